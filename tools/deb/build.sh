#!/usr/bin/env bash
# Builds the Debian package penstock_VERSION-1_ARCH.deb into $CARGO_TARGET_DIR/debian/
# (docs/packaging.md). Needs cargo-deb (`cargo install cargo-deb --version 3.8.0 --locked`).
# Prints the package's path on its last line. One release build serves the binary and the
# C library, in target/TRIPLE/release.
#
# PENSTOCK_DEB_PROFILE=dev (what .ci/run sets): package the test build's binary instead
# (target/debug, no release build), with the C library cargo cinstall made from that build
# (PENSTOCK_DEB_CLIB=path of its libpenstock.so.X.Y.Z, soname set). The package's shape, scripts,
# units and checks are the same; only the binary's optimisation differs. Operators build release.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in cargo-deb objdump strip gzip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "tools/deb/build.sh: $tool is missing (docs/packaging.md)" >&2; exit 1; }
done

triple="$(rustc -vV | sed -n 's/^host: //p')"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
profile="${PENSTOCK_DEB_PROFILE:-release}"
case "$profile" in
  release) release="$target_dir/$triple/release" ;;
  dev) release="$target_dir/debug" ;;
  *) echo "tools/deb/build.sh: PENSTOCK_DEB_PROFILE is release or dev, not $profile" >&2; exit 2 ;;
esac
out="$release/deb"

# The changelog names the version packaged: it must be the workspace's.
version="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "penstock"))')"
head -n 1 deploy/debian/changelog | grep -q "^penstock ($version-1) " || {
  echo "tools/deb/build.sh: deploy/debian/changelog's first entry is not $version-1: add one" >&2
  exit 1
}

t0=$SECONDS
IFS=. read -r major minor patch <<<"$version"
soname="libpenstock.so.$major.$minor"
[ "$major" = 0 ] || soname="libpenstock.so.$major"
if [ "$profile" = release ]; then
  cargo build --release --locked --target "$triple" -p penstock
  # libpenstock as `cargo cinstall` lays it out (docs/c-api.md): libpenstock.so.X.Y.Z with the
  # soname libpenstock.so.X.Y (a 0.x minor release may break the ABI), the checked-in header,
  # penstock.pc. Built by `cargo rustc` in the same build as the binary: the soname flag applies
  # to this crate only and every dependency is the binary's. cargo cinstall would compile every
  # dependency a second time (its own cargo hashes them differently; docs/packaging.md).
  cargo rustc --release --locked --target "$triple" -p penstock-c --lib --crate-type cdylib \
    -- -C "link-arg=-Wl,-soname,$soname"
  clib="$release/libpenstock.so"
else
  # The binary the workspace's test build made (`cargo test --workspace`, whose features a
  # plain `cargo build` would not unify the same way): nothing to build after the tests.
  cargo test --locked --workspace --no-run >/dev/null 2>&1 || cargo test --locked --workspace --no-run
  clib="${PENSTOCK_DEB_CLIB:?PENSTOCK_DEB_PROFILE=dev needs PENSTOCK_DEB_CLIB: the libpenstock.so.X.Y.Z cargo cinstall made}"
fi
rm -rf "$out"
mkdir -p "$out/man" "$out/completions" "$out/systemd" "$out/stage/usr/lib/pkgconfig" "$out/stage/usr/include"
install -m 0644 "$clib" "$out/stage/usr/lib/libpenstock.so.$version"
# cargo-deb strips what cargo built (--strip below), not this copy.
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$out/stage/usr/lib/libpenstock.so.$version"
ln -s "libpenstock.so.$version" "$out/stage/usr/lib/$soname"
ln -s "$soname" "$out/stage/usr/lib/libpenstock.so"
install -m 0644 crates/libpenstock/include/penstock.h "$out/stage/usr/include/penstock.h"
description="$(sed -n 's/^description = "\(.*\)"$/\1/p' crates/libpenstock/Cargo.toml | sed -n '$p')"
cat >"$out/stage/usr/lib/pkgconfig/penstock.pc" <<PC
prefix=/usr
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: penstock
Description: $description
Version: $version
Libs: -L\${libdir} -lpenstock
Cflags: -I\${includedir}
PC
if ! objdump -p "$out/stage/usr/lib/libpenstock.so.$version" | grep -q "SONAME *$soname\$"; then
  echo "tools/deb/build.sh: libpenstock has no soname $soname" >&2
  exit 1
fi
echo "$profile build (binary and C library): $((SECONDS - t0)) s"

bin="$release/penstock"
"$bin" man --dir "$out/man"
gzip -9n "$out"/man/*.1
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
if [ "$profile" = release ]; then
  cargo deb -p penstock --target "$triple" --no-build --strip --locked
else
  cargo deb -p penstock --profile dev --no-build --strip --locked
fi
ls -1 "$target_dir/debian/penstock_${version}-1_"*.deb | tail -n 1
