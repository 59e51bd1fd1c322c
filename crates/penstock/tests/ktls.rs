//! Kernel TLS (issue 33): with `[tls] ktls = true` a 100 MB body over https leaves penstock by
//! sendfile on a socket the kernel encrypts, none of its bytes read into penstock's memory;
//! with `ktls = false` the same body goes through user-space TLS (read, then encrypted and
//! written). Both byte-exact to curl. This machine's kernel has no `tls` ULP: the transfer
//! runs in a Debian kernel under QEMU (`tools/qemu/run.sh`, fetched by `tools/qemu/fetch.sh`,
//! which `.ci/run` runs), or directly where the host kernel has the ULP. The guest's script,
//! `tests/ktls/guest.sh`, prints what it saw; this test reads it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::zerocopy::{TRACED, Tally};

const BYTES: u64 = 100 << 20;

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn host_has_ktls() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls"))
}

fn qemu_root() -> PathBuf {
    std::env::var_os("PENSTOCK_QEMU_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/penstock-qemu")
        })
}

fn which(tool: &str) -> PathBuf {
    penstock_testreq::which(tool).unwrap_or_else(|| panic!("{tool} was required"))
}

/// Runs the guest `script` where kernel TLS is: on this host when its kernel has the `tls`
/// ULP (with `env` and `PENSTOCK`), else in the QEMU guest of `tools/qemu/run.sh` with the
/// penstock binary and `bins`, the test CA and certificate of `conf` in `/etc/ktls`, the
/// `srv` files named in `/srv`, and `timeout_s`. `None` when neither can run (the
/// requirement `qemu-ktls` said so: under CI a failure, not a skip).
fn run_where_ktls_is(
    script: &Path,
    env: &[(&str, &Path)],
    bins: &[PathBuf],
    conf: &Path,
    srv: &Path,
    srv_files: &[&str],
    timeout_s: u32,
) -> Option<std::process::Output> {
    let penstock = env!("CARGO_BIN_EXE_penstock");
    if host_has_ktls() {
        let mut cmd = Command::new("sh");
        cmd.arg(script).env("PENSTOCK", penstock);
        for (k, v) in env {
            cmd.env(k, v);
        }
        return Some(run(&mut cmd));
    }
    let root = qemu_root();
    let missing = (!root.join("ready").exists()).then(|| {
        format!(
            "this kernel has no tls ULP and no QEMU kernel is in {} (tools/qemu/fetch.sh)",
            root.display()
        )
    });
    if !penstock_testreq::require_that("qemu-ktls", missing) {
        return None;
    }
    let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/qemu/run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&runner)
        .env("PENSTOCK_QEMU_ROOT", &root)
        .args(["--script"])
        .arg(script)
        .args(["--bin", penstock]);
    for b in bins {
        cmd.arg("--bin").arg(b);
    }
    cmd.args(["--mem", "1024", "--timeout", &timeout_s.to_string()]);
    for f in ["ca.pem", "cert.pem", "cert.key", "traced"] {
        if !conf.join(f).exists() {
            continue;
        }
        cmd.arg("--file")
            .arg(format!("{}:/etc/ktls/{f}", conf.join(f).display()));
    }
    for f in srv_files {
        cmd.arg("--file")
            .arg(format!("{}:/srv/{f}", srv.join(f).display()));
    }
    Some(run(&mut cmd))
}

/// `BYTES` of xorshift output, no two 8-byte words alike: a body whose every misplaced
/// byte changes its hash, made quickly on the host (random bytes made in the guest take
/// the emulated CPU minutes).
fn write_body(path: &Path) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = Vec::with_capacity(BYTES as usize);
    while (buf.len() as u64) < BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, &buf).unwrap();
}

/// The bound on the body's bytes through penstock's memory with kTLS: what the zero-copy
/// matrix allows an HTTP response (its head), plus the TLS handshakes' flights (the
/// certificate chain) of the two connections (the readiness probe's and the fetch's).
const KTLS_THROUGH_BOUND: u64 = 2 * (512 + 8 * 1024);

/// A `KTLS_TALLY mode=M k=v …` line of the guest (`guest_tally`) → its figures.
fn tally_line(log: &str, mode: &str) -> BTreeMap<String, u64> {
    let line = log
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find_map(|l| l.strip_prefix(&format!("KTLS_TALLY mode={mode} ")))
        .unwrap_or_else(|| panic!("no KTLS_TALLY line for {mode}:\n{log}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            (
                k.to_string(),
                v.parse().unwrap_or_else(|_| panic!("{line}")),
            )
        })
        .collect()
}

/// The guest half of the 100 MB test (`tests/ktls/guest.sh` runs this binary under the name
/// `ktls-tally`): the server's strace log added up by the zero-copy harness
/// (`common::zerocopy::Tally`, the parser and rule every other row of the matrix uses),
/// printed as one `KTLS_TALLY` line for the host.
#[test]
#[ignore = "the strace tally of a_100_mb_body_…, run inside the QEMU guest"]
fn guest_tally() {
    let (Some(log), Some(mode), Some(file)) = (
        std::env::var_os("KTLS_TALLY_LOG"),
        std::env::var("KTLS_TALLY_MODE").ok(),
        std::env::var_os("KTLS_TALLY_FILE"),
    ) else {
        return;
    };
    let tally = Tally::read(Path::new(&log));
    let file = Path::new(&file);
    for l in tally.to_string().lines() {
        println!("KTLS_TALLY_CALL mode={mode} {}", l.trim());
    }
    println!(
        "KTLS_TALLY mode={mode} zero_copy_to_sockets={} read_from_file={} written_to_sockets={} \
         through_user_space={} calls={}",
        tally.zero_copy_to_sockets(),
        tally.read_from_file(file),
        tally.written_to_sockets(),
        tally.through_user_space(file),
        tally.calls
    );
}

#[test]
fn a_100_mb_body_leaves_by_sendfile_on_a_ktls_socket_and_through_user_space_without_it() {
    for tool in ["curl", "strace", "openssl"] {
        if !penstock_testreq::require(tool) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    common::make_ca(&conf);
    // `cert.pem` (the chain) and `cert.key`, as tests/ktls/guest.sh names them.
    common::make_cert(&conf, "cert", "localhost");
    let srv = dir.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    write_body(&srv.join("big.bin"));
    // The calls to trace, and the tally of what they moved: the zero-copy harness's own
    // (this binary, under the name the guest script runs).
    std::fs::write(conf.join("traced"), TRACED).unwrap();
    let tally = dir.path().join("ktls-tally");
    std::fs::copy(std::env::current_exe().unwrap(), &tally).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ktls/guest.sh");
    let work = dir.path().join("work");
    let Some(out) = run_where_ktls_is(
        &script,
        &[
            ("WORK", &work),
            ("CONF", &conf),
            ("SRV", &srv),
            ("TALLY", &tally),
        ],
        &[which("curl"), which("strace"), tally.clone()],
        &conf,
        &srv,
        &["big.bin"],
        900,
    ) else {
        return;
    };
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown: Vec<&str> = log
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.contains("KTLS_") || l.contains("PENSTOCK_QEMU"))
        .collect();
    println!("{}", shown.join("\n"));
    for (mode, path) in [("ktls", "path=ktls"), ("user", "path=tls-user")] {
        let result = shown
            .iter()
            .find(|l| l.contains(&format!("KTLS_RESULT mode={mode} ")))
            .unwrap_or_else(|| panic!("no result for {mode}:\n{log}"));
        assert!(
            result.contains("same=yes"),
            "{mode}: curl got other bytes: {result}"
        );
        assert!(
            result.contains(path),
            "{mode}: the access log names another path: {result}"
        );
    }
    // kTLS: the body by sendfile/splice to the socket; through penstock's memory only heads
    // and handshakes (the matrix's rule, docs/testing.md).
    let ktls = tally_line(&log, "ktls");
    println!("kTLS: {ktls:?} (bound {KTLS_THROUGH_BOUND} B through user space)");
    assert!(
        ktls["zero_copy_to_sockets"] >= BYTES,
        "kTLS: the body did not leave by sendfile/splice: {ktls:?}"
    );
    assert!(
        ktls["through_user_space"] <= KTLS_THROUGH_BOUND,
        "kTLS: {} B of the body through user space, bound {KTLS_THROUGH_BOUND} B: {ktls:?}",
        ktls["through_user_space"]
    );
    // User-space TLS, the control: the same harness sees the body read into memory and
    // written (encrypted) from it.
    let user = tally_line(&log, "user");
    println!("user TLS: {user:?}");
    assert!(
        user["read_from_file"] >= BYTES && user["written_to_sockets"] >= BYTES,
        "user TLS: the harness did not see the body go through user space: {user:?}"
    );
    // The kernel counted the kTLS session.
    let tx_sw = shown
        .iter()
        .find_map(|l| l.trim().strip_prefix("KTLS_STAT TlsTxSw"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        tx_sw >= 1,
        "/proc/net/tls_stat counts no kTLS transmit session:\n{log}"
    );
}

/// The guest's client of `tests/ktls/keyupdate.sh`: this test binary, run in the QEMU guest
/// (or on a host with the ULP) with `KTLS_GUEST_CLIENT` set. Ignored otherwise: it is the
/// client half of `a_key_update_and_close_notify_on_ktls_connections_end_cleanly`, which
/// asserts what it prints.
#[test]
#[ignore = "the client half of a_key_update_and_close_notify_…, run inside the QEMU guest"]
fn guest_client() {
    if std::env::var_os("KTLS_GUEST_CLIENT").is_none() {
        return;
    }
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}"));
    let srv = PathBuf::from(env("KTLS_SRV"));
    let ca = PathBuf::from(env("KTLS_CA"));
    let clip = std::fs::read(srv.join("clip.ts")).unwrap();
    for key_update in [false, true] {
        let (got, end) = guest::rtsp_session(&env("KTLS_RTSPS"), &ca, key_update, clip.len());
        println!(
            "KTLS_KU rtsps key_update={key_update} same={} prefix={} bytes={} of={} end={end}",
            got == clip,
            clip.starts_with(&got),
            got.len(),
            clip.len()
        );
    }
    let body = std::fs::read(srv.join("body.bin")).unwrap();
    let (got, end) = guest::https_get(&env("KTLS_HTTPS"), &ca, "/body.bin");
    println!(
        "KTLS_KU https key_update=true same={} prefix={} bytes={} of={} end={end}",
        got == body,
        body.starts_with(&got),
        got.len(),
        body.len()
    );
    let (got, end) = guest::https_get_close(&env("KTLS_HTTPS"), &ca, "/body.bin");
    println!(
        "KTLS_KU https connection_close same={} bytes={} end={end}",
        got == body,
        got.len()
    );
}

mod guest {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

    fn connect(addr: &str, ca: &Path) -> Tls {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(addr).unwrap();
        // Under emulation: generous, and only a bound on a stuck test.
        tcp.set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let conn =
            rustls::ClientConnection::new(Arc::new(cfg), "localhost".try_into().unwrap()).unwrap();
        rustls::StreamOwned::new(conn, tcp)
    }

    /// How a read ended: `eof` (with or without close_notify: rustls says which), or the
    /// error (a corrupt record would be rustls's "decrypt error").
    fn ended(e: std::io::Error) -> String {
        format!("error:{}", e.to_string().replace(' ', "_"))
    }

    /// An RTSP session over TLS on `addr` playing `/clip.ts` interleaved: the RTP payloads
    /// until the BYE or the end of the connection, and how it ended. With `key_update`, a
    /// KeyUpdate is sent once half of `len` has come.
    pub fn rtsp_session(addr: &str, ca: &Path, key_update: bool, len: usize) -> (Vec<u8>, String) {
        let mut s = connect(addr, ca);
        let url = format!("rtsps://localhost/{}", "clip.ts");
        let mut buf: Vec<u8> = Vec::new();
        let mut cseq = 0;
        let mut session = String::new();
        for (method, extra) in [
            ("DESCRIBE", String::new()),
            (
                "SETUP",
                "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n".to_string(),
            ),
            ("PLAY", String::new()),
        ] {
            cseq += 1;
            let extra = if method == "PLAY" {
                format!("Session: {session}\r\n")
            } else {
                extra
            };
            let req = format!("{method} {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{extra}\r\n");
            if let Err(e) = s.write_all(req.as_bytes()) {
                return (Vec::new(), ended(e));
            }
            loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let body: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buf.len() >= end + 4 + body {
                        assert!(head.starts_with("RTSP/1.0 200"), "{method}: {head}");
                        if let Some(v) = head.lines().find_map(|l| l.strip_prefix("Session: ")) {
                            session = v.split(';').next().unwrap().trim().to_string();
                        }
                        buf.drain(..end + 4 + body);
                        break;
                    }
                }
                let mut b = [0u8; 16384];
                match s.read(&mut b) {
                    Ok(0) => return (Vec::new(), "eof-before-play".into()),
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                    Err(e) => return (Vec::new(), ended(e)),
                }
            }
        }
        let mut got = Vec::new();
        let mut updated = false;
        loop {
            while buf.len() >= 4 && buf[0] == b'$' {
                let n = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
                if buf.len() < 4 + n {
                    break;
                }
                let (ch, p) = (buf[1], buf[4..4 + n].to_vec());
                buf.drain(..4 + n);
                if ch == 0 && p.len() > 12 {
                    got.extend_from_slice(&p[12..]);
                } else if ch == 1 && p.len() > 1 && p[1] == 203 {
                    return (got, "bye".into());
                } else if ch == 1 {
                    // A sender report; a compound may end with the BYE.
                    let mut at = 0;
                    while at + 4 <= p.len() {
                        if p[at + 1] == 203 {
                            return (got, "bye".into());
                        }
                        at += 4 * (usize::from(u16::from_be_bytes([p[at + 2], p[at + 3]])) + 1);
                    }
                }
            }
            if key_update && !updated && got.len() >= len / 2 {
                updated = true;
                s.conn.refresh_traffic_keys().unwrap();
                if let Err(e) = s.flush() {
                    return (got, ended(e));
                }
            }
            let mut b = [0u8; 16384];
            match s.read(&mut b) {
                Ok(0) => return (got, "eof".into()),
                Ok(n) => buf.extend_from_slice(&b[..n]),
                Err(e) => return (got, ended(e)),
            }
        }
    }

    /// A GET over TLS with `Connection: close`, read to the end of the connection: the body
    /// and how the connection ended (`eof` only when the server said close_notify: rustls
    /// reports a bare FIN as an error).
    pub fn https_get_close(addr: &str, ca: &Path, path: &str) -> (Vec<u8>, String) {
        let mut s = connect(addr, ca);
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        if let Err(e) = s.write_all(req.as_bytes()) {
            return (Vec::new(), ended(e));
        }
        let mut all = Vec::new();
        let mut b = vec![0u8; 65536];
        let end = loop {
            match s.read(&mut b) {
                Ok(0) => break "eof".to_string(),
                Ok(n) => all.extend_from_slice(&b[..n]),
                Err(e) => break ended(e),
            }
        };
        let body = match all.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(h) => all.split_off(h + 4),
            None => Vec::new(),
        };
        (body, end)
    }

    /// A GET over TLS with a KeyUpdate once half the body came and a close_notify after it:
    /// the body read and how the connection ended.
    pub fn https_get(addr: &str, ca: &Path, path: &str) -> (Vec<u8>, String) {
        let mut s = connect(addr, ca);
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        if let Err(e) = s.write_all(req.as_bytes()) {
            return (Vec::new(), ended(e));
        }
        let mut buf = Vec::new();
        let mut b = vec![0u8; 65536];
        let (start, len) = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                break (end + 4, len);
            }
            match s.read(&mut b) {
                Ok(0) => return (Vec::new(), "eof-before-head".into()),
                Ok(n) => buf.extend_from_slice(&b[..n]),
                Err(e) => return (Vec::new(), ended(e)),
            }
        };
        let mut body = buf.split_off(start);
        let mut updated = false;
        while body.len() < len {
            if !updated && body.len() >= len / 2 {
                updated = true;
                s.conn.refresh_traffic_keys().unwrap();
                if let Err(e) = s.flush() {
                    return (body, ended(e));
                }
            }
            match s.read(&mut b) {
                Ok(0) => return (body, "eof-before-end".into()),
                Ok(n) => body.extend_from_slice(&b[..n]),
                Err(e) => return (body, ended(e)),
            }
        }
        // The whole body: close_notify, then what the server does.
        s.conn.send_close_notify();
        if let Err(e) = s.flush() {
            return (body, format!("complete,close_notify_{}", ended(e)));
        }
        let end = match s.read(&mut b) {
            Ok(0) => "eof".to_string(),
            Ok(n) => format!("{n}-more-bytes"),
            Err(e) => ended(e),
        };
        (body, format!("complete,close_notify_sent,{end}"))
    }
}

/// Kernel TLS and the end of a session (docs/tls.md, "kTLS: key updates and close_notify"):
/// in the QEMU guest (a kernel with the `tls` module), penstock with an https:// and an
/// rtsps:// listener and `[tls] ktls = true`; the client (`guest_client`, rustls, TLS 1.3)
/// plays an rtsps:// session interleaved over kTLS to its BYE, byte for byte; then plays one
/// sending a KeyUpdate midway, and GETs a body sending a KeyUpdate midway and a
/// close_notify after it. The bytes that arrive are always the file's (a prefix of it, or
/// all of it), and a connection ends with a close, never a corrupt record.
#[test]
fn a_key_update_and_close_notify_on_ktls_connections_end_cleanly() {
    if !penstock_testreq::require("openssl") || !penstock_testreq::require("ffmpeg") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    common::make_ca(&conf);
    common::make_cert(&conf, "cert", "localhost");
    let srv = dir.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    let clip = common::mpeg2_ts_clip("ktls-ku", 4).expect("ffmpeg was required");
    std::fs::copy(&clip, srv.join("clip.ts")).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut body = Vec::with_capacity(8 << 20);
    while body.len() < 8 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        body.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(srv.join("body.bin"), &body).unwrap();
    // The client is this binary, under the name the guest script runs.
    let client = dir.path().join("ktls-client");
    std::fs::copy(std::env::current_exe().unwrap(), &client).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ktls/keyupdate.sh");
    let work = dir.path().join("work");
    let Some(out) = run_where_ktls_is(
        &script,
        &[
            ("CLIENT", &client),
            ("WORK", &work),
            ("CONF", &conf),
            ("SRV", &srv),
        ],
        std::slice::from_ref(&client),
        &conf,
        &srv,
        &["clip.ts", "body.bin"],
        600,
    ) else {
        return;
    };
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown: Vec<&str> = log
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.contains("KTLS_KU") || l.contains("PENSTOCK_QEMU"))
        .collect();
    println!("{}", shown.join("\n"));
    let line = |what: &str| {
        *shown
            .iter()
            .find(|l| l.contains(&format!("KTLS_KU {what}")))
            .unwrap_or_else(|| panic!("no {what} line:\n{log}"))
    };
    // The session without a key update: every payload byte, to the BYE, over kTLS.
    let plain = line("rtsps key_update=false");
    assert!(
        plain.contains("same=true") && plain.contains("end=bye"),
        "{plain}"
    );
    assert!(
        log.contains("path=ktls"),
        "the rtsps connections were not kTLS:\n{log}"
    );
    // A response with `Connection: close` over kTLS ends with the server's close_notify (an
    // alert record the kernel makes, `ktls::send_close_notify`), not a bare FIN.
    let close = line("https connection_close");
    assert!(
        close.contains("same=true") && close.contains("end=eof"),
        "{close}"
    );
    // With a key update: the file's bytes (all, or a prefix), then a close; never a record
    // that does not decrypt.
    for what in ["rtsps key_update=true", "https key_update=true"] {
        let l = line(what);
        assert!(l.contains("prefix=true"), "{what}: other bytes: {l}");
        let lower = l.to_lowercase();
        assert!(
            !lower.contains("decrypt")
                && !lower.contains("corrupt")
                && !lower.contains("bad_record"),
            "{what}: a corrupt record: {l}"
        );
    }
}
