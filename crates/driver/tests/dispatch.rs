//! The dispatch slack (`EngineConfig::dispatch_slack`, issue 15's scale goal), on the real
//! kernel: many paced UDP streams on one worker whose units fall due within one slack of each
//! other are sent from one wake-up — the worker's own count of system calls (io_uring_enter,
//! clock_nanosleep) per unit shows it — every unit still has its lateness measured against its
//! own deadline, and none is sent before its deadline minus the slack (with no slack, none
//! before its deadline).

use std::net::{Ipv4Addr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Role};
use penstock_core::stream::plan::Pacing;
use penstock_core::stream::{DataPath, Extent, PathChoice};
use penstock_core::time::Instant;
use penstock_driver::{Engine, EngineConfig, StreamReport, StreamSpec};

const STREAMS: u64 = 32;
const UNIT_BYTES: u64 = 1316;
const UNITS: u64 = 20;
const PERIOD: Duration = Duration::from_millis(10);
/// Stream `i`'s unit `n` is due at `start + n · PERIOD + i · OFFSET`: the 32 streams' units
/// of one period fall due over 465 µs, within the default slack (500 µs).
const OFFSET: Duration = Duration::from_micros(15);
/// Time for the streams to open and read their files before unit 0 of the first is due.
const LEAD: Duration = Duration::from_millis(150);
const HANG: Duration = Duration::from_secs(30);

fn engine(slack: Duration) -> Engine {
    Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 160,
        buffer_bytes: 64 << 10,
        stream_depth: 4,
        dispatch_slack: slack,
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

fn spec(source: &Path, to: std::net::SocketAddr, start: Instant) -> StreamSpec {
    let mut s = StreamSpec::new(
        Endpoint::File {
            path: source.to_path_buf(),
        },
        Endpoint::parse(&format!("udp://{to}"), Role::Target).expect("target endpoint"),
    );
    s.path = PathChoice::Fixed(DataPath::Uring);
    s.unit_bytes = UNIT_BYTES as usize;
    s.extent = Extent {
        offset: 0,
        length: Some(UNITS * UNIT_BYTES),
    };
    s.pacing = Pacing::Periodic { period: PERIOD };
    s.unit_bytes = (UNIT_BYTES) as usize;
    s.trace = true;
    s.start_at = Some(start);
    s
}

/// What one run of the 32 streams showed.
struct Run {
    /// The worker's system calls from just after unit 0 to just before the last unit, and
    /// the units due in that window.
    syscalls: u64,
    units: u64,
    periods: u64,
    reports: Vec<StreamReport>,
}

fn run(slack: Duration, source: &Path) -> Option<Run> {
    let e = engine(slack);
    penstock_testreq::require_ok("io_uring", e.info().uring.clone())?;
    let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    // Nothing reads it: a full receive queue drops datagrams, and sends complete all the same.
    let to = rx.local_addr().unwrap();
    let start = penstock_driver::clock::now() + LEAD;
    let handles: Vec<_> = (0..STREAMS)
        .map(|i| {
            let at = start + OFFSET * u32::try_from(i).unwrap();
            e.open(spec(source, to, at)).expect("stream opens")
        })
        .collect();
    // The window: from unit 1's period to unit UNITS - 2's (open and read-ahead excluded).
    let sleep_until = |t: Instant| {
        let now = penstock_driver::clock::now();
        std::thread::sleep(t.saturating_duration_since(now));
    };
    // (Pacing the test's own reads, not waiting for another process: a late wake-up of this
    // thread widens the window, and the periods are counted from the window as it was.)
    sleep_until(start + PERIOD / 2);
    let before = e.worker_syscalls();
    let t_before = penstock_driver::clock::now();
    let from_unit = 1;
    let to_unit = UNITS - 2;
    sleep_until(start + PERIOD * u32::try_from(to_unit).unwrap() + PERIOD / 2);
    let after = e.worker_syscalls();
    let window = penstock_driver::clock::now().saturating_duration_since(t_before);
    let reports = handles
        .into_iter()
        .map(|h| match h.wait_timeout(HANG) {
            Some(r) => r.expect("the stream ends well"),
            None => panic!("a stream hung"),
        })
        .collect();
    drop(rx);
    Some(Run {
        syscalls: after - before,
        units: (to_unit - from_unit + 1) * STREAMS,
        // The periods the window spanned (rounded up), as measured.
        periods: window.as_nanos().div_ceil(PERIOD.as_nanos()) as u64,
        reports,
    })
}

fn source(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("units.bin");
    std::fs::write(&path, vec![0x47u8; (UNITS * UNIT_BYTES) as usize]).unwrap();
    path
}

/// Every unit sent once, its lateness measured against its own deadline, and none completed
/// before its deadline minus `slack`.
fn check_every_unit(run: &Run, slack: Duration) {
    for r in &run.reports {
        assert_eq!(r.units, UNITS, "every unit sent");
        let stats = r.lateness.as_ref().expect("a paced stream has lateness");
        assert_eq!(stats.units(), UNITS, "every unit's lateness measured");
        assert_eq!(r.trace.len() as u64, UNITS, "every unit traced");
        for t in &r.trace {
            let earliest = Instant::from_nanos(
                t.scheduled
                    .as_nanos()
                    .saturating_sub(u64::try_from(slack.as_nanos()).unwrap()),
            );
            assert!(
                t.completed >= earliest,
                "unit {} of stream {} completed {:?} before its deadline (slack {slack:?})",
                t.seq,
                t.stream,
                t.scheduled.saturating_duration_since(t.completed)
            );
        }
    }
}

#[test]
fn units_due_within_the_slack_leave_from_one_wake_up_and_none_early() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path());
    let slack = penstock_driver::engine::DISPATCH_SLACK_DEFAULT;
    assert!(
        OFFSET * u32::try_from(STREAMS - 1).unwrap() < slack,
        "the test's units of one period fall due within one slack"
    );
    let Some(batched) = run(slack, &src) else {
        return;
    };
    check_every_unit(&batched, slack);
    let Some(unbatched) = run(Duration::ZERO, &src) else {
        return;
    };
    check_every_unit(&unbatched, Duration::ZERO);
    let per_unit = |r: &Run| r.syscalls as f64 / r.units as f64;
    eprintln!(
        "system calls per unit: {:.3} with a {slack:?} slack, {:.3} without ({} units)",
        per_unit(&batched),
        per_unit(&unbatched),
        batched.units
    );
    // A period's 32 units leave from one wake-up: the timer's return, one enter handing the
    // 32 sends to the kernel (their completions come back in it), and the sleep — about 3 per
    // period. Allow 8 per period (a late wake-up, a read completing), still 4 units per call;
    // sending unit by unit costs at least one per unit.
    let periods = batched.periods;
    assert!(
        batched.syscalls <= 8 * periods,
        "{} system calls for {periods} periods of {STREAMS} units due within the slack",
        batched.syscalls
    );
}
