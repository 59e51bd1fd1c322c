//! A request for a path missing beneath the root, with `[origin]` on: [`Worker::hand_to_origin`]
//! takes the connection out of epoll and starts a thread (`crate::origin::run`) that answers
//! on a `dup` of the socket; [`Worker::poll_origin`] collects the ends (the thread writes the
//! loop's eventfd) and brings the connection back to `Reading`, or closes it. A `tls-user`
//! connection's rustls session goes to the thread with the socket (every byte it writes is
//! encrypted there) and comes back with the end.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use penstock_core::http::{Request, boundary_for};
use rustix::event::epoll;

use super::send::Out;
use super::tls_io::ConnTls;
use super::{Interest, RequestEnd, State, Worker, conn_in, record};
use crate::access_log::LogEntry;
use crate::origin::{OriginEnd, OriginJob};

/// A connection whose response a thread is making from the origin.
pub(super) struct OriginBody {
    done: Arc<Mutex<Option<OriginEnd>>>,
    pub(super) cancel: Arc<AtomicBool>,
    class: Arc<str>,
    started: Instant,
    pub(super) log: Option<LogEntry>,
    /// A `tls-user` connection's session, while the thread has it.
    tls: crate::origin::TlsSession,
}

impl OriginBody {
    pub(super) fn request_end(&self, status: u16, body_bytes: u64) -> RequestEnd<'_> {
        RequestEnd {
            class: &self.class,
            data_path: "origin",
            status,
            body_bytes,
            started: self.started,
            log: self.log.as_ref(),
        }
    }
}

const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n";

impl Worker {
    /// `out` was made by `respond` for a path the root does not have (`out.origin_type`).
    pub(super) fn hand_to_origin(&mut self, idx: u32, generation: u32, req: Request, out: Out) {
        let shared = self.shared.clone();
        let origin = shared
            .origin
            .clone()
            .expect("respond hands to the origin only when there is one");
        let content_type = out.origin_type.clone().unwrap_or_default();
        self.boundary_seed = self
            .boundary_seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let boundary = boundary_for(self.boundary_seed);
        let live = self.live.clone();
        let Some(c) = conn_in(&mut self.slots, idx, generation) else {
            return;
        };
        let busy = origin.requests.fetch_add(1, Ordering::Relaxed) >= origin.requests_max;
        let sock = if busy {
            None
        } else {
            c.sock.as_fd().try_clone_to_owned().ok()
        };
        let Some(sock) = sock else {
            origin.requests.fetch_sub(1, Ordering::Relaxed);
            // No thread for it (requests_max, or no descriptor): 503, and the connection
            // closes (the loop's pieces are not made for this response).
            super::tls_io::send_small(c, BUSY);
            shared.metrics.error("origin_busy");
            record(&shared, &mut self.access, c.peer, &out.request_end(503, 0));
            self.close(idx);
            return;
        };
        if epoll::delete(&self.epoll, &c.sock).is_ok() {
            c.interest = Interest::Removed;
        }
        let done = Arc::new(Mutex::new(None));
        let cancel = Arc::new(AtomicBool::new(false));
        let tls: crate::origin::TlsSession = Arc::new(Mutex::new(None));
        match std::mem::replace(&mut c.tls, ConnTls::Plain) {
            ConnTls::User(t) => *tls.lock().unwrap_or_else(|p| p.into_inner()) = Some(t),
            other => c.tls = other,
        }
        let job = OriginJob {
            origin: origin.clone(),
            keep_alive_allowed: out.keep_alive,
            req,
            sock,
            content_type,
            server_name: shared.server_name.clone(),
            keep_alive_timeout_s: Some(live.limits.idle_timeout_ms / 1000),
            ranges_max: live.limits.ranges_max,
            boundary,
            send_timeout: live.limits.send_timeout(),
            cancel: cancel.clone(),
            done: done.clone(),
            waker: self.engine_waker.clone(),
            delivery: out.delivery.clone(),
            tls: tls.clone(),
        };
        let mut out = out;
        let body = OriginBody {
            done,
            cancel,
            class: out.class.clone(),
            started: out.started,
            log: out.log.take(),
            tls,
        };
        match std::thread::Builder::new()
            .name("penstock-origin".into())
            .spawn(move || crate::origin::run(job))
        {
            Ok(_) => {
                c.state = State::Origin(Box::new(body));
                self.origin_conns.push((idx, generation));
            }
            Err(e) => {
                origin.requests.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "no thread for an origin request");
                if let Some(t) = body.tls.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    c.tls = ConnTls::User(t);
                }
                super::tls_io::send_small(c, BUSY);
                shared.metrics.error("origin_busy");
                record(&shared, &mut self.access, c.peer, &body.request_end(503, 0));
                self.close(idx);
            }
        }
    }

    pub(super) fn poll_origin(&mut self) {
        let list = std::mem::take(&mut self.origin_conns);
        for (idx, generation) in list {
            let shared = self.shared.clone();
            let Some(c) = conn_in(&mut self.slots, idx, generation) else {
                continue;
            };
            let State::Origin(o) = &c.state else { continue };
            let Some(end) = *o.done.lock().unwrap_or_else(|p| p.into_inner()) else {
                self.origin_conns.push((idx, generation));
                continue;
            };
            let State::Origin(o) = std::mem::replace(&mut c.state, State::Reading) else {
                unreachable!("matched Origin above")
            };
            // The session back from the thread (a `tls-user` connection).
            if let Some(t) = o.tls.lock().unwrap_or_else(|p| p.into_inner()).take() {
                c.tls = ConnTls::User(t);
            }
            if let Some(t) = end.head_sent {
                shared
                    .metrics
                    .first_byte(&o.class, t.saturating_duration_since(o.started));
            }
            record(
                &shared,
                &mut self.access,
                c.peer,
                &o.request_end(end.status.code(), end.body_bytes),
            );
            if !end.complete || shared.stopping.load(Ordering::Relaxed) {
                if !end.complete {
                    shared.metrics.error("origin_cut");
                }
                self.close(idx);
                continue;
            }
            if !end.keep_alive {
                self.linger(idx, generation);
                continue;
            }
            self.resume_reading(idx, generation);
        }
    }
}
