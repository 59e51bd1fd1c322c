//! The PCR plan of an opened TS file (`penstock_core::ts`), read from the descriptor in
//! chunks at explicit offsets (the descriptor may be shared: its position means nothing).
//! One reader for `penstock stream --timing pcr` and the RTSP server's media.

use std::io;
use std::os::unix::fs::FileExt;

use penstock_core::ts::{PcrLimits, PcrPid, PcrPidProbe, PcrPlanner, TsError, TsPlan};

/// Bytes read per call while planning.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Why a file has no PCR plan.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediaError {
    #[error("reading: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Ts(#[from] TsError),
    #[error(transparent)]
    Mp4(#[from] penstock_core::mp4::Mp4Error),
    #[error(transparent)]
    KeyFrames(#[from] penstock_core::hls::TsIndexError),
}

/// The movie (sample index) of the MP4 behind `file`, `len` bytes: its top-level boxes walked
/// (16 bytes read at each, at explicit offsets), its `moov` read whole with one range read
/// (at the start with faststart, at the end without) and parsed (`penstock_core::mp4`). One
/// reader for HLS/DASH packaging and `penstock stream --timing samples`.
pub fn mp4_movie(
    file: &std::fs::File,
    len: u64,
    limits: &penstock_core::mp4::Mp4Limits,
) -> Result<penstock_core::mp4::Movie, MediaError> {
    use penstock_core::mp4::{Mp4Error, boxes::TOP_HEADER_BYTES, parse_movie, top_level};
    let mut at = 0u64;
    let mut head = [0u8; TOP_HEADER_BYTES];
    for _ in 0..limits.top_boxes_max {
        if at >= len {
            return Err(Mp4Error::NoMoov.into());
        }
        let want = head.len().min((len - at) as usize);
        file.read_exact_at(&mut head[..want], at)?;
        let b = top_level(&head[..want], at, len)?;
        match &b.kind {
            b"moov" => {
                let body_len = b.size - u64::from(b.header_len);
                if body_len > limits.moov_bytes_max {
                    return Err(Mp4Error::MoovTooLarge(body_len, limits.moov_bytes_max).into());
                }
                let mut moov = vec![0u8; body_len as usize];
                file.read_exact_at(&mut moov, at + u64::from(b.header_len))?;
                return Ok(parse_movie(&moov, len, limits)?);
            }
            b"moof" => return Err(Mp4Error::Fragmented.into()),
            _ => at = b.end(),
        }
    }
    Err(Mp4Error::TooManyBoxes(limits.top_boxes_max).into())
}

/// Reads from offset 0 with `read_at` in chunks and feeds each to `f` until it says stop.
fn read_chunks(
    read_at: &impl Fn(&mut [u8], u64) -> io::Result<usize>,
    mut f: impl FnMut(&[u8]) -> Result<bool, MediaError>,
) -> Result<(), MediaError> {
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    let mut offset = 0u64;
    loop {
        let n = read_at(&mut buf, offset)?;
        if n == 0 || !f(&buf[..n])? {
            return Ok(());
        }
        offset += n as u64;
    }
}

/// The key-frame index of the first `len` bytes of the TS file behind `file`
/// (`penstock_core::hls::TsIndexer`), read through once: the index HLS cuts segments from
/// and RTSP's `Range: npt=` and `penstock stream --from` seek by.
pub fn ts_key_frames(
    file: &std::fs::File,
    len: u64,
    limits: penstock_core::hls::TsIndexLimits,
) -> Result<penstock_core::hls::TsIndex, MediaError> {
    let mut indexer = penstock_core::hls::TsIndexer::new(limits);
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    let mut at = 0u64;
    while at < len {
        let want = buf
            .len()
            .min(usize::try_from(len - at).unwrap_or(usize::MAX));
        let n = file.read_at(&mut buf[..want], at)?;
        if n == 0 {
            break;
        }
        indexer.push(&buf[..n]);
        at += n as u64;
    }
    Ok(indexer.finish()?)
}

/// The PCR plan of the file behind `file` (both passes: the PCR PID, then the units).
pub fn pcr_plan(file: &std::fs::File, limits: &PcrLimits) -> Result<(PcrPid, TsPlan), MediaError> {
    pcr_plan_with(|buf, offset| file.read_at(buf, offset), limits)
}

/// [`pcr_plan`] of bytes read by `read_at(buf, offset)` (0 at the end): a volume partition's
/// ([`crate::volume::PartitionIo::read_at`]).
pub fn pcr_plan_with(
    read_at: impl Fn(&mut [u8], u64) -> io::Result<usize>,
    limits: &PcrLimits,
) -> Result<(PcrPid, TsPlan), MediaError> {
    let file = &read_at;
    let mut probe = PcrPidProbe::new(limits);
    let mut pid = None;
    read_chunks(file, |chunk| {
        pid = probe.handle(chunk)?;
        Ok(pid.is_none())
    })?;
    let pid = match pid {
        Some(p) => p,
        None => probe.finish()?,
    };
    let mut planner = PcrPlanner::new(pid.pid, limits)?;
    read_chunks(file, |chunk| {
        planner.handle(chunk)?;
        Ok(true)
    })?;
    Ok((pid, planner.finish()?))
}
