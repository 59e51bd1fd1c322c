//! Accepting connections, and the back-off when accept runs out of a resource (the module
//! doc of `http` says why; docs/http.md has the figures).

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::SendFlags;

use super::tls_io::ConnTls;
use super::{Conn, Interest, Slot, State, TOKEN_LISTENER, Worker, token};

const ACCEPTS_PER_TURN: usize = 64;
/// At most one log line about failed accepts per worker per interval.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Distinct errnos counted between two log lines (more are lumped into the last).
const ACCEPT_ERRNOS_MAX: usize = 8;

/// Failed accepts counted between two log lines.
pub(super) struct AcceptFailures {
    /// (errno, count) since the last line; at most `ACCEPT_ERRNOS_MAX` entries.
    pub(super) counts: Vec<(Errno, u64)>,
    /// No line before then.
    pub(super) next_log: Instant,
}

impl AcceptFailures {
    fn add(&mut self, e: Errno) {
        if let Some(c) = self.counts.iter_mut().find(|(x, _)| *x == e) {
            c.1 += 1;
        } else if self.counts.len() < ACCEPT_ERRNOS_MAX {
            self.counts.push((e, 1));
        } else if let Some(last) = self.counts.last_mut() {
            last.1 += 1;
        }
    }

    /// One warn line with the counts since the last one, if any and if the interval allows.
    /// Returns whether it wrote one.
    pub(super) fn report(&mut self, now: Instant, worker: usize, backoff: Duration) -> bool {
        if self.counts.is_empty() || now < self.next_log {
            return false;
        }
        let failed: u64 = self.counts.iter().map(|c| c.1).sum();
        let errors = self
            .counts
            .iter()
            .map(|(e, n)| format!("{} x{n}", errno_name(*e)))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            worker,
            failed,
            errors = %errors,
            backoff_ms = backoff.as_millis() as u64,
            "HTTP accepts failed since the last report (at most one a {} s); out of descriptors or memory, accepting pauses for backoff_ms",
            ACCEPT_LOG_INTERVAL.as_secs()
        );
        self.counts.clear();
        self.next_log = now + ACCEPT_LOG_INTERVAL;
        true
    }
}

/// What a failed accept means for the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptFailure {
    /// The pending connection's own trouble (accept(2): Linux passes network errors of the
    /// new socket to accept, "treat them like EAGAIN by retrying"): try the next one.
    Connection,
    /// Out of descriptors or kernel memory, or a reason we do not know: retrying at once
    /// would fail the same way while the listener stays readable. Pause.
    Resource,
}

fn accept_failure(e: Errno) -> AcceptFailure {
    match e {
        Errno::CONNABORTED
        | Errno::PROTO
        | Errno::PERM
        | Errno::NETDOWN
        | Errno::NOPROTOOPT
        | Errno::HOSTDOWN
        | Errno::NONET
        | Errno::HOSTUNREACH
        | Errno::OPNOTSUPP
        | Errno::NETUNREACH
        | Errno::TIMEDOUT => AcceptFailure::Connection,
        _ => AcceptFailure::Resource,
    }
}

/// `EMFILE` and so on: the name, for logs and metric labels.
fn errno_name(e: Errno) -> std::borrow::Cow<'static, str> {
    let name = match e {
        Errno::MFILE => "EMFILE",
        Errno::NFILE => "ENFILE",
        Errno::NOBUFS => "ENOBUFS",
        Errno::NOMEM => "ENOMEM",
        Errno::CONNABORTED => "ECONNABORTED",
        Errno::PROTO => "EPROTO",
        Errno::PERM => "EPERM",
        Errno::NETDOWN => "ENETDOWN",
        Errno::NOPROTOOPT => "ENOPROTOOPT",
        Errno::HOSTDOWN => "EHOSTDOWN",
        Errno::NONET => "ENONET",
        Errno::HOSTUNREACH => "EHOSTUNREACH",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::NETUNREACH => "ENETUNREACH",
        Errno::TIMEDOUT => "ETIMEDOUT",
        e => return format!("errno {}", e.raw_os_error()).into(),
    };
    name.into()
}

impl Worker {
    /// Takes the listener out of epoll for `accept_backoff_ms`: the loop's wait then ends at
    /// the latest when the pause does ([`Worker::resume_accepting`]).
    fn pause_accepting(&mut self) {
        if self.accept_paused_until.is_some() {
            return;
        }
        for l in &self.listeners {
            // Fails only if it is not registered, which is the state wanted.
            let _ = epoll::delete(&self.epoll, l);
        }
        self.accept_paused_until = Some(Instant::now() + self.live.limits.accept_backoff());
        self.shared.metrics.accept_paused("http");
    }

    /// The pause is over: the listener goes back into epoll (level-triggered, so a waiting
    /// backlog is reported at the next wait).
    pub(super) fn resume_accepting(&mut self, now: Instant) {
        self.accept_paused_until = None;
        self.retake_spare();
        let backoff = self.live.limits.accept_backoff();
        let mut failed = None;
        for l in &self.listeners {
            if let Err(e) = epoll::add(
                &self.epoll,
                l,
                epoll::EventData::new_u64(TOKEN_LISTENER),
                epoll::EventFlags::IN,
            ) {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            for l in &self.listeners {
                let _ = epoll::delete(&self.epoll, l);
            }
            // ENOMEM or ENOSPC (max_user_watches): try again after another back-off. Counted
            // with the failed accepts in the log line (rate-limited like them).
            self.accept_failures.add(e);
            self.shared.metrics.error("accept_rearm");
            self.accept_paused_until = Some(now + backoff);
            self.shared.metrics.accept_paused("http");
        }
        let _ = self.accept_failures.report(now, self.index, backoff);
    }

    /// Accepts from every listener (they share one epoll token; level-triggered, so what
    /// is left waiting is reported again at the next wait).
    pub(super) fn accept(&mut self) {
        for i in 0..self.listeners.len() {
            let _ = self.accept_from(i);
        }
    }

    /// Accepts up to the per-turn number from one listener; whether more may be waiting
    /// (the turn ended on its budget, not on EAGAIN, a pause or a missing listener).
    pub(super) fn accept_from(&mut self, listener: usize) -> bool {
        for _ in 0..ACCEPTS_PER_TURN {
            if self.accept_paused_until.is_some() {
                // An event of the same epoll_wait batch as the failure.
                return false;
            }
            let Some(l) = self.listeners.get(listener) else {
                return false;
            };
            // accept4 with SOCK_NONBLOCK: no separate call to make the socket non-blocking.
            // The peer's address comes with the accept (the access log's `$remote_addr`):
            // no getpeername per request.
            let (sock, peer) = match rustix::net::acceptfrom_with(
                l,
                rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            ) {
                Ok((fd, addr)) => (
                    TcpStream::from(fd),
                    addr.and_then(|a| std::net::SocketAddr::try_from(a).ok())
                        .map(|a| a.ip().to_canonical()),
                ),
                Err(Errno::AGAIN) => return false,
                Err(Errno::INTR) => continue,
                Err(e @ (Errno::MFILE | Errno::NFILE)) if self.spare_fd.is_some() => {
                    self.accept_failures.add(e);
                    self.shared
                        .metrics
                        .accept_failed("http", &errno_name(e).to_lowercase());
                    let refused = self.refuse_exhausted(listener);
                    let _ = self.accept_failures.report(
                        Instant::now(),
                        self.index,
                        self.live.limits.accept_backoff(),
                    );
                    if !refused {
                        // The spare did not make room (another thread took it): pause.
                        self.pause_accepting();
                        return false;
                    }
                    continue;
                }
                Err(e) => {
                    self.shared.metrics.error("accept");
                    self.shared
                        .metrics
                        .accept_failed("http", &errno_name(e).to_lowercase());
                    self.accept_failures.add(e);
                    let failure = accept_failure(e);
                    if failure == AcceptFailure::Resource {
                        self.pause_accepting();
                    }
                    let _ = self.accept_failures.report(
                        Instant::now(),
                        self.index,
                        self.live.limits.accept_backoff(),
                    );
                    match failure {
                        AcceptFailure::Connection => continue,
                        AcceptFailure::Resource => return false,
                    }
                }
            };
            let tls_listener = self.listener_tls.get(listener).copied().unwrap_or(false);
            let limits = &self.live.limits;
            if self.shared.conns.fetch_add(1, Ordering::AcqRel) >= limits.connections_max {
                self.shared.conns.fetch_sub(1, Ordering::AcqRel);
                self.shared.metrics.connections_refused.inc();
                // A TLS client could not read a 503 in clear: it only sees the close.
                if !tls_listener {
                    let _ = rustix::net::send(
                        &sock,
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        SendFlags::NOSIGNAL,
                    );
                }
                continue;
            }
            // A TLS listener's connection starts with a session of its own.
            let (tls, state, first_deadline) = if tls_listener {
                let session = self
                    .shared
                    .tls
                    .as_ref()
                    .map(|t| (t.accept(), t.handshake_timeout()));
                match session {
                    Some((Ok(s), timeout)) => (
                        ConnTls::Handshake(Box::new(s)),
                        State::Handshake,
                        Instant::now() + timeout,
                    ),
                    _ => {
                        self.shared.conns.fetch_sub(1, Ordering::AcqRel);
                        self.shared.metrics.error("tls_session");
                        continue;
                    }
                }
            } else {
                (
                    ConnTls::Plain,
                    State::Reading,
                    Instant::now() + self.live.limits.idle_timeout(),
                )
            };
            self.shared.metrics.connections.inc();
            let _ = sock.set_nodelay(true);
            let idx = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.slots.push(Slot {
                        generation: 0,
                        conn: None,
                    });
                    (self.slots.len() - 1) as u32
                }
            };
            let slot = &mut self.slots[idx as usize];
            slot.generation = slot.generation.wrapping_add(1);
            let generation = slot.generation;
            if epoll::add(
                &self.epoll,
                &sock,
                epoll::EventData::new_u64(token(idx, generation)),
                epoll::EventFlags::IN,
            )
            .is_err()
            {
                self.free.push(idx);
                self.release_count();
                continue;
            }
            slot.conn = Some(Conn {
                sock,
                peer,
                head_started: None,
                inbuf: Vec::new(),
                requests: 0,
                state,
                deadline: first_deadline,
                interest: Interest::Read,
                peer_eof: false,
                tls,
                viewer_holds: Vec::new(),
            });
            // A client sends its request right after connecting: read it now rather than a
            // loop turn later (under load a turn is every other connection's work; the probe
            // of `bench http` measured nginx's p99 time to first byte at about half
            // penstock's without this).
            self.on_event(idx, generation, epoll::EventFlags::IN);
        }
        true
    }
}

/// The worker's spare descriptor (`None` if even that fails: then accepts out of
/// descriptors pause without answering).
pub(super) fn spare_fd() -> Option<std::os::fd::OwnedFd> {
    crate::listen::spare_descriptor()
}

/// What a connection refused for want of descriptors reads before the server closes it.
const EXHAUSTED_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n";

impl Worker {
    /// Takes the spare descriptor again if it was lost (another thread took the one it
    /// freed): called when this worker closes a connection and when a pause ends.
    pub(super) fn retake_spare(&mut self) {
        if self.spare_fd.is_none() {
            self.spare_fd = spare_fd();
        }
    }

    /// Out of descriptors with a connection waiting: the spare descriptor is closed, the
    /// connection accepted, answered `503` with `Connection: close` and closed, and the spare
    /// taken again (nginx leaves such connections in the backlog, unanswered, until it has
    /// room; a client then waits for nothing). What the client already sent is read and
    /// dropped first, so that the close is a FIN, not a reset that could destroy the 503.
    /// Returns whether a connection was refused so (else the spare could not be used).
    fn refuse_exhausted(&mut self, listener: usize) -> bool {
        drop(self.spare_fd.take());
        let accepted = self.listeners.get(listener).map(|l| {
            rustix::net::accept_with(
                l,
                rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            )
        });
        let refused = match accepted {
            Some(Ok(fd)) => {
                let mut b = [0u8; 4096];
                for _ in 0..16 {
                    match rustix::net::recv(&fd, &mut b, rustix::net::RecvFlags::empty()) {
                        Ok((n, _)) if n > 0 => {}
                        _ => break,
                    }
                }
                let _ = rustix::net::send(&fd, EXHAUSTED_503, SendFlags::NOSIGNAL);
                let _ = rustix::net::shutdown(&fd, rustix::net::Shutdown::Write);
                self.shared.metrics.connections_refused.inc();
                self.shared.metrics.error("accept_out_of_descriptors");
                true
            }
            _ => false,
        };
        self.spare_fd = spare_fd();
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 20: out of descriptors, at most one line per interval, and it counts by errno.
    #[test]
    fn accept_failures_are_reported_once_per_interval_with_counts() {
        let t0 = Instant::now();
        let backoff = Duration::from_millis(500);
        let mut f = AcceptFailures {
            counts: Vec::new(),
            next_log: t0,
        };
        assert!(!f.report(t0, 0, backoff), "nothing to report");
        f.add(Errno::MFILE);
        assert!(
            f.report(t0, 0, backoff),
            "the first failure is reported at once"
        );
        for _ in 0..1000 {
            f.add(Errno::MFILE);
        }
        f.add(Errno::NFILE);
        assert!(!f.report(t0 + Duration::from_secs(9), 0, backoff));
        assert_eq!(f.counts, vec![(Errno::MFILE, 1000), (Errno::NFILE, 1)]);
        assert!(f.report(t0 + ACCEPT_LOG_INTERVAL, 0, backoff));
        assert!(f.counts.is_empty());
        // Distinct errnos are bounded.
        for raw in 1..100 {
            f.add(Errno::from_raw_os_error(raw));
        }
        assert_eq!(f.counts.len(), ACCEPT_ERRNOS_MAX);
        assert_eq!(f.counts.iter().map(|c| c.1).sum::<u64>(), 99);
    }

    #[test]
    fn resource_errors_pause_and_connection_errors_do_not() {
        for e in [
            Errno::MFILE,
            Errno::NFILE,
            Errno::NOBUFS,
            Errno::NOMEM,
            Errno::BADF,
        ] {
            assert_eq!(accept_failure(e), AcceptFailure::Resource, "{e:?}");
        }
        for e in [Errno::CONNABORTED, Errno::PROTO, Errno::NETUNREACH] {
            assert_eq!(accept_failure(e), AcceptFailure::Connection, "{e:?}");
        }
        assert_eq!(errno_name(Errno::MFILE), "EMFILE");
    }
}
