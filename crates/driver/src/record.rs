//! Recording a datagram stream with index tracks (Clockwise §3.1): `penstock record SRC DST`.
//!
//! One thread per recording runs this loop:
//!
//! 1. wait (poll, at most [`POLL_MAX`]) for the socket, then receive a **batch** of datagrams
//!    with one recvmmsg(2) into fixed slots ([`RecvBatch`]), each with its kernel receive time
//!    (SO_TIMESTAMPNS) and the socket's drop counter (SO_RXQ_OVFL);
//! 2. append the batch's datagrams to the media with **one vectored write** (pwritev) whose
//!    iovecs point at the slots: stored whole and consecutively, never copied into a staging
//!    block;
//! 3. only then build the tracks' records for the datagrams the media write took
//!    ([`TracksWriter`], [`FrameDetector`]) and append them to `DST.time`, `DST.packet` and
//!    `DST.frame`, so a track never describes media that was not written first;
//! 4. every `sync_every`, hand a **sync point** (the lengths written so far) to a sync thread,
//!    which fdatasyncs the media, then the three tracks, and reports the point durable; the
//!    receive loop never waits for a disk flush.
//!
//! Stopping (the `stop` flag: SIGINT/SIGTERM in the binary, or `duration`) writes what was
//! received, waits for the sync thread and makes everything durable in the same order.
//! Running out of space (ENOSPC, or EFBIG from RLIMIT_FSIZE) stops the recording cleanly: the
//! files are cut back to the longest prefix the tracks and media agree on (core's
//! [`check`](penstock_core::track::check)), synced, and the report says how much was kept.
//!
//! Reading a recording back (decoding and checking its tracks): `record/load.rs`.
//!
//! Limits (checked at start): a slot holds at most 65536 bytes, a batch at most 1024 slots
//! (IOV_MAX bounds one pwritev). A datagram longer than its slot is counted as truncated and
//! not recorded.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, channel, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use penstock_core::time::Instant;
use penstock_core::track::format::{FLAG_KERNEL_TIMESTAMPS, HEADER_BYTES, RECORD_BYTES};
use penstock_core::track::segments::{KeptSegment, SegmentName, SegmentPolicy};
use penstock_core::track::{
    CheckReport, FrameDetector, FrameRecord, FrameRule, PacketRecord, TimeRecord, TrackBytes,
    TrackHeader, TrackKind, TracksWriter, check, decode,
};
use penstock_uring::sys::{RecvBatch, set_socket_int};
use rustix::event::{PollFd, PollFlags};

use crate::clock;
use crate::volume::PartitionIo;

mod load;
pub use load::{
    LoadError, LoadedRecording, load_recording, load_tracks, load_tracks_with, media_path,
};

/// The longest the loop waits for a datagram before it looks at the stop flag, the duration
/// and the sync thread again.
pub const POLL_MAX: Duration = Duration::from_millis(50);
/// Batches received per loop turn at most before the stop flag and syncs are looked at.
const BATCHES_PER_TURN: usize = 16;
/// Largest slot (datagram) and batch accepted.
pub const DATAGRAM_BYTES_MAX: usize = 65536;
pub const BATCH_MAX: usize = 1024;
/// Track records read back at most when cutting a recording after ENOSPC (24 bytes each).
const RECORDS_MAX: u64 = 1 << 28;

/// How the frame track decides what begins an independent frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameChoice {
    /// From the first datagram: MPEG-TS, RTP or every packet ([`FrameRule::detect`]).
    Auto,
    Fixed(FrameRule),
}

/// A recording's limits and policy.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    /// Bytes of a receive slot: the largest datagram recorded whole (1..=65536).
    pub datagram_bytes_max: usize,
    /// Datagrams per recvmmsg and per pwritev (1..=1024).
    pub batch_max: usize,
    /// SO_RCVBUF asked for (SO_RCVBUFFORCE when permitted): what absorbs a stall of the loop.
    pub rcvbuf_bytes: usize,
    /// Make data and tracks durable this often; `None`: only when the recording stops.
    pub sync_every: Option<Duration>,
    /// Stop after this long; `None`: only on `stop`.
    pub duration: Option<Duration>,
    pub frames: FrameChoice,
    /// Use the kernel's receive times (SO_TIMESTAMPNS) rather than the loop's clock.
    pub kernel_timestamps: bool,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            datagram_bytes_max: 9216,
            batch_max: 64,
            rcvbuf_bytes: 32 << 20,
            sync_every: Some(Duration::from_secs(1)),
            duration: None,
            frames: FrameChoice::Auto,
            kernel_timestamps: true,
        }
    }
}

/// Lengths of the four files at one instant: what a sync makes durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncPoint {
    /// Which file of a segmented recording (0 the first this run opened; always 0 for a
    /// single file): the lengths are that file's.
    pub segment: u64,
    pub packets: u64,
    pub media_bytes: u64,
    pub time_bytes: u64,
    pub packet_bytes: u64,
    pub frame_bytes: u64,
}

/// Why a recording stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The caller's stop flag (a signal).
    Stopped,
    /// `duration` elapsed.
    Duration,
    /// The destination ran out of space (ENOSPC) or hit the file size limit (EFBIG).
    NoSpace { errno: i32 },
}

/// How a recording ended.
#[derive(Debug, Clone)]
pub struct RecordReport {
    pub cause: StopCause,
    /// Packets, media bytes and frame starts kept (after a cut, what survived it).
    pub packets: u64,
    pub media_bytes: u64,
    pub frames: u64,
    /// Datagrams received but not recorded: longer than a slot, or empty.
    pub truncated: u64,
    pub empty: u64,
    /// Datagrams the socket dropped (SO_RXQ_OVFL); `None` when the kernel refused the option.
    pub socket_drops: Option<u64>,
    pub frame_rule: FrameRule,
    /// Receive times are the kernel's (SO_TIMESTAMPNS).
    pub kernel_timestamps: bool,
    /// The receive buffer the kernel granted.
    pub rcvbuf_bytes: usize,
    /// Syncs completed, and the last durable point.
    pub syncs: u64,
    pub synced: SyncPoint,
    /// Largest batch received by one recvmmsg.
    pub batch_largest: usize,
    pub elapsed: Duration,
    /// After a cut (no space): the check of what was kept.
    pub kept: Option<CheckReport>,
}

/// Why a recording failed (nothing of it is usable, or an unexpected I/O error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("invalid recording configuration: {0}")]
    Config(String),
    #[error("{path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{op} failed after {packets} packets: {source}")]
    Io {
        op: &'static str,
        packets: u64,
        source: io::Error,
    },
}

/// The track file of kind `kind` beside the media file `media`: `REC.time`, `REC.packet`,
/// `REC.frame`.
pub fn track_path(media: &Path, kind: TrackKind) -> PathBuf {
    let mut s = media.as_os_str().to_os_string();
    s.push(kind.file_suffix());
    PathBuf::from(s)
}

const KINDS: [TrackKind; 3] = [TrackKind::Time, TrackKind::Packet, TrackKind::Frame];

/// Where a recording goes.
#[derive(Debug)]
pub enum RecordDst {
    /// A media file, its tracks beside it (`FILE.time`, …).
    File(PathBuf),
    /// A volume partition (held open, exclusively, by the caller) and the prefix of the track
    /// files (`PREFIX.time`, …): the tracks stay ordinary files that tools can read. The
    /// partition's size bounds the recording; the tracks say where the media ends.
    Partition {
        io: Box<PartitionIo>,
        tracks: PathBuf,
    },
    /// A directory of segments (docs/recording.md "Segments and retention"): a new file at the
    /// first key frame past each segment's end, named by its start time, each with its
    /// tracks; the oldest deleted as the policy says.
    Segments(SegmentsDst),
}

/// Where and how a segmented recording goes.
#[derive(Debug)]
pub struct SegmentsDst {
    /// The directory of the segments (created if missing).
    pub dir: PathBuf,
    pub policy: SegmentPolicy,
    /// Retention is checked at each rotation and this often besides (`keep` expires segments
    /// between rotations).
    pub retention_every: Duration,
    /// What the recording keeps, for metrics and `STATE`.
    pub stats: Arc<RecordStats>,
}

/// A segmented recording's figures, updated by its thread (read by metrics and `STATE`).
#[derive(Debug, Default)]
pub struct RecordStats {
    /// Bytes of the segments kept before the open one (media and tracks), at the last
    /// retention check.
    pub closed_bytes: AtomicU64,
    /// Bytes of the open segment (media and tracks) after its last write.
    pub open_bytes: AtomicU64,
    /// Segments kept, the open one included.
    pub segments: AtomicU64,
    /// Segments deleted by retention, and their bytes.
    pub deletions: AtomicU64,
    pub deleted_bytes: AtomicU64,
    /// The oldest kept segment's start, seconds since the Unix epoch (0: none yet).
    pub oldest_unix_s: AtomicU64,
    /// Deletions that failed (the file stays; counted, logged once per check).
    pub deletion_errors: AtomicU64,
    /// The segment being written: its number in this run ([`SyncPoint::segment`]) and path.
    pub current: std::sync::Mutex<Option<(u64, PathBuf)>>,
}

impl RecordStats {
    /// The path of segment `n` of this run, while it is the one being written.
    pub fn current_path(&self, n: u64) -> Option<PathBuf> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|(m, _)| *m == n)
            .map(|(_, p)| p.clone())
    }

    /// Bytes on disk: the kept segments and the open one.
    pub fn bytes(&self) -> u64 {
        self.closed_bytes.load(Ordering::Acquire) + self.open_bytes.load(Ordering::Acquire)
    }

    fn note_open(&self, bytes: u64) {
        self.open_bytes.store(bytes, Ordering::Release);
    }
}

impl RecordDst {
    /// The path the track files are named after.
    pub fn tracks_prefix(&self) -> &Path {
        match self {
            RecordDst::File(p) => p,
            RecordDst::Partition { tracks, .. } => tracks,
            RecordDst::Segments(s) => &s.dir,
        }
    }
}

/// The media: a file, or a partition's members reopened buffered.
#[derive(Clone)]
enum Media {
    File(Arc<File>),
    Partition(Arc<PartitionIo>),
}

impl Media {
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> (u64, Option<io::Error>) {
        match self {
            Media::File(f) => {
                let mut slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
                pwritev_all(f.as_fd(), &mut slices, offset)
            }
            Media::Partition(p) => p.write_vectored_at(bufs, offset),
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        match self {
            Media::File(f) => rustix::fs::fdatasync(f.as_fd()).map_err(Into::into),
            // Synced, then the size that covers what was synced is committed.
            Media::Partition(p) => p.commit(),
        }
    }

    /// The media's length: a file's, or the partition's size (the tracks end the recording).
    fn len(&self) -> io::Result<u64> {
        match self {
            Media::File(f) => Ok(f.metadata()?.len()),
            Media::Partition(p) => Ok(p.size_bytes.max(p.written_end())),
        }
    }

    /// Cuts a file's media to `len`; a partition keeps its size (its tail is not indexed).
    fn cut(&self, len: u64) -> io::Result<()> {
        match self {
            Media::File(f) => f.set_len(len),
            Media::Partition(_) => Ok(()),
        }
    }
}

/// The four files of a recording and how much of each was written.
struct Files {
    media: Media,
    tracks: [Arc<File>; 3],
    media_len: u64,
    track_len: [u64; 3],
    /// The tracks' header time: their records' times count from it.
    start_wall_ns: u64,
}

impl Files {
    fn bytes(&self) -> u64 {
        self.media_len + self.track_len.iter().sum::<u64>()
    }

    fn point(&self, packets: u64) -> SyncPoint {
        SyncPoint {
            segment: 0,
            packets,
            media_bytes: self.media_len,
            time_bytes: self.track_len[0],
            packet_bytes: self.track_len[1],
            frame_bytes: self.track_len[2],
        }
    }

    fn all(&self) -> (Media, [Arc<File>; 3]) {
        (self.media.clone(), self.tracks.clone())
    }
}

/// Creates a recording's file for reading and writing: truncating one that exists, or
/// (`exclusive`) failing with EEXIST.
fn create(path: &Path, exclusive: bool) -> Result<Arc<File>, RecordError> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true);
    if exclusive {
        o.create_new(true);
    } else {
        o.create(true).truncate(true);
    }
    o.open(path)
        .map(Arc::new)
        .map_err(|source| RecordError::Open {
            path: path.to_path_buf(),
            source,
        })
}

fn write_headers(
    tracks: &[Arc<File>; 3],
    start_wall_ns: u64,
    rule: FrameRule,
    flags: u32,
) -> io::Result<()> {
    for (f, kind) in tracks.iter().zip(KINDS) {
        let h = TrackHeader {
            kind,
            start_wall_ns,
            frame_rule: rule,
            flags,
        }
        .encode();
        if let (_, Some(e)) = pwrite_all(f, &h, 0) {
            return Err(e);
        }
    }
    Ok(())
}

/// Creates the tracks beside `media` (named after `prefix`), makes the new names durable
/// (their directories fsynced once, before any sync point is reported: a sync point's
/// fdatasyncs make the files' bytes durable, not their names) and writes the headers.
fn open_files(
    media: Media,
    media_path: Option<&Path>,
    prefix: &Path,
    start_wall_ns: u64,
    rule: FrameRule,
    flags: u32,
) -> Result<Files, RecordError> {
    let tracks = [
        create(&track_path(prefix, TrackKind::Time), false)?,
        create(&track_path(prefix, TrackKind::Packet), false)?,
        create(&track_path(prefix, TrackKind::Frame), false)?,
    ];
    let mut dirs: Vec<PathBuf> = Vec::new();
    for p in media_path
        .map(Path::to_path_buf)
        .into_iter()
        .chain([track_path(prefix, TrackKind::Time)])
    {
        let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
        if !dirs.contains(&dir) {
            crate::sys::sync_parent_dir(&p).map_err(|source| RecordError::Open {
                path: dir.clone(),
                source,
            })?;
            dirs.push(dir);
        }
    }
    write_headers(&tracks, start_wall_ns, rule, flags).map_err(|e| RecordError::Io {
        op: "writing the track headers",
        packets: 0,
        source: e,
    })?;
    Ok(Files {
        media,
        tracks,
        media_len: 0,
        track_len: [HEADER_BYTES as u64; 3],
        start_wall_ns,
    })
}

/// Segment files tried at most for one start second (`_1` … `_999`) before giving up.
const SUFFIXES_MAX: u32 = 1000;
/// Segments listed at most in one retention check (beyond, the newest are not looked at:
/// the oldest are what retention deletes).
const SEGMENTS_LISTED_MAX: usize = 1 << 20;

/// A segmented recording's files: naming the next, and retention.
struct Segmenter {
    dir: PathBuf,
    policy: SegmentPolicy,
    retention_every: Duration,
    stats: Arc<RecordStats>,
    /// Files opened so far (the open one is number `opened - 1`).
    opened: u64,
    current: Option<(SegmentName, PathBuf)>,
    /// Media bytes of the segments closed this run (for the report).
    closed_media_bytes: u64,
    /// A retention failure already logged since the last check that deleted all it had to.
    error_logged: bool,
}

impl Segmenter {
    fn new(d: SegmentsDst) -> Segmenter {
        Segmenter {
            dir: d.dir,
            policy: d.policy,
            retention_every: d.retention_every,
            stats: d.stats,
            opened: 0,
            current: None,
            closed_media_bytes: 0,
            error_logged: false,
        }
    }

    fn current_path(&self) -> &Path {
        self.current.as_ref().map_or(&self.dir, |(_, p)| p)
    }

    /// Creates the next segment, starting at `wall_ns`: named by its start second, with the
    /// first free suffix when a file of that name exists (never overwritten).
    fn open_next(
        &mut self,
        wall_ns: u64,
        rule: FrameRule,
        flags: u32,
    ) -> Result<Files, RecordError> {
        let mut name = SegmentName::at(wall_ns);
        if let Some((last, _)) = &self.current
            && last.start_unix_s == name.start_unix_s
        {
            name.suffix = last.suffix + 1;
        }
        loop {
            let path = self.dir.join(format!("{}.ts", name.stem()));
            match create(&path, true) {
                Ok(f) => {
                    let files =
                        open_files(Media::File(f), Some(&path), &path, wall_ns, rule, flags)?;
                    *self.stats.current.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((self.opened, path.clone()));
                    self.current = Some((name, path));
                    self.opened += 1;
                    return Ok(files);
                }
                Err(RecordError::Open { source, .. })
                    if source.kind() == io::ErrorKind::AlreadyExists
                        && name.suffix < SUFFIXES_MAX =>
                {
                    name.suffix += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Lists the directory's segments (oldest first, the open one last), deletes what the
    /// policy says has expired (each segment's tracks, then its media; one directory fsync
    /// after), and updates the figures. A failure is counted and logged, never fatal: the
    /// recording goes on.
    fn retain(&mut self, open_bytes: u64, now_wall_ns: u64) {
        let Some((open_name, open_path)) = self.current.clone() else {
            return;
        };
        let mut listed: Vec<(SegmentName, PathBuf, u64)> = Vec::new();
        match std::fs::read_dir(&self.dir) {
            Ok(rd) => {
                for e in rd.flatten().take(SEGMENTS_LISTED_MAX) {
                    let path = e.path();
                    let Some(stem) = path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_suffix(".ts"))
                    else {
                        continue;
                    };
                    let Some(name) = SegmentName::parse(stem) else {
                        continue;
                    };
                    if path == open_path {
                        continue;
                    }
                    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
                    let bytes = size(&path)
                        + KINDS
                            .iter()
                            .map(|k| size(&track_path(&path, *k)))
                            .sum::<u64>();
                    listed.push((name, path, bytes));
                }
            }
            Err(e) => {
                self.fail(&format!("listing {}: {e}", self.dir.display()));
                return;
            }
        }
        listed.sort();
        listed.push((open_name, open_path, open_bytes));
        let kept: Vec<KeptSegment> = listed
            .iter()
            .map(|(n, _, b)| KeptSegment {
                start_unix_ns: n.start_unix_ns(),
                bytes: *b,
            })
            .collect();
        let n = self.policy.expired(&kept, now_wall_ns);
        let mut deleted = 0;
        for (_, path, bytes) in &listed[..n] {
            // The tracks first: a crash between leaves a media file the next check lists and
            // deletes, never tracks nobody lists.
            let mut r = Ok(());
            for k in KINDS {
                match std::fs::remove_file(track_path(path, k)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => r = Err(e),
                    _ => {}
                }
            }
            let r = r.and_then(|()| std::fs::remove_file(path));
            match r {
                Ok(()) => {
                    deleted += 1;
                    self.stats.deletions.fetch_add(1, Ordering::AcqRel);
                    self.stats.deleted_bytes.fetch_add(*bytes, Ordering::AcqRel);
                }
                Err(e) => {
                    self.stats.deletion_errors.fetch_add(1, Ordering::AcqRel);
                    self.fail(&format!("deleting {}: {e}", path.display()));
                    break;
                }
            }
        }
        if deleted > 0
            && let Err(e) = crate::sys::sync_parent_dir(&listed[0].1)
        {
            self.fail(&format!("fsync of {}: {e}", self.dir.display()));
        }
        if deleted == n {
            // A check that did all it had to: the next failure is logged again.
            self.error_logged = false;
        }
        let left = &listed[deleted..];
        let closed: u64 = left[..left.len() - 1].iter().map(|(_, _, b)| b).sum();
        self.stats.closed_bytes.store(closed, Ordering::Release);
        self.stats.note_open(open_bytes);
        self.stats
            .segments
            .store(left.len() as u64, Ordering::Release);
        self.stats
            .oldest_unix_s
            .store(left[0].0.start_unix_s, Ordering::Release);
    }

    fn fail(&mut self, what: &str) {
        if !self.error_logged {
            tracing::warn!(dir = %self.dir.display(), "recording retention: {what}");
            self.error_logged = true;
        }
    }
}

/// fdatasync the media, then the tracks: at a sync point the durable tracks never describe
/// media that is not durable.
fn sync_in_order((media, tracks): &(Media, [Arc<File>; 3])) -> io::Result<()> {
    media.sync_data()?;
    for f in tracks {
        rustix::fs::fdatasync(f.as_fd())?;
    }
    Ok(())
}

/// The sync thread: one request in flight at most (a request while busy is skipped, the next
/// one covers it).
struct Syncer {
    tx: Option<SyncSender<SyncPoint>>,
    rx: Receiver<io::Result<SyncPoint>>,
    join: Option<JoinHandle<()>>,
    in_flight: bool,
}

impl Syncer {
    fn start(files: (Media, [Arc<File>; 3])) -> io::Result<Syncer> {
        let (tx, req) = sync_channel::<SyncPoint>(1);
        let (done, rx) = channel();
        let join = std::thread::Builder::new()
            .name("penstock-sync".into())
            .spawn(move || {
                while let Ok(point) = req.recv() {
                    let r = sync_in_order(&files).map(|()| point);
                    if done.send(r).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Syncer {
            tx: Some(tx),
            rx,
            join: Some(join),
            in_flight: false,
        })
    }

    fn request(&mut self, point: SyncPoint) {
        if self.in_flight {
            return;
        }
        let tx = self.tx.as_ref().expect("sender lives until stop");
        match tx.try_send(point) {
            Ok(()) => self.in_flight = true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
    }

    /// A finished sync, if any; `block`: wait for the one in flight.
    fn poll(&mut self, block: bool) -> Option<io::Result<SyncPoint>> {
        if !self.in_flight {
            return None;
        }
        let r = if block {
            self.rx.recv().ok()
        } else {
            match self.rx.try_recv() {
                Ok(r) => Some(r),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Err(io::Error::other("sync thread died"))),
            }
        };
        if r.is_some() {
            self.in_flight = false;
        }
        r
    }

    fn stop(&mut self) {
        self.tx = None;
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn no_space(e: &io::Error) -> Option<i32> {
    match e.raw_os_error() {
        Some(c) if c == libc::ENOSPC || c == libc::EFBIG || c == libc::EDQUOT => Some(c),
        _ => None,
    }
}

/// What a failed write or sync (`op`, after `packets`) does to the recording: a full disk
/// ends it with [`StopCause::NoSpace`] (what it holds is kept), any other error fails it.
fn stop_or_fail(op: &'static str, packets: u64, e: io::Error) -> Result<StopCause, RecordError> {
    match no_space(&e) {
        Some(errno) => Ok(StopCause::NoSpace { errno }),
        None => Err(RecordError::Io {
            op,
            packets,
            source: e,
        }),
    }
}

/// Writes all of `bufs` at `offset` with pwritev, continuing after short writes. Returns the
/// bytes written and the error that stopped it early, if any.
fn pwritev_all(
    fd: BorrowedFd<'_>,
    bufs: &mut [IoSlice<'_>],
    offset: u64,
) -> (u64, Option<io::Error>) {
    let mut written = 0u64;
    let mut bufs = bufs;
    while !bufs.is_empty() {
        match rustix::io::pwritev(fd, bufs, offset + written) {
            Ok(0) => return (written, Some(io::Error::from_raw_os_error(libc::ENOSPC))),
            Ok(n) => {
                written += n as u64;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return (written, Some(e.into())),
        }
    }
    (written, None)
}

/// Writes all of `bytes` at `offset`; returns the bytes written and the error, if any.
fn pwrite_all(f: &File, bytes: &[u8], offset: u64) -> (u64, Option<io::Error>) {
    let mut done = 0usize;
    while done < bytes.len() {
        match f.write_at(&bytes[done..], offset + done as u64) {
            Ok(0) => {
                return (
                    done as u64,
                    Some(io::Error::from_raw_os_error(libc::ENOSPC)),
                );
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done as u64, Some(e)),
        }
    }
    (done as u64, None)
}

/// Records datagrams arriving on `socket` (a bound UDP socket) into `dst` and its tracks until
/// `stop` is set, `cfg.duration` elapses or the destination is full. `on_sync` is called with
/// each point made durable.
pub fn record(
    socket: BorrowedFd<'_>,
    dst: &Path,
    cfg: &RecordConfig,
    stop: &AtomicBool,
    on_sync: &mut dyn FnMut(&SyncPoint),
) -> Result<RecordReport, RecordError> {
    record_to(
        socket,
        RecordDst::File(dst.to_path_buf()),
        cfg,
        stop,
        on_sync,
    )
}

/// [`record`] into a file, a volume partition or a directory of segments.
pub fn record_to(
    socket: BorrowedFd<'_>,
    dst: RecordDst,
    cfg: &RecordConfig,
    stop: &AtomicBool,
    on_sync: &mut dyn FnMut(&SyncPoint),
) -> Result<RecordReport, RecordError> {
    if !(1..=DATAGRAM_BYTES_MAX).contains(&cfg.datagram_bytes_max) {
        return Err(RecordError::Config(format!(
            "datagram size limit must be 1..={DATAGRAM_BYTES_MAX} bytes, got {}",
            cfg.datagram_bytes_max
        )));
    }
    if !(1..=BATCH_MAX).contains(&cfg.batch_max) {
        return Err(RecordError::Config(format!(
            "batch must be 1..={BATCH_MAX} datagrams, got {}",
            cfg.batch_max
        )));
    }
    // Socket options: a large receive buffer, drop counter, kernel receive times.
    if rustix::net::sockopt::set_socket_recv_buffer_size_force(socket, cfg.rcvbuf_bytes).is_err() {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(socket, cfg.rcvbuf_bytes);
    }
    let rcvbuf_bytes = rustix::net::sockopt::socket_recv_buffer_size(socket).unwrap_or(0);
    let drops_known = set_socket_int(socket, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).is_ok();
    let kernel_timestamps = cfg.kernel_timestamps
        && set_socket_int(socket, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1).is_ok();

    let start_wall_ns = clock::wall_ns();
    let start = clock::now();
    let mut rule = match cfg.frames {
        FrameChoice::Fixed(r) => r,
        FrameChoice::Auto => FrameRule::EveryPacket, // until the first datagram says otherwise
    };
    let mut rule_decided = matches!(cfg.frames, FrameChoice::Fixed(_));
    let flags = if kernel_timestamps {
        FLAG_KERNEL_TIMESTAMPS
    } else {
        0
    };
    let mut dst_label = match &dst {
        RecordDst::File(p) => p.display().to_string(),
        RecordDst::Partition { io, .. } => format!("vol:{}", io.label),
        RecordDst::Segments(s) => s.dir.display().to_string(),
    };
    let mut segments: Option<Segmenter> = None;
    let mut files = match dst {
        RecordDst::File(p) => open_files(
            Media::File(create(&p, false)?),
            Some(&p),
            &p,
            start_wall_ns,
            rule,
            flags,
        )?,
        RecordDst::Partition { mut io, tracks } => {
            io.make_buffered().map_err(|source| RecordError::Open {
                path: PathBuf::from(format!("vol:{}", io.label)),
                source,
            })?;
            open_files(
                Media::Partition(Arc::from(io)),
                None,
                &tracks,
                start_wall_ns,
                rule,
                flags,
            )?
        }
        RecordDst::Segments(s) => {
            std::fs::create_dir_all(&s.dir).map_err(|source| RecordError::Open {
                path: s.dir.clone(),
                source,
            })?;
            let mut seg = Segmenter::new(s);
            let f = seg.open_next(start_wall_ns, rule, flags)?;
            dst_label = seg.current_path().display().to_string();
            seg.retain(f.media_len, clock::wall_ns());
            segments = Some(seg);
            f
        }
    };
    let mut syncer = Syncer::start(files.all()).map_err(|e| RecordError::Io {
        op: "starting the sync thread",
        packets: 0,
        source: e,
    })?;

    let mut batch = RecvBatch::new(cfg.batch_max, cfg.datagram_bytes_max);
    let mut writer = TracksWriter::new();
    let mut detector = FrameDetector::new(rule);
    let mut out = TrackBytes::default();
    let mut kept: Vec<usize> = Vec::with_capacity(cfg.batch_max);
    // (datagram slot, receive time since the recording's start, begins a frame)
    let mut items: Vec<(usize, u64, bool)> = Vec::with_capacity(cfg.batch_max);
    let (mut truncated, mut empty, mut frames) = (0u64, 0u64, 0u64);
    let mut drops: Option<u64> = drops_known.then_some(0);
    let mut last_time_ns = 0u64;
    let mut batch_largest = 0usize;
    let (mut syncs, mut synced) = (0u64, SyncPoint::default());
    // The open segment's first receive time (since the recording's start): its tracks' times
    // count from it. 0 for a single file.
    let mut seg_t0_ns = 0u64;
    // Packets and frames of the segments closed before the open one.
    let (mut packets_before, mut frames_before) = (0u64, 0u64);
    let sync_ns = cfg
        .sync_every
        .map(|d| d.as_nanos() as u64)
        .filter(|&n| n > 0);
    let mut next_sync = sync_ns.map(|n| Instant::from_nanos(start.as_nanos().saturating_add(n)));
    let retention_ns = segments
        .as_ref()
        .map(|s| s.retention_every.as_nanos() as u64);
    let mut next_retention =
        retention_ns.map(|n| Instant::from_nanos(start.as_nanos().saturating_add(n)));
    let end = cfg
        .duration
        .map(|d| Instant::from_nanos(start.as_nanos().saturating_add(d.as_nanos() as u64)));

    let mut handle_sync = |r: io::Result<SyncPoint>,
                           syncs: &mut u64,
                           synced: &mut SyncPoint|
     -> Result<(), io::Error> {
        let p = r?;
        *syncs += 1;
        *synced = p;
        on_sync(&p);
        Ok(())
    };
    let segment_no = |s: &Option<Segmenter>| s.as_ref().map_or(0, |s| s.opened - 1);

    let cause = 'run: loop {
        if stop.load(Ordering::Acquire) {
            break StopCause::Stopped;
        }
        let now = clock::now();
        if end.is_some_and(|e| now >= e) {
            break StopCause::Duration;
        }
        if let Some(r) = syncer.poll(false)
            && let Err(e) = handle_sync(r, &mut syncs, &mut synced)
        {
            break stop_or_fail("fdatasync", packets_before + writer.packets(), e)?;
        }
        if let Some(ns) = sync_ns
            && next_sync.is_some_and(|t| now >= t)
        {
            let mut p = files.point(writer.packets());
            p.segment = segment_no(&segments);
            syncer.request(p);
            next_sync = Some(Instant::from_nanos(now.as_nanos().saturating_add(ns)));
        }
        if let (Some(seg), Some(ns)) = (segments.as_mut(), retention_ns)
            && next_retention.is_some_and(|t| now >= t)
        {
            seg.retain(files.bytes(), clock::wall_ns());
            next_retention = Some(Instant::from_nanos(now.as_nanos().saturating_add(ns)));
        }
        // Wait for data, at most until the next thing to look at.
        let mut wait = POLL_MAX;
        for t in [end, next_sync].into_iter().flatten() {
            wait = wait.min(t.saturating_duration_since(now));
        }
        let ts = rustix::time::Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        let mut pfd = [PollFd::new(&socket, PollFlags::IN)];
        match rustix::event::poll(&mut pfd, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(RecordError::Io {
                    op: "poll",
                    packets: packets_before + writer.packets(),
                    source: e.into(),
                });
            }
        }
        for _ in 0..BATCHES_PER_TURN {
            let n = match batch.recv(socket) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(RecordError::Io {
                        op: "recvmmsg",
                        packets: packets_before + writer.packets(),
                        source: e,
                    });
                }
            };
            batch_largest = batch_largest.max(n);
            let user_time_ns = clock::now().as_nanos().saturating_sub(start.as_nanos());
            kept.clear();
            for i in 0..n {
                let m = batch.meta(i);
                if let Some(d) = m.drops {
                    drops = Some(drops.unwrap_or(0).max(u64::from(d)));
                }
                if m.truncated {
                    truncated += 1;
                } else if m.len == 0 {
                    empty += 1;
                } else {
                    kept.push(i);
                }
            }
            if kept.is_empty() {
                continue;
            }
            if !rule_decided {
                rule = FrameRule::detect(batch.datagram(kept[0]));
                rule_decided = true;
                detector = FrameDetector::new(rule);
                if rule != FrameRule::EveryPacket
                    && let Err(e) = write_headers(&files.tracks, files.start_wall_ns, rule, flags)
                {
                    break 'run stop_or_fail("writing the track headers", 0, e)?;
                }
            }
            // Each datagram's receive time and frame start, in order (the detector sees
            // every datagram once).
            items.clear();
            for &i in &kept {
                let t = match (kernel_timestamps, batch.meta(i).kernel_time_ns) {
                    (true, Some(k)) => k.saturating_sub(start_wall_ns),
                    _ => user_time_ns,
                };
                // CLOCK_REALTIME can step back; the track's times must not.
                let t = t.max(last_time_ns);
                last_time_ns = t;
                items.push((i, t, detector.observe(batch.datagram(i))));
            }
            // Runs of datagrams for one file each: a segmented recording starts a new file
            // before the first frame start past the segment's end.
            let mut from = 0;
            while from < items.len() {
                if let Some(seg) = &segments
                    && seg.policy.rotate_before(
                        seg_t0_ns,
                        files.media_len,
                        items[from].1,
                        items[from].2,
                    )
                {
                    // Close the open segment: what it holds made durable, then the next file.
                    let seg = segments.as_mut().expect("checked above");
                    if let Some(r) = syncer.poll(true)
                        && let Err(e) = handle_sync(r, &mut syncs, &mut synced)
                    {
                        break 'run stop_or_fail(
                            "fdatasync",
                            packets_before + writer.packets(),
                            e,
                        )?;
                    }
                    syncer.stop();
                    let mut p = files.point(writer.packets());
                    p.segment = seg.opened - 1;
                    if let Err(e) = sync_in_order(&files.all())
                        .and_then(|()| handle_sync(Ok(p), &mut syncs, &mut synced))
                    {
                        break 'run stop_or_fail(
                            "fdatasync",
                            packets_before + writer.packets(),
                            e,
                        )?;
                    }
                    seg.closed_media_bytes += files.media_len;
                    packets_before += writer.packets();
                    frames_before = frames;
                    seg_t0_ns = items[from].1;
                    let wall = start_wall_ns.saturating_add(seg_t0_ns);
                    files = match seg.open_next(wall, rule, flags) {
                        Ok(f) => f,
                        Err(RecordError::Open { source, .. }) if no_space(&source).is_some() => {
                            let errno = no_space(&source).expect("matched");
                            break 'run StopCause::NoSpace { errno };
                        }
                        Err(e) => return Err(e),
                    };
                    dst_label = seg.current_path().display().to_string();
                    writer = TracksWriter::new();
                    syncer = Syncer::start(files.all()).map_err(|e| RecordError::Io {
                        op: "starting the sync thread",
                        packets: packets_before,
                        source: e,
                    })?;
                    seg.retain(0, clock::wall_ns());
                }
                let mut to = from + 1;
                if let Some(seg) = &segments {
                    let mut bytes = files.media_len + batch.datagram(items[from].0).len() as u64;
                    while to < items.len()
                        && !seg
                            .policy
                            .rotate_before(seg_t0_ns, bytes, items[to].1, items[to].2)
                    {
                        bytes += batch.datagram(items[to].0).len() as u64;
                        to += 1;
                    }
                } else {
                    to = items.len();
                }
                let run = &items[from..to];
                from = to;
                // 1. The media: one vectored write of the slots, no copy (a partition: one
                // per member piece).
                let slices: Vec<&[u8]> = run.iter().map(|&(i, ..)| batch.datagram(i)).collect();
                let (written, media_err) = files.media.write_vectored_at(&slices, files.media_len);
                files.media_len += written;
                // 2. The tracks, for the datagrams the media holds whole.
                out.clear();
                let mut covered = 0u64;
                for &(i, t, frame) in run {
                    let d = batch.datagram(i);
                    if covered + d.len() as u64 > written {
                        break;
                    }
                    covered += d.len() as u64;
                    frames += u64::from(frame);
                    writer
                        .push(t - seg_t0_ns, d.len() as u32, frame, &mut out)
                        .expect("times are clamped non-decreasing and offsets fit u64");
                }
                let mut track_err = None;
                for (k, bytes) in [&out.time, &out.packet, &out.frame].into_iter().enumerate() {
                    let (w, e) = pwrite_all(&files.tracks[k], bytes, files.track_len[k]);
                    files.track_len[k] += w;
                    if e.is_some() {
                        track_err = e;
                        break;
                    }
                }
                if let Some(e) = media_err.or(track_err) {
                    break 'run stop_or_fail("write", packets_before + writer.packets(), e)?;
                }
                if let Some(seg) = &segments {
                    seg.stats.note_open(files.bytes());
                }
            }
        }
    };

    // Stop: finish the sync in flight, then make everything durable, media first.
    let mut cause = cause;
    if let Some(r) = syncer.poll(true)
        && let Err(e) = handle_sync(r, &mut syncs, &mut synced)
    {
        cause = stop_or_fail("fdatasync", packets_before + writer.packets(), e)?;
    }
    syncer.stop();
    let mut kept_report = None;
    let (mut packets, mut media_bytes) = (writer.packets(), files.media_len);
    if let StopCause::NoSpace { .. } = cause {
        let r = cut_to_readable(&dst_label, &files).map_err(|e| RecordError::Io {
            op: "cutting the recording back after running out of space",
            packets,
            source: e,
        })?;
        packets = r.readable_packets;
        media_bytes = r.readable_media_bytes;
        frames = frames_before + r.readable_frames;
        files.media_len = r.readable_media_bytes;
        files.track_len = [
            (HEADER_BYTES as u64) + RECORD_BYTES as u64 * r.readable_packets,
            (HEADER_BYTES as u64) + RECORD_BYTES as u64 * r.readable_packets,
            (HEADER_BYTES as u64) + RECORD_BYTES as u64 * r.readable_frames,
        ];
        kept_report = Some(r);
    }
    match sync_in_order(&files.all()) {
        Ok(()) => {
            let mut p = files.point(packets);
            p.segment = segment_no(&segments);
            handle_sync(Ok(p), &mut syncs, &mut synced).expect("Ok is handled");
        }
        Err(e) if no_space(&e).is_some() && kept_report.is_some() => {}
        Err(e) => {
            return Err(RecordError::Io {
                op: "fdatasync",
                packets,
                source: e,
            });
        }
    }
    if let Some(seg) = &segments {
        seg.stats.note_open(files.bytes());
        media_bytes += seg.closed_media_bytes;
    }
    Ok(RecordReport {
        cause,
        packets: packets_before + packets,
        media_bytes,
        frames,
        truncated,
        empty,
        socket_drops: drops,
        frame_rule: rule,
        kernel_timestamps,
        rcvbuf_bytes,
        syncs,
        synced,
        batch_largest,
        elapsed: clock::now().saturating_duration_since(start),
        kept: kept_report,
    })
}

/// Reads a recording's tracks back, checks them against the media and cuts all four files to
/// the readable prefix (truncating never needs space). Returns the check of the kept part.
fn cut_to_readable(dst: &str, files: &Files) -> io::Result<CheckReport> {
    let read = |f: &File| -> io::Result<Vec<u8>> {
        let len = f.metadata()?.len();
        let mut b = vec![0u8; len as usize];
        f.read_exact_at(&mut b, 0)?;
        Ok(b)
    };
    let bad = |e: penstock_core::track::TrackError| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{dst}: {e}"))
    };
    let time = decode::<TimeRecord>(&read(&files.tracks[0])?, RECORDS_MAX).map_err(bad)?;
    let packet = decode::<PacketRecord>(&read(&files.tracks[1])?, RECORDS_MAX).map_err(bad)?;
    let frame = decode::<FrameRecord>(&read(&files.tracks[2])?, RECORDS_MAX).map_err(bad)?;
    let media_len = files.media.len()?;
    let r = check(&time.records, &packet.records, &frame.records, media_len);
    let rec = |n: u64| (HEADER_BYTES + RECORD_BYTES * n as usize) as u64;
    files.media.cut(r.readable_media_bytes)?;
    files.tracks[0].set_len(rec(r.readable_packets))?;
    files.tracks[1].set_len(rec(r.readable_packets))?;
    files.tracks[2].set_len(rec(r.readable_frames))?;
    Ok(check(
        &time.records[..r.readable_packets as usize],
        &packet.records[..r.readable_packets as usize],
        &frame.records[..r.readable_frames as usize],
        r.readable_media_bytes,
    ))
}
