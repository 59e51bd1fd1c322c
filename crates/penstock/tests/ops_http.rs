//! Issue 16 as an operator sees it from outside: `penstock serve` logs every request on
//! stdout by default and reopens its log file on SIGUSR1 (logrotate); `penstock stream` and
//! `penstock record` serve Prometheus metrics with `--metrics ADDR`. Waits are bounded loops;
//! nothing asserts a duration.

mod common;

use common::{assert_promtool_clean, sample, scrape, serve_addresses};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_penstock");

fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

/// Kills the child if a test fails before it exits.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn get(addr: &str, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out[..out.len().min(12)])
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The lines of a child's pipe, as they come, through a channel.
fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

fn next_line(rx: &mpsc::Receiver<String>, what: &str) -> String {
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("no {what}: {e}"))
}

fn serve(dir: &Path, conf: &str) -> (Reap, String, mpsc::Receiver<String>) {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("a.txt"), b"hello").unwrap();
    let path = dir.join("penstock.toml");
    std::fs::write(&path, conf).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--control", "", "--no-control-unix", "--config"])
        .arg(&path)
        .arg("--root")
        .arg(&www)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = lines_of(child.stdout.take().unwrap());
    let start = next_line(&out, "start line");
    let (http, _) = serve_addresses(&start);
    // Its details follow, indented: bodies, descriptors and workers, the root.
    for _ in 0..3 {
        let d = next_line(&out, "start detail line");
        assert!(d.starts_with("  "), "not a start detail line: {d:?}");
    }
    (Reap(child), http, out)
}

#[test]
fn serve_logs_every_request_on_stdout_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, http, out) = serve(
        dir.path(),
        "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
    );
    assert_eq!(get(&http, "/a.txt"), 200);
    assert_eq!(get(&http, "/missing"), 404);
    let mut got = vec![
        next_line(&out, "access line"),
        next_line(&out, "access line"),
    ];
    got.sort();
    assert!(
        got[0].starts_with("127.0.0.1 - - [")
            && got[0].contains("] \"GET /a.txt HTTP/1.1\" 200 5 \"-\" \"-\" rt=")
            && got[0].ends_with(" path=sendfile"),
        "{got:#?}"
    );
    assert!(
        got[1].contains("\"GET /missing HTTP/1.1\" 404 "),
        "{got:#?}"
    );
    signal(&child.0, rustix::process::Signal::TERM);
    assert!(child.0.wait().unwrap().success());
    // Exactly those two.
    assert!(out.recv_timeout(Duration::from_secs(5)).is_err());
}

fn file_lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_file_lines(p: &Path, n: usize) -> Vec<String> {
    for _ in 0..3000 {
        let l = file_lines(p);
        if l.len() >= n {
            return l;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    file_lines(p)
}

#[test]
fn sigusr1_reopens_the_access_log_after_logrotate_renamed_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let (mut child, http, out) = serve(
        dir.path(),
        &format!(
            "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"127.0.0.1:0\"\n[log]\naccess = \"{}\"\naccess_flush_ms = 20\n",
            log.display()
        ),
    );
    for i in 0..2 {
        assert_eq!(get(&http, &format!("/a.txt?before={i}")), 200);
    }
    assert_eq!(wait_file_lines(&log, 2).len(), 2);
    std::fs::rename(&log, &rotated).unwrap();
    signal(&child.0, rustix::process::Signal::USR1);
    for _ in 0..3000 {
        if log.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(log.exists(), "SIGUSR1 did not reopen the log's path");
    for i in 0..3 {
        assert_eq!(get(&http, &format!("/a.txt?after={i}")), 200);
    }
    let new = wait_file_lines(&log, 3);
    signal(&child.0, rustix::process::Signal::TERM);
    assert!(child.0.wait().unwrap().success());
    assert_eq!(new.len(), 3, "{new:#?}");
    assert!(new.iter().all(|l| l.contains("?after=")), "{new:#?}");
    let old = file_lines(&rotated);
    assert_eq!(old.len(), 2, "{old:#?}");
    assert!(old.iter().all(|l| l.contains("?before=")), "{old:#?}");
    // With a file, stdout has the start lines only.
    assert!(out.recv_timeout(Duration::from_millis(200)).is_err());
}

/// The address from `penstock: metrics on http://ADDR/metrics` among stderr's lines.
fn metrics_addr(err: &mpsc::Receiver<String>) -> String {
    loop {
        let l = next_line(err, "metrics line on stderr");
        if let Some(rest) = l.strip_prefix("penstock: metrics on http://") {
            return rest.trim_end_matches("/metrics").to_string();
        }
    }
}

#[test]
fn stream_serves_lateness_by_class_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.ts");
    // 300 units of 1 KiB at 100 units/s: three seconds to scrape in.
    std::fs::write(&src, vec![7u8; 300 * 1024]).unwrap();
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut child = Command::new(BIN)
        .arg("stream")
        .arg(&src)
        .arg(format!("udp://{}", rx.local_addr().unwrap()))
        .args([
            "--rate",
            "100/s",
            "--unit",
            "1KiB",
            "--metrics",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = lines_of(child.stderr.take().unwrap());
    let mut child = Reap(child);
    let addr = metrics_addr(&err);
    let units = "penstock_stream_units_total";
    let lateness = "penstock_stream_lateness_seconds_count{class=\"bulk\"}";
    let mut page = String::new();
    for _ in 0..3000 {
        page = scrape(&addr).unwrap_or_default();
        if sample(&page, lateness).is_some_and(|n| n >= 10.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        sample(&page, lateness).is_some_and(|n| n >= 10.0),
        "no lateness counted while the stream ran:\n{page}"
    );
    assert!(sample(&page, units).is_some_and(|n| n >= 10.0), "{page}");
    for w in [
        "penstock_stream_lateness_seconds_bucket{le=\"+Inf\",class=\"bulk\"} ",
        "penstock_stream_lateness_seconds_count{class=\"rt\"} 0",
        "penstock_deadline_misses_total{class=\"bulk\"} ",
        "penstock_stream_bytes_total ",
        "penstock_engine_buffers{state=\"total\"} ",
        "penstock_engine_buffer_repossessions_total ",
        "penstock_build_info{version=",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
    ] {
        assert!(
            page.lines().any(|l| l.starts_with(w)),
            "{w} missing:\n{page}"
        );
    }
    assert_promtool_clean(&page);
    let st = child.0.wait().unwrap();
    assert!(st.success(), "{st}");
    drop(rx);
}

#[test]
fn record_serves_its_durable_counts_while_it_records() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("rec.ts");
    let mut child = Command::new(BIN)
        .args(["record", "udp-listen://127.0.0.1:0"])
        .arg(&dst)
        .args(["--sync-every", "50ms", "--metrics", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    let mut child = Reap(child);
    let listening = next_line(&out, "listening line");
    let to = listening.strip_prefix("listening ").unwrap().to_string();
    let addr = metrics_addr(&err);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    const PACKETS: u64 = 40;
    for i in 0..PACKETS {
        tx.send_to(&[i as u8; 188], &to).unwrap();
    }
    let mut page = String::new();
    for _ in 0..3000 {
        page = scrape(&addr).unwrap_or_default();
        if sample(&page, "penstock_record_packets_total") == Some(PACKETS as f64) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        sample(&page, "penstock_record_packets_total"),
        Some(PACKETS as f64),
        "{page}"
    );
    assert_eq!(
        sample(&page, "penstock_record_bytes_total"),
        Some((PACKETS * 188) as f64),
        "{page}"
    );
    assert!(
        sample(&page, "penstock_record_syncs_total").is_some_and(|n| n >= 1.0),
        "{page}"
    );
    assert!(page.contains("process_start_time_seconds "), "{page}");
    assert_promtool_clean(&page);
    signal(&child.0, rustix::process::Signal::INT);
    assert!(child.0.wait().unwrap().success());
}
