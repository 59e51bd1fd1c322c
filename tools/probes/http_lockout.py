#!/usr/bin/env python3
"""The HTTP lock-out probes of issue 30, run against penstock serve and nginx side by side.

    python3 tools/probes/http_lockout.py [--penstock target/release/penstock] [--nginx nginx]

Each server serves the same directory on loopback with the same limits where both have one
(10,000 requests per connection; 1,024 descriptors for the descriptor probe) and otherwise
its defaults. Probes:

- pipeline: 12,000 pipelined GETs on one connection: responses received intact, and how
  the connection ended (a clean EOF, or a reset that loses responses already answered).
- nofile: the server under `prlimit --nofile=1024`, 10,000 connections each sending a GET:
  how many got a reply (200 or 503), a clean close, a reset, or nothing within 10 s.
- trickle: 256 connections each sending one byte of a request head every 2 s; meanwhile a
  normal client's GET every second for 20 s: how many were served.

Prints one table; nothing here is asserted (the tests in crates/penstock/tests/lockout.rs
do that for penstock). Loopback only.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REQ = b"GET /small.txt HTTP/1.1\r\nHost: probe\r\n\r\n"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, deadline=20.0):
    t0 = time.time()
    while time.time() - t0 < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def start_penstock(binary, root, port, nofile, work):
    cfg = os.path.join(work, "penstock.toml")
    with open(cfg, "w") as f:
        f.write(
            "[limits]\nrequests_per_connection_max = 10000\n"
            "[control]\nlisten = \"\"\n[rtsp]\nlisten = \"\"\n"
            "[admission]\nself_calibrate = false\n"
        )
    cmd = [binary, "serve", root, "--listen", f"127.0.0.1:{port}", "--config", cfg]
    if nofile:
        cmd = ["prlimit", f"--nofile={nofile}", "--"] + cmd
    env = dict(os.environ, XDG_RUNTIME_DIR=work)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return p


def start_nginx(binary, root, port, nofile, work):
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(
            f"""daemon off; worker_processes 1; pid {work}/nginx.pid; error_log {work}/error.log;
events {{ worker_connections 16384; }}
http {{ access_log off; sendfile on; keepalive_requests 10000;
  client_body_temp_path {work}/b; proxy_temp_path {work}/p; fastcgi_temp_path {work}/f;
  uwsgi_temp_path {work}/u; scgi_temp_path {work}/s;
  server {{ listen 127.0.0.1:{port}; root {root}; }} }}
"""
        )
    cmd = [binary, "-c", conf, "-e", f"{work}/error.log"]
    if nofile:
        cmd = ["prlimit", f"--nofile={nofile}", "--"] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def read_responses(sock, expect_body):
    """Counts complete 200 responses until EOF or error; returns (count, ending)."""
    buf = b""
    count = 0
    sock.settimeout(30)
    ending = "eof"
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
            while True:
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    break
                head = buf[:i]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                if len(buf) < i + 4 + length:
                    break
                if head.startswith(b"HTTP/1.1 200") and length == expect_body:
                    count += 1
                buf = buf[i + 4 + length :]
    except ConnectionResetError:
        ending = "reset"
    except socket.timeout:
        ending = "timeout"
    return count, ending


def probe_pipeline(port, body_len):
    s = socket.create_connection(("127.0.0.1", port))
    data = REQ * 12000

    def writer():
        try:
            s.sendall(data)
        except OSError:
            pass

    t = threading.Thread(target=writer)
    t.start()
    n, ending = read_responses(s, body_len)
    t.join()
    s.close()
    return f"{n} of 12000 responses, then {ending}"


def probe_nofile(port):
    socks = []
    outcome = {
        "reply": 0,
        "503": 0,
        "close": 0,
        "reset": 0,
        "nothing": 0,
        "refused": 0,
        "connect timed out": 0,
        "not tried (60 s spent connecting)": 0,
    }
    t0 = time.time()
    for i in range(10000):
        if time.time() - t0 > 60:
            outcome["not tried (60 s spent connecting)"] = 10000 - i
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(REQ)
            s.setblocking(False)
            socks.append(s)
        except ConnectionRefusedError:
            outcome["refused"] += 1
        except socket.timeout:
            outcome["connect timed out"] += 1
        except OSError:
            outcome["reset"] += 1
    deadline = time.time() + 10
    pending = list(socks)
    while pending and time.time() < deadline:
        still = []
        for s in pending:
            try:
                d = s.recv(64)
                if not d:
                    outcome["close"] += 1
                elif d.startswith(b"HTTP/1.1 503"):
                    outcome["503"] += 1
                else:
                    outcome["reply"] += 1
            except BlockingIOError:
                still.append(s)
                continue
            except OSError:
                outcome["reset"] += 1
        pending = still
        time.sleep(0.05)
    outcome["nothing"] = len(pending)
    for s in socks:
        s.close()
    return ", ".join(f"{k} {v}" for k, v in outcome.items() if v)


def probe_trickle(port):
    socks = []
    for _ in range(256):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    stop = threading.Event()

    def trickler():
        i = 0
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(REQ[i % len(REQ) : i % len(REQ) + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(2)

    t = threading.Thread(target=trickler)
    t.start()
    served = 0
    tries = 0
    t0 = time.time()
    while time.time() - t0 < 20:
        tries += 1
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=2)
            c.settimeout(2)
            c.sendall(REQ.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            if c.recv(16).startswith(b"HTTP/1.1 200"):
                served += 1
            c.close()
        except OSError:
            pass
        time.sleep(1)
    stop.set()
    t.join()
    for s in socks:
        s.close()
    return f"{len(socks)} trickling; normal client served {served} of {tries}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--penstock", default="target/release/penstock")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="probe-")
    # nginx's workers run as nobody: the root must be theirs to read.
    os.chmod(work, 0o755)
    root = os.path.join(work, "root")
    os.mkdir(root, 0o755)
    body = b"x" * 512
    with open(os.path.join(root, "small.txt"), "wb") as f:
        f.write(body)
    os.chmod(os.path.join(root, "small.txt"), 0o644)
    rows = []
    for name, start in (("penstock", start_penstock), ("nginx", start_nginx)):
        binary = a.penstock if name == "penstock" else a.nginx
        for probe in ("pipeline", "nofile", "trickle"):
            port = free_port()
            w = tempfile.mkdtemp(dir=work)
            p = start(binary, root, port, 1024 if probe == "nofile" else None, w)
            try:
                if not wait_port(port):
                    rows.append((probe, name, "did not start"))
                    continue
                if probe == "pipeline":
                    r = probe_pipeline(port, len(body))
                elif probe == "nofile":
                    r = probe_nofile(port)
                else:
                    r = probe_trickle(port)
                alive = p.poll() is None
                rows.append((probe, name, r + ("" if alive else "; SERVER EXITED")))
            finally:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
            print(f"{probe:<9} {name:<9} {rows[-1][2]}", file=sys.stderr, flush=True)
    print("| probe | server | result |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
