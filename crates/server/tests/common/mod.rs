//! A server on loopback over a small tree, for the integration tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use penstock_server::{Server, ServerConfig};

pub const TOKEN: &str = "test-token-0123456789";

pub struct Fixture {
    pub server: Option<Server>,
    pub dir: tempfile::TempDir,
    pub http: SocketAddr,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown(Duration::from_secs(5));
        }
    }
}

/// Deterministic bytes, different at every offset (a shifted range would not compare equal).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    v
}

pub fn config() -> ServerConfig {
    let mut c = ServerConfig::default();
    c.http.listen = "127.0.0.1:0".into();
    // No RTSP server unless a test asks (its default port would be shared by the tests).
    c.rtsp.listen = "".into();
    c.http.workers = 2;
    // Bodies of 1 MiB and more go through the engine: both paths are exercised.
    c.http.engine_body_bytes_min = 1 << 20;
    c.control.listen = "127.0.0.1:0".into();
    c.control.token = Some(TOKEN.into());
    c.engine.workers = 1;
    // The access log has its own tests (tests/access_log.rs); here it would fill the test
    // runner's stdout.
    c.log.access = "off".into();
    // Nothing from the machine's history: no device measured or read from a cache (a test
    // that needs disk figures sets them; the driver's tests measure).
    c.admission.self_calibrate = Some(false);
    c.admission.calibration_cache_dir = Some("/nonexistent/penstock-test-cache".into());
    c
}

/// Tree: small.txt (1000 B), mid.bin (300 KiB: the loop's sendfile), big.bin (3 MiB: the
/// engine), empty.txt, dir/ (no index), dir/x.html, pw -> /etc/passwd, up -> .., in -> small.txt.
pub fn start_with(cfg: ServerConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(p.join("small.txt"), pattern(1000, 1)).unwrap();
    std::fs::write(p.join("mid.bin"), pattern(300 * 1024, 2)).unwrap();
    std::fs::write(p.join("big.bin"), pattern(3 << 20, 3)).unwrap();
    std::fs::write(p.join("empty.txt"), b"").unwrap();
    std::fs::create_dir(p.join("dir")).unwrap();
    std::fs::write(p.join("dir/x.html"), b"<p>x</p>").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", p.join("pw")).unwrap();
    std::os::unix::fs::symlink("..", p.join("up")).unwrap();
    std::os::unix::fs::symlink("small.txt", p.join("in")).unwrap();
    let server = Server::start(&cfg, p).unwrap();
    let http = server.http_addr();
    Fixture {
        server: Some(server),
        dir,
        http,
    }
}

pub fn start() -> Fixture {
    start_with(config())
}

impl Fixture {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn control(&self) -> SocketAddr {
        self.server.as_ref().unwrap().control_addr().unwrap()
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// One raw request on a fresh connection; returns everything until the server closes or
/// `timeout` passes without a byte.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// The status code of the first response in `resp`.
pub fn status_of(resp: &[u8]) -> u16 {
    let s = String::from_utf8_lossy(&resp[..resp.len().min(12)]).to_string();
    s.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// A GET with `headers` through ureq: status, response headers, body.
pub fn get(
    f: &Fixture,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut req = agent().get(f.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.call().unwrap();
    let status = r.status().as_u16();
    let hs = r
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let body = r
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .unwrap();
    (status, hs, body)
}

/// One segment a media playlist names: `len` bytes of its URI from `offset`, `secs` long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranged {
    pub offset: u64,
    pub len: u64,
    pub secs: f64,
}

/// The playlist checker: RFC 8216's rules for a VOD media playlist whose segments are byte
/// ranges of one file of `file_len` bytes named `uri`: `#EXTM3U` first, `#EXT-X-ENDLIST`
/// last, `EXT-X-PLAYLIST-TYPE:VOD`, a version of at least 4 (byte ranges; 6 with a map on a
/// media playlist), every `EXTINF` rounded at most `EXT-X-TARGETDURATION` (§4.3.3.1), every
/// segment an explicit `len@offset` range (§4.3.2.2) of `uri`, the ranges contiguous and
/// inside the file, from the end of the map (or `first_offset`) to `end`. Returns the
/// segments and the `EXT-X-MAP` range (offset, len) if any; the caller checks what each
/// segment must begin with (a key frame) by its format.
pub fn check_media_playlist(
    playlist: &str,
    file_len: u64,
    uri: &str,
    first_offset: Option<u64>,
    end: u64,
) -> (Vec<Ranged>, Option<(u64, u64)>) {
    let lines: Vec<&str> = playlist.lines().collect();
    assert_eq!(lines[0], "#EXTM3U", "{playlist}");
    assert_eq!(lines.last(), Some(&"#EXT-X-ENDLIST"), "{playlist}");
    assert!(lines.contains(&"#EXT-X-PLAYLIST-TYPE:VOD"), "{playlist}");
    let version: u32 = lines
        .iter()
        .find_map(|l| l.strip_prefix("#EXT-X-VERSION:"))
        .expect("EXT-X-VERSION")
        .parse()
        .unwrap();
    let target: f64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("#EXT-X-TARGETDURATION:"))
        .expect("EXT-X-TARGETDURATION")
        .parse()
        .unwrap();
    let map = lines
        .iter()
        .find_map(|l| l.strip_prefix("#EXT-X-MAP:"))
        .map(|m| {
            assert!(m.starts_with(&format!("URI=\"{uri}\",BYTERANGE=\"")), "{m}");
            let r = m
                .split("BYTERANGE=\"")
                .nth(1)
                .unwrap()
                .trim_end_matches('"');
            let (len, at) = r.split_once('@').expect("a map range names its offset");
            let (len, at): (u64, u64) = (len.parse().unwrap(), at.parse().unwrap());
            assert!(at + len <= file_len, "the map lies inside the file");
            (at, len)
        });
    assert!(version >= if map.is_some() { 6 } else { 4 }, "{playlist}");
    let mut out = Vec::new();
    let mut next = first_offset.or(map.map(|(at, len)| at + len));
    for w in lines.windows(3) {
        let Some(extinf) = w[0].strip_prefix("#EXTINF:") else {
            continue;
        };
        let secs: f64 = extinf.trim_end_matches(',').parse().unwrap();
        assert!(secs > 0.0 && secs.round() <= target, "{secs} > {target}");
        let (len, at) = w[1]
            .strip_prefix("#EXT-X-BYTERANGE:")
            .expect("a byte range after EXTINF")
            .split_once('@')
            .expect("an explicit offset");
        let (len, at): (u64, u64) = (len.parse().unwrap(), at.parse().unwrap());
        assert_eq!(w[2], uri);
        if let Some(n) = next {
            assert_eq!(at, n, "ranges contiguous: {playlist}");
        }
        assert!(len > 0 && at + len <= file_len, "inside the file");
        next = Some(at + len);
        out.push(Ranged {
            offset: at,
            len,
            secs,
        });
    }
    assert!(!out.is_empty());
    assert_eq!(next, Some(end), "the last range ends at {end}");
    (out, map)
}
