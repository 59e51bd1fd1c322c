//! `penstock_engine`: the engine, the control protocol's stream table over it, and the
//! threads that serve the table (a reaper; one per control descriptor).

use std::ffi::c_int;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use penstock_driver::{Engine, EngineConfig};
use penstock_server::Metrics;
use penstock_server::config::ControlConfig;
use penstock_server::control::{ControlShared, Session, serve_stream_descriptor, start_reaper};
use penstock_server::streams::{Caller, EngineBackend, Identity, Streams};

use crate::backend::LocalPolicy;
use crate::error::{
    Error, PENSTOCK_EHANDLE, PENSTOCK_EINVAL, PENSTOCK_ENULL, PENSTOCK_ESYS, PENSTOCK_OK,
};
use crate::ffi::{Registry, guard, guard_code};

/// An engine (opaque). Made by `penstock_engine_new`, ended by `penstock_engine_free`.
pub struct penstock_engine {
    _opaque: [u8; 0],
}

/// An engine's limits. Fill it with `penstock_config_default`, change what you need, pass it
/// to `penstock_engine_new` (which checks every field and says which one it refuses).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct penstock_config {
    /// Worker threads (event loops), 1 to 1024. Default: the CPUs available.
    pub workers: u32,
    /// Streams open at once (cues and typed streams together, running or not), 1 to 1048576.
    /// Default 4096.
    pub streams_max: u32,
    /// Buffers in each worker's io_uring pool (the uring path's read-ahead and in-flight
    /// sends), 1 to 65535. Default 32.
    pub pool_buffers: u32,
    /// Bytes per pool buffer: the largest unit of a paced or uring-path stream; a multiple of
    /// 4096. Default 1048576.
    pub buffer_bytes: u32,
    /// A stream that moves no byte for this long fails (`PENSTOCK_ETIMEDOUT`); 0: never.
    /// Default 60000.
    pub send_timeout_ms: u64,
    /// A control descriptor's stream not started within this long is closed, and a finished
    /// one whose descriptor is still open is forgotten this long after it ended (typed
    /// streams never expire: their handle closes them). Default 60000; at least 1.
    pub pending_timeout_ms: u64,
    /// A `tcp://` endpoint's connect gives up after this long. Default 10000; at least 1.
    pub connect_timeout_ms: u64,
    /// A `tcp-listen://` or `unix-listen:` endpoint waits this long for its peer after START.
    /// Default 60000; at least 1.
    pub accept_timeout_ms: u64,
    /// A control descriptor whose stream is closed is closed by the library after this long
    /// without a command. Default 300000; at least 1.
    pub idle_timeout_ms: u64,
}

impl Default for penstock_config {
    fn default() -> penstock_config {
        let e = EngineConfig::default();
        let c = ControlConfig::default();
        penstock_config {
            workers: u32::try_from(e.workers).unwrap_or(1),
            streams_max: u32::try_from(e.streams_max).unwrap_or(4096),
            pool_buffers: u32::try_from(e.pool_buffers).unwrap_or(32),
            buffer_bytes: u32::try_from(e.buffer_bytes).unwrap_or(1 << 20),
            send_timeout_ms: c.send_timeout_ms,
            pending_timeout_ms: c.pending_timeout_ms,
            connect_timeout_ms: c.connect_timeout_ms,
            accept_timeout_ms: c.accept_timeout_ms,
            idle_timeout_ms: c.idle_timeout_ms,
        }
    }
}

/// Fills `*cfg` with the defaults. `PENSTOCK_ENULL` when `cfg` is NULL.
///
/// # Safety
/// `cfg` is NULL or points to a writable `penstock_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_config_default(cfg: *mut penstock_config) -> c_int {
    guard_code(|| {
        if cfg.is_null() {
            return Err(Error::new(PENSTOCK_ENULL, "cfg is NULL"));
        }
        // SAFETY: not NULL, and writable (the caller's promise above); a plain C struct.
        unsafe { cfg.write(penstock_config::default()) };
        Ok(PENSTOCK_OK)
    })
}

/// A live engine: what every handle made from it shares.
pub(crate) struct EngineInner {
    /// The engine itself, for what is not a stream (`penstock_rtu_create`).
    pub engine: Arc<Engine>,
    pub shared: Arc<ControlShared>,
    pub streams: Arc<Streams>,
    pub uid: u32,
    /// `penstock_config.streams_max`, for messages.
    pub streams_max: u32,
    next_conn: AtomicU64,
    /// `penstock_engine_free` has begun: nothing new opens (a call that found the handle
    /// just before the free is refused instead of opening a stream nobody would reap).
    stopped: AtomicBool,
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// The control descriptors' threads (finished ones are joined as new ones come).
    cues: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) static ENGINES: Registry<EngineInner> = Registry::new("penstock_engine");

fn check_range(name: &str, v: u64, lo: u64, hi: u64) -> Result<(), Error> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(Error::new(
            PENSTOCK_EINVAL,
            format!("penstock_config.{name} is {v}; it must be {lo} to {hi}"),
        ))
    }
}

impl EngineInner {
    fn new(c: &penstock_config) -> Result<EngineInner, Error> {
        check_range("workers", c.workers.into(), 1, 1024)?;
        check_range("streams_max", c.streams_max.into(), 1, 1 << 20)?;
        check_range("pool_buffers", c.pool_buffers.into(), 1, 65_535)?;
        for (name, v) in [
            ("pending_timeout_ms", c.pending_timeout_ms),
            ("connect_timeout_ms", c.connect_timeout_ms),
            ("accept_timeout_ms", c.accept_timeout_ms),
            ("idle_timeout_ms", c.idle_timeout_ms),
        ] {
            check_range(name, v, 1, u64::MAX / 2)?;
        }
        check_range("send_timeout_ms", c.send_timeout_ms, 0, u64::MAX / 2)?;
        let engine_cfg = EngineConfig {
            workers: c.workers as usize,
            streams_max: c.streams_max as usize,
            pool_buffers: c.pool_buffers as usize,
            buffer_bytes: c.buffer_bytes as usize,
            ..EngineConfig::default()
        };
        // The engine checks the rest (buffer_bytes) and says why it refuses.
        let engine = Engine::new(engine_cfg)
            .map_err(|e| Error::new(PENSTOCK_EINVAL, format!("penstock_engine_new: {e}")))?;
        let uid = rustix::process::geteuid().as_raw();
        let control = ControlConfig {
            listen: String::new(),
            streams_per_identity_max: c.streams_max as usize,
            // A control descriptor drives one stream; a typed stream is a connection of one.
            streams_per_connection_max: 1,
            pending_timeout_ms: c.pending_timeout_ms,
            send_timeout_ms: c.send_timeout_ms,
            connect_timeout_ms: c.connect_timeout_ms,
            accept_timeout_ms: c.accept_timeout_ms,
            idle_timeout_ms: c.idle_timeout_ms,
            ..ControlConfig::default()
        };
        let engine = Arc::new(engine);
        let backend = EngineBackend::new(
            engine.clone(),
            LocalPolicy {
                connect_timeout: Duration::from_millis(c.connect_timeout_ms),
            },
        );
        let streams = Arc::new(Streams::new(
            Box::new(backend),
            Arc::new(Metrics::new()),
            control.clone(),
        ));
        // No token: `AUTH` never succeeds on a control descriptor (an empty token matches
        // nothing), so a descriptor passed to another process drives its own stream only.
        let shared = Arc::new(ControlShared::new(
            streams.clone(),
            control,
            String::new(),
            Box::new(|| 0),
        ));
        let reaper = start_reaper(shared.clone())
            .map_err(|e| Error::new(PENSTOCK_ESYS, format!("could not start a thread: {e}")))?;
        Ok(EngineInner {
            engine,
            shared,
            streams,
            uid,
            streams_max: c.streams_max,
            next_conn: AtomicU64::new(1),
            stopped: AtomicBool::new(false),
            reaper: Mutex::new(Some(reaper)),
            cues: Mutex::new(Vec::new()),
        })
    }

    /// A new caller of the table: a connection of its own, this process's identity; refused
    /// once the engine is being freed.
    pub fn caller(&self) -> Result<Caller, Error> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::new(
                PENSTOCK_EHANDLE,
                "the penstock_engine is being freed: nothing new opens on it",
            ));
        }
        Ok(Caller {
            conn: self.next_conn.fetch_add(1, Ordering::Relaxed),
            identity: Identity::Peer {
                uid: self.uid,
                gid: rustix::process::getegid().as_raw(),
            },
        })
    }

    /// Serves `mine` (the library's end of a control descriptor) for stream `own` of
    /// `caller`'s connection on a thread of its own; when the other end closes, the stream is
    /// closed unless it was opened DETACHED.
    pub fn serve_cue(
        self: &Arc<Self>,
        mine: UnixStream,
        caller: Caller,
        own: penstock_core::control::StreamId,
    ) -> std::io::Result<()> {
        let shared = self.shared.clone();
        let session = Session::for_stream(caller.conn, caller.identity, "cue".into(), own);
        let t = std::thread::Builder::new()
            .name("penstock-cue".into())
            .spawn(move || {
                serve_stream_descriptor(&shared, mine, session);
                shared.streams().connection_closed(caller.conn);
            })?;
        let mut cues = self.cues.lock().unwrap_or_else(|p| p.into_inner());
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *cues)
            .into_iter()
            .partition(|t| t.is_finished());
        for t in done {
            let _ = t.join();
        }
        *cues = running;
        cues.push(t);
        Ok(())
    }

    /// Stops everything: control descriptors answer 421 and close (within 200 ms), streams
    /// are cancelled (waiting up to 10 s in all for their in-flight I/O), the reaper ends.
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.shared.stop();
        let cues = std::mem::take(&mut *self.cues.lock().unwrap_or_else(|p| p.into_inner()));
        for t in cues {
            let _ = t.join();
        }
        self.streams.shutdown(Duration::from_secs(10));
        if let Some(r) = self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = r.join();
        }
    }
}

/// Starts an engine with `cfg` (NULL: the defaults). NULL on failure, with
/// `penstock_last_error()` saying why (an invalid field names itself). Without io_uring (a
/// sysctl, seccomp) the engine still runs, on the copy, sendfile and splice paths.
///
/// # Safety
/// `cfg` is NULL or points to a readable `penstock_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn penstock_engine_new(cfg: *const penstock_config) -> *mut penstock_engine {
    guard(
        |_| std::ptr::null_mut(),
        || {
            let c = if cfg.is_null() {
                penstock_config::default()
            } else {
                // SAFETY: not NULL and readable (the caller's promise); a plain C struct of
                // integers, every bit pattern valid.
                unsafe { cfg.read() }
            };
            let inner = Arc::new(EngineInner::new(&c)?);
            Ok(ENGINES.insert(inner) as *mut penstock_engine)
        },
    )
}

/// Stops and frees an engine: its control descriptors are answered `421` and closed, its
/// streams cancelled. Streams still open by handle stay valid handles whose calls fail
/// (`PENSTOCK_ENOSTREAM`) until `penstock_stream_close`. NULL is ignored; an unknown handle
/// sets the last error (`PENSTOCK_EHANDLE`) and is otherwise ignored.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_engine_free(engine: *mut penstock_engine) {
    if engine.is_null() {
        return;
    }
    guard(
        |_| (),
        || {
            ENGINES.remove(engine as u64)?.stop();
            Ok(())
        },
    );
}

/// Waits until none of the engine's streams is starting, waiting for its peer or running —
/// a graceful stop before `penstock_engine_free` (which cancels what still runs) — at most
/// `timeout_ms` (negative: as long as it takes). Pending and paused streams do not count.
/// `PENSTOCK_OK`, or `PENSTOCK_ETIMEDOUT` when streams still ran at the timeout.
#[unsafe(no_mangle)]
pub extern "C" fn penstock_engine_drain(engine: *mut penstock_engine, timeout_ms: i64) -> c_int {
    guard_code(|| {
        let inner = ENGINES.get(engine as u64)?;
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        if inner.streams.wait_idle(timeout) {
            Ok(PENSTOCK_OK)
        } else {
            Err(Error::new(
                crate::error::PENSTOCK_ETIMEDOUT,
                format!("streams still running after {timeout_ms} ms"),
            ))
        }
    })
}
