//! A body handed to the engine: after the head, [`Worker::hand_off`] opens an engine stream
//! on the file and a `dup` of the socket and takes the connection out of epoll;
//! [`Worker::poll_engine`] collects the reports and brings the connection back to `Reading`
//! (or closes it).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use penstock_core::http::{BodyPiece, Status};
use penstock_core::stream::{Extent, IoKind};
use penstock_driver::open::Opened as EngineOpened;
use penstock_driver::{StreamError, StreamHandle, StreamSpec};
use rustix::event::epoll;

use super::{Interest, RequestEnd, State, Worker, conn_in, record, token};
use crate::access_log::LogEntry;

pub(super) struct EngineBody {
    pub(super) handle: StreamHandle,
    keep_alive: bool,
    class: Arc<str>,
    path_label: &'static str,
    status: Status,
    started: Instant,
    log: Option<LogEntry>,
}

impl EngineBody {
    /// This body ending now with `body_bytes` sent.
    pub(super) fn request_end(&self, body_bytes: u64) -> RequestEnd<'_> {
        RequestEnd {
            class: &self.class,
            data_path: self.path_label,
            status: self.status.code(),
            body_bytes,
            started: self.started,
            log: self.log.as_ref(),
        }
    }
}

impl Worker {
    /// The head is out; the engine sends the one file extent through the socket's dup.
    pub(super) fn hand_off(&mut self, idx: u32, generation: u32) {
        let shared = self.shared.clone();
        let epoll_fd = &self.epoll;
        let Some(c) = self.slots[idx as usize].conn.as_mut() else {
            return;
        };
        let State::Sending(out) = std::mem::replace(&mut c.state, State::Reading) else {
            return;
        };
        let mut out = out;
        let slot = out
            .to_engine
            .take()
            .expect("write_out hands off only with a reserved engine place");
        let target_fd = match c.sock.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(_) => {
                // The head is out: this loop sends the body instead of cutting it.
                shared.metrics.error("dup_failed");
                drop(slot);
                c.state = State::Sending(out);
                self.ready.push((idx, generation));
                return;
            }
        };
        let Some(BodyPiece::File {
            offset_bytes,
            len_bytes,
        }) = out.pieces.pop_front()
        else {
            unreachable!("to_engine is set only for one file piece")
        };
        let peer = c.sock.peer_addr().ok();
        let mut body_path = shared.body_path;
        let source = match (out.volume.take(), out.file.take()) {
            (Some(pio), _) => {
                // The partition's members, read on the engine's uring path (or copy); the
                // path configured for file bodies (sendfile) does not apply.
                body_path = penstock_core::stream::PathChoice::Auto;
                penstock_driver::open::opened_partition(*pio).map_err(|e| e.to_string())
            }
            (None, Some(file)) => {
                let file_len = file
                    .metadata()
                    .map_or(offset_bytes + len_bytes, |m| m.len());
                Ok(EngineOpened {
                    fd: file.into(),
                    kind: IoKind::File,
                    size: Some(file_len),
                    socket: false,
                    label: out.file_label.clone(),
                    volume: None,
                })
            }
            (None, None) => unreachable!("to_engine is set only with a file or a partition"),
        };
        let source = match source {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "a partition's members could not be reopened");
                shared.metrics.error("engine_refused");
                record(
                    &shared,
                    &mut self.access,
                    c.peer,
                    &out.request_end(out.status.code(), 0),
                );
                self.close(idx);
                return;
            }
        };
        let target = EngineOpened {
            fd: target_fd.into(),
            kind: IoKind::StreamSocket,
            size: None,
            socket: true,
            label: peer.map_or_else(|| "http client".to_string(), |p| p.to_string()),
            volume: None,
        };
        // A viewer token's `rate` (`respond`): the planner paces the stream at it, on a path
        // that sends unit by unit at deadlines (uring or copy; not one sendfile).
        if out.rate.is_some() {
            body_path = penstock_core::stream::PathChoice::Auto;
        }
        let mut spec = body_spec(body_path, &out.class, offset_bytes, len_bytes);
        if let Some(r) = out.rate {
            spec.pacing = penstock_driver::engine::Pacing::Rate(
                penstock_core::units::Rate::BitsPerSecond(r.bytes_per_s.saturating_mul(8)),
            );
        }
        // Admitted in a tenant's share before the head (`respond`): started as that rt
        // stream, the reservation kept.
        let admitted = out.tenant_admitted.take();
        if admitted.is_some() {
            for_tenant(&mut spec);
        }
        // nginx's send_timeout, as the loop applies it to its own bodies.
        spec.send_timeout = Some(self.live.limits.send_timeout());
        // Leave epoll while the engine owns the socket's writes.
        if epoll::delete(epoll_fd, &c.sock).is_ok() {
            c.interest = Interest::Removed;
        }
        // Refused only if the file shrank since the head was made (the place is reserved and
        // the path was checked in `respond`).
        match shared
            .engine
            .open_reserved_admitted(slot, admitted, spec, source, target)
        {
            Ok(handle) => {
                shared.metrics.streams_active.inc();
                let waker = self.engine_waker.clone();
                handle.notify_when_done(Box::new(move || {
                    // A full counter (EAGAIN) still wakes the loop.
                    let _ = rustix::io::write(&*waker, &1u64.to_ne_bytes());
                }));
                let path_label = match handle.path() {
                    penstock_core::stream::DataPath::Sendfile => "engine-sendfile",
                    penstock_core::stream::DataPath::Splice => "engine-splice",
                    penstock_core::stream::DataPath::Uring => "engine-uring",
                    _ => "engine-copy",
                };
                c.state = State::Engine(Box::new(EngineBody {
                    handle,
                    keep_alive: out.keep_alive,
                    class: out.class.clone(),
                    path_label,
                    status: out.status,
                    started: out.started,
                    log: out.log.take(),
                }));
                self.engine_conns.push((idx, generation));
            }
            Err(e) => {
                tracing::warn!(error = %e, "engine refused an HTTP body");
                shared.metrics.error("engine_refused");
                // The head is out, the body is not: logged with what was sent.
                record(
                    &shared,
                    &mut self.access,
                    c.peer,
                    &out.request_end(out.status.code(), 0),
                );
                self.close(idx);
            }
        }
    }

    /// A connection whose body another thread sent (the engine's stream, an origin thread)
    /// goes back to reading requests: its idle deadline restarts, it is in epoll again and
    /// looked at once now (pipelined requests may already be buffered); closed if epoll
    /// refuses it.
    pub(super) fn resume_reading(&mut self, idx: u32, generation: u32) {
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        c.deadline = Instant::now() + self.live.limits.idle_timeout();
        if epoll::add(
            &self.epoll,
            &c.sock,
            epoll::EventData::new_u64(token(idx, generation)),
            epoll::EventFlags::IN,
        )
        .is_err()
        {
            self.close(idx);
            return;
        }
        c.interest = Interest::Read;
        self.ready.push((idx, generation));
    }

    pub(super) fn poll_engine(&mut self) {
        let list = std::mem::take(&mut self.engine_conns);
        for (idx, generation) in list {
            let shared = self.shared.clone();
            let Some(c) = conn_in(&mut self.slots, idx, generation) else {
                continue;
            };
            let State::Engine(e) = &c.state else { continue };
            let Some(result) = e.handle.wait_timeout(Duration::ZERO) else {
                self.engine_conns.push((idx, generation));
                continue;
            };
            shared.metrics.streams_active.dec();
            let State::Engine(e) = std::mem::replace(&mut c.state, State::Reading) else {
                unreachable!("matched Engine above")
            };
            match result {
                Ok(report) => {
                    record(
                        &shared,
                        &mut self.access,
                        c.peer,
                        &e.request_end(report.bytes),
                    );
                    if shared.stopping.load(Ordering::Relaxed) {
                        self.close(idx);
                        continue;
                    }
                    if !e.keep_alive {
                        self.linger(idx, generation);
                        continue;
                    }
                    self.resume_reading(idx, generation);
                }
                Err(err) => {
                    tracing::debug!(error = %err, "HTTP body stream ended early");
                    // Cut: the bytes the engine counted as sent.
                    record(
                        &shared,
                        &mut self.access,
                        c.peer,
                        &e.request_end(e.handle.counters().bytes_sent),
                    );
                    shared.metrics.error(match err {
                        StreamError::Stalled { .. } => "send_timeout",
                        _ => "client_vanished",
                    });
                    self.close(idx);
                }
            }
        }
    }
}

/// The engine stream of one HTTP body: descriptors, not names (the engine never opens
/// anything by the URL path); the location's class is the disk queue its reads wait in, with
/// no admission (an HTTP body has no rate to guarantee). `respond` plans it before the head,
/// `hand_off` starts it after.
pub(super) fn body_spec(
    path: penstock_core::stream::PathChoice,
    class: &str,
    offset_bytes: u64,
    len_bytes: u64,
) -> StreamSpec {
    let mut spec = StreamSpec::opened();
    spec.class = Some(if class == "rt" {
        penstock_driver::DiskClass::Rt
    } else {
        penstock_driver::DiskClass::Bulk
    });
    spec.best_effort = true;
    spec.extent = Extent {
        offset: offset_bytes,
        length: Some(len_bytes),
    };
    spec.path = path;
    spec
}

/// A tenant's paced body ([`body_spec`] with a rate): an rt stream that asks admission, so
/// that it is charged to the tenant's share (`crate::tenants`).
pub(super) fn for_tenant(spec: &mut StreamSpec) {
    spec.class = Some(penstock_driver::DiskClass::Rt);
    spec.best_effort = false;
}
