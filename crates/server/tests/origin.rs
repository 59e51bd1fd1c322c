//! `[origin]` (issue 18 item 1, docs/origin.md) on loopback with real parts: nginx as the
//! HTTP origin (started and stopped here), penstock serving an empty root, ureq clients;
//! and small origins written here where a fault must be exact (a body cut mid-block, a
//! garbled range, an origin that never answers). Every byte is compared; origin bytes are
//! counted by nginx's access log and by penstock's metric. No assertion on wall-clock time.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;

struct Nginx {
    child: Child,
    port: u16,
    www: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the master, which stops its workers; SIGKILL would orphan them (each
        // run left nginx workers behind). SIGKILL only if it has not exited within 5 s.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// nginx on loopback serving a fresh directory, logging `status body_bytes_sent uri`.
fn nginx() -> Option<Nginx> {
    if !penstock_testreq::require("nginx") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().to_path_buf();
    let www = p.join("www");
    std::fs::create_dir(&www).unwrap();
    let log = p.join("access.log");
    let port = free_port();
    std::fs::write(
        p.join("nginx.conf"),
        format!(
            "user root;\nworker_processes 1;\ndaemon off;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  log_format b '$status $body_bytes_sent $request_uri';\n  access_log {log} b;\n  sendfile on;\n\
               client_body_temp_path {p}/cb; proxy_temp_path {p}/px; fastcgi_temp_path {p}/fc; uwsgi_temp_path {p}/uw; scgi_temp_path {p}/sc;\n\
               server {{ listen 127.0.0.1:{port}; root {www}; location / {{ }} }}\n}}\n",
            p = p.display(),
            log = log.display(),
            www = www.display(),
        ),
    )
    .unwrap();
    let child = Command::new("nginx")
        .arg("-p")
        .arg(&p)
        .arg("-c")
        .arg(p.join("nginx.conf"))
        .arg("-e")
        .arg(p.join("error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed and waited for by Drop, whatever happens next.
    let n = Nginx {
        child,
        port,
        www,
        log,
        _dir: dir,
    };
    for _ in 0..200 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(n);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("nginx did not listen");
}

impl Nginx {
    /// Body bytes nginx sent (its access log; it writes each line at the request's end).
    fn bytes_sent(&self) -> u64 {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(1)?.parse::<u64>().ok())
            .sum()
    }
}

/// penstock with an empty root, its origin `url`, the cache in a directory of its own.
fn penstock(
    url: &str,
    tune: impl FnOnce(&mut penstock_server::config::OriginConfig),
) -> (Fixture, tempfile::TempDir) {
    // The server's warnings (an origin fault, a cut body) in the test's output.
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.origin.url = url.to_string();
    cfg.origin.cache_dir = Some(cache.path().to_path_buf());
    cfg.origin.block_bytes = MIB;
    cfg.origin.cache_bytes_max = 256 * MIB;
    tune(&mut cfg.origin);
    (start_with(cfg), cache)
}

fn metric(f: &Fixture, name: &str) -> u64 {
    let page = String::from_utf8(get(f, "/metrics", &[]).2).unwrap();
    page.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("{name} not in the metrics"))
        .round() as u64
}

/// Block files and temporary files left in the cache: (blocks, bytes of blocks, temps).
fn cache_files(cache: &Path) -> (usize, u64, usize) {
    let dir = cache.join("penstock-origin");
    let blocks: Vec<_> = std::fs::read_dir(dir.join("blocks"))
        .unwrap()
        .flatten()
        .collect();
    let bytes = blocks.iter().map(|e| e.metadata().unwrap().len()).sum();
    let temps = std::fs::read_dir(dir.join("tmp")).unwrap().count();
    (blocks.len(), bytes, temps)
}

fn fetch(
    f: &Fixture,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    get(f, path, headers)
}

#[test]
fn concurrent_clients_get_exact_bytes_and_each_block_is_fetched_once() {
    let Some(n) = nginx() else { return };
    let files: Vec<(String, Vec<u8>)> = (0..16)
        .map(|i| {
            // Sizes around a few MB, most not a multiple of the block.
            let len = 2_500_000 + i * 123_457;
            (format!("/v/f{i}.bin"), pattern(len, 100 + i as u64))
        })
        .collect();
    std::fs::create_dir(n.www.join("v")).unwrap();
    for (name, data) in &files {
        std::fs::write(n.www.join(&name[1..]), data).unwrap();
    }
    let unique: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let (f, _cache) = penstock(&format!("http://127.0.0.1:{}", n.port), |_| {});
    let clients = 8;
    std::thread::scope(|s| {
        for c in 0..clients {
            let (f, files) = (&f, &files);
            s.spawn(move || {
                // Every client reads every file, all starting together on the same ones
                // (readers of one block at once: coalescing), half of them in another order.
                for k in 0..files.len() {
                    let i = if c % 2 == 0 {
                        k
                    } else {
                        (k * 7 + c) % files.len()
                    };
                    let (name, data) = &files[i];
                    let (st, _, body) = fetch(f, name, &[]);
                    assert_eq!(st, 200, "{name}");
                    assert!(
                        body == *data,
                        "{name}: {} bytes differ from the origin's",
                        body.len()
                    );
                }
            });
        }
    });
    let ours = metric(&f, "penstock_origin_fetched_bytes_total");
    // nginx writes its log line after the response: bounded wait for the last ones.
    let mut theirs = n.bytes_sent();
    for _ in 0..100 {
        if theirs >= unique {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        theirs = n.bytes_sent();
    }
    let waits = metric(&f, "penstock_origin_coalesced_waits_total");
    let hits = metric(&f, "penstock_origin_cache_hits_total");
    println!(
        "unique {unique} B, origin sent {theirs} B (nginx log), fetched {ours} B (metric): {:.4} × unique; coalesced waits {waits}, hits {hits}",
        theirs as f64 / unique as f64
    );
    assert_eq!(ours, theirs, "the metric counts what nginx sent");
    assert!(
        theirs >= unique,
        "every byte came from the origin once at least"
    );
    assert!(
        theirs as f64 <= 1.05 * unique as f64,
        "origin bytes {theirs} > 1.05 × unique {unique}"
    );
    // Every later read is a hit: clients × files reads, each object's blocks once fetched.
    assert!(hits > 0);
}

#[test]
fn ranges_head_and_conditionals_work_as_on_local_files() {
    let Some(n) = nginx() else { return };
    let data = pattern(3 * MIB as usize + 1000, 7);
    std::fs::write(n.www.join("r.bin"), &data).unwrap();
    std::fs::write(n.www.join("empty.bin"), b"").unwrap();
    let (f, _cache) = penstock(&format!("http://127.0.0.1:{}/", n.port), |o| {
        o.read_ahead_blocks = 0;
    });
    // Across a block boundary, from the middle of one block.
    let (st, hs, body) = fetch(&f, "/r.bin", &[("range", "bytes=1000000-2100000")]);
    assert_eq!(st, 206);
    assert!(body == data[1_000_000..=2_100_000]);
    let cr = hs
        .iter()
        .find(|(k, _)| k == "content-range")
        .map(|(_, v)| v.clone());
    assert_eq!(
        cr.as_deref(),
        Some(format!("bytes 1000000-2100000/{}", data.len()).as_str())
    );
    // Only the blocks of that range (and the first, which tells the size) were fetched.
    assert_eq!(metric(&f, "penstock_origin_fetched_bytes_total"), 3 * MIB);
    // A suffix, the last (short) block.
    let (st, _, body) = fetch(&f, "/r.bin", &[("range", "bytes=-500")]);
    assert_eq!(st, 206);
    assert!(body == data[data.len() - 500..]);
    // Two ranges: multipart, each part exact.
    let (st, hs, body) = fetch(&f, "/r.bin", &[("range", "bytes=0-9,3145728-3145737")]);
    assert_eq!(st, 206);
    let ct = hs
        .iter()
        .find(|(k, _)| k == "content-type")
        .unwrap()
        .1
        .clone();
    assert!(ct.starts_with("multipart/byteranges"), "{ct}");
    let text = body.clone();
    let find = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    assert!(find(&data[0..10]) && find(&data[3145728..3145738]));
    // Past the end: 416; HEAD: the length, no body.
    let (st, _, _) = fetch(&f, "/r.bin", &[("range", "bytes=99999999-")]);
    assert_eq!(st, 416);
    let r = agent().head(f.url("/r.bin")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers().get("content-length").unwrap().to_str().unwrap(),
        data.len().to_string()
    );
    // The whole object, then a conditional GET with the validator penstock gave: 304.
    let (st, hs, body) = fetch(&f, "/r.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == data);
    let etag = hs.iter().find(|(k, _)| k == "etag").unwrap().1.clone();
    let (st, _, body) = fetch(&f, "/r.bin", &[("if-none-match", &etag)]);
    assert_eq!((st, body.len()), (304, 0));
    // An empty object.
    let (st, _, body) = fetch(&f, "/empty.bin", &[]);
    assert_eq!((st, body.len()), (200, 0));
    // Missing at the origin: 404, and a local path still wins over the origin.
    assert_eq!(fetch(&f, "/nope.bin", &[]).0, 404);
    assert!(fetch(&f, "/small.txt", &[]).2 == pattern(1000, 1));
}

#[test]
fn lru_eviction_under_a_small_limit_keeps_every_byte_exact() {
    let Some(n) = nginx() else { return };
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("/e{i}.bin"),
                pattern(2 * MIB as usize + 5000, 300 + i),
            )
        })
        .collect();
    for (name, data) in &files {
        std::fs::write(n.www.join(&name[1..]), data).unwrap();
    }
    let (f, cache) = penstock(&format!("http://127.0.0.1:{}", n.port), |o| {
        o.cache_bytes_max = 3 * MIB;
    });
    for round in 0..2 {
        std::thread::scope(|s| {
            for chunk in files.chunks(2) {
                let f = &f;
                s.spawn(move || {
                    for (name, data) in chunk {
                        let (st, _, body) = fetch(f, name, &[]);
                        assert_eq!(st, 200);
                        assert!(body == *data, "{name} differs in round {round}");
                    }
                });
            }
        });
    }
    let evictions = metric(&f, "penstock_origin_cache_evictions_total");
    let cached = metric(&f, "penstock_origin_cache_bytes");
    let (_, bytes, temps) = cache_files(cache.path());
    println!(
        "evictions {evictions}, cache bytes {cached} (files {bytes}), limit {}",
        3 * MIB
    );
    assert!(evictions > 0, "a 3 MiB cache for 16 MiB of objects evicts");
    assert!(cached <= 3 * MIB && bytes <= 3 * MIB, "{cached} {bytes}");
    assert_eq!(temps, 0, "no temporary file is left");
}

#[test]
fn a_changed_object_is_revalidated_and_its_new_bytes_served() {
    let Some(n) = nginx() else { return };
    let old = pattern(2 * MIB as usize + 77, 11);
    let new = pattern(2 * MIB as usize + 77, 12);
    let path = n.www.join("c.bin");
    std::fs::write(&path, &old).unwrap();
    let (f, _cache) = penstock(&format!("http://127.0.0.1:{}", n.port), |o| {
        o.revalidate_after_ms = 100;
    });
    assert!(fetch(&f, "/c.bin", &[]).2 == old);
    // Unchanged: after the TTL a conditional request, answered 304 (no body).
    std::thread::sleep(Duration::from_millis(150));
    let before = metric(&f, "penstock_origin_fetched_bytes_total");
    assert!(fetch(&f, "/c.bin", &[]).2 == old);
    assert_eq!(metric(&f, "penstock_origin_fetched_bytes_total"), before);
    assert!(metric(&f, "penstock_origin_revalidations_total") >= 1);
    // Changed (new bytes, another mtime: nginx's ETag changes): the new bytes.
    std::fs::write(&path, &new).unwrap();
    let t = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(t)
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let (st, _, body) = fetch(&f, "/c.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == new, "the changed object's new bytes");
    assert_eq!(metric(&f, "penstock_origin_objects_changed_total"), 1);
}

/// A one-object origin written here: `size` bytes of `pattern(size, 5)`, ranges served
/// exactly except for the requests `fault` rewrites. Runs until the test ends.
fn fake_origin(size: usize, fault: fn(u64, &mut Vec<u8>, &mut Vec<u8>)) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    scripted_origin(l, size, move |start, _, head, body| {
        fault(start, head, body)
    });
    port
}

/// How many requests a scripted origin received for each range start.
type Asked = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, u32>>>;

/// The origin of [`fake_origin`] on the listener `l`, with a fault that also sees how many
/// times this range start was asked before (0 the first time): transient faults. Returns
/// the requests counted per range start.
fn scripted_origin(
    l: TcpListener,
    size: usize,
    fault: impl Fn(u64, u32, &mut Vec<u8>, &mut Vec<u8>) + Send + Sync + 'static,
) -> Asked {
    let data = std::sync::Arc::new(pattern(size, 5));
    let asked: Asked = Default::default();
    let counts = asked.clone();
    let fault = std::sync::Arc::new(fault);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let (data, counts, fault) = (data.clone(), counts.clone(), fault.clone());
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                loop {
                    let mut range = None;
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                            let (a, b) = v.trim().split_once('-').unwrap();
                            range = Some((a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()));
                        }
                    }
                    let (a, b) = range.expect("penstock always asks for a range");
                    let nth = {
                        let mut c = counts.lock().unwrap();
                        let n = c.entry(a).or_insert(0);
                        *n += 1;
                        *n - 1
                    };
                    let b = b.min(data.len() as u64 - 1);
                    let mut body = data[a as usize..=b as usize].to_vec();
                    let mut head = format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{}\r\nContent-Length: {}\r\nETag: \"x\"\r\n\r\n",
                        data.len(),
                        body.len()
                    )
                    .into_bytes();
                    fault(a, nth, &mut head, &mut body);
                    if s.write_all(&head).is_err() || s.write_all(&body).is_err() {
                        return;
                    }
                    if head.is_empty() {
                        // The fault cut the connection.
                        let _ = s.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                }
            });
        }
    });
    asked
}

/// Block 1 (from 1 MiB) is cut after half its body: the origin dies mid-transfer.
fn cut_second_block(start: u64, head: &mut Vec<u8>, body: &mut Vec<u8>) {
    if start == MIB {
        body.truncate(body.len() / 2);
        let mut h = std::mem::take(head);
        h.extend_from_slice(body);
        *body = h;
        // An empty head tells the responder to close after writing `body`.
    }
}

/// Block 1 is answered with another range than the one asked.
fn garble_second_block(start: u64, head: &mut Vec<u8>, _body: &mut Vec<u8>) {
    if start == MIB {
        let h = String::from_utf8(head.clone()).unwrap();
        *head = h
            .replace(&format!("bytes {}-", MIB), &format!("bytes {}-", MIB + 1))
            .into_bytes();
    }
}

/// Block 0 is cut: the object cannot even be opened.
fn cut_first_block(start: u64, head: &mut Vec<u8>, body: &mut Vec<u8>) {
    if start == 0 {
        cut_second_block(MIB, head, body);
    }
}

/// Reads a whole response on a raw connection (until the server closes): head and body.
fn raw_get(f: &Fixture, path: &str) -> (u16, usize, Option<usize>) {
    let resp = raw(
        f.http,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |p| p + 4);
    let head = String::from_utf8_lossy(&resp[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: ")?.trim().parse().ok());
    (status_of(&resp), resp.len() - end, len)
}

#[test]
fn an_origin_dying_mid_block_cuts_the_body_and_caches_nothing_partial() {
    let size = 3 * MIB as usize;
    for (fault, label) in [
        (
            cut_second_block as fn(u64, &mut Vec<u8>, &mut Vec<u8>),
            "cut",
        ),
        (garble_second_block, "garbled"),
    ] {
        let port = fake_origin(size, fault);
        let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |o| {
            o.read_ahead_blocks = 0;
            o.timeout_ms = 2000;
        });
        // The head (200, the whole length) went before block 1 failed: the body is short
        // and the connection closes, as HTTP/1.1 has it.
        let (st, body_len, len) = raw_get(&f, "/o.bin");
        assert_eq!((st, len), (200, Some(size)), "{label}");
        assert_eq!(
            body_len, MIB as usize,
            "{label}: block 0 only, then the cut"
        );
        // Only the complete block 0 is cached; no temporary file stays.
        let (blocks, bytes, temps) = cache_files(cache.path());
        assert_eq!((blocks, bytes, temps), (1, MIB, 0), "{label}");
        // Tried twice (`attempts = 2`), never kept.
        assert!(
            metric(&f, "penstock_origin_fetch_failures_total") >= 2,
            "{label}"
        );
        // Block 1 is asked again (not served from a poisoned entry), and fails again.
        let (_, body_len, _) = raw_get(&f, "/o.bin");
        assert_eq!(body_len, MIB as usize, "{label}");
        // A range inside block 0 is still served whole from the cache.
        let (st, _, body) = fetch(&f, "/o.bin", &[("range", "bytes=10-99")]);
        assert_eq!(st, 206);
        assert!(body == pattern(size, 5)[10..100]);
    }
    // The first block cut: no head was sent yet, so 502, nothing cached.
    let port = fake_origin(size, cut_first_block);
    let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |_| {});
    assert_eq!(fetch(&f, "/o.bin", &[]).0, 502);
    assert_eq!(cache_files(cache.path()), (0, 0, 0));
}

/// `from` replaced by `to` in a reply head.
fn rewrite(head: &mut Vec<u8>, from: &str, to: &str) {
    let h = String::from_utf8(head.clone()).unwrap();
    assert!(h.contains(from), "{from:?} not in {h:?}");
    *head = h.replace(from, to).into_bytes();
}

/// A rewrite of a reply's head and body.
type Garble = fn(&mut Vec<u8>, &mut Vec<u8>);

/// The ways an origin garbles block 1 (from 1 MiB, of a 3 MiB object): each is refused.
fn garbles() -> Vec<(&'static str, Garble)> {
    vec![
        // A shorter range than asked, consistently framed (as a truncating proxy would).
        ("short range", |head, body| {
            let half = MIB / 2;
            rewrite(
                head,
                &format!("bytes {}-{}", MIB, 2 * MIB - 1),
                &format!("bytes {}-{}", MIB, MIB + half - 1),
            );
            rewrite(
                head,
                &format!("Content-Length: {MIB}"),
                &format!("Content-Length: {half}"),
            );
            body.truncate(half as usize);
        }),
        // Content-Length longer than the range, with that many bytes.
        ("long length", |head, body| {
            rewrite(
                head,
                &format!("Content-Length: {MIB}"),
                &format!("Content-Length: {}", MIB + 10),
            );
            body.extend_from_slice(&[0xAA; 10]);
        }),
        // Content-Length shorter than the range, the connection kept open.
        ("short length", |head, body| {
            rewrite(
                head,
                &format!("Content-Length: {MIB}"),
                &format!("Content-Length: {}", MIB - 10),
            );
            body.truncate(MIB as usize - 10);
        }),
        // Another object's size in the Content-Range.
        ("wrong size", |head, _| {
            rewrite(head, &format!("/{}", 3 * MIB), &format!("/{}", 3 * MIB + 1));
        }),
        // A 206 without a Content-Range.
        ("no content-range", |head, _| {
            rewrite(
                head,
                &format!(
                    "Content-Range: bytes {}-{}/{}\r\n",
                    MIB,
                    2 * MIB - 1,
                    3 * MIB
                ),
                "",
            );
        }),
    ]
}

/// Each block file in the cache against the object's bytes: (block, equal).
fn blocks_match(cache: &Path, data: &[u8]) -> Vec<(u64, bool)> {
    let mut out: Vec<(u64, bool)> = std::fs::read_dir(cache.join("penstock-origin/blocks"))
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let i: u64 = name.rsplit('-').next().unwrap().parse().unwrap();
            let start = (i * MIB) as usize;
            let want = &data[start..(start + MIB as usize).min(data.len())];
            (i, std::fs::read(e.path()).unwrap() == want)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_short_or_garbled_range_is_retried_up_to_attempts_and_never_cached() {
    let size = 3 * MIB as usize;
    let data = pattern(size, 5);
    for (label, garble) in garbles() {
        // Always garbled: tried `attempts` times (3 here), then the body is cut after block
        // 0 and only block 0 is on disk.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let asked = scripted_origin(l, size, move |start, _, head, body| {
            if start == MIB {
                garble(head, body)
            }
        });
        let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |o| {
            o.read_ahead_blocks = 0;
            o.attempts = 3;
            o.timeout_ms = 2000;
        });
        let (st, body_len, len) = raw_get(&f, "/o.bin");
        assert_eq!(
            (st, len, body_len),
            (200, Some(size), MIB as usize),
            "{label}"
        );
        assert_eq!(
            asked.lock().unwrap().get(&MIB),
            Some(&3),
            "{label}: attempts = 3"
        );
        assert_eq!(cache_files(cache.path()), (1, MIB, 0), "{label}");
        assert_eq!(
            blocks_match(cache.path(), &data),
            vec![(0, true)],
            "{label}"
        );
        assert_eq!(
            metric(&f, "penstock_origin_fetch_failures_total"),
            3,
            "{label}"
        );

        // Garbled once only: the second attempt is right; the client gets every byte and
        // the cache holds the three blocks exactly.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let asked = scripted_origin(l, size, move |start, nth, head, body| {
            if start == MIB && nth == 0 {
                garble(head, body)
            }
        });
        let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |o| {
            o.read_ahead_blocks = 0;
            o.timeout_ms = 2000;
        });
        let (st, _, body) = fetch(&f, "/o.bin", &[]);
        assert!(st == 200 && body == data, "{label}: retried, exact");
        assert_eq!(asked.lock().unwrap().get(&MIB), Some(&2), "{label}");
        assert_eq!(
            blocks_match(cache.path(), &data),
            vec![(0, true), (1, true), (2, true)],
            "{label}"
        );
        assert_eq!(cache_files(cache.path()).2, 0, "{label}: no temporary file");
    }
    // `attempts = 1`: a transient fault is not tried again (the limit is the configured one).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let asked = scripted_origin(l, size, |start, nth, head, body| {
        if start == MIB && nth == 0 {
            garble_second_block(start, head, body)
        }
    });
    let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |o| {
        o.read_ahead_blocks = 0;
        o.attempts = 1;
    });
    assert_eq!(raw_get(&f, "/o.bin").1, MIB as usize);
    assert_eq!(asked.lock().unwrap().get(&MIB), Some(&1));
    assert_eq!(cache_files(cache.path()), (1, MIB, 0));
}

#[test]
fn an_origin_back_after_a_502_serves_exact_bytes_from_an_unpoisoned_cache() {
    let size = 3 * MIB as usize + 7;
    let data = pattern(size, 5);
    // Nothing listens on the port yet: 502, twice (the second asks again), nothing kept.
    let port = free_port();
    let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |o| {
        o.read_ahead_blocks = 0;
    });
    for _ in 0..2 {
        assert_eq!(fetch(&f, "/o.bin", &[]).0, 502);
        assert_eq!(cache_files(cache.path()), (0, 0, 0));
    }
    let failures = metric(&f, "penstock_origin_fetch_failures_total");
    assert!(failures >= 2, "{failures} failures counted");
    // The origin comes up on that port: the same server, no restart, exact bytes, each
    // block asked once.
    let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let asked = scripted_origin(l, size, |_, _, _, _| {});
    let (st, _, body) = fetch(&f, "/o.bin", &[]);
    assert_eq!(st, 200);
    assert!(body == data, "{} bytes of {size}", body.len());
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 4, "{asked:?}");
    assert!(asked.values().all(|&n| n == 1), "{asked:?}");
    assert_eq!(
        blocks_match(cache.path(), &data),
        vec![(0, true), (1, true), (2, true), (3, true)]
    );
    let (st, _, body) = fetch(&f, "/o.bin", &[("range", "bytes=1048570-2097160")]);
    assert!(st == 206 && body == data[1048570..=2097160]);
}

#[test]
fn origin_down_is_502_and_origin_silent_is_504() {
    // Nothing listens: connection refused.
    let port = free_port();
    let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |_| {});
    assert_eq!(fetch(&f, "/x.bin", &[]).0, 502);
    assert_eq!(cache_files(cache.path()), (0, 0, 0));
    // Accepts and never answers: the origin timeout, then 504.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (f, cache) = penstock(&format!("http://127.0.0.1:{port}"), |o| {
        o.timeout_ms = 300;
    });
    let (st, _, _) = fetch(&f, "/x.bin", &[]);
    assert_eq!(st, 504);
    assert_eq!(cache_files(cache.path()), (0, 0, 0));
    drop(l);
}

/// A single-node Garage (S3) started for a test: its process, S3 address, a bucket and a key.
struct Garage {
    child: Child,
    s3: String,
    bucket: String,
    key_id: String,
    secret: String,
    _dir: tempfile::TempDir,
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn garage_bin() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(home.map(|h| h.join(".cargo/bin")))
        .map(|d| d.join("garage"))
        .find(|p| p.is_file())
}

fn garage() -> Option<Garage> {
    let bin = penstock_testreq::require_ok(
        "garage",
        garage_bin().ok_or("not on PATH nor in ~/.cargo/bin (cargo install garage --locked)"),
    )?;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let (rpc, s3) = (free_port(), free_port());
    let secret: String = pattern(32, 99).iter().map(|b| format!("{b:02x}")).collect();
    let conf = p.join("garage.toml");
    std::fs::write(
        &conf,
        format!(
            "metadata_dir = \"{p}/meta\"\ndata_dir = \"{p}/data\"\ndb_engine = \"sqlite\"\nreplication_factor = 1\n\
             rpc_bind_addr = \"127.0.0.1:{rpc}\"\nrpc_public_addr = \"127.0.0.1:{rpc}\"\nrpc_secret = \"{secret}\"\n\
             [s3_api]\ns3_region = \"garage\"\napi_bind_addr = \"127.0.0.1:{s3}\"\nroot_domain = \".s3.garage.localhost\"\n",
            p = p.display()
        ),
    )
    .unwrap();
    let child = Command::new(&bin)
        .arg("-c")
        .arg(&conf)
        .arg("server")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut g = Garage {
        child,
        s3: format!("http://127.0.0.1:{s3}"),
        bucket: "media-bucket".into(),
        key_id: String::new(),
        secret: String::new(),
        _dir: dir,
    };
    // The CLI reaches the daemon by RPC: retried until it is up (bounded).
    let cli = |args: &[&str]| -> Option<String> {
        let o = Command::new(&bin)
            .arg("-c")
            .arg(&conf)
            .args(args)
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).to_string())
    };
    // Each step retried while the daemon settles (bounded: 10 s a step).
    let step = |args: &[&str]| -> String {
        for _ in 0..200 {
            if let Some(out) = cli(args) {
                return out;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("garage {args:?} kept failing");
    };
    let id = step(&["node", "id", "-q"]);
    let node = id.trim().split('@').next().unwrap().to_string();
    step(&["layout", "assign", "-z", "dc1", "-c", "1G", &node]);
    step(&["layout", "apply", "--version", "1"]);
    step(&["bucket", "create", &g.bucket]);
    let key = step(&["key", "create", "penstock-test"]);
    let field = |name: &str| {
        key.lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("{name} in {key}"))
    };
    g.key_id = field("Key ID:");
    g.secret = field("Secret key:");
    step(&[
        "bucket",
        "allow",
        "--read",
        "--write",
        &g.bucket,
        "--key",
        "penstock-test",
    ]);
    for _ in 0..200 {
        if TcpStream::connect(g.s3.trim_start_matches("http://")).is_ok() {
            return Some(g);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("garage's S3 API did not listen");
}

impl Garage {
    /// PUT through a presigned URL (rusty-s3, as penstock signs its GETs).
    fn put(&self, key: &str, data: &[u8]) {
        use rusty_s3::S3Action;
        let bucket = rusty_s3::Bucket::new(
            url::Url::parse(&self.s3).unwrap(),
            rusty_s3::UrlStyle::Path,
            self.bucket.clone(),
            "garage",
        )
        .unwrap();
        let creds = rusty_s3::Credentials::new(self.key_id.clone(), self.secret.clone());
        let url = bucket
            .put_object(Some(&creds), key)
            .sign(Duration::from_secs(60));
        let r = agent()
            .put(url.as_str())
            .header("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
            .send(data)
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "PUT {key}");
    }
}

#[test]
fn s3_origin_on_garage_serves_exact_bytes_fetching_each_block_once() {
    let Some(g) = garage() else { return };
    let files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            (
                format!("/s{i}.bin"),
                pattern(2_000_000 + i * 333_333, 500 + i as u64),
            )
        })
        .collect();
    for (name, data) in &files {
        g.put(&format!("media{name}"), data);
    }
    let unique: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    // Credentials from a file in the AWS format (the environment is the other way).
    let creds = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        creds.path(),
        format!(
            "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            g.key_id, g.secret
        ),
    )
    .unwrap();
    let (f, _cache) = penstock(&format!("s3://{}/media", g.bucket), |o| {
        o.s3.endpoint = g.s3.clone();
        o.s3.region = "garage".into();
        o.s3.credentials_file = Some(creds.path().to_path_buf());
    });
    std::thread::scope(|s| {
        for _ in 0..6 {
            let (f, files) = (&f, &files);
            s.spawn(move || {
                for (name, data) in files {
                    let (st, _, body) = fetch(f, name, &[]);
                    assert_eq!(st, 200, "{name}");
                    assert!(body == *data, "{name} differs");
                }
            });
        }
    });
    let fetched = metric(&f, "penstock_origin_fetched_bytes_total");
    println!(
        "S3 (Garage): unique {unique} B, fetched {fetched} B: {:.4} × unique",
        fetched as f64 / unique as f64
    );
    assert!(fetched >= unique && fetched as f64 <= 1.05 * unique as f64);
    let (st, _, body) = fetch(&f, "/s3.bin", &[("range", "bytes=1048570-1048590")]);
    assert_eq!(st, 206);
    assert!(body == files[3].1[1048570..=1048590]);
    // A key that is not there: Garage's 404 (NoSuchKey) is ours.
    assert_eq!(fetch(&f, "/missing.bin", &[]).0, 404);
}

/// One RTSP request on a fresh connection: the reply's head and body as text.
fn rtsp(addr: std::net::SocketAddr, method: &str, url: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {url} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    let mut len = 0usize;
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap() == 0 || l == "\r\n" {
            break;
        }
        if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        head.push_str(&l);
    }
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(&mut r, &mut body).unwrap();
    head + &String::from_utf8_lossy(&body)
}

#[test]
fn rtsp_plays_a_file_missing_beneath_the_root_from_the_origin() {
    let Some(n) = nginx() else { return };
    // 10 s of MPEG-TS at 2 Mbit/s with PCRs (2.5 MB: three 1 MiB blocks).
    let clip = penstock_core::ts::synth::cbr_ts(13_300, 2_000_000, 0, 0, 20, true);
    std::fs::write(n.www.join("clip.ts"), &clip).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.rtsp.listen = format!("127.0.0.1:{}", free_port()).as_str().into();
    cfg.origin.url = format!("http://127.0.0.1:{}", n.port);
    cfg.origin.cache_dir = Some(cache.path().to_path_buf());
    cfg.origin.block_bytes = MIB;
    let f = start_with(cfg);
    // The same clip beneath the root: what DESCRIBE says of a local file.
    std::fs::write(f.path("local.ts"), &clip).unwrap();
    let addr = f.server.as_ref().unwrap().rtsp_addrs()[0];
    let local = rtsp(addr, "DESCRIBE", &format!("rtsp://{addr}/local.ts"));
    let remote = rtsp(addr, "DESCRIBE", &format!("rtsp://{addr}/clip.ts"));
    assert!(local.starts_with("RTSP/1.0 200"), "{local}");
    assert!(remote.starts_with("RTSP/1.0 200"), "{remote}");
    let range = |r: &str| {
        r.lines()
            .find(|l| l.starts_with("a=range:"))
            .map(str::to_string)
    };
    assert!(range(&local).is_some(), "{local}");
    assert_eq!(
        range(&remote),
        range(&local),
        "the origin's copy has the local file's timing"
    );
    // The copy in the cache is the origin's object, byte for byte; each block came once.
    let whole = std::fs::read_dir(cache.path().join("penstock-origin/blocks"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with("-whole"))
        .expect("the whole-object copy");
    assert!(std::fs::read(whole.path()).unwrap() == clip);
    assert_eq!(
        metric(&f, "penstock_origin_fetched_bytes_total"),
        clip.len() as u64
    );
    // Played over interleaved TCP: the RTP payloads are the origin's bytes from the start.
    let played = play_interleaved(addr, &format!("rtsp://{addr}/clip.ts"), 200_000);
    assert!(played.len() >= 200_000);
    assert!(
        played[..] == clip[..played.len()],
        "RTP payloads differ from the origin's clip"
    );
    // Missing at the origin: 404.
    let missing = rtsp(addr, "DESCRIBE", &format!("rtsp://{addr}/nope.ts"));
    assert!(missing.starts_with("RTSP/1.0 404"), "{missing}");
}

/// SETUP (interleaved) and PLAY `url` on one connection; the RTP payloads of channel 0 until
/// at least `bytes` arrived.
fn play_interleaved(addr: std::net::SocketAddr, url: &str, bytes: usize) -> Vec<u8> {
    use std::io::Read;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf: Vec<u8> = Vec::new();
    let fill = |s: &mut TcpStream, buf: &mut Vec<u8>| {
        let mut b = [0u8; 65536];
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "the RTSP connection closed");
        buf.extend_from_slice(&b[..n]);
    };
    // One reply head (our replies to SETUP and PLAY have no body).
    let reply = |s: &mut TcpStream, buf: &mut Vec<u8>| -> String {
        loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..p]).to_string();
                buf.drain(..p + 4);
                return head;
            }
            fill(s, buf);
        }
    };
    write!(
        s,
        "SETUP {url}/trackID=0 RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n"
    )
    .unwrap();
    let setup = reply(&mut s, &mut buf);
    assert!(setup.starts_with("RTSP/1.0 200"), "{setup}");
    let session = setup
        .lines()
        .find_map(|l| l.strip_prefix("Session: "))
        .map(|v| v.split(';').next().unwrap().trim().to_string())
        .expect("a Session header");
    write!(
        s,
        "PLAY {url} RTSP/1.0\r\nCSeq: 2\r\nSession: {session}\r\n\r\n"
    )
    .unwrap();
    let play = reply(&mut s, &mut buf);
    assert!(play.starts_with("RTSP/1.0 200"), "{play}");
    let mut out = Vec::new();
    while out.len() < bytes {
        while buf.len() < 4 {
            fill(&mut s, &mut buf);
        }
        assert_eq!(buf[0], b'$', "an interleaved frame");
        let (channel, len) = (buf[1], usize::from(u16::from_be_bytes([buf[2], buf[3]])));
        while buf.len() < 4 + len {
            fill(&mut s, &mut buf);
        }
        if channel == 0 {
            // A 12-byte RTP header (no CSRC, no extension), then TS packets.
            out.extend_from_slice(&buf[4 + 12..4 + len]);
        }
        buf.drain(..4 + len);
    }
    out
}

/// A tmpfs of `size` mounted on a fresh directory (root only), unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !penstock_testreq::require_that(
            "a tmpfs mount",
            (!ok).then(|| "not root, or no mount permission".to_string()),
        ) {
            return None;
        }
        Some(SmallDisk { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_cache_disk_serves_through_without_caching() {
    let Some(n) = nginx() else { return };
    // 1.5 MiB of disk for a cache configured far larger: the second 1 MiB block does not fit.
    let Some(disk) = SmallDisk::mount("1536k") else {
        return;
    };
    let data = pattern(4 * MIB as usize + 99, 21);
    std::fs::write(n.www.join("far.bin"), &data).unwrap();
    let cache_dir = disk.dir.path().to_path_buf();
    let mut cfg = config();
    cfg.origin.url = format!("http://127.0.0.1:{}", n.port);
    cfg.origin.cache_dir = Some(cache_dir.clone());
    cfg.origin.block_bytes = MIB;
    cfg.origin.cache_bytes_max = 256 * MIB;
    cfg.origin.read_ahead_blocks = 0;
    let f = start_with(cfg);
    for round in 0..2 {
        let (st, _, body) = fetch(&f, "/far.bin", &[]);
        assert_eq!(st, 200);
        let diff = body.iter().zip(&data).position(|(a, b)| a != b);
        assert!(
            body == data,
            "round {round}: {} bytes of {}, first difference at {diff:?}",
            body.len(),
            data.len()
        );
    }
    let failures = metric(&f, "penstock_origin_cache_write_failures_total");
    let through = metric(&f, "penstock_origin_served_through_total");
    let (blocks, bytes, temps) = cache_files(&cache_dir);
    println!(
        "write failures {failures}, served through {through}, blocks on disk {blocks} ({bytes} B)"
    );
    assert!(failures > 0 && through > 0);
    // What is on disk is whole blocks only (each file the length of its block); no
    // temporary file is left.
    assert!(blocks > 0 && bytes > 0);
    for e in std::fs::read_dir(cache_dir.join("penstock-origin/blocks"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        let i: u64 = name.rsplit('-').next().unwrap().parse().unwrap();
        let want = MIB.min(data.len() as u64 - i * MIB);
        assert_eq!(e.metadata().unwrap().len(), want, "{name}");
    }
    assert_eq!(temps, 0);
    drop(f);
}

#[test]
fn a_control_stream_sends_a_file_missing_beneath_the_root_from_the_origin() {
    use penstock_core::control::{Limits, ReplyParser};
    let Some(n) = nginx() else { return };
    let data = pattern(3 * MIB as usize + 12_345, 31);
    std::fs::write(n.www.join("ctl.bin"), &data).unwrap();
    let (f, _cache) = penstock(&format!("http://127.0.0.1:{}", n.port), |_| {});
    let rx = TcpListener::bind("127.0.0.1:0").unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = rx.accept().unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut s, &mut all).unwrap();
        all
    });
    let s = TcpStream::connect(f.control()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s);
    let mut cmd = |line: &str| {
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
    };
    assert_eq!(cmd(&format!("AUTH {TOKEN}")).code.code(), 200);
    // The path names a file beneath the served root that is not there: the origin's.
    let src = f.path("ctl.bin");
    let opened = cmd(&format!("OPEN file:{} tcp://{rx_addr}", src.display()));
    assert_eq!(opened.code.code(), 201, "{opened:?}");
    let id = opened.stream_id().unwrap();
    let started = cmd(&format!("START {id}"));
    assert_eq!(started.code.code(), 200, "{started:?}");
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the stream's bytes differ from the origin's");
    // Missing at the origin too: START fails and says why.
    let opened = cmd(&format!(
        "OPEN file:{} tcp://{rx_addr}",
        f.path("nope.bin").display()
    ));
    let id = opened.stream_id().unwrap();
    let started = cmd(&format!("START {id}"));
    assert_ne!(started.code.code(), 200, "{started:?}");
    assert!(
        format!("{started:?}").contains("not found at the origin"),
        "{started:?}"
    );
}

/// Issue 32, item 5: the origin's answers (made on its own thread) carry the location's CORS
/// lines, and media files their `Cache-Control`, as local files do.
#[test]
fn origin_answers_carry_the_locations_cors_and_caching_lines() {
    let port = fake_origin(3000, |_, _, _| {});
    let cache = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.origin.url = format!("http://127.0.0.1:{port}/");
    cfg.origin.cache_dir = Some(cache.path().to_path_buf());
    cfg.origin.block_bytes = MIB;
    cfg.origin.cache_bytes_max = 16 * MIB;
    cfg.location.push(penstock_server::config::Location {
        prefix: "/".into(),
        class: None,
        limit_rate_bytes_per_s: None,
        limit_rate_after_bytes: None,
        cors_allow_origins: vec!["https://player.example".into()],
        ..Default::default()
    });
    let f = start_with(cfg);
    let header = |hs: &[(String, String)], name: &str| {
        hs.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let origin = [
        ("origin", "https://player.example"),
        ("range", "bytes=0-187"),
    ];
    let (st, hs, body) = fetch(&f, "/obj.ts", &origin);
    assert_eq!(st, 206, "{hs:?}");
    assert!(body == pattern(3000, 5)[..188]);
    assert_eq!(
        header(&hs, "access-control-allow-origin").as_deref(),
        Some("https://player.example"),
        "{hs:?}"
    );
    assert_eq!(header(&hs, "vary").as_deref(), Some("Origin"));
    assert_eq!(
        header(&hs, "cache-control").as_deref(),
        Some("public, max-age=86400"),
        "{hs:?}"
    );
    let (st, hs, _) = fetch(&f, "/obj.bin", &[("origin", "https://player.example")]);
    assert_eq!(st, 200);
    assert!(
        header(&hs, "access-control-allow-origin").is_some(),
        "{hs:?}"
    );
    assert_eq!(header(&hs, "cache-control"), None, "not media: {hs:?}");
    let (st, hs, _) = fetch(&f, "/obj.ts", &[("origin", "https://evil.example")]);
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "access-control-allow-origin"), None, "{hs:?}");
}
