//! Descriptor hand-off over the Unix control socket (`OPEN fd fd`, SCM_RIGHTS): the
//! descriptors a line brings are used by its OPEN, or closed once that line is answered;
//! more than two in one message close the connection and every one of them; a stream of
//! passed descriptors moves its bytes exactly. (Refusals by SO_PEERCRED, as another uid:
//! libpenstock's `tests/c.rs`.)

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, IoSlice, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// Sends `line` (with its "\n") and `fds` in one sendmsg(2).
fn send_with_fds(s: &UnixStream, line: &str, fds: &[&OwnedFd]) {
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
    let bytes = format!("{line}\n");
    let n = rustix::net::sendmsg(
        s,
        &[IoSlice::new(bytes.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    assert_eq!(n, bytes.len());
}

fn read_reply(r: &mut BufReader<UnixStream>) -> String {
    let mut all = String::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap() == 0 {
            return all;
        }
        all.push_str(&l);
        if l.as_bytes().get(3) == Some(&b' ') {
            return all;
        }
    }
}

/// Reads `pipe` to EOF on a thread: the bytes, or None if no EOF came within 10 s (someone
/// still holds the write end).
fn read_to_eof(pipe: OwnedFd) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = File::from(pipe).read_to_end(&mut b);
        let _ = tx.send(b);
    });
    rx
}

fn connect(sock: &Path) -> (UnixStream, BufReader<UnixStream>) {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn fixture() -> (Fixture, std::path::PathBuf, tempfile::TempDir) {
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("ctl.sock");
    let mut cfg = config();
    cfg.control.unix = Some(sock.clone());
    (start_with(cfg), sock, run)
}

#[test]
fn passed_descriptors_stream_exactly_and_unused_ones_are_closed_after_their_line() {
    let (f, sock, _run) = fixture();
    let (s, mut r) = connect(&sock);

    // A file and a pipe's write end, handed over: the pipe gets the file's bytes, then EOF
    // (the server held the only other write end).
    let file: OwnedFd = File::open(f.path("mid.bin")).unwrap().into();
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    let got = read_to_eof(rd);
    send_with_fds(&s, "OPEN fd fd", &[&file, &wr]);
    drop((file, wr));
    let opened = read_reply(&mut r);
    assert!(opened.starts_with("201 "), "{opened}");
    let id: u64 = opened[4..].split(' ').next().unwrap().parse().unwrap();
    send_with_fds_plain(&s, &format!("START {id}"));
    assert!(read_reply(&mut r).starts_with("200 "));
    let bytes = got.recv_timeout(Duration::from_secs(30)).expect("EOF");
    assert_eq!(bytes, pattern(300 * 1024, 2));

    // A descriptor sent with a line that is not OPEN is closed once the line is answered.
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    let eof = read_to_eof(rd);
    send_with_fds(&s, "HELP", &[&wr]);
    drop(wr);
    assert!(read_reply(&mut r).starts_with("214"));
    assert_eq!(eof.recv_timeout(Duration::from_secs(10)).unwrap(), b"");

    // OPEN fd fd with one descriptor: refused, saying how; the one that came is closed.
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    let eof = read_to_eof(rd);
    send_with_fds(&s, "OPEN fd fd", &[&wr]);
    drop(wr);
    let reply = read_reply(&mut r);
    assert!(
        reply.starts_with("400 ") && reply.contains("SCM_RIGHTS"),
        "{reply}"
    );
    assert_eq!(eof.recv_timeout(Duration::from_secs(10)).unwrap(), b"");

    // Without descriptors, "fd" is refused too (never a file named fd).
    send_with_fds_plain(&s, "OPEN fd tcp://127.0.0.1:9");
    let reply = read_reply(&mut r);
    assert!(reply.starts_with("400 "), "{reply}");
}

#[test]
fn more_than_two_descriptors_in_one_message_close_them_all_and_the_connection() {
    let (_f, sock, _run) = fixture();
    // 3: all arrive (the buffer's alignment leaves room) and are too many; 8: the kernel
    // cuts the control message (MSG_CTRUNC). The same answer, every one closed.
    for n in [3, 8] {
        let (s, mut r) = connect(&sock);
        let pipes: Vec<_> = (0..n).map(|_| rustix::pipe::pipe().unwrap()).collect();
        let writes: Vec<&OwnedFd> = pipes.iter().map(|(_, w)| w).collect();
        send_with_fds(&s, "HELP", &writes);
        let mut eofs = Vec::new();
        for (rd, wr) in pipes {
            drop(wr);
            eofs.push(read_to_eof(rd));
        }
        let reply = read_reply(&mut r);
        assert!(
            reply.starts_with("400 ") && reply.contains("more than 2 descriptors"),
            "{n}: {reply}"
        );
        assert_eq!(read_reply(&mut r), "", "the connection is closed");
        for e in eofs {
            assert_eq!(e.recv_timeout(Duration::from_secs(10)).unwrap(), b"");
        }
    }
}

fn send_with_fds_plain(s: &UnixStream, line: &str) {
    use std::io::Write;
    (&*s).write_all(format!("{line}\n").as_bytes()).unwrap();
}
