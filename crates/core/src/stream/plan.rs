//! The planner: a stream's whole policy, decided once.
//!
//! Every way to open a stream (the CLI's `penstock stream`, an HTTP body, a control `START`,
//! later RTSP and the C library) ends in [`plan_stream`]: the caller's [`PlanRequest`] (what
//! the user asked for), the [`Facts`] the driver gathered about the opened endpoints (kinds,
//! sizes, O_DIRECT alignment, page-cache residency, peer family, volume layout) and the
//! kernel's [`PathCaps`] go in; one [`StreamPlan`] comes out — data path, O_DIRECT or not,
//! unit and read sizes, zero-copy, disk class, the admission request and the buffers to
//! reserve — or a typed [`PlanError`] *before* anything is admitted or placed. The driver
//! then only carries the plan out; it asks no policy question of its own.
//!
//! Pure: no I/O, no clock. Exhaustively tested below (every request either plans to a plan
//! the executor accepts, or is refused with a reason).

use crate::admission::{DeviceId, DiskDemand, QosClass, ReadGeometry, StreamQos};
use std::sync::Arc;
use std::time::Duration;

use crate::schedule::{
    LatePolicy, PlanError as UnitPlanError, Schedule, ScheduleError, ScheduleFlags, ScheduleLimits,
    ScheduleSpec, UnitPlan, check_plan, parse_kt,
};
use crate::units::{Rate, parse_duration, parse_rate};
use crate::volume::MEMBERS_MAX;
use crate::volume::layout::{member_bytes_sequential, pieces_per_member_max};

use super::{
    CachePolicy, DataPath, Extent, ExtentError, IoKind, PathCaps, PathChoice, PathError,
    choose_path,
};

/// The most bytes one unit may have on any path.
pub const UNIT_BYTES_MAX: u64 = 64 << 20;

/// How far ahead of its deadline a paced stream that already holds a chunk reads the next:
/// one second. A paced stream's chunk lasts as long as its units take to send (a 1 MiB chunk
/// at 48 KB/s: 21 s), so reading ahead by the read depth alone held several pool buffers per
/// stream for tens of seconds while later streams found none (issue 38). Within the depth,
/// a read starts when its first unit is due within this much — time for the disk queue's
/// EDF to serve it.
pub const PACED_READ_AHEAD_NS: u64 = 1_000_000_000;
/// The largest UDP payload (65,535 − 8 − 20).
pub const DATAGRAM_BYTES_MAX: u64 = 65_507;
/// Seven MPEG-TS packets: the default unit of a datagram target, and of a paced stream that
/// names no unit (fits a 1500-byte MTU with IP, UDP and RTP headers).
pub const DATAGRAM_UNIT_BYTES_DEFAULT: u64 = 1316;
/// A bit-rate stream to a byte-stream target (TCP, a pipe, a file) that names no unit gets
/// units at least this far apart (see [`paced_unit_bytes_default`]).
pub const PACED_STREAM_UNIT_PERIOD_MIN_NS: u64 = 1_000_000;
/// The default unit of the sendfile, splice and copy paths (measured: fewer, larger calls move
/// loopback data markedly faster than 1 MiB ones, see bench/results).
pub const UNIT_BYTES_DEFAULT: u64 = 4 << 20;
/// Zero-copy sends pay from this unit size on (smaller ones are slower with SEND_ZC).
pub const ZERO_COPY_UNIT_BYTES_MIN: u64 = 64 << 10;

/// The disk classes of the engine's scheduler: the two built-in ones and any class the
/// configuration names (`[disk.classes.NAME]`, docs/io-scheduler.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskClass {
    /// Real-time: EDF by deadline, a larger DRR quantum, IOPRIO_CLASS_RT where permitted; an
    /// explicit `Rt` is admitted against the calibrated capacity.
    Rt,
    /// Everything else.
    Bulk,
    /// A configured class: a DRR queue of its own with its own quantum, served in arrival
    /// order like bulk and, like bulk, not admitted (its share is its quantum's, not a
    /// guarantee). Only `rt` orders by deadline.
    Named(ClassName),
}

impl DiskClass {
    /// `rt`, `bulk` or a configured class's name (any case for the two built-in ones).
    pub fn parse(s: &str) -> Result<DiskClass, ClassNameError> {
        if s.eq_ignore_ascii_case("rt") {
            Ok(DiskClass::Rt)
        } else if s.eq_ignore_ascii_case("bulk") {
            Ok(DiskClass::Bulk)
        } else {
            ClassName::new(s).map(DiskClass::Named)
        }
    }

    /// The class's name as the configuration and the protocols write it.
    pub fn name(&self) -> &str {
        match self {
            DiskClass::Rt => "rt",
            DiskClass::Bulk => "bulk",
            DiskClass::Named(n) => n.as_str(),
        }
    }
}

impl std::fmt::Display for DiskClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Longest class name.
pub const CLASS_NAME_BYTES_MAX: usize = 32;

/// A configured disk class's name: 1 to [`CLASS_NAME_BYTES_MAX`] of `[A-Za-z0-9_-]`,
/// starting with a letter, never `rt` or `bulk` in any case. Held inline so that a
/// [`DiskClass`] stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClassName {
    len: u8,
    bytes: [u8; CLASS_NAME_BYTES_MAX],
}

/// Why a class name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("class name {0:?}: 1 to 32 of A-Z a-z 0-9 _ -, starting with a letter, not rt or bulk")]
pub struct ClassNameError(pub String);

impl ClassName {
    pub fn new(s: &str) -> Result<ClassName, ClassNameError> {
        let ok = (1..=CLASS_NAME_BYTES_MAX).contains(&s.len())
            && s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            && !s.eq_ignore_ascii_case("rt")
            && !s.eq_ignore_ascii_case("bulk");
        if !ok {
            return Err(ClassNameError(s.chars().take(40).collect()));
        }
        let mut bytes = [0u8; CLASS_NAME_BYTES_MAX];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(ClassName {
            len: s.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII was copied in (checked by `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl std::fmt::Debug for ClassName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// Zero-copy sends (SEND_ZC) on the uring path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// Only where it pays: units of 64 KiB or more to a non-loopback peer (loopback always
    /// copies).
    #[default]
    Auto,
    On,
    Off,
}

/// How the caller asked a stream's units to be timed: the one description every way in
/// (the CLI's flags, a control `RATE`/`SCHEDULE`, an HTTP `limit_rate`, RTSP's media timing,
/// the C library's period, an HLS viewer's bandwidth) fills. The unit, when the caller names
/// one, is the request's `unit_bytes`; [`plan_schedule`] turns a paced ask into the checked
/// [`Schedule`] of the plan, with the unit default, and is the only place that does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Pacing {
    /// As fast as possible.
    #[default]
    Burst,
    /// One unit every `period` (`--period 33.333ms`).
    Periodic { period: Duration },
    /// A frame rate (one unit every 1/rate) or a constant bit rate (`--rate 8Mbit/s`).
    Rate(Rate),
    /// Cues' (k, t): `cycle_units` units due at the start of every cycle of length `cycle`.
    Kt { cycle_units: u64, cycle: Duration },
    /// Cues' (k, t) as the paper defines it: `cycle_units` units, then a pause of `pause`
    /// after the last of them was sent (`pause=K,T`).
    KtPause { cycle_units: u64, pause: Duration },
    /// A unit plan: one deadline and size per unit (playback of a recording, an MPEG-TS
    /// file's PCR, an MP4's decode times: media timing, read by the caller).
    Units(Arc<[UnitPlan]>),
}

impl Pacing {
    /// Parses the pacing flags of `penstock stream` (no flag: burst; more than one: an error).
    /// Parsing only: the planner checks the result.
    pub fn from_flags(flags: &ScheduleFlags<'_>) -> Result<Pacing, ScheduleError> {
        match (flags.period, flags.rate, flags.kt, flags.pause) {
            (None, None, None, None) => Ok(Pacing::Burst),
            (Some(p), None, None, None) => Ok(Pacing::Periodic {
                period: parse_duration(p)?,
            }),
            (None, Some(r), None, None) => Ok(Pacing::Rate(parse_rate(r)?)),
            (None, None, Some(s), None) => {
                let (cycle_units, cycle) = parse_kt(s)?;
                Ok(Pacing::Kt { cycle_units, cycle })
            }
            (None, None, None, Some(s)) => {
                let (cycle_units, pause) = parse_kt(s)?;
                Ok(Pacing::KtPause { cycle_units, pause })
            }
            _ => Err(ScheduleError::ConflictingPacing),
        }
    }

    /// Paced by a schedule or a unit plan (not burst).
    pub fn is_paced(&self) -> bool {
        !matches!(self, Pacing::Burst)
    }
}

/// The schedule a paced request runs on, checked against pool buffers of `buffer_bytes`;
/// `None` for a burst stream and a unit plan. A paced stream that names no unit gets
/// [`paced_unit_bytes_default`] (`datagram`: the target is a UDP socket). The one place a
/// rate, period or (k, t) becomes a [`Schedule`]: [`plan_stream`] and [`admission_request`]
/// call it, and a caller that shows a stream's schedule before it starts (a control
/// `STATE`) asks it the same.
pub fn plan_schedule(
    pacing: &Pacing,
    unit_bytes: Option<u64>,
    datagram: bool,
    buffer_bytes: u64,
) -> Result<Option<Schedule>, PlanError> {
    let unit = |rate: Option<Rate>| {
        unit_bytes.unwrap_or_else(|| match rate {
            Some(r) => paced_unit_bytes_default(r, datagram, buffer_bytes),
            None => DATAGRAM_UNIT_BYTES_DEFAULT,
        })
    };
    let spec = match pacing {
        Pacing::Burst | Pacing::Units(_) => return Ok(None),
        Pacing::Periodic { period } => ScheduleSpec::Periodic {
            period: *period,
            unit_bytes: unit(None),
        },
        Pacing::Rate(rate) => ScheduleSpec::Rate {
            rate: *rate,
            unit_bytes: unit(Some(*rate)),
        },
        Pacing::Kt { cycle_units, cycle } => ScheduleSpec::Kt {
            cycle_units: *cycle_units,
            cycle: *cycle,
            unit_bytes: unit(None),
        },
        Pacing::KtPause { cycle_units, pause } => ScheduleSpec::KtPause {
            cycle_units: *cycle_units,
            pause: *pause,
            unit_bytes: unit(None),
        },
    };
    let schedule = Schedule::new(&spec, &ScheduleLimits::new(buffer_bytes))?;
    Ok((!schedule.is_burst()).then_some(schedule))
}

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    pub path: PathChoice,
    pub cache: CachePolicy,
    pub zero_copy: ZeroCopy,
    /// `None`: rt when paced, else bulk. An explicit `Rt` asks admission control for the
    /// schedule's rate (refused without one) unless `best_effort`.
    pub class: Option<DiskClass>,
    /// With `class: Some(Rt)`: the rt disk queue only, no guarantee (an HTTP location).
    pub best_effort: bool,
    pub pacing: Pacing,
    /// `None`: the path's default (a paced stream's: [`plan_schedule`]'s).
    pub unit_bytes: Option<u64>,
    pub extent: Extent,
    /// Pool buffers an admitted rt stream reserves; `None`: the default.
    pub buffers: Option<u32>,
    /// What a paced stream does with a unit later than its miss threshold
    /// (`crate::schedule::LatePolicy`): send it anyway (default) or skip it.
    pub late: LatePolicy,
    /// Each unit goes out as one RTP packet: a 12-byte header in front of it
    /// (`crate::rtp`). Needs a unit plan (the timestamps come from its deadlines) and a
    /// datagram target.
    pub rtp: bool,
    /// RTP interleaved on an RTSP connection (RFC 2326 §10.12): each packet goes to a stream
    /// socket behind a 4-byte `$ channel length` frame header, written in front of the RTP
    /// header. Needs `rtp` and a stream-socket target.
    pub rtp_interleaved: bool,
}

/// Bytes in front of a unit's payload: the RTP header, and the interleaved frame's 4 bytes.
pub fn rtp_header_bytes(rtp: bool, interleaved: bool) -> u64 {
    match (rtp, interleaved) {
        (false, _) => 0,
        (true, false) => crate::rtp::RTP_HEADER_BYTES as u64,
        (true, true) => crate::rtp::RTP_HEADER_BYTES as u64 + 4,
    }
}

/// What a socket endpoint is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketFacts {
    /// A TCP (or UDP) socket over IP; false for Unix sockets.
    pub ip: bool,
    /// The peer is a loopback address (or a Unix socket).
    pub loopback: bool,
}

/// A volume partition endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeFacts {
    pub size_bytes: u64,
    /// The members' O_DIRECT alignment (1: buffered members).
    pub align_bytes: u64,
    /// The partition's stripe unit (a placed partition's block) and block.
    pub unit_bytes: u64,
    pub block_bytes: u64,
    /// The members it spreads over, in slot order: how many, and each one's device.
    pub width: u8,
    pub member_devices: [u64; MEMBERS_MAX],
}

impl VolumeFacts {
    /// A partition over one member of unknown device, striped in 64 KiB units of 1 MiB
    /// blocks (tests and callers that know only the size).
    pub fn simple(size_bytes: u64, align_bytes: u64) -> VolumeFacts {
        VolumeFacts {
            size_bytes,
            align_bytes,
            unit_bytes: crate::volume::layout::STRIPE_UNIT_BYTES_DEFAULT,
            block_bytes: crate::volume::layout::BLOCK_BYTES_DEFAULT,
            width: 1,
            member_devices: [0; MEMBERS_MAX],
        }
    }
}

/// What the driver found about one opened endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointFacts {
    pub kind: IoKind,
    /// Files and block devices.
    pub size: Option<u64>,
    /// Sockets.
    pub socket: Option<SocketFacts>,
    /// Volume partitions.
    pub volume: Option<VolumeFacts>,
    /// A file source's O_DIRECT alignment when its file system takes O_DIRECT (statx
    /// DIOALIGN, else 4096); `None`: O_DIRECT refused there.
    pub direct_align: Option<u64>,
    /// The device a file's reads land on (a block device's own number, else its file
    /// system's); 0: unknown.
    pub device: u64,
}

impl EndpointFacts {
    /// A thing of `kind` and nothing more known.
    pub fn of(kind: IoKind) -> EndpointFacts {
        EndpointFacts {
            kind,
            size: None,
            socket: None,
            volume: None,
            direct_align: None,
            device: 0,
        }
    }
}

/// What the driver found about a stream's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub source: EndpointFacts,
    pub target: EndpointFacts,
    /// The source's whole range is in the page cache (cachestat); only asked for a file to a
    /// stream socket.
    pub resident: bool,
}

/// The engine's sizes a plan must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    /// Bytes per pool buffer: the largest unit of the uring path.
    pub buffer_bytes: u64,
    /// What an rt stream reserves unless it says.
    pub rt_buffers_default: u32,
    /// The most an rt stream may reserve.
    pub rt_buffers_max: u32,
}

/// The one decision about a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPlan {
    pub path: DataPath,
    /// `[start, end)` of a file source, or `(0, length)` of a stream source with a length.
    pub range: Option<(u64, u64)>,
    pub unit_bytes: u64,
    /// Read the source with O_DIRECT (a descriptor of its own, reopened from the opened one).
    pub direct: bool,
    /// The uring path's read alignment (1: none) and the bytes each read asks for.
    pub align_bytes: u64,
    pub read_bytes: u64,
    pub zero_copy: bool,
    /// The disk scheduler's class is `rt` (EDF, rt I/O priority, timed workers).
    pub rt: bool,
    /// The disk scheduler's class by name: `rt` exactly when [`StreamPlan::rt`].
    pub class: DiskClass,
    /// Reopen a volume source's members buffered (planned units fall anywhere).
    pub buffered_source_volume: bool,
    /// Reopen a volume target's members buffered (the copy path writes unaligned runs).
    pub buffered_target_volume: bool,
    /// What admission control is asked for (rt streams): the rate, and the reads above
    /// (`read_bytes` chunks on the source's devices, [`read_geometry`]).
    pub admission: Option<StreamQos>,
    /// Pool buffers an admitted uring-path stream reserves on its worker.
    pub buffers_reserved: Option<u32>,
    /// A paced stream's late-unit policy (always `Send` for a burst stream).
    pub late: LatePolicy,
    /// Bytes the data path writes in front of each unit (the RTP header), 0 for none.
    pub header_bytes: u64,
    /// When each unit is due: the schedule decided from the request's pacing
    /// ([`plan_schedule`]); `None` for a burst stream and a unit plan.
    pub schedule: Option<Schedule>,
    /// The request's unit plan, when it paced by one.
    pub units: Option<Arc<[UnitPlan]>>,
    /// What the plan chose against the request, for the report.
    pub notes: Vec<String>,
}

/// Why a stream cannot be planned; every variant names what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(transparent)]
    Extent(#[from] ExtentError),
    #[error(transparent)]
    Units(#[from] UnitPlanError),
    #[error("the unit plan holds {plan_bytes} bytes, the extent {extent_bytes:?}")]
    UnitsExtent {
        plan_bytes: u64,
        extent_bytes: Option<u64>,
    },
    #[error("a unit plan is sent on the uring path only, not {path}")]
    UnitsNeedUring { path: DataPath },
    #[error(
        "a paced stream sends unit by unit at deadlines: use the uring or copy path, not {path}"
    )]
    PacedPath { path: DataPath },
    #[error("volume partitions are read and written through io_uring, which is unavailable here")]
    VolumeNeedsUring,
    #[error("the uring path reads files: {source_kind:?} into a volume moves on the copy path")]
    VolumeUringNeedsFile { source_kind: IoKind },
    #[error(
        "volume partitions move on the uring path, or copy from a socket or pipe (got --path {path})"
    )]
    VolumePath { path: DataPath },
    #[error(
        "units sent one by one (datagrams, paced) from a volume need an offset that is a multiple of {align_bytes}"
    )]
    VolumeDatagramOffset { align_bytes: u64 },
    #[error(
        "a paced stream from a file into a volume partition is not supported: write it unpaced, or pace a socket or pipe source"
    )]
    PacedIntoVolume,
    #[error("{bytes} bytes do not fit the target partition ({size_bytes} bytes)")]
    VolumeTooSmall { bytes: u64, size_bytes: u64 },
    #[error("unit of {unit_bytes} bytes is larger than the pool's buffers ({buffer_bytes} bytes)")]
    UnitOverBuffer { unit_bytes: u64, buffer_bytes: u64 },
    #[error("unit of {unit_bytes} bytes is larger than 64 MiB")]
    UnitTooLarge { unit_bytes: u64 },
    #[error("unit of {unit_bytes} bytes does not fit one UDP datagram ({DATAGRAM_BYTES_MAX})")]
    UnitOverDatagram { unit_bytes: u64 },
    #[error("a unit of 0 bytes")]
    ZeroUnit,
    #[error(
        "unit {unit_bytes} and O_DIRECT alignment {align_bytes} need {read_bytes}-byte reads, larger than the pool's buffers"
    )]
    ReadOverBuffer {
        unit_bytes: u64,
        align_bytes: u64,
        read_bytes: u64,
    },
    #[error("--class rt needs a rate or a period: a guarantee is for a known bandwidth")]
    RtNeedsRate,
    #[error(
        "an rt stream reserves 1..={max} pool buffers (client_buffers_max, pool_buffers), not {asked}"
    )]
    RtBuffers { asked: u32, max: u32 },
    #[error(
        "late-unit policy skip needs a paced stream (a rate, period or schedule): a burst stream has no late units"
    )]
    SkipNeedsPacing,
    #[error(
        "late-unit policy skip needs deadlines on a grid: the pause form's next cycle is due a pause after the last send, so no unit of it is ever late (use schedule=K,T)"
    )]
    SkipPauseForm,
    #[error(
        "late-unit policy skip moves past the skipped units' bytes, which needs a file source, not {source_kind:?}"
    )]
    SkipNeedsFile { source_kind: IoKind },
    #[error(
        "RTP needs a unit plan (--timing pcr or tracks): its timestamps are the units' deadlines"
    )]
    RtpNeedsUnitPlan,
    #[error("RTP goes to a datagram target (udp://), not {target_kind:?}")]
    RtpNeedsDatagram { target_kind: IoKind },
    #[error("interleaved RTP goes to the RTSP connection's stream socket, not {target_kind:?}")]
    RtpInterleavedNeedsStream { target_kind: IoKind },
}

/// A schedule's bytes per second (rounded up): what an rt stream reserves.
pub fn schedule_bytes_per_s(s: &Schedule) -> u64 {
    s.bytes_per_s()
}

/// The unit of a paced stream that names none: [`DATAGRAM_UNIT_BYTES_DEFAULT`] for a datagram
/// target and for a frame rate (a unit is a frame); for a bit rate to a byte-stream target,
/// whole multiples of it large enough that units are [`PACED_STREAM_UNIT_PERIOD_MIN_NS`] or
/// more apart, up to the largest multiple that fits a pool buffer of `buffer_bytes`. Seven TS
/// packets a unit at 230 MB/s would ask for a send every 5.7 µs: the rate the stream could
/// keep was set by the per-send cost, not by what was asked.
pub fn paced_unit_bytes_default(
    rate: crate::units::Rate,
    datagram: bool,
    buffer_bytes: u64,
) -> u64 {
    let crate::units::Rate::BitsPerSecond(bits) = rate else {
        return DATAGRAM_UNIT_BYTES_DEFAULT;
    };
    if datagram {
        return DATAGRAM_UNIT_BYTES_DEFAULT;
    }
    let unit = DATAGRAM_UNIT_BYTES_DEFAULT;
    let bytes_per_period =
        u128::from(bits.div_ceil(8)) * u128::from(PACED_STREAM_UNIT_PERIOD_MIN_NS) / 1_000_000_000;
    let want = u64::try_from(bytes_per_period.div_ceil(u128::from(unit)))
        .unwrap_or(u64::MAX)
        .saturating_mul(unit);
    let cap = (buffer_bytes / unit).max(1) * unit;
    want.clamp(unit, cap)
}

/// The default transfer unit of `path` to a `target`: a safe datagram for UDP; for the uring
/// path a whole pool buffer; for the other paths [`UNIT_BYTES_DEFAULT`].
pub fn default_unit_bytes(path: DataPath, target: IoKind, buffer_bytes: u64) -> u64 {
    match (path, target) {
        (_, IoKind::Datagram) => DATAGRAM_UNIT_BYTES_DEFAULT,
        (DataPath::Uring, _) => buffer_bytes,
        _ => UNIT_BYTES_DEFAULT,
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The path of a stream with a volume endpoint: only the uring path splits transfers into
/// per-member I/O, so `auto` means uring and any other fixed path is refused; a socket, pipe
/// or stdin into a partition moves on the copy path (bytes of unknown length in pieces of
/// any size, written through the page cache).
fn volume_path(
    choice: PathChoice,
    facts: &Facts,
    caps: PathCaps,
) -> Option<Result<DataPath, PlanError>> {
    if facts.source.volume.is_none() && facts.target.volume.is_none() {
        return None;
    }
    let source = facts.source.kind;
    Some(match choice {
        PathChoice::Auto | PathChoice::Fixed(DataPath::Copy)
            if facts.target.volume.is_some() && source != IoKind::File =>
        {
            Ok(DataPath::Copy)
        }
        _ if !caps.uring => Err(PlanError::VolumeNeedsUring),
        PathChoice::Fixed(DataPath::Uring) if source != IoKind::File => {
            Err(PlanError::VolumeUringNeedsFile {
                source_kind: source,
            })
        }
        PathChoice::Auto | PathChoice::Fixed(DataPath::Uring) => Ok(DataPath::Uring),
        PathChoice::Fixed(path) => Err(PlanError::VolumePath { path }),
    })
}

/// The bytes each read of the uring path asks for (the executor reads `[start, end)` in
/// chunks of this size, the last one shorter: [`chunk_reads`]). Units sent one by one (a
/// datagram target, a paced stream) are read a whole number of them at a time, as many as
/// fill a pool buffer, so that none straddles two buffers; other reads are one unit rounded
/// up to `len_align`. `None`: no read fits a buffer.
/// Whether O_DIRECT reads of planned units fit a pool buffer: the largest unit (its header
/// included) with the slack the driver's aligned reads need — up to one block before the
/// group's first unit, one after its last, and the headers' room rounded up to a block.
pub fn planned_direct_fits(unit_bytes: u64, align_bytes: u64, limits: &PlanLimits) -> bool {
    unit_bytes.saturating_add(3 * align_bytes) <= limits.buffer_bytes
}

/// The bytes a buffer of planned units may hold (payloads and headers) when its read is
/// O_DIRECT with `align_bytes`: the buffer less the slack of [`planned_direct_fits`].
pub fn planned_direct_room(buffer_bytes: u64, align_bytes: u64) -> u64 {
    buffer_bytes.saturating_sub(3 * align_bytes)
}

pub fn read_bytes_for(
    unit_bytes: u64,
    align_bytes: u64,
    len_align: u64,
    by_unit: bool,
    buffer_bytes: u64,
) -> Option<u64> {
    let r = if by_unit {
        let l = unit_bytes / gcd(unit_bytes, align_bytes) * align_bytes; // lcm
        if l > buffer_bytes {
            return None;
        }
        l * (buffer_bytes / l)
    } else {
        unit_bytes
            .div_ceil(len_align)
            .saturating_mul(len_align)
            .min(buffer_bytes / len_align * len_align)
    };
    (r > 0).then_some(r)
}

/// The executor's reads of a source range `[start, end)` read in chunks of `read_bytes` with
/// alignment `align` (the uring path's loop: from `start` rounded down to `align`, up to `end`
/// rounded up), as `(offset, len)`.
pub fn chunk_reads(
    start: u64,
    end: u64,
    align: u64,
    read_bytes: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let align = align.max(1);
    let read_end = end.div_ceil(align) * align;
    let mut next = start / align * align;
    std::iter::from_fn(move || {
        if next >= end || read_bytes == 0 {
            return None;
        }
        let len = next_read_len(next, read_end, read_bytes);
        let at = next;
        next += len;
        Some((at, len))
    })
}

/// The length of the executor's next read at `next` (see [`chunk_reads`]).
pub fn next_read_len(next: u64, read_end: u64, read_bytes: u64) -> u64 {
    (read_end - next).min(read_bytes)
}

/// What the executor's chunks of `read_bytes` cost each device: one request on a file's
/// device; on a volume, each member's pieces at most ([`pieces_per_member_max`]) and its
/// bytes as a sequential reader's long-run share with the excess of any run of chunks over
/// it ([`member_bytes_sequential`]: a member gets a quarter of a 4-wide stripe's bytes, give
/// or take one unit, however one chunk falls); nothing for a source that is not on a disk.
pub fn read_geometry(read_bytes: u64, source: &EndpointFacts) -> ReadGeometry {
    if let Some(v) = &source.volume {
        let width = usize::from(v.width.max(1));
        let (requests, peak_bytes) =
            pieces_per_member_max(read_bytes, v.unit_bytes, v.block_bytes, width);
        let (mean_bytes, excess_bytes) = member_bytes_sequential(read_bytes, v.unit_bytes, width);
        let disks: Vec<DiskDemand> = v.member_devices[..width]
            .iter()
            .map(|d| DiskDemand {
                device: DeviceId(*d),
                requests,
                bytes: mean_bytes,
                peak_bytes,
                excess_bytes,
            })
            .collect();
        return ReadGeometry::spread(read_bytes, &disks);
    }
    match source.kind {
        IoKind::File => ReadGeometry::single(read_bytes, DeviceId(source.device)),
        _ => ReadGeometry::spread(read_bytes, &[]),
    }
}

/// What a stream asks of admission control: a guarantee (`class: Some(Rt)`, not best
/// effort) is for a known bandwidth, the schedule's. Independent of the endpoints, so that a
/// server can admit a stream before it opens them (`Engine::admit`): the reads are charged
/// as the uring path reads a paced file to a datagram target, unaligned, on the default
/// device; [`plan_stream`] asks for the reads it planned on the real devices (the engine
/// replaces the one with the other at the start). `datagram`: the target is a UDP socket
/// (known from its name before it is opened), which decides a paced stream's default unit.
pub fn admission_request(
    req: &PlanRequest,
    datagram: bool,
    limits: &PlanLimits,
) -> Result<Option<StreamQos>, PlanError> {
    check_request(req)?;
    let schedule = plan_schedule(&req.pacing, req.unit_bytes, datagram, limits.buffer_bytes)?;
    admission_of(req, schedule.as_ref(), limits)
}

/// The rules of a request that hold whatever its endpoints: checked by [`plan_stream`] and,
/// before anything is opened, by [`admission_request`].
fn check_request(req: &PlanRequest) -> Result<(), PlanError> {
    if req.late == LatePolicy::Skip && !req.pacing.is_paced() {
        return Err(PlanError::SkipNeedsPacing);
    }
    if req.late == LatePolicy::Skip && matches!(req.pacing, Pacing::KtPause { .. }) {
        return Err(PlanError::SkipPauseForm);
    }
    Ok(())
}

fn admission_of(
    req: &PlanRequest,
    schedule: Option<&Schedule>,
    limits: &PlanLimits,
) -> Result<Option<StreamQos>, PlanError> {
    if req.class != Some(DiskClass::Rt) || req.best_effort {
        return Ok(None);
    }
    let s = match (schedule, &req.pacing) {
        (Some(s), _) => s,
        // A unit plan (a TS file's PCR, a recording's tracks): its mean rate over the whole
        // plan, headers (RTP) included, and its largest unit.
        (None, Pacing::Units(u)) => {
            let buffers = req.buffers.unwrap_or(limits.rt_buffers_default);
            let header = rtp_header_bytes(req.rtp, req.rtp_interleaved);
            return units_qos(u, header, buffers, limits.buffer_bytes)
                .map(Some)
                .ok_or(PlanError::RtNeedsRate);
        }
        _ => return Err(PlanError::RtNeedsRate),
    };
    let unit_bytes = s.unit_bytes();
    let chunk = read_bytes_for(unit_bytes, 1, 1, true, limits.buffer_bytes).unwrap_or(unit_bytes);
    Ok(Some(StreamQos {
        class: QosClass::Rt,
        rate_bytes_per_s: schedule_bytes_per_s(s),
        unit_bytes,
        buffers: req.buffers.unwrap_or(limits.rt_buffers_default),
        reads: ReadGeometry::single(chunk, DeviceId::UNKNOWN),
        datagrams: true,
    }))
}

/// The admission request of a unit plan: its bytes (with each unit's RTP header when `rtp`)
/// over its length in time, rounded up; per disk request, the whole units one pool buffer
/// holds (the uring path reads a buffer's worth of units at once: `buffer_bytes`, at least
/// the largest unit, at most the plan). `None` for a plan with no length in time (one unit,
/// or all due at once), which has no rate to guarantee.
fn units_qos(
    units: &[UnitPlan],
    header: u64,
    buffers: u32,
    buffer_bytes: u64,
) -> Option<StreamQos> {
    let span_ns = units
        .last()?
        .offset_ns
        .checked_sub(units.first()?.offset_ns)?;
    if span_ns == 0 {
        return None;
    }
    let bytes: u128 = units
        .iter()
        .map(|u| u128::from(u64::from(u.size_bytes) + header))
        .sum();
    let rate = (bytes * 1_000_000_000).div_ceil(u128::from(span_ns));
    let largest = units
        .iter()
        .map(|u| u64::from(u.size_bytes) + header)
        .max()?;
    let total = u64::try_from(bytes).unwrap_or(u64::MAX);
    let per_read = (buffer_bytes / largest * largest).clamp(largest, total.max(largest));
    Some(StreamQos {
        class: QosClass::Rt,
        rate_bytes_per_s: u64::try_from(rate).unwrap_or(u64::MAX),
        unit_bytes: largest,
        buffers,
        reads: ReadGeometry::single(per_read, DeviceId::UNKNOWN),
        datagrams: true,
    })
}

/// Plans a stream (see the module doc).
pub fn plan_stream(
    req: &PlanRequest,
    facts: &Facts,
    caps: PathCaps,
    limits: &PlanLimits,
) -> Result<StreamPlan, PlanError> {
    let (src, dst) = (&facts.source, &facts.target);
    let datagram = dst.kind == IoKind::Datagram;
    check_request(req)?;
    let planned = plan_schedule(&req.pacing, req.unit_bytes, datagram, limits.buffer_bytes)?;
    let schedule = planned.as_ref();
    let units = match &req.pacing {
        Pacing::Units(u) => Some(&u[..]),
        _ => None,
    };
    let mut notes = Vec::new();

    // The path.
    let mut choice = req.path;
    if choice == PathChoice::Auto {
        if units.is_some() {
            // Planned units of varying size are read whole into pool buffers.
            choice = PathChoice::Fixed(DataPath::Uring);
        } else if schedule.is_some() {
            // Paced units of a file are read ahead into the pool and sent at their deadline;
            // without io_uring, or from a socket or pipe, read then write at the deadline.
            choice = PathChoice::Fixed(if caps.uring && src.kind == IoKind::File {
                DataPath::Uring
            } else {
                DataPath::Copy
            });
        }
    }
    let path = match volume_path(choice, facts, caps) {
        Some(Ok(path)) if req.cache == CachePolicy::Bypass && path != DataPath::Uring => {
            return Err(PathError::BypassNeedsUring { path }.into());
        }
        Some(r) => r?,
        None => {
            let resident = choice == PathChoice::Auto
                && src.kind == IoKind::File
                && dst.kind == IoKind::StreamSocket
                && req.cache == CachePolicy::Keep
                && req.class != Some(DiskClass::Rt)
                && facts.resident;
            choose_path(choice, src.kind, dst.kind, req.cache, caps, resident)?
        }
    };
    if schedule.is_some() && !matches!(path, DataPath::Uring | DataPath::Copy) {
        return Err(PlanError::PacedPath { path });
    }
    if units.is_some() && path != DataPath::Uring {
        return Err(PlanError::UnitsNeedUring { path });
    }
    if req.late == LatePolicy::Skip {
        // (A burst stream was refused by `check_request`.) A socket or pipe cannot move past bytes without reading them; a late unit of a
        // live source is not the source's to drop.
        if src.kind != IoKind::File {
            return Err(PlanError::SkipNeedsFile {
                source_kind: src.kind,
            });
        }
    }

    // The extent.
    let range = match (src.kind, src.size) {
        (IoKind::File, Some(size)) => Some(req.extent.resolve_in_file(size)?),
        _ if req.extent.offset != 0 => return Err(ExtentError::OffsetOnStream(src.kind).into()),
        // A stream has no size: a length bounds how much of it is read.
        _ => req.extent.length.map(|length| (0, length)),
    };

    // The unit.
    let header_bytes = if req.rtp {
        if units.is_none() {
            return Err(PlanError::RtpNeedsUnitPlan);
        }
        if req.rtp_interleaved {
            if dst.kind != IoKind::StreamSocket {
                return Err(PlanError::RtpInterleavedNeedsStream {
                    target_kind: dst.kind,
                });
            }
        } else if dst.kind != IoKind::Datagram {
            return Err(PlanError::RtpNeedsDatagram {
                target_kind: dst.kind,
            });
        }
        rtp_header_bytes(true, req.rtp_interleaved)
    } else {
        0
    };
    let unit_bytes = if let Some(units) = units {
        // A unit and its header share one pool buffer and one datagram.
        let room = limits.buffer_bytes.saturating_sub(header_bytes);
        let (total, largest) = check_plan(units, room)?;
        let extent_bytes = range.map(|(s, e)| e - s);
        if extent_bytes != Some(total) {
            return Err(PlanError::UnitsExtent {
                plan_bytes: total,
                extent_bytes,
            });
        }
        u64::from(largest) + header_bytes
    } else if let Some(s) = schedule {
        s.unit_bytes()
    } else {
        match req.unit_bytes {
            Some(0) => return Err(PlanError::ZeroUnit),
            Some(u) => u,
            None => default_unit_bytes(path, dst.kind, limits.buffer_bytes),
        }
    };
    if unit_bytes == 0 {
        return Err(PlanError::ZeroUnit);
    }
    if path == DataPath::Uring && unit_bytes > limits.buffer_bytes {
        return Err(PlanError::UnitOverBuffer {
            unit_bytes,
            buffer_bytes: limits.buffer_bytes,
        });
    }
    if unit_bytes > UNIT_BYTES_MAX {
        return Err(PlanError::UnitTooLarge { unit_bytes });
    }
    if dst.kind == IoKind::Datagram && unit_bytes > DATAGRAM_BYTES_MAX {
        return Err(PlanError::UnitOverDatagram { unit_bytes });
    }

    let admission = admission_of(req, schedule, limits)?;
    let buffers_reserved = match admission {
        Some(q) if path == DataPath::Uring => {
            if q.buffers == 0 || q.buffers > limits.rt_buffers_max {
                return Err(PlanError::RtBuffers {
                    asked: q.buffers,
                    max: limits.rt_buffers_max,
                });
            }
            Some(q.buffers)
        }
        _ => None,
    };

    // O_DIRECT and the uring path's reads.
    let mut direct = false;
    let mut align_bytes = 1;
    let mut read_bytes = unit_bytes;
    let buffered_source_volume = path == DataPath::Uring && units.is_some() && src.volume.is_some();
    if path == DataPath::Uring {
        let (start, end) = range.unwrap_or((0, 0));
        let datagram = dst.kind == IoKind::Datagram;
        // Units sent one by one are read whole, a buffer's worth at a time (the uring path
        // sends by unit for a datagram target or a paced stream).
        let by_unit = datagram || schedule.is_some();
        if req.cache == CachePolicy::Bypass && src.volume.is_none() {
            match src.direct_align {
                None => notes.push(
                    "O_DIRECT refused by this file system: reading through the page cache".into(),
                ),
                // Planned units (RTSP, recorded tracks) are read in groups of whole units:
                // each read covers the aligned blocks around its group, into an aligned
                // place of the buffer (`planned_direct_fits`), whatever the units' offsets.
                Some(a) if units.is_some() && !planned_direct_fits(unit_bytes, a, limits) => {
                    notes.push(format!(
                        "O_DIRECT reads of a {unit_bytes}-byte planned unit and its aligned blocks would not fit a pool buffer: reading through the page cache"
                    ))
                }
                Some(a) => {
                    direct = true;
                    align_bytes = a.max(1);
                }
            }
        }
        if let Some(v) = src.volume {
            // Member descriptors are O_DIRECT where the file system allows (whole blocks
            // only); buffered ones for planned units (any range).
            align_bytes = if buffered_source_volume {
                1
            } else {
                v.align_bytes.max(1)
            };
            if by_unit && !start.is_multiple_of(align_bytes) {
                return Err(PlanError::VolumeDatagramOffset { align_bytes });
            }
        } else if direct && units.is_some() {
            // Planned reads align themselves (above): no condition on the offset.
        } else if direct && by_unit && !start.is_multiple_of(align_bytes) {
            // Unit boundaries would not fall on aligned reads: read through the cache.
            direct = false;
            align_bytes = 1;
            notes.push(
                "O_DIRECT needs an aligned offset for units sent one by one: reading through the page cache"
                    .into(),
            );
        } else if direct
            && by_unit
            && unit_bytes / gcd(unit_bytes, align_bytes) * align_bytes > limits.buffer_bytes
        {
            // No whole number of units ends on an aligned boundary within a buffer.
            direct = false;
            align_bytes = 1;
            notes.push(format!(
                "O_DIRECT reads of whole {unit_bytes}-byte units would not fit a pool buffer: reading through the page cache"
            ));
        }
        let mut len_align = align_bytes;
        if let Some(v) = dst.volume {
            if schedule.is_some() || units.is_some() {
                // Whole chunks go to the members at once: no unit would wait for its deadline.
                return Err(PlanError::PacedIntoVolume);
            }
            if end - start > v.size_bytes {
                return Err(PlanError::VolumeTooSmall {
                    bytes: end - start,
                    size_bytes: v.size_bytes,
                });
            }
            if direct && !start.is_multiple_of(align_bytes) {
                direct = false;
                align_bytes = 1;
                notes.push(
                    "O_DIRECT source reads need an aligned offset to fill a volume: reading through the page cache"
                        .into(),
                );
            }
            // Every chunk starts at a partition block boundary: its writes stay aligned.
            len_align = align_bytes.max(v.align_bytes.max(1));
        }
        let read_bytes_for = |unit_bytes, align_bytes, len_align, by_unit, buffer_bytes| {
            if direct && units.is_some() {
                // Whole units per buffer, the read's blocks around them (the driver's
                // `units_fitting` sizes each read); at most the buffer's aligned bytes.
                Some(buffer_bytes / align_bytes * align_bytes).filter(|&r| r > 0)
            } else {
                read_bytes_for(unit_bytes, align_bytes, len_align, by_unit, buffer_bytes)
            }
        };
        let Some(read_bytes_planned) = read_bytes_for(
            unit_bytes,
            align_bytes,
            len_align,
            by_unit,
            limits.buffer_bytes,
        ) else {
            return Err(PlanError::ReadOverBuffer {
                unit_bytes,
                align_bytes: if by_unit { align_bytes } else { len_align },
                read_bytes: if by_unit {
                    unit_bytes / gcd(unit_bytes, align_bytes) * align_bytes
                } else {
                    len_align
                },
            });
        };
        read_bytes = read_bytes_planned;
    }

    // Zero-copy sends (the uring path's only) exist for TCP and UDP. `auto` picks them for
    // TCP only: a datagram is one send, and SEND_ZC's second completion per datagram costs
    // more than the copy of a small one; `on` asks for them on UDP too.
    let ip_target = matches!(dst.kind, IoKind::StreamSocket | IoKind::Datagram)
        && dst.socket.is_some_and(|s| s.ip);
    let zero_copy = path == DataPath::Uring
        && match req.zero_copy {
            ZeroCopy::On if path == DataPath::Uring && !ip_target => {
                notes.push("zero-copy sends need a TCP or UDP target: sending with copies".into());
                false
            }
            ZeroCopy::On => true,
            ZeroCopy::Off => false,
            ZeroCopy::Auto => {
                dst.kind == IoKind::StreamSocket
                    && unit_bytes >= ZERO_COPY_UNIT_BYTES_MIN
                    && dst.socket.is_some_and(|s| !s.loopback)
            }
        };

    // The class: as asked, else rt for a paced stream and bulk for a burst one.
    let class = req
        .class
        .unwrap_or(if schedule.is_some() || units.is_some() {
            DiskClass::Rt
        } else {
            DiskClass::Bulk
        });

    // What admission is charged: the reads just planned, on the source's devices.
    let admission = admission.map(|q| StreamQos {
        reads: read_geometry(read_bytes, src),
        datagrams: dst.kind == IoKind::Datagram,
        ..q
    });

    Ok(StreamPlan {
        path,
        range,
        unit_bytes,
        direct,
        align_bytes,
        read_bytes,
        zero_copy,
        rt: class == DiskClass::Rt,
        class,
        buffered_source_volume,
        buffered_target_volume: path == DataPath::Copy && dst.volume.is_some(),
        admission,
        buffers_reserved,
        late: req.late,
        header_bytes,
        schedule: planned,
        units: match &req.pacing {
            Pacing::Units(u) => Some(u.clone()),
            _ => None,
        },
        notes,
    })
}

#[cfg(test)]
mod tests;
