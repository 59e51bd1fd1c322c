//! HLS viewer sessions (issue 32 item 7, docs/hls.md "Viewer sessions"): the book of who is
//! watching. A location with `sessions = true` gives each viewer a session id, written into
//! the URIs its playlist names (`?sid=ID`, the parameter the signed session tokens of
//! [`crate::auth`] carry: one id for both); a viewer is a session while it keeps fetching.
//!
//! Pure bookkeeping: the caller hands in `now`, the peer's address and what the session
//! holds (`T`: the server keeps the engine's admission reservation there, given back when the
//! entry is dropped). Nothing here reads a clock or makes an id: the server draws ids from
//! the system's random source and checks them with [`parse_session_id`].
//!
//! Order of use, for every request of a sessions location: [`Sessions::expire`] first (the
//! idle ones leave and their reservations go back before anything is admitted), then
//! [`Sessions::touch`] for a request that names a session, or [`Sessions::check_new`] → the
//! engine's admission → [`Sessions::insert`] for a new one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::time::Instant;

/// The longest session id accepted from a request (base64url characters): what the signed
/// session tokens allow too. The server's own ids are 22 (16 random bytes).
pub const SESSION_ID_BYTES_MAX: usize = 32;
/// The most query parameters looked at for `sid` (as [`crate::auth::QUERY_PARAMS_MAX`]).
pub const QUERY_PARAMS_MAX: usize = crate::auth::QUERY_PARAMS_MAX;

/// The limits of the session book (`[hls] session_idle_ms`, `sessions_max`,
/// `sessions_per_address_max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session that fetched nothing for this long has ended.
    pub idle: Duration,
    /// Sessions at once, in all.
    pub sessions_max: usize,
    /// Sessions at once from one client address.
    pub per_address_max: usize,
}

/// Why a new session was not opened (before admission was asked).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionRefusal {
    #[error("hls.sessions_max {0} sessions already open")]
    SessionsMax(usize),
    #[error("hls.sessions_per_address_max {max} sessions already open from {addr}")]
    PerAddress { max: usize, addr: IpAddr },
    #[error("session id {0:?} is in use")]
    Taken(String),
}

/// What [`Sessions::touch`] found for a request naming a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// Live, and `path` is within its scope: its idle clock restarts.
    Live,
    /// Live, but for another title: the request is not this session's.
    OtherTitle,
    /// No such session (never opened here, or ended).
    Unknown,
}

/// One session, as listed (`STATE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionView {
    pub id: String,
    /// What it may fetch: a file (`/movie/high.ts`) or a directory of renditions (`/movie/`).
    pub scope: String,
    pub addr: IpAddr,
    /// What it was admitted at.
    pub bandwidth_bits_per_s: u64,
    /// Requests it made (playlists and segments).
    pub requests: u64,
    /// Since its last request.
    pub idle: Duration,
}

#[derive(Debug)]
struct Entry<T> {
    scope: String,
    addr: IpAddr,
    last: Instant,
    bandwidth_bits_per_s: u64,
    requests: u64,
    held: T,
}

/// The open sessions, by id.
#[derive(Debug)]
pub struct Sessions<T> {
    limits: SessionLimits,
    map: HashMap<String, Entry<T>>,
    per_address: HashMap<IpAddr, usize>,
}

impl<T> Sessions<T> {
    pub fn new(limits: SessionLimits) -> Sessions<T> {
        Sessions {
            limits,
            map: HashMap::new(),
            per_address: HashMap::new(),
        }
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Open sessions.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Ends every session idle for at least `limits.idle` at `now`, handing back what each
    /// held (the caller drops it: its reservation goes back), with its id.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, T)> {
        let idle = self.limits.idle;
        let gone: Vec<String> = self
            .map
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.last) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        gone.into_iter()
            .filter_map(|id| self.remove(&id).map(|held| (id, held)))
            .collect()
    }

    /// Ends session `id` now (the operator's kick), handing back what it held; `None`:
    /// no such session.
    pub fn remove(&mut self, id: &str) -> Option<T> {
        let e = self.map.remove(id)?;
        if let Some(n) = self.per_address.get_mut(&e.addr) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&e.addr);
            }
        }
        Some(e.held)
    }

    /// Whether a new session from `addr` may be opened now (asked before admission, so a
    /// refusal here costs the engine nothing).
    pub fn check_new(&self, addr: IpAddr) -> Result<(), SessionRefusal> {
        if self.map.len() >= self.limits.sessions_max {
            return Err(SessionRefusal::SessionsMax(self.limits.sessions_max));
        }
        if self.per_address.get(&addr).copied().unwrap_or(0) >= self.limits.per_address_max {
            return Err(SessionRefusal::PerAddress {
                max: self.limits.per_address_max,
                addr,
            });
        }
        Ok(())
    }

    /// Opens session `id` (admitted at `bandwidth_bits_per_s`, holding `held`) at `now`; the
    /// limits are checked again. On a refusal `held` is handed back with it.
    pub fn insert(
        &mut self,
        now: Instant,
        id: &str,
        addr: IpAddr,
        scope: &str,
        bandwidth_bits_per_s: u64,
        held: T,
    ) -> Result<(), (SessionRefusal, T)> {
        if self.map.contains_key(id) {
            return Err((SessionRefusal::Taken(id.to_string()), held));
        }
        if let Err(e) = self.check_new(addr) {
            return Err((e, held));
        }
        *self.per_address.entry(addr).or_insert(0) += 1;
        self.map.insert(
            id.to_string(),
            Entry {
                scope: scope.to_string(),
                addr,
                last: now,
                bandwidth_bits_per_s,
                requests: 1,
                held,
            },
        );
        Ok(())
    }

    /// What open session `id` holds.
    pub fn held(&self, id: &str) -> Option<&T> {
        self.map.get(id).map(|e| &e.held)
    }

    /// A request of session `id` for `path` at `now`: [`Touch::Live`] restarts its idle
    /// clock. A session ended by idling is [`Touch::Unknown`] even before
    /// [`Sessions::expire`] removed it.
    pub fn touch(&mut self, now: Instant, id: &str, path: &str) -> Touch {
        let idle = self.limits.idle;
        let Some(e) = self.map.get_mut(id) else {
            return Touch::Unknown;
        };
        if now.saturating_duration_since(e.last) >= idle {
            return Touch::Unknown;
        }
        if !in_scope(&e.scope, path) {
            return Touch::OtherTitle;
        }
        e.last = e.last.max(now);
        e.requests += 1;
        Touch::Live
    }

    /// The open sessions at `now`, by id.
    pub fn list(&self, now: Instant) -> Vec<SessionView> {
        let mut v: Vec<SessionView> = self
            .map
            .iter()
            .map(|(id, e)| SessionView {
                id: id.clone(),
                scope: e.scope.clone(),
                addr: e.addr,
                bandwidth_bits_per_s: e.bandwidth_bits_per_s,
                requests: e.requests,
                idle: now.saturating_duration_since(e.last),
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// When the next session idles out if nothing is fetched (`None`: none open).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.map
            .values()
            .map(|e| e.last.saturating_add(self.limits.idle))
            .min()
    }
}

/// Whether `path` is within `scope`: the file itself, or anything beneath a directory
/// scope (ending in `/`).
pub fn in_scope(scope: &str, path: &str) -> bool {
    path == scope || (scope.ends_with('/') && path.starts_with(scope))
}

/// The session id a query names (`sid=ID`; still percent-encoded, without `?`): `Ok(None)`
/// without one; an error for one that is empty, longer than [`SESSION_ID_BYTES_MAX`], not
/// base64url, or given twice. Only the first [`QUERY_PARAMS_MAX`] parameters are looked at.
pub fn parse_session_id(query: &str) -> Result<Option<&str>, &'static str> {
    let mut found = None;
    for pair in query.split('&').take(QUERY_PARAMS_MAX) {
        let Some(v) = pair.strip_prefix("sid=") else {
            continue;
        };
        if found.is_some() {
            return Err("sid appears twice");
        }
        if !valid_session_id(v) {
            return Err("sid is not 1 ..= 32 base64url characters");
        }
        found = Some(v);
    }
    Ok(found)
}

/// 1 ..= [`SESSION_ID_BYTES_MAX`] base64url characters.
pub fn valid_session_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= SESSION_ID_BYTES_MAX
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn book(max: usize, per: usize) -> Sessions<u32> {
        Sessions::new(SessionLimits {
            idle: Duration::from_millis(1000),
            sessions_max: max,
            per_address_max: per,
        })
    }

    #[test]
    fn a_session_lives_while_it_fetches_and_ends_when_idle() {
        let mut s = book(4, 4);
        s.insert(at(0), "x", A, "/m/a.ts", 800_000, 7).unwrap();
        assert_eq!(s.touch(at(900), "x", "/m/a.ts"), Touch::Live);
        // 1.8 s after its start, 0.9 s after its last fetch: still live.
        assert!(s.expire(at(1800)).is_empty());
        assert_eq!(s.touch(at(1800), "x", "/m/a.ts"), Touch::Live);
        assert_eq!(s.next_expiry(), Some(at(2800)));
        // Idle for exactly the limit: ended, even before expire() ran.
        assert_eq!(s.touch(at(2800), "x", "/m/a.ts"), Touch::Unknown);
        assert_eq!(s.expire(at(2800)), vec![("x".to_string(), 7)]);
        assert!(s.is_empty());
        assert_eq!(s.touch(at(2801), "x", "/m/a.ts"), Touch::Unknown);
        assert_eq!(s.next_expiry(), None);
    }

    #[test]
    fn scope_is_the_file_or_the_directory_of_renditions() {
        let mut s = book(4, 4);
        s.insert(at(0), "f", A, "/m/a.ts", 1, 0).unwrap();
        s.insert(at(0), "d", A, "/movie/", 1, 0).unwrap();
        assert_eq!(s.touch(at(1), "f", "/m/b.ts"), Touch::OtherTitle);
        assert_eq!(s.touch(at(1), "f", "/m/a.ts.x"), Touch::OtherTitle);
        assert_eq!(s.touch(at(1), "d", "/movie/high.ts"), Touch::Live);
        assert_eq!(s.touch(at(1), "d", "/movie/low.ts/index.m3u8"), Touch::Live);
        assert_eq!(s.touch(at(1), "d", "/movies/x.ts"), Touch::OtherTitle);
        assert_eq!(s.touch(at(1), "nope", "/m/a.ts"), Touch::Unknown);
        assert_eq!(s.list(at(1))[0].requests, 3);
    }

    #[test]
    fn limits_in_all_and_per_address() {
        let mut s = book(3, 2);
        s.insert(at(0), "1", A, "/a", 1, 0).unwrap();
        s.insert(at(0), "2", A, "/a", 1, 0).unwrap();
        assert_eq!(
            s.check_new(A),
            Err(SessionRefusal::PerAddress { max: 2, addr: A })
        );
        let (e, held) = s.insert(at(0), "3", A, "/a", 1, 9).unwrap_err();
        assert!(matches!(e, SessionRefusal::PerAddress { .. }));
        assert_eq!(held, 9, "a refused insert hands back what it was to hold");
        s.insert(at(0), "3", B, "/a", 1, 0).unwrap();
        assert_eq!(s.check_new(B), Err(SessionRefusal::SessionsMax(3)));
        assert!(matches!(
            s.insert(at(0), "3", B, "/a", 1, 0),
            Err((SessionRefusal::Taken(_), 0))
        ));
        // Two of A's end: A may open again, and the book is below its max.
        s.touch(at(900), "3", "/a");
        assert_eq!(s.expire(at(1000)).len(), 2);
        assert_eq!(s.check_new(A), Ok(()));
        assert_eq!(s.list(at(1000)).len(), 1);
    }

    #[test]
    fn session_ids_in_queries() {
        assert_eq!(parse_session_id("sid=abc_-9"), Ok(Some("abc_-9")));
        assert_eq!(parse_session_id("x=1&sid=Q"), Ok(Some("Q")));
        assert_eq!(parse_session_id("x=1&sids=Q"), Ok(None));
        assert_eq!(parse_session_id(""), Ok(None));
        assert!(parse_session_id("sid=").is_err());
        assert!(parse_session_id("sid=a.b").is_err());
        assert!(parse_session_id("sid=a%41").is_err());
        assert!(parse_session_id(&format!("sid={}", "a".repeat(33))).is_err());
        assert!(parse_session_id("sid=a&sid=b").is_err());
        // Past the parameters looked at, a sid is not seen.
        let q = format!("{}sid=z", "p=1&".repeat(QUERY_PARAMS_MAX));
        assert_eq!(parse_session_id(&q), Ok(None));
    }

    proptest! {
        /// Whatever the requests and times: the per-address counts add up to the book's
        /// size, no address exceeds its limit, the book never exceeds its max, and after
        /// expire() no session is older than the idle limit.
        #[test]
        fn counts_stay_consistent(ops in proptest::collection::vec((0u8..3, 0u8..6, 0u8..3, 0u64..700), 0..200)) {
            let mut s = book(4, 2);
            let mut now = 0u64;
            for (op, id, addr, dt) in ops {
                now += dt;
                let id = id.to_string();
                let addr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, addr));
                match op {
                    0 => { let _ = s.insert(at(now), &id, addr, "/t", 1, 0); }
                    1 => { s.touch(at(now), &id, "/t"); }
                    _ => { s.expire(at(now)); }
                }
                let total: usize = s.per_address.values().sum();
                prop_assert_eq!(total, s.len());
                prop_assert!(s.len() <= 4);
                prop_assert!(s.per_address.values().all(|&n| (1..=2).contains(&n)));
            }
            s.expire(at(now));
            prop_assert!(s.list(at(now)).iter().all(|v| v.idle < Duration::from_millis(1000)));
        }
    }
}
