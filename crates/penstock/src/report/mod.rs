//! `penstock bench all --report DIR`: every bench of the papers' experiments, one after
//! another, and one page that puts what each paper measured beside what penstock measured
//! here (issue 19).
//!
//! Each bench runs as this executable's own subcommand (`penstock bench NAME … --json FILE`),
//! a child process with its output in `DIR/logs/NAME.log`: the command shown on the page to
//! re-run a bench alone is exactly the one that ran, a bench that raises a limit or pins a
//! CPU does so in its own process, and one that fails or is missing a peer (nginx, cc, the C
//! library) costs its section only. The benches are the entries of [`entries`]: one more bench
//! is one more entry there and one more arm in `analysis::section`.
//!
//! Written to DIR: `results.json` (every bench's JSON as it wrote it, with the machine, the
//! commit, the commands and the times; its shape is `docs/bench-report.schema.json`),
//! `index.html` (one page, inline CSS, images beside it, nothing fetched), `*.svg` (plotters),
//! `logs/`, `raw/` (the benches' own JSON files) and `traces/` (the 1-stream periodic traces).
//! `--render FILE` writes the page again from a `results.json` without running anything.

mod analysis;
mod html;
mod machine;
mod plots;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

/// The `results.json` format this build writes and reads.
pub const SCHEMA: &str = "penstock-bench-all/1";

#[derive(Args, Debug)]
pub struct AllArgs {
    /// Where the report goes (created): index.html, *.svg, results.json, logs/, raw/, traces/.
    #[arg(long, value_name = "DIR", required_unless_present = "list")]
    pub report: Option<PathBuf>,
    /// The short runs: every bench, ≤ 10 minutes on a 2-core machine.
    #[arg(long)]
    pub quick: bool,
    /// The shortest runs that still fill every table and plot (for tests; the figures mean
    /// little).
    #[arg(long, hide = true, conflicts_with = "quick")]
    pub smoke: bool,
    /// Only these benches, comma-separated (default: all; see `penstock bench all --list`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Print the benches and the command each runs, then exit.
    #[arg(long)]
    pub list: bool,
    /// Write the page from this results.json (of an earlier run) into --report; runs nothing.
    #[arg(long, value_name = "RESULTS.json")]
    pub render: Option<PathBuf>,
}

/// How long a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Full,
    Quick,
    Smoke,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Quick => "quick",
            Mode::Smoke => "smoke",
        }
    }
}

/// One bench of the report.
pub struct Entry {
    /// The name in `--only`, in results.json and of its section.
    pub name: &'static str,
    /// `penstock bench` subcommand words.
    pub subcommand: &'static [&'static str],
    /// Arguments per mode (`--json FILE` is added).
    pub full: &'static [&'static str],
    pub quick: &'static [&'static str],
    pub smoke: &'static [&'static str],
    /// Expected seconds per mode on a 2-core VM (the progress estimate starts from these and
    /// is corrected by the measured ratio as benches finish).
    pub estimate_s: [u64; 3],
    /// Whether the bench writes per-unit traces (`--traces DIR/traces`).
    pub traces: bool,
}

impl Entry {
    fn args(&self, mode: Mode) -> &'static [&'static str] {
        match mode {
            Mode::Full => self.full,
            Mode::Quick => self.quick,
            Mode::Smoke => self.smoke,
        }
    }

    fn estimate(&self, mode: Mode) -> u64 {
        self.estimate_s[match mode {
            Mode::Full => 0,
            Mode::Quick => 1,
            Mode::Smoke => 2,
        }]
    }

    /// The arguments after `penstock`, `--json` and `--traces` pointing into `dir`.
    fn argv(&self, mode: Mode, dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = vec!["bench".into()];
        v.extend(self.subcommand.iter().map(|s| s.to_string()));
        v.extend(self.args(mode).iter().map(|s| s.to_string()));
        if self.traces {
            v.push("--traces".into());
            v.push(dir.join("traces").display().to_string());
        }
        v.push("--json".into());
        v.push(
            dir.join("raw")
                .join(format!("{}.json", self.name))
                .display()
                .to_string(),
        );
        v
    }
}

/// Every bench, in the order of the page. Quick arguments are chosen so that the whole
/// `--quick` run stays within 10 minutes on a 2-core VM (measured: the run prints its wall
/// time); full arguments are each bench's own defaults (plus the traces and, for periodic,
/// nothing cut).
pub fn entries() -> Vec<Entry> {
    vec![
        Entry {
            name: "paths",
            subcommand: &["paths"],
            full: &[],
            quick: &["--quick"],
            smoke: &["--sizes", "8MB", "--reps", "1", "--no-cold"],
            estimate_s: [600, 10, 5],
            traces: false,
        },
        Entry {
            name: "periodic",
            subcommand: &["periodic"],
            full: &[],
            quick: &[
                "--streams",
                "1,1000,10000",
                "--duration",
                "8s",
                "--loads",
                "none,cpu",
            ],
            smoke: &[
                "--streams",
                "1,10",
                "--duration",
                "1s",
                "--loads",
                "none",
                "--senders",
                "penstock,usleep,nanosleep",
            ],
            estimate_s: [900, 230, 8],
            traces: true,
        },
        Entry {
            name: "isolation",
            subcommand: &["isolation"],
            // MARS Table 2's columns: 1, 4 and 32 rt streams.
            full: &["--rt-streams", "1,4,32"],
            quick: &["--size", "200MB"],
            smoke: &["--size", "20MB", "--readers", "0,2"],
            estimate_s: [720, 40, 15],
            traces: false,
        },
        Entry {
            name: "rtu",
            subcommand: &["rtu"],
            full: &[],
            quick: &["--duration", "4s"],
            smoke: &["--duration", "1s"],
            estimate_s: [45, 20, 6],
            traces: false,
        },
        Entry {
            name: "stripe",
            subcommand: &["stripe"],
            full: &[],
            quick: &["--size", "128MiB", "--reps", "1"],
            smoke: &["--size", "16MiB", "--reps", "1"],
            estimate_s: [60, 5, 5],
            traces: false,
        },
        Entry {
            name: "record",
            subcommand: &["record"],
            full: &[],
            quick: &["--duration", "5s", "--streams", "1,10,50"],
            smoke: &["--duration", "1s", "--streams", "1,2"],
            estimate_s: [300, 30, 10],
            traces: false,
        },
        Entry {
            name: "http",
            subcommand: &["http"],
            full: &[],
            quick: &["--quick", "--reps", "1", "--clients", "1,16,128"],
            smoke: &[
                "--quick",
                "--reps",
                "1",
                "--clients",
                "1,4",
                "--duration-s",
                "1",
            ],
            estimate_s: [500, 40, 15],
            traces: false,
        },
        Entry {
            name: "https",
            subcommand: &["https"],
            full: &[],
            quick: &["--quick", "--reps", "1"],
            smoke: &[
                "--quick",
                "--reps",
                "1",
                "--clients",
                "4",
                "--duration-s",
                "1",
            ],
            estimate_s: [260, 30, 10],
            traces: false,
        },
        Entry {
            name: "hls",
            subcommand: &["hls"],
            full: &[],
            quick: &["--quick"],
            smoke: &[
                "--quick",
                "--viewers",
                "4",
                "--duration-s",
                "2",
                "--title-s",
                "8",
            ],
            estimate_s: [420, 90, 25],
            traces: false,
        },
        Entry {
            name: "cues",
            subcommand: &["cues"],
            full: &[],
            quick: &[
                "--file-size",
                "128MiB",
                "--reps",
                "1",
                "--k",
                "1,4,16",
                "--t",
                "1ms,10ms",
                "--window",
                "1s",
            ],
            smoke: &[
                "--file-size",
                "8MiB",
                "--reps",
                "1",
                "--transfers",
                "2",
                "--k",
                "1,4",
                "--t",
                "10ms",
                "--window",
                "300ms",
            ],
            estimate_s: [240, 15, 15],
            traces: false,
        },
        Entry {
            name: "rtsp",
            subcommand: &["rtsp"],
            full: &[],
            // Steps of 1-16 sessions per server, 3 s each: GStreamer's one pipeline per
            // session keeps a step's start short enough.
            quick: &["--quick", "--max-sessions", "16"],
            smoke: &["--quick", "--max-sessions", "1", "--duration", "1s"],
            estimate_s: [400, 90, 30],
            traces: false,
        },
        Entry {
            // Issue 36's `bench mp4`, its RTSP half (the HLS half is `hls`'s MP4 rows).
            name: "mp4",
            subcommand: &["rtsp", "--media", "mp4"],
            full: &[],
            quick: &["--quick", "--max-sessions", "16"],
            smoke: &["--quick", "--max-sessions", "1", "--duration", "1s"],
            estimate_s: [400, 90, 30],
            traces: false,
        },
        Entry {
            name: "admission",
            subcommand: &["admission"],
            full: &[],
            // 1316-byte datagrams only (the case whose bound is the CPU), 4 s runs, two
            // forced steps beyond N_adm and two bisection probes.
            quick: &[
                "--duration",
                "4s",
                "--units",
                "1316",
                "--force-steps",
                "2",
                "--bisect-steps",
                "2",
            ],
            smoke: &[
                "--duration",
                "1s",
                "--units",
                "1316",
                "--force-steps",
                "1",
                "--bisect-steps",
                "0",
                "--streams-max",
                "8",
            ],
            estimate_s: [480, 100, 20],
            traces: false,
        },
    ]
}

pub fn run(a: AllArgs) -> Result<()> {
    let mode = if a.smoke {
        Mode::Smoke
    } else if a.quick {
        Mode::Quick
    } else {
        Mode::Full
    };
    let all = entries();
    for n in &a.only {
        if !all.iter().any(|e| e.name == n) {
            bail!(crate::Usage(format!(
                "--only: no bench {n:?} (the benches: {})",
                all.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let chosen: Vec<&Entry> = all
        .iter()
        .filter(|e| a.only.is_empty() || a.only.iter().any(|n| n == e.name))
        .collect();
    if a.list {
        for e in &chosen {
            println!(
                "{:<10} penstock {}  (~{} s)",
                e.name,
                e.argv(mode, Path::new("DIR")).join(" "),
                e.estimate(mode)
            );
        }
        return Ok(());
    }
    let Some(report) = a.report.as_deref() else {
        bail!(crate::Usage("--report DIR is needed".into()));
    };
    std::fs::create_dir_all(report).with_context(|| format!("creating {}", report.display()))?;
    let results = match &a.render {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let v: Value =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            if v["schema"] != SCHEMA {
                bail!(
                    "{}: schema {} (this build reads {SCHEMA})",
                    p.display(),
                    v["schema"]
                );
            }
            // The page links its results.json: keep one beside it.
            let beside = report.join("results.json");
            if std::fs::canonicalize(p).ok() != std::fs::canonicalize(&beside).ok() {
                std::fs::write(&beside, text)?;
            }
            v
        }
        None => {
            let v = run_benches(&chosen, mode, report)?;
            let text = serde_json::to_string_pretty(&v)? + "\n";
            std::fs::write(report.join("results.json"), text)?;
            v
        }
    };
    let sections = write_page(&results, report)?;
    let wall = results["wall_s"].as_f64().unwrap_or(0.0);
    eprintln!(
        "penstock bench all: {} benches ({}), wall time {:.0} s ({:.1} min); report in {}",
        sections.len(),
        mode_of(&results),
        wall,
        wall / 60.0,
        report.join("index.html").display()
    );
    for s in &sections {
        eprintln!("  {:<10} {}", s.name, s.verdict.line());
    }
    Ok(())
}

fn mode_of(results: &Value) -> String {
    results["mode"].as_str().unwrap_or("?").to_string()
}

/// Draws the plots and writes index.html; returns the sections (for the summary lines).
pub fn write_page(results: &Value, dir: &Path) -> Result<Vec<analysis::Section>> {
    let mut sections = Vec::new();
    for b in results["benches"].as_array().into_iter().flatten() {
        let mut s = analysis::section(b);
        s.plots = plots::draw(b, dir, &s.name).with_context(|| format!("plotting {}", s.name))?;
        sections.push(s);
    }
    let page = html::page(results, &sections);
    std::fs::write(dir.join("index.html"), page)?;
    Ok(sections)
}

/// Runs the benches one after another and gathers their JSON.
fn run_benches(chosen: &[&Entry], mode: Mode, dir: &Path) -> Result<Value> {
    for sub in ["logs", "raw", "traces"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let started = Instant::now();
    let started_utc = humantime_utc();
    let machine_start = machine::describe(dir);
    let commit = machine::commit();
    let total_est: u64 = chosen.iter().map(|e| e.estimate(mode)).sum();
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(total_est.max(1));
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut done_est = 0u64;
    let mut done_real = 0.0f64;
    let mut benches = Vec::new();
    for (i, e) in chosen.iter().enumerate() {
        let argv = e.argv(mode, dir);
        let log_path = dir.join("logs").join(format!("{}.log", e.name));
        let json_path = dir.join("raw").join(format!("{}.json", e.name));
        let _ = std::fs::remove_file(&json_path);
        let log = std::fs::File::create(&log_path)?;
        let est = e.estimate(mode);
        let remaining_after: u64 = chosen[i + 1..].iter().map(|e| e.estimate(mode)).sum();
        // Every bench bounds its own waits; this bound catches one that hangs anyway.
        let limit = Duration::from_secs(est * 4 + 300);
        let line = format!(
            "[{}/{}] bench {} (expected ~{} s)",
            i + 1,
            chosen.len(),
            e.name,
            est
        );
        match &bar {
            Some(b) => b.println(&line),
            None => eprintln!("penstock bench all: {line}"),
        }
        let t0 = Instant::now();
        let mut child = Command::new(&exe)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break Some(s);
            }
            let el = t0.elapsed();
            if el > limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            if let Some(b) = &bar {
                // Remaining: this bench's expected rest and the others', scaled by how the
                // finished benches compared with their estimates.
                let scale = if done_est > 0 {
                    (done_real / done_est as f64).clamp(0.3, 5.0)
                } else {
                    1.0
                };
                let cur_left = (est as f64 * scale - el.as_secs_f64()).max(0.0);
                let left = cur_left + remaining_after as f64 * scale;
                b.set_position((done_est + est.min(el.as_secs())).min(total_est));
                b.set_message(format!(
                    "{} ({}/{}), ~{} left",
                    e.name,
                    i + 1,
                    chosen.len(),
                    fmt_secs(left)
                ));
                b.tick();
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let secs = t0.elapsed().as_secs_f64();
        done_est += est;
        done_real += secs;
        let exit_code = status.and_then(|s| s.code());
        let result: Value = std::fs::read_to_string(&json_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let traces = if e.traces {
            collect_traces(dir, e.name)?
        } else {
            Value::Null
        };
        let tail = log_tail(&log_path, 12);
        let outcome = match (status, exit_code) {
            (None, _) => format!("killed after {:.0} s (limit {:?})", secs, limit),
            (Some(_), Some(0)) => format!("done in {secs:.0} s"),
            (Some(_), c) => format!("exit {c:?} after {secs:.0} s"),
        };
        match &bar {
            Some(b) => b.println(format!("  {}: {outcome}", e.name)),
            None => eprintln!("penstock bench all:   {}: {outcome}", e.name),
        }
        let mut shown = vec!["penstock".to_string()];
        shown.extend(e.argv(mode, Path::new(".")).into_iter().map(|a| {
            // The page shows paths relative to the report directory.
            a.strip_prefix("./").map(str::to_string).unwrap_or(a)
        }));
        benches.push(json!({
            "name": e.name,
            "command": shown.join(" "),
            "exit_code": exit_code,
            "killed": status.is_none(),
            "seconds": secs,
            "estimate_s": est,
            "log": format!("logs/{}.log", e.name),
            "log_tail": tail,
            "result": result,
            "traces": traces,
        }));
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut machine = machine_start;
    machine["load_average_end"] = json!(machine::loadavg());
    Ok(json!({
        "schema": SCHEMA,
        "mode": mode.name(),
        "started_utc": started_utc,
        "wall_s": started.elapsed().as_secs_f64(),
        "penstock_version": env!("CARGO_PKG_VERSION"),
        "commit": commit,
        "machine": machine,
        "benches": benches,
    }))
}

fn fmt_secs(s: f64) -> String {
    let s = s.round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn humantime_utc() -> String {
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn log_tail(path: &Path, lines: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The lateness distribution of each 1-stream trace the bench wrote: its quantiles (for the
/// CDF) and every unit's lateness in sequence order up to a bound (for Roadrunner's Figure 2),
/// so that the page can be drawn again from results.json alone.
fn collect_traces(dir: &Path, bench: &str) -> Result<Value> {
    /// Units per trace kept for the scatter (Roadrunner's figure shows 10,000).
    const SCATTER_UNITS_MAX: usize = 10_000;
    let mut out = serde_json::Map::new();
    let tdir = dir.join("traces");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tdir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "csv")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(bench))
        })
        .collect();
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p)?;
        let mut lateness: Vec<(u64, i64)> = Vec::new();
        for line in text.lines().skip(1) {
            if let Ok(r) = penstock_core::lateness::TraceRecord::from_csv_line(line) {
                lateness.push((r.seq, r.lateness_ns()));
            }
        }
        lateness.sort_by_key(|x| x.0);
        let mut sorted: Vec<i64> = lateness.iter().map(|x| x.1).collect();
        sorted.sort_unstable();
        let cdf = analysis::quantiles(&sorted, 200);
        let scatter: Vec<i64> = lateness
            .iter()
            .take(SCATTER_UNITS_MAX)
            .map(|x| x.1)
            .collect();
        let key = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("trace")
            .to_string();
        out.insert(
            key,
            json!({"file": format!("traces/{}", p.file_name().and_then(|n| n.to_str()).unwrap_or("")),
                   "units": sorted.len(), "cdf_ns": cdf, "lateness_ns_by_seq": scatter}),
        );
    }
    Ok(Value::Object(out))
}
