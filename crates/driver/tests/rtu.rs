//! Real-Time Upcalls (issue 14, MARS §4.5) on a real engine: periodic callbacks run by a
//! worker's dispatcher beside paced streams (real files, UDP on loopback), admitted against
//! the CPU they declare.
//!
//! A callback's work is a fixed amount of its thread's CPU time (`burn`), so "within its
//! budget" does not depend on this machine's speed. Time appears as counts (activations,
//! skipped, misses under the engine's miss threshold) and as the activations' own releases
//! compared with each other, never as an absolute figure.

use std::net::UdpSocket;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penstock_core::admission::cpu::CpuRefusal;
use penstock_core::endpoint::{Endpoint, Host};
use penstock_core::stream::Extent;
use penstock_core::stream::plan::Pacing;
use penstock_core::time::Instant;
use penstock_driver::clock;
use penstock_driver::{
    Engine, EngineConfig, RtuError, RtuHandle, RtuKeep, RtuReport, RtuSpec, StreamHandle,
    StreamSpec,
};

const MS: Duration = Duration::from_millis(1);
/// The streams' unit: one datagram.
const UNIT: u64 = 1024;

/// Uses `cpu` of this thread's CPU time.
fn burn(cpu: Duration) {
    let t0 = clock::thread_cpu_ns();
    let mut x = 0u64;
    while clock::thread_cpu_ns().saturating_sub(t0) < cpu.as_nanos() as u64 {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

fn engine(workers: usize, streams: usize) -> Engine {
    Engine::new(EngineConfig {
        workers,
        pool_buffers: streams * 2 + 8,
        buffer_bytes: 16 * 1024,
        stream_depth: 2,
        streams_max: streams + 16,
        ..EngineConfig::default()
    })
    .unwrap()
}

/// `n` paced streams of `units` units of [`UNIT`] bytes from `file` to `port` on loopback,
/// unit 0 of stream i due at `t0 + i·period/n`.
fn paced_streams(
    e: &Engine,
    file: &Path,
    port: u16,
    n: usize,
    units: u64,
    period: Duration,
    t0: Instant,
) -> Vec<StreamHandle> {
    let unit = UNIT;
    (0..n)
        .map(|i| {
            let mut s = StreamSpec::new(
                Endpoint::File {
                    path: file.to_path_buf(),
                },
                Endpoint::UdpSend {
                    host: Host::Ip([127, 0, 0, 1].into()),
                    port,
                    local_port: None,
                },
            );
            s.unit_bytes = unit as usize;
            s.pacing = Pacing::Periodic { period };
            s.extent = Extent {
                offset: 0,
                length: Some(units * unit),
            };
            s.start_at = Some(t0 + period.mul_f64(i as f64 / n as f64));
            e.open(s).unwrap()
        })
        .collect()
}

/// A UDP receiver on loopback counting datagrams until `stop`.
fn receiver() -> (u16, Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(50 * MS)).unwrap();
    let port = sock.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let j = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while !stop2.load(Ordering::Relaxed) {
            if sock.recv(&mut buf).is_ok() {
                n += 1;
            }
        }
        n
    });
    (port, stop, j)
}

fn source(dir: &Path, bytes: u64) -> std::path::PathBuf {
    let p = dir.join("source.bin");
    std::fs::write(&p, vec![0x5au8; bytes as usize]).unwrap();
    p
}

/// An upcall that uses `work` of CPU per activation.
fn working(e: &Engine, period: Duration, budget: Duration, work: Duration) -> RtuHandle {
    e.rtu_create(RtuSpec::new(period, budget), Box::new(move |_| burn(work)))
        .unwrap()
}

fn show(name: &str, r: &RtuReport) {
    let l = r.lateness.summary();
    println!(
        "{name}: period {:?} budget {:?}: {} activations, {} overruns, {} misses, {} skipped; \
         lateness p50 {} us p99 {} us max {} us; cpu max {:?} wall max {:?}",
        r.period,
        r.budget,
        r.activations,
        r.overruns,
        l.misses,
        r.skipped,
        l.p50_ns / 1000,
        l.p99_ns / 1000,
        l.max_ns / 1000,
        r.cpu_max,
        r.wall_max
    );
}

/// The acceptance run, shortened: MARS's three upcalls at 60, 75 and 120 ms, each doing
/// 0.5 ms of work within a 5 ms budget, beside 100 streams paced at 30 units/s on the same
/// worker (one dispatcher serves them all), for about 3 s. Deadlines met are measured by
/// `penstock bench rtu --upcalls` (release); here, the structure: every period run or
/// skipped, within budget, the streams paced.
#[test]
fn three_upcalls_beside_100_paced_streams_run_every_period_within_budget() {
    const STREAMS: usize = 100;
    const UNITS: u64 = 100;
    let period = Duration::from_nanos(1_000_000_000 / 30);
    let dir = tempfile::tempdir().unwrap();
    let file = source(dir.path(), UNITS * UNIT);
    let e = engine(1, STREAMS);
    let (port, stop, rx) = receiver();
    // The upcalls first, all released at t0; the streams' phases spread over one period
    // from t0 (opening them takes less than the slack; if not, the streams start late).
    let t0 = clock::now() + 500 * MS;
    let periods = [60, 75, 120];
    let rtus: Vec<RtuHandle> = periods
        .iter()
        .map(|&p| {
            let mut spec = RtuSpec::new(p * MS, 5 * MS);
            spec.start_at = Some(t0);
            e.rtu_create(spec, Box::new(|_| burn(MS / 2))).unwrap()
        })
        .collect();
    assert_eq!(e.cpu_load()[0].rtus, 3);
    let streams = paced_streams(&e, &file, port, STREAMS, UNITS, period, t0);
    // No bound on how long opening took: a stream opened after its start time starts late
    // (its lateness says so), the upcalls' checks below count from t0 either way.
    if clock::now() >= t0 {
        println!("opening 100 streams took longer than the 500 ms slack: they started late");
    }
    let mut sent = 0;
    let mut stream_misses = 0;
    for h in streams {
        let r = h.wait().unwrap();
        assert_eq!(r.units, UNITS);
        sent += r.units;
        let l = r.lateness.unwrap();
        // Every unit's lateness recorded (units sent within the dispatch slack before
        // their due time count as early: allowed; the lower bound below is the pacing).
        assert_eq!(l.units(), UNITS, "{l:?}");
        stream_misses += l.misses();
    }
    let ran_ns = clock::now().as_nanos() - t0.as_nanos();
    // The streams were paced: the last unit is due (UNITS - 1) periods after t0 at least (a
    // lower bound: a loaded machine only makes it later).
    assert!(
        ran_ns >= (UNITS - 1) * period.as_nanos() as u64,
        "{UNITS} units at {period:?} finished {ran_ns} ns after t0: not paced"
    );
    assert_eq!(sent, STREAMS as u64 * UNITS);
    let reports: Vec<RtuReport> = rtus.into_iter().map(|h| h.stop().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let received = rx.join().unwrap();
    println!(
        "100 streams: {sent} units sent, {stream_misses} late by more than a period; {received} datagrams received"
    );
    for (p, r) in periods.iter().zip(&reports) {
        show(&format!("{p} ms"), r);
        // Every period since t0 had its activation or was skipped on the grid (none lost,
        // none twice), and none overran its CPU budget (CPU time, not wall time). Whether
        // each met its deadline depends on the machine's load beside the test: misses are
        // printed here and measured by `penstock bench rtu` (release, docs/rtu.md), not
        // asserted.
        let due = ran_ns / (u64::from(*p) * 1_000_000) + 1;
        assert!(
            r.activations + r.skipped + 1 >= due && r.activations + r.skipped <= due + 1,
            "{p} ms: {} activations, {} skipped, {due} periods",
            r.activations,
            r.skipped
        );
        assert!(r.lateness.misses() <= r.activations, "{p} ms");
        assert_eq!(r.overruns, 0, "{p} ms");
        assert_eq!(
            r.lateness.early_units(),
            0,
            "{p} ms: started before its release"
        );
    }
    // Their CPU is given back.
    assert_eq!(e.cpu_load()[0].rtus, 0);
}

#[test]
fn an_over_committed_set_is_refused_at_create_and_removing_frees() {
    let e = engine(1, 4);
    let work = MS / 10;
    // MARS's periods with budgets of a third of each: utilization 1.0 in all.
    let first = working(&e, 60 * MS, 20 * MS, work);
    let refused = e
        .rtu_create(RtuSpec::new(75 * MS, 25 * MS), Box::new(|_| {}))
        .unwrap_err();
    let msg = refused.to_string();
    println!("{msg}");
    assert!(
        matches!(
            refused,
            RtuError::Refused(CpuRefusal::Unschedulable { alone: false, .. })
        ),
        "{msg}"
    );
    assert!(
        msg.contains("utilization 0.667 of a worker") && msg.contains("> bound 0.700"),
        "{msg}"
    );
    let load = e.cpu_load();
    assert_eq!((load[0].rtus, load[0].utilization_ppb), (1, 333_333_334));
    // Bad specs are refused as such.
    for (p, b, what) in [(60, 0, "budget of 0"), (60, 61, "longer than the period")] {
        let err = e
            .rtu_create(RtuSpec::new(p * MS, b * MS), Box::new(|_| {}))
            .unwrap_err();
        assert!(
            matches!(err, RtuError::Refused(CpuRefusal::Invalid { .. }))
                && err.to_string().contains(what),
            "{err}"
        );
    }
    // Not even alone: more than the bound on an idle worker.
    let alone = e
        .rtu_create(RtuSpec::new(10 * MS, 6 * MS), Box::new(|_| {}))
        .unwrap_err();
    assert!(
        alone.to_string().ends_with("(it would not fit even alone)"),
        "{alone}"
    );
    // The refusals changed nothing: the first upcall runs on.
    let before = first.stats().activations;
    while first.stats().activations < before + 2 {
        std::thread::sleep(10 * MS);
    }
    assert!(first.stats().running);
    // Removing it frees its CPU: the refused one now fits.
    let r = first.stop().unwrap();
    assert!(r.activations >= 2);
    assert_eq!(e.cpu_load()[0].rtus, 0);
    let second = working(&e, 75 * MS, 25 * MS, work);
    // A dropped handle cancels its upcall and frees its CPU too (when the worker takes it).
    drop(second);
    let mut polls = 0;
    while e.cpu_load()[0].rtus != 0 {
        polls += 1;
        assert!(polls < 500, "the dropped upcall still holds its CPU");
        std::thread::sleep(10 * MS);
    }
}

#[test]
fn upcalls_spread_over_workers_and_a_set_no_worker_takes_is_refused() {
    let e = engine(2, 4);
    let a = working(&e, 60 * MS, 20 * MS, MS / 10);
    let b = working(&e, 75 * MS, 25 * MS, MS / 10);
    let load = e.cpu_load();
    assert_eq!((load[0].rtus, load[1].rtus), (1, 1));
    let err = e
        .rtu_create(RtuSpec::new(120 * MS, 40 * MS), Box::new(|_| {}))
        .unwrap_err();
    assert!(matches!(err, RtuError::Refused(_)), "{err}");
    assert_eq!(e.cpu_load().iter().map(|l| l.rtus).sum::<u32>(), 2);
    a.stop().unwrap();
    b.stop().unwrap();
}

#[test]
fn a_panicking_callback_is_cancelled_and_the_worker_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = source(dir.path(), 40 * 1024);
    let e = engine(1, 4);
    let calls = Arc::new(AtomicU64::new(0));
    let calls2 = calls.clone();
    let bad = e
        .rtu_create(
            RtuSpec::new(10 * MS, MS),
            Box::new(move |a| {
                calls2.fetch_add(1, Ordering::Relaxed);
                if a.seq == 2 {
                    panic!("boom in the callback");
                }
            }),
        )
        .unwrap();
    let good = working(&e, 10 * MS, MS, MS / 10);
    // A paced stream on the same worker.
    let (port, stop, rx) = receiver();
    let streams = paced_streams(&e, &file, port, 1, 40, 5 * MS, clock::now());
    match bad.wait() {
        Err(RtuError::Panicked {
            seq,
            message,
            report,
        }) => {
            assert_eq!(seq, 2);
            assert!(message.contains("boom in the callback"), "{message}");
            assert_eq!(report.activations, 3);
        }
        other => panic!("expected a panic report, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::Relaxed), 3, "never called again");
    assert_eq!(e.cpu_load()[0].rtus, 1, "its CPU was given back");
    // The worker lives: the other upcall goes on, the stream completes.
    let before = good.stats().activations;
    for h in streams {
        assert_eq!(h.wait().unwrap().units, 40);
    }
    while good.stats().activations < before + 3 {
        std::thread::sleep(5 * MS);
    }
    assert!(good.stats().running);
    let r = good.stop().unwrap();
    assert_eq!(r.overruns, 0);
    stop.store(true, Ordering::Relaxed);
    rx.join().unwrap();
}

#[test]
fn overruns_are_counted_and_activations_whose_period_passed_are_skipped_on_the_grid() {
    let e = engine(1, 1);
    // Declares 1 ms, uses 2 ms: every activation overruns.
    let over = working(&e, 20 * MS, MS, 2 * MS);
    // Declares 1 ms every 10 ms, uses 25 ms: each activation outlives the next periods.
    let releases = Arc::new(Mutex::new(Vec::new()));
    let rel2 = releases.clone();
    let hog = e
        .rtu_create(
            RtuSpec::new(10 * MS, MS),
            Box::new(move |a| {
                rel2.lock().unwrap().push((a.seq, a.release, a.deadline));
                burn(25 * MS);
            }),
        )
        .unwrap();
    while hog.stats().activations < 8 {
        std::thread::sleep(10 * MS);
    }
    let (h, o) = (hog.stop().unwrap(), over.stop().unwrap());
    show("hog", &h);
    show("over", &o);
    assert_eq!(o.overruns, o.activations);
    assert!(o.cpu_max >= 2 * MS && o.cpu_max >= o.budget);
    assert_eq!(h.overruns, h.activations);
    assert!(h.skipped > 0, "{h:?}");
    let rel = releases.lock().unwrap();
    assert_eq!(rel.len() as u64, h.activations);
    let (first_seq, first, _) = rel[0];
    assert_eq!(first_seq, 0);
    for w in rel.windows(2) {
        let ((s0, _, _), (s1, r1, d1)) = (w[0], w[1]);
        assert!(s1 > s0, "numbers only go up");
        // Releases stay on the grid: activation s is released at first + s · period.
        assert_eq!(r1.as_nanos() - first.as_nanos(), s1 * 10_000_000);
        assert_eq!(d1.as_nanos() - r1.as_nanos(), 10_000_000);
    }
    // Every number up to the last is either run or skipped.
    let last = rel.last().unwrap().0;
    assert!(h.activations + h.skipped > last, "{h:?}");
}

/// Polls `cond` every 5 ms; panics naming `what` after 2,000 polls (a bounded wait on the
/// worker, never a fixed one).
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        std::thread::sleep(5 * MS);
    }
    panic!("{what}: not within 2,000 polls");
}

/// MARS's `rtu_suspend` / `rtu_run`: a suspended upcall is not activated; kept, its CPU stays
/// reserved (another upcall that needs it is refused) and `run` cannot be refused; given
/// back, another upcall may take it and `run` is then refused naming the utilization, until
/// that one ends. Each `run` resumes the activations.
#[test]
fn a_suspended_upcall_keeps_or_gives_back_its_cpu_and_runs_again() {
    let e = engine(1, 4);
    let work = MS / 10;
    let a = working(&e, 20 * MS, 8 * MS, work);
    until("first activations", || a.stats().activations >= 3);
    let load = |e: &Engine| e.cpu_load()[0].utilization_ppb;
    let reserved = load(&e);
    assert_eq!(reserved, 400_000_000);

    // Suspended with its reservation: no activation while suspended, the CPU still held.
    a.suspend(RtuKeep::Reservation).unwrap();
    until("the worker suspends it", || a.stats().suspended);
    let n = a.stats().activations;
    // A window of five periods in which a running upcall would be activated five times.
    std::thread::sleep(100 * MS);
    assert_eq!(a.stats().activations, n, "activated while suspended");
    assert_eq!(
        a.stats().lateness.units_skipped,
        0,
        "a suspension skips nothing"
    );
    assert_eq!(load(&e), reserved, "the kept reservation");
    let other = RtuSpec::new(20 * MS, 5 * MS);
    assert!(matches!(
        e.rtu_create(other, Box::new(|_| {})),
        Err(RtuError::Refused(_))
    ));
    a.suspend(RtuKeep::Nothing).unwrap(); // already suspended: its first keep holds
    a.run().unwrap();
    until("activations after run", || {
        a.stats().activations >= n + 3 && !a.stats().suspended
    });

    // Suspended without it: the CPU goes back; another upcall takes it; run is refused.
    a.suspend(RtuKeep::Nothing).unwrap();
    until("the CPU given back", || load(&e) == 0);
    let b = working(&e, 20 * MS, 8 * MS, work);
    let refused = a.run().unwrap_err();
    assert!(
        matches!(refused, RtuError::Refused(_)) && refused.to_string().contains("utilization"),
        "{refused}"
    );
    assert!(a.stats().suspended, "a refused run leaves it suspended");
    let n = a.stats().activations;
    b.stop().unwrap();
    until("b's CPU back", || load(&e) == 0);
    a.run().unwrap();
    assert_eq!(load(&e), reserved, "admitted again");
    until("activations after the second run", || {
        a.stats().activations >= n + 3
    });
    let r = a.stop().unwrap();
    assert_eq!(r.overruns, 0);
    working(&e, 20 * MS, 8 * MS, work).stop().unwrap();
}
