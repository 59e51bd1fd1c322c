//! Replies: `DDD text` on one line, or FTP/SMTP-style multi-line replies where every line
//! but the last is `DDD-text` and the last is `DDD text` with the same code. A client reads
//! until a line whose fourth character is a space: framing needs no length and no escape.

use std::fmt;

use super::{ControlError, Limits};

/// A three-digit reply code: 2xx done, 4xx the client's mistake (retrying the same line
/// fails again), 5xx the server's refusal or failure (may succeed later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplyCode(u16);

impl ReplyCode {
    /// The command was carried out.
    pub const OK: ReplyCode = ReplyCode(200);
    /// `OPEN` admitted a stream: `201 <id> admitted ...`.
    pub const OPENED: ReplyCode = ReplyCode(201);
    /// `STATE`: one `211-` line per stream, then `211 end ...`.
    pub const STATE: ReplyCode = ReplyCode(211);
    /// `STATS`: `212-key value` lines, then `212 end`.
    pub const STATS: ReplyCode = ReplyCode(212);
    /// `HELP`: `214-` lines, then `214 end`.
    pub const HELP: ReplyCode = ReplyCode(214);
    /// `QUIT`: the server closes the connection after this line.
    pub const BYE: ReplyCode = ReplyCode(221);
    /// The line does not parse (unknown verb, wrong arguments, bad value).
    pub const BAD_SYNTAX: ReplyCode = ReplyCode(400);
    /// This connection must `AUTH` first (remote peer, or another connection's stream).
    pub const AUTH_REQUIRED: ReplyCode = ReplyCode(401);
    /// Wrong token, or the command is not permitted to this connection.
    pub const FORBIDDEN: ReplyCode = ReplyCode(403);
    /// No stream with that id (never existed, or closed).
    pub const NO_SUCH_STREAM: ReplyCode = ReplyCode(404);
    /// The stream is in the wrong state (e.g. `RESUME` of a running stream, `START` twice).
    pub const WRONG_STATE: ReplyCode = ReplyCode(409);
    /// The line exceeded the server's line limit; the server closes the connection.
    pub const LINE_TOO_LONG: ReplyCode = ReplyCode(414);
    /// The server failed (an I/O error opening an endpoint, a broken invariant caught).
    pub const INTERNAL_ERROR: ReplyCode = ReplyCode(500);
    /// Understood but not available here (e.g. `path=uring` where io_uring is refused).
    pub const NOT_IMPLEMENTED: ReplyCode = ReplyCode(501);
    /// Admission control refused the stream; the text names the shortage.
    pub const REFUSED: ReplyCode = ReplyCode(503);

    /// A code from its number; `None` outside 100..=599.
    pub const fn from_code(code: u16) -> Option<ReplyCode> {
        if code >= 100 && code <= 599 {
            Some(ReplyCode(code))
        } else {
            None
        }
    }

    pub const fn code(self) -> u16 {
        self.0
    }

    pub const fn is_success(self) -> bool {
        self.0 >= 200 && self.0 < 300
    }
}

impl fmt::Display for ReplyCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:03}", self.0)
    }
}

/// One reply: zero or more continuation lines and a final line, all with one code.
/// Texts never contain CR or LF (constructors replace them with spaces), so framing holds
/// whatever a message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: ReplyCode,
    /// Continuation lines (`DDD-text`), in order; empty for a one-line reply.
    pub lines: Vec<String>,
    /// The final line's text (`DDD text`).
    pub text: String,
}

impl Reply {
    /// A one-line reply.
    pub fn new(code: ReplyCode, text: impl Into<String>) -> Reply {
        Reply {
            code,
            lines: Vec::new(),
            text: sanitize(text.into()),
        }
    }

    /// A multi-line reply: `lines` as continuations, then `text`.
    pub fn multi(
        code: ReplyCode,
        lines: impl IntoIterator<Item = String>,
        text: impl Into<String>,
    ) -> Reply {
        Reply {
            code,
            lines: lines.into_iter().map(sanitize).collect(),
            text: sanitize(text.into()),
        }
    }

    /// `200 OK` (or `200 <text>`).
    pub fn ok(text: impl Into<String>) -> Reply {
        Reply::new(ReplyCode::OK, text)
    }

    /// `201 <id> admitted <details>`: the id comes first so a script can `cut -d' ' -f2`.
    pub fn opened(id: super::StreamId, details: &str) -> Reply {
        let text = if details.is_empty() {
            format!("{id} admitted")
        } else {
            format!("{id} admitted {details}")
        };
        Reply::new(ReplyCode::OPENED, text)
    }

    /// `503 refused <shortage>`, e.g. `503 refused disk bandwidth: need 12MB/s, 3MB/s free`.
    pub fn refused(shortage: &str) -> Reply {
        Reply::new(ReplyCode::REFUSED, format!("refused {shortage}"))
    }

    /// The first word of the final line parsed as a stream id: what `201` carries.
    pub fn stream_id(&self) -> Option<super::StreamId> {
        let w = self.text.split(' ').next()?;
        if w.is_empty() || !w.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        w.parse().ok().map(super::StreamId)
    }

    /// The whole reply as text, each line ending in `\n` (same as `to_string()`).
    pub fn to_line(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.lines {
            writeln!(f, "{}-{l}", self.code)?;
        }
        writeln!(f, "{} {}", self.code, self.text)
    }
}

fn sanitize(s: String) -> String {
    if s.contains(['\r', '\n']) {
        s.replace(['\r', '\n'], " ")
    } else {
        s
    }
}

/// The client side: feed reply lines one at a time (with or without their line ending);
/// a [`Reply`] comes out when its final line arrives.
#[derive(Debug, Clone)]
pub struct ReplyParser {
    limits: Limits,
    pending: Option<(ReplyCode, Vec<String>)>,
}

impl ReplyParser {
    pub fn new(limits: Limits) -> ReplyParser {
        ReplyParser {
            limits,
            pending: None,
        }
    }

    /// Whether a multi-line reply has started and not ended.
    pub fn is_mid_reply(&self) -> bool {
        self.pending.is_some()
    }

    /// Consumes one line. Errors (bad shape, a code change mid-reply, too many lines, too
    /// long) mean the server is not speaking this protocol: the client should give up.
    pub fn push_line(&mut self, line: &str) -> Result<Option<Reply>, ControlError> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let bad = || ControlError::BadReply(line.chars().take(64).collect());
        if line.len() > self.limits.line_bytes_max {
            return Err(ControlError::LineTooLong {
                limit_bytes: self.limits.line_bytes_max,
            });
        }
        let b = line.as_bytes();
        if b.len() < 3 || !b[..3].iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        let code = ReplyCode::from_code(line[..3].parse().map_err(|_| bad())?).ok_or_else(bad)?;
        let (last, text) = match b.get(3) {
            None => (true, ""),
            Some(b' ') => (true, &line[4..]),
            Some(b'-') => (false, &line[4..]),
            Some(_) => return Err(bad()),
        };
        if self
            .pending
            .as_ref()
            .is_some_and(|(pending_code, _)| *pending_code != code)
        {
            return Err(bad());
        }
        if last {
            let lines = self.pending.take().map(|(_, l)| l).unwrap_or_default();
            return Ok(Some(Reply {
                code,
                lines,
                text: text.to_string(),
            }));
        }
        let (_, lines) = self.pending.get_or_insert_with(|| (code, Vec::new()));
        if lines.len() == self.limits.reply_lines_max {
            self.pending = None;
            return Err(ControlError::ReplyTooLong {
                limit: self.limits.reply_lines_max,
            });
        }
        lines.push(text.to_string());
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::StreamId;

    fn parse_all(text: &str) -> Result<Vec<Reply>, ControlError> {
        let mut p = ReplyParser::new(Limits::default());
        let mut out = Vec::new();
        for l in text.lines() {
            out.extend(p.push_line(l)?);
        }
        assert!(!p.is_mid_reply());
        Ok(out)
    }

    #[test]
    fn one_line_replies() {
        assert_eq!(Reply::ok("OK").to_string(), "200 OK\n");
        let r = Reply::opened(StreamId(7), "class=rt rate=30/s");
        assert_eq!(r.to_line(), "201 7 admitted class=rt rate=30/s\n");
        assert_eq!(r.stream_id(), Some(StreamId(7)));
        assert_eq!(Reply::ok("OK").stream_id(), None);
        assert_eq!(
            Reply::refused("disk bandwidth: need 12MB/s, 3MB/s free").to_string(),
            "503 refused disk bandwidth: need 12MB/s, 3MB/s free\n"
        );
        assert_eq!(
            Reply::new(ReplyCode::NO_SUCH_STREAM, "no\r\nsuch").to_string(),
            "404 no  such\n"
        );
    }

    #[test]
    fn multi_line_round_trip() {
        let r = Reply::multi(
            ReplyCode::STATE,
            [
                "1 running offset=4096".to_string(),
                "2 paused offset=0".to_string(),
                "211 looks final".to_string(),
            ],
            "end 2",
        );
        let text = r.to_string();
        assert_eq!(
            text,
            "211-1 running offset=4096\n211-2 paused offset=0\n211-211 looks final\n211 end 2\n"
        );
        assert_eq!(parse_all(&text), Ok(vec![r]));
        // CRLF endings, a bare code, and two replies back to back.
        let two = parse_all("200 OK\r\n214-HELP\r\n214\r\n").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(
            two[1],
            Reply::multi(ReplyCode::HELP, ["HELP".to_string()], "")
        );
    }

    #[test]
    fn bad_replies() {
        for l in ["", "20 OK", "2000 OK", "abc OK", "200_OK", "999 x", "099 x"] {
            let mut p = ReplyParser::new(Limits::default());
            assert!(p.push_line(l).is_err(), "{l:?}");
        }
        let mut p = ReplyParser::new(Limits::default());
        assert_eq!(p.push_line("211-a"), Ok(None));
        assert!(p.push_line("212 b").is_err());
        let mut p = ReplyParser::new(Limits {
            reply_lines_max: 2,
            ..Limits::default()
        });
        assert_eq!(p.push_line("211-a"), Ok(None));
        assert_eq!(p.push_line("211-b"), Ok(None));
        assert_eq!(
            p.push_line("211-c"),
            Err(ControlError::ReplyTooLong { limit: 2 })
        );
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn reply_text_reply(code in 100u16..600, lines in proptest::collection::vec("\\PC{0,40}", 0..5), text in "\\PC{0,40}") {
                let r = Reply::multi(ReplyCode::from_code(code).unwrap(), lines, text);
                prop_assert_eq!(parse_all(&r.to_string()), Ok(vec![r]));
            }

            #[test]
            fn parser_never_panics(lines in proptest::collection::vec("\\PC{0,12}", 0..6)) {
                let mut p = ReplyParser::new(Limits::default());
                for l in &lines {
                    let _ = p.push_line(l);
                }
            }
        }
    }
}
