#!/usr/bin/env bash
# Fetch (only when missing) a Debian kernel that builds the `tls` ULP as a module, QEMU and
# busybox into a cache directory, unpacked with dpkg-deb -x: nothing is installed on the host
# (installing qemu-system-x86 would replace the host's qemu-utils). Prints the directory on
# stdout; progress and the cost on stderr. Used by crates/penstock/tests/ktls.rs through
# PENSTOCK_QEMU_ROOT, which .ci/run sets to this script's output.
#
#   tools/qemu/fetch.sh [DIR]     DIR defaults to $PENSTOCK_QEMU_ROOT or ~/.cache/penstock-qemu
set -euo pipefail
dir="${1:-${PENSTOCK_QEMU_ROOT:-$HOME/.cache/penstock-qemu}}"
if [ -f "$dir/ready" ]; then
  echo "$dir"
  exit 0
fi
t0=$SECONDS
mkdir -p "$dir/debs" "$dir/root"
# The versioned kernel package the 6.12 meta-package depends on (the meta-package holds no kernel).
kernel="$(apt-cache depends linux-image-6.12-amd64 2>/dev/null | awk '/Depends: linux-image-6/ {print $2; exit}')"
if [ -z "$kernel" ]; then
  echo "fetch.sh: apt-cache names no linux-image-6.12 kernel (apt-get update first?)" >&2
  exit 1
fi
# qemu-system-x86, its modules (TCG is one), the libraries a Debian host usually lacks, its ROMs.
# Debian's rebuild 1:7.2+dfsg-7+deb12u18+b3 (seen 2026-12-06) also links libpmem (with libndctl,
# libdaxctl) and rdma (librdmacm, libibverbs with libnl): the ldd check below names any other.
pkgs="$kernel qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu busybox-static libcapstone4 libfdt1 libslirp0 libvdeplug2"
pkgs="$pkgs libpmem1 libndctl6 libdaxctl1 librdmacm1 libibverbs1 libnl-3-200 libnl-route-3-200"
(cd "$dir/debs" && apt-get download $pkgs 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2)
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
rm -rf "$dir/debs"
missing="$(LD_LIBRARY_PATH="$dir/root/usr/lib/x86_64-linux-gnu:$dir/root/lib/x86_64-linux-gnu" \
  ldd "$dir/root/usr/bin/qemu-system-x86_64" | awk '/not found/ {print $1}')"
if [ -n "$missing" ]; then
  echo "fetch.sh: qemu-system-x86_64 still lacks: $missing" >&2
  exit 1
fi
touch "$dir/ready"
echo "fetch.sh: $kernel, QEMU and busybox in $dir: $(du -sh "$dir" | cut -f1) in $((SECONDS - t0)) s" >&2
echo "$dir"
