//! index.html: one page, inline CSS, the plots as `<img>` of the SVG files beside it;
//! nothing is fetched from a network.

use serde_json::Value;

use super::analysis::{Section, VerdictKind, fmt};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const CSS: &str = "body{font-family:sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222;line-height:1.4}\
h1{font-size:1.6em}h2{border-top:2px solid #ccc;padding-top:.8em;margin-top:2em}\
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}\
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}\
.verdict{padding:.4em .7em;border-radius:4px;margin:.6em 0;font-weight:bold}\
.beats{background:#d8f0d8}.matches{background:#e4ecf7}.short{background:#f9e0d0}.notrun{background:#eee}\
code,pre{background:#f6f6f6;padding:.1em .3em;font-size:.88em}pre{padding:.5em;overflow-x:auto;white-space:pre-wrap}\
img{max-width:100%;border:1px solid #ddd;margin:.4em 0}.paper td,.paper th{text-align:left}\
.summary td,.summary th{text-align:left}";

/// The whole page.
pub fn page(results: &Value, sections: &[Section]) -> String {
    let m = &results["machine"];
    let d = &m["disk"];
    let commit = &results["commit"];
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>penstock bench all</title>\n<style>");
    h.push_str(CSS);
    h.push_str("</style></head><body>\n<h1>penstock against the papers: <code>penstock bench all</code></h1>\n");
    h.push_str(&format!(
        "<p>Run {} ({} mode), wall time {:.0} s ({:.1} min). Every figure in the tables and plots was measured in this run; \
         the papers' numbers are quoted in each section's first table and labelled as the paper's. \
         The raw figures are in <a href=\"results.json\">results.json</a>; each bench's output in <code>logs/</code>.</p>\n",
        esc(results["started_utc"].as_str().unwrap_or("?")),
        esc(results["mode"].as_str().unwrap_or("?")),
        results["wall_s"].as_f64().unwrap_or(0.0),
        results["wall_s"].as_f64().unwrap_or(0.0) / 60.0
    ));
    h.push_str("<h2 id=\"machine\">Machine and commit</h2>\n<table class=\"summary\">\n");
    let rows = [
        (
            "CPU",
            format!(
                "{} ({} cores available)",
                m["cpu_model"].as_str().unwrap_or("?"),
                m["cores"]
            ),
        ),
        ("kernel", m["kernel"].as_str().unwrap_or("?").to_string()),
        (
            "memory",
            format!(
                "{:.1} GiB",
                m["memory_bytes"].as_f64().unwrap_or(0.0) / f64::from(1u32 << 30)
            ),
        ),
        (
            "disk (of the report directory)",
            format!(
                "{} {} ({}, {:.0} GB); I/O scheduler: {}",
                d["name"].as_str().unwrap_or("?"),
                d["model"].as_str().unwrap_or(""),
                if d["rotational"] == true {
                    "rotational"
                } else {
                    "non-rotational"
                },
                d["size_bytes"].as_f64().unwrap_or(0.0) / 1e9,
                d["scheduler"].as_str().unwrap_or("?")
            ),
        ),
        (
            "load average (1, 5, 15 min)",
            format!(
                "at start {}, at end {} — other work on this machine during the run shows here",
                m["load_average_start"].as_str().unwrap_or("?"),
                m["load_average_end"].as_str().unwrap_or("?")
            ),
        ),
        (
            "commit",
            format!(
                "{}{} ({})",
                commit["rev"].as_str().unwrap_or("?"),
                if commit["dirty"] == true {
                    " + uncommitted changes"
                } else {
                    ""
                },
                commit["source"].as_str().unwrap_or("?")
            ),
        ),
        (
            "penstock",
            results["penstock_version"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
        ),
    ];
    for (k, v) in rows {
        h.push_str(&format!(
            "<tr><th>{}</th><td>{}</td></tr>\n",
            esc(k),
            esc(&v)
        ));
    }
    h.push_str("</table>\n<h2 id=\"summary\">Verdicts</h2>\n<table class=\"summary\"><tr><th>bench</th><th>verdict</th><th>why (from this run's figures)</th></tr>\n");
    for s in sections {
        h.push_str(&format!(
            "<tr><td><a href=\"#{}\">{}</a></td><td class=\"{}\">{}</td><td>{}</td></tr>\n",
            esc(&s.name),
            esc(&s.title),
            class(s.verdict.kind),
            s.verdict.kind.word(),
            esc(&s.verdict.why)
        ));
    }
    h.push_str("</table>\n");
    let benches: Vec<&Value> = results["benches"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for s in sections {
        let b = benches.iter().find(|b| b["name"] == s.name.as_str());
        h.push_str(&format!(
            "<h2 id=\"{}\">{}</h2>\n",
            esc(&s.name),
            esc(&s.title)
        ));
        h.push_str(&format!(
            "<div class=\"verdict {}\">Verdict: {} — {}</div>\n",
            class(s.verdict.kind),
            s.verdict.kind.word(),
            esc(&s.verdict.why)
        ));
        if !s.paper.is_empty() {
            h.push_str("<table class=\"paper\"><tr><th>what the paper measured</th><th>the paper's number</th></tr>\n");
            for (w, n) in &s.paper {
                h.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td></tr>\n",
                    esc(w),
                    esc(n)
                ));
            }
            h.push_str("</table>\n");
        }
        if !s.ratio.is_empty() {
            h.push_str(&format!(
                "<p><b>Ratio (this run):</b> {}</p>\n",
                esc(&s.ratio)
            ));
        }
        for p in &s.plots {
            h.push_str(&format!("<img src=\"{}\" alt=\"{}\">\n", esc(p), esc(p)));
        }
        if !s.rows.is_empty() {
            h.push_str("<p><b>Measured here</b> (with the peer in the same run):</p>\n<table><tr>");
            for c in &s.head {
                h.push_str(&format!("<th>{}</th>", esc(c)));
            }
            h.push_str("</tr>\n");
            for r in &s.rows {
                h.push_str("<tr>");
                for c in r {
                    h.push_str(&format!("<td>{}</td>", esc(c)));
                }
                h.push_str("</tr>\n");
            }
            h.push_str("</table>\n");
        }
        if !s.notes.is_empty() {
            h.push_str("<ul>\n");
            for n in &s.notes {
                h.push_str(&format!("<li>{}</li>\n", esc(n)));
            }
            h.push_str("</ul>\n");
        }
        if let Some(b) = b {
            h.push_str(&format!(
                "<p>Ran in {} s (exit {}). Re-run this bench alone (from the report directory):</p><pre>{}</pre>\n",
                fmt(b["seconds"].as_f64().unwrap_or(f64::NAN)),
                b["exit_code"],
                esc(b["command"].as_str().unwrap_or("?"))
            ));
            if s.verdict.kind == VerdictKind::NotRun {
                let tail: Vec<&str> = b["log_tail"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                h.push_str(&format!(
                    "<p>Its output ended with:</p><pre>{}</pre>\n",
                    esc(&tail.join("\n"))
                ));
            }
        }
    }
    h.push_str("</body></html>\n");
    h
}

fn class(k: VerdictKind) -> &'static str {
    match k {
        VerdictKind::Beats => "beats",
        VerdictKind::Matches => "matches",
        VerdictKind::FallsShort => "short",
        VerdictKind::NotRun => "notrun",
    }
}
