# The key-update run of crates/penstock/tests/ktls.rs (`a_key_update_and_close_notify_…`),
# run by /bin/sh in the QEMU guest of tools/qemu/run.sh (or on a host whose kernel has the
# tls ULP). One penstock with an https:// and an rtsps:// listener, [tls] ktls = true; the
# client is the test binary itself (its ignored `guest_client`, rustls): an rtsps:// session
# played to its BYE, one with a TLS 1.3 KeyUpdate sent midway, and an https GET with a
# KeyUpdate midway and a close_notify at its end. It prints KTLS_KU lines.
set -u
: "${PENSTOCK:=/bin/penstock}" "${CLIENT:=/bin/ktls-client}" "${WORK:=/tmp/ku}" "${CONF:=/etc/ktls}" "${SRV:=/srv}"
mkdir -p "$WORK"
cat > "$WORK/ku.toml" <<CFG
[http]
listen = ["https://127.0.0.1:19443"]
[control]
listen = ""
[rtsp]
listen = ["rtsps://127.0.0.1:19322"]
[log]
access = "off"
[admission]
self_calibrate = false
disk_seq_bytes_per_s = 1000000000
disk_random_iops = 100000
net_bytes_per_s = 1250000000
cpu_send_ns = 5000
cpu_send_byte_ps = 500
[tls]
ktls = true
[[tls.certificates]]
cert = "$CONF/cert.pem"
key = "$CONF/cert.key"
CFG
PENSTOCK_LOG=penstock_server=debug "$PENSTOCK" serve --config "$WORK/ku.toml" --root "$SRV" \
  --no-control-unix > "$WORK/log" 2>&1 &
pid=$!
i=0
until grep -q "rtsps://" "$WORK/log" 2>/dev/null; do
  i=$((i + 1))
  if [ "$i" -gt 900 ]; then echo "KTLS_KU_FAIL the server did not start"; cat "$WORK/log"; exit 1; fi
  sleep 0.1
done
echo "KTLS_KU_STEP server started"
KTLS_GUEST_CLIENT=1 KTLS_HTTPS=127.0.0.1:19443 KTLS_RTSPS=127.0.0.1:19322 KTLS_CA="$CONF/ca.pem" \
  KTLS_SRV="$SRV" "$CLIENT" --ignored --exact guest_client --nocapture --test-threads 1 2>&1 \
  | grep 'KTLS_KU'
kill -TERM "$pid"
i=0
while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
grep -i 'ktls\|kernel tls\|path=\|rtsp\|engine\|stream' "$WORK/log" | grep -v 'GET /\|self-calib' | head -40 | sed 's/^/KTLS_KU_LOG /'
sed 's/^/KTLS_KU_STAT /' /proc/net/tls_stat
exit 0
