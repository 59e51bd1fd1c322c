//! HLS for TS files beneath the root (docs/hls.md): `GET /PATH/index.m3u8`, PATH a `.ts`
//! file, answers a VOD media playlist whose segments are byte ranges of PATH cut at its key
//! frames (`penstock_core::hls`). The key-frame index of a file is built once, by reading it
//! through, and kept in a small cache keyed by device, inode, size and modification time, so
//! a changed file is indexed again. Segments are ordinary range requests of PATH, answered by
//! the HTTP server's range code (sendfile, or the engine).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{Arc, Mutex};

use penstock_core::hls::Segment;
use penstock_core::hls::{
    PTS_TICKS_PER_S, TsIndex, TsIndexError, TsIndexLimits, Variant, bandwidth, i_frame_bandwidth,
    i_frame_map, i_frame_playlist, i_frames, map_range, media_playlist, segments, stream_info,
};
use penstock_core::mp4::{
    FragIndexer, FragSegment, FragmentedMp4, Movie, Mp4Error, Mp4Limits, Need, Packaging,
};

use crate::config::HlsConfig;

/// What identifies one version of a file: device, inode, size, mtime (s, ns).
type FileKey = (u64, u64, u64, i64, i64);

/// Why a playlist cannot be made.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum HlsError {
    /// The file is not TS with a video stream and key frames: 415 (remembered for the file
    /// version, like an index).
    #[error("{0}")]
    Index(#[from] TsIndexError),
    /// The file is not an MP4 penstock packages (`crate::mp4`): 415 naming why.
    #[error("{0}")]
    Mp4(#[from] Mp4Error),
    /// Reading the file failed: 500 (not remembered: the next request tries again).
    #[error("reading the file: {0}")]
    Io(Arc<std::io::Error>),
}

/// What an index build ends with: a TS file's key-frame index, or an MP4's package
/// ([`Mp4Package`]).
pub(crate) type Built<T = TsIndex> = Result<Arc<T>, HlsError>;

/// An MP4 served as HLS and DASH: a plain one packaged on the fly, or a fragmented one
/// served as byte ranges of itself.
#[derive(Debug)]
pub(crate) enum Mp4Package {
    Plain(PlainMp4),
    Fragmented(FragMp4),
}

/// A plain MP4 packaged for HLS and DASH: its movie (the sample index), its segments for the
/// configured target duration, and each track's init segment, made once.
#[derive(Debug)]
pub(crate) struct PlainMp4 {
    pub(crate) movie: Movie,
    pub(crate) packaging: Packaging,
    /// (track id, init segment).
    pub(crate) inits: Vec<(u32, Vec<u8>)>,
}

/// A fragmented MP4 (CMAF): its index (init section, fragments) and its segments for the
/// configured target duration, runs of whole fragments (`penstock_core::mp4::frag`).
#[derive(Debug)]
pub(crate) struct FragMp4 {
    pub(crate) index: FragmentedMp4,
    pub(crate) cuts: Vec<FragSegment>,
    pub(crate) segments: Vec<Segment>,
}

impl FragMp4 {
    /// The media playlist: `EXT-X-MAP` on the init section, each segment a byte range of
    /// the file named `uri` (relative to the playlist, escaped).
    pub(crate) fn playlist(&self, uri: &str) -> String {
        media_playlist(&self.segments, uri, Some(self.index.init))
    }

    /// The DASH manifest naming the file as `uri`.
    pub(crate) fn manifest(&self, uri: &str) -> String {
        penstock_core::mp4::frag::dash_manifest(&self.index, &self.cuts, uri)
    }
}

/// The key-frame indexes of the files played, the builds under way, and the settings.
pub(crate) struct Hls {
    cfg: HlsConfig,
    cache: Arc<Mutex<Cache>>,
    /// MP4 packages: the same mechanism, keyed the same way, its own entries.
    mp4: Arc<Mutex<Cache<Mp4Package>>>,
    /// `/live/NAME/…`: the live sources this server runs (registered as they start).
    live: Mutex<HashMap<String, Arc<crate::hls_live::LiveFeed>>>,
    /// Blocking reloads parked now (`[hls] blocking_reload_waiters_max`).
    pub(crate) live_waiting: Arc<std::sync::atomic::AtomicUsize>,
}

/// How much memory a cached index holds, roughly (its vectors' bytes): what
/// `[hls] index_cache_bytes_max` bounds.
pub(crate) trait Weigh {
    fn weight(&self) -> usize;
}

impl Weigh for TsIndex {
    fn weight(&self) -> usize {
        std::mem::size_of::<TsIndex>()
            + self.key_frames.len() * std::mem::size_of::<penstock_core::hls::KeyFrame>()
            + self.sps.as_ref().map_or(0, Vec::len)
    }
}

impl Weigh for Mp4Package {
    fn weight(&self) -> usize {
        match self {
            Mp4Package::Plain(p) => p.weight(),
            Mp4Package::Fragmented(f) => {
                let runs: usize = f.index.fragments.iter().map(|x| x.runs.len()).sum();
                std::mem::size_of::<Mp4Package>()
                    + f.index.fragments.len() * std::mem::size_of::<penstock_core::mp4::Fragment>()
                    + runs * std::mem::size_of::<penstock_core::mp4::TrackRun>()
                    + f.cuts.len() * std::mem::size_of::<FragSegment>()
                    + f.segments.len() * std::mem::size_of::<Segment>()
                    + f.index
                        .movie
                        .tracks
                        .iter()
                        .map(|t| t.stsd.len() + 256)
                        .sum::<usize>()
            }
        }
    }
}

impl PlainMp4 {
    fn weight(&self) -> usize {
        let tracks: usize = self
            .movie
            .tracks
            .iter()
            .map(|t| {
                t.samples.len() * std::mem::size_of::<penstock_core::mp4::Sample>()
                    + t.sync.as_ref().map_or(0, |s| s.len() * 4)
                    + t.tkhd.len()
                    + t.mdhd.len()
                    + t.hdlr.len()
                    + t.media_header.len()
                    + t.stsd.len()
                    + t.edts.as_ref().map_or(0, Vec::len)
            })
            .sum();
        let cuts: usize = self
            .packaging
            .tracks
            .iter()
            .map(|t| t.segments.len() * std::mem::size_of::<penstock_core::mp4::SegmentSpan>())
            .sum();
        let inits: usize = self.inits.iter().map(|(_, i)| i.len()).sum();
        std::mem::size_of::<Mp4Package>() + tracks + cuts + inits
    }
}

fn weight_of<T: Weigh>(b: &Built<T>) -> usize {
    match b {
        Ok(t) => t.weight(),
        Err(_) => 64,
    }
}

/// What the cache may hold: entries and bytes (`[hls] index_cache_entries`,
/// `index_cache_bytes_max`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    entries: usize,
    bytes: usize,
}

impl Bounds {
    fn of(cfg: &HlsConfig) -> Bounds {
        Bounds {
            entries: cfg.index_cache_entries,
            bytes: cfg.index_cache_bytes_max,
        }
    }
}

struct Cache<T = TsIndex> {
    /// Indexes, and the files that have none (not TS, no video, no key frame).
    map: HashMap<FileKey, Built<T>>,
    /// Each entry's weight, and their sum.
    weights: HashMap<FileKey, usize>,
    bytes: usize,
    /// Insertion order: the oldest goes first when the cache is full.
    order: VecDeque<FileKey>,
    /// The builds under way (at most `indexers_max`), one per file version.
    building: HashMap<FileKey, Arc<Build<T>>>,
}

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Cache {
            map: HashMap::new(),
            weights: HashMap::new(),
            bytes: 0,
            order: VecDeque::new(),
            building: HashMap::new(),
        }
    }
}

/// One index being built on a thread of its own; the requests that wait for it.
pub(crate) struct Build<T = TsIndex> {
    state: Mutex<BuildState<T>>,
}

struct BuildState<T = TsIndex> {
    result: Option<Built<T>>,
    /// The eventfds of the HTTP loops whose connections wait (written once, at the end).
    wakers: Vec<Arc<OwnedFd>>,
}

impl<T> Default for BuildState<T> {
    fn default() -> Self {
        BuildState {
            result: None,
            wakers: Vec::new(),
        }
    }
}

impl<T> Build<T> {
    /// The end of the build, once it has one.
    pub(crate) fn result(&self) -> Option<Built<T>> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .result
            .clone()
    }

    /// Writes `waker` when the build ends (at once if it has).
    fn wake_at_end(&self, waker: &Arc<OwnedFd>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.result.is_some() {
            drop(st);
            wake(waker);
        } else if !st.wakers.iter().any(|w| Arc::ptr_eq(w, waker)) {
            st.wakers.push(waker.clone());
        }
    }
}

fn wake(waker: &OwnedFd) {
    // A full counter (EAGAIN) still wakes the loop.
    let _ = rustix::io::write(waker, &1u64.to_ne_bytes());
}

/// What [`Hls::lookup`] found for a file.
pub(crate) enum Lookup<T = TsIndex> {
    /// Cached: the index, or why the file has none.
    Ready(Built<T>),
    /// Being built: the caller waits for the build (its loop's eventfd is written at the end).
    Building(Arc<Build<T>>),
    /// `indexers_max` builds are under way (or no thread could be started): 503.
    Busy,
}

impl Hls {
    pub(crate) fn new(cfg: HlsConfig) -> Hls {
        Hls {
            cfg,
            cache: Arc::new(Mutex::new(Cache::default())),
            mp4: Arc::new(Mutex::new(Cache::default())),
            live: Mutex::new(HashMap::new()),
            live_waiting: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }

    pub(crate) fn cfg(&self) -> &HlsConfig {
        &self.cfg
    }

    /// Registers live source `name`, recording into `media` (or not recording): its
    /// `/live/NAME/…` paths exist from now on.
    pub(crate) fn register_live(
        &self,
        name: &str,
        media: crate::hls_live::LiveMedia,
    ) -> Arc<crate::hls_live::LiveFeed> {
        let feed = Arc::new(crate::hls_live::LiveFeed::new(
            name,
            media,
            self.target_ticks(),
            self.cfg.live_segments_max,
        ));
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), feed.clone());
        feed
    }

    /// The live source `name`, if this server runs it.
    pub(crate) fn live(&self, name: &str) -> Option<Arc<crate::hls_live::LiveFeed>> {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub(crate) fn has_live(&self) -> bool {
        !self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// `[hls] cache_max_age_s`: how long playlists and media files may be cached.
    pub(crate) fn cache_max_age_s(&self) -> u64 {
        self.cfg.cache_max_age_s
    }

    /// The most TS files a multivariant playlist lists.
    pub(crate) fn renditions_max(&self) -> usize {
        self.cfg.renditions_max
    }

    fn target_ticks(&self) -> u64 {
        self.cfg.target_duration_ms.max(1) * PTS_TICKS_PER_S / 1000
    }

    /// `file`, named `name` in its directory, as one rendition of a multivariant playlist
    /// (its media playlist `NAME/index.m3u8`): the bandwidth of the segments [`Hls::playlist`]
    /// cuts, the size and codecs its streams say; for a fragmented MP4 (CMAF) the same of
    /// its fragments, the codecs and size read from its `moov` (a plain MP4 is no single
    /// rendition: its own `index.m3u8` is a multivariant playlist; it is refused here). An
    /// index not cached yet is read here, on the caller's thread (docs/hls.md's limits: a
    /// `master.m3u8` of a title nobody played yet holds its HTTP worker meanwhile).
    pub(crate) fn variant(&self, file: &File, name: &str) -> Result<Variant, HlsError> {
        let uri = media_playlist_uri(name);
        if is_mp4_name(name) {
            let target_ms = self.cfg.target_duration_ms;
            let pkg = now_in(&self.mp4, &self.cfg, file, move |f, len| {
                read_mp4(f, len, target_ms)
            })?;
            let Mp4Package::Fragmented(frag) = &*pkg else {
                return Err(HlsError::Mp4(Mp4Error::NotFragmented));
            };
            let (peak, average) = bandwidth(&frag.segments);
            return Ok(Variant {
                uri,
                bandwidth: peak,
                average_bandwidth: average,
                resolution: frag.index.resolution(),
                codecs: Some(frag.index.codecs()),
                i_frames: None,
            });
        }
        let index = self.index_now(file)?;
        let (peak, average) = bandwidth(&segments(&index, self.target_ticks()));
        let info = stream_info(&index);
        let i_frames = uri.strip_suffix("index.m3u8").map(|dir| {
            (
                format!("{dir}iframes.m3u8"),
                i_frame_bandwidth(&i_frames(&index)),
            )
        });
        Ok(Variant {
            uri,
            bandwidth: peak,
            average_bandwidth: average,
            resolution: info.resolution,
            codecs: info.codecs,
            i_frames,
        })
    }

    /// The `EXT-X-I-FRAMES-ONLY` playlist of `index` (every key frame a byte range of the
    /// file named `uri`, as [`Hls::playlist`]'s segments).
    pub(crate) fn i_frame_playlist(&self, index: &TsIndex, uri: &str) -> String {
        i_frame_playlist(&i_frames(index), uri, i_frame_map(index))
    }

    /// The index of `file` from the cache, else read now on this thread and cached (RTSP's
    /// seeks use it too: one index per file version).
    pub(crate) fn index_now(&self, file: &File) -> Built {
        now_in(&self.cache, &self.cfg, file, read_index)
    }

    /// The peak bandwidth (bits/s) of the segments [`Hls::playlist`] cuts from `index`:
    /// its `BANDWIDTH`, what an HLS session of it is admitted at.
    pub(crate) fn peak_bits_per_s(&self, index: &TsIndex) -> u64 {
        bandwidth(&segments(index, self.target_ticks())).0
    }

    /// The index of `file` if it is cached; never reads the file.
    pub(crate) fn cached(&self, file: &File) -> Option<Arc<TsIndex>> {
        let m = file.metadata().ok()?;
        let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
        match self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .get(&key)
        {
            Some(Ok(i)) => Some(i.clone()),
            _ => None,
        }
    }

    /// The media playlist of `index`, whose segments name the file as `uri` (relative to the
    /// playlist's own URL; escaped by the caller).
    pub(crate) fn playlist(&self, index: &TsIndex, uri: &str) -> String {
        let segs = segments(index, self.target_ticks());
        media_playlist(&segs, uri, map_range(index, &segs))
    }

    /// The index of `file` if cached; else the build under way for this file version (one per
    /// version, however many ask), or a new one on a thread of its own (`indexer`), within
    /// `indexers_max`. `waker` is written when a build the caller waits for ends.
    pub(crate) fn lookup(&self, file: &File, waker: &Arc<OwnedFd>) -> Lookup {
        lookup_in(&self.cache, &self.cfg, file, waker, read_index)
    }

    /// [`Hls::lookup`] for an MP4 (`PATH.mp4/…`): its package, built once per file version
    /// on an index thread (the top-level boxes walked, the `moov` read with one range read).
    pub(crate) fn lookup_mp4(&self, file: &File, waker: &Arc<OwnedFd>) -> Lookup<Mp4Package> {
        let target_ms = self.cfg.target_duration_ms;
        lookup_in(&self.mp4, &self.cfg, file, waker, move |f, len| {
            read_mp4(f, len, target_ms)
        })
    }
}

/// The cached result for `file` in `cache`, else `read` now on this thread and cached.
fn now_in<T: Weigh>(
    cache: &Mutex<Cache<T>>,
    cfg: &HlsConfig,
    file: &File,
    read: impl FnOnce(&File, u64) -> Built<T>,
) -> Built<T> {
    let m = file.metadata().map_err(|e| HlsError::Io(Arc::new(e)))?;
    let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
    if let Some(r) = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map
        .get(&key)
    {
        return r.clone();
    }
    let result = read(file, key.2);
    if !matches!(result, Err(HlsError::Io(_))) {
        keep(
            &mut cache.lock().unwrap_or_else(|p| p.into_inner()),
            key,
            result.clone(),
            Bounds::of(cfg),
        );
    }
    result
}

/// The cached result for `file` in `cache`, the build under way, or a new build on a thread
/// of its own (`read` reads the file), within `indexers_max`.
fn lookup_in<T: Weigh + Send + Sync + 'static>(
    cache: &Arc<Mutex<Cache<T>>>,
    cfg: &HlsConfig,
    file: &File,
    waker: &Arc<OwnedFd>,
    read: impl FnOnce(&File, u64) -> Built<T> + Send + 'static,
) -> Lookup<T> {
    let m = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Lookup::Ready(Err(HlsError::Io(Arc::new(e)))),
    };
    let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = c.map.get(&key) {
        return Lookup::Ready(r.clone());
    }
    if let Some(b) = c.building.get(&key) {
        b.wake_at_end(waker);
        return Lookup::Building(b.clone());
    }
    if c.building.len() >= cfg.indexers_max.max(1) {
        return Lookup::Busy;
    }
    let file = match file.try_clone() {
        Ok(f) => f,
        Err(e) => return Lookup::Ready(Err(HlsError::Io(Arc::new(e)))),
    };
    let build = Arc::new(Build {
        state: Mutex::new(BuildState {
            result: None,
            wakers: vec![waker.clone()],
        }),
    });
    let job = (cache.clone(), build.clone(), key, Bounds::of(cfg));
    let spawned = std::thread::Builder::new()
        .name("penstock-index".into())
        .spawn(move || {
            let (cache, build, key, entries) = job;
            indexer(&cache, &build, key, entries, &file, read);
        });
    match spawned {
        Ok(_) => {
            c.building.insert(key, build.clone());
            Lookup::Building(build)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no thread for an HLS index");
            Lookup::Busy
        }
    }
}

/// An index thread: reads `file` through, keeps the index (or why there is none) in the
/// cache, then ends the build and wakes the loops whose connections wait for it. The thread
/// cannot hold the lock before `lookup` has registered the build: `lookup` holds it while
/// spawning.
fn indexer<T: Weigh>(
    cache: &Mutex<Cache<T>>,
    build: &Build<T>,
    key: FileKey,
    entries: Bounds,
    file: &File,
    read: impl FnOnce(&File, u64) -> Built<T>,
) {
    // A panic in the indexer (a bug) must not leave the build registered and its waiters
    // parked for good: it ends the build as a read error would.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(file, key.2)))
        .unwrap_or_else(|_| {
            Err(HlsError::Io(Arc::new(std::io::Error::other(
                "the index thread panicked",
            ))))
        });
    {
        let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
        c.building.remove(&key);
        // An I/O error is not kept: the next request tries again.
        if !matches!(result, Err(HlsError::Io(_))) {
            keep(&mut c, key, result.clone(), entries);
        }
    }
    let wakers = {
        let mut st = build.state.lock().unwrap_or_else(|p| p.into_inner());
        st.result = Some(result);
        std::mem::take(&mut st.wakers)
    };
    for w in &wakers {
        wake(w);
    }
}

/// Keeps `result` for `key`, the oldest leaving first beyond the bounds' entries or bytes
/// (the newest stays even alone above the bytes: it is in use).
fn keep<T: Weigh>(c: &mut Cache<T>, key: FileKey, result: Built<T>, bounds: Bounds) {
    let w = weight_of(&result);
    if c.map.insert(key, result).is_none() {
        c.order.push_back(key);
    }
    if let Some(old) = c.weights.insert(key, w) {
        c.bytes -= old;
    }
    c.bytes += w;
    while c.map.len() > bounds.entries.max(1) || (c.bytes > bounds.bytes && c.map.len() > 1) {
        let Some(old) = c.order.pop_front() else {
            break;
        };
        c.map.remove(&old);
        if let Some(w) = c.weights.remove(&old) {
            c.bytes -= w;
        }
    }
}

/// The index of `file` (`len` bytes), read through once
/// (`penstock_driver::media::ts_key_frames`).
fn read_index(file: &File, len: u64) -> Built {
    Ok(Arc::new(penstock_driver::media::ts_key_frames(
        file,
        len,
        TsIndexLimits::default(),
    )?))
}

impl From<penstock_driver::media::MediaError> for HlsError {
    /// A reader's error: what the file is not (415), or the reading (500).
    fn from(e: penstock_driver::media::MediaError) -> HlsError {
        use penstock_driver::media::MediaError;
        match e {
            MediaError::KeyFrames(e) => HlsError::Index(e),
            MediaError::Mp4(e) => HlsError::Mp4(e),
            MediaError::Io(e) => HlsError::Io(Arc::new(e)),
            e => HlsError::Io(Arc::new(std::io::Error::other(e.to_string()))),
        }
    }
}

/// The package of the MP4 `file` (`len` bytes): its top-level boxes walked (16 bytes read at
/// each), its `moov` read whole with one range read (at the start or at the end), the movie
/// and its sample index parsed, cut into segments of `target_ms`, the init segments made.
fn read_mp4(file: &File, len: u64, target_ms: u64) -> Built<Mp4Package> {
    use penstock_driver::media::MediaError;
    let movie = match penstock_driver::media::mp4_movie(file, len, &Mp4Limits::default()) {
        Ok(m) => m,
        Err(MediaError::Mp4(Mp4Error::Fragmented)) => {
            return read_fragmented(file, len, target_ms);
        }
        Err(e) => return Err(e.into()),
    };
    let packaging = Packaging::cut(&movie, target_ms);
    let inits = movie
        .tracks
        .iter()
        .map(|t| (t.id, penstock_core::mp4::write::init_segment(&movie, t)))
        .collect();
    Ok(Arc::new(Mp4Package::Plain(PlainMp4 {
        movie,
        packaging,
        inits,
    })))
}

/// The index of the fragmented MP4 `file` (`len` bytes): the walk of
/// `penstock_core::mp4::FragIndexer`, which reads each top-level box header (16 bytes), the
/// `moov` and every `moof` whole, never an `mdat`; then its segments for `target_ms`.
fn read_fragmented(file: &File, len: u64, target_ms: u64) -> Built<Mp4Package> {
    let mut ix = FragIndexer::new(len, Mp4Limits::default());
    let mut buf = Vec::new();
    loop {
        let (offset, want) = match ix.need() {
            Need::Done => break,
            Need::Header { offset, len } | Need::Body { offset, len } => (offset, len),
        };
        buf.resize(want, 0);
        let mut got = 0;
        while got < want {
            let n = file
                .read_at(&mut buf[got..], offset + got as u64)
                .map_err(|e| HlsError::Io(Arc::new(e)))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        ix.push(&buf[..got])?;
    }
    let index = penstock_core::mp4::frag::checked(ix.finish()?)?;
    let cuts = index.cut(target_ms);
    let segments = index.hls_segments(&cuts);
    Ok(Arc::new(Mp4Package::Fragmented(FragMp4 {
        index,
        cuts,
        segments,
    })))
}

/// Whether `name` names an MP4 file packaged for HLS and DASH: `.mp4`, `.m4v`, `.mov`, any
/// case.
pub(crate) fn is_mp4_name(name: &str) -> bool {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    matches!(ext.as_deref(), Some("mp4" | "m4v" | "mov"))
}

/// The last component of `path`, percent-escaped for a URI reference: what a playlist at
/// `PATH/index.m3u8` names PATH by (`../NAME`).
pub(crate) fn segment_uri(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    format!("../{}", escape(name))
}

/// What a multivariant playlist in the file's directory names its media playlist by
/// (`NAME/index.m3u8`, escaped).
pub(crate) fn media_playlist_uri(name: &str) -> String {
    format!("{}/index.m3u8", escape(name))
}

/// `name` percent-escaped for a URI path segment.
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `name` (a file name or a path) names a TS file: `.ts` or `.m2ts`, any case.
pub(crate) fn is_ts_name(name: &str) -> bool {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    matches!(ext.as_deref(), Some("ts" | "m2ts"))
}

/// Whether a directory entry named `name` is a rendition a multivariant playlist considers:
/// not hidden, a TS file or an MP4 (of which only fragmented ones are listed).
pub(crate) fn is_rendition_name(name: &str) -> bool {
    !name.starts_with('.') && (is_ts_name(name) || is_mp4_name(name))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cache_keeps_within_its_bytes_the_oldest_leaving_first() {
        struct W(usize);
        impl Weigh for W {
            fn weight(&self) -> usize {
                self.0
            }
        }
        let mut c: Cache<W> = Cache::default();
        let bounds = Bounds {
            entries: 10,
            bytes: 100,
        };
        let key = |i: u64| (0, i, 0, 0, 0);
        for i in 0..3 {
            keep(&mut c, key(i), Ok(Arc::new(W(40))), bounds);
        }
        // 120 bytes: the first left.
        assert_eq!(c.bytes, 80);
        assert!(!c.map.contains_key(&key(0)) && c.map.contains_key(&key(2)));
        // One alone above the bound stays (it is in use), the rest leave.
        keep(&mut c, key(3), Ok(Arc::new(W(500))), bounds);
        assert_eq!(c.map.len(), 1);
        assert_eq!(c.bytes, 500);
        // A key kept again is counted once.
        keep(&mut c, key(3), Ok(Arc::new(W(30))), bounds);
        assert_eq!((c.map.len(), c.bytes), (1, 30));
        assert_eq!(c.order.len(), 1);
    }

    use super::*;

    #[test]
    fn the_segment_uri_is_the_file_one_level_up_escaped() {
        assert_eq!(segment_uri("/movies/clip.ts"), "../clip.ts");
        assert_eq!(segment_uri("/a b/c d\".ts"), "../c%20d%22.ts");
        assert_eq!(segment_uri("/x/é.ts"), "../%C3%A9.ts");
        assert_eq!(media_playlist_uri("a b.ts"), "a%20b.ts/index.m3u8");
    }

    #[test]
    fn renditions_are_visible_ts_files() {
        assert!(is_rendition_name("1080p.ts"));
        assert!(is_rendition_name("x.M2TS"));
        assert!(!is_rendition_name(".hidden.ts"));
        assert!(!is_rendition_name("master.m3u8"));
        assert!(!is_rendition_name("ts"));
        assert!(is_rendition_name("720p.mp4"));
    }

    /// Waits (at most a minute) until `fd` is written.
    fn woken(fd: &OwnedFd) {
        let ts = rustix::event::Timespec {
            tv_sec: 60,
            tv_nsec: 0,
        };
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        assert_eq!(
            rustix::event::poll(&mut fds, Some(&ts)).unwrap(),
            1,
            "no wake"
        );
        let mut b = [0u8; 8];
        rustix::io::read(fd, &mut b).unwrap();
    }

    #[test]
    fn a_file_without_an_index_is_read_once_and_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.ts");
        std::fs::write(&path, vec![0x11u8; 1000]).unwrap();
        let file = File::open(&path).unwrap();
        let hls = Hls::new(HlsConfig::default());
        let waker =
            Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap());
        let Lookup::Building(build) = hls.lookup(&file, &waker) else {
            panic!("a new file is built on a thread");
        };
        woken(&waker);
        assert!(matches!(
            build.result(),
            Some(Err(HlsError::Index(TsIndexError::NotTs(_))))
        ));
        // The same version again: the failure from the cache, no build.
        assert!(matches!(
            hls.lookup(&file, &waker),
            Lookup::Ready(Err(HlsError::Index(TsIndexError::NotTs(_))))
        ));
    }

    #[test]
    fn requests_for_a_file_being_indexed_share_its_build_within_indexers_max() {
        let dir = tempfile::tempdir().unwrap();
        let hls = Hls::new(HlsConfig {
            indexers_max: 1,
            ..HlsConfig::default()
        });
        let a = File::open({
            let p = dir.path().join("a.ts");
            std::fs::write(&p, b"x").unwrap();
            p
        })
        .unwrap();
        let b = File::open({
            let p = dir.path().join("b.ts");
            std::fs::write(&p, b"y").unwrap();
            p
        })
        .unwrap();
        let waker =
            Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap());
        // A build registered by hand (no thread): it stays under way for this test.
        let build = Arc::new(Build {
            state: Mutex::new(BuildState::default()),
        });
        let m = a.metadata().unwrap();
        let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
        hls.cache
            .lock()
            .unwrap()
            .building
            .insert(key, build.clone());
        let Lookup::Building(same) = hls.lookup(&a, &waker) else {
            panic!("joins the build under way");
        };
        assert!(Arc::ptr_eq(&same, &build));
        assert_eq!(build.state.lock().unwrap().wakers.len(), 1);
        // Another file, with the one indexer busy: refused.
        assert!(matches!(hls.lookup(&b, &waker), Lookup::Busy));
    }
}
