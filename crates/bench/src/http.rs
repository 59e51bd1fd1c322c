//! `penstock bench http`: `penstock serve` against nginx in the same run, with wrk.
//!
//! Both servers serve the same temporary directory on loopback: a large file (256 MiB, 64
//! MiB with `--quick`) and a 16 KiB one. nginx runs with `sendfile on`, `tcp_nopush on`, no
//! access log and as many worker processes as penstock has HTTP workers. For each workload
//! and each client count, penstock then nginx run one wrk measurement each, `--reps` times
//! (interleaved, so machine noise hits both alike), and the table shows medians. The servers
//! run on the first half of the CPUs and wrk on the other half (`--no-pin`: anywhere). Server CPU is the utime+stime delta of every server
//! process (/proc/PID/stat) over the wrk run. wrk's latency is the whole response (for the
//! large file: the whole download, not the time to first byte); its p99 is reported. The time
//! to first byte is measured beside wrk by a probe: while wrk runs, every 100 ms a fresh
//! connection (4 KiB receive window) sends one GET and waits for the first byte of the
//! response (connect included), then closes; the p99 of those samples is reported.
//! nginx and wrk must be installed (`apt-get install nginx wrk`); without them the bench says
//! so and exits 2 — it installs nothing itself. Both run without an access log.
//!
//! `--https` (issue 33) runs the same comparison with both servers over TLS: see
//! [`HttpArgs::https`]. nginx gets `ssl_protocols TLSv1.2 TLSv1.3`, its defaults otherwise
//! (no `ssl_conf_command Options KTLS`: without the kernel's TLS module neither server can
//! hand records to the kernel, and Debian's nginx does not ask for it by default).
//!
//! `--access-log` measures penstock against itself instead (issue 16): its access log to a
//! file against logging off, in the same run, alternating (off, file, file, off, …: `--reps`
//! pairs), each run `--duration-s` (default 60) of wrk with `--clients` (default 64) on the
//! 16 KiB file, a fresh server each run. The table gives requests/s and their ratio, and
//! checks the log: exactly one well-formed line per request wrk completed. To make that
//! count exact, the window ends with the *server*: at the end of the window it gets SIGTERM
//! and stops gracefully (every request it has read is answered, then its connection closed;
//! requests not yet read die with their connection), while wrk runs two seconds longer and
//! so reads every answer the server wrote (its reconnects are refused). Had wrk stopped
//! first, the requests in flight at its end (at most one per connection) would be answered
//! and logged but never counted by wrk. Requests/s is wrk's count over the window.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

#[derive(Args, Debug)]
pub struct HttpArgs {
    /// Smaller large file (64 MiB) and shorter runs (3 s).
    #[arg(long)]
    pub quick: bool,
    /// Concurrent clients, comma-separated (default 1,8,64,512; with --access-log 64).
    #[arg(long)]
    pub clients: Option<String>,
    /// Seconds per wrk run (default 10, 3 with --quick; with --access-log 60).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// penstock with its access log to a file against logging off (see the module doc),
    /// instead of penstock against nginx.
    #[arg(long)]
    pub access_log: bool,
    /// Both servers over TLS (`penstock bench https`): one throwaway ECDSA P-256 certificate
    /// made with `openssl`, TLS 1.2 and 1.3, wrk over https. Where the kernel has no TLS ULP
    /// (these VMs) both encrypt in user space: penstock with rustls (`tls-user`), nginx with
    /// OpenSSL. Clients default to 8,64; the time-to-first-byte probe (plain TCP) is off.
    #[arg(long, conflicts_with = "access_log")]
    pub https: bool,
    /// Server workers for both (penstock HTTP workers, nginx worker_processes); 0: the CPUs
    /// the servers run on.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// wrk runs per server and cell (alternating penstock, nginx); the table shows medians.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Let the scheduler place servers and wrk (default: the servers on the first half of the
    /// allowed CPUs, wrk on the rest, when there are two or more).
    #[arg(long)]
    pub no_pin: bool,
    /// Also write the table (Markdown) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every cell's figures as JSON here; a bare `--json` writes them on stdout (the
    /// table then goes to stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

impl Measure {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "bytes_per_s": self.bytes_per_s, "requests_per_s": self.requests_per_s,
            "cpu_s_per_gb": self.cpu_s_per_gb, "machine_cpu_s_per_gb": self.machine_cpu_s_per_gb,
            "p99_ms": self.p99_ms, "ttfb_p99_ms": self.ttfb_p99_ms, "errors": self.errors,
        })
    }
}

struct Measure {
    bytes_per_s: f64,
    requests_per_s: f64,
    cpu_s_per_gb: f64,
    /// Every CPU's busy time per GB (server, load generator and kernel).
    machine_cpu_s_per_gb: f64,
    p99_ms: f64,
    /// p99 time to first byte of the probe's requests during the run.
    ttfb_p99_ms: f64,
    errors: u64,
}

impl Measure {
    /// Each figure's median over the runs (errors: their sum).
    fn median(runs: &[Measure]) -> Measure {
        let med = |f: fn(&Measure) -> f64| {
            crate::stats::median(&runs.iter().map(f).collect::<Vec<f64>>())
        };
        Measure {
            bytes_per_s: med(|m| m.bytes_per_s),
            requests_per_s: med(|m| m.requests_per_s),
            cpu_s_per_gb: med(|m| m.cpu_s_per_gb),
            machine_cpu_s_per_gb: med(|m| m.machine_cpu_s_per_gb),
            p99_ms: med(|m| m.p99_ms),
            ttfb_p99_ms: med(|m| m.ttfb_p99_ms),
            errors: runs.iter().map(|m| m.errors).sum(),
        }
    }
}

pub(crate) fn ensure_tools(tools: &[&'static str]) -> Result<()> {
    let have = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing: Vec<&str> = tools.iter().copied().filter(|c| !have(c)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    // A benchmark installs nothing on the machine it measures (on Debian, installing nginx
    // also starts it on port 80): say what is missing, exit 2.
    eprintln!(
        "penstock: error: this bench needs {} on PATH; install with: apt-get install {}",
        missing.join(" and "),
        missing.join(" ")
    );
    std::process::exit(2);
}

fn write_file(path: &Path, len: u64) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for c in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn wait_listening(port: u16, child: &mut Child) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("server exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("server did not listen on port {port}")
}

/// Busy time of the whole machine (every CPU's user, nice, system, irq and softirq time, from
/// /proc/stat), in seconds: the server's own CPU plus what the kernel did for its traffic
/// wherever that ran — and the load generator's, which is the same program for both servers.
fn machine_busy_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return f64::NAN;
    };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    // cpu user nice system idle iowait irq softirq steal ...
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 7 {
        return f64::NAN;
    }
    (v[0] + v[1] + v[2] + v[5] + v[6]) / 100.0
}

/// utime + stime of `pid` and its children processes (nginx workers), in seconds.
pub(crate) fn cpu_s(pid: u32) -> f64 {
    let mut total = proc_cpu_s(&pid.to_string()).map_or(0.0, |(_, t)| t);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(p) = e.file_name().to_str().filter(|n| n.parse::<u32>().is_ok())
                && let Some((ppid, t)) = proc_cpu_s(p)
                && ppid == pid
            {
                total += t;
            }
        }
    }
    total
}

/// `/proc/WHICH/stat`'s parent pid and utime + stime in seconds (WHICH a pid or `self`).
pub(crate) fn proc_cpu_s(which: &str) -> Option<(u32, f64)> {
    // /proc reports in USER_HZ, which the kernel fixes at 100 for user space.
    let tick = 100.0;
    let s = std::fs::read_to_string(format!("/proc/{which}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split(' ').collect();
    // After the comm: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = f.get(1)?.parse().ok()?;
    let t = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some((ppid, t / tick))
}

fn parse_size_wrk(s: &str) -> Option<f64> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.parse().ok()?;
    let m = match unit {
        "B" => 1.0,
        "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        "TB" => 1024.0f64.powi(4),
        _ => return None,
    };
    Some(n * m)
}

fn parse_time_ms(s: &str) -> Option<f64> {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => return None,
    })
}

/// Time to first byte under load (see the module's doc): a thread that probes until stopped.
struct Probe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl Probe {
    /// Between probes: ~100 samples per 10 s run, and little load added.
    const GAP: Duration = Duration::from_millis(100);

    /// A connection with a 4 KiB receive buffer (set before connecting, so the window stays
    /// small): a server can push little of a large body before the probe closes on it.
    fn connect(port: u16) -> std::io::Result<TcpStream> {
        use rustix::net::{AddressFamily, SocketType, sockopt};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
        sockopt::set_socket_recv_buffer_size(&fd, 4096)?;
        rustix::net::connect(&fd, &std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
        Ok(TcpStream::from(fd))
    }

    fn start(port: u16, path: &str) -> Probe {
        use std::io::Read;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut ms = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                if let Ok(mut s) = Probe::connect(port) {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut first = [0u8; 1];
                    if s.write_all(request.as_bytes()).is_ok()
                        && matches!(s.read(&mut first), Ok(1))
                    {
                        ms.push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                }
                std::thread::sleep(Probe::GAP);
            }
            ms
        });
        Probe { stop, thread }
    }

    /// Stop probing; the p99 of the samples (NaN if none).
    fn p99_ms(self) -> f64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        crate::stats::percentile(&self.thread.join().unwrap_or_default(), 99)
    }
}

fn run_wrk(
    port: u16,
    path: &str,
    clients: usize,
    duration_s: u64,
    server_pid: u32,
    https: bool,
) -> Result<Measure> {
    let threads = clients.clamp(1, 2);
    let cpu0 = cpu_s(server_pid);
    let busy0 = machine_busy_s();
    // The probe speaks plain HTTP: over TLS it is not run (NaN).
    let probe = (!https).then(|| Probe::start(port, path));
    let scheme = if https { "https" } else { "http" };
    let out = Command::new("wrk")
        .args([
            "-t",
            &threads.to_string(),
            "-c",
            &clients.to_string(),
            "-d",
            &format!("{duration_s}s"),
            "--timeout",
            "30s",
            "--latency",
            &format!("{scheme}://127.0.0.1:{port}{path}"),
        ])
        .output()
        .context("running wrk")?;
    let cpu1 = cpu_s(server_pid);
    let busy1 = machine_busy_s();
    let ttfb_p99_ms = probe.map_or(f64::NAN, Probe::p99_ms);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut bytes = None;
    let mut secs = None;
    let mut rps = 0.0;
    let mut p99 = f64::NAN;
    let mut errors = 0u64;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        // "  123 requests in 10.00s, 1.23GB read"
        if w.len() >= 6 && w[1] == "requests" && w[2] == "in" {
            secs = parse_time_ms(w[3].trim_end_matches(',')).map(|ms| ms / 1000.0);
            bytes = parse_size_wrk(w[4]);
        }
        if w.first() == Some(&"Requests/sec:") {
            rps = w.get(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        }
        if w.first() == Some(&"99%") {
            p99 = w.get(1).and_then(|v| parse_time_ms(v)).unwrap_or(f64::NAN);
        }
        if w.first() == Some(&"Socket") || w.first() == Some(&"Non-2xx") {
            errors += line
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    let (Some(bytes), Some(secs)) = (bytes, secs) else {
        bail!("could not read wrk's output:\n{text}");
    };
    let cpu = cpu1 - cpu0;
    Ok(Measure {
        bytes_per_s: bytes / secs,
        requests_per_s: rps,
        cpu_s_per_gb: if bytes > 0.0 {
            cpu / (bytes / 1e9)
        } else {
            f64::NAN
        },
        machine_cpu_s_per_gb: if bytes > 0.0 {
            (busy1 - busy0) / (bytes / 1e9)
        } else {
            f64::NAN
        },
        p99_ms: p99,
        ttfb_p99_ms,
        errors,
    })
}

pub(crate) struct Child2(pub(crate) Child);

/// A throwaway certificate for `--https`.
struct Cert {
    cert: PathBuf,
    key: PathBuf,
}

/// An ECDSA P-256 key and a self-signed certificate for 127.0.0.1 in `dir` (the key 0600:
/// penstock refuses a key others may read).
fn make_cert(dir: &Path) -> Result<Cert> {
    use std::os::unix::fs::PermissionsExt;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .context("running openssl")?;
    if !o.status.success() {
        bail!("openssl req: {}", String::from_utf8_lossy(&o.stderr));
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    Ok(Cert { cert, key })
}

/// `penstock serve` (this executable) with a configuration written to `conf`: `workers`
/// loops on `127.0.0.1:port`, no control listeners, `access` (`off` or a file) as the access
/// log, serving `www`; returns once it listens.
fn start_penstock(
    conf: &Path,
    port: u16,
    workers: usize,
    www: &Path,
    access: &str,
    tls: Option<&Cert>,
) -> Result<Child2> {
    let (scheme, tls) = match tls {
        Some(c) => (
            "https://",
            format!(
                "[[tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n",
                c.cert.display(),
                c.key.display()
            ),
        ),
        None => ("", String::new()),
    };
    std::fs::write(
        conf,
        format!(
            "[rtsp]\nlisten = \"\"\n[http]\nlisten = \"{scheme}127.0.0.1:{port}\"\nworkers = {workers}\n[engine]\nworkers = {workers}\n[limits]\nrequests_per_connection_max = 1000000\n[log]\naccess = \"{access}\"\n{tls}"
        ),
    )?;
    let mut server = Child2(
        Command::new(std::env::current_exe()?)
            .args(["serve", "--config"])
            .arg(conf)
            .arg("--root")
            .arg(www)
            .args(["--control", "", "--no-control-unix"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting penstock serve")?,
    );
    wait_listening(port, &mut server.0)?;
    Ok(server)
}

/// nginx under `prefix` (created), `workers` worker processes, serving `root` on
/// `127.0.0.1:port` (`listen_extra`: e.g. its TLS parameters) with sendfile, tcp_nopush, no
/// access log and keep-alive without a practical limit; `types` its MIME map. Returns once it
/// listens. Used by `bench http` and `bench hls`.
pub(crate) fn start_nginx(
    prefix: &Path,
    workers: usize,
    port: u16,
    listen_extra: &str,
    root: &Path,
    types: &str,
) -> Result<Child2> {
    std::fs::create_dir(prefix)?;
    std::fs::write(
        prefix.join("nginx.conf"),
        format!(
            "user root;\nworker_processes {workers};\ndaemon off;\npid {p}/nginx.pid;\nerror_log {p}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 1000000;\n  keepalive_timeout 65;\n\
               client_body_temp_path {p}/cb; proxy_temp_path {p}/px; fastcgi_temp_path {p}/fc; uwsgi_temp_path {p}/uw; scgi_temp_path {p}/sc;\n\
               types {{ {types} }}\n\
               server {{ listen 127.0.0.1:{port}{listen_extra}; root {root}; location / {{ }} }}\n}}\n",
            p = prefix.display(),
            root = root.display(),
        ),
    )?;
    let mut nginx = Child2(
        Command::new("nginx")
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(prefix.join("nginx.conf"))
            .arg("-e")
            .arg(prefix.join("error.log"))
            .stdout(Stdio::null())
            .spawn()
            .context("starting nginx")?,
    );
    wait_listening(port, &mut nginx.0)?;
    Ok(nginx)
}

impl Drop for Child2 {
    fn drop(&mut self) {
        // SIGTERM (both servers stop gracefully on it), then reap.
        let pid = rustix::process::Pid::from_raw(self.0.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(a: HttpArgs) -> Result<()> {
    if a.access_log {
        return access_log::run(a);
    }
    if a.https {
        ensure_tools(&["nginx", "wrk", "openssl"])?;
    } else {
        ensure_tools(&["nginx", "wrk"])?;
    }
    let clients: Vec<usize> = a
        .clients
        .as_deref()
        .unwrap_or(if a.https { "8,64" } else { "1,8,64,512" })
        .split(',')
        .map(|s| s.trim().parse().context("--clients"))
        .collect::<Result<_>>()?;
    let duration_s = a.duration_s.unwrap_or(if a.quick { 3 } else { 10 });
    let large_bytes: u64 = if a.quick { 64 << 20 } else { 256 << 20 };
    if a.reps == 0 {
        bail!("--reps must be at least 1");
    }
    // Placement: the load generator is a receiver on the same machine. Left to the scheduler,
    // wrk and the server's workers share both CPUs and which one gets pulled onto the other's
    // CPU decides the CPU a server is charged (one run said 0.06, the next 0.4 s/GB). Pinned
    // apart — both servers on the same CPUs, wrk on the others — they are measured alike.
    // Before pinning: the machine's CPUs, not this thread's.
    let machine = machine_line();
    let cpus = penstock_driver::clock::allowed_cpus();
    let pinned = !a.no_pin && cpus.len() >= 2;
    let (server_cpus, client_cpus) = if pinned {
        let half = cpus.len() / 2;
        (cpus[..half].to_vec(), cpus[half..].to_vec())
    } else {
        (cpus.clone(), cpus.clone())
    };
    let workers = if a.workers == 0 {
        if pinned {
            server_cpus.len()
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    } else {
        a.workers
    };
    if pinned {
        // The servers inherit this process's mask when started; wrk the one set after.
        penstock_driver::clock::pin_to_cpus(&server_cpus).context("pinning the servers")?;
    }
    let dir = tempfile::Builder::new()
        .prefix("penstock-bench-http-")
        .tempdir()?;
    let www = dir.path().join("www");
    std::fs::create_dir(&www)?;
    write_file(&www.join("large.bin"), large_bytes)?;
    write_file(&www.join("small.bin"), 16 * 1024)?;
    // Warm the page cache for both.
    for f in ["large.bin", "small.bin"] {
        std::io::copy(&mut std::fs::File::open(www.join(f))?, &mut std::io::sink())?;
    }

    let cert = if a.https {
        Some(make_cert(dir.path())?)
    } else {
        None
    };
    let p_port = free_port()?;
    let penstock = start_penstock(
        &dir.path().join("penstock.toml"),
        p_port,
        workers,
        &www,
        "off",
        cert.as_ref(),
    )?;
    let nginx_tls = cert.as_ref().map_or(String::new(), |c| {
        format!(
            " ssl; ssl_certificate {}; ssl_certificate_key {}; ssl_protocols TLSv1.2 TLSv1.3",
            c.cert.display(),
            c.key.display()
        )
    });

    let n_port = free_port()?;
    let nginx = start_nginx(
        &dir.path().join("nginx"),
        workers,
        n_port,
        &nginx_tls,
        &www,
        "application/octet-stream bin;",
    )?;
    let placement = if pinned {
        penstock_driver::clock::pin_to_cpus(&client_cpus).context("pinning wrk")?;
        format!("servers on CPUs {server_cpus:?}, wrk on CPUs {client_cpus:?}")
    } else {
        "servers and wrk placed by the scheduler".to_string()
    };

    let mut table = String::new();
    table.push_str(&format!(
        "penstock bench {}: {machine}; {workers} workers each; {placement}; wrk {duration_s} s per run, medians of {} runs per cell; large = {} MiB, small = 16 KiB\n\n",
        if a.https { "https (both servers over TLS)" } else { "http" },
        a.reps,
        large_bytes >> 20
    ));
    table.push_str("| file | clients | server | MB/s | req/s | server CPU s/GB | machine CPU s/GB | p99 TTFB ms (probe) | p99 response ms (wrk) | errors |\n|---|---|---|---|---|---|---|---|---|---|\n");
    let mut ratios = String::from(
        "\n| file | clients | throughput penstock/nginx | req/s penstock/nginx | server CPU/GB penstock/nginx | machine CPU/GB penstock/nginx | p99 TTFB penstock/nginx | p99 response penstock/nginx |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut json_rows = Vec::new();
    for (name, path) in [("large", "/large.bin"), ("small", "/small.bin")] {
        for &c in &clients {
            let (mut ps, mut ns) = (Vec::new(), Vec::new());
            for _ in 0..a.reps {
                ps.push(run_wrk(
                    p_port,
                    path,
                    c,
                    duration_s,
                    penstock.0.id(),
                    a.https,
                )?);
                ns.push(run_wrk(n_port, path, c, duration_s, nginx.0.id(), a.https)?);
            }
            let (p, n) = (Measure::median(&ps), Measure::median(&ns));
            json_rows.push(serde_json::json!({
                "file": name, "clients": c, "penstock": p.json(), "nginx": n.json(),
            }));
            for (server, m) in [("penstock", &p), ("nginx", &n)] {
                table.push_str(&format!(
                    "| {name} | {c} | {server} | {:.0} | {:.0} | {:.3} | {:.3} | {:.2} | {:.1} | {} |\n",
                    m.bytes_per_s / 1e6,
                    m.requests_per_s,
                    m.cpu_s_per_gb,
                    m.machine_cpu_s_per_gb,
                    m.ttfb_p99_ms,
                    m.p99_ms,
                    m.errors
                ));
            }
            ratios.push_str(&format!(
                "| {name} | {c} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
                ratio(p.bytes_per_s, n.bytes_per_s),
                ratio(p.requests_per_s, n.requests_per_s),
                ratio(p.cpu_s_per_gb, n.cpu_s_per_gb),
                ratio(p.machine_cpu_s_per_gb, n.machine_cpu_s_per_gb),
                ratio(p.ttfb_p99_ms, n.ttfb_p99_ms),
                ratio(p.p99_ms, n.p99_ms)
            ));
            eprintln!("bench http: {name} {c} clients done");
        }
    }
    table.push_str(&ratios);
    write!(crate::out::human(a.json.as_deref()), "{table}")?;
    if let Some(o) = &a.out {
        std::fs::write(o, &table)?;
    }
    if let Some(j) = &a.json {
        crate::out::write_json(
            j,
            &serde_json::json!({"bench": if a.https { "https" } else { "http" }, "machine": machine, "placement": placement,
                "duration_s": duration_s, "reps": a.reps, "large_bytes": large_bytes, "rows": json_rows}),
        )?;
    }
    drop(nginx);
    drop(penstock);
    Ok(())
}

/// `a / b`, or NaN when `b` measured nothing (no request completed within a run, say).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 && a.is_finite() {
        a / b
    } else {
        f64::NAN
    }
}

pub(crate) fn machine_line() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpus} x {cpu}, Linux {kernel}")
}

/// `bench http --access-log`: penstock's access log to a file against logging off (the
/// module doc says how the count is made exact).
mod access_log {
    use super::*;

    /// wrk runs this much longer than the server's window (its reconnects are refused then).
    const WRK_GRACE_S: u64 = 2;
    const SMALL_BYTES: u64 = 16 * 1024;

    struct Run {
        log: bool,
        requests: u64,
        window_s: f64,
        lines: u64,
        malformed: u64,
        server_cpu_s: f64,
        wrk_errors: String,
        /// The machine's 1-minute load average at the end of the window (this run's server
        /// and wrk make about 2): how much else ran.
        load: f64,
    }

    impl Run {
        fn requests_per_s(&self) -> f64 {
            self.requests as f64 / self.window_s
        }
    }

    /// The line of a request for the small file, as it must be (the time and `rt=` vary).
    fn well_formed(line: &str) -> bool {
        let Some(rest) = line.strip_prefix("127.0.0.1 - - [") else {
            return false;
        };
        let Some((time, rest)) = rest.split_once("] ") else {
            return false;
        };
        let Some(rest) = rest.strip_prefix(&format!(
            "\"GET /small.bin HTTP/1.1\" 200 {SMALL_BYTES} \"-\" \"-\" rt="
        )) else {
            return false;
        };
        let Some((rt, path)) = rest.split_once(' ') else {
            return false;
        };
        time.len() == 26
            && time.ends_with(" +0000")
            && rt.split_once('.').is_some_and(|(s, ms)| {
                !s.is_empty()
                    && ms.len() == 3
                    && s.bytes().chain(ms.bytes()).all(|b| b.is_ascii_digit())
            })
            && path == "path=sendfile"
    }

    fn wrk_count(text: &str) -> Option<u64> {
        text.lines().find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 3 && w[1] == "requests" && w[2] == "in")
                .then(|| w[0].parse().ok())
                .flatten()
        })
    }

    fn wrk_errors(text: &str) -> String {
        text.lines()
            .filter(|l| {
                let l = l.trim_start();
                l.starts_with("Socket errors") || l.starts_with("Non-2xx")
            })
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ")
    }

    #[allow(clippy::too_many_arguments)]
    fn one_run(
        dir: &Path,
        www: &Path,
        log: bool,
        workers: usize,
        clients: usize,
        window_s: u64,
        client_cpus: &[usize],
        pinned: bool,
        n: usize,
    ) -> Result<Run> {
        let port = free_port()?;
        let log_path = dir.join(format!("access-{n}.log"));
        let conf = dir.join(format!("penstock-{n}.toml"));
        let access = if log {
            log_path.display().to_string()
        } else {
            "off".into()
        };
        // The servers inherit this process's mask (the servers' CPUs), wrk the clients'.
        let server = start_penstock(&conf, port, workers, www, &access, None)?;
        let pid = server.0.id();
        let threads = clients.clamp(1, 2);
        let mut wrk = Command::new("wrk");
        wrk.args([
            "-t",
            &threads.to_string(),
            "-c",
            &clients.to_string(),
            "-d",
            &format!("{}s", window_s + WRK_GRACE_S),
            "--timeout",
            "30s",
            &format!("http://127.0.0.1:{port}/small.bin"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if pinned {
            penstock_driver::clock::pin_to_cpus(client_cpus).context("pinning wrk")?;
        }
        let cpu0 = cpu_s(pid);
        let t0 = Instant::now();
        let wrk = wrk.spawn().context("running wrk");
        if pinned {
            penstock_driver::clock::pin_to_cpus(&server_cpus_of(client_cpus))
                .context("pinning back")?;
        }
        let wrk = wrk?;
        std::thread::sleep(Duration::from_secs(window_s));
        let cpu1 = cpu_s(pid);
        let window = t0.elapsed().as_secs_f64();
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN);
        // The server ends the window: graceful stop, every read request answered.
        drop(server);
        let out = wrk.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        }
        let requests =
            wrk_count(&text).with_context(|| format!("could not read wrk's output:\n{text}"))?;
        let (mut lines, mut malformed) = (0u64, 0u64);
        if log {
            let f = std::io::BufReader::new(std::fs::File::open(&log_path)?);
            for l in std::io::BufRead::lines(f) {
                let l = l?;
                lines += 1;
                if !well_formed(&l) {
                    if malformed < 3 {
                        eprintln!("bench http --access-log: malformed line: {l:?}");
                    }
                    malformed += 1;
                }
            }
            // Not kept: a 60 s run writes hundreds of MB.
            let _ = std::fs::remove_file(&log_path);
        }
        Ok(Run {
            log,
            requests,
            window_s: window,
            lines,
            malformed,
            server_cpu_s: cpu1 - cpu0,
            wrk_errors: wrk_errors(&text),
            load,
        })
    }

    /// The allowed CPUs that are not `client_cpus` (the servers' half), or all of them.
    fn server_cpus_of(client_cpus: &[usize]) -> Vec<usize> {
        let all = penstock_driver::clock::allowed_cpus();
        let rest: Vec<usize> = all
            .iter()
            .copied()
            .filter(|c| !client_cpus.contains(c))
            .collect();
        if rest.is_empty() { all } else { rest }
    }

    pub(super) fn run(a: HttpArgs) -> Result<()> {
        ensure_tools(&["wrk"])?;
        let clients: usize = a
            .clients
            .as_deref()
            .unwrap_or("64")
            .trim()
            .parse()
            .context("--clients: one number with --access-log")?;
        let window_s = a.duration_s.unwrap_or(60);
        if a.reps == 0 || window_s == 0 {
            bail!("--reps and --duration-s must be at least 1");
        }
        let machine = machine_line();
        let cpus = penstock_driver::clock::allowed_cpus();
        let pinned = !a.no_pin && cpus.len() >= 2;
        let (server_cpus, client_cpus) = if pinned {
            let half = cpus.len() / 2;
            (cpus[..half].to_vec(), cpus[half..].to_vec())
        } else {
            (cpus.clone(), cpus.clone())
        };
        let workers = if a.workers == 0 {
            server_cpus.len()
        } else {
            a.workers
        };
        if pinned {
            penstock_driver::clock::pin_to_cpus(&server_cpus).context("pinning the servers")?;
        }
        let dir = tempfile::Builder::new()
            .prefix("penstock-bench-http-log-")
            .tempdir()?;
        let www = dir.path().join("www");
        std::fs::create_dir(&www)?;
        write_file(&www.join("small.bin"), SMALL_BYTES)?;
        std::io::copy(
            &mut std::fs::File::open(www.join("small.bin"))?,
            &mut std::io::sink(),
        )?;
        let mut runs = Vec::new();
        for rep in 0..a.reps {
            // off, file, then file, off: drift over the run hits both alike.
            let order = if rep % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for log in order {
                let r = one_run(
                    dir.path(),
                    &www,
                    log,
                    workers,
                    clients,
                    window_s,
                    &client_cpus,
                    pinned,
                    runs.len(),
                )?;
                eprintln!(
                    "bench http --access-log: run {} ({}) {} requests, {:.0} req/s{}",
                    runs.len() + 1,
                    if log { "file" } else { "off" },
                    r.requests,
                    r.requests_per_s(),
                    if log {
                        format!(", {} lines, {} malformed", r.lines, r.malformed)
                    } else {
                        String::new()
                    }
                );
                runs.push(r);
            }
        }
        let placement = if pinned {
            format!("server on CPUs {server_cpus:?}, wrk on CPUs {client_cpus:?}")
        } else {
            "server and wrk placed by the scheduler".to_string()
        };
        let mut table = format!(
            "penstock bench http --access-log: {machine}; {workers} HTTP worker(s); {placement}; wrk -c {clients} for a {window_s} s window (+{WRK_GRACE_S} s after the server's graceful stop) per run on a 16 KiB file, a fresh server per run, runs alternating off/file\n\n"
        );
        table.push_str("| run | access log | wrk requests | req/s | log lines | lines - requests | malformed lines | server CPU µs/request | load avg | wrk errors (after the server's stop) |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for (i, r) in runs.iter().enumerate() {
            table.push_str(&format!(
                "| {} | {} | {} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {} |\n",
                i + 1,
                if r.log { "file" } else { "off" },
                r.requests,
                r.requests_per_s(),
                if r.log {
                    r.lines.to_string()
                } else {
                    "-".into()
                },
                if r.log {
                    (r.lines as i64 - r.requests as i64).to_string()
                } else {
                    "-".into()
                },
                if r.log {
                    r.malformed.to_string()
                } else {
                    "-".into()
                },
                r.server_cpu_s / r.requests.max(1) as f64 * 1e6,
                r.load,
                if r.wrk_errors.is_empty() {
                    "-"
                } else {
                    &r.wrk_errors
                },
            ));
        }
        let med = |log: bool, f: fn(&Run) -> f64| {
            crate::stats::median(
                &runs
                    .iter()
                    .filter(|r| r.log == log)
                    .map(f)
                    .collect::<Vec<f64>>(),
            )
        };
        let (off, on) = (
            med(false, Run::requests_per_s),
            med(true, Run::requests_per_s),
        );
        let cpu = |r: &Run| r.server_cpu_s / r.requests.max(1) as f64 * 1e6;
        let exact = runs
            .iter()
            .filter(|r| r.log)
            .all(|r| r.lines == r.requests && r.malformed == 0);
        table.push_str(&format!(
            "\nmedian req/s: off {off:.0}, file {on:.0}; file/off = {:.3} (cost {:.1} %); median server CPU per request: off {:.1} µs, file {:.1} µs\n\
             every logged run has exactly one well-formed line per request wrk completed: {}\n",
            ratio(on, off),
            (1.0 - ratio(on, off)) * 100.0,
            med(false, cpu),
            med(true, cpu),
            if exact { "yes" } else { "NO" }
        ));
        write!(crate::out::human(a.json.as_deref()), "{table}")?;
        if let Some(o) = &a.out {
            std::fs::write(o, &table)?;
        }
        if let Some(j) = &a.json {
            let rows: Vec<serde_json::Value> = runs
                .iter()
                .map(|r| {
                    serde_json::json!({"log": if r.log { "file" } else { "off" },
                        "requests": r.requests, "window_s": r.window_s,
                        "requests_per_s": r.requests_per_s(), "lines": r.lines,
                        "malformed": r.malformed, "server_cpu_s": r.server_cpu_s,
                        "wrk_errors": r.wrk_errors, "load": r.load})
                })
                .collect();
            crate::out::write_json(
                j,
                &serde_json::json!({"bench": "http --access-log", "file_over_off": ratio(on, off),
                    "exact": exact, "runs": rows}),
            )?;
        }
        if !exact {
            bail!("the access log did not hold exactly one well-formed line per request");
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn lines_are_checked_field_by_field() {
            let good = "127.0.0.1 - - [24/Nov/2026:13:45:01 +0000] \"GET /small.bin HTTP/1.1\" 200 16384 \"-\" \"-\" rt=0.000 path=sendfile";
            assert!(well_formed(good));
            for bad in [
                &good[..good.len() - 1],
                &good.replace("200 16384", "200 16383"),
                &good.replace("rt=0.000", "rt=0.00"),
                &good.replace("+0000]", "+0000 ]"),
                "",
            ] {
                assert!(!well_formed(bad), "{bad}");
            }
            let wrk = "Running 2s test\n  2 threads and 64 connections\n  123456 requests in 62.00s, 1.90GB read\n  Socket errors: connect 64, read 0, write 0, timeout 0\nRequests/sec: 1991.23\n";
            assert_eq!(wrk_count(wrk), Some(123_456));
            assert_eq!(
                wrk_errors(wrk),
                "Socket errors: connect 64, read 0, write 0, timeout 0"
            );
        }
    }
}
