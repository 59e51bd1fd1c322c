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
    Blocking, LiveFile, LiveIndex, LiveKeyFrame, LiveView, TsPsi, find_psi, key_frame_in,
};
use penstock_core::track::format::{HEADER_BYTES, RECORD_BYTES, decode_one};
use penstock_core::track::{FrameRecord, PacketRecord, TimeRecord, TrackKind, decode_header};
use penstock_driver::record::{SyncPoint, track_path};

/// The media read at most to find the PAT and PMT (ffmpeg repeats them every 100 ms).
const PSI_SCAN_BYTES: u64 = 1 << 20;
/// Frame-track bytes read at most per sync point (the rest at the next one).
const FRAME_READ_BYTES: u64 = (4096 * RECORD_BYTES) as u64;
const TS_PACKET_BYTES: u64 = 188;

/// Files of a segmented recording the feed remembers at most (the index's own bound drops
/// their segments sooner).
const FILES_KNOWN_MAX: usize = 4096;

/// What a live source records, as its HLS sees it.
pub(crate) enum LiveMedia {
    /// Not recorded: no playlist (409).
    None,
    /// One file, served as `/live/NAME/stream.ts`.
    File(PathBuf),
    /// Segments (`record = { dir, … }`): each file served as `/live/NAME/<its name>`, the
    /// playlist spanning the files still kept (the recorder says which file it writes).
    Segments(Arc<penstock_driver::record::RecordStats>),
}

/// A file of a segmented recording the playlist lists segments of.
struct KnownFile {
    /// The index's number of it.
    index_file: u64,
    path: PathBuf,
    /// Its name: its URI beside the playlist.
    name: String,
    map: Option<(u64, u64)>,
    /// Its length once the recorder moved on (`None`: being written, its synced length).
    len: Option<u64>,
}

/// One live source's HLS: its recording (if any) and the index of it.
pub(crate) struct LiveFeed {
    pub(crate) name: String,
    pub(crate) media: LiveMedia,
    state: Mutex<FeedState>,
}

struct FeedState {
    index: LiveIndex,
    psi: Option<TsPsi>,
    /// The first file's tracks' start: the playlist's times count from it.
    start_wall_ns: u64,
    /// The file indexed now: the recorder's segment number, the time its tracks count from
    /// (after `start_wall_ns`, ns), the index's file number.
    segment: u64,
    file_offset_ns: u64,
    index_file: u64,
    /// A segmented recording's files still listed, oldest first.
    known: std::collections::VecDeque<KnownFile>,
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
        media: LiveMedia,
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
                segment: 0,
                file_offset_ns: 0,
                index_file: 0,
                known: Default::default(),
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
        let media = match &self.media {
            LiveMedia::None => return Ok(()),
            LiveMedia::File(m) => m.clone(),
            LiveMedia::Segments(stats) => {
                if p.segment != st.segment {
                    // The recorder moved to its next file: the one indexed is complete at
                    // its last synced length (the recorder synced it whole before).
                    let end = st.index.synced_bytes();
                    st.index.handle_next_file(end);
                    if let Some(k) = st.known.back_mut()
                        && k.len.is_none()
                    {
                        k.len = Some(end);
                    }
                    st.index_file += 1;
                    st.segment = p.segment;
                    st.files = None;
                    st.psi = None;
                    st.frame_read = HEADER_BYTES as u64;
                }
                prune_deleted(st);
                match st.known.back() {
                    Some(k) if k.index_file == st.index_file => k.path.clone(),
                    _ => {
                        let path = stats.current_path(p.segment).ok_or_else(|| {
                            format!(
                                "segment {} of the recording is not the one written",
                                p.segment
                            )
                        })?;
                        let name = path
                            .file_name()
                            .and_then(|n| n.to_str())
                            .ok_or("a segment's name is not UTF-8")?
                            .to_string();
                        st.known.push_back(KnownFile {
                            index_file: st.index_file,
                            path: path.clone(),
                            name,
                            map: None,
                            len: None,
                        });
                        path
                    }
                }
            }
        };
        let media = &media;
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
            let start = decode_header(&h)
                .map_err(|e| format!("the time track's header: {e}"))?
                .start_wall_ns;
            if st.start_wall_ns == 0 {
                st.start_wall_ns = start;
            }
            st.file_offset_ns = start.saturating_sub(st.start_wall_ns);
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
            if let (Some(psi), Some(k)) = (st.psi, st.known.back_mut())
                && k.index_file == st.index_file
            {
                k.map = psi.map_range();
            }
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
                    time_ns: st.file_offset_ns.saturating_add(t.time_ns),
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
        let mut st = self.state();
        prune_deleted(&mut st);
        if st.index.segments().is_empty() || st.psi.is_none() {
            return LivePlaylist::NotYet(st.failed.clone());
        }
        let files: Vec<LiveFile<'_>> = st
            .known
            .iter()
            .map(|k| LiveFile {
                file: k.index_file,
                uri: k.name.as_str(),
                map: k.map,
            })
            .collect();
        LivePlaylist::Ready(st.index.playlist(&LiveView {
            uri,
            map: st.psi.and_then(|p| p.map_range()),
            window,
            start_wall_ns: st.start_wall_ns,
            query,
            files: &files,
        }))
    }

    /// A segmented recording's file named `name` that the playlist lists: its path and the
    /// length served (the synced length of the one being written).
    pub(crate) fn segment_file(&self, name: &str) -> Option<(PathBuf, u64)> {
        let st = self.state();
        let k = st.known.iter().find(|k| k.name == name)?;
        Some((
            k.path.clone(),
            k.len.unwrap_or_else(|| st.index.synced_bytes()),
        ))
    }
}

/// The files of a segmented recording that retention deleted leave the playlist (oldest
/// first, as retention deletes them; the file being written is never deleted). Looked at at
/// each sync point and each playlist request: one stat of the oldest file.
fn prune_deleted(st: &mut FeedState) {
    while st.known.len() > 1 && (st.known.len() > FILES_KNOWN_MAX || !st.known[0].path.exists()) {
        if let Some(k) = st.known.pop_front() {
            st.index.handle_file_removed(k.index_file);
        }
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
