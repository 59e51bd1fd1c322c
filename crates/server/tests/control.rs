//! The control protocol on loopback: Cues' remote control (a second connection drives a
//! stream with its id and the token), pause and resume with exact bytes, admission
//! refusals that name the shortage, and the token rule for non-local peers.
//!
//! Non-local peers without a network namespace: every 127.0.0.0/8 address is loopback on
//! Linux, so the test server is configured with `local_peers = ["127.0.0.1"]` and the
//! "remote" client binds its socket to 127.0.0.2 before connecting. The server sees a peer
//! address that is not in its local list, exactly as it would see a remote host.

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

    fn from(s: TcpStream) -> Ctl {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Ctl {
            r: BufReader::new(s),
        }
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

    let mut a = Ctl::connect(f.control());
    let opened = a.cmd(&format!(
        "OPEN file:{} tcp://{rx_addr} DETACHED",
        src.display()
    ));
    assert_eq!(opened.code.code(), 201, "{opened:?}");
    let id = opened.stream_id().unwrap();

    // A second connection: refused without the token, allowed with it.
    let mut b = Ctl::connect(f.control());
    assert_eq!(b.cmd(&format!("START {id}")).code.code(), 401);
    assert_eq!(b.cmd("AUTH wrong").code.code(), 403);
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
    let mut c = Ctl::connect(f.control());
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
    let f = start();
    let src = f.path("small.txt");
    let mut c = Ctl::connect(f.control());
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
}

#[test]
fn a_non_local_peer_needs_the_token() {
    let mut cfg = config();
    cfg.control.local_peers = vec!["127.0.0.1".parse().unwrap()];
    let f = start_with(cfg);
    // Connect from 127.0.0.2: not in local_peers.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.2:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sock.connect(&f.control().into()).unwrap();
    let mut remote = Ctl::from(sock.into());
    assert_eq!(remote.cmd("STATS").code.code(), 401);
    assert_eq!(remote.cmd("STATE *").code.code(), 401);
    assert_eq!(remote.cmd("HELP").code.code(), 214);
    assert_eq!(remote.cmd("AUTH nope").code.code(), 403);
    assert_eq!(remote.cmd("STATS").code.code(), 401);
    assert_eq!(remote.cmd(&format!("AUTH {TOKEN}")).code.code(), 200);
    assert_eq!(remote.cmd("STATS").code.code(), 212);
    // A local peer needs no token for its own streams.
    let mut local = Ctl::connect(f.control());
    assert_eq!(local.cmd("STATS").code.code(), 212);
}

#[test]
fn streams_of_a_closed_connection_are_closed_unless_detached() {
    let f = start();
    let src = f.path("small.txt");
    let mut a = Ctl::connect(f.control());
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
    let mut b = Ctl::connect(f.control());
    b.cmd(&format!("AUTH {TOKEN}"));
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
