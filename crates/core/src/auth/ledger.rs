//! A token's `sessions` cap across HTTP, HLS and RTSP (issue 35 item 4): how many sessions
//! each credential holds open right now.
//!
//! Pure bookkeeping: the server opens a place when a session starts (an HTTP connection's
//! first request under the credential, an RTSP SETUP) and closes it when the session ends
//! (the connection closes, TEARDOWN or the session's timeout). One count per credential,
//! named by [`credential_id`]: the JWT's `jti`, else its `sub`, else a digest of the token
//! itself. The number of credentials tracked at once is bounded (`credentials_max`): a
//! flood of distinct tokens fills the table, and the next new credential is refused rather
//! than the table growing.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

use super::jwt::JwtGrant;

/// What the server applies to a verified credential's sessions (from a JWT's claims).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewerLimits {
    /// The one name the credential's sessions are counted under ([`credential_id`]).
    pub credential: String,
    /// The most sessions open at once (`sessions` claim); `None`: no cap of its own.
    pub sessions_max: Option<u32>,
    /// The rate each session is paced at (`rate` claim), bytes per second.
    pub rate_bytes_per_s: Option<u64>,
    /// The tenant named by the credential (`tenant` claim).
    pub tenant: Option<String>,
    /// The token's `jti`, for revocation.
    pub jti: Option<String>,
}

impl ViewerLimits {
    /// The limits a verified JWT carries; `token` is the JWT as sent (for the credential's
    /// name when it has neither `jti` nor `sub`).
    pub fn of_jwt(grant: &JwtGrant, token: &str) -> ViewerLimits {
        ViewerLimits {
            credential: credential_id(grant, token),
            sessions_max: grant.sessions,
            rate_bytes_per_s: grant.rate_bytes_per_s.filter(|&r| r > 0),
            tenant: grant.tenant.clone(),
            jti: grant.jti.clone(),
        }
    }
}

/// The name a JWT's sessions are counted under: `jti:` + its `jti`, else `sub:` + its
/// `sub` (one user, however many tokens the login service hands it), else `jwt:` + the
/// first 96 bits of SHA-256 over the token (one token, one count).
pub fn credential_id(grant: &JwtGrant, token: &str) -> String {
    if let Some(j) = &grant.jti {
        return format!("jti:{j}");
    }
    if let Some(s) = &grant.sub {
        return format!("sub:{s}");
    }
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    format!("jwt:{}", B64.encode(&d.as_ref()[..12]))
}

/// Why a session was not opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerRefusal {
    /// The credential holds `sessions_max` sessions already.
    #[error("the token's sessions cap is reached (sessions = {sessions_max}, {open} open)")]
    Cap { sessions_max: u32, open: u32 },
    /// `credentials_max` credentials hold sessions already.
    #[error("too many credentials hold sessions (auth.credentials_max {credentials_max})")]
    Full { credentials_max: usize },
}

/// The open sessions of each capped credential.
#[derive(Debug, Clone)]
pub struct SessionLedger {
    open: HashMap<String, u32>,
    credentials_max: usize,
}

impl SessionLedger {
    pub fn new(credentials_max: usize) -> SessionLedger {
        SessionLedger {
            open: HashMap::new(),
            credentials_max: credentials_max.max(1),
        }
    }

    /// Opens one session of `credential` under its cap `sessions_max`.
    pub fn open(&mut self, credential: &str, sessions_max: u32) -> Result<(), LedgerRefusal> {
        let tracked = self.open.len();
        match self.open.get_mut(credential) {
            Some(n) if *n >= sessions_max => Err(LedgerRefusal::Cap {
                sessions_max,
                open: *n,
            }),
            Some(n) => {
                *n += 1;
                Ok(())
            }
            None if sessions_max == 0 => Err(LedgerRefusal::Cap {
                sessions_max,
                open: 0,
            }),
            None if tracked >= self.credentials_max => Err(LedgerRefusal::Full {
                credentials_max: self.credentials_max,
            }),
            None => {
                self.open.insert(credential.to_string(), 1);
                Ok(())
            }
        }
    }

    /// Closes one session of `credential` (opened by [`SessionLedger::open`]).
    pub fn close(&mut self, credential: &str) {
        let n = self
            .open
            .get_mut(credential)
            .expect("a session is closed only after it was opened");
        assert!(*n > 0, "an entry is removed when its count reaches 0");
        *n -= 1;
        if *n == 0 {
            self.open.remove(credential);
        }
    }

    /// The sessions `credential` holds open.
    pub fn open_sessions(&self, credential: &str) -> u32 {
        self.open.get(credential).copied().unwrap_or(0)
    }

    /// The credentials holding at least one session.
    pub fn credentials(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_third_session_of_a_cap_of_two_is_refused_until_one_closes() {
        let mut l = SessionLedger::new(8);
        l.open("jti:a", 2).unwrap();
        l.open("jti:a", 2).unwrap();
        let e = l.open("jti:a", 2).unwrap_err();
        assert_eq!(
            e,
            LedgerRefusal::Cap {
                sessions_max: 2,
                open: 2
            }
        );
        assert!(e.to_string().contains("sessions = 2"), "{e}");
        // Another credential is counted apart.
        l.open("jti:b", 2).unwrap();
        l.close("jti:a");
        l.open("jti:a", 2).unwrap();
        assert_eq!(l.open_sessions("jti:a"), 2);
        l.close("jti:a");
        l.close("jti:a");
        assert_eq!(l.open_sessions("jti:a"), 0);
        assert_eq!(l.credentials(), 1, "an emptied entry is removed");
    }

    #[test]
    fn a_cap_of_zero_refuses_every_session() {
        let mut l = SessionLedger::new(8);
        assert!(matches!(
            l.open("x", 0),
            Err(LedgerRefusal::Cap {
                sessions_max: 0,
                ..
            })
        ));
        assert_eq!(l.credentials(), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut l = SessionLedger::new(2);
        l.open("a", 5).unwrap();
        l.open("b", 5).unwrap();
        assert_eq!(
            l.open("c", 5),
            Err(LedgerRefusal::Full { credentials_max: 2 })
        );
        // Credentials already in the table still open sessions.
        l.open("a", 5).unwrap();
        l.close("b");
        l.open("c", 5).unwrap();
    }

    #[test]
    fn credentials_are_named_by_jti_then_sub_then_the_token() {
        let mut g = JwtGrant {
            expires_s: 10,
            kid: None,
            paths: None,
            sessions: Some(2),
            rate_bytes_per_s: None,
            tenant: None,
            jti: Some("j1".into()),
            sub: Some("alice".into()),
            admin: false,
        };
        assert_eq!(credential_id(&g, "t"), "jti:j1");
        g.jti = None;
        assert_eq!(credential_id(&g, "t"), "sub:alice");
        g.sub = None;
        let a = credential_id(&g, "token-a");
        assert!(a.starts_with("jwt:") && a.len() == 4 + 16, "{a}");
        assert_ne!(a, credential_id(&g, "token-b"));
    }
}
