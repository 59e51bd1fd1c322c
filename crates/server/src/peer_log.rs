//! One rate limiter for every warning a peer's behaviour causes (issue 30: 20,000 refused
//! SCM_RIGHTS messages wrote 20,000 WARN lines, 3.2 MB in 2.2 s). A peer must not be able to
//! fill the disk or drown the operator's log by repeating what makes the server warn.
//!
//! Each kind of warning (a `&'static str`, e.g. `"control_fds_refused"`) may write
//! [`LINES_PER_WINDOW`] lines per [`WINDOW`]; beyond, lines are counted, not written, and the
//! next line written of that kind says how many were suppressed since the last one
//! (`suppressed=N`). Use [`peer_warn!`](crate::peer_warn) where a peer can cause the line
//! over and over; the accept back-off lines already have their own interval.
//!
//! Kinds are few and fixed in the code, so the table is bounded by them, never by peers.
//!
//! The lines suppressed are also counted for good, per kind ([`PeerLog::suppressed_totals`]):
//! the metric `penstock_peer_log_suppressed_lines_total{kind}`, every kind of [`KINDS`]
//! present at 0 from the start.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines one kind may write per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The kinds [`peer_warn!`](crate::peer_warn) is called with in this crate (a metric's label
/// values, present at 0 from the start; a kind not listed is counted all the same).
pub const KINDS: [&str; 8] = [
    "auth_refused",
    "control_fds_refused",
    "control_wrong_token",
    "http_origin",
    "http_origin_cut",
    "metrics_accept_failed",
    "rtsp_origin",
    "unreadable",
];

#[derive(Debug)]
struct Window {
    started: Instant,
    lines: u32,
    /// Lines not written since the last one that was.
    suppressed: u64,
}

/// The limiter: per kind, lines written in the current window and lines suppressed. A B-tree,
/// not a hash map: the C tests run the library under memcheck, which calls a hash table's
/// block (reached only through an interior pointer) "possibly lost".
#[derive(Debug, Default)]
pub struct PeerLog {
    kinds: Mutex<BTreeMap<&'static str, Window>>,
    /// Lines suppressed since the start, per kind (never reset; bounded by the kinds).
    totals: Mutex<BTreeMap<&'static str, u64>>,
}

impl PeerLog {
    /// Whether a line of `kind` may be written at `now`: `Some(suppressed)` (the lines of
    /// that kind suppressed since the last one written, to say in this one), or `None`
    /// (suppressed; counted).
    pub fn allow(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut m = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let w = m.entry(kind).or_insert(Window {
            started: now,
            lines: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(w.started) >= WINDOW {
            w.started = now;
            w.lines = 0;
        }
        if w.lines >= LINES_PER_WINDOW {
            w.suppressed += 1;
            drop(m);
            *self
                .totals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(kind)
                .or_insert(0) += 1;
            return None;
        }
        w.lines += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

impl PeerLog {
    /// Lines suppressed since the start, per kind: every kind of [`KINDS`] (0 when none was)
    /// and any other that had lines suppressed.
    pub fn suppressed_totals(&self) -> BTreeMap<&'static str, u64> {
        let mut out: BTreeMap<&'static str, u64> = KINDS.iter().map(|&k| (k, 0)).collect();
        for (k, n) in self.totals.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            out.insert(k, *n);
        }
        out
    }

    /// The kinds whose window is over with lines suppressed in it, and how many: each
    /// returned once (its count starts again at zero). For [`flush`]: a flood that stops
    /// still has its suppressed lines reported.
    pub fn due(&self, now: Instant) -> Vec<(&'static str, u64)> {
        let mut m = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (kind, w) in m.iter_mut() {
            if w.suppressed > 0 && now.saturating_duration_since(w.started) >= WINDOW {
                out.push((*kind, std::mem::take(&mut w.suppressed)));
            }
        }
        // Windows with nothing to say are dropped (the table holds active kinds only).
        m.retain(|_, w| now.saturating_duration_since(w.started) < WINDOW || w.suppressed > 0);
        out
    }
}

/// Writes one line per kind whose window ended with lines suppressed (called from the HTTP
/// workers' sweep, every few seconds): the count is reported even when no line of that
/// kind follows.
pub fn flush() {
    for (kind, suppressed) in global().due(Instant::now()) {
        tracing::warn!(
            kind,
            suppressed,
            "warnings a peer caused were suppressed (at most {LINES_PER_WINDOW} a kind per {} s)",
            WINDOW.as_secs()
        );
    }
}

/// The process's limiter.
pub fn global() -> &'static PeerLog {
    static LOG: std::sync::OnceLock<PeerLog> = std::sync::OnceLock::new();
    LOG.get_or_init(PeerLog::default)
}

/// `tracing::warn!` through the process's [`PeerLog`]: `peer_warn!("kind", fields…; "message")`
/// writes the line with `suppressed = N` added when the kind's window allows, else counts it.
#[macro_export]
macro_rules! peer_warn {
    ($kind:expr, $($rest:tt)+) => {
        if let Some(suppressed) =
            $crate::peer_log::global().allow($kind, ::std::time::Instant::now())
        {
            ::tracing::warn!(kind = $kind, suppressed, $($rest)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_writes_its_lines_per_window_and_counts_the_rest() {
        let log = PeerLog::default();
        let t0 = Instant::now();
        let written: Vec<u64> = (0..1000).filter_map(|_| log.allow("a", t0)).collect();
        assert_eq!(written, vec![0; LINES_PER_WINDOW as usize]);
        // Another kind has its own window.
        assert_eq!(log.allow("b", t0), Some(0));
        // The next window's first line says how many were suppressed.
        assert_eq!(
            log.allow("a", t0 + WINDOW),
            Some(1000 - u64::from(LINES_PER_WINDOW))
        );
        assert_eq!(log.allow("a", t0 + WINDOW), Some(0));
        // The totals keep every suppressed line, beside the known kinds at 0.
        let totals = log.suppressed_totals();
        assert_eq!(totals["a"], 1000 - u64::from(LINES_PER_WINDOW));
        assert_eq!(totals.get("b"), None);
        assert!(KINDS.iter().all(|k| totals[k] == 0));
    }

    #[test]
    fn suppressed_counts_are_due_once_their_window_is_over() {
        let log = PeerLog::default();
        let t0 = Instant::now();
        for _ in 0..25 {
            let _ = log.allow("a", t0);
        }
        assert!(log.due(t0).is_empty(), "the window is not over");
        assert_eq!(log.due(t0 + WINDOW), vec![("a", 15)]);
        assert!(log.due(t0 + WINDOW).is_empty(), "reported once");
        // The kind's window starts afresh.
        assert_eq!(log.allow("a", t0 + WINDOW * 2), Some(0));
    }
}
