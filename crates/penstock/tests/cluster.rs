//! The cluster (issue 18 items 2-4, docs/cluster.md) with real parts: an etcd server and an
//! HAProxy started here on loopback, `penstock serve` nodes on 127.0.0.2 … 127.0.0.5, curl
//! and ffprobe as clients. Each test starts its own etcd (free ports, a temporary data
//! directory) and stops everything it started.
//!
//! Times are never asserted as absolute figures: a node killed with SIGKILL must leave the
//! membership only after its lease expires (it is still listed right after the kill), one
//! stopped with SIGTERM before half the lease's TTL (the lease was revoked).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");
/// The nodes' lease TTL (seconds): short, so the test waits little for an expiry.
const TTL_S: u64 = 3;

/// A child process stopped (SIGKILL) and reaped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have(tool: &str, arg: &str) -> bool {
    if common::tool(tool, arg) {
        return true;
    }
    println!("SKIPPED: {tool} not found (apt-get install etcd-server haproxy ffmpeg curl)");
    false
}

fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Etcd {
    _proc: Proc,
    url: String,
    client: u16,
    peer: u16,
    dir: std::sync::Arc<tempfile::TempDir>,
}

fn etcd() -> Etcd {
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let (client, peer) = (free_port("127.0.0.1"), free_port("127.0.0.1"));
    etcd_on(dir, client, peer)
}

impl Etcd {
    /// Stops this etcd; returns what starts it again on the same ports and data.
    fn stop(self) -> (std::sync::Arc<tempfile::TempDir>, u16, u16) {
        (self.dir.clone(), self.client, self.peer)
    }
}

fn etcd_on(dir: std::sync::Arc<tempfile::TempDir>, client: u16, peer: u16) -> Etcd {
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--name", "t", "--listen-client-urls", &url])
        .args(["--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("t={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd");
    let e = Etcd {
        _proc: Proc(child),
        url,
        client,
        peer,
        dir,
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if http_get(&format!("127.0.0.1:{client}"), "/health").is_some_and(|b| b.contains("true")) {
            return e;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("etcd did not become healthy");
}

/// A GET on a fresh connection: the body of a 200, else `None`.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    if !out.starts_with("HTTP/1.1 200") {
        return None;
    }
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

const TOKEN: &str = "cluster-test-token-cluster-test";

struct Node {
    proc: Proc,
    name: String,
    http: String,
    rtsp: String,
    control: String,
    dir: tempfile::TempDir,
}

impl Node {
    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    fn metric(&self, series: &str) -> f64 {
        common::scrape(&self.http)
            .and_then(|p| common::sample(&p, series))
            .unwrap_or(-1.0)
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.proc.0.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }
}

/// `penstock serve` as node `name` on `ip`, serving `files` (name, bytes), with `extra`
/// TOML appended (e.g. a small `[admission]`).
fn node(etcd: &Etcd, name: &str, ip: &str, files: &[(String, Vec<u8>)], extra: &str) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for (f, b) in files {
        std::fs::write(root.join(f), b).unwrap();
    }
    let conf = dir.path().join("penstock.toml");
    std::fs::write(
        &conf,
        format!(
            "[http]\nlisten = \"{ip}:0\"\n[control]\nlisten = \"{ip}:0\"\ntoken = \"{TOKEN}\"\n\
             [log]\naccess = \"{}\"\naccess_flush_ms = 50\n[rtsp]\nlisten = \"{ip}:0\"\n\
             [cluster]\netcd = \"{}\"\nnode = \"{name}\"\nlease_ttl = \"{TTL_S}s\"\netcd_timeout = \"500ms\"\nretry_max = \"1s\"\n{extra}",
            dir.path().join("access.log").display(),
            etcd.url
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(&root)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, control) = common::serve_addresses(&line);
    let control = control.expect("a control address");
    let rtsp = line
        .split("rtsp://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no rtsp address in {line:?}"))
        .to_string();
    Node {
        proc: Proc(child),
        name: name.into(),
        http,
        rtsp,
        control,
        dir,
    }
}

/// `penstock cluster status --json`: the node names listed.
fn listed(etcd: &Etcd) -> Vec<String> {
    let o = Command::new(BIN)
        .args(["cluster", "status", "--json", "--etcd", &etcd.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut names: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Waits until `cond` holds or `limit` passes; the time it took, or `None`.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn nodes_register_leave_at_the_ttl_when_killed_and_at_once_when_stopped() {
    if !have("etcd", "--version") {
        return;
    }
    let etcd = etcd();
    let a = node(&etcd, "a", "127.0.0.2", &[], "");
    let b = node(&etcd, "b", "127.0.0.3", &[], "");
    let c = node(&etcd, "c", "127.0.0.4", &[], "");
    assert!(
        wait_for(Duration::from_secs(20), || listed(&etcd)
            == names(&["a", "b", "c"]))
        .is_some(),
        "3 nodes listed: {:?}",
        listed(&etcd)
    );
    // The table form names them too, with their addresses.
    let o = Command::new(BIN)
        .args(["cluster", "status", "--etcd", &etcd.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains(&a.http) && table.contains("3 node(s)"),
        "{table}"
    );
    assert_eq!(a.metric("penstock_cluster_membership"), 1.0);
    assert_eq!(a.metric("penstock_node_info{node=\"a\"}"), 1.0);
    // a's own listing follows at its next refresh (every lease_ttl / 3).
    assert!(
        wait_for(Duration::from_secs(TTL_S * 2), || a
            .metric("penstock_cluster_nodes")
            == 3.0)
        .is_some(),
        "a lists 3 nodes"
    );
    common::assert_promtool_clean(&common::scrape(&a.http).unwrap());

    // SIGKILL: nothing revokes the lease; the node stays listed until it expires.
    let t_kill = Instant::now();
    c.signal(rustix::process::Signal::KILL);
    assert!(
        listed(&etcd).contains(&"c".to_string()),
        "a killed node stays listed until its lease expires"
    );
    let gone = wait_for(Duration::from_secs(TTL_S * 4), || {
        !listed(&etcd).contains(&"c".to_string())
    });
    assert!(gone.is_some(), "c still listed {TTL_S} s TTL later");
    println!("killed node gone after {:?}", t_kill.elapsed());

    // SIGTERM: the lease is revoked on the way out.
    let t_term = Instant::now();
    b.signal(rustix::process::Signal::TERM);
    let gone = wait_for(Duration::from_secs(TTL_S * 4), || {
        !listed(&etcd).contains(&"b".to_string())
    })
    .expect("b gone");
    println!("stopped node gone after {:?}", t_term.elapsed());
    assert!(
        gone < Duration::from_millis(TTL_S * 1000 / 2),
        "b left after {gone:?}: not revoked (the TTL is {TTL_S} s)"
    );
    assert_eq!(listed(&etcd), names(&["a"]));

    // etcd down: a keeps serving, its health check says fine, a metric says membership is
    // lost; back up, it is listed again. First a's own listing catches up (b gone).
    assert!(
        wait_for(Duration::from_secs(TTL_S * 2), || a
            .metric("penstock_cluster_nodes")
            == 1.0)
        .is_some(),
        "a lists itself only"
    );
    let (dir, client, peer) = etcd.stop();
    assert!(
        wait_for(Duration::from_secs(10), || a
            .metric("penstock_cluster_membership")
            == 0.0)
        .is_some(),
        "membership lost is counted"
    );
    assert_eq!(http_get(&a.http, "/healthz").as_deref(), Some("ok\n"));
    assert!(a.metric("penstock_cluster_etcd_failures_total") >= 1.0);
    // ... with the membership it last read (itself), and says since when: the time of the
    // last refresh stays where it was while etcd is away.
    assert_eq!(a.metric("penstock_cluster_nodes"), 1.0);
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let last = a.metric("penstock_cluster_last_refresh_timestamp_seconds");
    assert!(last > 0.0 && last <= unix_now(), "last refresh {last}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        a.metric("penstock_cluster_last_refresh_timestamp_seconds"),
        last,
        "no refresh while etcd is down"
    );
    // `cluster status` says etcd is unreachable, in words, and fails.
    let o = Command::new(BIN)
        .args([
            "cluster",
            "status",
            "--etcd",
            &format!("http://127.0.0.1:{client}"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("etcd at http://127.0.0.1:{client} is unreachable")),
        "{err}"
    );
    let etcd = etcd_on(dir, client, peer);
    assert!(
        wait_for(Duration::from_secs(20), || {
            a.metric("penstock_cluster_membership") == 1.0 && listed(&etcd) == names(&["a"])
        })
        .is_some(),
        "a registered again once etcd is back"
    );
    assert!(a.metric("penstock_cluster_last_refresh_timestamp_seconds") > last);

    // A lease revoked from outside (as if it had expired): a's next keepalive finds it
    // gone, grants a new lease and puts its record again.
    let client =
        penstock_server::cluster::etcd::Etcd::new(&etcd.url, Duration::from_secs(2)).unwrap();
    let (kvs, _) = client.range_prefix("/penstock/nodes/a").unwrap();
    let old_lease = kvs[0].lease;
    client.revoke(old_lease).unwrap();
    assert!(listed(&etcd).is_empty());
    assert!(
        wait_for(Duration::from_secs(TTL_S * 3), || listed(&etcd)
            == names(&["a"]))
        .is_some(),
        "a put its record again under a new lease"
    );
    let (kvs, _) = client.range_prefix("/penstock/nodes/a").unwrap();
    assert_ne!(kvs[0].lease, old_lease);
}

/// The same bytes in every node's root: `f{i}.bin`, 256 KiB each, distinct.
fn files(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let mut x = 0x9e37_79b9u64.wrapping_mul(i as u64 + 1);
            let v: Vec<u8> = (0..256 * 1024)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            (format!("f{i}.bin"), v)
        })
        .collect()
}

fn curl(url: &str, out: &Path) -> bool {
    Command::new("curl")
        .args(["-s", "-f", "--max-time", "10", "-o"])
        .arg(out)
        .arg(url)
        .status()
        .is_ok_and(|s| s.success())
}

fn haproxy_config(etcd: &Etcd, bind: &str, out: &Path, watch: Option<&Path>) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "cluster",
        "haproxy-config",
        "--etcd",
        &etcd.url,
        "--bind",
        bind,
    ])
    .args(["--check-interval", "200ms", "--out"])
    .arg(out);
    if let Some(sock) = watch {
        c.args(["--watch", "--interval", "200ms", "--master-socket"])
            .arg(sock);
    }
    c
}

/// Requests for `path` that reached each node, from their access logs.
fn hits(nodes: &[&Node], path: &str) -> Vec<usize> {
    let needle = format!("\"GET /{path} ");
    nodes
        .iter()
        .map(|n| n.access_log().matches(&needle).count())
        .collect()
}

#[test]
fn haproxy_from_etcd_sends_one_uri_to_one_node_and_watch_adds_a_fourth() {
    if !have("etcd", "--version") || !have("haproxy", "-v") || !have("curl", "--version") {
        return;
    }
    let etcd = etcd();
    let fs = files(24);
    let n: Vec<Node> = [("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")]
        .iter()
        .map(|(name, ip)| node(&etcd, name, ip, &fs, ""))
        .collect();
    assert!(
        wait_for(Duration::from_secs(20), || listed(&etcd).len() == 3).is_some(),
        "3 nodes listed"
    );
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("haproxy.cfg");
    let bind = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let o = haproxy_config(&etcd, &bind, &cfg, None).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&cfg).unwrap();
    for node in &n {
        assert!(
            text.contains(&format!("server {} {} check", node.name, node.http)),
            "{text}"
        );
    }
    let check = Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "haproxy -c: {}{}\n{text}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let sock = work.path().join("master.sock");
    let _haproxy = Proc(
        Command::new("haproxy")
            .arg("-W")
            .arg("-S")
            .arg(&sock)
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let got = work.path().join("got");
    let base = format!("http://{bind}");
    assert!(
        wait_for(Duration::from_secs(20), || curl(
            &format!("{base}/f0.bin"),
            &got
        ))
        .is_some(),
        "HAProxy answers"
    );
    // One URI, ten GETs: the same node every time, every byte exact.
    let before = hits(&[&n[0], &n[1], &n[2]], "f1.bin");
    for _ in 0..10 {
        assert!(curl(&format!("{base}/f1.bin"), &got));
        assert!(std::fs::read(&got).unwrap() == fs[1].1, "bytes differ");
    }
    let counted = wait_for(Duration::from_secs(10), || {
        let h = hits(&[&n[0], &n[1], &n[2]], "f1.bin");
        h.iter().zip(&before).map(|(a, b)| a - b).sum::<usize>() == 10
    });
    assert!(
        counted.is_some(),
        "access logs: {:?}",
        hits(&[&n[0], &n[1], &n[2]], "f1.bin")
    );
    let h = hits(&[&n[0], &n[1], &n[2]], "f1.bin");
    let d: Vec<usize> = h.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(d.contains(&10), "f1.bin went to more than one node: {d:?}");

    // --watch: a fourth node is written into the file and HAProxy reloads through its
    // master socket; then some of the URIs reach it.
    let mut watcher = haproxy_config(&etcd, &bind, &cfg, Some(&sock));
    let watcher = Proc(
        watcher
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let d4 = node(&etcd, "d", "127.0.0.5", &fs, "");
    assert!(
        wait_for(Duration::from_secs(20), || {
            std::fs::read_to_string(&cfg)
                .is_ok_and(|t| t.contains(&format!("server d {} check", d4.http)))
        })
        .is_some(),
        "the watcher wrote the fourth node"
    );
    let reached = wait_for(Duration::from_secs(20), || {
        for (f, _) in &fs {
            let _ = curl(&format!("{base}/{f}"), &got);
        }
        std::thread::sleep(Duration::from_millis(100));
        fs.iter().any(|(f, _)| hits(&[&d4], f)[0] > 0)
    });
    assert!(
        reached.is_some(),
        "no request reached the fourth node after the reload"
    );
    for (f, b) in &fs {
        assert!(curl(&format!("{base}/{f}"), &got));
        assert!(std::fs::read(&got).unwrap() == *b, "{f}: bytes differ");
    }
    drop(watcher);
}

/// A real MPEG-TS of `seconds` at 2 Mbit/s (the demo's synthetic multiplex).
fn ts_clip(seconds: u64) -> Vec<u8> {
    let packets = 2_000_000 / 8 * seconds / penstock_core::ts::TS_PACKET_BYTES as u64;
    penstock_core::ts::synth::cbr_ts(packets, 2_000_000, 0, 0, 20, true)
}

/// One RTSP request on a fresh connection; the reply's head.
fn rtsp(addr: &str, req: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut out = Vec::new();
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        let k = s.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        out.extend_from_slice(&buf[..k]);
    }
    String::from_utf8_lossy(&out).to_string()
}

#[test]
fn an_rtsp_open_a_full_node_refuses_is_redirected_and_ffprobe_follows() {
    if !have("etcd", "--version") || !have("ffprobe", "-version") {
        return;
    }
    let etcd = etcd();
    let clip = vec![("clip.ts".to_string(), ts_clip(10))];
    // a admits less than one 2 Mbit/s stream; b has the default capacity.
    let full = node(
        &etcd,
        "a",
        "127.0.0.2",
        &clip,
        "[admission]\nnet_bytes_per_s = 100000\n",
    );
    let roomy = node(&etcd, "b", "127.0.0.3", &clip, "");
    assert!(
        wait_for(Duration::from_secs(20), || full
            .metric("penstock_cluster_nodes")
            == 2.0)
        .is_some(),
        "a sees both nodes"
    );
    let url = format!("rtsp://{}/clip.ts", full.rtsp);
    let want = format!("Location: rtsp://{}/clip.ts", roomy.rtsp);
    let d = rtsp(
        &full.rtsp,
        &format!("DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\n\r\n"),
    );
    assert!(d.starts_with("RTSP/1.0 302"), "{d}");
    assert!(d.contains(&want), "{d}");
    let s = rtsp(
        &full.rtsp,
        &format!(
            "SETUP {url} RTSP/1.0\r\nCSeq: 2\r\nTransport: RTP/AVP;unicast;client_port=40000-40001\r\n\r\n"
        ),
    );
    assert!(s.starts_with("RTSP/1.0 302"), "{s}");
    assert!(s.contains(&want), "{s}");
    // The roomy node answers the same DESCRIBE itself.
    let d = rtsp(
        &roomy.rtsp,
        &format!(
            "DESCRIBE rtsp://{}/clip.ts RTSP/1.0\r\nCSeq: 1\r\n\r\n",
            roomy.rtsp
        ),
    );
    assert!(d.starts_with("RTSP/1.0 200"), "{d}");

    let o = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-rtsp_transport",
            "tcp",
            "-show_entries",
            "format=format_name",
        ])
        .args(["-of", "default=nw=1:nk=1", "-timeout", "10000000", &url])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ffprobe: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("rtsp"), "{o:?}");
    assert!(full.metric("penstock_cluster_redirects_total{protocol=\"rtsp\"}") >= 3.0);
    // b served the player's SETUP and PLAY; a none.
    let played = roomy.metric("penstock_rtsp_requests_total{method=\"PLAY\",code=\"200\"}");
    assert!(played >= 1.0, "b played: {played}");

    // The control protocol: an rt OPEN a cannot admit is refused (503) and names b.
    let mut c = TcpStream::connect(&full.control).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let clip_path = full.dir.path().join("root/clip.ts");
    c.write_all(
        format!(
            "AUTH {TOKEN}\nOPEN file:{} udp://127.0.0.1:9 class=rt rate=2Mbit/s unit=1316\nQUIT\n",
            clip_path.display()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut replies = String::new();
    let _ = c.read_to_string(&mut replies);
    let refused = replies
        .lines()
        .find(|l| l.starts_with("503"))
        .unwrap_or_else(|| panic!("no 503 in {replies:?}"));
    assert!(
        refused.ends_with(&format!("; redirect node=b control={}", roomy.control)),
        "{refused}"
    );
    assert!(full.metric("penstock_cluster_redirects_total{protocol=\"control\"}") >= 1.0);
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// deploy/kubernetes: the YAML parses (python3's yaml), the DaemonSet runs on the host's
/// network with /healthz probes, and its ConfigMap's penstock.toml is a valid configuration
/// with a `[cluster]`.
#[test]
fn the_kubernetes_daemonset_parses_and_carries_a_valid_cluster_configuration() {
    let file = repo().join("deploy/kubernetes/penstock-daemonset.yaml");
    let o = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&file)
        .output();
    let o = match o {
        Ok(o) if o.status.success() => o,
        _ => {
            println!(
                "SKIPPED: python3 with its yaml module not found (apt-get install python3-yaml)"
            );
            return;
        }
    };
    let docs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let docs = docs.as_array().unwrap();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let ds = kind("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let ctr = &pod["containers"][0];
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/healthz");
    let toml = kind("ConfigMap")["data"]["penstock.toml"].as_str().unwrap();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("penstock.toml");
    std::fs::write(&p, toml).unwrap();
    let cfg = penstock_server::ServerConfig::load(&p).unwrap();
    assert!(!cfg.cluster.is_off());
    assert_eq!(cfg.cluster.lease_ttl_ms, 5000);
}

/// deploy/systemd/penstock-haproxy-config.service passes `systemd-analyze verify` (its
/// ExecStart pointed at the binary just built; its man page from `penstock man`).
#[test]
fn systemd_analyze_verify_accepts_the_haproxy_config_unit() {
    if !common::tool("systemd-analyze", "--version") {
        println!("SKIPPED: systemd-analyze not found (apt-get install systemd)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let unit =
        std::fs::read_to_string(repo().join("deploy/systemd/penstock-haproxy-config.service"))
            .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/penstock cluster haproxy-config"));
    assert!(unit.contains("--watch") && unit.contains("--master-socket"));
    let path = d.path().join("penstock-haproxy-config.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/penstock", BIN)).unwrap();
    let man1 = d.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    assert!(
        Command::new(BIN)
            .args(["man", "--dir"])
            .arg(&man1)
            .status()
            .unwrap()
            .success()
    );
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", d.path().join("man"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // verify exits 0 on unknown keys and bad values too, and says so on stderr.
    let about_ours: Vec<&str> = err.lines().filter(|l| l.contains("penstock")).collect();
    assert!(o.status.success() && about_ours.is_empty(), "{err}");
}
