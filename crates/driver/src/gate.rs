//! One writer at a time on a socket two parties write: an RTSP connection's TCP socket,
//! written by its connection thread (replies, RTCP frames) and by the engine (interleaved RTP
//! frames, sent from the pool). Each takes the gate before the first byte of a message and
//! gives it back after the last, so a reply never lands inside a frame nor a frame inside a
//! reply. The engine's worker never blocks on it: it tries, and when the gate is taken waits
//! a short while in its event loop (`uring_path`); the connection thread waits a bounded
//! time ([`WriterGate::acquire_within`]).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

const FREE: u8 = 0;
const HELD: u8 = 1;
/// A writer stopped inside a message (a stream ended mid-frame): the socket's byte stream is
/// broken, and no one may write on it again.
const BROKEN: u8 = 2;

/// How long the worker waits before it tries a taken gate again.
pub const RETRY: Duration = Duration::from_micros(200);

#[derive(Debug, Default)]
pub struct WriterGate {
    state: AtomicU8,
    /// The connection thread waits for the gate: the engine lets it have the gate before its
    /// next frame (else a backlog of due frames, each taken as the last one is given back,
    /// would starve a reply).
    waiting: AtomicBool,
}

/// Why the gate was not had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateError {
    /// The other writer held it past the wait.
    TimedOut,
    /// A writer stopped inside a message: the byte stream is broken.
    Broken,
}

impl WriterGate {
    pub fn new() -> WriterGate {
        WriterGate::default()
    }

    /// Takes the gate for an engine stream's frame when it is free and the connection thread
    /// does not wait for it.
    pub fn try_acquire_frame(&self) -> Result<bool, GateError> {
        if self.waiting.load(Ordering::Acquire) {
            return if self.is_broken() {
                Err(GateError::Broken)
            } else {
                Ok(false)
            };
        }
        self.try_acquire()
    }

    /// Takes the gate when it is free.
    pub fn try_acquire(&self) -> Result<bool, GateError> {
        match self
            .state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(true),
            Err(BROKEN) => Err(GateError::Broken),
            Err(_) => Ok(false),
        }
    }

    /// Takes the gate, waiting at most `timeout` for the other writer (polled every 50 µs:
    /// the engine holds it for one frame's send).
    pub fn acquire_within(&self, timeout: Duration) -> Result<(), GateError> {
        let t0 = Instant::now();
        self.waiting.store(true, Ordering::Release);
        let r = loop {
            match self.try_acquire() {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            if t0.elapsed() >= timeout {
                break Err(GateError::TimedOut);
            }
            std::thread::sleep(Duration::from_micros(50));
        };
        self.waiting.store(false, Ordering::Release);
        r
    }

    /// Gives the gate back after a whole message.
    pub fn release(&self) {
        let _ = self
            .state
            .compare_exchange(HELD, FREE, Ordering::Release, Ordering::Relaxed);
    }

    /// The holder stopped inside a message: nobody writes on the socket again.
    pub fn break_stream(&self) {
        self.state.store(BROKEN, Ordering::Release);
    }

    pub fn is_broken(&self) -> bool {
        self.state.load(Ordering::Acquire) == BROKEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_at_a_time_and_a_broken_stream_stays_broken() {
        let g = WriterGate::new();
        assert_eq!(g.try_acquire(), Ok(true));
        assert_eq!(g.try_acquire(), Ok(false));
        assert_eq!(
            g.acquire_within(Duration::from_millis(1)),
            Err(GateError::TimedOut)
        );
        g.release();
        assert_eq!(g.try_acquire_frame(), Ok(true));
        g.release();
        g.waiting.store(true, Ordering::Release);
        assert_eq!(
            g.try_acquire_frame(),
            Ok(false),
            "the connection waits: it goes first"
        );
        g.waiting.store(false, Ordering::Release);
        assert_eq!(g.acquire_within(Duration::from_millis(1)), Ok(()));
        g.break_stream();
        g.release();
        assert_eq!(g.try_acquire(), Err(GateError::Broken));
        assert!(g.is_broken());
    }
}

/// An interleaved session's channel and its connection's writer gate (the engine sends an
/// RTSP session's `$`-framed packets straight to the connection's socket behind it).
#[derive(Debug, Clone)]
pub struct Interleaved {
    pub channel: u8,
    pub gate: std::sync::Arc<WriterGate>,
}
