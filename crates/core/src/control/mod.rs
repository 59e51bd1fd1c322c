//! The stream control protocol: Cues' control descriptor as a line-based text protocol.
//!
//! In Cues, `cue(src, dst)` returns a descriptor; writing commands to it sets the offset,
//! the unit and the length and starts the transfer, and because it is a descriptor a remote
//! peer can drive the transfer too. Here the descriptor is a stream id, and the commands are
//! lines of text on a TCP or Unix socket, so `nc` is a client. The grammar is in
//! `docs/control-protocol.md`; this module is its only implementation: [`parse_command`]
//! (server side), [`Command`]'s `Display` (client side, and the round-trip tests), [`Reply`]
//! and [`ReplyParser`].
//!
//! What is absent: sockets, the stream table, admission. The driver frames lines with
//! [`next_line`], parses them, executes them against the engine and writes a [`Reply`].

mod command;
mod parse;
mod reply;

pub use command::{
    Class, Command, DataPath, DiskTune, KtSchedule, OpenSpec, StartTime, StreamId, StreamSelector,
    Token,
};
pub use parse::{
    next_line, parse_command, parse_command_bytes, parse_command_bytes_on, parse_command_on,
    parse_open_options,
};
pub use reply::{Reply, ReplyCode, ReplyParser};

/// Bounds on one line and what it may ask for; each overflow is a typed error, never an
/// allocation proportional to the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// One line, without its line ending. Beyond: [`ControlError::LineTooLong`].
    pub line_bytes_max: usize,
    /// Ids in one `STATE a,b,c`. Beyond: [`ControlError::TooManyIds`].
    pub state_ids_max: usize,
    /// `key=value` options and flags after `OPEN src dst`. Beyond:
    /// [`ControlError::TooManyOptions`].
    pub open_options_max: usize,
    /// Continuation lines in one multi-line reply (client side). Beyond:
    /// [`ControlError::ReplyTooLong`].
    pub reply_lines_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            line_bytes_max: 4096,
            state_ids_max: 1024,
            open_options_max: 16,
            reply_lines_max: 4096,
        }
    }
}

/// Why a line was refused. Every variant is answered with a [`Reply`] of code
/// [`ControlError::reply_code`] and the error's text; the connection stays open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("empty line")]
    Empty,
    #[error("line longer than {limit_bytes} bytes")]
    LineTooLong { limit_bytes: usize },
    #[error("line is not UTF-8")]
    NotUtf8,
    #[error("control character in line")]
    ControlCharacter,
    #[error("unknown command {0:?} (try HELP)")]
    UnknownVerb(String),
    #[error("{verb}: expected {expected}")]
    Arity {
        verb: &'static str,
        expected: &'static str,
    },
    #[error("bad stream id {0:?}: expected a decimal number below 2^64")]
    BadStreamId(String),
    #[error("more than {limit} stream ids")]
    TooManyIds { limit: usize },
    #[error("more than {limit} options")]
    TooManyOptions { limit: usize },
    #[error("unknown option {0:?}")]
    UnknownOption(String),
    #[error("option {0} given twice")]
    DuplicateOption(&'static str),
    #[error("bad value for {name}: {value:?} ({expected})")]
    BadValue {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// Client side: a reply line that is not `DDD text` / `DDD-text`.
    #[error("malformed reply line {0:?}")]
    BadReply(String),
    #[error("multi-line reply longer than {limit} lines")]
    ReplyTooLong { limit: usize },
}

impl ControlError {
    /// The reply code the server answers with: 414 for an over-long line, 400 for the rest.
    pub fn reply_code(&self) -> ReplyCode {
        match self {
            ControlError::LineTooLong { .. } => ReplyCode::LINE_TOO_LONG,
            _ => ReplyCode::BAD_SYNTAX,
        }
    }

    /// The reply the server sends for this error.
    pub fn to_reply(&self) -> Reply {
        Reply::new(self.reply_code(), self.to_string())
    }
}
