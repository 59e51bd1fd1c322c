//! `GET /api/v1/events`: server-sent events. A thread compares the streams' states every
//! tick (at most 200 ms apart) and sends a `state` event for each stream whose state changed
//! (a new stream, a stream gone from the table as `gone`), and an `overview` event (what
//! `GET /api/v1/overview` answers, with each stream's lateness over the last interval) every
//! `overview_interval_ms`. Nothing is computed while no one reads.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use penstock_driver::{LATENESS_BUCKETS, LatenessCounts};

use super::{Api, Conn, SSE_KEEPALIVE, next_event, routes};

/// What the last tick saw: each stream's state and lateness counts.
#[derive(Default)]
pub(crate) struct Tracker {
    states: HashMap<String, String>,
    lateness: HashMap<u64, LatenessCounts>,
    /// Each stream's lateness p99 over the last interval (ns), for the overview.
    pub(crate) recent_p99_ns: HashMap<u64, u64>,
}

impl Tracker {
    /// The p99 of the units completed since the last call for stream `id` (an upper bound:
    /// the top of its power-of-two bucket), and remembers `now`.
    pub(crate) fn interval_p99(&mut self, id: u64, now: LatenessCounts) -> u64 {
        let before = self.lateness.insert(id, now).unwrap_or_default();
        let mut d = LatenessCounts {
            max_ns: now.max_ns,
            ..LatenessCounts::default()
        };
        for i in 0..LATENESS_BUCKETS {
            d.buckets[i] = now.buckets[i].saturating_sub(before.buckets[i]);
        }
        d.quantile_ns_max(990_000)
    }
}

fn event(name: &str, data: &serde_json::Value) -> Arc<str> {
    format!("event: {name}\ndata: {data}\n\n").into()
}

/// The events thread: until the API stops.
pub(crate) fn run(api: &Arc<Api>) {
    let interval = Duration::from_millis(api.cfg.overview_interval_ms);
    let tick = interval.min(Duration::from_millis(200));
    let mut last_overview = Instant::now();
    while !api.stop.load(Ordering::Acquire) {
        std::thread::sleep(tick);
        if !api.has_subscribers() {
            continue;
        }
        for (name, data) in state_changes(api) {
            api.publish(event(name, &data));
        }
        if last_overview.elapsed() >= interval {
            last_overview = Instant::now();
            let o = routes::overview(api, true);
            api.publish(event("overview", &o));
        }
    }
}

/// The `state` events since the last call.
fn state_changes(api: &Api) -> Vec<(&'static str, serde_json::Value)> {
    let now: HashMap<String, serde_json::Value> = routes::state_all(api)
        .into_iter()
        .filter_map(|v| Some((v.get("id")?.as_str()?.to_string(), v)))
        .collect();
    let mut t = api.events.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for (id, v) in &now {
        let state = v.get("state").and_then(|s| s.as_str()).unwrap_or("");
        if t.states.get(id).map(String::as_str) != Some(state) {
            t.states.insert(id.clone(), state.to_string());
            out.push(("state", v.clone()));
        }
    }
    let gone: Vec<String> = t
        .states
        .keys()
        .filter(|id| !now.contains_key(*id))
        .cloned()
        .collect();
    for id in gone {
        t.states.remove(&id);
        if let Ok(n) = id.parse::<u64>() {
            t.lateness.remove(&n);
            t.recent_p99_ns.remove(&n);
        }
        out.push(("state", serde_json::json!({ "id": id, "state": "gone" })));
    }
    out
}

/// Serves one event stream on `conn` until the reader goes, the API stops, or a write
/// stalls past the idle timeout.
pub(crate) fn serve(api: &Arc<Api>, mut conn: Conn) -> io::Result<()> {
    let Some(rx) = api.subscribe() else {
        let body = format!(
            "{{\"error\":\"{} event streams are open (api.sse_max): try again later\"}}\n",
            api.cfg.sse_max
        );
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: 5\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(head.as_bytes())?;
        return conn.flush();
    };
    struct Release<'a>(&'a Api);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0.sse.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let _release = Release(api);
    let _ = conn.tcp().set_read_timeout(None);
    conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\nretry: 2000\n\n",
    )?;
    // The reader starts from the whole picture.
    let first = routes::overview(api, false);
    conn.write_all(event("overview", &first).as_bytes())?;
    conn.flush()?;
    let mut last_write = Instant::now();
    while !api.stop.load(Ordering::Acquire) {
        match next_event(&rx, Duration::from_millis(500)) {
            Ok(e) => {
                conn.write_all(e.as_bytes())?;
                conn.flush()?;
                last_write = Instant::now();
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if last_write.elapsed() >= SSE_KEEPALIVE {
                    conn.write_all(b": keepalive\n\n")?;
                    conn.flush()?;
                    last_write = Instant::now();
                }
            }
            // Cut off by `publish` (the reader fell behind).
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Ok(())
}
