#!/usr/bin/env bash
# Builds the Debian package penstock_VERSION-1_ARCH.deb into $CARGO_TARGET_DIR/debian/
# (docs/packaging.md). Needs cargo-deb and cargo-c (`cargo install cargo-deb --locked`;
# cargo-c as in .ci/run). Prints the package's path on its last line.
#
# One release build serves the binary and the C library: both are built for the host's
# triple named explicitly, as cargo-c always builds, so that they share one
# target/TRIPLE/release (a build without --target would compile every dependency twice).
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in cargo-deb cargo-cinstall; do
  command -v "$tool" >/dev/null 2>&1 || { echo "tools/deb/build.sh: $tool is missing (docs/packaging.md)" >&2; exit 1; }
done

triple="$(rustc -vV | sed -n 's/^host: //p')"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
release="$target_dir/$triple/release"
out="$release/deb"

# The changelog names the version packaged: it must be the workspace's.
version="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "penstock"))')"
head -n 1 deploy/debian/changelog | grep -q "^penstock ($version-1) " || {
  echo "tools/deb/build.sh: deploy/debian/changelog's first entry is not $version-1: add one" >&2
  exit 1
}

t0=$SECONDS
cargo build --release --locked --target "$triple" -p penstock
rm -rf "$out"
mkdir -p "$out/man" "$out/completions" "$out/systemd"
# libpenstock.so.0 (soname), penstock.h, penstock.pc with prefix /usr; libpenstock.a is left
# out (docs/packaging.md).
cargo cinstall --release --locked --target "$triple" -p penstock-c \
  --prefix /usr --libdir lib --destdir "$out/stage" >/dev/null
rm -f "$out"/stage/usr/lib/libpenstock.a
echo "release build (binary and C library): $((SECONDS - t0)) s"

bin="$release/penstock"
"$bin" man --dir "$out/man"
"$bin" completions bash >"$out/completions/penstock"
"$bin" completions zsh >"$out/completions/_penstock"
"$bin" completions fish >"$out/completions/penstock.fish"

# The repository's units name /usr/local/bin/penstock (a manual install, docs/service.md);
# the package's binary is /usr/bin/penstock.
for unit in penstock.service penstock.socket penstock-haproxy-config.service; do
  sed 's|/usr/local/bin/penstock|/usr/bin/penstock|g' "deploy/systemd/$unit" >"$out/systemd/$unit"
  if grep -q /usr/local "$out/systemd/$unit"; then
    echo "tools/deb/build.sh: $unit still names /usr/local" >&2
    exit 1
  fi
done

# cargo-deb strips the binary and the library (the release profile keeps debug = 1).
cargo deb -p penstock --target "$triple" --no-build --strip --locked
ls -1 "$target_dir/debian/penstock_${version}-1_"*.deb | tail -n 1
