//! Zero copy checked where it happens: a command runs under `strace -f -yy`, and the bytes
//! each system call moved (its return value) are added up by call family and by the kind of
//! descriptor it moved them on (strace's `-yy` names each descriptor: a file's path,
//! `TCP:[…]`, `UDP:[…]`, `pipe:[…]`, …).
//!
//! "Through user space" is a copy by the kernel into or out of the process's memory
//! (copy_to_user / copy_from_user): the read family (read, pread64, readv, preadv, preadv2,
//! recvfrom, recvmsg, recvmmsg) on the payload's file, and the write family (write,
//! pwrite64, writev, pwritev, pwritev2, sendto, sendmsg, sendmmsg) on sockets. sendfile,
//! splice and copy_file_range move page-cache pages without that copy.
//!
//! io_uring operations are not system calls strace can see into (one io_uring_enter submits
//! many): for the uring path, the engine's own per-mechanism counts (`StreamReport::moved`,
//! `penstock stream --json`'s `moved`, the server's `penstock_engine_moved_bytes_total`)
//! say what its ring operations moved; see `docs/testing.md`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The calls traced: every call that moves bytes between a descriptor and memory or between
/// two descriptors.
pub const TRACED: &str = "read,pread64,readv,preadv,preadv2,recvfrom,recvmsg,recvmmsg,\
    write,pwrite64,writev,pwritev,pwritev2,sendto,sendmsg,sendmmsg,\
    sendfile,splice,copy_file_range,tee";

const READS: [&str; 8] = [
    "read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg", "recvmmsg",
];
const WRITES: [&str; 8] = [
    "write", "pwrite64", "writev", "pwritev", "pwritev2", "sendto", "sendmsg", "sendmmsg",
];

/// Whether strace is here (`penstock_testreq`: a counted skip, a failure under
/// `PENSTOCK_TEST_REQUIRE=all`).
pub fn require_strace() -> bool {
    penstock_testreq::require("strace")
}

/// `program` under `strace -f -qq -yy -s 0 -e signal=none -e trace=TRACED -o trace`: add
/// its arguments and spawn it. Threads and children are followed (`-f`); strings are not
/// printed (`-s 0`), descriptors are (`-yy`).
pub fn traced(trace: &Path, program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("strace");
    c.args(["-f", "-qq", "-yy", "-s", "0", "-e", "signal=none", "-e"])
        .arg(format!("trace={TRACED}"))
        .arg("-o")
        .arg(trace)
        .arg(program);
    c
}

/// The kind of descriptor a call moved bytes on, from strace's `-yy` annotation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum FdKind {
    /// A file, by its path.
    File(String),
    Tcp,
    Udp,
    Unix,
    Pipe,
    /// Anything else (eventfd, a character device, …), by its annotation's first word.
    Other(String),
}

impl FdKind {
    fn of(annotation: &str) -> FdKind {
        let a = annotation;
        if a.starts_with("TCP:") || a.starts_with("TCPv6:") {
            FdKind::Tcp
        } else if a.starts_with("UDP:") || a.starts_with("UDPv6:") {
            FdKind::Udp
        } else if a.starts_with("UNIX") {
            FdKind::Unix
        } else if a.starts_with("pipe:") {
            FdKind::Pipe
        } else if a.starts_with('/') && !a.starts_with("/dev/") {
            // A path, maybe followed by a device annotation (`/dev/null<char 1:3>`).
            FdKind::File(a.split('<').next().unwrap_or(a).to_string())
        } else {
            FdKind::Other(a.split(['<', ':', '[']).next().unwrap_or(a).to_string())
        }
    }

    pub fn is_socket(&self) -> bool {
        matches!(self, FdKind::Tcp | FdKind::Udp | FdKind::Unix)
    }
}

/// Bytes moved, by call name and the kind of descriptor: the descriptor read or written for
/// the read and write families, the *target* (out) descriptor for sendfile, splice, tee and
/// copy_file_range.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub bytes: BTreeMap<(String, FdKind), u64>,
    /// Calls with a positive result, by the same keys.
    pub call_counts: BTreeMap<(String, FdKind), u64>,
    /// Calls counted (with a positive result).
    pub calls: u64,
    /// Lines not understood: [`Tally::read`] fails on any, so that a format this parser
    /// misreads cannot pass as "nothing copied".
    pub unparsed: Vec<String>,
}

impl Tally {
    /// Reads `trace` (what [`traced`] wrote) and adds it up.
    pub fn read(trace: &Path) -> Tally {
        let text = std::fs::read_to_string(trace)
            .unwrap_or_else(|e| panic!("strace log {}: {e}", trace.display()));
        let t = Tally::parse(&text);
        assert!(
            t.unparsed.is_empty() && t.calls > 0,
            "{} lines of {} not understood (of {} calls counted), first: {:?}",
            t.unparsed.len(),
            trace.display(),
            t.calls,
            &t.unparsed[..t.unparsed.len().min(5)]
        );
        t
    }

    /// Adds up an `strace -f -yy` log.
    pub fn parse(text: &str) -> Tally {
        let mut t = Tally::default();
        // A call interrupted by another thread's line: "PID name(args <unfinished ...>",
        // later "PID <... name resumed>rest) = N". Its arguments wait here, by pid.
        let mut unfinished: BTreeMap<&str, String> = BTreeMap::new();
        for line in text.lines() {
            // strace pads the pid column ("3993  read(…" beside five-digit pids).
            let Some((pid, rest)) = line.split_once(' ') else {
                t.unparsed.push(line.to_string());
                continue;
            };
            let rest = rest.trim_start();
            let call = if let Some(head) = rest.strip_suffix(" <unfinished ...>") {
                unfinished.insert(pid, head.to_string());
                continue;
            } else if let Some(resumed) = rest.strip_prefix("<... ") {
                let Some(head) = unfinished.remove(pid) else {
                    t.unparsed.push(line.to_string());
                    continue;
                };
                let tail = resumed.split_once(" resumed>").map_or("", |x| x.1);
                format!("{head}{tail}")
            } else {
                rest.to_string()
            };
            if !t.add(&call) {
                t.unparsed.push(line.to_string());
            }
        }
        t
    }

    /// Adds one whole call line; false when it is not one this parser understands.
    fn add(&mut self, call: &str) -> bool {
        let Some((name, args)) = call.split_once('(') else {
            return false;
        };
        let known = READS.contains(&name)
            || WRITES.contains(&name)
            || ["sendfile", "splice", "copy_file_range", "tee"].contains(&name);
        if !known {
            return false;
        }
        // "…) = N", or "…)    = N" (strace aligns the results of resumed calls).
        let Some((before, ret)) = call.rsplit_once(" = ") else {
            return false;
        };
        if !before.trim_end().ends_with(')') {
            return false;
        }
        let ret = ret.split_whitespace().next().unwrap_or("");
        if ret == "?" {
            return true; // the thread exited inside the call: no result
        }
        let Ok(ret) = ret.parse::<i64>() else {
            return false;
        };
        if ret <= 0 {
            return true;
        }
        let bytes = if name.ends_with("mmsg") {
            // The result counts messages; their lengths are in msg_len=.
            let lens: Vec<u64> = args
                .split("msg_len=")
                .skip(1)
                .filter_map(|s| s.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
                .collect();
            assert_eq!(
                lens.len() as i64,
                ret,
                "cannot add up {name}'s messages (abbreviated?): {call}"
            );
            lens.iter().sum()
        } else {
            ret as u64
        };
        let fds = annotations(args);
        // The descriptor the bytes went to (or came from, for a read).
        let fd = match name {
            "splice" | "tee" | "copy_file_range" => fds.get(1),
            _ => fds.first(),
        };
        let Some(fd) = fd else {
            return false; // no descriptor annotation: not `-yy` output
        };
        *self
            .bytes
            .entry((name.to_string(), FdKind::of(fd)))
            .or_default() += bytes;
        *self
            .call_counts
            .entry((name.to_string(), FdKind::of(fd)))
            .or_default() += 1;
        self.calls += 1;
        true
    }

    fn sum(&self, pred: impl Fn(&str, &FdKind) -> bool) -> u64 {
        self.bytes
            .iter()
            .filter(|((n, k), _)| pred(n, k))
            .map(|(_, b)| b)
            .sum()
    }

    /// Bytes sendfile, splice, tee and copy_file_range moved to a socket: moved by the
    /// kernel, page to socket, without a copy through the process.
    pub fn zero_copy_to_sockets(&self) -> u64 {
        self.sum(|n, k| {
            ["sendfile", "splice", "tee", "copy_file_range"].contains(&n) && k.is_socket()
        })
    }

    /// The sendfile, splice, tee and copy_file_range calls that moved bytes to a socket.
    #[allow(dead_code)] // not every test binary that includes this module asks
    pub fn zero_copy_calls_to_sockets(&self) -> u64 {
        self.call_counts
            .iter()
            .filter(|((n, k), _)| {
                ["sendfile", "splice", "tee", "copy_file_range"].contains(&n.as_str())
                    && k.is_socket()
            })
            .map(|(_, c)| c)
            .sum()
    }

    /// Bytes the read family copied out of `file` into the process.
    pub fn read_from_file(&self, file: &Path) -> u64 {
        let file = canonical(file);
        self.sum(|n, k| READS.contains(&n) && *k == FdKind::File(file.clone()))
    }

    /// Bytes the write family copied from the process to sockets (TCP, UDP, Unix).
    pub fn written_to_sockets(&self) -> u64 {
        self.sum(|n, k| WRITES.contains(&n) && k.is_socket())
    }

    /// The payload `file`'s bytes that may have gone through the process's memory: read
    /// from it by the read family, plus everything the write family sent to sockets (heads
    /// and playlists included: the bound a test sets says how much of that is not payload).
    pub fn through_user_space(&self, file: &Path) -> u64 {
        self.read_from_file(file) + self.written_to_sockets()
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for ((name, kind), b) in &self.bytes {
            writeln!(f, "  {name:>16} {kind:?}: {b} B")?;
        }
        Ok(())
    }
}

fn canonical(p: &Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| PathBuf::from(p))
        .to_string_lossy()
        .into_owned()
}

/// The `-yy` annotations of a call's descriptor arguments, in order: each `N<…>` that starts
/// an argument (brackets balanced: `/dev/null<char 1:3>` nests one).
fn annotations(args: &str) -> Vec<String> {
    let b = args.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_arg = i == 0 || (i >= 2 && &b[i - 2..i] == b", ");
        if starts_arg && b[i].is_ascii_digit() {
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j < b.len() && b[j] == b'<' {
                let mut depth = 0;
                let mut k = j;
                while k < b.len() {
                    match b[k] {
                        b'<' => depth += 1,
                        // `->` inside a socket's `TCP:[A->B]` closes nothing.
                        b'>' if b[k - 1] != b'-' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                out.push(args[j + 1..k.min(b.len())].to_string());
                i = k + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The server process strace runs (strace's only child), for a signal to it rather than to
/// strace: `/proc/STRACE/task/STRACE/children`.
pub fn traced_child(strace: &std::process::Child) -> u32 {
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", strace.id())).unwrap();
    children
        .split_whitespace()
        .next()
        .expect("strace's child")
        .parse()
        .unwrap()
}

/// Stops a traced server with SIGTERM (to the server, not strace, which then exits with its
/// status) and waits for strace, so that the whole trace is written.
pub fn stop_traced(strace: &mut std::process::Child) {
    let server = traced_child(strace);
    let _ = Command::new("kill")
        .args(["-TERM", &server.to_string()])
        .status();
    let status = strace.wait().unwrap();
    assert!(status.success(), "the traced server exited with {status}");
}

/// Checks of the parser on lines strace 6.1 printed here.
pub fn self_check() {
    let log = "\
16272 sendfile(4<TCP:[127.0.0.1:44924->127.0.0.1:51869]>, 6</tmp/zc-x.bin>, [0] => [1000], 1000) = 1000
16272 recvfrom(5<TCP:[127.0.0.1:51869->127.0.0.1:44924]>, \"\"..., 100, 0, NULL, NULL) = 100
16272 sendto(7<UDP:[2271014]>, \"\"..., 10, 0, {sa_family=AF_INET}, 16) = 10
16272 read(3<pipe:[2272053]>,  <unfinished ...>
16280 write(1<pipe:[2272053]>, \"\"..., 5 <unfinished ...>
16272 <... read resumed>\"\"..., 4096)    = 5
16280 <... write resumed>)              = 5
16290 splice(3</tmp/zc-x.bin>, [0], 8<pipe:[1]>, NULL, 65536, SPLICE_F_MOVE) = 4096
16290 splice(7<pipe:[1]>, NULL, 9<TCP:[1->2]>, NULL, 4096, SPLICE_F_MOVE) = 4096
16290 write(2</dev/null<char 1:3>>, \"\"..., 237) = 237
16290 write(9<TCP:[1->2]>, \"\"..., 237) = -1 EAGAIN (Resource temporarily unavailable)
16290 pread64(3</tmp/zc-x.bin>, \"\"..., 100, 0) = 100
3993  pread64(3</tmp/zc-x.bin>, \"\"..., 100, 0) = 100
";
    let t = Tally::parse(log);
    assert!(t.unparsed.is_empty(), "{:?}", t.unparsed);
    let odd = Tally::parse("12 read(3, \"\"..., 5) = 5\n12 <... write resumed>) = 1\n");
    assert_eq!(
        odd.unparsed.len(),
        2,
        "no -yy annotation, a resumption of nothing"
    );
    assert_eq!(t.zero_copy_to_sockets(), 1000 + 4096, "{t}");
    assert_eq!(t.written_to_sockets(), 10, "{t}");
    assert_eq!(t.bytes.get(&("read".into(), FdKind::Pipe)), Some(&5), "{t}");
    assert_eq!(
        t.bytes
            .get(&("pread64".into(), FdKind::File("/tmp/zc-x.bin".into()))),
        Some(&200),
        "{t}"
    );
}
