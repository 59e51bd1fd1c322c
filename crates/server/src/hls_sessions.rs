//! HLS viewer sessions (docs/hls.md "Viewer sessions"): the server's side of
//! `penstock_core::hls::session`. It reads the clock, draws session ids from the system's
//! random source (ring's `SystemRandom`), asks the engine's one admission control for each
//! new session at its rendition's bandwidth (the reservation is held in the book and given
//! back when the session idles out), counts, and lists the sessions for `STATE`.
//!
//! Expiry is evaluated whenever the book is used or looked at (a request of a sessions
//! location, a `/metrics` scrape, `STATE`): no thread of its own, and an idle session's
//! capacity is back before the next admission is asked.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use penstock_core::hls::session::{SessionLimits, Sessions, Touch};
use penstock_core::units::Rate;
use penstock_driver::engine::Pacing;
use penstock_driver::{Admitted, DiskClass, Engine, StreamError, StreamSpec};
use ring::rand::SecureRandom;

use crate::config::HlsConfig;
use crate::metrics::Metrics;

/// Why a session was not opened: the answer is a `503` whose body says this, with
/// `Retry-After` (seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) reason: String,
    pub(crate) retry_after_s: u64,
}

/// What a segment request of a sessions location gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SegmentVerdict {
    /// An open session's (or one re-admitted under its id): served.
    Serve,
    /// No session id: `403` (the playlist gives one).
    NoSession,
    /// An open session of another title: `403`.
    OtherTitle,
    /// An ended session whose file's bandwidth is not known here (its index is not
    /// cached): `403`, the player fetches the playlist again.
    Ended,
    /// Re-admission refused: `503` + `Retry-After`.
    Refused(Refused),
}

/// The sessions of one server.
pub(crate) struct HlsSessions {
    book: Mutex<Sessions<Option<Admitted>>>,
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    rng: ring::rand::SystemRandom,
}

impl std::fmt::Debug for HlsSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HlsSessions").finish_non_exhaustive()
    }
}

fn now() -> penstock_core::time::Instant {
    penstock_driver::clock::now()
}

impl HlsSessions {
    pub(crate) fn new(cfg: &HlsConfig, engine: Arc<Engine>, metrics: Arc<Metrics>) -> HlsSessions {
        HlsSessions {
            book: Mutex::new(Sessions::new(SessionLimits {
                idle: cfg.session_idle(),
                sessions_max: cfg.sessions_max,
                per_address_max: cfg.sessions_per_address_max,
            })),
            engine,
            metrics,
            rng: ring::rand::SystemRandom::new(),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Sessions<Option<Admitted>>> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the idle sessions (their reservations go back as they are dropped) and sets the
    /// gauge.
    fn sweep(&self, book: &mut Sessions<Option<Admitted>>) {
        let gone = book.expire(now());
        for (id, held) in gone {
            tracing::debug!(session = %id, "hls session idled out: its admission given back");
            self.metrics.hls_sessions_expired.inc();
            drop(held);
        }
        self.metrics.hls_sessions.set(book.len() as i64);
        self.set_tenant_gauges();
    }

    /// [`HlsSessions::sweep`] alone: before a scrape or a `STATE`.
    pub(crate) fn sweep_now(&self) {
        let mut b = self.book();
        self.sweep(&mut b);
    }

    /// A playlist's session: `asked` (the id its request named, checked by the caller:
    /// a query's `sid`, or a verified session token's) when that session is open and `path`
    /// is within its scope; else a new session for `scope`, admitted at
    /// `bandwidth_bits_per_s`. The id to write into the playlist's URIs.
    /// `tenant` (a JWT's `tenant` claim) admits a new session within that tenant's share of
    /// the rt capacity (`[tenants.NAME]`); `None`: within the part of no tenant.
    pub(crate) fn for_playlist(
        &self,
        asked: Option<&str>,
        path: &str,
        scope: &str,
        addr: IpAddr,
        bandwidth_bits_per_s: u64,
        tenant: Option<&str>,
    ) -> Result<String, Refused> {
        let mut book = self.book();
        self.sweep(&mut book);
        if let Some(id) = asked
            && book.touch(now(), id, path) == Touch::Live
        {
            return Ok(id.to_string());
        }
        let id = self.new_id();
        self.admit(&mut book, &id, addr, scope, bandwidth_bits_per_s, tenant)?;
        Ok(id)
    }

    /// The tenant whose share open session `id` is admitted in, if any.
    pub(crate) fn tenant_of(&self, id: &str) -> Option<String> {
        let book = self.book();
        crate::tenants::of(&self.engine, book.held(id)?.as_ref()?)
    }

    /// `penstock_tenant_sessions{tenant}`: what each tenant's partition holds.
    fn set_tenant_gauges(&self) {
        crate::tenants::set_gauges(&self.engine, &self.metrics);
    }

    /// A segment request for `path` naming session `asked`. An open session in scope is
    /// served; an ended (or unknown) one is admitted again under its id at
    /// `bandwidth_bits_per_s` (the file's, when its index is at hand) — a viewer who paused
    /// longer than `session_idle_ms` resumes if the machine can carry it, else `503` +
    /// `Retry-After`, which players retry.
    pub(crate) fn for_segment(
        &self,
        asked: Option<&str>,
        path: &str,
        addr: IpAddr,
        bandwidth_bits_per_s: impl FnOnce() -> Option<u64>,
    ) -> SegmentVerdict {
        let Some(id) = asked else {
            return SegmentVerdict::NoSession;
        };
        let mut book = self.book();
        self.sweep(&mut book);
        match book.touch(now(), id, path) {
            Touch::Live => SegmentVerdict::Serve,
            Touch::OtherTitle => SegmentVerdict::OtherTitle,
            Touch::Unknown => {
                // The index lookup takes the cache's lock only, never reads the file.
                let Some(bits) = bandwidth_bits_per_s() else {
                    return SegmentVerdict::Ended;
                };
                // Re-admitted in the part of no tenant: a segment's session token does not
                // name the tenant of the playlist's credential.
                match self.admit(&mut book, id, addr, path, bits, None) {
                    Ok(()) => SegmentVerdict::Serve,
                    Err(r) => SegmentVerdict::Refused(r),
                }
            }
        }
    }

    fn admit(
        &self,
        book: &mut Sessions<Option<Admitted>>,
        id: &str,
        addr: IpAddr,
        scope: &str,
        bandwidth_bits_per_s: u64,
        tenant: Option<&str>,
    ) -> Result<(), Refused> {
        let refuse = |reason: String, book: &Sessions<Option<Admitted>>| {
            self.metrics.hls_sessions_refused.inc();
            Refused {
                reason,
                retry_after_s: retry_after_s(book),
            }
        };
        if let Err(e) = book.check_new(addr) {
            crate::tenants::refused(&self.metrics, tenant);
            return Err(refuse(e.to_string(), book));
        }
        let admitted = match self.reserve(bandwidth_bits_per_s, tenant) {
            Ok(a) => a,
            Err(why) => return Err(refuse(why, book)),
        };
        match book.insert(now(), id, addr, scope, bandwidth_bits_per_s, admitted) {
            Ok(()) => {
                self.metrics.hls_sessions_admitted.inc();
                self.metrics.hls_sessions.set(book.len() as i64);
                self.set_tenant_gauges();
                Ok(())
            }
            // The limits were checked above under the same lock: only a taken id (a 128-bit
            // collision); the reservation goes back as `_held` is dropped.
            Err((e, _held)) => {
                crate::tenants::refused(&self.metrics, tenant);
                Err(refuse(e.to_string(), book))
            }
        }
    }

    /// The engine's admission for a viewer at `bits_per_s`: an rt stream paced at that rate
    /// (what the same bytes would reserve if the engine sent them), nothing started, in
    /// `tenant`'s share ([`crate::tenants::admit`], which counts a tenant's refusal).
    fn reserve(&self, bits_per_s: u64, tenant: Option<&str>) -> Result<Option<Admitted>, String> {
        // The planner's unit for a bit rate to a byte stream (HTTP), as the engine would send.
        let spec = StreamSpec {
            pacing: Pacing::Rate(Rate::BitsPerSecond(bits_per_s.max(8))),
            class: Some(DiskClass::Rt),
            ..StreamSpec::opened()
        };
        crate::tenants::admit(&self.engine, &self.metrics, &spec, false, tenant).map_err(
            |e| match e {
                crate::tenants::Refused::Engine(StreamError::Plan(why)) => {
                    format!("the session's rate {bits_per_s} bit/s: {why}")
                }
                other => other.to_string(),
            },
        )
    }

    fn new_id(&self) -> String {
        let mut b = [0u8; 16];
        // The system's random source does not fail once the kernel's is seeded; if it did,
        // no id is better than a guessable one.
        self.rng
            .fill(&mut b)
            .expect("the system's random source gives 16 bytes");
        B64.encode(b)
    }

    /// Ends session `id` now (the API's kick): its reservation goes back. False: no such
    /// session (or it had idled out already).
    pub(crate) fn kick(&self, id: &str) -> bool {
        let mut book = self.book();
        self.sweep(&mut book);
        let held = book.remove(id);
        let found = held.is_some();
        drop(held);
        self.metrics.hls_sessions.set(book.len() as i64);
        found
    }

    /// `STATE *` lines: `hls-<id> open scope=<path> peer=<address> bandwidth_bits_per_s=<n>
    /// requests=<n> idle_ms=<n>`.
    pub(crate) fn state_lines(&self) -> Vec<String> {
        let mut book = self.book();
        self.sweep(&mut book);
        book.list(now())
            .into_iter()
            .map(|v| {
                format!(
                    "hls-{} open scope={} peer={} bandwidth_bits_per_s={} requests={} idle_ms={}",
                    v.id,
                    v.scope,
                    v.addr,
                    v.bandwidth_bits_per_s,
                    v.requests,
                    v.idle.as_millis()
                )
            })
            .collect()
    }
}

/// When a refused viewer may try again: when the next session idles out if nothing is
/// fetched (at least 1 s, at most 60 s).
fn retry_after_s(book: &Sessions<Option<Admitted>>) -> u64 {
    let n = now();
    book.next_expiry()
        .map_or(Duration::from_secs(1), |t| t.saturating_duration_since(n))
        .as_secs()
        .saturating_add(1)
        .clamp(1, 60)
}
