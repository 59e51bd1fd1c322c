//! Cues' (k, t) as the paper defines it (`Pacing::KtPause`, `pause=K,T`) on the real engine:
//! `k` units, then a pause of `t` after the last of them was sent. The trace's own instants
//! give lower bounds only (no upper bound on wall time): each cycle's first unit leaves at
//! least `t` after the previous cycle's last unit completed, so a run of `c` cycles lasts at
//! least `(c − 1) · t` plus the sends; the cycle form (`schedule=K,T`) of the same (k, t)
//! starts its cycles on the grid instead, and is checked for the contrast.

use std::path::Path;
use std::time::Duration;

use penstock_core::endpoint::Endpoint;
use penstock_core::stream::plan::Pacing;
use penstock_core::stream::{DataPath, PathChoice};
use penstock_driver::{Engine, EngineConfig, StreamReport, StreamSpec};

const UNIT: u64 = 4096;
const K: u64 = 4;
const T: Duration = Duration::from_millis(30);
const CYCLES: u64 = 6;

fn run(e: &Engine, dir: &Path, pacing: Pacing, name: &str) -> StreamReport {
    let src = dir.join("src.bin");
    if !src.exists() {
        let bytes: Vec<u8> = (0..UNIT * K * CYCLES).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, bytes).unwrap();
    }
    let mut s = StreamSpec::new(
        Endpoint::File { path: src.clone() },
        Endpoint::File {
            path: dir.join(name),
        },
    );
    s.path = PathChoice::Fixed(DataPath::Uring);
    s.unit_bytes = UNIT as usize;
    s.pacing = pacing;
    s.trace = true;
    let r = e.open(s).unwrap().wait().unwrap();
    assert_eq!(r.bytes, UNIT * K * CYCLES);
    assert_eq!(
        std::fs::read(dir.join(name)).unwrap(),
        std::fs::read(&src).unwrap()
    );
    r
}

#[test]
fn the_pause_form_waits_t_after_each_cycles_last_send() {
    let e = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 16,
        buffer_bytes: 64 << 10,
        ..EngineConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        &e,
        dir.path(),
        Pacing::KtPause {
            cycle_units: K,
            pause: T,
        },
        "pause.bin",
    );
    let trace = &r.trace;
    assert_eq!(trace.len() as u64, K * CYCLES);
    let t_ns = T.as_nanos() as u64;
    let mut gaps = Vec::new();
    for c in 1..CYCLES {
        let last = &trace[(c * K - 1) as usize];
        let first = &trace[(c * K) as usize];
        // Due a pause after the previous cycle's last send completed, and sent no earlier.
        assert!(
            first.scheduled.as_nanos() >= last.completed.as_nanos() + t_ns,
            "cycle {c} due {} ns after the last send",
            first.scheduled.as_nanos() as i128 - last.completed.as_nanos() as i128
        );
        assert!(first.completed.as_nanos() >= last.completed.as_nanos() + t_ns);
        gaps.push((first.completed.as_nanos() - last.completed.as_nanos()) / 1000);
        // Inside a cycle every unit is due with the first.
        for u in c * K..c * K + K {
            assert_eq!(trace[u as usize].scheduled, first.scheduled);
        }
    }
    let span = trace.last().unwrap().completed.as_nanos() - trace[0].completed.as_nanos();
    assert!(span >= (CYCLES - 1) * t_ns);
    println!(
        "pause form: gaps between cycles {gaps:?} us (each >= {} us)",
        t_ns / 1000
    );

    // The cycle form of the same (k, t): cycle i due at start + i·t, whatever the sends took.
    let r = run(
        &e,
        dir.path(),
        Pacing::Kt {
            cycle_units: K,
            cycle: T,
        },
        "cycle.bin",
    );
    let start = r.trace[0].scheduled.as_nanos();
    for (u, rec) in r.trace.iter().enumerate() {
        assert_eq!(
            rec.scheduled.as_nanos() - start,
            (u as u64 / K) * t_ns,
            "unit {u}"
        );
    }
}
