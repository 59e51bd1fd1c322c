//! From one bench's JSON to its section of the page: what the paper measured (its own
//! numbers, labelled as the paper's), what this run measured, the ratio, and the verdict.
//!
//! Pure: a `results.json` entry in, a [`Section`] out; no clock, no file. The verdict rules
//! are [`judge`] and [`combine`], tested below on recorded figures.

use serde_json::Value;

/// How a measured figure compares with the paper's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum VerdictKind {
    /// The bench did not run or wrote no figures.
    NotRun,
    FallsShort,
    Matches,
    Beats,
}

impl VerdictKind {
    pub fn word(self) -> &'static str {
        match self {
            VerdictKind::NotRun => "not run",
            VerdictKind::FallsShort => "falls short",
            VerdictKind::Matches => "matches",
            VerdictKind::Beats => "beats",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// The figures that decided it.
    pub why: String,
}

impl Verdict {
    pub fn line(&self) -> String {
        format!("{}: {}", self.kind.word(), self.why)
    }
    fn not_run(why: impl Into<String>) -> Verdict {
        Verdict {
            kind: VerdictKind::NotRun,
            why: why.into(),
        }
    }
}

/// `measured` against `paper` (both ratios or both rates, same direction): within `tol`
/// (a fraction of the paper's figure) matches, better beats, worse falls short.
/// `higher_is_better` says the direction. `what` names the figure in the reason.
pub fn judge(measured: f64, paper: f64, tol: f64, higher_is_better: bool, what: &str) -> Verdict {
    let (better, worse) = if higher_is_better {
        (
            measured > paper * (1.0 + tol),
            measured < paper * (1.0 - tol),
        )
    } else {
        (
            measured < paper * (1.0 - tol),
            measured > paper * (1.0 + tol),
        )
    };
    let kind = if !measured.is_finite() {
        VerdictKind::NotRun
    } else if better {
        VerdictKind::Beats
    } else if worse {
        VerdictKind::FallsShort
    } else {
        VerdictKind::Matches
    };
    Verdict {
        kind,
        why: format!(
            "{what}: {} here against the paper's {}",
            fmt(measured),
            fmt(paper)
        ),
    }
}

/// Reasons a combined verdict quotes; the rest are counted (the table has every figure).
const REASONS_MAX: usize = 3;

/// The worst of several verdicts, with the reasons of those at that level (the first
/// [`REASONS_MAX`], and how many more).
pub fn combine(vs: &[Verdict]) -> Verdict {
    let Some(worst) = vs.iter().map(|v| v.kind).min() else {
        return Verdict::not_run("no figures");
    };
    let at: Vec<&str> = vs
        .iter()
        .filter(|v| v.kind == worst)
        .map(|v| v.why.as_str())
        .collect();
    let mut why = at[..at.len().min(REASONS_MAX)].join("; ");
    if at.len() > REASONS_MAX {
        why.push_str(&format!(
            "; and {} more such cells (see the table)",
            at.len() - REASONS_MAX
        ));
    }
    Verdict { kind: worst, why }
}

/// A figure with three significant digits.
pub fn fmt(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// `n` evenly spaced quantiles (0 to 1 inclusive) of sorted samples.
pub fn quantiles(sorted: &[i64], n: usize) -> Vec<i64> {
    if sorted.is_empty() || n < 2 {
        return sorted.to_vec();
    }
    (0..n)
        .map(|i| sorted[(i * (sorted.len() - 1)) / (n - 1)])
        .collect()
}

/// One section of the page.
#[derive(Debug)]
pub struct Section {
    pub name: String,
    pub title: String,
    /// (what the paper measured, its number) — the papers' own figures.
    pub paper: Vec<(String, String)>,
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// The ratio(s) that compare the run with the paper.
    pub ratio: String,
    pub verdict: Verdict,
    pub notes: Vec<String>,
    /// SVG file names beside index.html.
    pub plots: Vec<String>,
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

fn s(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        x => x.to_string(),
    }
}

fn rows_of(r: &Value) -> &[Value] {
    r["rows"].as_array().map_or(&[], Vec::as_slice)
}

/// The section of one `results.json` bench entry.
pub fn section(b: &Value) -> Section {
    let name = b["name"].as_str().unwrap_or("?").to_string();
    let r = &b["result"];
    let mut sec = Section {
        title: name.clone(),
        name: name.clone(),
        paper: Vec::new(),
        head: Vec::new(),
        rows: Vec::new(),
        ratio: String::new(),
        verdict: Verdict::not_run(""),
        notes: Vec::new(),
        plots: Vec::new(),
    };
    match name.as_str() {
        "paths" => paths(r, &mut sec),
        "periodic" => periodic(r, b, &mut sec),
        "isolation" => isolation(r, &mut sec),
        "rtu" => rtu(r, &mut sec),
        "stripe" => stripe(r, &mut sec),
        "record" => record(r, &mut sec),
        "http" => http(r, &mut sec, false),
        "https" => http(r, &mut sec, true),
        "hls" => hls(r, &mut sec),
        "cues" => cues(r, &mut sec),
        "rtsp" | "mp4" => rtsp(r, &mut sec),
        "admission" => admission(r, &mut sec),
        _ => {
            sec.title = format!("{name} (no analysis in this build: its JSON is in results.json)");
        }
    }
    if r.is_null() || sec.rows.is_empty() {
        let tail = b["log_tail"]
            .as_array()
            .and_then(|t| {
                t.iter()
                    .rev()
                    .find_map(|l| l.as_str().filter(|l| !l.trim().is_empty()))
            })
            .unwrap_or("no output")
            .to_string();
        sec.verdict = Verdict::not_run(format!(
            "exit {}, no figures; the log's last line: {tail}",
            b["exit_code"]
        ));
    }
    for l in b["log_tail"].as_array().into_iter().flatten() {
        if let Some(l) = l
            .as_str()
            .filter(|l| l.contains("FAILED") || l.contains("SKIPPED"))
        {
            sec.notes.push(format!("log: {}", l.trim()));
        }
    }
    sec
}

fn paths(r: &Value, sec: &mut Section) {
    sec.title = "Data paths — MARS Table 1".into();
    sec.paper = vec![
        (
            "MARS Table 1: stream read/send (mmbuf, zero copy) on a 2-disk ccd, 32 KB chunks, 40-360 MB files".into(),
            "17.65 MB/s = 1.10× read/send on the same ccd (16.06 MB/s); read/send on one disk 10.90 MB/s".into(),
        ),
    ];
    let rows = rows_of(r);
    let size = rows
        .iter()
        .filter_map(|x| x["size"].as_u64())
        .max()
        .unwrap_or(0);
    let at = |path: &str, cache: &str| {
        rows.iter()
            .find(|x| x["size"].as_u64() == Some(size) && x["path"] == path && x["cache"] == cache)
    };
    sec.head = [
        "path",
        "cache",
        "MB/s",
        "CPU s/GB",
        "MB/s × copy",
        "CPU/GB × copy",
    ]
    .map(String::from)
    .to_vec();
    for cache in ["cold", "hot"] {
        let copy = at("copy", cache);
        for x in rows
            .iter()
            .filter(|x| x["size"].as_u64() == Some(size) && x["cache"] == cache)
        {
            let (mbs, cpu) = (f(x, "mb_per_s_median"), f(x, "cpu_s_per_gb_median"));
            let (rm, rc) = copy.map_or((f64::NAN, f64::NAN), |c| {
                (
                    mbs / f(c, "mb_per_s_median"),
                    cpu / f(c, "cpu_s_per_gb_median"),
                )
            });
            sec.rows.push(vec![
                s(x, "path"),
                cache.into(),
                fmt(mbs),
                fmt(cpu),
                fmt(rm),
                fmt(rc),
            ]);
        }
    }
    // The paper's comparison: the zero-copy stream path against read/send on the same
    // device, cold (from the disk) where measured.
    let cache = if at("copy", "cold").is_some() {
        "cold"
    } else {
        "hot"
    };
    let copy = at("copy", cache).map_or(f64::NAN, |c| f(c, "mb_per_s_median"));
    let best = ["sendfile", "splice", "uring", "uring keep"]
        .iter()
        .filter_map(|p| at(p, cache).map(|x| (*p, f(x, "mb_per_s_median"))))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((p, mbs)) = best {
        let m = mbs / copy;
        sec.ratio = format!(
            "{cache}, {} MB: best zero-copy path ({p}) {} MB/s / copy {} MB/s = {}× (paper: 1.10×)",
            size / 1_000_000,
            fmt(mbs),
            fmt(copy),
            fmt(m)
        );
        let mut v = judge(
            m,
            1.10,
            0.05,
            true,
            &format!("{p} / copy throughput ({cache})"),
        );
        if v.kind == VerdictKind::FallsShort
            && let Some(fail) = r["verdicts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .find(|l| l.starts_with("FAIL") && l.contains(cache))
        {
            v.why.push_str(&format!("; the bench's own check: {fail}"));
        }
        sec.verdict = v;
    }
    for check in r["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        sec.notes.push(format!("the bench's own check: {check}"));
    }
    if let Some(dev) = at("O_DIRECT read (device rate)", "cold")
        && let Some(u) = at("uring", "cold")
    {
        sec.notes.push(format!(
            "uring (O_DIRECT) read {} MB/s = {}× the device's O_DIRECT read rate measured in the same run ({} MB/s){}",
            fmt(f(u, "mb_per_s_median")),
            fmt(f(u, "mb_per_s_median") / f(dev, "mb_per_s_median")),
            fmt(f(dev, "mb_per_s_median")),
            r["depth"].as_u64().map_or(String::new(), |d| format!(
                "; the engine's read depth on this device {d} ({}){}",
                r["depth_from"].as_str().unwrap_or("?"),
                r["reads_in_flight_max"]
                    .as_u64()
                    .map_or(String::new(), |m| format!(", at most {m} reads in flight"))
            ))
        ));
    }
}

fn us(ns: f64) -> f64 {
    ns / 1e3
}

fn periodic(r: &Value, b: &Value, sec: &mut Section) {
    sec.title = "Periodic streams — Roadrunner Figure 2".into();
    sec.paper = vec![(
        "Roadrunner Fig. 2: one 30 packet/s stream of 1 KiB UDP packets from a file; lateness from the start of each period to the end of the UDP write, first 10,000 packets".into(),
        "BSD usleep() loop: diagonal bands of late packets (the sleep's inaccuracy); Roadrunner's periodic stream: flat and bounded (a figure; the text gives no number)".into(),
    )];
    sec.head = [
        "streams",
        "load",
        "sender",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "misses",
        "lost",
        "CPU %",
        "worker CPU wait %",
    ]
    .map(String::from)
    .to_vec();
    let rows = rows_of(r);
    for x in rows {
        sec.rows.push(vec![
            s(x, "streams"),
            s(x, "load"),
            s(x, "sender"),
            fmt(us(f(x, "p50_ns"))),
            fmt(us(f(x, "p99_ns"))),
            fmt(us(f(x, "p999_ns"))),
            fmt(us(f(x, "max_ns"))),
            format!("{} / {}", s(x, "misses"), s(x, "units")),
            s(x, "lost"),
            fmt(f(x, "cpu_percent")),
            opt(x, "worker_wait_percent"),
        ]);
    }
    let find = |n: &Value, load: &Value, sender: &str| {
        rows.iter()
            .find(|x| &x["streams"] == n && &x["load"] == load && x["sender"] == sender)
    };
    let mut verdicts = Vec::new();
    let mut ratios = Vec::new();
    for x in rows.iter().filter(|x| x["sender"] == "penstock") {
        let (n, load) = (&x["streams"], &x["load"]);
        let cell = format!("N={n} load={}", load.as_str().unwrap_or("?"));
        let p = f(x, "p99_ns");
        if x["misses"].as_u64().unwrap_or(0) > 0 || x["lost"].as_u64().unwrap_or(0) > 0 {
            verdicts.push(Verdict {
                kind: VerdictKind::FallsShort,
                why: format!(
                    "{cell}: penstock missed {} of {} units (later than a period), {} lost{}",
                    s(x, "misses"),
                    s(x, "units"),
                    s(x, "lost"),
                    periodic_cause(x, find(n, load, "penstock-rt"))
                ),
            });
        }
        if let Some(u) = find(n, load, "usleep") {
            let m = p / f(u, "p99_ns");
            ratios.push(format!("{cell}: p99 penstock/usleep {}", fmt(m)));
            // The paper's claim: the stream engine's lateness is below the sleep loop's.
            verdicts.push(if m <= 1.0 {
                Verdict {
                    kind: VerdictKind::Matches,
                    why: format!(
                        "{cell}: p99 {} µs ≤ the usleep loop's {} µs",
                        fmt(us(p)),
                        fmt(us(f(u, "p99_ns")))
                    ),
                }
            } else {
                Verdict {
                    kind: VerdictKind::FallsShort,
                    why: format!(
                        "{cell}: p99 {} µs > the usleep loop's {} µs",
                        fmt(us(p)),
                        fmt(us(f(u, "p99_ns")))
                    ),
                }
            });
        }
        if let Some(t) = find(n, load, "nanosleep") {
            let m = p / f(t, "p99_ns");
            ratios.push(format!("{cell}: p99 penstock/nanosleep {}", fmt(m)));
            if m <= 1.0 {
                verdicts.push(Verdict {
                    kind: VerdictKind::Beats,
                    why: format!(
                        "{cell}: p99 {} µs ≤ absolute nanosleep threads' {} µs too",
                        fmt(us(p)),
                        fmt(us(f(t, "p99_ns")))
                    ),
                });
            }
        }
    }
    // Beats only when every cell beats (both baselines), else the worst cell decides.
    let all_beat = !verdicts.is_empty()
        && rows.iter().filter(|x| x["sender"] == "penstock").all(|x| {
            let (n, load) = (&x["streams"], &x["load"]);
            verdicts.iter().any(|v| {
                v.kind == VerdictKind::Beats
                    && v.why
                        .starts_with(&format!("N={n} load={}:", load.as_str().unwrap_or("?")))
            })
        });
    let mut v = combine(
        &verdicts
            .iter()
            .filter(|v| v.kind != VerdictKind::Beats || all_beat)
            .cloned()
            .collect::<Vec<_>>(),
    );
    if v.kind == VerdictKind::Matches && all_beat {
        v.kind = VerdictKind::Beats;
    }
    if v.kind == VerdictKind::Beats {
        v.why = "penstock's p99 lateness ≤ the usleep loop's and the nanosleep threads' in every cell, no miss, no loss".into();
    }
    sec.verdict = v;
    sec.ratio = ratios.join("; ");
    if let Some(max_n) = rows
        .iter()
        .filter(|x| x["sender"] == "penstock")
        .filter_map(|x| x["streams"].as_u64())
        .max()
    {
        sec.notes.push(format!(
            "largest stream count penstock ran here: {max_n} (thread-per-stream baselines stop at 1,000)"
        ));
    }
    if b["traces"].as_object().is_some_and(|t| !t.is_empty()) {
        sec.notes.push(
            "CDFs and the Figure 2 scatter come from the 1-stream traces (traces/*.csv, also plottable with `penstock plot`)".into(),
        );
    }
}

/// Why a periodic cell fell short, from the same run: the same dispatcher with its workers at
/// SCHED_FIFO (`penstock-rt`) in the same cell, and how long the workers waited for a CPU.
fn periodic_cause(x: &Value, rt: Option<&Value>) -> String {
    let wait = x["worker_wait_percent"]
        .as_f64()
        .map(|w| format!("its worker waited for a CPU {}% of the run", fmt(w)));
    let rt_fig = rt.map(|t| {
        (
            t["misses"].as_u64().unwrap_or(0) + t["lost"].as_u64().unwrap_or(0),
            format!(
                "the same dispatcher at SCHED_FIFO (penstock-rt): {} missed, p99 {} µs{}",
                s(t, "misses"),
                fmt(us(f(t, "p99_ns"))),
                t["worker_wait_percent"]
                    .as_f64()
                    .map_or(String::new(), |w| format!(", CPU wait {}%", fmt(w)))
            ),
        )
    });
    let mut parts: Vec<String> = wait.into_iter().collect();
    let verdict = match &rt_fig {
        Some((0, fig)) => {
            parts.push(fig.clone());
            " → the machine's CPU (the worker's wait to run), not the dispatcher"
        }
        Some((_, fig)) => {
            parts.push(fig.clone());
            ""
        }
        None => "",
    };
    if parts.is_empty() {
        return String::new();
    }
    format!(" — {}{verdict}", parts.join("; "))
}

/// The rt streams of an isolation row (1 in reports made before `--rt-streams`).
fn rt_streams(x: &Value) -> u64 {
    x["rt_streams"].as_u64().unwrap_or(1)
}

fn isolation(r: &Value, sec: &mut Section) {
    sec.title = "Real-time stream under background readers — MARS Table 2".into();
    sec.paper = vec![
        (
            "MARS Table 2: 400 MB read and sent under n background read() processes (2-disk ccd)".into(),
            "read/send: 22.0 s alone → 567 s with 6 readers (25.8×); 4 stream reads: 21.44 s → 22.40 s (1.04×); 32 stream reads: 20.38 s → 21.14 s (1.04×)".into(),
        ),
    ];
    sec.head = [
        "background",
        "sched",
        "rt streams",
        "readers",
        "rt seconds",
        "late units",
        "p99 ms",
        "background MB/s",
        "worker CPU wait ms",
        "disk ms/read",
    ]
    .map(String::from)
    .to_vec();
    let rows = rows_of(r);
    for x in rows {
        sec.rows.push(vec![
            s(x, "background"),
            s(x, "sched"),
            rt_streams(x).to_string(),
            s(x, "readers"),
            fmt(f(x, "seconds")),
            format!("{} / {}", s(x, "misses"), s(x, "units")),
            fmt(f(x, "p99_ms")),
            fmt(f(x, "background_mb_s")),
            opt(x, "worker_wait_ms"),
            opt(x, "disk_read_ms"),
        ]);
    }
    let mut vs = Vec::new();
    let mut ratios = Vec::new();
    // The rt stream's slack and the longest a read of it can wait behind reads already in the
    // device (DRR orders what it submits; it does not preempt what the device holds).
    let unit = f(r, "unit_bytes");
    let period_ms = Some(unit / f(r, "rate_bytes_per_s") * 1e3).filter(|p| p.is_finite());
    let slack_ms = period_ms.map(|p| p * f(r, "stream_depth"));
    let queue_ms = f(r, "disk_inflight_max") * unit / f(r, "device_rate_bytes_per_s") * 1e3;
    let wait_bound = match slack_ms {
        Some(sl) if sl.is_finite() && queue_ms.is_finite() => format!(
            " — a rt read may queue behind {} bulk reads of {} MiB already in the device ({} ms at the device's {} MB/s) against a read-ahead of {} units = {} ms of slack{}",
            s(r, "disk_inflight_max"),
            fmt(unit / f64::from(1u32 << 20)),
            fmt(queue_ms),
            fmt(f(r, "device_rate_bytes_per_s") / 1e6),
            s(r, "stream_depth"),
            fmt(sl),
            if queue_ms > sl {
                ": the bound exceeds the slack"
            } else {
                ""
            }
        ),
        _ => String::new(),
    };
    let mut ks: Vec<u64> = rows.iter().map(rt_streams).collect();
    ks.sort_unstable();
    ks.dedup();
    for (bg, sched, k) in ["penstock bulk streams", "read() processes"]
        .into_iter()
        .flat_map(|bg| ["drr", "fifo"].into_iter().map(move |sc| (bg, sc)))
        .flat_map(|(bg, sc)| ks.iter().map(move |&k| (bg, sc, k)))
    {
        // One rt stream is the table's first column; k > 1 says so in each line.
        let streams = if k == 1 {
            String::new()
        } else {
            format!(" ({k} rt streams)")
        };
        {
            let cell: Vec<&Value> = rows
                .iter()
                .filter(|x| x["background"] == bg && x["sched"] == sched && rt_streams(x) == k)
                .collect();
            let base = cell.iter().find(|x| x["readers"].as_u64() == Some(0));
            let top = cell
                .iter()
                .max_by_key(|x| x["readers"].as_u64().unwrap_or(0));
            if let (Some(b0), Some(t)) = (base, top) {
                let m = f(t, "seconds") / f(b0, "seconds");
                ratios.push(format!(
                    "{sched}{streams}, {} {bg}: {}× the time alone",
                    s(t, "readers"),
                    fmt(m)
                ));
                if sched == "drr" {
                    vs.push(judge(
                        m,
                        1.04,
                        0.05,
                        false,
                        &format!("rt time{streams} with {} {bg} / alone", s(t, "readers")),
                    ));
                    // A paced stream takes its time whatever happens; its late units say
                    // whether it kept its schedule.
                    for x in &cell {
                        let late = x["misses"].as_u64().unwrap_or(0);
                        if late > 0 {
                            vs.push(Verdict {
                                kind: VerdictKind::FallsShort,
                                why: format!(
                                    "{}{streams}: {late} of {} rt units later than a period{} (p99 {} ms){}",
                                    if x["readers"].as_u64() == Some(0) {
                                        "with no background reader at all".to_string()
                                    } else {
                                        format!("{} {bg}", s(x, "readers"))
                                    },
                                    s(x, "units"),
                                    period_ms.map_or(String::new(), |p| format!(" of {} ms", fmt(p * k as f64))),
                                    fmt(f(x, "p99_ms")),
                                    if bg == "read() processes" {
                                        " (other processes: the kernel's I/O scheduler orders their reads, not penstock's DRR)".to_string()
                                    } else {
                                        cpu_or_disk(x, period_ms)
                                    }
                                ),
                            });
                        }
                    }
                }
            }
        }
    }
    sec.ratio = ratios.join("; ");
    sec.verdict = combine(&vs);
    if r["realtime"].as_bool() == Some(true) {
        sec.notes.push(
            "the engine's worker ran at SCHED_FIFO (--realtime): its CPU wait is the kernel's, not other work's".into(),
        );
    }
    if sec.verdict.kind == VerdictKind::FallsShort && !wait_bound.is_empty() {
        sec.verdict.why.push_str(&wait_bound);
    }
    if !wait_bound.is_empty() {
        sec.notes.push(format!(
            "From this run's figures{wait_bound}. Kernel I/O scheduler: {}.",
            r["kernel_scheduler"].as_str().unwrap_or("?")
        ));
    }
}

/// A number field, or "–" when the run did not record it (older results).
fn opt(v: &Value, k: &str) -> String {
    v[k].as_f64().map_or("–".into(), fmt)
}

/// A late rt row's split between CPU and disk, from its figures: how long the engine's worker
/// waited for a CPU (runnable, not running) against the device's time per read, each against
/// the stream's period. Empty when the row has neither figure.
fn cpu_or_disk(x: &Value, period_ms: Option<f64>) -> String {
    let (Some(w), Some(d)) = (x["worker_wait_ms"].as_f64(), x["disk_read_ms"].as_f64()) else {
        return String::new();
    };
    let run_ms = f(x, "seconds") * 1e3;
    let share = w / run_ms * 100.0;
    let per = period_ms.filter(|p| *p > 0.0);
    let cause = match per {
        Some(p) if d >= p => "disk: a read alone takes longer than a period",
        Some(_) if share >= 5.0 => "CPU: the worker waited for a CPU, reads stayed within a period",
        Some(_) => "neither figure alone exceeds its budget",
        None => "",
    };
    format!(
        " — CPU: the engine's worker waited {} ms for a CPU ({}% of the run); disk: {} ms per read{}{}",
        fmt(w),
        fmt(share),
        fmt(d),
        per.map_or(String::new(), |p| format!(
            " ({} of the period)",
            fmt(d / p)
        )),
        if cause.is_empty() {
            String::new()
        } else {
            format!(" → {cause}")
        }
    )
}

fn rtu(r: &Value, sec: &mut Section) {
    sec.title = "Three periodic streams — MARS Table 3".into();
    sec.paper = vec![(
        "MARS Table 3: three streams with RTU periods 60, 75, 120 ms, with and without CPU-bound background load".into(),
        "8.536, 6.824, 4.264 Mbit/s (60 ms / 120 ms = 2.00×); no deadline missed in either case".into(),
    )];
    sec.head = [
        "load",
        "order",
        "period ms",
        "implied MB/s",
        "achieved MB/s",
        "misses",
        "p99 ms",
        "bytes exact",
    ]
    .map(String::from)
    .to_vec();
    let rows = rows_of(r);
    for x in rows {
        sec.rows.push(vec![
            s(x, "load"),
            s(x, "order"),
            s(x, "period_ms"),
            fmt(f(x, "implied_mb_s")),
            fmt(f(x, "achieved_mb_s")),
            format!("{} / {}", s(x, "misses"), s(x, "units")),
            fmt(f(x, "p99_ms")),
            s(x, "received_exact"),
        ]);
    }
    let mut vs = Vec::new();
    let mut ratios = Vec::new();
    for x in rows {
        let cell = format!(
            "{} {} {} ms",
            s(x, "load"),
            s(x, "order"),
            s(x, "period_ms")
        );
        if x["misses"].as_u64().unwrap_or(0) > 0 || x["received_exact"] == false {
            vs.push(Verdict {
                kind: VerdictKind::FallsShort,
                why: format!(
                    "{cell}: {} missed of {}, bytes exact: {}",
                    s(x, "misses"),
                    s(x, "units"),
                    s(x, "received_exact")
                ),
            });
        } else if f(x, "achieved_mb_s") < 0.98 * f(x, "implied_mb_s") {
            vs.push(Verdict {
                kind: VerdictKind::FallsShort,
                why: format!(
                    "{cell}: achieved {} MB/s < 98% of the {} MB/s its period implies",
                    fmt(f(x, "achieved_mb_s")),
                    fmt(f(x, "implied_mb_s"))
                ),
            });
        }
    }
    for load in ["none", "cpu"] {
        let get = |p: u64| {
            rows.iter()
                .find(|x| {
                    x["load"] == load && x["order"] == "edf" && x["period_ms"].as_u64() == Some(p)
                })
                .map(|x| f(x, "achieved_mb_s"))
        };
        if let (Some(a), Some(c)) = (get(60), get(120)) {
            ratios.push(format!(
                "load {load}: 60 ms / 120 ms throughput {}× (paper 2.00×)",
                fmt(a / c)
            ));
            vs.push(judge(
                a / c,
                2.0,
                0.03,
                true,
                &format!("load {load}: 60 ms / 120 ms throughput"),
            ));
        }
    }
    // A ratio above 2 only means rounding of the units per period: never "beats".
    let mut v = combine(&vs);
    if v.kind == VerdictKind::Beats {
        v.kind = VerdictKind::Matches;
    }
    if v.kind == VerdictKind::Matches {
        v.why = format!(
            "no deadline missed in {} runs, each stream at its period's rate; {}",
            rows.len(),
            v.why
        );
    }
    sec.ratio = ratios.join("; ");
    sec.verdict = v;
}

fn stripe(r: &Value, sec: &mut Section) {
    sec.title = "Striping — Clockwise Figure 1, MARS ccd".into();
    sec.paper = vec![
        (
            "Clockwise §2 / Fig. 1: read throughput of 1-4 disks, one per controller".into(),
            "2.0×, 2.95×, 3.9× one disk's for 2, 3, 4 disks".into(),
        ),
        (
            "MARS Table 1: a 2-disk ccd against one disk".into(),
            "+47% (read/send), +60% (stream read/send)".into(),
        ),
    ];
    sec.head = [
        "members",
        "read MB/s",
        "read × 1 member",
        "paper ×",
        "read CPU s/GB",
        "write MB/s",
        "write × 1 member",
        "write CPU s/GB",
    ]
    .map(String::from)
    .to_vec();
    let paper = |k: u64| match k {
        1 => 1.0,
        2 => 2.0,
        3 => 2.95,
        4 => 3.9,
        _ => f64::NAN,
    };
    let rows = rows_of(r);
    for x in rows {
        let k = x["members"].as_u64().unwrap_or(0);
        sec.rows.push(vec![
            k.to_string(),
            fmt(f(x, "mb_per_s")),
            fmt(f(x, "ratio_to_1")),
            fmt(paper(k)),
            fmt(f(x, "cpu_s_per_gb")),
            fmt(f(x, "write_mb_per_s")),
            fmt(f(x, "write_ratio_to_1")),
            fmt(f(x, "write_cpu_s_per_gb")),
        ]);
    }
    let mode = r["members"].as_str().unwrap_or("").to_string();
    sec.notes.push(format!("members: {mode}"));
    let writes = rows.iter().any(|x| x.get("write_mb_per_s").is_some());
    if writes {
        sec.notes.push(format!(
            "writes: a file in the page cache streamed into the partition, timed up to the members synced; \
             the same stream into a plain file on the members' disk (not throttled, synced): {} MB/s",
            fmt(f(r, "plain_file_write_mb_per_s"))
        ));
    } else {
        sec.notes
            .push("writes to a striped partition were not measured in this run (recorded before the bench wrote)".into());
    }
    if let Some(top) = rows
        .iter()
        .max_by_key(|x| x["members"].as_u64().unwrap_or(0))
    {
        let k = top["members"].as_u64().unwrap_or(0);
        let m = f(top, "ratio_to_1");
        let w = f(top, "write_ratio_to_1");
        sec.ratio = format!(
            "{k} members: reads {}× one member's throughput (paper {}×)",
            fmt(m),
            fmt(paper(k))
        );
        if writes {
            sec.ratio += &format!("; writes {}× (linear: {k}×)", fmt(w));
        }
        let read = judge(
            m,
            paper(k),
            0.1,
            true,
            &format!("{k}-member / 1-member read throughput"),
        );
        // Writes: the papers give no figure; the bar is the members' own, linear in k (each
        // member takes its stripe units at its rate), with the read bar's tolerance. A ratio
        // beyond it is the members, not striping: matches.
        let mut v = if writes {
            let mut wv = judge(
                w,
                k as f64,
                0.1,
                true,
                &format!("{k}-member / 1-member write throughput (linear: {k}×)"),
            );
            if wv.kind == VerdictKind::Beats {
                wv.kind = VerdictKind::Matches;
            }
            combine(&[read, wv])
        } else {
            read
        };
        if m > k as f64 * 1.1 || (writes && w > k as f64 * 1.1) {
            v = Verdict::not_run(format!(
                "{}× (reads), {}× (writes) with {k} members: beyond linear, one member's run was not bound by its device (too small a --size for the throttle?), so the ratio means nothing",
                fmt(m),
                fmt(w)
            ));
        } else if mode.starts_with("plain files") {
            v = Verdict::not_run(format!(
                "members are plain sparse files, not independent devices: {} only shows the striping overhead",
                v.why
            ));
        }
        sec.verdict = v;
    }
}

fn record(r: &Value, sec: &mut Section) {
    sec.title = "Recording — Clockwise".into();
    sec.paper = vec![(
        "Clockwise: simultaneous recording and playback of media streams of 1-8 Mbit/s (goal set before measuring)".into(),
        "20 streams (the authors then expected 60 eight-Mbit/s streams on 622 Mbit/s ATM)".into(),
    )];
    sec.head = [
        "streams",
        "sent",
        "recorded",
        "intact streams",
        "lost streams",
        "socket drops",
        "sender misses",
        "sender p99 µs",
        "CPU s",
    ]
    .map(String::from)
    .to_vec();
    let rows = rows_of(r);
    let mut intact_max = 0u64;
    let mut first_bad: Option<String> = None;
    for x in rows {
        let n = x["streams"].as_u64().unwrap_or(0);
        let ok = x["identical"].as_u64() == Some(n)
            && x["lost_streams"].as_u64() == Some(0)
            && x["socket_drops"].as_u64() == Some(0);
        if ok {
            intact_max = intact_max.max(n);
        } else if first_bad.is_none() {
            first_bad = Some(format!(
                "{n} streams: {} identical, {} lost, {} socket drops",
                s(x, "identical"),
                s(x, "lost_streams"),
                s(x, "socket_drops")
            ));
        }
        sec.rows.push(vec![
            n.to_string(),
            s(x, "sent"),
            s(x, "recorded"),
            s(x, "identical"),
            s(x, "lost_streams"),
            s(x, "socket_drops"),
            s(x, "sender_misses"),
            fmt(f(x, "sender_p99_us")),
            fmt(f(x, "cpu_s")),
        ]);
    }
    let tried_max = rows
        .iter()
        .filter_map(|x| x["streams"].as_u64())
        .max()
        .unwrap_or(0);
    sec.ratio = format!(
        "{intact_max} streams recorded intact / the paper's 20 = {}×",
        fmt(intact_max as f64 / 20.0)
    );
    let mut v = judge(
        intact_max as f64,
        20.0,
        0.0,
        true,
        "streams recorded byte-identical, no drop",
    );
    if v.kind == VerdictKind::FallsShort {
        if tried_max < 20 && first_bad.is_none() {
            v = Verdict::not_run(format!(
                "this run tried at most {tried_max} streams (all intact): below the paper's 20, no verdict"
            ));
        } else if let Some(bad) = first_bad {
            v.why.push_str(&format!("; {bad}"));
        }
    }
    sec.verdict = v;
    if let Some(p) = r["playback"].as_object() {
        let g = |k: &str| p.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        sec.notes.push(format!(
            "playback of the recording by its time track: arrival jitter p50 {} µs, p99 {} µs (the original capture's: p50 {} µs, p99 {} µs)",
            fmt(g("playback_p50_us")),
            fmt(g("playback_p99_us")),
            fmt(g("baseline_p50_us")),
            fmt(g("baseline_p99_us"))
        ));
    }
}

/// `bench http` and (`tls`) `bench https`: penstock against nginx. Over TLS the CPU judged
/// is the machine's per GB (both sides encrypt or decrypt: issue 33 asks ≥ 0.95× nginx's
/// throughput at ≤ 1.05× its machine CPU per GB).
fn http(r: &Value, sec: &mut Section, tls: bool) {
    sec.title = if tls {
        "HTTPS against nginx (both servers over TLS)".into()
    } else {
        "HTTP against nginx".into()
    };
    let cpu_key = if tls {
        "machine_cpu_s_per_gb"
    } else {
        "cpu_s_per_gb"
    };
    sec.paper = vec![(
        "No paper measured HTTP. Nearest: Cues Table 1, an FTP server rebuilt on cue(), 12 MB files".into(),
        "4 clients: 360 KB/s with cue() (4,16) against 240 KB/s user-driven (1.50×); 1 client: 370 against 410 (0.90×)".into(),
    )];
    sec.head = [
        "file",
        "clients",
        "penstock MB/s",
        "nginx MB/s",
        "× nginx",
        if tls {
            "penstock machine CPU s/GB"
        } else {
            "penstock CPU s/GB"
        },
        if tls {
            "nginx machine CPU s/GB"
        } else {
            "nginx CPU s/GB"
        },
        "CPU × nginx",
        "errors p/n",
    ]
    .map(String::from)
    .to_vec();
    let rows = rows_of(r);
    let mut worst: Option<(f64, String)> = None;
    let mut worst_cpu: Option<(f64, String)> = None;
    for x in rows {
        let (p, n) = (&x["penstock"], &x["nginx"]);
        let t = f(p, "bytes_per_s") / f(n, "bytes_per_s");
        let c = f(p, cpu_key) / f(n, cpu_key);
        let cell = format!("{} file, {} clients", s(x, "file"), s(x, "clients"));
        if worst.as_ref().is_none_or(|w| t < w.0) {
            worst = Some((t, cell.clone()));
        }
        if c.is_finite() && worst_cpu.as_ref().is_none_or(|w| c > w.0) {
            worst_cpu = Some((c, cell.clone()));
        }
        sec.rows.push(vec![
            s(x, "file"),
            s(x, "clients"),
            fmt(f(p, "bytes_per_s") / 1e6),
            fmt(f(n, "bytes_per_s") / 1e6),
            fmt(t),
            fmt(f(p, cpu_key)),
            fmt(f(n, cpu_key)),
            fmt(c),
            format!("{}/{}", s(p, "errors"), s(n, "errors")),
        ]);
    }
    let mut vs = Vec::new();
    if let Some((t, cell)) = &worst {
        vs.push(judge(
            *t,
            1.0,
            0.1,
            true,
            &format!("lowest throughput × nginx ({cell})"),
        ));
    }
    if let Some((c, cell)) = &worst_cpu {
        vs.push(judge(
            *c,
            1.0,
            0.1,
            false,
            &format!("highest CPU/GB × nginx ({cell})"),
        ));
    }
    // No paper figure here: the target is parity with the peer.
    for v in &mut vs {
        v.why = v.why.replace("against the paper's", "against parity,");
    }
    sec.ratio = format!(
        "throughput penstock/nginx at worst {}; {} CPU per GB penstock/nginx at worst {} (target: parity, 1.0×, ±10%)",
        worst.map_or("n/a".into(), |w| fmt(w.0)),
        if tls { "machine" } else { "server" },
        worst_cpu.map_or("n/a".into(), |w| fmt(w.0))
    );
    sec.verdict = combine(&vs);
    if let Some(m) = r["machine"].as_str() {
        sec.notes.push(m.to_string());
    }
    if let Some(p) = r["placement"].as_str() {
        sec.notes.push(format!("placement: {p}"));
    }
}

/// `bench hls`: HLS viewers of penstock (playlists cut from the original files, segments sent
/// from them) against nginx serving ffmpeg's pre-segmented copies. Issue 32's goal: no late
/// segment where nginx has none, at ≤ nginx's CPU per viewer, with no segment copies on disk.
fn hls(r: &Value, sec: &mut Section) {
    sec.title = "HLS viewers against nginx (segments cut from the original files)".into();
    sec.paper = vec![(
        "No paper served HLS. Nearest: Clockwise's index tracks, which let a server find any point of a recording without a scan".into(),
        "no figure; the peer is nginx serving ffmpeg's pre-segmented copies (twice the disk)".into(),
    )];
    sec.head = [
        "format",
        "viewers",
        "late penstock/nginx",
        "penstock CPU ms per viewer-s",
        "nginx CPU ms per viewer-s",
        "CPU × nginx",
        "copies on disk penstock/nginx MB",
        "errors p/n",
    ]
    .map(String::from)
    .to_vec();
    let mut worst_cpu: Option<(f64, String)> = None;
    let mut late_where_nginx_none = Vec::new();
    for x in rows_of(r) {
        let (p, n) = (&x["penstock"], &x["nginx"]);
        let c = f(p, "cpu_ms_per_viewer_s") / f(n, "cpu_ms_per_viewer_s");
        let cell = format!("{}, {} viewers", s(x, "format"), s(x, "viewers"));
        if c.is_finite() && worst_cpu.as_ref().is_none_or(|w| c > w.0) {
            worst_cpu = Some((c, cell.clone()));
        }
        if f(p, "late") > 0.0 && f(n, "late") == 0.0 {
            late_where_nginx_none.push(cell);
        }
        sec.rows.push(vec![
            s(x, "format"),
            s(x, "viewers"),
            format!("{}/{}", s(p, "late"), s(n, "late")),
            fmt(f(p, "cpu_ms_per_viewer_s")),
            fmt(f(n, "cpu_ms_per_viewer_s")),
            fmt(c),
            format!(
                "{}/{}",
                fmt(f(x, "penstock_disk_bytes") / 1e6),
                fmt(f(x, "nginx_disk_bytes") / 1e6)
            ),
            format!("{}/{}", s(p, "errors"), s(n, "errors")),
        ]);
    }
    let mut vs = Vec::new();
    if let Some((c, cell)) = &worst_cpu {
        let mut v = judge(
            *c,
            1.0,
            0.1,
            false,
            &format!("highest CPU per viewer × nginx ({cell})"),
        );
        v.why = v.why.replace("against the paper's", "against parity,");
        vs.push(v);
    }
    if !late_where_nginx_none.is_empty() {
        vs.push(Verdict {
            kind: VerdictKind::FallsShort,
            why: format!(
                "late segments where nginx had none: {}",
                late_where_nginx_none.join("; ")
            ),
        });
    }
    sec.ratio = format!(
        "server CPU per viewer penstock/nginx at worst {} (target: ≤ 1.0×); late segments where nginx had none: {}",
        worst_cpu.map_or("n/a".into(), |w| fmt(w.0)),
        late_where_nginx_none.len()
    );
    sec.verdict = combine(&vs);
    if let Some(m) = r["machine"].as_str() {
        sec.notes.push(m.to_string());
    }
    if let Some(p) = r["placement"].as_str() {
        sec.notes.push(format!("placement: {p}"));
    }
}

fn cues(r: &Value, sec: &mut Section) {
    sec.title = "Cues — Figures 4-5, Table 1, §4.3".into();
    sec.paper = vec![
        (
            "Cues Fig. 4-5: aggregate throughput of 3-4 parallel transfers with cue() (k, t), normalized to read/write".into(),
            "≈1.0 for t ≥ 30-40 ms (lower for short t)".into(),
        ),
        (
            "Cues Table 1: FTP server, 4 clients".into(),
            "cue() (4,16) 360 KB/s against user-driven 240 KB/s (1.50×)".into(),
        ),
        (
            "Cues §4.3: CPU left to a metering process during one transfer".into(),
            "≈4% more system calls than beside read/write (1.04×)".into(),
        ),
    ];
    sec.head = [
        "build",
        "transfers",
        "MB/s",
        "server CPU s/GB",
        "machine CPU s/GB",
    ]
    .map(String::from)
    .to_vec();
    for x in r["table1"].as_array().into_iter().flatten() {
        sec.rows.push(vec![
            s(x, "build"),
            s(x, "transfers"),
            fmt(f(x, "mb_s")),
            fmt(f(x, "server_cpu_s_per_gb")),
            fmt(f(x, "machine_cpu_s_per_gb")),
        ]);
    }
    let mut vs = Vec::new();
    let mut ratios = Vec::new();
    let tx = r["ratios_vs_read_write"]["cue()"]["throughput_x"].as_f64();
    if let Some(t) = tx {
        ratios.push(format!(
            "cue() throughput × read/write at {} transfers: {} (paper Fig. 4 ≈1.0, Table 1 1.50)",
            s(r, "transfers"),
            fmt(t)
        ));
        vs.push(judge(
            t,
            1.0,
            0.1,
            true,
            "cue() throughput × read/write (Fig. 4)",
        ));
    }
    let meter: Vec<&Value> = r["meter"]["builds"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let share = |b: &str| {
        meter
            .iter()
            .find(|x| x["build"] == b)
            .map(|x| f(x, "share_of_idle"))
    };
    if let (Some(c), Some(w)) = (share("cue()"), share("read/write")) {
        ratios.push(format!(
            "metering process's share of idle: cue() {} / read/write {} = {}× (paper 1.04×)",
            fmt(c),
            fmt(w),
            fmt(c / w)
        ));
        vs.push(judge(
            c / w,
            1.04,
            0.03,
            true,
            "CPU left to the meter, cue() × read/write (§4.3)",
        ));
    }
    sec.ratio = ratios.join("; ");
    sec.verdict = combine(&vs);
    for n in r["notes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        sec.notes.push(n.to_string());
    }
    if let Some(m) = r["machine"].as_str() {
        sec.notes.push(m.to_string());
    }
}

/// One RTSP server's ramp: its steps and its largest clean N.
fn rtsp_server<'a>(r: &'a Value, name: &str) -> Option<&'a Value> {
    r["servers"]
        .as_array()?
        .iter()
        .find(|s| s["server"].as_str() == Some(name))
}

fn rtsp(r: &Value, sec: &mut Section) {
    if r["media"].as_str() == Some("mp4") {
        sec.title = "RTSP of an MP4 against GStreamer — issue 36's bench mp4".into();
        sec.paper = vec![(
            "issue 36 (no paper measured RTSP): concurrent clean sessions of an H.264 + AAC MP4 (two RTP sessions each) against gst-rtsp-server (qtdemux ! rtph264pay / rtpmp4gpay) in the same run".into(),
            "≥ 2× GStreamer's sessions at ≤ 0.5× its server CPU per session".into(),
        )];
    } else {
        sec.title = "RTSP sessions against GStreamer — issue 15's goal".into();
        sec.paper = vec![(
            "issue 15 (no paper measured RTSP): concurrent clean 8 Mbit/s RTP sessions against gst-rtsp-server in the same run".into(),
            "≥ 2× GStreamer's sessions at ≤ 0.5× its server CPU per session".into(),
        )];
    }
    sec.head = [
        "server",
        "N",
        "clean",
        "lost",
        "lateness p99 ms",
        "jitter mean ms",
        "server CPU per session %",
    ]
    .map(String::from)
    .to_vec();
    let max = r["max_sessions"].as_u64().unwrap_or(0);
    for srv in r["servers"].as_array().into_iter().flatten() {
        let name = srv["server"].as_str().unwrap_or("?");
        for x in srv["steps"].as_array().into_iter().flatten() {
            sec.rows.push(vec![
                name.to_string(),
                s(x, "sessions"),
                if x["clean"].as_bool() == Some(true) {
                    "yes".into()
                } else {
                    "no".into()
                },
                s(x, "lost"),
                fmt(f(x, "lateness_ms_p99")),
                fmt(f(x, "jitter_ms_mean")),
                fmt(f(x, "server_cpu_per_session") * 100.0),
            ]);
        }
    }
    sec.notes.push(format!(
        "clip {} ({} s); each step a fresh server, N sessions, {} s measured; clean = no loss and p99 lateness ≤ {} ms; the ramp's cap N = {max}",
        r["clip"]["path"].as_str().unwrap_or("?"),
        fmt(f(&r["clip"], "seconds")),
        fmt(f(r, "duration_s")),
        fmt(f(r, "lateness_max_ms")),
    ));
    for n in r["notes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        sec.notes.push(n.to_string());
    }
    sec.verdict = rtsp_verdict(r);
    let (p, g) = (
        rtsp_server(r, "penstock").map_or(0, |s| s["largest_clean"].as_u64().unwrap_or(0)),
        rtsp_server(r, "GStreamer").map_or(0, |s| s["largest_clean"].as_u64().unwrap_or(0)),
    );
    let goal = &r["goal"];
    let common = goal["common_sessions"].as_u64().unwrap_or(0);
    sec.ratio = if common > 0 {
        format!(
            "largest clean N: penstock {p}, GStreamer {g}; CPU per session {}× GStreamer's at N = {common}, the largest both kept clean",
            fmt(f(goal, "cpu_per_session_ratio_at_common")),
        )
    } else {
        format!(
            "largest clean N: penstock {p}, GStreamer {g}; no N both kept clean, so CPU per session is not compared"
        )
    };
}

/// Issue 15's goal on a run: sessions (≥ 2×) and CPU per session at the largest N both
/// kept clean (≤ 0.5×). When both reach the ramp's cap (a `--quick` run) the sessions say
/// nothing and only the CPU is judged, which the reason says.
pub fn rtsp_verdict(r: &Value) -> Verdict {
    let (Some(p), Some(g)) = (rtsp_server(r, "penstock"), rtsp_server(r, "GStreamer")) else {
        return Verdict::not_run(
            "both servers are needed (GStreamer's RTSP server was not run here: see the log)",
        );
    };
    let max = r["max_sessions"].as_u64().unwrap_or(0);
    let pn = p["largest_clean"].as_u64().unwrap_or(0);
    let gn = g["largest_clean"].as_u64().unwrap_or(0);
    let goal = &r["goal"];
    let cpu = f(goal, "cpu_per_session_ratio_at_common");
    if pn == 0 && gn == 0 {
        return Verdict::not_run(format!(
            "neither server kept one session clean (p99 lateness above {} ms or loss at N = 1: the machine, not a server, sets the bar in this run); nothing to compare",
            fmt(f(r, "lateness_max_ms"))
        ));
    }
    if pn == 0 {
        return Verdict {
            kind: VerdictKind::FallsShort,
            why: format!("penstock kept no step clean (GStreamer: {gn} sessions)"),
        };
    }
    if gn == 0 {
        return Verdict {
            kind: VerdictKind::Beats,
            why: format!("GStreamer kept no step clean, penstock {pn} sessions"),
        };
    }
    let cpu_v = judge(
        cpu,
        0.5,
        0.1,
        false,
        &format!(
            "server CPU per session against GStreamer's at N = {} (goal ≤ 0.5×)",
            s(goal, "common_sessions")
        ),
    );
    // Within the goal is meeting it: "matches" up to 0.5×, "beats" well below.
    let cpu_v = if cpu_v.kind == VerdictKind::FallsShort || cpu <= 0.5 {
        cpu_v
    } else {
        Verdict {
            kind: VerdictKind::Matches,
            ..cpu_v
        }
    };
    if pn >= max && gn >= max {
        return Verdict {
            why: format!(
                "both kept the ramp's cap ({max} sessions) clean, so sessions are not compared; {}",
                cpu_v.why
            ),
            ..cpu_v
        };
    }
    let ratio = pn as f64 / gn as f64;
    let mut sessions = judge(
        ratio,
        2.0,
        0.0,
        true,
        &format!("largest clean N against GStreamer's ({pn} vs {gn}; goal ≥ 2×)"),
    );
    if sessions.kind == VerdictKind::Beats && pn >= max {
        sessions
            .why
            .push_str(" (penstock at the cap: a lower bound)");
    }
    if sessions.kind == VerdictKind::FallsShort && pn >= max {
        return Verdict::not_run(format!(
            "penstock reached the ramp's cap ({max}) below 2× GStreamer's {gn}: raise --max-sessions to decide; {}",
            cpu_v.why
        ));
    }
    combine(&[sessions, cpu_v])
}

fn admission(r: &Value, sec: &mut Section) {
    sec.title = "Admission control: safe and tight — issue 22's goal".into();
    sec.paper = vec![
        (
            "MARS §3 / Cues: a stream is admitted only when the disk, network, buffers and CPU can carry it; issue 22's measure".into(),
            "the admitted set misses nothing, and N_adm / N_miss ≥ 0.9 (admits nearly all the machine can carry)".into(),
        ),
        (
            "issue 22: the engine's self-calibrated N_adm against a full calibration's".into(),
            "within 2×".into(),
        ),
    ];
    sec.head = [
        "unit bytes",
        "N_adm",
        "binding",
        "admitted: misses / units",
        "admitted p99 ms",
        "N_miss",
        "N_adm / N_miss",
        "N_adm calibrated",
    ]
    .map(String::from)
    .to_vec();
    for x in rows_of(r) {
        let ad = &x["admitted"];
        sec.rows.push(vec![
            s(x, "unit_bytes"),
            format!(
                "{}{}",
                s(x, "n_adm"),
                if x["n_adm_is_limit"].as_bool() == Some(true) {
                    " (the bench's cap)"
                } else {
                    ""
                }
            ),
            x["refusal"]
                .as_str()
                .unwrap_or("–")
                .chars()
                .take(60)
                .collect(),
            format!("{} / {}", s(ad, "misses"), s(ad, "units")),
            fmt(f(ad, "p99_ns") / 1e6),
            s(x, "n_miss"),
            fmt(f(x, "ratio")),
            s(x, "n_adm_calibrated"),
        ]);
    }
    sec.notes.push(format!(
        "{} bit/s rt streams, {} s per run, {} bulk readers beside, a miss = a unit sent more than {} ms late; {}",
        s(r, "rate_bits_per_s"),
        s(r, "duration_s"),
        s(r, "bulk_readers"),
        fmt(f(r, "miss_after_ns") / 1e6),
        if r["synchronized"].as_bool() == Some(true) {
            "every stream due at the same instant"
        } else {
            "phases spread over one period"
        }
    ));
    let vs: Vec<Verdict> = rows_of(r).iter().map(admission_verdict).collect();
    sec.ratio = rows_of(r)
        .iter()
        .map(|x| {
            format!(
                "{} B units: N_adm/N_miss {}, self-calibrated / calibrated N_adm {}",
                s(x, "unit_bytes"),
                fmt(f(x, "ratio")),
                fmt(f(x, "n_adm") / f(x, "n_adm_calibrated"))
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    sec.verdict = combine(&vs);
}

/// Issue 22's goal on one unit size: the admitted set safe (no miss), then tight
/// (N_adm / N_miss against 0.9), and the self-calibrated N_adm within 2× of the calibrated.
pub fn admission_verdict(x: &Value) -> Verdict {
    let unit = s(x, "unit_bytes");
    let n_adm = f(x, "n_adm");
    if x["n_adm_is_limit"].as_bool() == Some(true) {
        return Verdict::not_run(format!(
            "{unit} B: admission admitted all {n_adm} streams the bench would open (its --streams-max): no bound measured"
        ));
    }
    if x["admitted_set_safe"].as_bool() != Some(true) {
        let ad = &x["admitted"];
        return Verdict {
            kind: VerdictKind::FallsShort,
            why: format!(
                "{unit} B: the {} admitted streams missed {} of {} units (unsafe)",
                fmt(n_adm),
                s(ad, "misses"),
                s(ad, "units")
            ),
        };
    }
    let cal = f(x, "n_adm_calibrated");
    let within = (n_adm / cal).max(cal / n_adm);
    let cal_v = if within.is_finite() && within > 2.0 {
        Verdict {
            kind: VerdictKind::FallsShort,
            why: format!(
                "{unit} B: self-calibrated N_adm {} vs calibrated {} (> 2× apart)",
                fmt(n_adm),
                fmt(cal)
            ),
        }
    } else {
        Verdict {
            kind: VerdictKind::Matches,
            why: format!(
                "{unit} B: self-calibrated N_adm {} vs calibrated {}",
                fmt(n_adm),
                fmt(cal)
            ),
        }
    };
    let ratio = f(x, "ratio");
    let tight = if ratio.is_finite() {
        let mut v = judge(
            ratio,
            0.9,
            0.0,
            true,
            &format!("{unit} B: N_adm / N_miss (goal ≥ 0.9)"),
        );
        if v.kind == VerdictKind::Beats {
            v.kind = VerdictKind::Matches;
        }
        v
    } else {
        Verdict::not_run(format!(
            "{unit} B: safe at N_adm = {}, but no forced step missed (N_miss not found): tightness not measured",
            fmt(n_adm)
        ))
    };
    combine(&[tight, cal_v])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn judge_is_within_tolerance_matches_and_directional() {
        assert_eq!(
            judge(1.10, 1.10, 0.05, true, "x").kind,
            VerdictKind::Matches
        );
        assert_eq!(judge(1.20, 1.10, 0.05, true, "x").kind, VerdictKind::Beats);
        assert_eq!(
            judge(0.90, 1.10, 0.05, true, "x").kind,
            VerdictKind::FallsShort
        );
        // Lower is better: a shorter time beats.
        assert_eq!(judge(0.5, 1.04, 0.05, false, "x").kind, VerdictKind::Beats);
        assert_eq!(
            judge(2.0, 1.04, 0.05, false, "x").kind,
            VerdictKind::FallsShort
        );
        assert_eq!(
            judge(f64::NAN, 1.0, 0.1, true, "x").kind,
            VerdictKind::NotRun
        );
        assert!(
            judge(0.9, 1.1, 0.05, true, "tp")
                .why
                .contains("0.900 here against the paper's 1.10")
        );
    }

    #[test]
    fn combine_keeps_the_worst_and_its_reasons() {
        let v = combine(&[
            judge(2.0, 1.0, 0.1, true, "a"),
            judge(0.5, 1.0, 0.1, true, "b"),
            judge(0.4, 1.0, 0.1, true, "c"),
        ]);
        assert_eq!(v.kind, VerdictKind::FallsShort);
        assert!(v.why.contains("b:") && v.why.contains("c:") && !v.why.contains("a:"));
        assert_eq!(combine(&[]).kind, VerdictKind::NotRun);
    }

    fn entry(name: &str, result: Value) -> Value {
        json!({"name": name, "result": result, "exit_code": 0, "log_tail": []})
    }

    /// Figures of the committed isolation run (bench/results/2026-11-22-vm-2vcpu): DRR with
    /// 4 of penstock's own bulk streams left 64 of 382 rt units late.
    #[test]
    fn isolation_with_late_units_falls_short_with_the_period_slack_and_queue_figures() {
        let r = json!({"bench": "isolation", "kernel_scheduler": "none [mq-deadline] kyber bfq",
            "rate_bytes_per_s": 459_398_620.0, "device_rate_bytes_per_s": 1_837_594_480.0, "unit_bytes": 1_048_576,
            "stream_depth": 4, "disk_inflight_max": 8, "rows": [
            {"background": "penstock bulk streams", "background_mb_s": 0.0, "misses": 0, "p99_ms": 0.14, "readers": 0, "sched": "drr", "seconds": 0.8703, "units": 382},
            {"background": "penstock bulk streams", "background_mb_s": 667.8, "misses": 64, "p99_ms": 7.65, "readers": 4, "sched": "drr", "seconds": 0.8699, "units": 382},
            {"background": "penstock bulk streams", "background_mb_s": 577.4, "misses": 0, "p99_ms": 0.2, "readers": 6, "sched": "drr", "seconds": 0.8699, "units": 382}]});
        let s = section(&entry("isolation", r));
        assert_eq!(
            s.verdict.kind,
            VerdictKind::FallsShort,
            "{}",
            s.verdict.line()
        );
        assert!(s.verdict.why.contains("64 of 382"), "{}", s.verdict.why);
        // The period (1 MiB at 459 MB/s), the slack (4 periods) and the longest wait behind
        // 8 reads of 1 MiB at the device's 1.84 GB/s, all from the run's figures: here the
        // wait fits in the slack, and the page says so by not claiming otherwise.
        let why = &s.verdict.why;
        assert!(why.contains("later than a period of 2.28 ms"), "{why}");
        assert!(why.contains("(4.56 ms at the device's 1838 MB/s)"), "{why}");
        assert!(why.contains("9.13 ms of slack"), "{why}");
        assert!(!why.contains("exceeds"), "{why}");
        assert_eq!(s.rows.len(), 3);
    }

    #[test]
    fn isolation_without_late_units_and_constant_time_matches() {
        let r = json!({"rows": [
            {"background": "penstock bulk streams", "misses": 0, "p99_ms": 0.14, "readers": 0, "sched": "drr", "seconds": 0.87, "units": 382},
            {"background": "penstock bulk streams", "misses": 0, "p99_ms": 0.2, "readers": 6, "sched": "drr", "seconds": 0.87, "units": 382}]});
        // 1.00× against the paper's 1.04× is within 5%: matches.
        assert_eq!(
            section(&entry("isolation", r)).verdict.kind,
            VerdictKind::Matches
        );
    }

    #[test]
    fn periodic_beats_only_when_below_both_baselines_in_every_cell() {
        let row = |n: u64, sender: &str, p99: u64| {
            json!({"streams": n, "load": "none", "sender": sender, "p50_ns": 1, "p99_ns": p99, "p999_ns": p99, "max_ns": p99,
                   "misses": 0, "units": 90, "lost": 0, "cpu_percent": 1.0})
        };
        let all = json!({"rows": [row(1, "penstock", 100_000), row(1, "usleep", 300_000), row(1, "nanosleep", 200_000)]});
        assert_eq!(
            section(&entry("periodic", all)).verdict.kind,
            VerdictKind::Beats
        );
        let mid = json!({"rows": [row(1, "penstock", 250_000), row(1, "usleep", 300_000), row(1, "nanosleep", 200_000)]});
        assert_eq!(
            section(&entry("periodic", mid)).verdict.kind,
            VerdictKind::Matches
        );
        let bad = json!({"rows": [row(1, "penstock", 100_000), row(1, "usleep", 300_000), row(1, "nanosleep", 200_000),
                                  row(1000, "penstock", 900_000), row(1000, "usleep", 300_000)]});
        let v = section(&entry("periodic", bad)).verdict;
        assert_eq!(v.kind, VerdictKind::FallsShort);
        assert!(
            v.why.contains("N=1000") && v.why.contains("900 µs"),
            "{}",
            v.why
        );
    }

    /// The 2026-11-24 quick run's N=1000 cell: penstock missed 41,607 units while the same
    /// dispatcher at SCHED_FIFO missed none — the verdict blames the CPU, with the figures.
    #[test]
    fn periodic_shortfall_that_sched_fifo_removes_is_put_on_the_cpu() {
        let row = |sender: &str, p99: u64, misses: u64, wait: Option<f64>| {
            json!({"streams": 1000, "load": "none", "sender": sender, "p50_ns": 1, "p99_ns": p99, "p999_ns": p99, "max_ns": p99,
                   "misses": misses, "units": 240_000, "lost": 0, "cpu_percent": 30.0, "worker_wait_percent": wait})
        };
        let cpu = json!({"rows": [row("penstock", 623_902_719, 41_607, Some(61.5)),
            row("penstock-rt", 97_311, 0, Some(0.4)), row("usleep", 57_343_999, 75_219, None)]});
        let s = section(&entry("periodic", cpu));
        let why = &s.verdict.why;
        assert_eq!(s.verdict.kind, VerdictKind::FallsShort);
        assert!(why.contains("waited for a CPU 61.5% of the run"), "{why}");
        assert!(
            why.contains("SCHED_FIFO (penstock-rt): 0 missed, p99 97.3 µs"),
            "{why}"
        );
        assert!(why.contains("the machine's CPU"), "{why}");
        assert_eq!(s.rows[0].last().map(String::as_str), Some("61.5"));
        // The same dispatcher late at SCHED_FIFO too: not put on the CPU.
        let ours = json!({"rows": [row("penstock", 623_902_719, 41_607, Some(61.5)),
            row("penstock-rt", 623_902_719, 40_000, Some(0.4))]});
        let why = section(&entry("periodic", ours)).verdict.why;
        assert!(!why.contains("the machine's CPU"), "{why}");
    }

    #[test]
    fn isolation_late_units_are_split_between_cpu_and_disk() {
        let row = |misses: u64, wait: f64, disk: f64| {
            json!({"background": "penstock bulk streams", "background_mb_s": 500.0, "misses": misses, "p99_ms": 9.0,
                   "readers": 4, "sched": "drr", "seconds": 0.8, "units": 191, "worker_wait_ms": wait, "disk_read_ms": disk})
        };
        let base = json!({"background": "penstock bulk streams", "misses": 0, "p99_ms": 0.2, "readers": 0,
                          "sched": "drr", "seconds": 0.8, "units": 191, "worker_wait_ms": 1.0, "disk_read_ms": 1.0});
        let r = |x: Value| json!({"rate_bytes_per_s": 262_144_000.0, "unit_bytes": 1_048_576, "rows": [base.clone(), x]});
        // 4 ms period; 200 ms of CPU wait in 800 ms, reads of 2 ms: the CPU.
        let why = section(&entry("isolation", r(row(50, 200.0, 2.0))))
            .verdict
            .why;
        assert!(
            why.contains("waited 200 ms for a CPU (25.0% of the run)"),
            "{why}"
        );
        assert!(why.contains("→ CPU"), "{why}");
        // Reads of 6 ms against a 4 ms period: the disk.
        let why = section(&entry("isolation", r(row(50, 1.0, 6.0))))
            .verdict
            .why;
        assert!(
            why.contains("6.00 ms per read (1.50 of the period) → disk"),
            "{why}"
        );
    }

    #[test]
    fn rtu_matches_without_misses_and_falls_short_with_one() {
        let row = |load: &str, p: u64, mbs: f64, misses: u64| {
            json!({"load": load, "order": "edf", "period_ms": p, "implied_mb_s": mbs, "achieved_mb_s": mbs * 1.005,
                   "misses": misses, "p99_ms": 1.0, "received_exact": true, "units": 100})
        };
        let ok = json!({"rows": [row("none", 60, 17.48, 0), row("none", 120, 8.74, 0)]});
        assert_eq!(
            section(&entry("rtu", ok)).verdict.kind,
            VerdictKind::Matches
        );
        let miss = json!({"rows": [row("none", 60, 17.48, 1), row("none", 120, 8.74, 0)]});
        let v = section(&entry("rtu", miss)).verdict;
        assert_eq!(v.kind, VerdictKind::FallsShort);
        assert!(v.why.contains("1 missed of 100"), "{}", v.why);
    }

    #[test]
    fn stripe_on_plain_files_gives_no_verdict() {
        let rows = json!([{"members": 1, "mb_per_s": 100.0, "ratio_to_1": 1.0, "cpu_s_per_gb": 0.1},
                          {"members": 4, "mb_per_s": 396.0, "ratio_to_1": 3.96, "cpu_s_per_gb": 0.1}]);
        let thr = json!({"members": "loop devices over sparse files, each read-throttled to 100 MB/s by a cgroup", "rows": rows});
        assert_eq!(
            section(&entry("stripe", thr)).verdict.kind,
            VerdictKind::Matches
        );
        let plain = json!({"members": "plain files (--no-throttle): the table shows only overhead", "rows": rows});
        assert_eq!(
            section(&entry("stripe", plain)).verdict.kind,
            VerdictKind::NotRun
        );
    }

    #[test]
    fn striped_writes_short_of_linear_fall_short_even_when_reads_match() {
        let thr = "loop devices over sparse files, each read-throttled to 100 MB/s by a cgroup";
        let rows = |w4: f64| {
            json!([{"members": 1, "mb_per_s": 100.0, "ratio_to_1": 1.0, "cpu_s_per_gb": 0.1,
                    "write_mb_per_s": 100.0, "write_ratio_to_1": 1.0, "write_cpu_s_per_gb": 0.2},
                   {"members": 4, "mb_per_s": 392.0, "ratio_to_1": 3.92, "cpu_s_per_gb": 0.1,
                    "write_mb_per_s": 100.0 * w4, "write_ratio_to_1": w4, "write_cpu_s_per_gb": 0.2}])
        };
        let run = |w4| {
            section(&entry(
                "stripe",
                json!({"members": thr, "plain_file_write_mb_per_s": 900.0, "rows": rows(w4)}),
            ))
        };
        assert_eq!(run(3.9).verdict.kind, VerdictKind::Matches);
        let short = run(2.0);
        assert_eq!(short.verdict.kind, VerdictKind::FallsShort);
        assert!(
            short.verdict.why.contains("write throughput"),
            "{}",
            short.verdict.why
        );
        assert_eq!(short.head.len(), short.rows[0].len());
    }

    fn rtsp_run(
        p: &[(u64, bool, f64)],
        g: &[(u64, bool, f64)],
        max: u64,
        common: (u64, f64),
    ) -> Value {
        let srv = |name: &str, steps: &[(u64, bool, f64)]| {
            let best = steps.iter().filter(|s| s.1).map(|s| s.0).max().unwrap_or(0);
            json!({"server": name, "largest_clean": best, "steps": steps.iter().map(|&(n, clean, cpu)| json!({
                "sessions": n, "clean": clean, "lost": 0, "lateness_ms_p99": 0.5, "jitter_ms_mean": 0.05,
                "server_cpu_per_session": cpu})).collect::<Vec<_>>()})
        };
        json!({"bench": "rtsp", "max_sessions": max, "duration_s": 3.0, "lateness_max_ms": 5.0,
            "clip": {"path": "clip.ts", "seconds": 10.0}, "notes": [],
            "servers": [srv("penstock", p), srv("GStreamer", g)],
            "goal": {"common_sessions": common.0, "cpu_per_session_ratio_at_common": common.1}})
    }

    #[test]
    fn rtsp_verdict_follows_issue_15s_goal() {
        // The committed full run: 120 vs 80 sessions (1.5×), 0.77× the CPU at N = 64.
        let r = rtsp_run(
            &[(64, true, 0.0116), (128, false, 0.0079), (120, true, 0.008)],
            &[(64, true, 0.0151), (88, false, 0.015), (80, true, 0.013)],
            256,
            (64, 0.77),
        );
        let v = rtsp_verdict(&r);
        assert_eq!(v.kind, VerdictKind::FallsShort, "{}", v.why);
        // Twice the sessions at under half the CPU: meets the goal.
        let r = rtsp_run(
            &[(64, true, 0.005), (128, true, 0.004)],
            &[(64, true, 0.0151), (128, false, 0.01)],
            256,
            (64, 0.33),
        );
        assert!(rtsp_verdict(&r).kind >= VerdictKind::Matches);
        // A quick run where both keep the cap clean: only the CPU decides, and it says so.
        let r = rtsp_run(&[(16, true, 0.01)], &[(16, true, 0.015)], 16, (16, 0.67));
        let v = rtsp_verdict(&r);
        assert_eq!(v.kind, VerdictKind::FallsShort);
        assert!(v.why.contains("not compared"), "{}", v.why);
        let r = rtsp_run(&[(16, true, 0.004)], &[(16, true, 0.015)], 16, (16, 0.27));
        assert_eq!(rtsp_verdict(&r).kind, VerdictKind::Beats);
        // Neither kept one session clean (a loaded machine): undecided.
        let r = rtsp_run(&[(1, false, 0.03)], &[(1, false, 0.02)], 16, (0, f64::NAN));
        assert_eq!(rtsp_verdict(&r).kind, VerdictKind::NotRun);
        let r = rtsp_run(&[(1, false, 0.03)], &[(1, true, 0.02)], 16, (0, f64::NAN));
        assert_eq!(rtsp_verdict(&r).kind, VerdictKind::FallsShort);
        // Without the peer there is nothing to compare.
        let mut r = rtsp_run(&[(16, true, 0.004)], &[], 16, (0, f64::NAN));
        r["servers"].as_array_mut().unwrap().pop();
        assert_eq!(rtsp_verdict(&r).kind, VerdictKind::NotRun);
        let s = section(&entry(
            "rtsp",
            rtsp_run(&[(1, true, 0.03)], &[(1, true, 0.02)], 1, (1, 1.5)),
        ));
        assert_eq!(s.rows.len(), 2);
        assert_eq!(s.head.len(), s.rows[0].len());
    }

    #[test]
    fn admission_verdict_needs_a_safe_set_then_tightness() {
        let row = |safe: bool, ratio: Value, n_adm: u64, cal: u64, limit: bool| {
            json!({"unit_bytes": 1316, "n_adm": n_adm, "n_adm_is_limit": limit, "n_adm_calibrated": cal,
                "refusal": "cpu", "n_miss": 115, "admitted_set_safe": safe, "ratio": ratio,
                "admitted": {"misses": if safe { 0 } else { 80 }, "units": 1000, "p99_ns": 4_000_000}})
        };
        // Run A of the committed admission results: safe, 105/115 = 0.91, 105 vs 204.
        assert_eq!(
            admission_verdict(&row(true, json!(0.913), 105, 204, false)).kind,
            VerdictKind::Matches
        );
        // Run C: the admitted set missed: unsafe.
        let v = admission_verdict(&row(false, Value::Null, 105, 204, false));
        assert_eq!(v.kind, VerdictKind::FallsShort);
        assert!(v.why.contains("unsafe"), "{}", v.why);
        // Safe but loose.
        assert_eq!(
            admission_verdict(&row(true, json!(0.6), 105, 204, false)).kind,
            VerdictKind::FallsShort
        );
        // Safe and tight, but self-calibration more than 2× off a full calibration.
        assert_eq!(
            admission_verdict(&row(true, json!(0.95), 50, 204, false)).kind,
            VerdictKind::FallsShort
        );
        // No forced step missed, or the bench's cap admitted: nothing decided.
        assert_eq!(
            admission_verdict(&row(true, Value::Null, 105, 204, false)).kind,
            VerdictKind::NotRun
        );
        assert_eq!(
            admission_verdict(&row(true, Value::Null, 160, 204, true)).kind,
            VerdictKind::NotRun
        );
        let s = section(&entry(
            "admission",
            json!({"rate_bits_per_s": 8_000_000, "duration_s": 4, "bulk_readers": 2,
            "miss_after_ns": 50_000_000, "synchronized": false, "rows": [row(true, json!(0.913), 105, 204, false)]}),
        ));
        assert_eq!(s.verdict.kind, VerdictKind::Matches);
        assert_eq!(s.head.len(), s.rows[0].len());
    }

    #[test]
    fn a_bench_that_wrote_nothing_is_not_run_with_its_last_log_line() {
        let b = json!({"name": "http", "result": null, "exit_code": 2, "log_tail": ["", "penstock: error: nginx not found", ""]});
        let s = section(&b);
        assert_eq!(s.verdict.kind, VerdictKind::NotRun);
        assert!(
            s.verdict.why.contains("nginx not found"),
            "{}",
            s.verdict.why
        );
    }

    #[test]
    fn quantiles_span_the_samples() {
        assert_eq!(quantiles(&[1, 2, 3, 4, 5], 3), vec![1, 3, 5]);
        assert!(quantiles(&[], 10).is_empty());
    }
}
