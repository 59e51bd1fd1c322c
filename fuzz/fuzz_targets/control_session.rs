#![no_main]
//! Sequences of control-protocol commands from several connections against one stream
//! table, over a fake backend (no files, no sockets, no engine threads): the session layer
//! (identity, AUTH, limits, the stream states, admission bookkeeping) must never panic, never
//! hang on its locks (libFuzzer's -timeout catches a stuck lock), and keep its books:
//! after every step, the admitted streams are exactly those pending, running or paused.
//!
//! Input: lines. A line's first byte picks the connection (low 2 bits) and what happens
//! (next 3 bits): 0-4 the rest of the line is a command; 5 the reaper runs; 6 the connection
//! ends (its non-detached streams close) and a new one takes its place; 7 every running
//! stream of the fake backend moves on by a step.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use penstock_core::admission::{DeviceId, QosClass, ReadGeometry, Refusal, StreamQos, Usage};
use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::stream::{CachePolicy, DataPath, IoKind};
use penstock_driver::DiskClass;
use penstock_driver::open::Opened;
use penstock_driver::{
    CounterSnapshot, DiskSettings, DiskTuning, LatenessCounts, StreamError, StreamReport,
    StreamSpec,
};
use penstock_server::access::{Denied, Prepared};
use penstock_server::config::ControlConfig;
use penstock_server::control::{ControlShared, Session, handle_line};
use penstock_server::streams::{Backend, Identity, RunningStream, Streams, Ticket};

const TOKEN: &str = "tok";

static METRICS: std::sync::OnceLock<Arc<penstock_server::Metrics>> = std::sync::OnceLock::new();

/// A stream of the fake backend: moves `step` bytes each time the harness says so.
struct FakeRun {
    total: u64,
    sent: Arc<AtomicU64>,
    paused: AtomicBool,
    cancelled: AtomicBool,
    /// The stream's admission reservation, given back with it.
    _ticket: Option<Ticket>,
}

impl RunningStream for FakeRun {
    fn counters(&self) -> CounterSnapshot {
        let sent = self.sent.load(Ordering::Acquire).min(self.total);
        CounterSnapshot {
            bytes_read: sent,
            bytes_sent: sent,
            units_sent: sent / 1316,
        }
    }
    fn lateness(&self) -> LatenessCounts {
        LatenessCounts::default()
    }
    fn pause(&self) {
        self.paused.store(true, Ordering::Release);
    }
    fn resume(&self) {
        self.paused.store(false, Ordering::Release);
    }
    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }
    fn set_class(&self, _class: penstock_driver::DiskClass) -> Result<(), StreamError> {
        // The fake has one queue: a class is a label here.
        Ok(())
    }
    fn wait_timeout(&self, _: Duration) -> Option<Result<StreamReport, StreamError>> {
        let sent = self.counters().bytes_sent;
        if self.cancelled.load(Ordering::Acquire) {
            return Some(Err(StreamError::Cancelled { bytes_sent: sent }));
        }
        (sent >= self.total).then(|| {
            Ok(StreamReport {
                bytes: sent,
                units: sent / 1316,
                planned: DataPath::Copy,
                executed: Some(DataPath::Copy),
                moved: penstock_driver::MovedBytes {
                    copy_read: sent,
                    copy_written: sent,
                    ..Default::default()
                },
                cache: CachePolicy::Keep,
                elapsed: Duration::ZERO,
                notes: Vec::new(),
                lateness: None,
                trace: Vec::new(),
            })
        })
    }
}

/// Files under /ok are permitted, /fail permitted but failing to open, the rest forbidden;
/// every other endpoint is permitted and opens at once (a listener has its peer already).
struct FakeBackend {
    running: Mutex<Vec<(Arc<AtomicU64>, bool)>>,
    /// Admission: an rt stream with a schedule gets a ticket while fewer than 3 are out.
    tickets: Arc<AtomicU64>,
    /// `TUNE disk`: checked by the driver's own rules for 1 MiB reads.
    disk: Mutex<DiskSettings>,
}

/// A fake admission reservation: counted while it lives (a started stream keeps it).
struct FakeTicket(Arc<AtomicU64>);

impl Drop for FakeTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl FakeBackend {
    fn step(&self) {
        for (sent, _) in self.running.lock().unwrap().iter() {
            sent.fetch_add(64 << 10, Ordering::AcqRel);
        }
    }
}

impl Backend for FakeBackend {
    fn check(&self, ep: &Endpoint, _role: Role) -> Result<(), Denied> {
        match ep {
            Endpoint::File { path } if path.starts_with("/ok") || path.starts_with("/fail") => {
                Ok(())
            }
            Endpoint::File { .. } | Endpoint::Stdio => Err(Denied::Forbidden("fake".into())),
            _ => Ok(()),
        }
    }
    fn prepare(&self, ep: &Endpoint, role: Role, _truncate: bool) -> Result<Prepared, Denied> {
        self.check(ep, role)?;
        if matches!(ep, Endpoint::File { path } if path.starts_with("/fail")) {
            return Err(Denied::Failed("fake failure".into()));
        }
        let fd = std::fs::File::open("/dev/null")
            .map_err(|e| Denied::Failed(e.to_string()))?
            .into();
        let (kind, size, socket) = match ep {
            Endpoint::File { .. } | Endpoint::Volume { .. } => (IoKind::File, Some(1 << 20), false),
            Endpoint::UdpSend { .. } | Endpoint::UdpListen { .. } => (IoKind::Datagram, None, true),
            _ => (IoKind::StreamSocket, None, true),
        };
        Ok(Prepared::Ready(Opened {
            fd,
            kind,
            size,
            socket,
            label: ep.to_string(),
            volume: None,
        }))
    }
    fn admit(
        &self,
        spec: &StreamSpec,
        datagram: bool,
    ) -> Result<Option<(Ticket, StreamQos)>, StreamError> {
        // The planner's rules, as the engine applies them (class=rt needs pacing, …).
        let limits = penstock_core::stream::plan::PlanLimits {
            buffer_bytes: 1 << 20,
            rt_buffers_default: 2,
            rt_buffers_max: 8,
        };
        let asked =
            penstock_core::stream::plan::admission_request(&spec.plan_request(), datagram, &limits)?;
        if spec.class != Some(DiskClass::Rt) || asked.is_none() {
            return Ok(None);
        }
        if self.tickets.fetch_add(1, Ordering::AcqRel) >= 3 {
            self.tickets.fetch_sub(1, Ordering::AcqRel);
            return Err(StreamError::Refused(Refusal::StreamsMax { streams_max: 3 }));
        }
        let qos = StreamQos {
            class: QosClass::Rt,
            rate_bytes_per_s: 1,
            unit_bytes: 1316,
            buffers: 2,
            reads: ReadGeometry::single(1316 * 796, DeviceId::UNKNOWN),
            datagrams: true,
        };
        Ok(Some((
            Box::new(FakeTicket(self.tickets.clone())) as Ticket,
            qos,
        )))
    }
    fn admission_usage(&self) -> (Usage, Usage) {
        (Usage::default(), Usage::default())
    }
    fn start(
        &self,
        spec: StreamSpec,
        source: Opened,
        _target: Opened,
        ticket: Option<Ticket>,
    ) -> Result<Box<dyn RunningStream>, StreamError> {
        let size = source.size.unwrap_or(1 << 20);
        let (start, end) = spec.extent.resolve_in_file(size)?;
        let sent = Arc::new(AtomicU64::new(0));
        self.running.lock().unwrap().push((sent.clone(), true));
        Ok(Box::new(FakeRun {
            total: end - start,
            sent,
            paused: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            _ticket: ticket,
        }))
    }
    fn buffer_bytes(&self) -> usize {
        1 << 20
    }
    fn uring_available(&self) -> bool {
        true
    }
    fn disk_settings(&self) -> DiskSettings {
        self.disk.lock().unwrap().clone()
    }
    fn tune_disk(&self, t: &DiskTuning) -> Result<DiskSettings, String> {
        let mut d = self.disk.lock().unwrap();
        *d = d.tuned(t, 1 << 20).map_err(|e| e.to_string())?;
        Ok(d.clone())
    }
}

fn stat(lines: &[String], key: &str) -> u64 {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {lines:?}"))
}

/// The table's books agree with themselves and with the backend's: the reservations out are
/// exactly the streams the table counts as admitted, all of them live.
fn check_books(streams: &Streams, tickets: &AtomicU64) {
    let s = streams.stats_lines();
    let live =
        stat(&s, "streams_pending") + stat(&s, "streams_running") + stat(&s, "streams_paused");
    assert_eq!(
        stat(&s, "admitted"),
        tickets.load(Ordering::Acquire),
        "{s:?}"
    );
    assert!(stat(&s, "admitted") <= live, "{s:?}");
    assert_eq!(
        stat(&s, "streams"),
        live + stat(&s, "streams_done") + stat(&s, "streams_failed"),
        "{s:?}"
    );
}

fn identity_of(slot: usize) -> Identity {
    match slot {
        0 | 1 => Identity::Peer {
            uid: 1000,
            gid: 1000,
        },
        _ => Identity::Anonymous,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut config = ControlConfig::default();
    config.streams_per_connection_max = 6;
    config.streams_per_identity_max = 10;
    config.pending_timeout_ms = 1;
    config.line_bytes_max = 256;
    let backend = Arc::new(FakeBackend {
        running: Mutex::new(Vec::new()),
        tickets: Arc::new(AtomicU64::new(0)),
        disk: Mutex::new(DiskSettings {
            rt_quantum_bytes: 4 << 20,
            bulk_quantum_bytes: 1 << 20,
            disk_inflight_max: 8,
            named_quanta: vec![],
        }),
    });
    let streams = Arc::new(Streams::new(
        Box::new(backend.clone()),
        // One registry for the whole run: building it is most of an input's cost, and the
        // books checked are the table's own.
        METRICS
            .get_or_init(|| Arc::new(penstock_server::Metrics::new()))
            .clone(),
        config.clone(),
    ));
    let control = Arc::new(
        ControlShared::new(streams.clone(), config, TOKEN.into(), Box::new(|| 0))
            .with_auth_fail_delay(Duration::ZERO),
    );
    let mut next_conn = 0u64;
    let mut connect = |slot: usize| {
        next_conn += 1;
        Session::new(next_conn, identity_of(slot), format!("fuzz{slot}"))
    };
    let mut sessions: Vec<Session> = (0..4).map(&mut connect).collect();
    for line in data.split(|&b| b == b'\n').take(64) {
        let Some((&sel, rest)) = line.split_first() else {
            continue;
        };
        let slot = usize::from(sel & 3);
        match (sel >> 2) & 7 {
            0..=4 => {
                let (_reply, close) = handle_line(&control, &mut sessions[slot], rest);
                if close {
                    streams.connection_closed(sessions[slot].conn());
                    sessions[slot] = connect(slot);
                }
            }
            5 => streams.reap(),
            6 => {
                streams.connection_closed(sessions[slot].conn());
                sessions[slot] = connect(slot);
            }
            _ => backend.step(),
        }
        check_books(&streams, &backend.tickets);
    }
    for s in &sessions {
        streams.connection_closed(s.conn());
    }
    check_books(&streams, &backend.tickets);
    streams.shutdown(Duration::ZERO);
});
