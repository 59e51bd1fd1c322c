#!/usr/bin/env bash
# Boot the kernel that tools/qemu/fetch.sh unpacked, under QEMU (TCG: KVM does not work on
# these VMs), with an initramfs holding busybox, the `tls` module and its crypto, the programs
# given (each with the libraries ldd lists) and files; run SCRIPT there with /bin/sh and report
# through the serial console. The guest has loopback only (-nic none).
#
#   tools/qemu/run.sh --script FILE [--bin PATH]... [--file SRC:DST]... [--mem MB] [--timeout S]
#
# Prints the serial console; exits with SCRIPT's status (read from the console's
# PENSTOCK_QEMU_RC= line: QEMU itself exits 0 whatever the guest did), or 125 when the guest
# gave none (no boot, a panic, or the timeout).
set -euo pipefail
root="${PENSTOCK_QEMU_ROOT:-$HOME/.cache/penstock-qemu}"
script="" mem=1024 limit=300 bins=() files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --script) script="$2"; shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --mem) mem="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$script" ] || { echo "run.sh: --script is required" >&2; exit 2; }
[ -f "$root/ready" ] || { echo "run.sh: no QEMU root at $root (run tools/qemu/fetch.sh)" >&2; exit 2; }
root="$root/root"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,dev,proc,sys,tmp,modules,etc}
cp "$root/bin/busybox" "$stage/bin/busybox"
kver="$(basename "$(ls -d "$root"/lib/modules/*)")"
# The tls ULP and the AES-GCM it needs, in dependency order (the package has no modules.dep).
n=0
for m in crypto_null gf128mul ghash-generic gcm cryptd crypto_simd aesni-intel tls; do
  ko="$(find "$root/lib/modules/$kver" -name "$m.ko.xz" | head -1)"
  [ -n "$ko" ] || { echo "run.sh: module $m missing" >&2; exit 2; }
  n=$((n + 1))
  xz -dc "$ko" > "$stage/modules/$(printf %02d $n)-$m.ko"
done
copy_with_libs() {
  local bin="$1" dest="$stage/bin/$(basename "$1")"
  cp "$bin" "$dest"
  # A debug build carries ~200 MB of debug info the guest does not need in its RAM disk.
  strip --strip-debug "$dest" 2>/dev/null || true
  ldd "$bin" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
    mkdir -p "$stage$(dirname "$lib")"
    cp -L "$lib" "$stage$lib"
  done
}
for b in "${bins[@]}"; do copy_with_libs "$b"; done
for f in "${files[@]}"; do
  src="${f%%:*}" dst="${f#*:}"
  mkdir -p "$stage$(dirname "$dst")"
  cp -a "$src" "$stage$dst"
done
cp "$script" "$stage/test.sh"
# Name lookups for programs that ask (glibc reads these; no NSS modules are copied).
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$stage/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$stage/etc/group"
printf '127.0.0.1 localhost\n' > "$stage/etc/hosts"
cat > "$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
ip link set lo up
for m in /modules/*.ko; do insmod "$m" || echo "PENSTOCK_QEMU: insmod $m failed"; done
echo "PENSTOCK_QEMU: kernel $(uname -r), ulp: $(cat /proc/sys/net/ipv4/tcp_available_ulp)"
export PATH=/bin HOME=/tmp
sh /test.sh
echo "PENSTOCK_QEMU_RC=$?"
poweroff -f
INIT
chmod +x "$stage/init"
# Not compressed: the kernel copies it as it is, where decompressing 100 MB of test data
# would take the emulated CPU most of a minute.
(cd "$stage" && find . | "$stage/bin/busybox" cpio -o -H newc 2>/dev/null) > "$stage.cpio"
trap 'rm -rf "$stage" "$stage.cpio"' EXIT

lib="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu"
log="$stage.log"
trap 'rm -rf "$stage" "$stage.cpio" "$log"' EXIT
QEMU_MODULE_DIR="$root/usr/lib/x86_64-linux-gnu/qemu" LD_LIBRARY_PATH="$lib" timeout "$limit" "$root/usr/bin/qemu-system-x86_64" \
  -accel tcg -cpu max -m "$mem" -smp 1 \
  -L "$root/usr/share/seabios" -L "$root/usr/share/qemu" -L "$root/usr/share/ipxe/qemu" \
  -kernel "$root/boot/vmlinuz-$kver" -initrd "$stage.cpio" \
  -append "console=ttyS0 quiet panic=-1" -nographic -no-reboot -nic none </dev/null | tee "$log" || true
rc="$(tr -d '\r' < "$log" | sed -n 's/^PENSTOCK_QEMU_RC=\([0-9]*\)$/\1/p' | tail -1)"
exit "${rc:-125}"
