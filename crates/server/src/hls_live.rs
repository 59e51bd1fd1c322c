//! Live and DVR HLS of the server's own live relays (docs/hls.md "Live and DVR"):
//! `/live/NAME/index.m3u8` for each `[rtsp.live.NAME]` that records, its segments byte ranges
//! of the file being recorded (`/live/NAME/stream.ts`, sendfile), cut at the key frames of
//! the recorder's own frame track.
//!
//! The server only gathers facts; the playlist is made by core's [`LiveIndex`]. At each sync
//! point the recorder reports (`record::record`'s `on_sync`, on the recorder's thread), the
//! [`LiveFeed`] reads the frame-track records the sync made durable, and for each: the packet
//! track's record of that datagram (its size), the datagram itself (one pread of at most a
//! datagram: which TS packet starts the video PES, and its PTS) and the time track's record
//! (its receive time). Nothing else of the media is read (its first bytes once, for the PAT
//! and PMT of `EXT-X-MAP`). The sync point's media length is what the segment path serves at
//! most: a byte not yet synced is never listed nor sent.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use penstock_core::hls::{
    Blocking, LiveIndex, LiveKeyFrame, LiveView, TsPsi, find_psi, key_frame_in,
};
use penstock_core::track::format::{HEADER_BYTES, RECORD_BYTES, decode_one};
use penstock_core::track::{FrameRecord, PacketRecord, TimeRecord, TrackKind, decode_header};
use penstock_driver::record::{SyncPoint, track_path};

/// The media read at most to find the PAT and PMT (ffmpeg repeats them every 100 ms).
const PSI_SCAN_BYTES: u64 = 1 << 20;
/// Frame-track bytes read at most per sync point (the rest at the next one).
const FRAME_READ_BYTES: u64 = (4096 * RECORD_BYTES) as u64;
const TS_PACKET_BYTES: u64 = 188;

/// One live source's HLS: its recording (if any) and the index of it.
pub(crate) struct LiveFeed {
    pub(crate) name: String,
    /// The media file being recorded; `None`: the relay does not record (409).
    pub(crate) media: Option<PathBuf>,
    state: Mutex<FeedState>,
}

struct FeedState {
    index: LiveIndex,
    psi: Option<TsPsi>,
    start_wall_ns: u64,
    /// The next frame-track byte to read.
    frame_read: u64,
    files: Option<[File; 4]>,
    /// The loops whose connections wait for a segment (written at the next sync).
    wakers: Vec<Arc<OwnedFd>>,
    /// Why the recording has no playlist (said once in the log, then in each 503's log).
    failed: Option<String>,
}

impl std::fmt::Debug for LiveFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveFeed")
            .field("name", &self.name)
            .field("media", &self.media)
            .finish_non_exhaustive()
    }
}

/// What a playlist request found.
pub(crate) enum LivePlaylist {
    Ready(String),
    /// No segment complete yet, or the recording cannot be read (the reason): 503.
    NotYet(Option<String>),
}

impl LiveFeed {
    pub(crate) fn new(
        name: &str,
        media: Option<PathBuf>,
        target_ticks: u64,
        segments_max: usize,
    ) -> LiveFeed {
        LiveFeed {
            name: name.to_string(),
            media,
            state: Mutex::new(FeedState {
                index: LiveIndex::new(target_ticks, segments_max),
                psi: None,
                start_wall_ns: 0,
                frame_read: HEADER_BYTES as u64,
                files: None,
                wakers: Vec::new(),
                failed: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sync point of the recording: the new key frames are indexed, then the loops whose
    /// connections wait are woken.
    pub(crate) fn handle_sync(&self, p: &SyncPoint) {
        let mut st = self.state();
        if st.failed.is_none()
            && let Err(e) = self.index_new(&mut st, p)
        {
            tracing::warn!(live = %self.name, error = %e, "live HLS: the recording cannot be indexed");
            st.failed = Some(e);
        }
        for w in std::mem::take(&mut st.wakers) {
            let _ = rustix::io::write(&*w, &1u64.to_ne_bytes());
        }
    }

    fn index_new(&self, st: &mut FeedState, p: &SyncPoint) -> Result<(), String> {
        let Some(media) = &self.media else {
            return Ok(());
        };
        if st.files.is_none() {
            let open = |path: PathBuf| {
                File::open(&path).map_err(|e| format!("opening {}: {e}", path.display()))
            };
            let files = [
                open(media.clone())?,
                open(track_path(media, TrackKind::Time))?,
                open(track_path(media, TrackKind::Packet))?,
                open(track_path(media, TrackKind::Frame))?,
            ];
            let mut h = [0u8; HEADER_BYTES];
            files[1]
                .read_exact_at(&mut h, 0)
                .map_err(|e| format!("reading the time track's header: {e}"))?;
            st.start_wall_ns = decode_header(&h)
                .map_err(|e| format!("the time track's header: {e}"))?
                .start_wall_ns;
            st.files = Some(files);
        }
        let [media_f, time_f, packet_f, frame_f] = st.files.as_ref().expect("opened above");
        if st.psi.is_none() {
            let n = p.media_bytes.min(PSI_SCAN_BYTES) as usize;
            let mut b = vec![0u8; n];
            media_f
                .read_exact_at(&mut b, 0)
                .map_err(|e| format!("reading the media's start: {e}"))?;
            st.psi = find_psi(&b);
            if st.psi.is_none() {
                if p.media_bytes >= PSI_SCAN_BYTES {
                    return Err(format!(
                        "no PAT and PMT naming a video stream in the first {PSI_SCAN_BYTES} bytes"
                    ));
                }
                // Not there yet: the frame records wait for it.
                st.index.handle_synced(p.media_bytes);
                return Ok(());
            }
        }
        let psi = st.psi.expect("found above");
        let end = p.frame_bytes.min(st.frame_read + FRAME_READ_BYTES);
        let whole = (end.saturating_sub(st.frame_read) / RECORD_BYTES as u64) * RECORD_BYTES as u64;
        let mut frames = vec![0u8; whole as usize];
        frame_f
            .read_exact_at(&mut frames, st.frame_read)
            .map_err(|e| format!("reading the frame track: {e}"))?;
        let mut rec = [0u8; RECORD_BYTES];
        let mut datagram = Vec::new();
        for chunk in frames.chunks_exact(RECORD_BYTES) {
            let f: FrameRecord =
                decode_one(chunk).ok_or("a frame-track record with a bad checksum")?;
            let at = HEADER_BYTES as u64 + f.packet_index * RECORD_BYTES as u64;
            packet_f
                .read_exact_at(&mut rec, at)
                .map_err(|e| format!("reading the packet track: {e}"))?;
            let pk: PacketRecord =
                decode_one(&rec).ok_or("a packet-track record with a bad checksum")?;
            time_f
                .read_exact_at(&mut rec, at)
                .map_err(|e| format!("reading the time track: {e}"))?;
            let t: TimeRecord =
                decode_one(&rec).ok_or("a time-track record with a bad checksum")?;
            if pk.packet_index != f.packet_index
                || t.packet_index != f.packet_index
                || pk.media_offset_bytes != f.media_offset_bytes
                || f.media_offset_bytes + u64::from(pk.size_bytes) > p.media_bytes
            {
                return Err(format!(
                    "the tracks disagree at packet {} (docs/track-format.md)",
                    f.packet_index
                ));
            }
            datagram.resize(pk.size_bytes as usize, 0);
            media_f
                .read_exact_at(&mut datagram, f.media_offset_bytes)
                .map_err(|e| format!("reading a key frame's datagram: {e}"))?;
            if let Some((i, pts)) = key_frame_in(&datagram, psi.video_pid, psi.codec) {
                let skipped = st.index.skipped();
                st.index.handle_key_frame(LiveKeyFrame {
                    offset: f.media_offset_bytes + i as u64 * TS_PACKET_BYTES,
                    pts,
                    time_ns: t.time_ns,
                });
                if st.index.skipped() > skipped {
                    tracing::warn!(
                        source = %self.name,
                        target_duration_s = st.index.target_duration_s(),
                        "live HLS: key frames further apart than EXT-X-TARGETDURATION; \
                         that stretch is left out of the playlist (a discontinuity)"
                    );
                }
            }
        }
        st.frame_read += whole;
        st.index.handle_synced(p.media_bytes);
        Ok(())
    }

    /// The media length synced so far: what `/live/NAME/stream.ts` serves at most.
    pub(crate) fn synced_bytes(&self) -> u64 {
        self.state().index.synced_bytes()
    }

    /// The recording's start (its tracks' header), ns since the epoch; 0 before the first sync.
    pub(crate) fn start_wall_ns(&self) -> u64 {
        self.state().start_wall_ns
    }

    /// What `_HLS_msn=msn` gets now.
    pub(crate) fn blocking(&self, msn: u64) -> Blocking {
        self.state().index.blocking(msn)
    }

    /// Writes `waker` at the next sync point.
    pub(crate) fn wake_at_sync(&self, waker: &Arc<OwnedFd>) {
        let mut st = self.state();
        if !st.wakers.iter().any(|w| Arc::ptr_eq(w, waker)) {
            st.wakers.push(waker.clone());
        }
    }

    /// The playlist of the newest `window` segments (0: all), its segment URI `uri`.
    pub(crate) fn playlist(&self, uri: &str, window: usize, query: Option<&str>) -> LivePlaylist {
        let st = self.state();
        if st.index.segments().is_empty() || st.psi.is_none() {
            return LivePlaylist::NotYet(st.failed.clone());
        }
        LivePlaylist::Ready(st.index.playlist(&LiveView {
            uri,
            map: st.psi.and_then(|p| p.map_range()),
            window,
            start_wall_ns: st.start_wall_ns,
            query,
        }))
    }
}

/// A blocking reload parked: counted among `blocking_reload_waiters_max` until dropped (the
/// answer sent, or the connection gone).
pub(crate) struct WaitTicket(Arc<AtomicUsize>);

impl WaitTicket {
    /// A place among `max` waiters, or `None` when all are taken.
    pub(crate) fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<WaitTicket> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| WaitTicket(count.clone()))
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
