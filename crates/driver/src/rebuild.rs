//! A mirrored volume's rebuild as bulk-class engine streams (issue 21: `volume check --repair`
//! rebuilds a replaced member "as a bulk-class background stream with progress").
//!
//! [`Volume::rebuild_with`] works out what to copy (runs of the healthy copy's member onto
//! the member being rebuilt) and commits the result; this module moves the bytes. Each run is
//! cut into chunks of at most [`RebuildOptions::chunk_bytes`], and each chunk is one engine
//! stream on the io_uring path: a file source (the healthy member, reopened, at the run's
//! offset as the stream's extent) to a file target (the member being rebuilt, reopened and
//! positioned at the run's offset: the uring path writes a file target from its position).
//! The stream's reads go through the worker's disk queue in [`RebuildOptions::class`]
//! (bulk by default), so a rebuild takes the disk share DRR gives bulk, never rt streams'.
//!
//! Progress (bytes done of the total, the average rate) is reported at most every
//! [`RebuildOptions::progress_interval`] and once at the end; `cancel` stops the rebuild
//! within one poll (at most 100 ms) with the chunk under way cancelled (its in-flight I/O
//! completes first). A stopped rebuild is [`VolumeError::RebuildStopped`]: the members stay
//! `rebuilding`, so the volume is as it was before (degraded, repairable), and the next
//! rebuild copies everything again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use penstock_core::stream::{CachePolicy, DataPath, Extent, PathChoice};

use crate::engine::{DiskClass, Engine, StreamSpec, ZeroCopy};
use crate::open::classify_file;
use crate::volume::{RebuildCopy, RebuildJob, Volume, VolumeError};

/// Default largest chunk one stream copies: small enough that cancelling and progress come
/// within one chunk's time, large enough that a stream's start (plan, admission, a worker
/// message) is a negligible share of it.
pub const REBUILD_CHUNK_BYTES_DEFAULT: u64 = 16 << 20;
/// Largest chunk accepted (a limit so that a typo cannot make one stream the whole rebuild).
pub const REBUILD_CHUNK_BYTES_MAX: u64 = 1 << 30;
/// Default time between two progress reports.
pub const REBUILD_PROGRESS_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// How often the copy looks at `cancel` and the progress clock while a chunk streams.
const POLL: Duration = Duration::from_millis(100);

/// How a rebuild runs.
#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// The disk class of the copy's reads (bulk: below every rt stream).
    pub class: DiskClass,
    /// Largest bytes one stream copies (a multiple of 4096, 4 KiB to 1 GiB).
    pub chunk_bytes: u64,
    /// Average rate limit over the whole rebuild, in bytes per second (`None`: as fast as
    /// the class's share of the disk allows). Enforced between chunks: the next chunk starts
    /// when the bytes done so far are due at this rate.
    pub rate_bytes_per_s: Option<u64>,
    /// Time between two progress reports (at least 100 ms).
    pub progress_interval: Duration,
}

impl Default for RebuildOptions {
    fn default() -> RebuildOptions {
        RebuildOptions {
            class: DiskClass::Bulk,
            chunk_bytes: REBUILD_CHUNK_BYTES_DEFAULT,
            rate_bytes_per_s: None,
            progress_interval: REBUILD_PROGRESS_INTERVAL_DEFAULT,
        }
    }
}

impl RebuildOptions {
    /// Refuses options outside their limits, saying which.
    pub fn check(&self) -> Result<(), VolumeError> {
        if !(4096..=REBUILD_CHUNK_BYTES_MAX).contains(&self.chunk_bytes)
            || !self.chunk_bytes.is_multiple_of(4096)
        {
            return Err(VolumeError::Invalid(format!(
                "rebuild chunk of {} bytes: a multiple of 4096 from 4KiB to {REBUILD_CHUNK_BYTES_MAX} bytes",
                self.chunk_bytes
            )));
        }
        if self.rate_bytes_per_s == Some(0) {
            return Err(VolumeError::Invalid(
                "rebuild rate 0: give a rate above 0, or none for no limit".to_string(),
            ));
        }
        if self.progress_interval < POLL {
            return Err(VolumeError::Invalid(format!(
                "rebuild progress interval {:?}: at least {POLL:?}",
                self.progress_interval
            )));
        }
        Ok(())
    }
}

/// Where a rebuild stands, as reported to the progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Since the copy started.
    pub elapsed: Duration,
}

impl RebuildProgress {
    /// Average rate so far, bytes per second (0 before any time has passed).
    pub fn rate_bytes_per_s(&self) -> u64 {
        let ns = self.elapsed.as_nanos();
        if ns == 0 {
            return 0;
        }
        u64::try_from(u128::from(self.done_bytes) * 1_000_000_000 / ns).unwrap_or(u64::MAX)
    }
}

/// Gives the calling thread the lowest best-effort I/O priority (IOPRIO_CLASS_BE, level 7),
/// which threads it creates afterwards inherit: call it before creating the engine that runs
/// a rebuild, so that the worker's reads and writes (io_uring requests without an ioprio of
/// their own take their submitter's) yield to other processes' at the kernel's scheduler
/// (bfq, mq-deadline: docs/io-scheduler.md §7) as well as to rt streams in the engine's own
/// disk queue. An error (ioprio refused) leaves the priority as it was.
pub fn background_io_priority() -> std::io::Result<()> {
    use penstock_uring::sys::{IoprioClass, ioprio_set_current_thread, ioprio_value};
    ioprio_set_current_thread(ioprio_value(IoprioClass::BestEffort, 7))
}

/// Rebuilds `vol`'s members being rebuilt through `engine` (see the module doc). Returns the
/// bytes copied (0: nothing to rebuild). `progress` is called at most every
/// `opts.progress_interval` and once at the end.
pub fn rebuild(
    engine: &Engine,
    vol: &mut Volume,
    opts: &RebuildOptions,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(&RebuildProgress),
) -> Result<u64, VolumeError> {
    opts.check()?;
    vol.rebuild_with(&mut |job| copy_all(engine, job, opts, cancel, progress))
}

fn copy_all(
    engine: &Engine,
    job: &RebuildJob<'_>,
    opts: &RebuildOptions,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(&RebuildProgress),
) -> Result<(), VolumeError> {
    let started = Instant::now();
    let total_bytes = job.total_bytes;
    let mut done_bytes = 0u64;
    let mut last_report = started;
    let stopped = |done_bytes: u64, why: String| VolumeError::RebuildStopped {
        done_bytes,
        total_bytes,
        why,
    };
    for run in &job.copies {
        let mut at = 0u64;
        while at < run.len_bytes {
            let len = (run.len_bytes - at).min(opts.chunk_bytes);
            // The rate limit: wait until the bytes done are due, looking at `cancel`.
            if let Some(rate) = opts.rate_bytes_per_s {
                let due = Duration::from_nanos(
                    u64::try_from(u128::from(done_bytes) * 1_000_000_000 / u128::from(rate))
                        .unwrap_or(u64::MAX),
                );
                while started.elapsed() < due {
                    if cancel.load(Ordering::Acquire) {
                        return Err(stopped(done_bytes, "cancelled".to_string()));
                    }
                    std::thread::sleep((due - started.elapsed()).min(POLL));
                }
            }
            if cancel.load(Ordering::Acquire) {
                return Err(stopped(done_bytes, "cancelled".to_string()));
            }
            let piece = RebuildCopy {
                from_offset_bytes: run.from_offset_bytes + at,
                to_offset_bytes: run.to_offset_bytes + at,
                len_bytes: len,
                ..*run
            };
            let handle = start_chunk(engine, job, &piece, opts.class)
                .map_err(|why| stopped(done_bytes, why))?;
            let result = loop {
                if let Some(r) = handle.wait_timeout(POLL) {
                    break r;
                }
                if cancel.load(Ordering::Acquire) {
                    handle.cancel();
                    // The report or Cancelled, once in-flight I/O has completed.
                    let _ = handle.wait_timeout(Duration::from_secs(60));
                    let sent = handle.counters().bytes_sent;
                    return Err(stopped(done_bytes + sent, "cancelled".to_string()));
                }
                if last_report.elapsed() >= opts.progress_interval {
                    last_report = Instant::now();
                    progress(&RebuildProgress {
                        done_bytes: done_bytes + handle.counters().bytes_sent,
                        total_bytes,
                        elapsed: started.elapsed(),
                    });
                }
            };
            match result {
                Ok(report) if report.bytes == len => {}
                Ok(report) => {
                    return Err(stopped(
                        done_bytes + report.bytes,
                        format!(
                            "{} → {}: moved {} of {len} bytes",
                            job.member_path(piece.from).display(),
                            job.member_path(piece.to).display(),
                            report.bytes
                        ),
                    ));
                }
                Err(e) => {
                    return Err(stopped(
                        done_bytes,
                        format!(
                            "{} → {}: {e}",
                            job.member_path(piece.from).display(),
                            job.member_path(piece.to).display()
                        ),
                    ));
                }
            }
            done_bytes += len;
            at += len;
            if last_report.elapsed() >= opts.progress_interval {
                last_report = Instant::now();
                progress(&RebuildProgress {
                    done_bytes,
                    total_bytes,
                    elapsed: started.elapsed(),
                });
            }
        }
    }
    progress(&RebuildProgress {
        done_bytes,
        total_bytes,
        elapsed: started.elapsed(),
    });
    Ok(())
}

/// One chunk as one engine stream: the healthy member's bytes (the extent) to the rebuilt
/// member's descriptor, positioned at the chunk's offset.
fn start_chunk(
    engine: &Engine,
    job: &RebuildJob<'_>,
    piece: &RebuildCopy,
    class: DiskClass,
) -> Result<crate::StreamHandle, String> {
    let src = job
        .reopen_member(piece.from, false)
        .map_err(|e| e.to_string())?;
    let dst = job
        .reopen_member(piece.to, true)
        .map_err(|e| e.to_string())?;
    rustix::fs::seek(&dst, rustix::fs::SeekFrom::Start(piece.to_offset_bytes))
        .map_err(|e| format!("{}: seek: {e}", job.member_path(piece.to).display()))?;
    let label = |m| format!("member {m} {}", job.member_path(m).display());
    let source = classify_file(src, label(piece.from)).map_err(|e| e.to_string())?;
    let target = classify_file(dst, label(piece.to)).map_err(|e| e.to_string())?;
    let spec = StreamSpec {
        path: PathChoice::Fixed(DataPath::Uring),
        cache: CachePolicy::Keep,
        zero_copy: ZeroCopy::Off,
        class: Some(class),
        // An rt rebuild (not the default) has no rate to be admitted with: the rt queue
        // without a guarantee. Ignored for bulk.
        best_effort: true,
        extent: Extent {
            offset: piece.from_offset_bytes,
            length: Some(piece.len_bytes),
        },
        ..StreamSpec::opened()
    };
    engine
        .open_opened(spec, source, target)
        .map_err(|e| e.to_string())
}
