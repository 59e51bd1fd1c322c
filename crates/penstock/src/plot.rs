//! `penstock plot`: Roadrunner's Figure 2 — the lateness of each unit against its sequence
//! number — drawn from `--trace` files, several traces on one image for comparison.
//!
//! The image has three parts, top to bottom:
//! 1. a header that is the legend: per trace its colour, its label (the file stem or
//!    `--label`) and its statistics (p50 / p99 / p99.9 / max lateness, misses), computed with
//!    [`LatenessStats`] exactly as `penstock stream` computes its summary;
//! 2. the lateness of every unit against its sequence number, one colour per trace (every
//!    stream of a trace in that colour, or only `--stream N`);
//! 3. the lateness histogram: units per bucket on a log count axis, a step line per trace.
//!
//! The cost of drawing is bounded by the image, not by the trace: before drawing, each trace's
//! points are thinned to the first one in each 2×2-pixel cell of the plot. That keeps every
//! pattern a reader can see (a band, an outlier, Roadrunner's BSD diagonals), unlike a
//! per-column min/max, and draws a million units in well under a second.
//!
//! Text is drawn with DejaVu Sans compiled into the binary (`assets/`, with its licence) and
//! registered with plotters' `ab_glyph` backend, so no font needs to be installed and no
//! fontconfig is read. An SVG names the family `sans-serif`: its viewer supplies the font.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use penstock_core::lateness::{LatenessStats, TraceRecord};
use penstock_core::time::Instant;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// The font family every text of the image uses; registered once by [`register_font`].
const FONT: &str = "sans-serif";
/// DejaVu Sans (Bitstream Vera licence, `assets/DejaVuSans-LICENSE`).
const FONT_TTF: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Points closer than this many pixels (in both directions) to one already drawn for the same
/// trace are not drawn again.
const THIN_CELL_PX: i32 = 2;
/// Histogram buckets across the lateness axis.
const HISTOGRAM_BUCKETS: usize = 120;
/// The count at which the histogram's log axis starts: an empty bucket is drawn there.
const HISTOGRAM_COUNT_FLOOR: f64 = 0.5;

/// Colour of trace `i` (matplotlib's "tab10"): distinct, and readable on white. Its length is
/// the most traces a plot takes.
pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// Trace files written by `--trace FILE.csv` (one colour each, at most 10).
    #[arg(required = true, value_name = "TRACE.csv")]
    traces: Vec<PathBuf>,
    /// The image to write; `.png` or `.svg`, chosen by the extension.
    #[arg(short, long, value_name = "OUT.png|OUT.svg")]
    output: PathBuf,
    /// The legend label of a trace, repeated in the order of the files (default: the file
    /// stem).
    #[arg(long, value_name = "TEXT")]
    label: Vec<String>,
    /// Plot only this stream of each trace (default: every stream, in the trace's colour).
    #[arg(long, value_name = "N")]
    stream: Option<u64>,
    /// Logarithmic lateness axes (the per-unit plot's y, the histogram's x).
    #[arg(long)]
    log: bool,
    /// Count a unit as a miss when it is later than this (default: one period of its stream,
    /// as `stream` counts them: the largest gap between consecutive scheduled times in the
    /// trace; a stream without one has no misses).
    #[arg(long, value_name = "DUR", value_parser = parse_miss_after)]
    miss_after: Option<Duration>,
    /// Image width in pixels.
    #[arg(long = "width", value_name = "PX", default_value_t = 1280,
          value_parser = clap::value_parser!(u32).range(480..=8192))]
    width_px: u32,
    /// Image height in pixels.
    #[arg(long = "height", value_name = "PX", default_value_t = 960,
          value_parser = clap::value_parser!(u32).range(480..=8192))]
    height_px: u32,
    /// The most units read from all traces together (memory: 24 bytes a unit).
    #[arg(long, value_name = "N", default_value_t = 50_000_000)]
    units_max: u64,
}

fn parse_miss_after(s: &str) -> Result<Duration, String> {
    penstock_core::units::parse_duration(s).map_err(|e| e.to_string())
}

/// The image formats, by the output's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageFormat {
    Png,
    Svg,
}

impl ImageFormat {
    fn of(path: &Path) -> anyhow::Result<ImageFormat> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("png") => Ok(ImageFormat::Png),
            Some("svg") => Ok(ImageFormat::Svg),
            _ => bail!("{}: the output must end in .png or .svg", path.display()),
        }
    }
}

/// One unit as the plot needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unit {
    stream: u64,
    seq: u64,
    lateness_ns: i64,
}

/// One trace file, read.
#[derive(Debug)]
struct Trace {
    label: String,
    units: Vec<Unit>,
    /// Every stream's units under that stream's miss threshold, merged.
    stats: LatenessStats,
    streams: usize,
    /// The distinct miss thresholds of its streams (`u64::MAX`: no misses counted).
    miss_after_ns: Vec<u64>,
}

/// What reading a stream taught us about its schedule.
#[derive(Debug, Default, Clone, Copy)]
struct StreamScan {
    /// The last unit's `(seq, scheduled_ns)`.
    last: Option<(u64, u64)>,
    /// The largest `scheduled` gap between units `seq` and `seq + 1`: one period (the gaps of
    /// a periodic schedule differ by at most the 1 ns of rounding; those of a (k, t) schedule
    /// are 0 within a cycle and a period between cycles).
    gap_ns_max: u64,
}

pub fn run(args: PlotArgs) -> anyhow::Result<()> {
    let format = ImageFormat::of(&args.output)?;
    if args.traces.len() > PALETTE.len() {
        bail!(
            "{} traces: at most {} fit on one plot (one distinct colour each)",
            args.traces.len(),
            PALETTE.len()
        );
    }
    if args.label.len() > args.traces.len() {
        bail!(
            "{} --label given for {} trace file(s)",
            args.label.len(),
            args.traces.len()
        );
    }
    let miss_after_ns = args
        .miss_after
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut units_left = args.units_max;
    let mut traces = Vec::with_capacity(args.traces.len());
    for (i, path) in args.traces.iter().enumerate() {
        let label = match args.label.get(i) {
            Some(l) => l.clone(),
            None => path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into(),
            ),
        };
        let trace = read_trace(path, label, args.stream, miss_after_ns, &mut units_left)?;
        traces.push(trace);
    }
    if traces.iter().all(|t| t.units.is_empty()) {
        match args.stream {
            Some(n) => bail!("no units of stream {n} in the trace(s): nothing to plot"),
            None => bail!("the trace(s) hold no units: nothing to plot"),
        }
    }
    let axis = LatenessAxis::fit(&traces, args.log);
    let options = DrawOptions {
        axis,
        stream: args.stream,
        miss_after_given: args.miss_after.is_some(),
        miss_line_ns: common_miss_threshold(&traces, &axis),
    };
    register_font()?;
    let size = (args.width_px, args.height_px);
    let drawn = match format {
        ImageFormat::Png => {
            let root = BitMapBackend::new(&args.output, size).into_drawing_area();
            draw(&root, &traces, &options)
                .and_then(|()| root.present())
                .map_err(|e| anyhow!("{e}"))
        }
        ImageFormat::Svg => {
            let root = SVGBackend::new(&args.output, size).into_drawing_area();
            draw(&root, &traces, &options)
                .and_then(|()| root.present())
                .map_err(|e| anyhow!("{e}"))
        }
    };
    drawn.with_context(|| format!("drawing {}", args.output.display()))
}

/// Registers the embedded font as [`FONT`]. Registering twice replaces the entry with the
/// same bytes, so this needs no `Once`.
pub(crate) fn register_font() -> anyhow::Result<()> {
    plotters::style::register_font(FONT, FontStyle::Normal, FONT_TTF)
        .map_err(|_| anyhow!("the embedded font (assets/DejaVuSans.ttf) is not a valid TTF"))
}

/// Reads one trace: its header, then a [`TraceRecord`] a line. Keeps the units of `only`
/// (or of every stream), counts them against `units_left`, and computes the statistics.
fn read_trace(
    path: &Path,
    label: String,
    only: Option<u64>,
    miss_after_ns: Option<u64>,
    units_left: &mut u64,
) -> anyhow::Result<Trace> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut line = String::with_capacity(128);
    let mut units = Vec::new();
    let mut scans: BTreeMap<u64, StreamScan> = BTreeMap::new();
    let mut line_no = 0u64;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .with_context(|| format!("{}:{}: reading", path.display(), line_no + 1))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if line_no == 1 {
            if !TraceRecord::is_csv_header(&line) {
                bail!(
                    "{}:1: not a penstock trace: the first line must be {:?}",
                    path.display(),
                    TraceRecord::CSV_HEADER
                );
            }
            continue;
        }
        let record = TraceRecord::from_csv_line(&line)
            .map_err(|e| anyhow!("{}:{line_no}: {e}", path.display()))?;
        if only.is_some_and(|s| s != record.stream) {
            continue;
        }
        if *units_left == 0 {
            bail!(
                "{}:{line_no}: more units than --units-max allows in all traces together",
                path.display()
            );
        }
        *units_left -= 1;
        let scheduled_ns = record.scheduled.as_nanos();
        let scan = scans.entry(record.stream).or_default();
        if let Some((seq, at_ns)) = scan.last
            && record.seq == seq.wrapping_add(1)
        {
            scan.gap_ns_max = scan.gap_ns_max.max(scheduled_ns.saturating_sub(at_ns));
        }
        scan.last = Some((record.seq, scheduled_ns));
        units.push(Unit {
            stream: record.stream,
            seq: record.seq,
            lateness_ns: record.lateness_ns(),
        });
    }
    if line_no == 0 {
        bail!("{}: empty file, not a penstock trace", path.display());
    }

    let threshold_of = |scan: &StreamScan| match (miss_after_ns, scan.gap_ns_max) {
        (Some(ns), _) => ns,
        (None, 0) => u64::MAX, // a burst stream, or a single unit: no period, no misses
        (None, gap) => gap,
    };
    let mut per_stream: BTreeMap<u64, LatenessStats> = scans
        .iter()
        .map(|(&s, scan)| (s, LatenessStats::new(threshold_of(scan))))
        .collect();
    for u in &units {
        // Every stream of `units` has a scan, so an entry.
        if let Some(stats) = per_stream.get_mut(&u.stream) {
            let (scheduled, completed) = instants_of(u.lateness_ns);
            stats.record(scheduled, completed, 0);
        }
    }
    let mut miss_after_ns: Vec<u64> = per_stream.values().map(|s| s.miss_after_ns()).collect();
    miss_after_ns.sort_unstable();
    miss_after_ns.dedup();
    let mut stats = LatenessStats::new(miss_after_ns.first().copied().unwrap_or(u64::MAX));
    for s in per_stream.values() {
        stats.merge(s);
    }
    Ok(Trace {
        label,
        units,
        stats,
        streams: per_stream.len(),
        miss_after_ns,
    })
}

/// Two instants `lateness_ns` apart, for [`LatenessStats::record`]: the scheduled one at
/// 2^63 ns, so that `2^63 + lateness_ns` lies in `0..=u64::MAX` for every `i64`.
fn instants_of(lateness_ns: i64) -> (Instant, Instant) {
    const BASE_NS: u64 = 1 << 63;
    (
        Instant::from_nanos(BASE_NS),
        Instant::from_nanos(BASE_NS.wrapping_add_signed(lateness_ns)),
    )
}

/// The lateness axis shared by both panels, in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LatenessAxis {
    log: bool,
    lo_us: f64,
    hi_us: f64,
    /// Some unit's lateness is ≤ 0, which a log axis draws at its bottom.
    clamped: bool,
}

impl LatenessAxis {
    /// An axis holding every unit of `traces`: from 0 (or the most negative lateness) to a
    /// little above the max; on a log axis, from the decade below the smallest positive
    /// lateness to the decade above the max.
    fn fit(traces: &[Trace], log: bool) -> LatenessAxis {
        let all = || traces.iter().flat_map(|t| t.units.iter());
        let max_ns = all().map(|u| u.lateness_ns).max().unwrap_or(0);
        let min_ns = all().map(|u| u.lateness_ns).min().unwrap_or(0);
        let max_us = us(max_ns);
        if log {
            let min_pos_us = all()
                .filter(|u| u.lateness_ns > 0)
                .map(|u| us(u.lateness_ns))
                .fold(f64::INFINITY, f64::min);
            let (lo_us, hi_us) = if min_pos_us.is_finite() {
                let lo = 10f64.powf(min_pos_us.log10().floor());
                // 30 % headroom above the max, as the linear axis has 4 %: a whole decade
                // above it would waste up to a tenth of the plot.
                let hi = max_us * 1.3;
                (lo, if hi > lo { hi } else { lo * 10.0 })
            } else {
                (1e-3, 1.0) // 1 ns to 1 µs: every unit on time
            };
            LatenessAxis {
                log,
                lo_us,
                hi_us,
                clamped: min_ns <= 0,
            }
        } else {
            let lo_us = us(min_ns.min(0));
            let span = max_us - lo_us;
            let hi_us = if span > 0.0 {
                max_us + span * 0.04
            } else {
                1.0
            };
            LatenessAxis {
                log,
                lo_us,
                hi_us,
                clamped: false,
            }
        }
    }

    /// Where `lateness_ns` is drawn: in µs, clamped into the axis.
    fn place_us(&self, lateness_ns: i64) -> f64 {
        us(lateness_ns).clamp(self.lo_us, self.hi_us)
    }

    /// The histogram bucket of `lateness_ns`, in `0..HISTOGRAM_BUCKETS`.
    fn bucket(&self, lateness_ns: i64) -> usize {
        let v = self.place_us(lateness_ns);
        let f = if self.log {
            (v.log10() - self.lo_us.log10()) / (self.hi_us.log10() - self.lo_us.log10())
        } else {
            (v - self.lo_us) / (self.hi_us - self.lo_us)
        };
        // f in [0, 1]; 1 (the max) goes to the last bucket.
        ((f * HISTOGRAM_BUCKETS as f64) as usize).min(HISTOGRAM_BUCKETS - 1)
    }

    /// The low edge of bucket `i` (`i == HISTOGRAM_BUCKETS`: the axis's top), in µs.
    fn bucket_edge_us(&self, i: usize) -> f64 {
        let f = i as f64 / HISTOGRAM_BUCKETS as f64;
        if self.log {
            10f64.powf(self.lo_us.log10() + f * (self.hi_us.log10() - self.lo_us.log10()))
        } else {
            self.lo_us + f * (self.hi_us - self.lo_us)
        }
    }

    fn desc(&self) -> &'static str {
        match (self.log, self.clamped) {
            (true, true) => "lateness (µs, log; ≤ 0 drawn at the bottom)",
            (true, false) => "lateness (µs, log)",
            (false, _) => "lateness (µs)",
        }
    }
}

fn us(ns: i64) -> f64 {
    ns as f64 / 1_000.0
}

struct DrawOptions {
    axis: LatenessAxis,
    stream: Option<u64>,
    miss_after_given: bool,
    /// The miss threshold, drawn as a dashed line when every stream of every trace has the
    /// same one and it lies on the axis.
    miss_line_ns: Option<u64>,
}

/// The one miss threshold of all `traces`, if they share one and it lies on `axis`.
fn common_miss_threshold(traces: &[Trace], axis: &LatenessAxis) -> Option<u64> {
    let mut all = traces.iter().flat_map(|t| t.miss_after_ns.iter().copied());
    let first = all.next()?;
    let on_axis = (axis.lo_us..=axis.hi_us).contains(&us(i64::try_from(first).ok()?));
    (all.all(|ns| ns == first) && first != u64::MAX && on_axis).then_some(first)
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    traces: &[Trace],
    options: &DrawOptions,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let row_px = 24;
    let header_px = 44 + row_px * traces.len() as u32;
    let (header, body) = root.split_vertically(header_px);

    let mut title = String::from(
        "Lateness of each unit: scheduled time → send completed (cf. Roadrunner, Fig. 2)",
    );
    if let Some(s) = options.stream {
        title.push_str(&format!(" — stream {s}"));
    }
    header.draw(&Text::new(title, (14, 10), (FONT, 22).into_font()))?;
    for (i, trace) in traces.iter().enumerate() {
        let y = 42 + row_px as i32 * i as i32;
        let colour = PALETTE[i % PALETTE.len()];
        header.draw(&Rectangle::new(
            [(16, y + 3), (32, y + 17)],
            colour.filled(),
        ))?;
        let text = legend_line(trace, options.miss_after_given);
        header.draw(&Text::new(text, (40, y), (FONT, 16).into_font()))?;
    }

    let (_, body_h) = body.dim_in_pixel();
    let (upper, lower) = body.split_vertically(body_h * 3 / 5);
    if options.axis.log {
        let y = || LogCoord::from((options.axis.lo_us..options.axis.hi_us).log_scale());
        scatter_panel(&upper, traces, options, y())?;
        histogram_panel(&lower, traces, options, y())?;
    } else {
        let y = || RangedCoordf64::from(options.axis.lo_us..options.axis.hi_us);
        scatter_panel(&upper, traces, options, y())?;
        histogram_panel(&lower, traces, options, y())?;
    }
    Ok(())
}

/// The legend line of a trace: its label and its statistics.
fn legend_line(trace: &Trace, miss_after_given: bool) -> String {
    let s = trace.stats.summary();
    let streams = match trace.streams {
        1 => String::from("1 stream"),
        n => format!("{n} streams"),
    };
    let misses = match trace.miss_after_ns[..] {
        [] | [u64::MAX] => String::from("misses: none counted (no period)"),
        [ns] if miss_after_given => format!("misses (> {}): {}", fmt_ns(ns), s.misses),
        [ns] => format!("misses (> one period, {}): {}", fmt_ns(ns), s.misses),
        _ if miss_after_given => format!("misses: {}", s.misses),
        _ => format!("misses (> one period each): {}", s.misses),
    };
    let mut line = format!(
        "{}: {} units, {}; p50 {}, p99 {}, p99.9 {}, max {}; {}",
        trace.label,
        s.units,
        streams,
        fmt_ns(s.p50_ns),
        fmt_ns(s.p99_ns),
        fmt_ns(s.p999_ns),
        fmt_ns(s.max_ns),
        misses
    );
    if s.early_units > 0 {
        line.push_str(&format!("; {} early", s.early_units));
    }
    line
}

/// Nanoseconds for people: `850 ns`, `12.3 µs`, `33.3 ms`, `1.20 s`.
fn fmt_ns(ns: u64) -> String {
    let v = ns as f64;
    let (value, unit) = if ns < 1_000 {
        return format!("{ns} ns");
    } else if ns < 1_000_000 {
        (v / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        (v / 1e6, "ms")
    } else {
        (v / 1e9, "s")
    };
    if value < 10.0 {
        format!("{value:.2} {unit}")
    } else if value < 100.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

/// An axis tick: at most 6 decimals, without trailing zeros (`0.5`, `1000`, `0.001`).
fn fmt_tick(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

fn scatter_panel<DB, Y>(
    area: &DrawingArea<DB, Shift>,
    traces: &[Trace],
    options: &DrawOptions,
    y: Y,
) -> DrawResult<DB>
where
    DB: DrawingBackend,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let all = || traces.iter().flat_map(|t| t.units.iter());
    let seq_lo = all().map(|u| u.seq).min().unwrap_or(0);
    let seq_hi = all().map(|u| u.seq).max().unwrap_or(0).max(seq_lo + 1);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .margin_right(28)
        .x_label_area_size(48)
        .y_label_area_size(88)
        .build_cartesian_2d(seq_lo as f64..seq_hi as f64, y)?;
    chart
        .configure_mesh()
        .x_desc("sequence number (unit of its stream)")
        .y_desc(options.axis.desc())
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| fmt_tick(*v))
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(205, 205, 205))
        .draw()?;

    // Thin each trace to the first point of each THIN_CELL_PX² cell of the plot.
    let (px_x, px_y) = chart.plotting_area().get_pixel_range();
    let cols = ((px_x.end - px_x.start) / THIN_CELL_PX + 1).max(1) as usize;
    let rows = ((px_y.end - px_y.start) / THIN_CELL_PX + 1).max(1) as usize;
    let mut seen = vec![false; cols * rows];
    let mut kept: Vec<(f64, f64)> = Vec::new();
    for (i, trace) in traces.iter().enumerate() {
        seen.fill(false);
        kept.clear();
        for u in &trace.units {
            let point = (u.seq as f64, options.axis.place_us(u.lateness_ns));
            let (x, y) = chart.backend_coord(&point);
            let col = ((x - px_x.start) / THIN_CELL_PX).clamp(0, cols as i32 - 1) as usize;
            let row = ((y - px_y.start) / THIN_CELL_PX).clamp(0, rows as i32 - 1) as usize;
            let cell = &mut seen[row * cols + col];
            if !*cell {
                *cell = true;
                kept.push(point);
            }
        }
        // Few points: bigger dots, so that each one is seen.
        let radius = if trace.units.len() <= 5_000 { 2 } else { 1 };
        let colour = PALETTE[i % PALETTE.len()];
        chart.draw_series(
            kept.iter()
                .map(|&p| Circle::new(p, radius, colour.filled())),
        )?;
    }
    if let Some(ns) = options.miss_line_ns {
        let y = us(ns as i64); // common_miss_threshold checked that it fits
        let (x0, x1) = (seq_lo as f64, seq_hi as f64);
        chart.draw_series(DashedLineSeries::new(
            [(x0, y), (x1, y)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?;
        let text = format!("miss threshold {}", fmt_ns(ns));
        // Just above the line, clear of the y axis.
        let label = EmptyElement::at((x0, y)) + Text::new(text, (8, -18), (FONT, 13).into_font());
        chart.draw_series(std::iter::once(label))?;
    }
    Ok(())
}

fn histogram_panel<DB, X>(
    area: &DrawingArea<DB, Shift>,
    traces: &[Trace],
    options: &DrawOptions,
    x: X,
) -> DrawResult<DB>
where
    DB: DrawingBackend,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let axis = &options.axis;
    let counts: Vec<Vec<u64>> = traces
        .iter()
        .map(|t| {
            let mut c = vec![0u64; HISTOGRAM_BUCKETS];
            for u in &t.units {
                c[axis.bucket(u.lateness_ns)] += 1;
            }
            c
        })
        .collect();
    let count_max = counts.iter().flatten().copied().max().unwrap_or(1).max(1);
    let y = (HISTOGRAM_COUNT_FLOOR..count_max as f64 * 2.0).log_scale();
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .margin_right(28)
        .x_label_area_size(48)
        .y_label_area_size(88)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(axis.desc())
        .y_desc("units per bucket (log)")
        .x_label_formatter(&|v| fmt_tick(*v))
        // The floor (0.5) is where empty buckets are drawn: label it 0.
        .y_label_formatter(&|v| {
            if *v < 1.0 {
                "0".into()
            } else {
                format!("{v:.0}")
            }
        })
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(205, 205, 205))
        .draw()?;
    for (i, c) in counts.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let level = |n: u64| {
            if n == 0 {
                HISTOGRAM_COUNT_FLOOR
            } else {
                n as f64
            }
        };
        let mut steps = Vec::with_capacity(2 * HISTOGRAM_BUCKETS + 2);
        steps.push((axis.bucket_edge_us(0), HISTOGRAM_COUNT_FLOOR));
        for (b, &n) in c.iter().enumerate() {
            steps.push((axis.bucket_edge_us(b), level(n)));
            steps.push((axis.bucket_edge_us(b + 1), level(n)));
        }
        steps.push((
            axis.bucket_edge_us(HISTOGRAM_BUCKETS),
            HISTOGRAM_COUNT_FLOOR,
        ));
        chart.draw_series(LineSeries::new(steps, colour.stroke_width(2)))?;
    }
    if let Some(ns) = options.miss_line_ns {
        let x = us(ns as i64); // common_miss_threshold checked that it fits
        let (y0, y1) = (HISTOGRAM_COUNT_FLOOR, count_max as f64 * 2.0);
        chart.draw_series(DashedLineSeries::new(
            [(x, y0), (x, y1)],
            6,
            4,
            BLACK.stroke_width(1),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(seq: u64, lateness_ns: i64) -> Unit {
        Unit {
            stream: 0,
            seq,
            lateness_ns,
        }
    }

    fn trace(units: Vec<Unit>) -> Trace {
        Trace {
            label: "t".into(),
            units,
            stats: LatenessStats::new(u64::MAX),
            streams: 1,
            miss_after_ns: vec![u64::MAX],
        }
    }

    #[test]
    fn instants_of_keeps_the_sign_and_the_extremes() {
        for l in [0, 1, -1, 33_333_334, i64::MIN, i64::MAX] {
            let (s, c) = instants_of(l);
            assert_eq!(c.signed_nanos_since(s), i128::from(l));
        }
    }

    #[test]
    fn linear_axis_starts_at_zero_or_the_earliest_unit() {
        let a = LatenessAxis::fit(&[trace(vec![unit(0, 1_000), unit(1, 3_000)])], false);
        assert_eq!(a.lo_us, 0.0);
        assert!(a.hi_us > 3.0);
        let a = LatenessAxis::fit(&[trace(vec![unit(0, -2_000), unit(1, 3_000)])], false);
        assert_eq!(a.lo_us, -2.0);
        let a = LatenessAxis::fit(&[trace(vec![unit(0, 0)])], false);
        assert_eq!((a.lo_us, a.hi_us), (0.0, 1.0));
    }

    #[test]
    fn log_axis_starts_at_a_decade_and_clamps_non_positive_units() {
        let a = LatenessAxis::fit(
            &[trace(vec![unit(0, 0), unit(1, 25_000), unit(2, 4_500)])],
            true,
        );
        assert_eq!(a.lo_us, 1.0, "the decade below 4.5 µs");
        assert!((a.hi_us - 25.0 * 1.3).abs() < 1e-9, "{}", a.hi_us);
        assert!(a.clamped);
        assert_eq!(a.place_us(0), 1.0);
        assert_eq!(a.place_us(-7), 1.0);
        assert_eq!(a.bucket(0), 0);
        assert_eq!(a.bucket(25_000_000), HISTOGRAM_BUCKETS - 1);
        // Log-spaced: the middle edge is the geometric mean of the ends.
        let edge = a.bucket_edge_us(HISTOGRAM_BUCKETS / 2);
        assert!((edge - (a.lo_us * a.hi_us).sqrt()).abs() < 1e-9, "{edge}");
        assert!((a.bucket_edge_us(HISTOGRAM_BUCKETS) - a.hi_us).abs() < 1e-9);
    }

    #[test]
    fn buckets_cover_the_axis_in_order() {
        let a = LatenessAxis::fit(&[trace(vec![unit(0, 0), unit(1, 1_200_000)])], false);
        let mut last = 0;
        for ns in (0..=1_200_000).step_by(997) {
            let b = a.bucket(ns);
            assert!(b >= last && b < HISTOGRAM_BUCKETS);
            assert!(a.bucket_edge_us(b) <= us(ns) + 1e-9);
            last = b;
        }
    }

    #[test]
    fn numbers_for_people() {
        assert_eq!(fmt_ns(850), "850 ns");
        assert_eq!(fmt_ns(12_345), "12.3 µs");
        assert_eq!(fmt_ns(33_333_334), "33.3 ms");
        assert_eq!(fmt_ns(1_200_000_000), "1.20 s");
        assert_eq!(fmt_tick(0.5), "0.5");
        assert_eq!(fmt_tick(1000.0), "1000");
        assert_eq!(fmt_tick(0.1 + 0.2), "0.3");
        assert_eq!(fmt_tick(-0.0), "0");
    }

    #[test]
    fn the_output_format_comes_from_the_extension() {
        assert_eq!(
            ImageFormat::of(Path::new("a.png")).ok(),
            Some(ImageFormat::Png)
        );
        assert_eq!(
            ImageFormat::of(Path::new("a.SVG")).ok(),
            Some(ImageFormat::Svg)
        );
        assert!(ImageFormat::of(Path::new("a.jpg")).is_err());
        assert!(ImageFormat::of(Path::new("a")).is_err());
    }
}
