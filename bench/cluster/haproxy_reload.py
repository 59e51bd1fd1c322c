#!/usr/bin/env python3
"""HAProxy reload cost with 100 penstock nodes (docs/cluster.md, "Scaling estimate").

Starts, on loopback, an etcd, an nginx (the 100 "nodes" are 100 server lines pointing at it,
so every health check passes and every request has a live server) and HAProxy in
master-worker mode; puts 100 node records into etcd, renders the configuration with
`penstock cluster haproxy-config` (the real renderer) and measures:

- `haproxy -c -f FILE` (the config check: parse + resolve of 100 servers), median of 5;
- a reload through the master socket: wall time until `show proc` lists the new worker,
  the new worker's CPU seconds and RSS, the old worker's life while a download holds it;
- a download of 256 MiB through HAProxy (curl --limit-rate) with 3 reloads during it
  against one without: bytes exact (sha256), time ratio.

Usage: bench/cluster/haproxy_reload.py PENSTOCK_BIN [NODES]
Everything it starts is stopped at its end (also on error).
"""
import base64
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

PENSTOCK = sys.argv[1]
NODES = int(sys.argv[2]) if len(sys.argv) > 2 else 100
procs = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, what, limit=30):
    t = time.time()
    while time.time() - t < limit:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port}")


def etcd_call(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def b64(s):
    return base64.b64encode(s.encode()).decode()


def master(sock, cmd):
    """One command on HAProxy's master CLI. The master re-executes itself on reload: its
    socket refuses or resets connections for a moment, so the command is sent again."""
    t = time.time()
    while True:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        try:
            s.connect(sock)
            s.sendall((cmd + "\n").encode())
            s.shutdown(socket.SHUT_WR)
            out = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
            return out.decode(errors="replace")
        except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError, FileNotFoundError):
            if cmd == "reload" or time.time() - t > 10:
                # A reset after `reload` was sent: the master is re-executing (done).
                if cmd == "reload":
                    return ""
                raise
            time.sleep(0.002)
        finally:
            s.close()


def workers(sock):
    """(pid, reloads) of the current and old workers, from `show proc`."""
    cur, old = [], []
    section = None
    for line in master(sock, "show proc").splitlines():
        if line.startswith("# workers"):
            section = cur
        elif line.startswith("# old workers"):
            section = old
        elif line.startswith("#"):
            section = None
        elif section is not None and line.strip():
            section.append(int(line.split()[0]))
    return cur, old


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(d):
    # etcd
    cport, pport = free_port(), free_port()
    url = f"http://127.0.0.1:{cport}"
    procs.append(subprocess.Popen(
        ["etcd", "--data-dir", f"{d}/etcd", "--name", "t", "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-cluster", f"t=http://127.0.0.1:{pport}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_port(cport, "etcd")
    # nginx with a 256 MiB file and /healthz
    www = f"{d}/www"
    os.makedirs(www)
    data = os.urandom(1 << 20) * 256
    open(f"{www}/big.bin", "wb").write(data)
    want = hashlib.sha256(data).hexdigest()
    open(f"{www}/healthz", "w").write("ok\n")
    nport = free_port()
    open(f"{d}/nginx.conf", "w").write(
        f"user root;\nworker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx.err warn;\n"
        f"events {{ worker_connections 1024; }}\nhttp {{ access_log off; sendfile on;\n"
        f"client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc; "
        f"uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n"
        f"server {{ listen 127.0.0.1:{nport}; root {www}; }} }}\n")
    procs.append(subprocess.Popen(["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e", f"{d}/nginx.err"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_port(nport, "nginx")
    # NODES records in etcd, the format of core::cluster::record
    lease = etcd_call(url, "/v3/lease/grant", {"TTL": 600})["ID"]
    for i in range(NODES):
        rec = (f"penstock-node=1\nname=edge-{i:03}\nhttp=127.0.0.1:{nport}\nrtsp=10.0.0.{i % 250 + 1}:8554\n"
               f"control=10.0.0.{i % 250 + 1}:7070\nrt_bytes_per_s=12500000\nrt_bytes_per_s_left=9000000\n"
               f"streams=3\nstreams_max=1024\ncache_bytes=1073741824\n")
        etcd_call(url, "/v3/kv/put", {"key": b64(f"/penstock/nodes/edge-{i:03}"), "value": b64(rec), "lease": lease})
    hport = free_port()
    cfg = f"{d}/haproxy.cfg"
    t = time.time()
    subprocess.run([PENSTOCK, "cluster", "haproxy-config", "--etcd", url, "--out", cfg,
                    "--bind", f"127.0.0.1:{hport}", "--timeout-server", "120s", "--timeout-client", "120s"],
                   check=True)
    render_s = time.time() - t
    servers = sum(1 for l in open(cfg) if l.strip().startswith("server "))
    assert servers == NODES, f"{servers} server lines"
    print(f"rendered {servers} servers ({os.path.getsize(cfg)} bytes) in {render_s * 1000:.0f} ms (penstock cluster haproxy-config, etcd range + render)")
    checks = []
    for _ in range(5):
        t = time.time()
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["haproxy", "-c", "-q", "-f", cfg], check=True)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        checks.append((time.time() - t, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime))
    walls = [w for w, _ in checks]
    cpus = [c for _, c in checks]
    print(f"haproxy -c -f ({NODES} servers): wall median {statistics.median(walls) * 1000:.0f} ms (min {min(walls) * 1000:.0f}), "
          f"CPU median {statistics.median(cpus) * 1000:.0f} ms (min {min(cpus) * 1000:.0f}) of 5")
    sock = f"{d}/master.sock"
    procs.append(subprocess.Popen(["haproxy", "-W", "-S", sock, "-f", cfg],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    master_pid = procs[-1].pid
    wait_port(hport, "haproxy")
    time.sleep(2.5)  # first health checks (inter 1s, rise 1)
    cur, _ = workers(sock)
    print(f"master {master_pid} CPU {cpu_s(master_pid):.2f} s; worker {cur[0]}: RSS {rss_kib(cur[0])} KiB, CPU {cpu_s(cur[0]):.2f} s after start")

    def download(reloads):
        out = f"{d}/got.bin"
        c = subprocess.Popen(["curl", "-sS", "--limit-rate", "40M", "-o", out, f"http://127.0.0.1:{hport}/big.bin"])
        t = time.time()
        rel = []
        for _ in range(reloads):
            time.sleep(1.2)
            before, _ = workers(sock)
            m0 = cpu_s(master_pid)
            r0 = time.time()
            master(sock, "reload")
            while True:
                cur, old = workers(sock)
                if cur and cur[0] not in before:
                    break
                if time.time() - r0 > 30:
                    raise SystemExit("no new worker 30 s after reload")
                time.sleep(0.005)
            wall = time.time() - r0
            time.sleep(0.5)
            rel.append((wall, cpu_s(cur[0]), rss_kib(cur[0]), len(old), cpu_s(master_pid) - m0))
        rc = c.wait(timeout=120)
        took = time.time() - t
        got = hashlib.sha256(open(out, "rb").read()).hexdigest()
        return rc, took, got == want, rel

    rc, base, ok, _ = download(0)
    print(f"download 256 MiB at 40 MB/s, no reload: rc {rc}, {base:.2f} s, exact {ok}")
    rc, took, ok, rel = download(3)
    for w, c, r, o, m in rel:
        print(f"  reload: new worker after {w * 1000:.0f} ms; CPU: master {m * 1000:.0f} ms, new worker {c * 1000:.0f} ms "
              f"(0.5 s later); new worker RSS {r} KiB; old workers alive {o}")
    print(f"download 256 MiB at 40 MB/s, 3 reloads: rc {rc}, {took:.2f} s ({took / base:.3f}x the first), exact {ok}")
    rc, base2, ok, _ = download(0)
    print(f"download 256 MiB at 40 MB/s, no reload again: rc {rc}, {base2:.2f} s ({took / base2:.3f}x this one), exact {ok}")
    time.sleep(1)
    cur, old = workers(sock)
    print(f"after the download: {len(cur)} worker, {len(old)} old workers")


d = tempfile.mkdtemp(prefix="haproxy-reload-")
try:
    main(d)
finally:
    for p in reversed(procs):
        # HAProxy's master: SIGUSR1 stops its workers softly and it exits after them (a
        # SIGTERM'd master can leave its workers unreaped).
        p.send_signal(signal.SIGUSR1 if p.args[0] == "haproxy" else signal.SIGTERM)
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    shutil.rmtree(d, ignore_errors=True)
