//! A worker's command channel is bounded (`EngineConfig::worker_commands_max`, issue 34): while
//! its loop is held up, openers may queue that many commands, and the next open is refused
//! with a typed error that holds nothing (its place under `streams_max` is given back). Real
//! files, the real engine; the loop is held up by a done hook that blocks on the worker.

use std::sync::mpsc;
use std::time::Duration;

use penstock_core::endpoint::{Endpoint, Role};
use penstock_driver::{Engine, EngineConfig, StreamError, StreamSpec};

/// How long anything here may take before the test counts it as hung (an upper bound).
const HANG: Duration = Duration::from_secs(60);

fn copy(dir: &std::path::Path, name: &str) -> StreamSpec {
    let src = dir.join("src");
    StreamSpec::new(
        Endpoint::parse(src.to_str().expect("UTF-8"), Role::Source).expect("source"),
        Endpoint::parse(dir.join(name).to_str().expect("UTF-8"), Role::Target).expect("target"),
    )
}

#[test]
fn a_full_worker_queue_refuses_the_open_and_holds_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes: Vec<u8> = (0..(1u32 << 20) + 7).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("src"), &bytes).expect("source file");
    // Out-of-range settings are refused at start.
    for bad in [0, penstock_driver::engine::WORKER_COMMANDS_MAX_LIMIT + 1] {
        let e = Engine::new(EngineConfig {
            worker_commands_max: bad,
            ..EngineConfig::default()
        });
        assert!(e.is_err(), "worker_commands_max = {bad} was accepted");
    }
    let engine = Engine::new(EngineConfig {
        workers: 1,
        pool_buffers: 8,
        streams_max: 4,
        worker_commands_max: 2,
        ..EngineConfig::default()
    })
    .expect("engine starts");

    // Stream A's done hook blocks the worker's loop until released.
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let a = engine.open(copy(dir.path(), "a")).expect("A opens");
    a.notify_when_done(Box::new(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.recv_timeout(HANG);
    }));
    entered
        .recv_timeout(HANG)
        .expect("A's hook runs on the worker");

    // The loop is held: two opens fill its channel, the third is refused.
    let b = engine.open(copy(dir.path(), "b")).expect("B is queued");
    let c = engine.open(copy(dir.path(), "c")).expect("C is queued");
    match engine.open(copy(dir.path(), "d")) {
        Err(StreamError::WorkerQueueFull { commands_max: 2 }) => {}
        Err(e) => panic!("D: refused for another reason: {e}"),
        Ok(_) => panic!("D: accepted with the worker's queue full"),
    }
    assert!(
        !dir.path().join("d").exists()
            || std::fs::metadata(dir.path().join("d")).map_or(0, |m| m.len()) == 0,
        "the refused stream wrote"
    );

    // Released, the loop drains its queue. D's place under streams_max (4) was given back:
    // with A, B and C still held, a fourth opens (retried while the queue is still full).
    release.send(()).expect("the hook waits");
    let deadline = std::time::Instant::now() + HANG;
    let e = loop {
        match engine.open(copy(dir.path(), "e")) {
            Ok(h) => break h,
            Err(StreamError::WorkerQueueFull { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("E: {e} (the refused D kept its place?)"),
        }
    };
    // B, C and E run whole.
    for (name, h) in [("b", b), ("c", c), ("e", e)] {
        let r = h.wait().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.bytes, bytes.len() as u64, "{name}");
        assert!(
            std::fs::read(dir.path().join(name)).expect("target") == bytes,
            "{name}: differs"
        );
    }
    assert_eq!(a.wait().expect("A").bytes, bytes.len() as u64);
}
