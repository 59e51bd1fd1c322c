//! `penstock bench cues` (issue 14 item 4): the Cues experiments through the example server
//! `examples/c/httpd.c`, built several ways and compiled here with `cc`:
//!
//! - `sendfile`: the plain build (a sendfile(2) loop);
//! - `read/write`: `-DUSE_READWRITE`, a read(2)/write(2) loop through a 64 KiB buffer;
//! - `sendfile, a process per transfer`: the plain build, one server process per concurrent
//!   transfer (their CPU summed) — concurrent sendfile loops without the engine;
//! - `sendfile non-blocking`: `-DUSE_SENDFILE_NONBLOCKING`, the same sendfile(2) on a
//!   non-blocking socket with poll(2) for POLLOUT — the engine's pattern without the engine:
//!   on loopback the kernel charges the receiver's TCP work partly to whichever side runs
//!   it, and this row shows how much of cue()'s server CPU is that pattern's;
//! - `cue()`: `-DUSE_PENSTOCK`, libpenstock in process (penstock_cue + START);
//! - `hand-off`: `-DUSE_PENSTOCK -DUSE_PENSTOCK_CONNECT`, the same shape through
//!   `penstock_connect` + `penstock_conn_cue` to a `penstock serve` the bench starts (its
//!   CPU counted as the server's).
//!
//! The builds are entries of one list ([`builds`]); a build that needs a library symbol is
//! skipped (said in the output) when the header lacks it.
//!
//! Measured, each server on loopback and its files in a page-cached (or tmpfs) directory:
//! - Table 1 / Fig. 4: 1..=`--transfers` concurrent GETs of whole files (each file
//!   `--file-size`), read into a discarding buffer by client threads of this process; the
//!   aggregate throughput (bytes / time until the last client has its body), the server
//!   process's CPU (utime+stime of all its threads, /proc/PID/stat) per GB, the client
//!   threads' own (CLOCK_THREAD_CPUTIME_ID) per GB, their sum, and the machine's (busy time
//!   in /proc/stat) per GB; medians of `--reps` runs.
//! - Fig. 5: the cue() build with `schedule=K,T unit=--unit` for each K of `--k` and T of
//!   `--t`, `--transfers` clients each reading for `--window`: throughput and CPU.
//! - §4.3: a metering process (`penstock hog meter`, pinned to CPU 0: a busy loop printing its
//!   iteration count) beside `--transfers` concurrent transfers of each build; its iterations
//!   per second as a share of an idle machine's (measured in the same run): `--reps`
//!   rounds of an idle window then every build in turn, medians.
//!
//! The example server serves one connection at a time (accept, send, close), as written: the
//! sendfile and read/write builds send the concurrent requests one after another, the cue()
//! build hands each body to the engine and accepts the next at once.
//!
//! Needs `cc`, libpenstock.so (`--lib-dir`, default: beside this executable, where
//! `cargo build --release -p penstock -p penstock-c` puts it) and the repository's
//! `examples/c/httpd.c` and `crates/libpenstock/include` (`--source-dir`); without them it
//! says what is missing and exits 2.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use penstock_core::units::{parse_duration, parse_size};
use serde_json::{Value, json};

use crate::out;
use crate::stats::median;

#[derive(Args, Debug)]
pub struct CuesArgs {
    /// Size of each served file (one file per concurrent transfer).
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub file_size: u64,
    /// Concurrent transfers: Table 1 runs 1..=this many; Fig. 5 and §4.3 run this many.
    #[arg(long, default_value_t = 4)]
    pub transfers: usize,
    /// Runs of each Table 1 cell (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Fig. 5: the K values (units per cycle) of the (K, T) sweep.
    #[arg(long, default_value = "1,4,16,64", value_delimiter = ',')]
    pub k: Vec<u32>,
    /// Fig. 5: the T values (cycle lengths) of the (K, T) sweep, as SCHEDULE takes them.
    #[arg(long, default_value = "1ms,10ms", value_delimiter = ',')]
    pub t: Vec<String>,
    /// Fig. 5: the transfer unit of the sweep.
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    pub unit: u64,
    /// Fig. 5 and the idle meter: how long each measurement lasts.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub window: Duration,
    /// Options for the cue() build's streams in Table 1 and §4.3 (OPEN's options, e.g.
    /// `path=sendfile`; passed through HTTPD_PENSTOCK_OPTIONS). Default: none.
    #[arg(long)]
    pub cue_options: Option<String>,
    /// Skip Fig. 5.
    #[arg(long)]
    pub no_sweep: bool,
    /// Skip §4.3 (the metering process).
    #[arg(long)]
    pub no_meter: bool,
    /// Directory for the served files (default: /dev/shm when it exists, else the temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where libpenstock.so is (default: this executable's directory).
    #[arg(long)]
    pub lib_dir: Option<PathBuf>,
    /// The repository (examples/c/httpd.c, crates/libpenstock/include); default: where this
    /// binary was built from.
    #[arg(long)]
    pub source_dir: Option<PathBuf>,
    /// Write the results as JSON here.
    /// A bare `--json` writes it on stdout (the tables then go to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

/// One build of the example server.
struct Build {
    /// The name in the tables.
    name: &'static str,
    /// Extra `cc` flags.
    defines: &'static [&'static str],
    /// Links libpenstock.
    penstock: bool,
    /// A symbol the header must declare, else the build is skipped with a note.
    needs: Option<&'static str>,
    /// Hands its bodies to a `penstock serve` started for it (its Unix control socket in
    /// PENSTOCK_SOCKET); that process's CPU counts as the server's too.
    handoff: bool,
    /// One server process per concurrent transfer (their CPU summed): the plain build's
    /// sendfile loops running at once, as the engine's streams do.
    per_transfer: bool,
}

/// The builds, in table order.
fn builds() -> Vec<Build> {
    vec![
        Build {
            name: "read/write",
            defines: &["-DUSE_READWRITE"],
            penstock: false,
            needs: None,
            handoff: false,
            per_transfer: false,
        },
        Build {
            name: "sendfile",
            defines: &[],
            penstock: false,
            needs: None,
            handoff: false,
            per_transfer: false,
        },
        // Concurrent sendfile loops without the engine: what running the transfers at once
        // (not one after another, as one example server does) costs the senders on loopback.
        Build {
            name: "sendfile, a process per transfer",
            defines: &[],
            penstock: false,
            needs: None,
            handoff: false,
            per_transfer: true,
        },
        // The engine's pattern without the engine: where the kernel charges a loopback
        // receiver's TCP work when the sender waits in poll(2) instead of in sendfile(2).
        Build {
            name: "sendfile non-blocking",
            defines: &["-DUSE_SENDFILE_NONBLOCKING"],
            penstock: false,
            needs: None,
            handoff: false,
            per_transfer: false,
        },
        Build {
            name: "cue()",
            defines: &["-DUSE_PENSTOCK"],
            penstock: true,
            needs: None,
            handoff: false,
            per_transfer: false,
        },
        Build {
            name: "hand-off",
            defines: &["-DUSE_PENSTOCK", "-DUSE_PENSTOCK_CONNECT"],
            penstock: true,
            needs: Some("penstock_conn_cue"),
            handoff: true,
            per_transfer: false,
        },
    ]
}

/// A compiled build.
struct Built {
    name: &'static str,
    exe: PathBuf,
    handoff: bool,
    per_transfer: bool,
}

impl Built {
    /// Its server (`transfers` of them for a process-per-transfer build).
    fn start(&self, root: &Path, options: Option<&str>, transfers: usize) -> Result<Vec<Server>> {
        let count = if self.per_transfer { transfers } else { 1 };
        (0..count)
            .map(|_| Server::start(&self.exe, root, options, self.handoff))
            .collect()
    }
}

struct Paths {
    httpd: PathBuf,
    include: PathBuf,
    lib_dir: PathBuf,
}

/// What the bench needs on this machine; `Err` says what is missing.
fn find_paths(a: &CuesArgs) -> std::result::Result<Paths, String> {
    let src = a
        .source_dir
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let httpd = src.join("examples/c/httpd.c");
    let include = src.join("crates/libpenstock/include");
    let lib_dir = match &a.lib_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("current_exe: {e}"))?
            .parent()
            .map(Path::to_path_buf)
            .ok_or("current_exe has no directory")?,
    };
    let cc = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !cc {
        return Err("no C compiler: `cc --version` does not run".into());
    }
    if !httpd.is_file() {
        return Err(format!(
            "{} not found (--source-dir: the repository)",
            httpd.display()
        ));
    }
    if !include.join("penstock.h").is_file() {
        return Err(format!("{}/penstock.h not found", include.display()));
    }
    if !lib_dir.join("libpenstock.so").is_file() {
        return Err(format!(
            "{}/libpenstock.so not found: build it with `cargo build --release -p penstock-c`, or name its directory with --lib-dir",
            lib_dir.display()
        ));
    }
    Ok(Paths {
        httpd,
        include,
        lib_dir,
    })
}

/// Compiles one build; `Ok(None)` with the reason when the library lacks what it needs.
fn compile(p: &Paths, b: &Build, out_dir: &Path) -> Result<std::result::Result<PathBuf, String>> {
    if let Some(sym) = b.needs {
        let header = std::fs::read_to_string(p.include.join("penstock.h"))?;
        if !header.contains(sym) {
            return Ok(Err(format!("skipped: the library has no {sym}")));
        }
    }
    let exe = out_dir.join(format!(
        "httpd-{}",
        b.name.replace(['/', '(', ')', ','], "").replace(' ', "-")
    ));
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"])
        .args(b.defines)
        .arg(&p.httpd)
        .arg("-o")
        .arg(&exe);
    if b.penstock {
        cc.arg(format!("-I{}", p.include.display()))
            .arg(format!("-L{}", p.lib_dir.display()))
            .arg("-lpenstock")
            .arg(format!("-Wl,-rpath,{}", p.lib_dir.display()));
    }
    let o = cc.output().context("running cc")?;
    if !o.status.success() {
        bail!(
            "cc failed for the {} build: {}",
            b.name,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(Ok(exe))
}

/// A running example server (and, for the hand-off build, the `penstock serve` it hands
/// its bodies to).
struct Server {
    child: Child,
    port: u16,
    penstock: Option<Penstock>,
}

/// `penstock serve` for the hand-off build: its Unix control socket in a directory of its own,
/// no TCP control, no access log; stopped (SIGTERM, then kill) when dropped.
struct Penstock {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Penstock {
    fn start(root: &Path) -> Result<Penstock> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("ctl.sock");
        let conf = dir.path().join("penstock.toml");
        std::fs::write(&conf, "[log]\naccess = \"off\"\n")?;
        let mut child = Command::new(std::env::current_exe()?)
            .args(["serve", "--listen", "127.0.0.1:0", "--control", ""])
            .arg("--config")
            .arg(&conf)
            .arg("--control-unix")
            .arg(&socket)
            .arg(root)
            .stdout(Stdio::null())
            .spawn()
            .context("starting penstock serve")?;
        let start = Instant::now();
        while !socket.exists() {
            if let Some(st) = child.try_wait()? {
                bail!("penstock serve exited at start ({st})");
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                bail!("penstock serve made no control socket in 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Penstock {
            child,
            socket,
            _dir: dir,
        })
    }
}

impl Drop for Penstock {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
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

impl Server {
    fn start(exe: &Path, root: &Path, options: Option<&str>, handoff: bool) -> Result<Server> {
        let penstock = if handoff {
            Some(Penstock::start(root)?)
        } else {
            None
        };
        let mut c = Command::new(exe);
        c.args(["-p", "0"])
            .arg(root)
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match &penstock {
            Some(p) => c.env("PENSTOCK_SOCKET", &p.socket),
            None => c.env_remove("PENSTOCK_SOCKET"),
        };
        match options {
            Some(o) => c.env("HTTPD_PENSTOCK_OPTIONS", o),
            None => c.env_remove("HTTPD_PENSTOCK_OPTIONS"),
        };
        let mut child = c
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("server stdout")?).read_line(&mut line)?;
        let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok());
        match port {
            Some(port) => Ok(Server {
                child,
                port,
                penstock,
            }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{}: no port in {line:?}", exe.display())
            }
        }
    }

    /// The server process's CPU time, all threads (utime + stime), in seconds; with
    /// `penstock serve`'s added for the hand-off build.
    fn cpu_s(&self) -> Result<f64> {
        let serve = match &self.penstock {
            Some(p) => process_cpu_s(p.child.id())?,
            None => 0.0,
        };
        Ok(process_cpu_s(self.child.id())? + serve)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ticks_per_s() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}

pub(crate) fn process_cpu_s(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').context("/proc/PID/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    let utime: f64 = f.get(11).context("utime")?.parse()?;
    let stime: f64 = f.get(12).context("stime")?.parse()?;
    Ok((utime + stime) / ticks_per_s())
}

/// The machine's busy CPU time (all CPUs, everything but idle and iowait), in seconds.
fn machine_busy_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("/proc/stat")?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    let busy: f64 =
        v.iter().take(8).sum::<f64>() - v.get(3).unwrap_or(&0.0) - v.get(4).unwrap_or(&0.0);
    Ok(busy / ticks_per_s())
}

/// One client: GET /name, read the head and (at most until `deadline`) the body into a
/// discarding buffer. Returns the body bytes; without a deadline, an error unless all of
/// Content-Length arrived.
fn fetch(port: u16, name: &str, deadline: Option<Instant>) -> Result<(u64, f64)> {
    let cpu0 = penstock_driver::clock::thread_cpu_ns();
    let cpu_s = || penstock_driver::clock::thread_cpu_ns().saturating_sub(cpu0) as f64 / 1e9;
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET /{name} HTTP/1.0\r\n\r\n")?;
    let mut buf = vec![0u8; 256 << 10];
    let mut have = 0usize;
    let head_end = loop {
        let n = s.read(&mut buf[have..])?;
        if n == 0 {
            bail!("/{name}: the server closed before the head ended");
        }
        have += n;
        if let Some(i) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if have == buf.len() {
            bail!("/{name}: head too long");
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    if !head.starts_with("HTTP/1.0 200") {
        bail!("/{name}: {}", head.lines().next().unwrap_or(""));
    }
    let length: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .context("no Content-Length")?;
    let mut body = (have - head_end) as u64;
    if let Some(d) = deadline {
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        while Instant::now() < d && body < length {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => body += n as u64,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok((body, cpu_s()));
    }
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body += n as u64;
    }
    if body != length {
        bail!("/{name}: {body} of {length} bytes");
    }
    Ok((body, cpu_s()))
}

/// One measurement of `n` concurrent transfers.
#[derive(Clone, Copy, Debug)]
struct Run {
    bytes: u64,
    secs: f64,
    server_cpu_s: f64,
    /// The client threads' own CPU time (this process's threads reading the bodies).
    clients_cpu_s: f64,
    machine_cpu_s: f64,
}

impl Run {
    fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }
    fn server_s_per_gb(&self) -> f64 {
        self.server_cpu_s / (self.bytes as f64 / 1e9)
    }
    fn clients_s_per_gb(&self) -> f64 {
        self.clients_cpu_s / (self.bytes as f64 / 1e9)
    }
    /// Server and clients together: on loopback the kernel's TCP receive processing is
    /// charged to whichever side's context runs it, so this sum is the comparable cost.
    fn both_s_per_gb(&self) -> f64 {
        (self.server_cpu_s + self.clients_cpu_s) / (self.bytes as f64 / 1e9)
    }
    fn machine_s_per_gb(&self) -> f64 {
        self.machine_cpu_s / (self.bytes as f64 / 1e9)
    }
}

/// The servers' CPU time, summed.
fn servers_cpu_s(servers: &[Server]) -> Result<f64> {
    servers.iter().map(Server::cpu_s).sum()
}

/// `n` concurrent transfers, client `i` asking server `i` modulo their number.
fn transfer(servers: &[Server], n: usize, window: Option<Duration>) -> Result<Run> {
    let cpu0 = servers_cpu_s(servers)?;
    let busy0 = machine_busy_s()?;
    let start = Instant::now();
    let deadline = window.map(|w| start + w);
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let port = servers[i % servers.len()].port;
            std::thread::spawn(move || fetch(port, &format!("f{i}"), deadline))
        })
        .collect();
    let mut bytes = 0;
    let mut clients_cpu_s = 0.0;
    for h in handles {
        let (b, cpu) = h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
        bytes += b;
        clients_cpu_s += cpu;
    }
    let secs = start.elapsed().as_secs_f64();
    // The cue() build's engine may still be closing a stream: give it a moment so its CPU
    // is counted.
    std::thread::sleep(Duration::from_millis(20));
    Ok(Run {
        bytes,
        secs,
        server_cpu_s: servers_cpu_s(servers)? - cpu0,
        clients_cpu_s,
        machine_cpu_s: machine_busy_s()? - busy0,
    })
}

/// The metering process: `penstock hog meter` printing "<iterations>" lines; the latest
/// count with the time it arrived.
struct Meter {
    child: Child,
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
}

impl Meter {
    fn start() -> Result<Meter> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["hog", "meter"])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting penstock hog meter")?;
        let out = child.stdout.take().context("meter stdout")?;
        let samples = Arc::new(Mutex::new(Vec::new()));
        let s2 = samples.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Ok(n) = line.trim().parse::<u64>() {
                    s2.lock().unwrap().push((Instant::now(), n));
                }
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        Ok(Meter { child, samples })
    }

    fn count(&self) -> Result<(Instant, u64)> {
        self.samples
            .lock()
            .unwrap()
            .last()
            .copied()
            .context("the meter printed nothing")
    }

    /// Iterations per second while `f` runs.
    fn rate_during<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(f64, T)> {
        let (t0, c0) = self.count()?;
        let r = f()?;
        // Let the next sample arrive (the meter prints every 100 ms).
        std::thread::sleep(Duration::from_millis(150));
        let (t1, c1) = self.count()?;
        Ok(((c1 - c0) as f64 / (t1 - t0).as_secs_f64(), r))
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `penstock hog meter`: a busy loop pinned to CPU 0 printing its iteration count (one
/// iteration: a multiply-add) every 100 ms, until killed.
pub fn meter() -> Result<()> {
    let _ = penstock_driver::clock::pin_to_cpu(0);
    let mut out = std::io::stdout().lock();
    let mut x = 1u64;
    let mut count = 0u64;
    let mut next = Instant::now() + Duration::from_millis(100);
    loop {
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
        std::hint::black_box(x);
        count += 100_000;
        if Instant::now() >= next {
            writeln!(out, "{count}")?;
            out.flush()?;
            next += Duration::from_millis(100);
        }
    }
}

fn make_files(dir: &Path, n: usize, size: u64) -> Result<()> {
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i * 31 + i / 4093) as u8;
    }
    for i in 0..n {
        let p = dir.join(format!("f{i}"));
        if std::fs::metadata(&p).is_ok_and(|m| m.len() == size) {
            continue;
        }
        let mut f = std::io::BufWriter::new(std::fs::File::create(&p)?);
        let mut left = size;
        while left > 0 {
            let k = left.min(block.len() as u64) as usize;
            f.write_all(&block[..k])?;
            left -= k as u64;
        }
        f.flush()?;
    }
    // Read them once: page-cached for every build alike.
    for i in 0..n {
        let mut f = std::fs::File::open(dir.join(format!("f{i}")))?;
        while f.read(&mut block)? > 0 {}
    }
    Ok(())
}

pub fn run(a: CuesArgs) -> Result<()> {
    let dest = out::dest(&a.json);
    let mut h = out::human(dest);
    if a.transfers == 0 || a.reps == 0 || a.file_size == 0 || a.k.is_empty() || a.t.is_empty() {
        bail!("--transfers, --reps, --file-size, --k and --t must be non-zero / non-empty");
    }
    let paths = match find_paths(&a) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("penstock bench cues: {why}");
            std::process::exit(2);
        }
    };
    let work = tempfile::tempdir()?;
    let base = a.dir.clone().unwrap_or_else(|| {
        if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        }
    });
    let files = tempfile::Builder::new()
        .prefix("penstock-cues")
        .tempdir_in(&base)?;
    make_files(files.path(), a.transfers, a.file_size)?;

    let mut built: Vec<Built> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for b in builds() {
        match compile(&paths, &b, work.path())? {
            Ok(exe) => built.push(Built {
                name: b.name,
                exe,
                handoff: b.handoff,
                per_transfer: b.per_transfer,
            }),
            Err(why) => notes.push(format!("{}: {why}", b.name)),
        }
    }
    let machine = machine_line();
    writeln!(h, "# penstock bench cues\n\n{machine}\n")?;
    writeln!(
        h,
        "Files: {} × {} MiB in {} (page-cached); clients: threads of the bench reading into a discarding buffer; loopback TCP.\n",
        a.transfers,
        a.file_size >> 20,
        base.display()
    )?;
    writeln!(
        h,
        "cue() options in Table 1 and §4.3: {}\n",
        a.cue_options
            .as_deref()
            .unwrap_or("(none: the engine's defaults)")
    )?;
    for n in &notes {
        writeln!(h, "- {n}")?;
    }

    // Table 1 / Fig. 4.
    writeln!(
        h,
        "\n## Table 1 / Fig. 4: concurrent whole-file transfers (median of {} runs)\n",
        a.reps
    )?;
    writeln!(
        h,
        "| build | transfers | aggregate MB/s | server CPU s/GB | clients CPU s/GB | server + clients s/GB | machine CPU s/GB |\n|---|---:|---:|---:|---:|---:|---:|"
    )?;
    let mut table1 = Vec::new();
    // (build, MB/s, server CPU/GB, server + clients CPU/GB) at `--transfers`.
    let mut at_max: Vec<(&str, f64, f64, f64)> = Vec::new();
    for b in &built {
        let name = b.name;
        let servers = b.start(files.path(), a.cue_options.as_deref(), a.transfers)?;
        for n in 1..=a.transfers {
            let runs: Vec<Run> = (0..a.reps)
                .map(|_| transfer(&servers, n, None))
                .collect::<Result<_>>()?;
            let mb_s = median(&runs.iter().map(Run::mb_s).collect::<Vec<_>>());
            let srv = median(&runs.iter().map(Run::server_s_per_gb).collect::<Vec<_>>());
            let cli = median(&runs.iter().map(Run::clients_s_per_gb).collect::<Vec<_>>());
            let both = median(&runs.iter().map(Run::both_s_per_gb).collect::<Vec<_>>());
            let mach = median(&runs.iter().map(Run::machine_s_per_gb).collect::<Vec<_>>());
            writeln!(
                h,
                "| {name} | {n} | {mb_s:.0} | {srv:.3} | {cli:.3} | {both:.3} | {mach:.3} |"
            )?;
            table1.push(json!({"build": name, "transfers": n, "mb_s": mb_s,
                "server_cpu_s_per_gb": srv, "clients_cpu_s_per_gb": cli,
                "server_and_clients_cpu_s_per_gb": both, "machine_cpu_s_per_gb": mach,
                "runs": runs.iter().map(|r| json!({"bytes": r.bytes, "secs": r.secs,
                    "server_cpu_s": r.server_cpu_s, "clients_cpu_s": r.clients_cpu_s,
                    "machine_cpu_s": r.machine_cpu_s})).collect::<Vec<_>>()}));
            if n == a.transfers {
                at_max.push((name, mb_s, srv, both));
            }
        }
    }
    let find = |n: &str| at_max.iter().find(|x| x.0 == n).copied();
    let mut ratios = json!({});
    if let Some((_, rw_mb, rw_cpu, rw_both)) = find("read/write") {
        writeln!(
            h,
            "\nAt {} transfers, against the read/write build:\n",
            a.transfers
        )?;
        for (name, mb, cpu, both) in &at_max {
            if *name == "read/write" {
                continue;
            }
            let (tr, cr, br) = (mb / rw_mb, cpu / rw_cpu, both / rw_both);
            writeln!(
                h,
                "- {name}: throughput {tr:.2}×, server CPU/GB {cr:.2}×, server + clients CPU/GB {br:.2}×"
            )?;
            ratios[*name] = json!({"throughput_x": tr, "server_cpu_per_gb_x": cr,
                "server_and_clients_cpu_per_gb_x": br});
        }
        if let (Some((_, cue_mb, cue_cpu, cue_both)), Some((_, p_mb, p_cpu, p_both))) =
            (find("cue()"), find("sendfile, a process per transfer"))
        {
            writeln!(
                h,
                "- cue() against sendfile with a process per transfer (the same concurrency \
                 without the engine): throughput {:.2}×, server CPU/GB {:.2}×, server + \
                 clients CPU/GB {:.2}×",
                cue_mb / p_mb,
                cue_cpu / p_cpu,
                cue_both / p_both
            )?;
            ratios["cue() vs sendfile, a process per transfer"] = json!({
                "throughput_x": cue_mb / p_mb, "server_cpu_per_gb_x": cue_cpu / p_cpu,
                "server_and_clients_cpu_per_gb_x": cue_both / p_both});
        }
        if let Some((_, cue_mb, cue_cpu, _)) = find("cue()") {
            let met = cue_mb / rw_mb >= 1.5 && cue_cpu / rw_cpu <= 0.6;
            writeln!(
                h,
                "- acceptance (cue() ≥ 1.5× throughput at ≤ 0.6× CPU/GB): {}",
                if met { "met" } else { "NOT met" }
            )?;
        }
    }

    // Fig. 5.
    let mut sweep = Vec::new();
    let cue_exe = built
        .iter()
        .find(|b| b.name == "cue()")
        .map(|b| b.exe.clone());
    if !a.no_sweep
        && let Some(exe) = &cue_exe
    {
        writeln!(
            h,
            "\n## Fig. 5: cue() with schedule=K,T unit={} — {} transfers, {:?} each\n",
            a.unit, a.transfers, a.window
        )?;
        writeln!(
            h,
            "| K | T | MB/s | paced MB/s (transfers×K×unit/T) | server CPU s/GB | machine CPU s/GB |\n|---:|---|---:|---:|---:|---:|"
        )?;
        for t in &a.t {
            let t_s = parse_duration(t)
                .map_err(|e| anyhow::anyhow!("--t {t}: {e}"))?
                .as_secs_f64();
            for &k in &a.k {
                let opts = format!("schedule={k},{t} unit={}", a.unit);
                let server = Server::start(exe, files.path(), Some(&opts), false)?;
                let r = transfer(std::slice::from_ref(&server), a.transfers, Some(a.window))?;
                let nominal = a.transfers as f64 * f64::from(k) * a.unit as f64 / t_s / 1e6;
                writeln!(
                    h,
                    "| {k} | {t} | {:.0} | {:.0} | {:.3} | {:.3} |",
                    r.mb_s(),
                    nominal,
                    r.server_s_per_gb(),
                    r.machine_s_per_gb()
                )?;
                sweep.push(json!({"k": k, "t": t, "unit": a.unit, "mb_s": r.mb_s(),
                    "paced_mb_s": nominal, "bytes": r.bytes, "secs": r.secs,
                    "server_cpu_s_per_gb": r.server_s_per_gb(),
                    "machine_cpu_s_per_gb": r.machine_s_per_gb()}));
            }
        }
    }

    // §4.3.
    let mut meter_rows = Vec::new();
    let mut idle_rate = f64::NAN;
    if !a.no_meter {
        let m = Meter::start()?;
        let idle_for = || {
            m.rate_during(|| {
                std::thread::sleep(a.window);
                Ok(())
            })
            .map(|(r, ())| r)
        };
        // `--reps` rounds, each an idle window then every build in turn, so that a change in
        // the machine's other load (it is shared) falls on all builds alike: medians per
        // build, and of the idle windows.
        let mut idles = Vec::new();
        let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); built.len()];
        for _ in 0..a.reps {
            idles.push(idle_for()?);
            for (k, b) in built.iter().enumerate() {
                let servers = b.start(files.path(), a.cue_options.as_deref(), a.transfers)?;
                let (rate, r) = m.rate_during(|| transfer(&servers, a.transfers, None))?;
                samples[k].push((rate, r.mb_s()));
            }
        }
        let idle = median(&idles);
        idle_rate = idle;
        writeln!(
            h,
            "\n## §4.3: CPU left to others — a meter pinned to CPU 0 beside {} transfers (median of {} rounds)\n",
            a.transfers, a.reps
        )?;
        writeln!(
            h,
            "Idle machine: {:.0} M iterations/s (median; each round measured it again, then every build in turn). The transfers are not paced, so a faster build also takes the CPU for a shorter time: the last column is the meter's iterations lost per GB moved ((idle − meter) / GB/s).\n\n| build | meter M it/s | share of idle | transfers MB/s | meter M it lost per GB |\n|---|---:|---:|---:|---:|",
            idle / 1e6
        )?;
        for (b, got) in built.iter().zip(&samples) {
            let name = b.name;
            let rate = median(&got.iter().map(|x| x.0).collect::<Vec<_>>());
            let mb_s = median(&got.iter().map(|x| x.1).collect::<Vec<_>>());
            writeln!(
                h,
                "| {name} | {:.0} | {:.2} | {:.0} | {:.0} |",
                rate / 1e6,
                rate / idle,
                mb_s,
                (idle - rate) / 1e6 / (mb_s / 1e3)
            )?;
            meter_rows.push(json!({"build": name, "iterations_per_s": rate,
                "share_of_idle": rate / idle, "mb_s": mb_s,
                "iterations_lost_per_gb": (idle - rate) / (mb_s / 1e3),
                "rounds": got.iter().map(|x| json!({"iterations_per_s": x.0, "mb_s": x.1}))
                    .collect::<Vec<_>>()}));
        }
        let share = |n: &str| {
            meter_rows
                .iter()
                .find(|r| r["build"] == n)
                .and_then(|r| r["iterations_per_s"].as_f64())
        };
        if let (Some(rw), Some(cue)) = (share("read/write"), share("cue()")) {
            let gain = cue / rw - 1.0;
            writeln!(
                h,
                "\nUnder cue() the meter keeps {:+.0}% iterations against read/write (acceptance: ≥ +30%: {}).",
                gain * 100.0,
                if gain >= 0.30 { "met" } else { "NOT met" }
            )?;
            let lost = |n: &str| {
                meter_rows
                    .iter()
                    .find(|r| r["build"] == n)
                    .and_then(|r| r["iterations_lost_per_gb"].as_f64())
            };
            if let (Some(rw), Some(cue)) = (lost("read/write"), lost("cue()")) {
                writeln!(
                    h,
                    "Per GB moved, cue() costs the meter {:.2}× the iterations read/write does.",
                    cue / rw
                )?;
            }
        }
    }

    if let Some(d) = dest {
        let v: Value = json!({
            "bench": "cues",
            "machine": machine,
            "file_size": a.file_size,
            "transfers": a.transfers,
            "reps": a.reps,
            "cue_options": a.cue_options,
            "notes": notes,
            "table1": table1,
            "ratios_vs_read_write": ratios,
            "sweep": sweep,
            "meter": {"idle_iterations_per_s": idle_rate, "builds": meter_rows},
        });
        out::write_json(d, &v)?;
    }
    Ok(())
}

/// "Linux <release>, <n> CPUs (<model>), <MiB> MiB".
pub(crate) fn machine_line() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "Machine: Linux {}, {cpus} CPUs ({model}); load average at start {}",
        release.trim(),
        load.join(" ")
    )
}
