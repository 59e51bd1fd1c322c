//! `fd:N` endpoints: a descriptor of this process, duplicated and classified by the driver
//! (fstat, getsockopt), refused with a reason when it cannot play its part, and streamed
//! byte-exact by the engine while the caller keeps (or closes) its own copy. Real files,
//! pipes and loopback sockets.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::stream::IoKind;
use penstock_driver::open::{OpenError, open_fd, open_source, open_target};
use penstock_driver::{Engine, EngineConfig, StreamSpec};

fn engine() -> Engine {
    Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 8,
        stream_depth: 4,
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 4099) as u8).collect()
}

fn refused(r: Result<penstock_driver::open::Opened, OpenError>) -> String {
    match r {
        Ok(o) => panic!("{} was accepted as {:?}", o.label, o.kind),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_kind_of_descriptor_is_found_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, data(10_000)).unwrap();
    let f = File::open(&path).unwrap();
    let o = open_fd(f.as_raw_fd(), Role::Source).unwrap();
    assert_eq!(
        (o.kind, o.size, o.socket),
        (IoKind::File, Some(10_000), false)
    );
    assert_eq!(o.label, format!("fd:{}", f.as_raw_fd()));
    assert_ne!(
        o.fd.as_raw_fd(),
        f.as_raw_fd(),
        "a duplicate, not the caller's"
    );

    let (r, w) = rustix::pipe::pipe().unwrap();
    assert_eq!(
        open_fd(r.as_raw_fd(), Role::Source).unwrap().kind,
        IoKind::Pipe
    );
    assert_eq!(
        open_fd(w.as_raw_fd(), Role::Target).unwrap().kind,
        IoKind::Pipe
    );

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let o = open_fd(c.as_raw_fd(), Role::Target).unwrap();
    assert_eq!((o.kind, o.socket), (IoKind::StreamSocket, true));
    let (a, b) = UnixStream::pair().unwrap();
    assert_eq!(
        open_fd(a.as_raw_fd(), Role::Source).unwrap().kind,
        IoKind::StreamSocket
    );
    drop(b);

    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    assert_eq!(
        open_fd(u.as_raw_fd(), Role::Source).unwrap().kind,
        IoKind::Datagram,
        "a bound UDP socket receives"
    );
    u.connect("127.0.0.1:9").unwrap();
    assert_eq!(
        open_fd(u.as_raw_fd(), Role::Target).unwrap().kind,
        IoKind::Datagram
    );
    // Through the endpoint namespace, the same.
    let ep = Endpoint::parse(&format!("fd:{}", f.as_raw_fd()), Role::Source).unwrap();
    assert_eq!(open_source(&ep, &mut |_| {}).unwrap().size, Some(10_000));
}

#[test]
fn descriptors_that_cannot_play_their_part_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"x").unwrap();

    // Not open at all.
    let e = open_fd(1_000_000, Role::Source).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(9), "EBADF: {e}");
    assert!(e.to_string().starts_with("fd:1000000: "), "{e}");
    assert!(open_fd(-1, Role::Source).is_err());

    let ro = File::open(&path).unwrap();
    let m = refused(open_fd(ro.as_raw_fd(), Role::Target));
    assert!(m.contains("open for reading only"), "{m}");
    let wo = OpenOptions::new().write(true).open(&path).unwrap();
    let m = refused(open_fd(wo.as_raw_fd(), Role::Source));
    assert!(m.contains("open for writing only"), "{m}");

    let d = File::open(dir.path()).unwrap();
    let m = refused(open_fd(d.as_raw_fd(), Role::Source));
    assert!(m.contains("is a directory"), "{m}");

    let p: OwnedFd =
        rustix::fs::open(&path, rustix::fs::OFlags::PATH, rustix::fs::Mode::empty()).unwrap();
    let m = refused(open_fd(p.as_raw_fd(), Role::Source));
    assert!(m.contains("O_PATH"), "{m}");

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let m = refused(open_fd(l.as_raw_fd(), Role::Target));
    assert!(m.contains("listening socket"), "{m}");

    let unconnected =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let m = refused(open_fd(unconnected.as_raw_fd(), Role::Target));
    assert!(m.contains("no peer"), "{m}");

    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    let m = refused(open_fd(u.as_raw_fd(), Role::Target));
    assert!(m.contains("connect(2) it"), "{m}");

    let seq = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None).unwrap();
    let m = refused(open_fd(seq.as_raw_fd(), Role::Source));
    assert!(m.contains("neither a stream"), "{m}");

    // A refusal leaves the caller's descriptor as it was: still open, still blocking.
    let mut buf = [0u8; 1];
    assert_eq!((&ro).read(&mut buf).unwrap(), 1);
}

#[test]
fn file_to_socket_and_socket_to_file_through_descriptors_byte_exact() {
    let engine = engine();
    let dir = tempfile::tempdir().unwrap();
    let src_path = dir.path().join("src");
    let bytes = data((3 << 20) + 4097);
    std::fs::write(&src_path, &bytes).unwrap();

    // file (fd) → TCP (fd), the caller closing both of its own copies right after the open.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let send = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut recv, _) = l.accept().unwrap();
    let src = File::open(&src_path).unwrap();
    let spec = StreamSpec::new(
        Endpoint::parse(&format!("fd:{}", src.as_raw_fd()), Role::Source).unwrap(),
        Endpoint::parse(&format!("fd:{}", send.as_raw_fd()), Role::Target).unwrap(),
    );
    let stream = engine.open(spec).unwrap();
    drop((src, send));
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        recv.read_to_end(&mut got).unwrap();
        got
    });
    let report = stream.wait().unwrap();
    assert_eq!(report.bytes, bytes.len() as u64);
    assert!(
        reader.join().unwrap() == bytes,
        "file → TCP through fd: differs"
    );

    // TCP (fd) → file (fd).
    let out_path = dir.path().join("out");
    let out = File::create(&out_path).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut sender = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (peer, _) = l.accept().unwrap();
    let spec = StreamSpec::new(
        Endpoint::parse(&format!("fd:{}", peer.as_raw_fd()), Role::Source).unwrap(),
        Endpoint::parse(&format!("fd:{}", out.as_raw_fd()), Role::Target).unwrap(),
    );
    let stream = engine.open(spec).unwrap();
    drop((peer, out));
    let writer = {
        let bytes = bytes.clone();
        std::thread::spawn(move || sender.write_all(&bytes).unwrap())
    };
    writer.join().unwrap();
    let report = stream.wait().unwrap();
    assert_eq!(report.bytes, bytes.len() as u64);
    assert!(
        std::fs::read(&out_path).unwrap() == bytes,
        "TCP → file through fd: differs"
    );

    // A pipe (fd) → a Unix socket named by path works the same: open_target of a name.
    let (r, w) = rustix::pipe::pipe().unwrap();
    let (a, mut b) = UnixStream::pair().unwrap();
    let spec = StreamSpec::new(
        Endpoint::Fd { fd: r.as_raw_fd() },
        Endpoint::Fd { fd: a.as_raw_fd() },
    );
    let stream = engine.open(spec).unwrap();
    drop((r, a));
    let small = data(200_000);
    let writer = {
        let small = small.clone();
        std::thread::spawn(move || {
            let mut w = File::from(w);
            w.write_all(&small).unwrap();
        })
    };
    let mut got = Vec::new();
    b.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(stream.wait().unwrap().bytes, small.len() as u64);
    assert!(got == small, "pipe → Unix socket through fd: differs");
    // open_target of an fd: name is the same function.
    let f = File::create(dir.path().join("t")).unwrap();
    let ep = Endpoint::Fd { fd: f.as_raw_fd() };
    assert_eq!(open_target(&ep, &mut |_| {}).unwrap().kind, IoKind::File);
}

/// A file target handed over positioned is written from its position on every path that can
/// write a file (copy, sendfile, uring — the uring path used to write from 0): the bytes
/// before it stay as they were. A volume rebuild relies on it (a member written at a block's
/// offset).
#[test]
fn a_positioned_file_target_is_written_from_its_position_on_every_path() {
    use penstock_core::stream::{DataPath, Extent, PathChoice};
    use std::io::{Seek, SeekFrom};
    let engine = engine();
    let dir = tempfile::tempdir().unwrap();
    let src_path = dir.path().join("src");
    let bytes = data((1 << 20) + 12_288);
    std::fs::write(&src_path, &bytes).unwrap();
    let mut paths = vec![DataPath::Copy, DataPath::Sendfile];
    if penstock_testreq::require_ok("io_uring", engine.info().uring.clone()).is_some() {
        paths.push(DataPath::Uring);
    }
    for path in paths {
        let out_path = dir.path().join(format!("out-{path:?}"));
        let before = vec![0xA5u8; 3 << 20];
        std::fs::write(&out_path, &before).unwrap();
        let mut out = OpenOptions::new().write(true).open(&out_path).unwrap();
        let at = (1 << 20) + 8192;
        out.seek(SeekFrom::Start(at)).unwrap();
        let src = File::open(&src_path).unwrap();
        // The source's second 4 KiB onwards, 1 MiB of it.
        let spec = StreamSpec {
            path: PathChoice::Fixed(path),
            extent: Extent {
                offset: 4096,
                length: Some(1 << 20),
            },
            ..StreamSpec::new(
                Endpoint::Fd {
                    fd: src.as_raw_fd(),
                },
                Endpoint::Fd {
                    fd: out.as_raw_fd(),
                },
            )
        };
        let report = engine.open(spec).unwrap().wait().unwrap();
        assert_eq!(report.bytes, 1 << 20, "{path:?}");
        let got = std::fs::read(&out_path).unwrap();
        assert_eq!(got.len(), 3 << 20, "{path:?}: the file grew or shrank");
        let at = at as usize;
        assert!(
            got[..at] == before[..at],
            "{path:?}: bytes before the position changed"
        );
        assert!(
            got[at..at + (1 << 20)] == bytes[4096..4096 + (1 << 20)],
            "{path:?}: not written from the position"
        );
        assert!(
            got[at + (1 << 20)..] == before[at + (1 << 20)..],
            "{path:?}: past the end"
        );
    }
}
