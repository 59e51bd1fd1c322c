# The kernel-TLS transfer of crates/penstock/tests/ktls.rs, run by /bin/sh (busybox's in the
# QEMU guest of tools/qemu/run.sh, or the host's where its kernel has the tls ULP). It serves
# a 100 MB file over https twice — [tls] ktls = true, then false — fetches it with curl,
# and prints KTLS_* lines for the test to read: whether the bytes matched, the path the
# access log names, what the server's system calls moved (strace -yy, added up by the zero-copy
# harness's own parser: TALLY, the test binary, `guest_tally`), /proc/net/tls_stat.
set -u
: "${PENSTOCK:=/bin/penstock}" "${TALLY:=/bin/ktls-tally}" "${WORK:=/tmp/ktls}" "${CONF:=/etc/ktls}" "${SRV:=/srv}"
: "${BYTES:=104857600}"
mkdir -p "$WORK"
# The file to serve: given (the test writes it on the host: making 100 MB of random bytes
# under emulation takes minutes), else made here.
if [ ! -f "$SRV/big.bin" ]; then
  mkdir -p "$SRV"
  head -c "$BYTES" /dev/urandom > "$SRV/big.bin"
fi
echo "KTLS_FILE $(wc -c < "$SRV/big.bin") bytes"
want=$(sha256sum "$SRV/big.bin" | cut -d' ' -f1)
port=18443
for mode in ktls user; do
  port=$((port + 1))
  cfg="$WORK/$mode.toml"
  if [ "$mode" = ktls ]; then on=true; else on=false; fi
  cat > "$cfg" <<CFG
[http]
listen = ["https://127.0.0.1:$port"]
[control]
listen = ""
[rtsp]
listen = ""
# No self-calibration: its probes run for seconds natively, minutes under emulation.
[admission]
self_calibrate = false
[tls]
ktls = $on
[[tls.certificates]]
cert = "$CONF/cert.pem"
key = "$CONF/cert.key"
CFG
  # The calls the zero-copy harness traces (its TRACED, written to $CONF/traced by the test).
  strace -f -qq -yy -s 0 -e signal=none --seccomp-bpf -e trace="$(cat "$CONF/traced")" \
    -o "$WORK/strace-$mode" "$PENSTOCK" serve --config "$cfg" --root "$SRV" --no-control-unix \
    > "$WORK/log-$mode" 2>&1 &
  pid=$!
  echo "KTLS_STEP mode=$mode server started"
  # Bounded wait for the listener: a TLS handshake that completes.
  i=0
  until curl -s -o /dev/null --cacert "$CONF/ca.pem" "https://localhost:$port/"; do
    i=$((i + 1))
    if [ "$i" -gt 600 ]; then
      echo "KTLS_FAIL mode=$mode: the server did not answer"
      cat "$WORK/log-$mode"
      exit 1
    fi
    sleep 0.1
  done
  echo "KTLS_STEP mode=$mode server answers after $i polls"
  got=$(curl -s --cacert "$CONF/ca.pem" "https://localhost:$port/big.bin" | sha256sum | cut -d' ' -f1)
  echo "KTLS_STEP mode=$mode fetched"
  # SIGTERM to penstock itself (strace's child: its parent pid is strace's), then strace
  # ends with it; a bounded wait.
  for st in /proc/[0-9]*/stat; do
    set -- $(cat "$st" 2>/dev/null)
    if [ "${4:-}" = "$pid" ]; then kill -TERM "$1"; echo "KTLS_STEP mode=$mode SIGTERM to $1"; fi
  done
  i=0
  while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    echo "KTLS_FAIL mode=$mode: the server did not stop within 60 s of SIGTERM"
    tail -5 "$WORK/log-$mode"
    exit 1
  fi
  wait "$pid"
  echo "KTLS_STEP mode=$mode stopped"
  KTLS_TALLY_LOG="$WORK/strace-$mode" KTLS_TALLY_MODE="$mode" KTLS_TALLY_FILE="$SRV/big.bin" \
    "$TALLY" --ignored --exact guest_tally --nocapture --test-threads 1 2>&1 \
    | grep 'KTLS_TALLY\|panicked\|not understood'
  path=$(grep -o 'path=[a-z-]*' "$WORK/log-$mode" | tail -1)
  if [ "$got" = "$want" ]; then same=yes; else same=no; fi
  echo "KTLS_RESULT mode=$mode same=$same $path"
  grep -i 'ktls\|kernel tls\|tls-user' "$WORK/log-$mode" | head -3 | sed 's/^/KTLS_LOG /'
done
sed 's/^/KTLS_STAT /' /proc/net/tls_stat
exit 0
