//! The report's plots: SVG files drawn with plotters from a `results.json` bench entry.
//!
//! Text is laid out with DejaVu Sans compiled into the binary (registered by
//! `plot::register_font`); the SVG names the family `sans-serif` and its viewer draws it, so
//! no system font is read. Logarithmic axes are drawn as log10 of the value on a linear axis
//! with the tick labels written back as values.

use std::path::Path;

use anyhow::Result;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use serde_json::Value;

const W: u32 = 760;
const H: u32 = 470;
const FONT: &str = "sans-serif";

/// One line (or set of points) of a chart.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// Draws every plot of bench entry `b` into `dir`; returns the file names.
pub fn draw(b: &Value, dir: &Path, name: &str) -> Result<Vec<String>> {
    crate::plot::register_font()?;
    let r = &b["result"];
    if r.is_null() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let rows: &[Value] = r["rows"].as_array().map_or(&[], Vec::as_slice);
    match name {
        "paths" => {
            let size = rows
                .iter()
                .filter_map(|x| x["size"].as_u64())
                .max()
                .unwrap_or(0);
            let at_size: Vec<&Value> = rows
                .iter()
                .filter(|x| x["size"].as_u64() == Some(size))
                .collect();
            let mut paths: Vec<String> = Vec::new();
            for x in &at_size {
                let p = x["path"].as_str().unwrap_or("?").to_string();
                // The plot's labels are short; the table has the full names.
                if !paths.contains(&p) {
                    paths.push(p);
                }
            }
            for (file, key, ylabel) in [
                (
                    "paths-throughput.svg",
                    "mb_per_s_median",
                    "throughput (MB/s)",
                ),
                (
                    "paths-cpu.svg",
                    "cpu_s_per_gb_median",
                    "sender CPU (s per GB)",
                ),
            ] {
                let series: Vec<(String, Vec<f64>)> = ["cold", "hot"]
                    .iter()
                    .map(|c| {
                        (
                            format!("{c} cache"),
                            paths
                                .iter()
                                .map(|p| {
                                    at_size
                                        .iter()
                                        .find(|x| x["path"] == p.as_str() && x["cache"] == *c)
                                        .and_then(|x| x[key].as_f64())
                                        .unwrap_or(0.0)
                                })
                                .collect(),
                        )
                    })
                    .filter(|(_, v): &(String, Vec<f64>)| v.iter().any(|y| *y > 0.0))
                    .collect();
                bars(
                    &dir.join(file),
                    &format!(
                        "Data paths, {} MB file, to a loopback TCP receiver",
                        size / 1_000_000
                    ),
                    ylabel,
                    &paths
                        .iter()
                        .map(|p| match p.as_str() {
                            "bare sendfile loop" => "bare sendfile".to_string(),
                            "O_DIRECT read (device rate)" => "device rate".to_string(),
                            o => o.to_string(),
                        })
                        .collect::<Vec<_>>(),
                    &series,
                )?;
                out.push(file.to_string());
            }
        }
        "periodic" => {
            let traces = b["traces"].as_object();
            for load in ["none", "cpu", "disk"] {
                let series: Vec<Series> = ["penstock", "penstock-rt", "usleep", "nanosleep"]
                    .iter()
                    .filter_map(|s| {
                        let t = traces?.get(&format!("periodic-n1-{load}-{s}"))?;
                        let q: Vec<f64> = t["cdf_ns"]
                            .as_array()?
                            .iter()
                            .filter_map(Value::as_f64)
                            .collect();
                        let n = q.len().max(2) as f64 - 1.0;
                        Some(Series {
                            label: sender_label(s),
                            points: q
                                .iter()
                                .enumerate()
                                .map(|(i, v)| ((v / 1e3).max(1.0).log10(), i as f64 / n))
                                .collect(),
                        })
                    })
                    .collect();
                if series.is_empty() {
                    continue;
                }
                let file = format!("periodic-cdf-{load}.svg");
                lines(
                    &dir.join(&file),
                    &format!("Lateness CDF, 1 stream of 1 KiB every 33.3 ms, load: {load}"),
                    "lateness: end of send - start of period (µs, log)",
                    "fraction of units",
                    &series,
                    true,
                    false,
                    false,
                )?;
                out.push(file);
            }
            // Roadrunner's Figure 2: each unit's lateness against its number.
            let series: Vec<Series> = ["penstock", "usleep", "nanosleep"]
                .iter()
                .filter_map(|s| {
                    let t = traces?.get(&format!("periodic-n1-none-{s}"))?;
                    let v: Vec<f64> = t["lateness_ns_by_seq"]
                        .as_array()?
                        .iter()
                        .filter_map(Value::as_f64)
                        .collect();
                    Some(Series {
                        label: sender_label(s),
                        points: v
                            .iter()
                            .enumerate()
                            .map(|(i, l)| (i as f64, (l / 1e3).max(1.0).log10()))
                            .collect(),
                    })
                })
                .collect();
            if !series.is_empty() {
                let file = "periodic-fig2.svg".to_string();
                lines(
                    &dir.join(&file),
                    "Roadrunner Fig. 2 here: lateness of each unit, 1 stream, no load",
                    "unit (packet) number",
                    "lateness (µs, log)",
                    &series,
                    false,
                    true,
                    true,
                )?;
                out.push(file);
            }
            // p99 against stream count.
            let series: Vec<Series> = ["penstock", "penstock-rt", "usleep", "nanosleep"]
                .iter()
                .map(|s| Series {
                    label: sender_label(s),
                    points: rows
                        .iter()
                        .filter(|x| x["sender"] == *s && x["load"] == "none")
                        .filter_map(|x| {
                            Some((
                                x["streams"].as_f64()?.max(1.0).log10(),
                                (x["p99_ns"].as_f64()? / 1e3).max(1.0).log10(),
                            ))
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            if !series.is_empty() {
                let file = "periodic-p99.svg".to_string();
                lines(
                    &dir.join(&file),
                    "p99 lateness against concurrent streams, no load",
                    "streams (log)",
                    "p99 lateness (µs, log)",
                    &series,
                    true,
                    true,
                    false,
                )?;
                out.push(file);
            }
        }
        "isolation" => {
            let mut readers: Vec<u64> = rows.iter().filter_map(|x| x["readers"].as_u64()).collect();
            readers.sort_unstable();
            readers.dedup();
            let cats: Vec<String> = readers.iter().map(|r| format!("{r} readers")).collect();
            for (file, key, ylabel, title) in [
                (
                    "isolation-late.svg",
                    "misses",
                    "late rt units (of the stream's units)",
                    "Real-time stream: late units under background readers",
                ),
                (
                    "isolation-p99.svg",
                    "p99_ms",
                    "rt unit lateness p99 (ms)",
                    "Real-time stream: p99 lateness under background readers",
                ),
            ] {
                let mut series = Vec::new();
                // A series per background, scheduler and rt stream count (1 before
                // `--rt-streams`).
                let k_of = |x: &Value| x["rt_streams"].as_u64().unwrap_or(1);
                let mut ks: Vec<u64> = rows.iter().map(k_of).collect();
                ks.sort_unstable();
                ks.dedup();
                for (bg, sched, k) in ["penstock bulk streams", "read() processes"]
                    .into_iter()
                    .flat_map(|bg| ["drr", "fifo"].into_iter().map(move |sc| (bg, sc)))
                    .flat_map(|(bg, sc)| ks.iter().map(move |&k| (bg, sc, k)))
                {
                    {
                        let here = |x: &&Value| {
                            x["background"] == bg && x["sched"] == sched && k_of(x) == k
                        };
                        let v: Vec<f64> = readers
                            .iter()
                            .map(|n| {
                                rows.iter()
                                    .filter(here)
                                    .find(|x| x["readers"].as_u64() == Some(*n))
                                    .and_then(|x| x[key].as_f64())
                                    .unwrap_or(0.0)
                            })
                            .collect();
                        if rows.iter().any(|x| here(&x)) {
                            let label = if ks.len() > 1 {
                                format!("{sched}, {k} rt, {bg}")
                            } else {
                                format!("{sched}, {bg}")
                            };
                            series.push((label, v));
                        }
                    }
                }
                bars(&dir.join(file), title, ylabel, &cats, &series)?;
                out.push(file.to_string());
            }
        }
        "rtu" => {
            let mut periods: Vec<u64> = rows
                .iter()
                .filter_map(|x| x["period_ms"].as_u64())
                .collect();
            periods.sort_unstable();
            periods.dedup();
            let cats: Vec<String> = periods.iter().map(|p| format!("{p} ms")).collect();
            let mut series = Vec::new();
            for load in ["none", "cpu"] {
                for order in ["edf", "rm"] {
                    let v: Vec<f64> = periods
                        .iter()
                        .map(|p| {
                            rows.iter()
                                .find(|x| {
                                    x["load"] == load
                                        && x["order"] == order
                                        && x["period_ms"].as_u64() == Some(*p)
                                })
                                .and_then(|x| x["achieved_mb_s"].as_f64())
                                .unwrap_or(0.0)
                        })
                        .collect();
                    if v.iter().any(|y| *y > 0.0) {
                        series.push((format!("{order}, load {load}"), v));
                    }
                }
            }
            bars(
                &dir.join("rtu.svg"),
                "Three periodic streams: throughput by period",
                "achieved throughput (MB/s)",
                &cats,
                &series,
            )?;
            out.push("rtu.svg".into());
        }
        "stripe" => {
            let measured: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|x| Some((x["members"].as_f64()?, x["ratio_to_1"].as_f64()?)))
                .collect();
            let written: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|x| Some((x["members"].as_f64()?, x["write_ratio_to_1"].as_f64()?)))
                .collect();
            let mut series = vec![Series {
                label: "penstock reads, here".into(),
                points: measured,
            }];
            if !written.is_empty() {
                series.push(Series {
                    label: "penstock writes, here".into(),
                    points: written,
                });
            }
            series.extend([
                Series {
                    label: "Clockwise (paper)".into(),
                    points: vec![(1.0, 1.0), (2.0, 2.0), (3.0, 2.95), (4.0, 3.9)],
                },
                Series {
                    label: "linear".into(),
                    points: vec![(1.0, 1.0), (4.0, 4.0)],
                },
            ]);
            lines(
                &dir.join("stripe.svg"),
                "Striped read and write throughput against members",
                "members (disks)",
                "throughput / one member's (×)",
                &series,
                false,
                false,
                false,
            )?;
            out.push("stripe.svg".into());
        }
        "rtsp" | "mp4" => {
            let what = if name == "mp4" {
                "an H.264 + AAC MP4's RTP sessions"
            } else {
                "8 Mbit/s RTP sessions"
            };
            for (file, key, ylabel, scale) in [
                (
                    "cpu.svg",
                    "server_cpu_per_session",
                    "server CPU per session (% of one CPU)",
                    100.0,
                ),
                (
                    "lateness.svg",
                    "lateness_ms_p99",
                    "RTP lateness p99 (ms)",
                    1.0,
                ),
            ] {
                let mut series = Vec::new();
                for srv in r["servers"].as_array().into_iter().flatten() {
                    let mut pts: Vec<(f64, f64)> = srv["steps"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| {
                            Some((
                                x["sessions"].as_f64()?.max(1.0).log10(),
                                x[key].as_f64()? * scale,
                            ))
                        })
                        .collect();
                    // Bisection steps come after the ramp: in order of N for a line.
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    if !pts.is_empty() {
                        series.push(Series {
                            label: srv["server"].as_str().unwrap_or("?").to_string(),
                            points: pts,
                        });
                    }
                }
                if series.is_empty() {
                    continue;
                }
                let file = format!("{name}-{file}");
                lines(
                    &dir.join(&file),
                    &format!("RTSP: penstock serve against GStreamer's RTSP server ({what})"),
                    "concurrent sessions (log)",
                    ylabel,
                    &series,
                    true,
                    false,
                    false,
                )?;
                out.push(file);
            }
        }
        "http" => {
            for (file, key, ylabel, scale) in [
                (
                    "http-throughput.svg",
                    "bytes_per_s",
                    "throughput (MB/s)",
                    1e-6,
                ),
                ("http-cpu.svg", "cpu_s_per_gb", "server CPU (s per GB)", 1.0),
            ] {
                let mut series = Vec::new();
                for f in ["large", "small"] {
                    for server in ["penstock", "nginx"] {
                        let pts: Vec<(f64, f64)> = rows
                            .iter()
                            .filter(|x| x["file"] == f)
                            .filter_map(|x| {
                                Some((
                                    x["clients"].as_f64()?.max(1.0).log10(),
                                    x[server][key].as_f64()? * scale,
                                ))
                            })
                            .collect();
                        if !pts.is_empty() {
                            series.push(Series {
                                label: format!("{server}, {f} file"),
                                points: pts,
                            });
                        }
                    }
                }
                if series.is_empty() {
                    continue;
                }
                lines(
                    &dir.join(file),
                    "HTTP: penstock serve against nginx (wrk on loopback)",
                    "concurrent clients (log)",
                    ylabel,
                    &series,
                    true,
                    false,
                    false,
                )?;
                out.push(file.to_string());
            }
        }
        "cues" => {
            let t1: &[Value] = r["table1"].as_array().map_or(&[], Vec::as_slice);
            let mut builds: Vec<String> = Vec::new();
            for x in t1 {
                let b = x["build"].as_str().unwrap_or("?").to_string();
                if !builds.contains(&b) {
                    builds.push(b);
                }
            }
            let series: Vec<Series> = builds
                .iter()
                .map(|b| Series {
                    label: b.clone(),
                    points: t1
                        .iter()
                        .filter(|x| x["build"] == b.as_str())
                        .filter_map(|x| Some((x["transfers"].as_f64()?, x["mb_s"].as_f64()?)))
                        .collect(),
                })
                .collect();
            if !series.is_empty() {
                lines(
                    &dir.join("cues-table1.svg"),
                    "Cues Table 1 / Fig. 4 here: concurrent whole-file transfers",
                    "concurrent transfers",
                    "aggregate throughput (MB/s)",
                    &series,
                    false,
                    false,
                    false,
                )?;
                out.push("cues-table1.svg".into());
            }
        }
        _ => {}
    }
    Ok(out)
}

fn sender_label(s: &str) -> String {
    match s {
        "penstock" => "penstock (engine, EDF dispatcher)".into(),
        "penstock-rt" => "penstock --realtime".into(),
        "usleep" => "usleep loop (thread per stream)".into(),
        "nanosleep" => "absolute nanosleep (thread per stream)".into(),
        o => o.into(),
    }
}

/// The colour of series `i` named `label`: a periodic sender has the same colour in every
/// plot; others take the palette in order.
fn colour(i: usize, label: &str) -> RGBColor {
    let fixed = [
        "penstock (engine",
        "penstock --realtime",
        "usleep",
        "absolute nanosleep",
    ]
    .iter()
    .position(|p| label.starts_with(p));
    let palette = &crate::plot::PALETTE;
    palette[fixed.unwrap_or(i) % palette.len()]
}

/// Height of the legend strip above a chart: the title and a row per two labels.
fn legend_height(n: usize) -> u32 {
    30 + 18 * n.div_ceil(2) as u32
}

/// The title and the legend (a coloured square and a label per series, two columns) in the
/// strip above the chart, where they cover no data.
fn title_and_legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    labels: &[(String, RGBColor)],
) -> Result<()> {
    area.draw(&Text::new(title.to_string(), (70, 6), (FONT, 17)))?;
    for (i, (label, c)) in labels.iter().enumerate() {
        let x = 70 + (i % 2) as i32 * 340;
        let y = 30 + (i / 2) as i32 * 18;
        area.draw(&Rectangle::new([(x, y + 2), (x + 14, y + 12)], c.filled()))?;
        area.draw(&Text::new(label.clone(), (x + 20, y), (FONT, 12)))?;
    }
    Ok(())
}

fn log_label(v: f64) -> String {
    let x = 10f64.powf(v);
    if x >= 1000.0 {
        format!("{:.0}", x)
    } else if x >= 1.0 {
        format!("{}", (x * 10.0).round() / 10.0)
    } else {
        format!("{x:.2}")
    }
}

fn range(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if log {
        (lo.floor(), hi.ceil().max(lo.floor() + 1.0))
    } else {
        let lo = lo.min(0.0);
        let hi = if hi <= lo { lo + 1.0 } else { hi * 1.08 };
        (lo, hi)
    }
}

/// A line chart (or scatter with `points_only`); `log_x`/`log_y` mean the data are log10
/// values already.
#[allow(clippy::too_many_arguments)]
fn lines(
    path: &Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    log_x: bool,
    log_y: bool,
    points_only: bool,
) -> Result<()> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let labels: Vec<(String, RGBColor)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.label.clone(), colour(i, &s.label)))
        .collect();
    let (top, body) = root.split_vertically(legend_height(labels.len()));
    title_and_legend(&top, title, &labels)?;
    let (x0, x1) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        log_x,
    );
    let (y0, y1) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        log_y,
    );
    let mut chart = ChartBuilder::on(&body)
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    let xf = |v: &f64| {
        if log_x {
            log_label(*v)
        } else {
            crate::report::analysis::fmt(*v)
        }
    };
    let yf = |v: &f64| {
        if log_y {
            log_label(*v)
        } else {
            crate::report::analysis::fmt(*v)
        }
    };
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (s, (_, c)) in series.iter().zip(&labels) {
        let c = *c;
        if points_only {
            chart.draw_series(s.points.iter().map(|p| Circle::new(*p, 1, c.filled())))?;
        } else {
            chart.draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?;
            chart.draw_series(s.points.iter().map(|p| Circle::new(*p, 2, c.filled())))?;
        }
    }
    root.present()?;
    Ok(())
}

/// Grouped bars: one group per category, one bar per series.
fn bars(
    path: &Path,
    title: &str,
    ylabel: &str,
    cats: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<()> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE)?;
    let labels: Vec<(String, RGBColor)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.0.clone(), colour(i, &s.0)))
        .collect();
    let (top, body) = root.split_vertically(legend_height(labels.len()));
    title_and_legend(&top, title, &labels)?;
    let k = series.len().max(1) as i32;
    // Each category takes k slots for its bars and one empty slot.
    let slots = cats.len() as i32 * (k + 1);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .fold(0.0f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.25 } else { 1.0 };
    let mut chart = ChartBuilder::on(&body)
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62)
        .build_cartesian_2d((0..slots.max(1)).into_segmented(), 0f64..ymax)?;
    let label = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(j) | SegmentValue::Exact(j) => {
            let (cat, pos) = ((j / (k + 1)) as usize, j % (k + 1));
            if pos == (k - 1) / 2 {
                cats.get(cat).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots.max(1) as usize)
        .x_label_formatter(&label)
        .y_desc(ylabel)
        .y_label_formatter(&|v| crate::report::analysis::fmt(*v))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (si, ((_, vals), (_, c))) in series.iter().zip(&labels).enumerate() {
        let c = *c;
        chart.draw_series(vals.iter().enumerate().map(|(ci, v)| {
            let j = ci as i32 * (k + 1) + si as i32;
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(j), 0.0),
                    (SegmentValue::Exact(j + 1), *v),
                ],
                c.filled(),
            );
            r.set_margin(0, 0, 2, 2);
            r
        }))?;
    }
    root.present()?;
    Ok(())
}
