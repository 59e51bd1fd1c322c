//! The control protocol on loopback: Cues' remote control (a second connection drives a
//! stream with its id and the token), pause and resume with exact bytes, admission
//! refusals that name the shortage, and the token rule for TCP peers (loopback included:
//! an address says nothing about who the peer is).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use penstock_core::control::{Limits, Reply, ReplyParser};

struct Ctl {
    r: BufReader<TcpStream>,
}

impl Ctl {
    fn connect(addr: SocketAddr) -> Ctl {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Ctl {
            r: BufReader::new(s),
        }
    }

    /// A connection that has sent the token (TCP peers may do nothing else before).
    fn authed(addr: SocketAddr) -> Ctl {
        let mut c = Ctl::connect(addr);
        assert_eq!(c.cmd(&format!("AUTH {TOKEN}")).code.code(), 200);
        c
    }

    fn cmd(&mut self, line: &str) -> Reply {
        self.r
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let mut p = ReplyParser::new(Limits::default());
        loop {
            let mut l = String::new();
            assert!(
                self.r.read_line(&mut l).unwrap() > 0,
                "server closed on {line}"
            );
            if let Some(r) = p.push_line(l.trim_end()).unwrap() {
                return r;
            }
        }
    }
}

fn state_field(reply: &Reply, key: &str) -> Option<u64> {
    reply.lines.first().and_then(|l| {
        l.split(' ').find_map(|w| {
            w.strip_prefix(&format!("{key}="))
                .and_then(|v| v.parse().ok())
        })
    })
}

#[test]
fn a_second_connection_drives_the_stream_pauses_resumes_and_the_bytes_are_exact() {
    let f = start();
    const LEN: usize = 32 << 20;
    let data = pattern(LEN, 7);
    let src = f.path("movie.ts");
    std::fs::write(&src, &data).unwrap();

    // The receiver does not read until told: the socket buffers fill, so the stream is
    // certainly still running when it is paused.
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = rx.accept().unwrap();
        go_rx.recv().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        all
    });

    let mut a = Ctl::authed(f.control());
    let opened = a.cmd(&format!(
        "OPEN file:{} tcp://{rx_addr} DETACHED",
        src.display()
    ));
    assert_eq!(opened.code.code(), 201, "{opened:?}");
    let id = opened.stream_id().unwrap();

    // A second connection: refused without the token, allowed with it.
    let mut b = Ctl::connect(f.control());
    assert_eq!(b.cmd(&format!("START {id}")).code.code(), 401);
    assert_eq!(b.cmd("AUTH wrong-token-wrong").code.code(), 403);
    assert_eq!(b.cmd(&format!("AUTH {TOKEN}")).code.code(), 200);
    assert_eq!(b.cmd(&format!("START {id}")).code.code(), 200);
    assert_eq!(b.cmd(&format!("START {id}")).code.code(), 409);
    // The opener's connection may end: the stream is DETACHED.
    drop(a);

    let paused = b.cmd(&format!("PAUSE {id}"));
    assert_eq!(paused.code.code(), 200, "{paused:?}");
    let st = b.cmd(&format!("STATE {id}"));
    assert!(st.lines[0].contains(" paused "), "{st:?}");
    let sent_at_pause = state_field(&st, "sent").unwrap();
    assert!(sent_at_pause < LEN as u64, "finished before the pause");
    assert_eq!(state_field(&st, "offset"), Some(sent_at_pause));
    // While paused, no byte moves.
    let st2 = b.cmd(&format!("STATE {id}"));
    assert_eq!(state_field(&st2, "sent"), Some(sent_at_pause));
    assert_eq!(b.cmd(&format!("RESUME {id}")).code.code(), 200);
    assert_eq!(b.cmd(&format!("RESUME {id}")).code.code(), 409);
    go_tx.send(()).unwrap();

    let mut done = false;
    for _ in 0..3000 {
        let st = b.cmd(&format!("STATE {id},999999"));
        assert_eq!(st.lines.len(), 2);
        assert_eq!(st.lines[1], "999999 unknown");
        if st.lines[0].contains(" done ") {
            assert_eq!(state_field(&st, "sent"), Some(LEN as u64));
            done = true;
            break;
        }
        assert!(!st.lines[0].contains(" failed "), "{st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(done, "stream never finished");
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), LEN);
    assert!(got == data, "bytes differ after pause/resume");
    let closed = b.cmd(&format!("CLOSE {id}"));
    assert_eq!(closed.code.code(), 200, "{closed:?}");
    assert_eq!(
        b.cmd(&format!("STATE {id}")).lines[0],
        format!("{id} unknown")
    );
}

#[test]
fn seek_and_length_edit_a_pending_stream() {
    let f = start();
    let data = pattern(100_000, 9);
    let src = f.path("clip.bin");
    std::fs::write(&src, &data).unwrap();
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = rx.accept().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        all
    });
    let mut c = Ctl::authed(f.control());
    let id = c
        .cmd(&format!("OPEN file:{} tcp://{rx_addr}", src.display()))
        .stream_id()
        .unwrap();
    assert_eq!(c.cmd(&format!("SEEK {id} 1000")).code.code(), 200);
    assert_eq!(c.cmd(&format!("LENGTH {id} 5000")).code.code(), 200);
    assert_eq!(c.cmd(&format!("UNIT {id} 4KiB")).code.code(), 200);
    assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
    assert_eq!(c.cmd(&format!("SEEK {id} 0")).code.code() / 100, 4);
    let got = receiver.join().unwrap();
    assert!(got == data[1000..6000]);
    let all = c.cmd("STATE *");
    assert_eq!(all.lines.len(), 1);
    assert_eq!(c.cmd(&format!("CLOSE {id} NOW")).code.code(), 200);
    assert_eq!(c.cmd(&format!("PAUSE {id}")).code.code(), 404);
    assert_eq!(c.cmd("BOGUS").code.code(), 400);
    assert_eq!(c.cmd("QUIT").code.code(), 221);
}

#[test]
fn a_refused_open_names_the_shortage() {
    // The disk's figures set here: 100 MB/s, 1,000 reads/s (not this machine's, which the
    // test cannot know).
    let mut cfg = config();
    cfg.admission.disk_seq_bytes_per_s = Some(100_000_000);
    cfg.admission.disk_random_iops = Some(1000);
    let f = start_with(cfg);
    let src = f.path("small.txt");
    let mut c = Ctl::authed(f.control());
    let r = c.cmd(&format!(
        "OPEN file:{} tcp://127.0.0.1:9 class=rt rate=1GB/s unit=1MiB",
        src.display()
    ));
    assert_eq!(r.code.code(), 503, "{r:?}");
    assert!(
        r.text.contains("refused") && r.text.contains("disk"),
        "{r:?}"
    );
    // A modest rt stream fits, and STATS shows its reservation.
    let r = c.cmd(&format!(
        "OPEN file:{} tcp://127.0.0.1:9 class=rt rate=1MB/s unit=64KiB",
        src.display()
    ));
    assert_eq!(r.code.code(), 201, "{r:?}");
    let stats = c.cmd("STATS");
    assert!(stats.lines.iter().any(|l| l == "admitted 1"), "{stats:?}");
    // Reserved shares per resource: CPU for its sends, and the device it was charged on
    // (admitted at OPEN, before the file is opened: the default device, with the configured
    // figures) with where its figures came from.
    assert!(
        stats
            .lines
            .iter()
            .any(|l| l.starts_with("rt_cpu_ns_per_s ") && !l.starts_with("rt_cpu_ns_per_s 0 ")),
        "{stats:?}"
    );
    assert!(
        stats
            .lines
            .iter()
            .any(|l| l.starts_with("rt_disk_device default ")
                && !l.starts_with("rt_disk_device default 0 ")
                && l.contains(" figures=configured")),
        "{stats:?}"
    );
    let m = String::from_utf8(
        agent()
            .get(f.url("/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_vec()
            .unwrap(),
    )
    .unwrap();
    assert!(
        m.contains("penstock_admission_refusals_total{resource=\"disk\"} 1"),
        "{m}"
    );
    let disk_share = m
        .lines()
        .find_map(|l| l.strip_prefix("penstock_admission_reserved_ratio{resource=\"disk\"} "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no reserved disk share: {m}"));
    assert!(disk_share > 0.0 && disk_share < 1.0, "{disk_share}");
    assert!(
        m.contains("penstock_admission_device_reserved_ratio{device=\"default\",figures="),
        "{m}"
    );
}

#[test]
fn a_tcp_peer_needs_the_token_even_on_loopback() {
    let f = start();
    let mut peer = Ctl::connect(f.control());
    assert_eq!(peer.cmd("STATS").code.code(), 401);
    assert_eq!(peer.cmd("STATE *").code.code(), 401);
    let src = f.path("small.txt");
    let open = format!("OPEN file:{} tcp://127.0.0.1:9", src.display());
    assert_eq!(peer.cmd(&open).code.code(), 401);
    assert_eq!(peer.cmd("HELP").code.code(), 214);
    assert_eq!(peer.cmd("AUTH nope-nope-nope").code.code(), 403);
    assert_eq!(peer.cmd("STATS").code.code(), 401);
    assert_eq!(peer.cmd(&format!("AUTH {TOKEN}")).code.code(), 200);
    assert_eq!(peer.cmd("STATS").code.code(), 212);
    assert_eq!(peer.cmd(&open).code.code(), 201);
}

#[test]
fn streams_of_a_closed_connection_are_closed_unless_detached() {
    let f = start();
    let src = f.path("small.txt");
    let mut a = Ctl::authed(f.control());
    let kept = a
        .cmd(&format!(
            "OPEN file:{} tcp://127.0.0.1:9 DETACHED",
            src.display()
        ))
        .stream_id()
        .unwrap();
    let gone = a
        .cmd(&format!("OPEN file:{} tcp://127.0.0.1:9", src.display()))
        .stream_id()
        .unwrap();
    drop(a);
    let mut b = Ctl::authed(f.control());
    let mut last = String::new();
    for _ in 0..3000 {
        let st = b.cmd(&format!("STATE {kept},{gone}"));
        last = format!("{st:?}");
        if st.lines[1] == format!("{gone} unknown") {
            assert!(st.lines[0].contains(" pending "), "{st:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the non-detached stream outlived its connection: {last}");
}

/// A receiver that counts bytes as they arrive (`count`) and returns them all at EOF; it
/// starts reading after `delay`.
fn counting_receiver(
    delay: Duration,
) -> (
    SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    std::thread::JoinHandle<Vec<u8>>,
) {
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = rx.local_addr().unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c = count.clone();
    let h = std::thread::spawn(move || {
        let (mut s, _) = rx.accept().unwrap();
        std::thread::sleep(delay);
        let mut all = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&buf[..n]);
            c.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (addr, count, h)
}

fn wait_done(c: &mut Ctl, id: penstock_core::control::StreamId) -> Reply {
    for _ in 0..6000 {
        let st = c.cmd(&format!("STATE {id}"));
        if st.lines[0].contains(" done ") {
            return st;
        }
        assert!(!st.lines[0].contains(" failed "), "{st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("stream {id} never finished");
}

fn metrics_text(f: &Fixture) -> String {
    String::from_utf8(
        agent()
            .get(f.url("/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_vec()
            .unwrap(),
    )
    .unwrap()
}

fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_paused_periodic_stream_sends_nothing_while_paused_and_keeps_its_pace() {
    let f = start();
    // 200 units of 4 KiB at 100 units/s: 2 s of pacing without the pause.
    const UNIT: usize = 4096;
    const UNITS: usize = 200;
    const RATE: usize = 100;
    let data = pattern(UNIT * UNITS, 11);
    let src = f.path("paced.ts");
    std::fs::write(&src, &data).unwrap();
    let (rx_addr, count, receiver) = counting_receiver(Duration::ZERO);

    let mut c = Ctl::authed(f.control());
    let opened = c.cmd(&format!(
        "OPEN file:{} tcp://{rx_addr} rate={RATE}/s unit={UNIT}",
        src.display()
    ));
    assert_eq!(opened.code.code(), 201, "{opened:?}");
    let id = opened.stream_id().unwrap();
    let started_at = std::time::Instant::now();
    assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
    // The event: some units arrived (a bounded poll), then a few more periods of pacing.
    let t0 = std::time::Instant::now();
    while count.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "nothing arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200)); // pacing: let it run a while
    let paused = c.cmd(&format!("PAUSE {id}"));
    let ran_s = started_at.elapsed().as_secs_f64();
    assert_eq!(paused.code.code(), 200, "{paused:?}");
    let st = c.cmd(&format!("STATE {id}"));
    assert!(st.lines[0].contains(" paused "), "{st:?}");
    assert!(st.lines[0].contains("paced=yes"), "{st:?}");
    let sent = state_field(&st, "sent").unwrap();
    // Units already handed to the socket arrive: wait (bounded) for the receiver to have
    // every byte the stream says it sent, then nothing more.
    let t0 = std::time::Instant::now();
    while count.load(std::sync::atomic::Ordering::SeqCst) < sent {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "sent bytes never arrived"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let at_pause = count.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(at_pause, sent, "{st:?}");
    // Paced: no more than the rate allows in the time it ran (plus one unit; a lower bound
    // on the time, never an upper one).
    let allowed = ((ran_s * RATE as f64).ceil() as u64 + 1) * UNIT as u64;
    assert!(
        at_pause <= allowed,
        "paced stream ran ahead of its rate: {at_pause} bytes in {ran_s:.3} s (at most {allowed})"
    );
    // A window of 80 periods in which an unpaused stream would send 80 units: none arrive.
    std::thread::sleep(Duration::from_millis(800));
    let after_window = count.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        after_window, at_pause,
        "bytes arrived while the stream was paused"
    );
    let st = c.cmd(&format!("STATE {id}"));
    assert_eq!(state_field(&st, "sent"), Some(at_pause), "{st:?}");

    let resumed_at = std::time::Instant::now();
    assert_eq!(c.cmd(&format!("RESUME {id}")).code.code(), 200);
    let st = wait_done(&mut c, id);
    let took = resumed_at.elapsed();
    assert_eq!(state_field(&st, "sent"), Some((UNIT * UNITS) as u64));
    // The same engine stream went on at its pace: no burst to catch up on the pause. The
    // rest needs (units left)/rate; allow half of that (a generous lower bound).
    let units_left = (UNIT * UNITS) as u64 - at_pause;
    let paced_s = units_left as f64 / UNIT as f64 / RATE as f64;
    assert!(
        took.as_secs_f64() >= paced_s * 0.5,
        "the rest came in {took:?}, its pace needs {paced_s:.2} s"
    );
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes differ after pause/resume");
}

#[test]
fn an_edit_while_paused_restarts_the_stream_at_the_new_offset() {
    let f = start();
    const LEN: usize = 8 << 20;
    let data = pattern(LEN, 13);
    let src = f.path("seekme.bin");
    std::fs::write(&src, &data).unwrap();
    // The receiver waits, so the stream is still running at the pause.
    let (rx_addr, count, receiver) = counting_receiver(Duration::from_millis(500));
    let mut c = Ctl::authed(f.control());
    let id = c
        .cmd(&format!("OPEN file:{} tcp://{rx_addr}", src.display()))
        .stream_id()
        .unwrap();
    assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
    let paused = c.cmd(&format!("PAUSE {id}"));
    assert_eq!(paused.code.code(), 200, "{paused:?}");
    // The first edit stops the engine stream; from then on `sent` is final. (Before it, on
    // the uring path, a send already in the ring may still complete once the receiver reads.)
    assert_eq!(c.cmd(&format!("LENGTH {id} 1MiB")).code.code(), 200);
    let sent = state_field(&c.cmd(&format!("STATE {id}")), "sent").unwrap();
    assert!(sent < LEN as u64, "finished before the pause");
    // Skip 1 MiB ahead of what was sent, and send 1 MiB from there.
    let skip_to = sent + (1 << 20);
    assert_eq!(c.cmd(&format!("SEEK {id} {skip_to}")).code.code(), 200);
    let st = c.cmd(&format!("STATE {id}"));
    assert!(st.lines[0].contains(" paused "), "{st:?}");
    assert_eq!(state_field(&st, "offset"), Some(skip_to), "{st:?}");
    assert_eq!(c.cmd(&format!("RESUME {id}")).code.code(), 200);
    let st = wait_done(&mut c, id);
    assert_eq!(state_field(&st, "sent"), Some(sent + (1 << 20)), "{st:?}");
    assert_eq!(c.cmd(&format!("CLOSE {id}")).code.code(), 200);
    let got = receiver.join().unwrap();
    let s = sent as usize;
    assert_eq!(got.len(), s + (1 << 20));
    assert!(got[..s] == data[..s], "bytes before the pause differ");
    assert!(
        got[s..] == data[s + (1 << 20)..s + (2 << 20)],
        "bytes after the seek differ"
    );
    assert_eq!(
        count.load(std::sync::atomic::Ordering::SeqCst),
        got.len() as u64
    );
}

#[test]
fn a_periodic_stream_feeds_the_lateness_histogram_and_its_misses() {
    let f = start();
    // 128 units of 64 KiB at 200 units/s; the receiver sleeps 1 s first, so the socket fills
    // and units go out late (misses: later than one period, 5 ms).
    const UNIT: usize = 64 << 10;
    const UNITS: u64 = 128;
    let data = pattern(UNIT * UNITS as usize, 17);
    let src = f.path("late.ts");
    std::fs::write(&src, &data).unwrap();
    let (rx_addr, _count, receiver) = counting_receiver(Duration::from_secs(1));
    let mut c = Ctl::authed(f.control());
    let id = c
        .cmd(&format!(
            "OPEN file:{} tcp://{rx_addr} rate=200/s unit={UNIT}",
            src.display()
        ))
        .stream_id()
        .unwrap();
    let before = metrics_text(&f);
    assert_eq!(
        metric_value(
            &before,
            "penstock_stream_lateness_seconds_count{class=\"bulk\"}"
        ),
        Some(0.0),
        "{before}"
    );
    assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
    wait_done(&mut c, id);
    let got = receiver.join().unwrap();
    assert!(got == data);
    let m = metrics_text(&f);
    println!("{m}");
    // Without class=, a control stream is in the engine's bulk class.
    let count = metric_value(&m, "penstock_stream_lateness_seconds_count{class=\"bulk\"}").unwrap();
    let misses = metric_value(&m, "penstock_deadline_misses_total{class=\"bulk\"}").unwrap();
    assert_eq!(
        count, UNITS as f64,
        "every unit's lateness is counted:\n{m}"
    );
    assert!(
        misses > 0.0,
        "units sent into a full socket were late:\n{m}"
    );
    assert!(misses <= count, "{m}");
    // The late units are in the upper buckets: fewer than all are within 8 µs.
    let within_8us = metric_value(
        &m,
        "penstock_stream_lateness_seconds_bucket{le=\"0.000008192\",class=\"bulk\"}",
    )
    .unwrap();
    assert!(within_8us < count, "{m}");
    assert!(
        m.contains("penstock_disk_queue_depth{class=\"rt\"}"),
        "disk queue depth is reported per class:\n{m}"
    );
    let total = metric_value(&m, "penstock_engine_buffers{state=\"total\"}").unwrap();
    assert!(total > 0.0, "the engine's pool is reported:\n{m}");
    assert!(
        m.contains("penstock_engine_buffers{state=\"bulk_borrowed\"}"),
        "{m}"
    );
}

fn unix_cmds(path: &std::path::Path, lines: &[&str]) -> Vec<Reply> {
    let s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s);
    lines
        .iter()
        .map(|line| {
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
        })
        .collect()
}

#[test]
fn idle_tcp_connections_do_not_lock_out_the_unix_socket() {
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("ctl.sock");
    let mut cfg = config();
    cfg.control.unix = Some(sock.clone());
    // All from 127.0.0.1: the per-address cap (tests/lockout.rs in the penstock crate tests
    // it) would bind before the total tested here.
    cfg.control.tcp_connections_per_address_max = 64;
    let f = start_with(cfg);
    // 64 idle TCP connections fill the TCP cap (each answered once, so each is accepted).
    let mut idle: Vec<Ctl> = (0..64).map(|_| Ctl::connect(f.control())).collect();
    for c in &mut idle {
        assert_eq!(c.cmd("HELP").code.code(), 214);
    }
    let mut extra = TcpStream::connect(f.control()).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut refused = String::new();
    let _ = extra.read_to_string(&mut refused);
    assert!(refused.starts_with("503 too many"), "{refused:?}");
    // The socket's owner (this test's uid: allowed by SO_PEERCRED) still gets in, needs no
    // token for its own streams, and is still confined.
    let src = f.path("small.txt");
    let replies = unix_cmds(
        &sock,
        &[
            "STATS",
            &format!("OPEN file:{} tcp://127.0.0.1:9", src.display()),
            "OPEN file:/etc/passwd tcp://127.0.0.1:9",
        ],
    );
    assert_eq!(replies[0].code.code(), 212, "{replies:?}");
    assert!(
        replies[0]
            .lines
            .iter()
            .any(|l| l == "control_connections_tcp 64"),
        "{replies:?}"
    );
    assert_eq!(replies[1].code.code(), 201, "{replies:?}");
    assert_eq!(replies[2].code.code(), 403, "{replies:?}");
    assert!(replies[2].text.contains("outside the roots"), "{replies:?}");
}

#[test]
fn detached_opens_without_the_token_are_refused_and_stale_streams_expire() {
    let mut cfg = config();
    cfg.control.pending_timeout_ms = 300;
    cfg.control.streams_per_connection_max = 8;
    let f = start_with(cfg);
    let src = f.path("small.txt");
    let open = format!("OPEN file:{} tcp://127.0.0.1:9 DETACHED", src.display());
    let mut anon = Ctl::connect(f.control());
    for _ in 0..1100 {
        assert_eq!(anon.cmd(&open).code.code(), 401);
    }
    let mut c = Ctl::authed(f.control());
    let stats = c.cmd("STATS");
    assert!(stats.lines.iter().any(|l| l == "streams 0"), "{stats:?}");
    // With the token: at most streams_per_connection_max at once.
    for i in 0..8 {
        assert_eq!(c.cmd(&open).code.code(), 201, "open {i}");
    }
    let ninth = c.cmd(&open);
    assert_eq!(ninth.code.code(), 503, "{ninth:?}");
    assert!(
        ninth.text.contains("streams_per_connection_max"),
        "{ninth:?}"
    );
    // Never started: gone after pending_timeout_ms, places and reservations back.
    let mut expired = false;
    for _ in 0..500 {
        let stats = c.cmd("STATS");
        if stats.lines.iter().any(|l| l == "streams 0") {
            assert!(stats.lines.iter().any(|l| l == "admitted 0"), "{stats:?}");
            expired = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(expired, "pending streams did not expire");
    assert_eq!(c.cmd(&open).code.code(), 201);
}

#[test]
fn wrong_tokens_close_the_connection_and_silent_strangers_are_dropped() {
    let f = start();
    let mut c = Ctl::connect(f.control());
    assert_eq!(c.cmd("AUTH wrong-token-number-1").code.code(), 403);
    assert_eq!(c.cmd("AUTH wrong-token-number-2").code.code(), 403);
    let last = c.cmd("AUTH wrong-token-number-3");
    assert_eq!(last.code.code(), 403);
    assert!(last.text.contains("closing"), "{last:?}");
    let mut rest = String::new();
    let _ = c.r.read_to_string(&mut rest);
    assert_eq!(rest, "", "the connection stayed open");
    // An anonymous connection that never authenticates is closed after auth_timeout_ms.
    let mut cfg = config();
    cfg.control.auth_timeout_ms = 300;
    let f = start_with(cfg);
    let mut s = TcpStream::connect(f.control()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut bye = String::new();
    let _ = s.read_to_string(&mut bye);
    assert!(bye.starts_with("421 authentication timeout"), "{bye:?}");
}

#[test]
fn a_file_target_is_created_only_beneath_a_write_root_and_cut_only_when_asked() {
    let rec = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, rec.path().join("link")).unwrap();
    let mut cfg = config();
    cfg.control.write_roots = vec![rec.path().to_path_buf()];
    let f = start_with(cfg);
    let src = f.path("small.txt");
    let mut c = Ctl::authed(f.control());
    let copy = |c: &mut Ctl, dst: &str| -> (Reply, Option<Reply>) {
        let o = c.cmd(&format!("OPEN file:{} {dst}", src.display()));
        match o.stream_id() {
            Some(id) => {
                let st = c.cmd(&format!("START {id}"));
                let done = (st.code.code() == 200).then(|| wait_done(c, id));
                (st, done)
            }
            None => (o, None),
        }
    };
    let out = rec.path().join("out.bin");
    let (st, _) = copy(&mut c, &format!("file:{}", out.display()));
    assert_eq!(st.code.code(), 200, "{st:?}");
    assert_eq!(std::fs::read(&out).unwrap(), pattern(1000, 1));
    // Exists: refused unless TRUNCATE.
    let (st, _) = copy(&mut c, &format!("file:{}", out.display()));
    assert_eq!(st.code.code(), 500, "{st:?}");
    assert!(st.text.contains("TRUNCATE"), "{st:?}");
    let (st, _) = copy(&mut c, &format!("file:{} TRUNCATE", out.display()));
    assert_eq!(st.code.code(), 200, "{st:?}");
    assert_eq!(std::fs::read(&out).unwrap(), pattern(1000, 1));
    // Through a planted link, or outside the write root: refused, nothing written.
    for dst in [
        format!("file:{} TRUNCATE", rec.path().join("link").display()),
        format!("file:{}", rec.path().join("link").display()),
        format!("file:{} TRUNCATE", victim.display()),
        format!("file:{}", f.path("new.bin").display()),
    ] {
        let (st, _) = copy(&mut c, &dst);
        assert_eq!(st.code.code(), 403, "{dst}: {st:?}");
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(!f.path("new.bin").exists());
}

#[test]
fn stats_answers_while_a_listening_stream_waits_for_its_peer() {
    let f = start();
    let src = f.path("big.bin");
    let mut c = Ctl::authed(f.control());
    let id = c
        .cmd(&format!(
            "OPEN file:{} tcp-listen://127.0.0.1:0",
            src.display()
        ))
        .stream_id()
        .unwrap();
    let started = c.cmd(&format!("START {id}"));
    assert_eq!(started.code.code(), 200, "{started:?}");
    let addr = started.text.rsplit(' ').next().unwrap().to_string();
    let st = c.cmd(&format!("STATE {id}"));
    assert!(st.lines[0].contains(" waiting "), "{st:?}");
    // Another connection's STATS and STATE * answer while the peer is awaited.
    let mut other = Ctl::authed(f.control());
    let t = std::time::Instant::now();
    assert_eq!(other.cmd("STATS").code.code(), 212);
    assert_eq!(other.cmd("STATE *").code.code(), 211);
    eprintln!(
        "STATS and STATE * while a listener waits: {:?}",
        t.elapsed()
    );
    // The peer arrives: the stream runs and delivers the file.
    let mut peer = TcpStream::connect(&addr).unwrap();
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got, pattern(3 << 20, 3));
    let done = wait_done(&mut c, id);
    assert!(done.lines[0].contains(" done "), "{done:?}");
    // CLOSE stops a wait at once; its port is free again.
    let id = c
        .cmd(&format!(
            "OPEN file:{} tcp-listen://127.0.0.1:0",
            src.display()
        ))
        .stream_id()
        .unwrap();
    let started = c.cmd(&format!("START {id}"));
    let addr = started.text.rsplit(' ').next().unwrap().to_string();
    assert_eq!(c.cmd(&format!("CLOSE {id}")).code.code(), 200);
    let mut freed = false;
    for _ in 0..100 {
        if TcpListener::bind(&addr).is_ok() {
            freed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(freed, "the listener of a closed stream still holds {addr}");
}

/// A started stream of 64 MiB (more than loopback's socket buffers hold) to a receiver that
/// accepts and never reads: it is still running when the test acts on it. Returns its id and
/// the receiver's socket (to keep it open).
fn started_towards_a_receiver_that_never_reads(
    f: &Fixture,
    c: &mut Ctl,
    options: &str,
) -> (penstock_core::control::StreamId, TcpStream) {
    let src = f.path("huge.bin");
    std::fs::write(&src, vec![2u8; 64 << 20]).unwrap();
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let opened = c.cmd(&format!(
        "OPEN file:{} tcp://{rx_addr} {options}",
        src.display()
    ));
    let id = opened.stream_id().unwrap_or_else(|| panic!("{opened:?}"));
    assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
    let (held, _) = rx.accept().unwrap();
    (id, held)
}

/// Found by the control_session fuzz target: a paused rt stream whose RESUME fails (here:
/// SEEK past the end) kept its admission reservation for good.
#[test]
fn a_resume_that_fails_returns_the_reservation() {
    let f = start();
    let mut c = Ctl::authed(f.control());
    let (id, _held) =
        started_towards_a_receiver_that_never_reads(&f, &mut c, "class=rt rate=1MB/s unit=64KiB");
    assert_eq!(c.cmd(&format!("PAUSE {id}")).code.code(), 200);
    assert_eq!(c.cmd(&format!("SEEK {id} 1G")).code.code(), 200);
    let stats = c.cmd("STATS");
    assert!(stats.lines.iter().any(|l| l == "admitted 1"), "{stats:?}");
    let resumed = c.cmd(&format!("RESUME {id}"));
    assert_eq!(resumed.code.code(), 500, "{resumed:?}");
    let stats = c.cmd("STATS");
    assert!(stats.lines.iter().any(|l| l == "admitted 0"), "{stats:?}");
    assert!(
        stats.lines.iter().any(|l| l == "streams_failed 1"),
        "{stats:?}"
    );
    assert!(
        stats
            .lines
            .iter()
            .any(|l| l.starts_with("rt_net_bytes_per_s 0 of")),
        "the engine kept the reservation: {stats:?}"
    );
}

#[test]
fn a_control_stream_to_a_receiver_that_stops_reading_fails_at_the_send_timeout() {
    let mut cfg = config();
    cfg.control.send_timeout_ms = 1000;
    let f = start_with(cfg);
    let mut c = Ctl::authed(f.control());
    let (id, _held) = started_towards_a_receiver_that_never_reads(&f, &mut c, "");
    let mut failed = None;
    for _ in 0..1500 {
        let st = c.cmd(&format!("STATE {id}"));
        assert!(!st.lines[0].contains(" done "), "{st:?}");
        if st.lines[0].contains(" failed ") {
            failed = Some(st.lines[0].clone());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let line = failed.expect("the stalled stream never failed");
    assert!(line.contains("no_progress"), "{line}");
    let stats = c.cmd("STATS");
    assert!(stats.lines.iter().any(|l| l == "admitted 0"), "{stats:?}");
}

#[test]
fn streams_of_one_file_share_its_descriptor_and_the_metrics_say_so() {
    let f = start();
    // Two paced streams of one file, 2 s each: both run when the metrics are read.
    const UNIT: usize = 4096;
    const UNITS: usize = 40;
    let data = pattern(UNIT * UNITS, 23);
    let src = f.path("shared.ts");
    std::fs::write(&src, &data).unwrap();
    let before = metrics_text(&f);
    assert_eq!(
        metric_value(&before, "penstock_engine_open_files"),
        Some(0.0),
        "{before}"
    );
    assert_eq!(
        metric_value(&before, "penstock_engine_open_file_shares_total"),
        Some(0.0),
        "{before}"
    );
    let mut c = Ctl::authed(f.control());
    let mut streams = Vec::new();
    for _ in 0..2 {
        let (rx_addr, _count, receiver) = counting_receiver(Duration::ZERO);
        let id = c
            .cmd(&format!(
                "OPEN file:{} tcp://{rx_addr} rate=20/s unit={UNIT}",
                src.display()
            ))
            .stream_id()
            .unwrap();
        assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
        streams.push((id, receiver));
    }
    let during = metrics_text(&f);
    assert_eq!(
        metric_value(&during, "penstock_engine_open_files"),
        Some(1.0),
        "two streams of one file, one descriptor:\n{during}"
    );
    assert_eq!(
        metric_value(&during, "penstock_engine_open_file_shares_total"),
        Some(1.0),
        "{during}"
    );
    for (id, receiver) in streams {
        wait_done(&mut c, id);
        assert!(receiver.join().unwrap() == data);
    }
    let after = metrics_text(&f);
    assert_eq!(
        metric_value(&after, "penstock_engine_open_files"),
        Some(0.0),
        "the last stream's end closed it:\n{after}"
    );
    assert_eq!(
        metric_value(&after, "penstock_engine_open_file_shares_total"),
        Some(1.0),
        "{after}"
    );
}

/// `fd:N` names a descriptor of the process that parses it: over the control protocol that is
/// the server, so every `fd:` endpoint is refused at OPEN (403, saying why), for the token's
/// holder and the socket's own user alike, in either role, and nothing is opened, admitted or
/// written (the server's stdout and its listeners are descriptors 1 and 3+).
#[test]
fn descriptors_by_number_are_refused_over_the_control_protocol() {
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("ctl.sock");
    let mut cfg = config();
    cfg.control.unix = Some(sock.clone());
    cfg.control.write_roots = vec![run.path().to_path_buf()];
    let f = start_with(cfg);
    let src = f.path("small.txt");
    let out = run.path().join("out.bin");
    let lines = [
        format!("OPEN fd:0 file:{}", out.display()),
        format!("OPEN file:{} fd:1", src.display()),
        "OPEN fd:3 fd:4 class=rt rate=1/s".to_string(),
    ];
    let mut c = Ctl::authed(f.control());
    let mut replies: Vec<Reply> = lines.iter().map(|l| c.cmd(l)).collect();
    replies.extend(unix_cmds(
        &sock,
        &lines.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    for r in &replies {
        assert_eq!(r.code.code(), 403, "{replies:?}");
        assert!(r.text.contains("may not name descriptors"), "{r:?}");
    }
    assert!(!out.exists());
    let st = c.cmd("STATS");
    assert!(st.lines.iter().any(|l| l == "streams 0"), "{st:?}");
    assert!(st.lines.iter().any(|l| l == "admitted 0"), "{st:?}");
    // A malformed number is a syntax error of the name, not a file called "fd:x".
    let r = c.cmd(&format!("OPEN fd:x file:{}", out.display()));
    assert_eq!(r.code.code(), 400, "{r:?}");
}

/// A stream that ended frees its place for the next `OPEN` at once, before the reaper has
/// looked at it: a client whose receiver saw EOF opens its next stream immediately. No
/// reaper runs here at all, so only `OPEN`'s own look at the table can free the place.
#[test]
fn an_ended_streams_place_is_free_for_the_next_open_before_any_reaper_runs() {
    use penstock_core::control::parse_open_options;
    use penstock_driver::{Engine, EngineConfig};
    use penstock_server::Metrics;
    use penstock_server::access::Access;
    use penstock_server::config::ControlConfig;
    use penstock_server::streams::{Caller, EngineBackend, Given, Identity, Streams};
    use std::sync::Arc;

    let read = tempfile::tempdir().unwrap();
    let write = tempfile::tempdir().unwrap();
    let src = read.path().join("a");
    std::fs::write(&src, vec![7u8; 100_000]).unwrap();
    let cfg = ControlConfig {
        read_roots: vec![read.path().to_path_buf()],
        write_roots: vec![write.path().to_path_buf()],
        streams_per_identity_max: 1,
        ..ControlConfig::default()
    };
    let access = Access::new(&cfg, read.path()).unwrap();
    let engine = Arc::new(Engine::new(EngineConfig::default()).unwrap());
    let streams = Arc::new(Streams::new(
        Box::new(EngineBackend::new(engine, access)),
        Arc::new(Metrics::new()),
        cfg,
    ));
    let orphaned = || Given {
        reachable_when_orphaned: false,
        ..Given::default()
    };
    let src_name = src.to_str().unwrap();
    for i in 0..3u64 {
        let dst = write.path().join(format!("b{i}"));
        let spec = parse_open_options(
            src_name,
            dst.to_str().unwrap(),
            "DETACHED",
            &Limits::default(),
        )
        .unwrap();
        let caller = Caller {
            conn: i + 1,
            identity: Identity::Token,
        };
        // The previous stream's end reaches the engine's report just after its last byte:
        // a bounded poll (no reaper here; a refusal changes nothing), not a fixed wait.
        let t = std::time::Instant::now();
        let (id, _) = loop {
            match streams.open_given(caller, &spec, orphaned()) {
                Ok(opened) => break opened,
                Err(r) if r.code.code() == 503 && t.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(r) => panic!("open {i}: {} {:?}", r.code.code(), r.lines),
            }
        };
        assert_eq!(streams.start(caller, id, None).code.code(), 200);
        streams.connection_closed(caller.conn);
        // Every byte is out; the stream is over (or about to be) in the engine.
        let t = std::time::Instant::now();
        while std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0) < 100_000 {
            assert!(t.elapsed() < Duration::from_secs(30), "stream {i} stalled");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Refusal still happens while a place is really held.
    let held = write.path().join("held");
    let spec =
        parse_open_options(src_name, held.to_str().unwrap(), "", &Limits::default()).unwrap();
    let holder = Caller {
        conn: 100,
        identity: Identity::Token,
    };
    streams.open_given(holder, &spec, orphaned()).unwrap();
    let other = Caller {
        conn: 101,
        identity: Identity::Token,
    };
    let refused = streams.open_given(other, &spec, orphaned()).unwrap_err();
    assert_eq!(refused.code.code(), 503, "{:?}", refused.lines);
}

/// Receivers for many streams on one listener: each accepted connection is read to its end
/// on a thread of its own; `bodies` gets what each one received.
fn many_receivers(
    n: usize,
) -> (
    SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    mpsc::Receiver<Vec<u8>>,
) {
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = rx.local_addr().unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (tx, bodies) = mpsc::channel();
    let c = count.clone();
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((mut s, _)) = rx.accept() else { return };
            let (tx, c) = (tx.clone(), c.clone());
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(k) = s.read(&mut buf) {
                    if k == 0 {
                        break;
                    }
                    all.extend_from_slice(&buf[..k]);
                    c.fetch_add(k as u64, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = tx.send(all);
            });
        }
    });
    (addr, count, bodies)
}

/// Opens and starts `n` streams of `src` to `rx` with `options`; their ids.
fn open_started(
    c: &mut Ctl,
    n: usize,
    src: &std::path::Path,
    rx: SocketAddr,
    options: &str,
) -> Vec<penstock_core::control::StreamId> {
    (0..n)
        .map(|i| {
            let o = c.cmd(&format!("OPEN file:{} tcp://{rx} {options}", src.display()));
            assert_eq!(o.code.code(), 201, "stream {i}: {o:?}");
            let id = o.stream_id().unwrap();
            assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
            id
        })
        .collect()
}

/// The regression the buffer pool's fairness guards (issue 38): 50 paced bulk streams at
/// 48 KB/s in 4 KiB units, opened through the control protocol on a worker whose pool starts
/// with fewer buffers than streams. Paced streams hold a buffer between their units, so the
/// first streams took every buffer and read ahead while the last ones never got one (18 of
/// them stayed `running` with 0 bytes sent). Every stream must make progress within a
/// bounded time.
#[test]
fn fifty_paced_streams_all_make_progress_on_a_smaller_pool() {
    const STREAMS: usize = 50;
    let mut cfg = config();
    // Each worker's pool starts with 8 buffers and may grow to 64 (the paced streams share
    // one worker's: the timed worker where a real-time policy may be had): more than the
    // streams, fewer than they would hold reading ahead by the read depth.
    cfg.engine.pool_buffers = Some(8);
    cfg.buffers.pool_max_bytes = Some(64 << 20);
    let f = start_with(cfg);
    // Two buffers' worth per stream: a stream that got one holds it ~20 s at this rate.
    let src = f.path("paced50.ts");
    std::fs::write(&src, pattern(2 << 20, 50)).unwrap();
    let (rx, _count, _bodies) = many_receivers(STREAMS);
    let mut c = Ctl::authed(f.control());
    let ids = open_started(&mut c, STREAMS, &src, rx, "rate=48KB/s unit=4KiB");
    let t0 = std::time::Instant::now();
    loop {
        let idle: Vec<_> = ids
            .iter()
            .filter(|id| {
                let st = c.cmd(&format!("STATE {id}"));
                assert!(!st.lines[0].contains(" failed "), "{st:?}");
                state_field(&st, "sent") == Some(0)
            })
            .collect();
        if idle.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{} of {STREAMS} paced streams sent nothing in 15 s: {idle:?}; metrics:\n{}",
            idle.len(),
            metrics_text(&f)
                .lines()
                .filter(|l| l.contains("buffer"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for id in ids {
        assert_eq!(c.cmd(&format!("CLOSE {id} NOW")).code.code(), 200);
    }
}

/// Issue 38's growth: a burst of 4× the streams the pools start with (each worker's pool
/// starts with 2 buffers) all open and run byte-exact without a refusal naming buffers, the
/// pools growing up to `[buffers] pool_max_bytes` each; once idle for `shrink_after_ms` (short
/// here) they are back to their start size. The metrics show the current and the most bytes.
#[test]
fn a_burst_grows_the_pool_and_an_idle_pool_shrinks_back() {
    const START: u64 = 2;
    let mut cfg = config();
    cfg.engine.pool_buffers = Some(START as usize);
    cfg.buffers.pool_max_bytes = Some(64 << 20);
    cfg.buffers.shrink_after_ms = Some(300);
    let f = start_with(cfg);
    let pool = |m: &str, state: &str| {
        metric_value(
            m,
            &format!("penstock_engine_buffer_pool_bytes{{state=\"{state}\"}}"),
        )
        .unwrap_or_else(|| panic!("no pool bytes {state}:\n{m}")) as u64
    };
    let m = metrics_text(&f);
    let start_bytes = pool(&m, "current");
    let workers = start_bytes / START / (1 << 20);
    assert!(workers >= 1, "{m}");
    assert_eq!(pool(&m, "max"), workers * (64 << 20), "{m}");
    let streams = (4 * START * workers) as usize;
    // Three buffers' worth each: every stream reads ahead while the others run.
    let data = pattern(3 << 20, 38);
    let src = f.path("burst.bin");
    std::fs::write(&src, &data).unwrap();
    let (rx, _count, bodies) = many_receivers(streams);
    let mut c = Ctl::authed(f.control());
    let ids = open_started(&mut c, streams, &src, rx, "path=uring");
    for &id in &ids {
        let st = wait_done(&mut c, id);
        assert_eq!(state_field(&st, "sent"), Some(data.len() as u64), "{st:?}");
    }
    for i in 0..streams {
        let got = bodies.recv_timeout(Duration::from_secs(60)).unwrap();
        assert!(
            got == data,
            "receiver {i}: {} bytes, not the file",
            got.len()
        );
    }
    let m = metrics_text(&f);
    let grown = metric_value(&m, "penstock_engine_buffer_pool_grown_total").unwrap();
    assert!(grown > 0.0, "the burst grew no pool:\n{m}");
    // Idle: back to the start size within a bounded time (shrink_after is 300 ms).
    let t0 = std::time::Instant::now();
    loop {
        let m = metrics_text(&f);
        if pool(&m, "current") == start_bytes {
            let shrunk = metric_value(&m, "penstock_engine_buffer_pool_shrunk_total").unwrap();
            assert_eq!(shrunk, grown, "{m}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the pool never shrank back to {start_bytes} bytes:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in ids {
        assert_eq!(c.cmd(&format!("CLOSE {id}")).code.code(), 200);
    }
}

/// Issue 38 items 3 and 5 over the real control socket: a configured class
/// (`[disk.classes.gold]`), `CLASS` moving a running stream from bulk to rt without stopping
/// it (every byte arrives, `STATE` and `STATS` follow), the refusal naming the resource when
/// rt cannot take a stream, `TUNE disk gold_quantum=`, the pause form (`pause=K,T`), and the
/// operator's ceiling (`[control.limits]`) refusing above it with the ceiling named.
#[test]
fn class_moves_a_running_stream_and_ceilings_refuse_above_them() {
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("ctl.sock");
    let mut cfg = config();
    cfg.control.unix = Some(sock.clone());
    cfg.disk.classes.insert(
        "gold".into(),
        penstock_server::config::DiskClassSection {
            quantum_bytes: Some(2 << 20),
        },
    );
    // The disk's figures set here (100 MB/s, 1,000 reads/s): a stream of 200 MB/s cannot be
    // in rt.
    cfg.admission.disk_seq_bytes_per_s = Some(100_000_000);
    cfg.admission.disk_random_iops = Some(1000);
    let own_uid = rustix::process::geteuid().as_raw();
    cfg.control.limits.insert(
        format!("uid:{own_uid}"),
        penstock_server::config::ControlLimit {
            schedule_max: Some("4,40ms".into()),
            rate_max: Some("1MB/s".into()),
        },
    );
    let f = start_with(cfg);
    const UNIT: usize = 4096;
    const UNITS: usize = 100;
    let data = pattern(UNIT * UNITS, 38);
    let src = f.path("classes.bin");
    std::fs::write(&src, &data).unwrap();
    let mut c = Ctl::authed(f.control());

    // A class the server does not have: refused naming the ones it has.
    let r = c.cmd(&format!(
        "OPEN file:{} tcp://127.0.0.1:9 class=platinum",
        src.display()
    ));
    assert_eq!(r.code.code(), 400, "{r:?}");
    assert!(r.text.contains("rt, bulk, gold"), "{r:?}");

    // A paced bulk stream (200 units/s: half a second), moved to rt while it runs.
    let (rx_addr, count, receiver) = counting_receiver(Duration::ZERO);
    let opened = c.cmd(&format!(
        "OPEN file:{} tcp://{rx_addr} class=bulk rate=200/s unit={UNIT}",
        src.display()
    ));
    assert_eq!(opened.code.code(), 201, "{opened:?}");
    let id = opened.stream_id().unwrap();
    assert_eq!(c.cmd(&format!("START {id}")).code.code(), 200);
    let t0 = std::time::Instant::now();
    while count.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "nothing arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    let moved = c.cmd(&format!("CLASS {id} rt"));
    assert_eq!(moved.code.code(), 200, "{moved:?}");
    let st = c.cmd(&format!("STATE {id}"));
    assert!(
        st.lines[0].contains(" running ") && st.lines[0].contains("class=rt"),
        "{st:?}"
    );
    let stats = c.cmd("STATS");
    assert!(stats.lines.iter().any(|l| l == "admitted 1"), "{stats:?}");
    assert!(
        stats
            .lines
            .iter()
            .any(|l| l == "disk_class gold quantum=2097152 streams=0"),
        "{stats:?}"
    );
    let st = wait_done(&mut c, id);
    assert_eq!(state_field(&st, "sent"), Some((UNIT * UNITS) as u64));
    let got = receiver.join().unwrap();
    assert!(got == data, "bytes differ across the class change");

    // rt cannot take a 200 MB/s stream: refused naming the resource, left in bulk.
    let big = c.cmd(&format!(
        "OPEN file:{} tcp://127.0.0.1:9 class=bulk rate=200MB/s unit=64KiB",
        src.display()
    ));
    assert_eq!(big.code.code(), 201, "{big:?}");
    let big_id = big.stream_id().unwrap();
    let refused = c.cmd(&format!("CLASS {big_id} rt"));
    assert_eq!(refused.code.code(), 503, "{refused:?}");
    assert!(
        refused.text.contains("refused") && refused.text.contains("disk"),
        "{refused:?}"
    );
    let st = c.cmd(&format!("STATE {big_id}"));
    assert!(st.lines[0].contains("class=bulk"), "{st:?}");
    // A named class takes it; unknown names are refused.
    assert_eq!(c.cmd(&format!("CLASS {big_id} gold")).code.code(), 200);
    let r = c.cmd(&format!("CLASS {big_id} platinum"));
    assert!(
        r.code.code() == 400 && r.text.contains("rt, bulk, gold"),
        "{r:?}"
    );
    // The named class's quantum is tuned by name.
    let t = c.cmd("TUNE disk gold_quantum=4MiB");
    assert!(t.text.contains("gold_quantum=4194304"), "{t:?}");
    let t = c.cmd("TUNE disk silver_quantum=4MiB");
    assert_eq!(t.code.code(), 400, "{t:?}");
    let m = metrics_text(&f);
    assert!(
        m.contains("penstock_disk_queue_depth{class=\"gold\"}")
            && m.contains("penstock_disk_class_read_bytes_total{class=\"rt\"}"),
        "{m}"
    );

    // The pause form, beside the cycle form.
    let p = c.cmd(&format!(
        "OPEN file:{} tcp://127.0.0.1:9 pause=2,20ms unit={UNIT}",
        src.display()
    ));
    assert_eq!(p.code.code(), 201, "{p:?}");
    let st = c.cmd(&format!("STATE {}", p.stream_id().unwrap()));
    assert!(
        st.lines[0].contains("pause_form=yes") && st.lines[0].contains("cycle_units=2"),
        "{st:?}"
    );
    let both = c.cmd(&format!(
        "OPEN file:{} tcp://127.0.0.1:9 pause=2,20ms schedule=2,20ms",
        src.display()
    ));
    assert_eq!(both.code.code(), 400, "{both:?}");

    // The ceiling of this uid (the Unix socket): 4 units per 40 ms, 1 MB/s.
    let open = |opts: &str| format!("OPEN file:{} tcp://127.0.0.1:9 {opts}", src.display());
    let replies = unix_cmds(
        &sock,
        &[
            &open(&format!("pause=4,40ms unit={UNIT}")),
            &open(&format!("schedule=2,20ms unit={UNIT}")),
            &open(&format!("schedule=8,80ms unit={UNIT}")),
            &open(&format!("pause=4,30ms unit={UNIT}")),
            &open("rate=2MB/s unit=64KiB"),
            &open(""),
        ],
    );
    assert_eq!(replies[0].code.code(), 201, "{replies:?}");
    assert_eq!(replies[1].code.code(), 201, "{replies:?}");
    for (r, why) in replies[2..]
        .iter()
        .zip(["8 units at once", "faster", "B/s", "unpaced"])
    {
        assert_eq!(r.code.code(), 503, "{r:?}");
        assert!(
            r.text.contains(why)
                && r.text.contains(&format!("uid:{own_uid}"))
                && r.text.contains("schedule_max=4,40ms rate_max=1000000B/s"),
            "{r:?}"
        );
    }
    // The token has no ceiling here.
    let r = c.cmd(&open("schedule=8,80ms unit=4096"));
    assert_eq!(r.code.code(), 201, "{r:?}");
}
