#!/usr/bin/env python3
"""The CPU a flood of bad signatures costs the server, against a flood of 404s in the same
run (issue 35, docs/security.md "Viewers").

Starts `penstock serve` (the binary given, a release build) on loopback with a location
`/premium/` that requires signed URLs and one key; then, alternating, ROUNDS times each:

- 404s: N GETs of paths that do not exist (`/nope-I`), beneath no signed location;
- bad signatures: N GETs of `/premium/data.bin?expires=…&kid=k1&sig=…` whose tag is wrong
  (a fresh random tag each time), answered 403 with the refusal counted and its log line
  rate-limited.

Each flood runs over one keep-alive connection, pipelined in batches of 100. The server's
CPU (utime + stime from /proc/PID/stat, in clock ticks) is read before and after each
flood; the ratio is bad-signature CPU / 404 CPU, totals over the rounds. Then it checks that
nothing else changed: a valid signed URL still gets the file (200, its bytes), and the log
holds at most the limiter's lines. Prints one JSON object.

Usage: bench/auth/flood.py PENSTOCK_BIN [N] [ROUNDS]
"""
import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime: fields 14 and 15 of stat(5), 12 and 13 after the comm field.
    return int(fields[11]) + int(fields[12])


def read_response(f):
    """Reads one response (head and Content-Length body); returns the status."""
    line = f.readline()
    if not line:
        raise RuntimeError("connection closed")
    status = int(line.split()[1])
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        k, _, v = h.decode().partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    if length:
        f.read(length)
    return status


def flood(addr, targets):
    """GETs each target over one connection, pipelined by 100; returns the statuses seen."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    f = s.makefile("rb")
    seen = {}
    for i in range(0, len(targets), 100):
        batch = targets[i : i + 100]
        s.sendall(b"".join(f"GET {t} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for t in batch))
        for _ in batch:
            st = read_response(f)
            seen[st] = seen.get(st, 0) + 1
    s.close()
    return seen


def main():
    binary = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    d = tempfile.mkdtemp(prefix="penstock-auth-flood-")
    root = os.path.join(d, "www")
    os.makedirs(os.path.join(root, "premium"))
    data = os.urandom(64 * 1024)
    with open(os.path.join(root, "premium", "data.bin"), "wb") as f:
        f.write(data)
    key = os.path.join(d, "k1.key")
    with open(key, "w") as f:
        f.write(secrets.token_urlsafe(48) + "\n")
    os.chmod(key, 0o600)
    conf = os.path.join(d, "penstock.toml")
    with open(conf, "w") as f:
        f.write(
            '[http]\nlisten = "127.0.0.1:0"\nworkers = 1\n[control]\nlisten = ""\n'
            '[log]\naccess = "off"\n[rtsp]\nlisten = ""\n'
            f'[auth]\nkeys = [{{ id = "k1", secret_file = "{key}" }}]\n'
            '[[location]]\nprefix = "/premium/"\nauth = "signed"\n'
        )
    log = open(os.path.join(d, "serve.log"), "wb")
    p = subprocess.Popen(
        [binary, "serve", "--no-control-unix", "--config", conf, root],
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        line = p.stdout.readline().decode()
        addr = line.split("http://", 1)[1].split(",")[0].split(";")[0].split()[0]
        exp = int(time.time()) + 3600
        bad = lambda: (
            f"/premium/data.bin?expires={exp}&kid=k1&sig="
            + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        )
        ticks = {"404": 0, "bad_signature": 0}
        statuses = {"404": {}, "bad_signature": {}}
        for r in range(rounds):
            for kind in ("404", "bad_signature"):
                targets = (
                    [f"/nope-{r}-{i}" for i in range(n)]
                    if kind == "404"
                    else [bad() for _ in range(n)]
                )
                t0 = cpu_ticks(p.pid)
                seen = flood(addr, targets)
                ticks[kind] += cpu_ticks(p.pid) - t0
                for k, v in seen.items():
                    statuses[kind][k] = statuses[kind].get(k, 0) + v
        # Nothing else changed: a valid URL still works.
        signed = subprocess.run(
            [binary, "sign", f"http://{addr}/premium/data.bin", "--expires", "1h", "--config", conf],
            capture_output=True,
            check=True,
        ).stdout.decode().strip()
        body = subprocess.run(["curl", "-s", signed], capture_output=True, check=True).stdout
        log.flush()
        refusals_logged = open(os.path.join(d, "serve.log"), "rb").read().count(b"refused a viewer")
        hz = os.sysconf("SC_CLK_TCK")
        print(
            json.dumps(
                {
                    "requests_per_flood": n,
                    "rounds": rounds,
                    "cpu_s_404": ticks["404"] / hz,
                    "cpu_s_bad_signature": ticks["bad_signature"] / hz,
                    "ratio_bad_signature_to_404": (
                        ticks["bad_signature"] / ticks["404"] if ticks["404"] else None
                    ),
                    "statuses": statuses,
                    "valid_url_after_flood_byte_exact": body == data,
                    "refusal_log_lines": refusals_logged,
                },
                indent=1,
            )
        )
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == "__main__":
    main()
