//! What the worker and the data paths share: a stream's byte-moving state ([`TaskIo`]), what
//! one step of a path returns ([`Step`]), and the tags of a stream's ring operations. Here
//! rather than in the worker so that the paths (`paths`, `uring_path`) need not import the
//! worker that calls them.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use penstock_core::rtp::Packetizer;
use penstock_core::stream::CachePolicy;
use penstock_core::time::Instant;

use crate::error::StreamError;
use crate::files::Descriptor;
use crate::open::Opened;
use crate::pace::Pace;
use crate::report::{Counters, MovedBytes};

/// Tags of a stream's ring operations, in their completion tokens (`worker::token`): the
/// worker handles its readiness polls itself and hands reads and sends to the uring path.
pub(crate) const TAG_POLL: u64 = 1;
pub(crate) const TAG_READ: u64 = 2;
pub(crate) const TAG_SEND: u64 = 3;

/// What a stream waits for after a step.
#[derive(Debug)]
pub(crate) enum Step {
    /// Made progress and may make more: run again next turn (budget used up).
    Yield,
    /// Wait until the source or target descriptor is ready (POLLIN / POLLOUT).
    WaitFd(Side, u32),
    /// Wait for one of its operations in the ring to complete.
    WaitRing,
    /// The next unit is due at this instant (a paced stream).
    WaitUntil(Instant),
    /// Done: success, or an error. In-flight operations still finish before the report.
    Finish(Result<(), StreamError>),
}

/// Which of a stream's descriptors a wait is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Source,
    Target,
}

/// The byte-moving state shared by every path.
pub(crate) struct TaskIo {
    pub source: Opened,
    pub target: Opened,
    /// The source reopened with O_DIRECT (the plan's), shared like the source.
    pub direct: Option<Descriptor>,
    /// Next source offset (files).
    pub pos: u64,
    /// End offset (files); `None` for sources read until EOF.
    pub end: Option<u64>,
    pub start: u64,
    pub unit: usize,
    /// The uring path's read alignment (1: none) and bytes per read, as planned.
    pub align_bytes: u64,
    pub read_bytes: usize,
    pub cache: CachePolicy,
    pub zero_copy: bool,
    pub sent: u64,
    pub units: u64,
    pub counters: Arc<Counters>,
    pub notes: Vec<String>,
    /// The schedule of a paced stream.
    pub pace: Option<Pace>,
    /// The stream's disk class (its queue in the worker's disk scheduler: 0 `rt`, 1
    /// `bulk`, then the named classes); `CLASS` changes it while the stream runs.
    pub class: penstock_core::sched::drr::ClassId,
    /// Each unit goes out as an RTP packet: the header is written in front of it in the pool
    /// buffer (the uring path; the plan allowed it only there, with a unit plan).
    pub rtp: Option<Packetizer>,
    /// RTP interleaved on a stream socket: the frame's channel and the socket's writer gate.
    pub interleaved: Option<crate::gate::Interleaved>,
    /// What each mechanism moved, counted where its call returned (the report's `executed`).
    pub moved: MovedBytes,
}

impl TaskIo {
    pub(crate) fn add_sent(&mut self, n: usize, units: u64) {
        self.sent += n as u64;
        self.units += units;
        self.counters.bytes_sent.store(self.sent, Ordering::Relaxed);
        self.counters
            .units_sent
            .store(self.units, Ordering::Relaxed);
    }

    pub(crate) fn add_read(&self, n: usize) {
        self.counters
            .bytes_read
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes left to read from a file source.
    pub(crate) fn remaining(&self) -> Option<u64> {
        self.end.map(|e| e - self.pos)
    }

    pub(crate) fn fd(&self, side: Side) -> BorrowedFd<'_> {
        match side {
            Side::Source => self.source.fd.as_fd(),
            Side::Target => self.target.fd.as_fd(),
        }
    }

    /// Bytes written in front of each unit (the RTP header), 0 for none.
    pub(crate) fn header_bytes(&self) -> usize {
        penstock_core::stream::plan::rtp_header_bytes(
            self.rtp.is_some(),
            self.interleaved.is_some(),
        ) as usize
    }

    pub(crate) fn note_once(&mut self, note: &str) {
        if !self.notes.iter().any(|n| n == note) {
            self.notes.push(note.to_string());
        }
    }
}
