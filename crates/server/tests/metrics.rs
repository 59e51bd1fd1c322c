//! The metrics page (issue 16): Prometheus conventions, every family present after HTTP
//! traffic, a refused OPEN and a paced stream, on the HTTP port and on the separate
//! listener; `promtool check metrics` finds nothing to say (when promtool is installed).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use penstock_core::control::{Limits, Reply, ReplyParser};

fn ctl_cmd(r: &mut BufReader<TcpStream>, line: &str) -> Reply {
    r.get_mut()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
    let mut p = ReplyParser::new(Limits::default());
    loop {
        let mut l = String::new();
        assert!(r.read_line(&mut l).unwrap() > 0, "server closed on {line}");
        if let Some(reply) = p.push_line(l.trim_end()).unwrap() {
            return reply;
        }
    }
}

/// GET `path` on `addr` with `accept`, raw: the whole response (the server closes).
fn scrape(addr: SocketAddr, path: &str, accept: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (status_of(head.as_bytes()), body.to_string())
}

fn value(m: &str, sample: &str) -> Option<f64> {
    m.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

/// `promtool check metrics` on `page`: `Some(output)` when it ran, `None` when promtool is
/// not installed.
pub fn promtool(page: &str) -> Option<(bool, String)> {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    Some((
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    ))
}

#[test]
fn every_family_is_there_after_http_a_refused_open_and_a_paced_stream() {
    let mut cfg = config();
    cfg.http.metrics_listen = "127.0.0.1:0".into();
    let f = start_with(cfg);
    let sep = f.server.as_ref().unwrap().metrics_addr().unwrap();

    // From the start: refusals at 0 for every resource, lateness per class at 0, the build
    // and the process.
    let (st, m) = scrape(sep, "/metrics", "*/*");
    assert_eq!(st, 200);
    for r in [
        "disk",
        "network",
        "buffers",
        "streams",
        "permission",
        "other",
    ] {
        assert_eq!(
            value(
                &m,
                &format!("penstock_admission_refusals_total{{resource=\"{r}\"}}")
            ),
            Some(0.0),
            "{r}:\n{m}"
        );
    }
    assert_eq!(
        value(&m, "penstock_http_connections_refused_total"),
        Some(0.0)
    );

    // HTTP traffic: the loop's sendfile, the engine, an error.
    assert_eq!(get(&f, "/small.txt", &[]).0, 200);
    assert_eq!(get(&f, "/big.bin", &[]).0, 200);
    assert_eq!(get(&f, "/nope", &[]).0, 404);

    // A refused OPEN (admission: the disk is short), then a paced stream of 50 units.
    let s = TcpStream::connect(f.control()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut c = BufReader::new(s);
    assert_eq!(ctl_cmd(&mut c, &format!("AUTH {TOKEN}")).code.code(), 200);
    let src = f.path("small.txt");
    let r = ctl_cmd(
        &mut c,
        &format!(
            "OPEN file:{} tcp://127.0.0.1:9 class=rt rate=1GB/s unit=1MiB",
            src.display()
        ),
    );
    assert_eq!(r.code.code(), 503, "{r:?}");
    const UNIT: usize = 4096;
    const UNITS: usize = 50;
    let paced = f.path("paced.ts");
    std::fs::write(&paced, pattern(UNIT * UNITS, 4)).unwrap();
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = rx.accept().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        all.len()
    });
    let id = ctl_cmd(
        &mut c,
        &format!(
            "OPEN file:{} tcp://{rx_addr} rate=500/s unit={UNIT}",
            paced.display()
        ),
    )
    .stream_id()
    .unwrap();
    assert_eq!(ctl_cmd(&mut c, &format!("START {id}")).code.code(), 200);
    assert_eq!(receiver.join().unwrap(), UNIT * UNITS);
    // The reaper adds the last counts when it sees the stream end: wait (bounded) for all.
    let lateness_count = "penstock_stream_lateness_seconds_count{class=\"bulk\"}";
    let mut m = String::new();
    for _ in 0..2000 {
        m = scrape(f.http, "/metrics", "*/*").1;
        if value(&m, lateness_count) == Some(UNITS as f64) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(value(&m, lateness_count), Some(UNITS as f64), "{m}");

    // Every family, by its sample names (Prometheus text 0.0.4).
    let want = [
        "penstock_http_requests_total{class=\"bulk\",data_path=\"sendfile\",code=\"2xx\"} ",
        "penstock_http_requests_total{class=\"bulk\",data_path=\"engine-sendfile\",code=\"2xx\"} ",
        "penstock_http_requests_total{class=\"bulk\",data_path=\"memory\",code=\"4xx\"} ",
        "penstock_http_body_bytes_total{class=\"bulk\",data_path=\"engine-sendfile\"} ",
        "penstock_http_request_duration_seconds_bucket{le=\"+Inf\",class=\"bulk\"} ",
        "penstock_http_request_duration_seconds_count{class=\"bulk\"} ",
        "penstock_http_time_to_first_byte_seconds_bucket{le=\"+Inf\",class=\"bulk\"} ",
        "penstock_http_time_to_first_byte_seconds_sum{class=\"bulk\"} ",
        "penstock_admission_refusals_total{resource=\"disk\"} 1",
        "penstock_admission_refusals_total{resource=\"permission\"} 0",
        "penstock_stream_lateness_seconds_bucket{le=\"+Inf\",class=\"bulk\"} 50",
        "penstock_stream_lateness_seconds_count{class=\"rt\"} 0",
        "penstock_deadline_misses_total{class=\"bulk\"} ",
        "penstock_deadline_misses_total{class=\"rt\"} 0",
        "penstock_engine_buffer_repossessions_total ",
        "penstock_engine_buffer_rereads_total ",
        "penstock_volume_members_degraded_total 0",
        "penstock_volume_checksum_failures_total 0",
        "penstock_volume_checksum_repairs_total 0",
        "penstock_engine_buffers{state=\"total\"} ",
        "penstock_disk_queue_depth{class=\"rt\"} ",
        "penstock_streams_active ",
        "penstock_access_log_dropped_lines_total 0",
        "penstock_peer_log_suppressed_lines_total{kind=\"control_fds_refused\"} 0",
        "penstock_peer_log_suppressed_lines_total{kind=\"control_wrong_token\"} ",
        "penstock_volume_scrub_passes_total 0",
        "penstock_volume_scrub_repaired_units_total 0",
        "penstock_hls_playlist_requests_total{kind=\"media\"} 0",
        "penstock_hls_playlist_requests_total{kind=\"master\"} 0",
        "penstock_hls_segment_requests_total 0",
        "penstock_hls_sessions 0",
        "penstock_hls_sessions_admitted_total 0",
        "penstock_hls_sessions_refused_total 0",
        "penstock_hls_sessions_expired_total 0",
        "penstock_worker_sched{worker=\"0\",role=\"general\",policy=\"other\"} 1",
        &format!(
            "penstock_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        ),
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_virtual_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "process_threads ",
    ];
    for w in want {
        assert!(m.lines().any(|l| l.starts_with(w)), "{w} missing:\n{m}");
    }
    for (family, kind) in [
        ("penstock_engine_buffer_repossessions_total", "counter"),
        ("penstock_http_requests_total", "counter"),
        ("penstock_http_request_duration_seconds", "histogram"),
        ("penstock_http_time_to_first_byte_seconds", "histogram"),
        ("penstock_stream_lateness_seconds", "histogram"),
        ("penstock_build_info", "gauge"),
        ("process_cpu_seconds_total", "counter"),
    ] {
        assert!(
            m.contains(&format!("# TYPE {family} {kind}\n")),
            "{family} {kind}:\n{m}"
        );
    }
    assert!(
        !m.contains(",path=\"") && !m.contains("{path=\""),
        "the label is data_path now:\n{m}"
    );
    assert!(!m.contains("# EOF"), "{m}");

    // The separate listener serves the same families; nothing else.
    let (st, sm) = scrape(sep, "/metrics", "*/*");
    assert_eq!(st, 200);
    assert!(
        sm.contains("penstock_admission_refusals_total{resource=\"disk\"} 1"),
        "{sm}"
    );
    assert_eq!(scrape(sep, "/small.txt", "*/*").0, 404);
    let (st, om) = scrape(
        sep,
        "/metrics",
        "application/openmetrics-text; version=1.0.0",
    );
    assert_eq!(st, 200);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains("# TYPE penstock_engine_buffer_repossessions counter\n"),
        "{om}"
    );

    if penstock_testreq::require("promtool") {
        let (ok, out) = promtool(&m).expect("promtool runs");
        assert!(ok, "promtool check metrics failed:\n{out}\n{m}");
        assert!(
            out.trim().is_empty(),
            "promtool has something to say:\n{out}"
        );
    }
}
