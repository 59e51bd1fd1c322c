//! RTSP over TLS (`[rtsp] listen = "rtsps://…"`, docs/rtsp.md "rtsps://"): `penstock serve`
//! as a process with an rtsps:// and a plain listener side by side, a 6-second MPEG-2 TS
//! clip, and real clients: ffprobe, ffmpeg (`-c copy -f mpegts`, compared as `tests/rtsp.rs`
//! compares plain RTSP), GStreamer's rtspsrc, `openssl s_client`, and a rustls client
//! written here where a test must read the interleaved frames itself (and send a TLS 1.3
//! KeyUpdate midway). The CA and certificate are made at test time with `openssl`.
//!
//! The certificate is checked by `openssl s_client -verify_return_error` and the rustls
//! client: Debian 12's ffmpeg 5.1 does not hand `-tls_verify`/`-ca_file` to the TLS layer
//! under its RTSP demuxer (ffmpeg refuses the options for an rtsps:// input; ffprobe
//! accepts them and checks nothing: a wrong CA file plays too), and GStreamer's rtspsrc
//! runs with `tls-validation-flags=0` (as for souphttpsrc in tests/tls.rs).
//!
//! On this VM's kernel (no TLS ULP) every connection is `tls-user`: the interleaved frames
//! go through the connection's rustls session, never straight from the engine to the
//! socket; a raw byte there would break the client's TLS stream, which every byte-exact
//! comparison here would see. Where the kernel has the ULP the same tests run `ktls`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::{make_ca, make_cert};

const TS: usize = 188;
const VIDEO_PID: u16 = 0x100;
const CLIP_S: u32 = 6;

fn clip() -> Option<&'static Path> {
    static CLIP: OnceLock<Option<PathBuf>> = OnceLock::new();
    CLIP.get_or_init(|| common::mpeg2_ts_clip("rtsps", CLIP_S))
        .as_deref()
}

struct Served {
    child: Child,
    dir: tempfile::TempDir,
    http: String,
    rtsps: SocketAddr,
    rtsp: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

impl Served {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn url(&self, file: &str) -> String {
        format!("rtsps://localhost:{}/{file}", self.rtsps.port())
    }

    fn metrics(&self) -> String {
        common::scrape(&self.http).unwrap_or_default()
    }

    fn metric(&self, series: &str) -> f64 {
        common::sample(&self.metrics(), series).unwrap_or(0.0)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }
}

fn serve(clip: &Path) -> Served {
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path());
    let (cert, key) = make_cert(dir.path(), "srv", "penstock-rtsps-test");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::copy(clip, www.join("clip.ts")).unwrap();
    let conf = dir.path().join("penstock.toml");
    // Admission's figures set, never measured (as tests/rtsp.rs: a loaded machine must not
    // refuse a player).
    std::fs::write(
        &conf,
        format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[control]\nlisten = \"\"\n[log]\naccess = \"{}\"\naccess_flush_ms = 50\n\
             [rtsp]\nlisten = [\"rtsps://127.0.0.1:0\", \"127.0.0.1:0\"]\n\
             [tls]\nhandshake_timeout_ms = 2000\n[[tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n\
             [admission]\nself_calibrate = false\ndisk_seq_bytes_per_s = 1000000000\n\
             disk_random_iops = 100000\nnet_bytes_per_s = 1250000000\ncpu_send_ns = 5000\n\
             cpu_send_byte_ps = 500\n",
            dir.path().join("access.log").display(),
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_penstock"))
        .args(["serve", "--no-control-unix", "--config"])
        .arg(&conf)
        .arg(&www)
        .env("PENSTOCK_LOG", "penstock_server=debug")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let line = common::start_line(&mut child);
    let (http, _) = common::serve_addresses(&line);
    let after = |scheme: &str| -> SocketAddr {
        line.split(scheme)
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_else(|| panic!("no {scheme} address in {line:?}"))
            .parse()
            .unwrap()
    };
    let rtsps = after("rtsps://");
    let rtsp = after(", rtsp://");
    Served {
        child,
        dir,
        http,
        rtsps,
        rtsp,
    }
}

/// The path every connection of this kernel takes.
fn expected_path() -> &'static str {
    let ulp = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
    if ulp.split_whitespace().any(|u| u == "tls") {
        "ktls"
    } else {
        "tls-user"
    }
}

fn pid(p: &[u8]) -> u16 {
    (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2])
}

fn video_packets(ts: &[u8]) -> Vec<&[u8]> {
    ts.chunks_exact(TS)
        .filter(|p| pid(p) == VIDEO_PID)
        .collect()
}

/// A player as a child with a time limit: (exit success, its output).
fn run(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut err = child.stderr.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st.success(), o.join().unwrap() + &e.join().unwrap());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (false, "killed at the time limit".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// ffprobe sees the stream; ffmpeg's remux has the file's video packets (all up to the last
/// PES, which ffmpeg's RTP TS parser holds: tests/rtsp.rs's module doc); GStreamer's
/// rtspsrc writes the file byte for byte — all over rtsps://, all at once, each session
/// interleaved in its TLS stream.
#[test]
fn players_get_the_file_over_rtsps() {
    let Some(clip) = clip() else { return };
    let src = std::fs::read(clip).unwrap();
    let s = serve(clip);
    let url = s.url("clip.ts");
    let limit = Duration::from_secs(u64::from(CLIP_S) + 30);
    let mut players: Vec<(&str, Command, Option<PathBuf>)> = Vec::new();
    if penstock_testreq::require("ffmpeg") {
        let mut c = Command::new("ffmpeg");
        c.args(["-hide_banner", "-loglevel", "error", "-y"])
            .args(["-i", &url, "-c", "copy", "-f", "mpegts"])
            .arg(s.path("ffmpeg.ts"));
        players.push(("ffmpeg", c, Some(s.path("ffmpeg.ts"))));
    }
    if penstock_testreq::require("gst-launch-1.0") {
        let mut c = Command::new("gst-launch-1.0");
        c.args(["-q", "rtspsrc", &format!("location={url}")])
            .args([
                "tls-validation-flags=0",
                "!",
                "rtpmp2tdepay",
                "!",
                "filesink",
            ])
            .arg(format!("location={}", s.path("gst.ts").display()));
        players.push(("gst", c, Some(s.path("gst.ts"))));
    }
    let handles: Vec<_> = players
        .into_iter()
        .map(|(name, cmd, file)| (name, file, std::thread::spawn(move || run(cmd, limit))))
        .collect();
    if penstock_testreq::require("ffprobe") {
        let mut c = Command::new("ffprobe");
        c.args(["-v", "error", "-show_streams", &url]);
        let (ok, log) = run(c, Duration::from_secs(30));
        assert!(ok, "ffprobe: {log}\nserver:\n{}", s.log());
        assert!(log.contains("codec_name=mpeg2video"), "ffprobe: {log}");
    }
    let mut played = 0;
    for (name, file, h) in handles {
        let (ok, log) = h.join().unwrap();
        let got = file.map(|f| std::fs::read(f).unwrap_or_default());
        // GStreamer's PAUSE-at-EOS race is GStreamer's (tests/rtsp.rs); the bytes are
        // still checked.
        let race = !ok && name == "gst" && common::gst_teardown_race(&log);
        assert!(ok || race, "{name}: {log}\nserver:\n{}", s.log());
        played += 1;
        let got = got.unwrap();
        if name == "gst" {
            assert!(
                got == src,
                "gst: {} bytes, not the source's {}",
                got.len(),
                src.len()
            );
            println!("gst: {} bytes, the file's", got.len());
        } else {
            let a = video_packets(&src);
            let b = video_packets(&got);
            let same = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let last_pes = a.iter().rposition(|p| p[1] & 0x40 != 0).unwrap();
            println!(
                "ffmpeg: {same} of its {} video packets identical to the source's, whose last PES starts at packet {last_pes}",
                b.len()
            );
            assert_eq!(same, b.len(), "ffmpeg: a video packet differs");
            assert_eq!(same, last_pes, "ffmpeg: video packets missing");
        }
    }
    let path = expected_path();
    let handshakes = s.metric(&format!("penstock_tls_handshakes_total{{path=\"{path}\"}}"));
    println!("{handshakes} TLS handshakes on path {path}");
    assert!(handshakes >= f64::from(played), "{handshakes} handshakes");
}

/// A rustls client trusting only the test CA.
fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A scripted RTSP client over TLS: requests, replies, and interleaved frames between them.
struct Client {
    s: Tls,
    cseq: u32,
    buf: Vec<u8>,
}

enum Msg {
    Reply(u16, String),
    Frame(u8, Vec<u8>),
}

impl Client {
    fn connect(s: &Served) -> Client {
        let tcp = TcpStream::connect(s.rtsps).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let conn = rustls::ClientConnection::new(
            client_config(&s.path("ca.pem")),
            "localhost".try_into().unwrap(),
        )
        .unwrap();
        Client {
            s: rustls::StreamOwned::new(conn, tcp),
            cseq: 0,
            buf: Vec::new(),
        }
    }

    fn next(&mut self) -> Option<Msg> {
        loop {
            if self.buf.first() == Some(&b'$') && self.buf.len() >= 4 {
                let len = usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]]));
                if self.buf.len() >= 4 + len {
                    let ch = self.buf[1];
                    let p = self.buf[4..4 + len].to_vec();
                    self.buf.drain(..4 + len);
                    return Some(Msg::Frame(ch, p));
                }
            } else if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if self.buf.len() >= end + 4 + len {
                    self.buf.drain(..end + 4 + len);
                    let status = head.split(' ').nth(1)?.parse().ok()?;
                    return Some(Msg::Reply(status, head));
                }
            }
            let mut b = [0u8; 16384];
            let n = self.s.read(&mut b).ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&b[..n]);
        }
    }

    /// Sends a request; its reply (frames before it are dropped).
    fn request(&mut self, method: &str, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
        self.cseq += 1;
        let mut t = format!("{method} {url} RTSP/1.0\r\nCSeq: {}\r\n", self.cseq);
        for (n, v) in headers {
            t += &format!("{n}: {v}\r\n");
        }
        t += "\r\n";
        self.s.write_all(t.as_bytes()).unwrap();
        loop {
            match self.next().expect("a reply") {
                Msg::Reply(status, head) => return (status, head),
                Msg::Frame(..) => {}
            }
        }
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Over rtsps:// a UDP SETUP is refused with 461 (the media would leave in clear); the
/// interleaved session then plays the file: its RTP payloads, in order, are the file byte
/// for byte, through a TLS 1.3 KeyUpdate the client sends midway (rustls on both sides
/// answers and changes keys; no byte is lost or corrupt), and the session ends with the
/// RTCP BYE.
#[test]
fn interleaved_rtp_over_tls_is_the_file_through_a_key_update() {
    let Some(clip) = clip() else { return };
    let src = std::fs::read(clip).unwrap();
    let s = serve(clip);
    let url = s.url("clip.ts");
    let mut c = Client::connect(&s);
    let (st, _) = c.request("DESCRIBE", &url, &[("Accept", "application/sdp")]);
    assert_eq!(st, 200);
    let (st, head) = c.request(
        "SETUP",
        &url,
        &[("Transport", "RTP/AVP;unicast;client_port=5000-5001")],
    );
    assert_eq!(st, 461, "{head}");
    assert_eq!(
        s.metric("penstock_errors_total{kind=\"rtsps_udp_refused\"}"),
        1.0
    );
    let (st, head) = c.request(
        "SETUP",
        &url,
        &[("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1")],
    );
    assert_eq!(st, 200, "{head}");
    let session = header(&head, "Session")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let (st, head) = c.request("PLAY", &url, &[("Session", &session)]);
    assert_eq!(st, 200, "{head}");
    let mut got = Vec::new();
    let mut updated = false;
    let mut bye = false;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(u64::from(CLIP_S) + 30) {
        match c.next() {
            None => break,
            Some(Msg::Reply(st, head)) => panic!("an unasked reply {st}: {head}"),
            Some(Msg::Frame(0, p)) => {
                got.extend_from_slice(&p[12..]);
                if !updated && got.len() >= src.len() / 2 {
                    c.s.conn.refresh_traffic_keys().unwrap();
                    c.s.flush().unwrap();
                    updated = true;
                }
            }
            Some(Msg::Frame(1, p)) => {
                // RTCP: a compound whose packets include a BYE (type 203) ends the media.
                let mut at = 0;
                while at + 4 <= p.len() {
                    if p[at + 1] == 203 {
                        bye = true;
                    }
                    at += 4 * (usize::from(u16::from_be_bytes([p[at + 2], p[at + 3]])) + 1);
                }
                if bye {
                    break;
                }
            }
            Some(Msg::Frame(ch, _)) => panic!("a frame on channel {ch}"),
        }
    }
    println!(
        "{} payload bytes (the file: {}), key update sent: {updated}, BYE: {bye}",
        got.len(),
        src.len()
    );
    assert!(updated, "the key update was never sent");
    assert!(bye, "no RTCP BYE\nserver:\n{}", s.log());
    assert!(got == src, "the payloads are not the file");
    // The connection goes on after the key update: a request is answered.
    let (st, _) = c.request("TEARDOWN", &url, &[("Session", &session)]);
    assert_eq!(st, 200);
    // The session's access-log line names its TLS path.
    let want = format!(" transport=tcp tls={} ", expected_path());
    let t0 = Instant::now();
    let line = loop {
        let log = std::fs::read_to_string(s.path("access.log")).unwrap_or_default();
        if let Some(l) = log.lines().find(|l| l.contains("end=teardown")) {
            break l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no access line: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("{line}");
    assert!(line.contains(&want), "{line}");
}

/// A plain RTSP client on the rtsps:// port reads a 400 in clear and a close; a TLS client
/// on the plain port gets the plain parser's 400 and a close; a ClientHello of garbage
/// and a handshake that stalls are closed too. Each is counted, and every other
/// connection is served: a TLS client on the rtsps:// port (its certificate checked by
/// `openssl s_client`) and a plain one on the plain port.
#[test]
fn wrong_protocols_on_either_port_are_closed_cleanly() {
    let Some(clip) = clip() else { return };
    let s = serve(clip);
    // Plain RTSP on the rtsps:// port.
    let mut t = TcpStream::connect(s.rtsps).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    t.write_all(b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    t.read_to_end(&mut got).unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.starts_with("RTSP/1.0 400 ") && got.contains("rtsps:// port"),
        "{got:?}"
    );
    // A stalled handshake (the first byte of a record, then nothing) is closed at
    // handshake_timeout_ms.
    let mut stall = TcpStream::connect(s.rtsps).unwrap();
    stall
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stall.write_all(&[0x16]).unwrap();
    // A ClientHello of garbage.
    let mut junk = TcpStream::connect(s.rtsps).unwrap();
    junk.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    junk.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
        .unwrap();
    let mut alert = Vec::new();
    let _ = junk.read_to_end(&mut alert);
    assert!(
        alert.first() == Some(&0x15) || alert.is_empty(),
        "not an alert: {alert:?}"
    );
    // TLS on the plain port: openssl's handshake fails (the server answers in clear and
    // closes).
    if penstock_testreq::require("openssl") {
        let o = Command::new("openssl")
            .args(["s_client", "-connect", &s.rtsp.to_string()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let out =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "a handshake on the plain port: {out}");
        // The right one: its certificate verifies against the test CA.
        let mut child = Command::new("openssl")
            .args(["s_client", "-connect", &s.rtsps.to_string()])
            .args([
                "-servername",
                "localhost",
                "-verify_return_error",
                "-CAfile",
            ])
            .arg(s.path("ca.pem"))
            .args(["-quiet", "-ign_eof"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"OPTIONS * RTSP/1.0\r\nCSeq: 7\r\n\r\n")
            .unwrap();
        // stdin closed: the server's idle close or the client's end; the reply is read
        // first.
        let mut out = String::new();
        let mut so = child.stdout.take().unwrap();
        let mut b = [0u8; 512];
        let t0 = Instant::now();
        while !out.contains("\r\n\r\n") && t0.elapsed() < Duration::from_secs(20) {
            match so.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.push_str(&String::from_utf8_lossy(&b[..n])),
            }
        }
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            out.starts_with("RTSP/1.0 200 ") && out.contains("CSeq: 7"),
            "s_client: {out:?} {err}"
        );
        assert!(err.contains("verify return:1"), "s_client: {err}");
    }
    // The stalled handshake was closed.
    let mut b = [0u8; 16];
    let t0 = Instant::now();
    let closed = matches!(stall.read(&mut b), Ok(0) | Err(_));
    println!(
        "stalled handshake closed: {closed} after {:?}",
        t0.elapsed()
    );
    assert!(closed);
    // Plain RTSP on the plain port still works.
    let mut p = TcpStream::connect(s.rtsp).unwrap();
    p.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    p.write_all(b"OPTIONS * RTSP/1.0\r\nCSeq: 2\r\n\r\n")
        .unwrap();
    let mut b = [0u8; 512];
    let n = p.read(&mut b).unwrap();
    assert!(b[..n].starts_with(b"RTSP/1.0 200 "));
    // Counted.
    let page = s.metrics();
    for kind in [
        "tls_plain_rtsp",
        "tls_handshake_timeout",
        "tls_handshake_failed",
    ] {
        let v = common::sample(&page, &format!("penstock_errors_total{{kind=\"{kind}\"}}"))
            .unwrap_or(0.0);
        assert!(v >= 1.0, "{kind}: {v}\n{page}");
    }
}
