//! Commands as values. `Display` writes the canonical line (upper-case verb, options in a
//! fixed order, sizes in bytes), which [`super::parse_command`] reads back to an equal
//! value: the client builds commands with this and the round-trip tests rely on it.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::schedule::LatePolicy;
use crate::stream::CachePolicy;
use crate::units::Rate;

/// A stream's id: a u64 in decimal, unique for the server's lifetime (the server never reuses
/// one, so a stale id held by a remote controller cannot reach another stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Which streams a `STATE` asks about (MARS's `stream_state` over a set of streams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSelector {
    /// `*`: every stream the connection may see.
    All,
    /// `a,b,c` in the order given (duplicates kept: the reply has one line per id given).
    Ids(Vec<StreamId>),
}

impl fmt::Display for StreamSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamSelector::All => f.write_str("*"),
            StreamSelector::Ids(ids) => {
                for (i, id) in ids.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{id}")?;
                }
                Ok(())
            }
        }
    }
}

/// A QoS class: the two built-in ones or a configured name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Class {
    /// Real-time: periodic, admitted against deadlines.
    Rt,
    /// Best effort.
    Bulk,
    /// A class from the configuration: 1 to 32 of `[A-Za-z0-9_-]`, starting with a letter;
    /// never `rt` or `bulk` in any case (those parse as [`Class::Rt`] / [`Class::Bulk`]).
    Named(String),
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Class::Rt => f.write_str("rt"),
            Class::Bulk => f.write_str("bulk"),
            Class::Named(n) => f.write_str(n),
        }
    }
}

/// How bytes move from source to destination. `Auto` lets the driver pick from what its
/// probe found; the others are requests the server may refuse with 501.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataPath {
    Auto,
    /// read + write through a user buffer (the baseline).
    Copy,
    Sendfile,
    Splice,
    /// io_uring with registered buffers.
    Uring,
}

impl DataPath {
    pub(crate) const ALL: [(&'static str, DataPath); 5] = [
        ("auto", DataPath::Auto),
        ("copy", DataPath::Copy),
        ("sendfile", DataPath::Sendfile),
        ("splice", DataPath::Splice),
        ("uring", DataPath::Uring),
    ];
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = DataPath::ALL
            .iter()
            .find(|(_, p)| p == self)
            .map_or("auto", |(n, _)| n);
        f.write_str(name)
    }
}

/// Cues' `(k, t)` schedule: send `blocks` units, then wait `delay`, and repeat.
/// Invariant: `blocks >= 1` (a schedule that sends nothing would never finish).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KtSchedule {
    pub blocks: u32,
    pub delay: Duration,
}

impl fmt::Display for KtSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.blocks, DurationText(self.delay))
    }
}

/// An `AUTH` token. Its `Debug` is redacted so that logging a command never leaks it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl Token {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// `OPEN`'s arguments: Cues' `cue(src, dst)` plus Clockwise's QoS parameters at open.
/// Unset options take the server's defaults; consistency between them (e.g. `rate` with
/// `period`) is the admission module's to judge, not the parser's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSpec {
    /// Source endpoint, unparsed (one whitespace-free token; `endpoint` parses it).
    pub src: String,
    /// Destination endpoint, unparsed.
    pub dst: String,
    pub class: Option<Class>,
    pub rate: Option<Rate>,
    /// Non-zero.
    pub period: Option<Duration>,
    /// Non-zero.
    pub unit_bytes: Option<u64>,
    pub schedule: Option<KtSchedule>,
    /// Cues' (k, t) as the paper defines it (`pause=K,T`): `blocks` units, then a pause of
    /// `delay` after the last of them was sent (`schedule=` is the cycle form).
    pub pause: Option<KtSchedule>,
    /// Non-zero.
    pub buffers: Option<u32>,
    pub offset_bytes: Option<u64>,
    pub length_bytes: Option<u64>,
    pub path: Option<DataPath>,
    /// The stream outlives the connection that opened it.
    pub detached: bool,
    /// A file target that exists may be cut to length 0 and rewritten (without it, a file
    /// target must be new).
    pub truncate: bool,
    /// What a paced stream does with a unit later than its miss threshold (`late=send|skip`).
    pub late: Option<LatePolicy>,
    /// What the stream does to the page cache (`cache=keep|bypass|drop`; bypass is O_DIRECT).
    pub cache: Option<CachePolicy>,
}

impl OpenSpec {
    /// An `OPEN src dst` with every option unset.
    pub fn new(src: impl Into<String>, dst: impl Into<String>) -> OpenSpec {
        OpenSpec {
            src: src.into(),
            dst: dst.into(),
            class: None,
            rate: None,
            period: None,
            unit_bytes: None,
            schedule: None,
            pause: None,
            buffers: None,
            offset_bytes: None,
            length_bytes: None,
            path: None,
            detached: false,
            truncate: false,
            late: None,
            cache: None,
        }
    }
}

/// When a `START … AT` stream's unit 0 is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StartTime {
    /// `+250ms`: this long after the server reads the command.
    In(Duration),
    /// An RFC 3339 instant (`2026-11-24T12:00:00.5Z`, `2026-11-24T13:00:00+01:00`), as
    /// nanoseconds since the Unix epoch in UTC (1970 to 2554: what a u64 holds).
    At { unix_ns: u64 },
}

impl StartTime {
    /// The wall-clock instant of an [`StartTime::At`].
    pub fn system_time(unix_ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(unix_ns)
    }
}

impl fmt::Display for StartTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartTime::In(d) => write!(f, "+{}", DurationText(*d)),
            // Every u64 of nanoseconds is before 9999, which humantime formats.
            StartTime::At { unix_ns } => write!(
                f,
                "{}",
                humantime::format_rfc3339_nanos(StartTime::system_time(*unix_ns))
            ),
        }
    }
}

/// `TUNE disk`: the engine's disk scheduler settings to change (MARS's quanta "changed over
/// time"); an absent one is kept. All absent: a query.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DiskTune {
    /// Bytes of cost the `rt` class may read per DRR round.
    pub rt_quantum_bytes: Option<u64>,
    /// Bytes of cost the `bulk` class may read per DRR round.
    pub bulk_quantum_bytes: Option<u64>,
    /// Reads in flight per device at most (`disk_inflight_max`).
    pub inflight_max: Option<u32>,
    /// Configured classes' quanta (`NAME_quantum=SIZE`), in the order given, each name once.
    pub class_quanta: Vec<(String, u64)>,
}

impl DiskTune {
    /// Nothing to change: the command asks for the settings in force.
    pub fn is_query(&self) -> bool {
        *self == DiskTune::default()
    }
}

/// One line of the control protocol, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// Create a stream (→ 201 with its id, or 503 with the shortage).
    Open(Box<OpenSpec>),
    /// `OPEN`, whose 201 reply carries the new stream's *own descriptor* (Cues' control
    /// descriptor) by SCM_RIGHTS: Unix-socket connections only. The stream belongs to that
    /// descriptor, not to the connection that sent `CUE`.
    Cue(Box<OpenSpec>),
    /// Set the source offset of the next transfer.
    Seek {
        id: StreamId,
        offset_bytes: u64,
    },
    /// Set the transfer unit (non-zero).
    Unit {
        id: StreamId,
        unit_bytes: u64,
    },
    /// Set how many bytes remain to transfer.
    Length {
        id: StreamId,
        length_bytes: u64,
    },
    Rate {
        id: StreamId,
        rate: Rate,
    },
    Schedule {
        id: StreamId,
        schedule: KtSchedule,
    },
    /// Start a pending stream, now or (`AT`) with its unit 0 due at a given time.
    Start {
        id: StreamId,
        at: Option<StartTime>,
    },
    Pause {
        id: StreamId,
    },
    Resume {
        id: StreamId,
    },
    /// Move a stream to another disk class while it runs (re-admitted there, or refused and
    /// left as it was).
    Class {
        id: StreamId,
        class: Class,
    },
    /// One reply line per selected stream, then an end line.
    State(StreamSelector),
    /// Close after in-flight I/O completes, or at once with `NOW`.
    Close {
        id: StreamId,
        now: bool,
    },
    Stats,
    /// Change (or, with nothing to change, report) the engine's disk scheduler settings.
    TuneDisk(DiskTune),
    Auth(Token),
    Help,
    Quit,
}

impl Command {
    /// The one stream a stream command names (`SEEK` … `CLOSE`, not `STATE`, which names a
    /// set).
    pub fn stream_id(&self) -> Option<StreamId> {
        match self {
            Command::Seek { id, .. }
            | Command::Unit { id, .. }
            | Command::Length { id, .. }
            | Command::Rate { id, .. }
            | Command::Schedule { id, .. }
            | Command::Start { id, .. }
            | Command::Pause { id }
            | Command::Resume { id }
            | Command::Class { id, .. }
            | Command::Close { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// The verb as written on the wire.
    pub fn verb(&self) -> &'static str {
        match self {
            Command::Open(_) => "OPEN",
            Command::Cue(_) => "CUE",
            Command::Seek { .. } => "SEEK",
            Command::Unit { .. } => "UNIT",
            Command::Length { .. } => "LENGTH",
            Command::Rate { .. } => "RATE",
            Command::Schedule { .. } => "SCHEDULE",
            Command::Start { .. } => "START",
            Command::Pause { .. } => "PAUSE",
            Command::Resume { .. } => "RESUME",
            Command::Class { .. } => "CLASS",
            Command::State(_) => "STATE",
            Command::Close { .. } => "CLOSE",
            Command::Stats => "STATS",
            Command::TuneDisk(_) => "TUNE",
            Command::Auth(_) => "AUTH",
            Command::Help => "HELP",
            Command::Quit => "QUIT",
        }
    }
}

impl fmt::Display for Command {
    /// The canonical line, without line ending.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.verb())?;
        match self {
            Command::Open(o) | Command::Cue(o) => {
                write!(f, " {} {}", o.src, o.dst)?;
                if let Some(c) = &o.class {
                    write!(f, " class={c}")?;
                }
                if let Some(r) = o.rate {
                    write!(f, " rate={}", RateText(r))?;
                }
                if let Some(p) = o.period {
                    write!(f, " period={}", DurationText(p))?;
                }
                if let Some(u) = o.unit_bytes {
                    write!(f, " unit={u}")?;
                }
                if let Some(s) = o.schedule {
                    write!(f, " schedule={s}")?;
                }
                if let Some(s) = o.pause {
                    write!(f, " pause={s}")?;
                }
                if let Some(b) = o.buffers {
                    write!(f, " buffers={b}")?;
                }
                if let Some(n) = o.offset_bytes {
                    write!(f, " offset={n}")?;
                }
                if let Some(n) = o.length_bytes {
                    write!(f, " length={n}")?;
                }
                if let Some(p) = o.path {
                    write!(f, " path={p}")?;
                }
                if let Some(l) = o.late {
                    write!(f, " late={l}")?;
                }
                if let Some(c) = o.cache {
                    write!(f, " cache={}", c.name())?;
                }
                if o.detached {
                    f.write_str(" DETACHED")?;
                }
                if o.truncate {
                    f.write_str(" TRUNCATE")?;
                }
                Ok(())
            }
            Command::Seek {
                id,
                offset_bytes: n,
            }
            | Command::Unit { id, unit_bytes: n }
            | Command::Length {
                id,
                length_bytes: n,
            } => write!(f, " {id} {n}"),
            Command::Rate { id, rate } => write!(f, " {id} {}", RateText(*rate)),
            Command::Schedule { id, schedule } => write!(f, " {id} {schedule}"),
            Command::Start { id, at } => {
                write!(f, " {id}")?;
                if let Some(at) = at {
                    write!(f, " AT {at}")?;
                }
                Ok(())
            }
            Command::Pause { id } | Command::Resume { id } => write!(f, " {id}"),
            Command::Class { id, class } => write!(f, " {id} {class}"),
            Command::TuneDisk(t) => {
                f.write_str(" disk")?;
                if let Some(q) = t.rt_quantum_bytes {
                    write!(f, " rt_quantum={q}")?;
                }
                if let Some(q) = t.bulk_quantum_bytes {
                    write!(f, " bulk_quantum={q}")?;
                }
                if let Some(n) = t.inflight_max {
                    write!(f, " inflight={n}")?;
                }
                for (name, q) in &t.class_quanta {
                    write!(f, " {name}_quantum={q}")?;
                }
                Ok(())
            }
            Command::State(sel) => write!(f, " {sel}"),
            Command::Close { id, now } => {
                write!(f, " {id}")?;
                if *now {
                    f.write_str(" NOW")?;
                }
                Ok(())
            }
            Command::Auth(t) => write!(f, " {}", t.as_str()),
            Command::Stats | Command::Help | Command::Quit => Ok(()),
        }
    }
}

/// A duration in the largest unit that keeps it exact, in a form `parse_duration` reads.
pub(crate) struct DurationText(pub Duration);

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            f.write_str("0")
        } else if ns.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", ns / 1_000_000_000)
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

/// A rate in a form `parse_rate` reads back exactly: every rate `parse_rate` produces has a
/// power-of-ten denominator, written as a decimal fraction. Other denominators (built by
/// hand) are rounded to nine decimals.
pub(crate) struct RateText(pub Rate);

impl fmt::Display for RateText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Rate::BitsPerSecond(bits) => write!(f, "{bits}bit/s"),
            Rate::UnitsPerSecond { num, den } => {
                let (num, den) = (u128::from(num), u128::from(den.max(1)));
                let (scaled, digits) = match (0..=9u32).find(|&k| 10u128.pow(k) == den) {
                    Some(k) => (num, k),
                    None => ((num * 1_000_000_000 + den / 2) / den, 9),
                };
                let unit = 10u128.pow(digits);
                if digits == 0 {
                    write!(f, "{scaled}/s")
                } else {
                    write!(
                        f,
                        "{}.{:0width$}/s",
                        scaled / unit,
                        scaled % unit,
                        width = digits as usize
                    )
                }
            }
        }
    }
}
