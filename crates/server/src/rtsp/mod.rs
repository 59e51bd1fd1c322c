//! The RTSP server (docs/rtsp.md): players (ffmpeg, GStreamer, VLC) set up, play, pause,
//! seek and tear down MPEG-TS files beneath the served root, sent as RTP by the engine.
//!
//! Three pieces kept apart, as in gst-rtsp-server:
//! - the **connection** ([`conn`]): one thread per RTSP TCP connection (few: players hold
//!   one each, capped by `connections_max`); it reads requests (`penstock_core::rtsp`,
//!   sans-IO), answers them and, for interleaved sessions, shares its socket with their
//!   engine streams through a writer gate (one whole message at a time);
//! - the **session** ([`Session`]): by id in the shared table, outlives a connection over
//!   UDP, holds the file, the transport, the admission reservation (from SETUP) and, while
//!   played, one engine stream — paced by the EDF dispatcher from the PCR plan, class `rt`,
//!   disk reads through the scheduler, RTP framing by the uring path — and its RTCP link;
//! - the **media** ([`Media`]): one PCR plan per file (`driver::media::pcr_plan`, cached by
//!   inode and mtime), shared by the sessions of that file.
//!
//! **Volume partitions** (docs/rtsp.md "Volume partitions"): with `[volumes]`, the path
//! `vol/NAME/PART` is partition PART of volume NAME ([`Source::Partition`]): planned from its
//! committed bytes (cached by volume, name and generation), seeked by the tracks in
//! `[volumes] tracks` when they are there, and played by the engine from the members (the
//! `vol:` source: the uring path), each PLAY from a duplicate of the session's reader.
//!
//! A reaper thread turns every played session's RTCP link (sender reports out, receiver
//! reports in: loss and jitter into the metrics per class, and a report counts as the
//! client being alive), sends the RTCP BYE when a stream reaches the end of its media, and
//! tears down sessions idle for longer than `session_timeout`.
//!
//! **Live sources** ([`live`], docs/rtsp.md "Live relay"): a path named in `[rtsp.live.NAME]`
//! is a fan-out of the datagrams arriving on a `udp-listen://` socket. Its sessions
//! ([`SessionMedia::Live`]) have no engine stream: PLAY subscribes the session's transport
//! (the same UDP socket or interleaved relay) to the source (`conn.rs`, `play_live`), PAUSE
//! unsubscribes it, and the reaper turns its RTCP as for a file's session.

mod conn;
pub mod live;
pub(crate) mod mp4;

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_core::rtp::Packetizer;
use penstock_core::rtsp::SessionState;
use penstock_core::ts::{PcrLimits, PcrPid, TsPlan};
use penstock_driver::Engine;
use penstock_driver::LatenessCounts;
use penstock_driver::engine::{Admitted, StreamHandle};
use penstock_driver::rtcp::RtcpLink;

use crate::config::RtspConfig;
use crate::confine;
use crate::metrics::Metrics;

/// How often the reaper runs (RTCP turns, ends of media, timeouts).
const REAP_INTERVAL: Duration = penstock_driver::rtcp::TURN_INTERVAL_MAX;
/// From the end of a stream to its RTCP BYE. Clients read their RTP and RTCP sockets in
/// either order (ffmpeg polls both, GStreamer's jitter buffer holds packets): a BYE at once
/// can overtake the last packets still queued on the RTP socket, and the client ends without
/// them. Half a second lets them drain.
const BYE_DELAY: Duration = Duration::from_millis(500);
/// How long the accept loop waits before it looks at the stop flag again.
const ACCEPT_POLL: Duration = Duration::from_millis(200);

/// What a media's plan was made from: the same key, the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MediaKey {
    /// (device, inode, size, mtime ns): a file changed on disk is planned again.
    File(u64, u64, u64, i64),
    /// (device and inode of the member named in `[volumes]`, partition, generation, size):
    /// every committed write or truncation bumps the generation.
    Partition(u64, u64, String, u64, u64),
}

impl MediaKey {
    /// The same file or partition (perhaps changed since).
    fn same_media(&self, other: &MediaKey) -> bool {
        match (self, other) {
            (MediaKey::File(d, i, ..), MediaKey::File(e, j, ..)) => d == e && i == j,
            (MediaKey::Partition(d, i, n, ..), MediaKey::Partition(e, j, m, ..)) => {
                d == e && i == j && n == m
            }
            _ => false,
        }
    }
}

/// What an RTSP path names: a file (beneath the root, or a copy of the origin's object), or a
/// volume partition.
#[derive(Debug)]
pub(crate) enum Source {
    File(File),
    /// A ready partition: a reader holding the volume's shared lock for the session's life
    /// (`volume rm` and `truncate` wait for it), with the key of its bytes and where its
    /// tracks would be.
    Partition {
        pio: Box<penstock_driver::volume::PartitionIo>,
        key: MediaKeyOf,
        tracks: Option<std::path::PathBuf>,
    },
}

/// A partition's media key (kept opaque outside this module).
#[derive(Debug, Clone)]
pub(crate) struct MediaKeyOf(MediaKey);

/// One file's PCR plan, shared by its sessions.
#[derive(Debug)]
pub struct Media {
    key: MediaKey,
    pub pid: PcrPid,
    pub plan: TsPlan,
    /// Where independent frames begin: the plan's units that hold them, in order, from a
    /// recording's frame track or else from the file's key-frame index (the one HLS cuts
    /// segments from); `None`: neither (seeks go by PCR).
    pub keys: Option<Vec<usize>>,
    /// Where `keys` came from: [`Seek::Track`] or [`Seek::KeyFrame`].
    pub keys_from: Seek,
    /// The first video PTS of a file with a key-frame index, in ns (`None` without one): what
    /// libavformat's clients add to the npt of their seeks
    /// (`penstock_core::rtsp::adds_stream_start`), taken off again here.
    pub pts_start_ns: Option<u64>,
}

/// How a PLAY found its start (`seek=` in `STATE *`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// No Range: from the start (or where a pause stopped).
    Start,
    /// By the recording's frame track: the last independent frame at or before the time.
    Track,
    /// By the file's key-frame index (`crate::hls`, the one HLS segments are cut from): the
    /// last key frame at or before the time.
    KeyFrame,
    /// By PCR search: the last PCR at or before the time.
    Pcr,
}

impl Seek {
    pub fn word(self) -> &'static str {
        match self {
            Seek::Start => "start",
            Seek::Track => "track",
            Seek::KeyFrame => "key",
            Seek::Pcr => "pcr",
        }
    }
}

impl Media {
    /// The media's end on its timeline: the last unit's time plus one mean unit interval
    /// (the time its packets take to play). What DESCRIBE's `a=range` and PLAY's `Range`
    /// say: a client that stops at the announced end (GStreamer's jitter buffer drops
    /// packets past `npt` stop) then keeps the last unit, whose time is the plan's
    /// `duration_ns` itself.
    pub fn end_ns(&self) -> u64 {
        let d = self.plan.duration_ns();
        let gaps = self.plan.units.len().saturating_sub(1).max(1) as u64;
        d.saturating_add(d.div_ceil(gaps))
    }

    /// What to send to play from `from_ns` (`None`: the start), and how its start was found:
    /// by the frame track where the file is a recording with tracks, else by its key-frame
    /// index (the unit holding the last independent frame at or before `from_ns`; the start
    /// when none is), else by PCR.
    pub fn playback(&self, from_ns: Option<u64>) -> (penstock_core::track::Playback, Seek) {
        match (from_ns, &self.keys) {
            (None, _) => (self.plan.playback_from(None), Seek::Start),
            (Some(t), Some(keys)) => (self.plan.playback_from_key(keys, t), self.keys_from),
            (Some(t), None) => (self.plan.playback_from(Some(t)), Seek::Pcr),
        }
    }
}

/// The plan's units holding the key frames of `index`, in order.
fn index_keys(path: &str, index: &penstock_core::hls::TsIndex, plan: &TsPlan) -> Vec<usize> {
    let keys = plan.key_units(index.key_frames.iter().map(|k| k.offset));
    tracing::debug!(
        "rtsp {path}: seeks go by the key-frame index ({} key frames)",
        keys.len()
    );
    keys
}

/// The plans of the files played lately (at most `media_cached_max`).
#[derive(Debug, Default)]
struct MediaCache {
    entries: VecDeque<Arc<Media>>,
}

/// How a session's RTP leaves.
#[derive(Debug)]
pub enum Transport {
    /// RTP from a server port pair to the client's.
    Udp {
        /// Connected to the client's RTP port; the engine sends on a duplicate.
        rtp: UdpSocket,
        /// Bound to the RTP port + 1; each played stream's RTCP link uses a duplicate.
        rtcp: UdpSocket,
        client_rtcp: SocketAddr,
    },
    /// RTP framed `$ channel length` on the RTSP connection: a file's engine stream sends
    /// each frame straight to the connection's socket (`tcp`, a duplicate), holding the
    /// connection's writer `gate` for the frame; a live source's thread sends each packet
    /// as one datagram into `engine_end` of a socket pair, which the connection thread reads
    /// and frames (docs/rtsp.md, "Interleaved writes").
    Interleaved {
        engine_end: UnixDatagram,
        tcp: std::os::fd::OwnedFd,
        gate: Arc<penstock_driver::gate::WriterGate>,
        /// RTCP from the reaper (sender reports, the BYE), written by the connection thread
        /// once the pair is drained: the reaper never waits on a client's socket.
        rtcp_out: RtcpOut,
        channels: (u8, u8),
        /// The connection that carries it (the session ends with it).
        conn_id: u64,
        /// Whether the engine writes its frames to `tcp` itself: `[rtsp]
        /// interleaved_direct` on a plain connection. On an `rtsps://` one the engine
        /// writes into `engine_end` instead and the connection thread frames the packets
        /// and writes them: through rustls (`tls-user`), or with a plain `write` on a kTLS
        /// socket, whose `sendmsg` refuses the engine's send flags (decided by
        /// [`crate::tls::interleaved_direct`]).
        direct: bool,
        /// The connection's TLS path (`ktls`, `tls-user`) on an `rtsps://` listener.
        tls: Option<&'static str>,
    },
}

impl Transport {
    /// The TLS path of the connection carrying it (`None`: plain, or UDP).
    fn tls(&self) -> Option<&'static str> {
        match self {
            Transport::Interleaved { tls, .. } => *tls,
            Transport::Udp { .. } => None,
        }
    }
}

impl Transport {
    /// An interleaved transport's RTP channel and its connection's writer gate, for the
    /// engine stream.
    pub(crate) fn interleaved(&self) -> Option<penstock_driver::engine::Interleaved> {
        match self {
            Transport::Udp { .. } => None,
            Transport::Interleaved { direct: false, .. } => None,
            Transport::Interleaved { channels, gate, .. } => {
                Some(penstock_driver::engine::Interleaved {
                    channel: channels.0,
                    gate: gate.clone(),
                })
            }
        }
    }
}

/// RTCP packets waiting for an interleaved session's connection thread (at most
/// [`RTCP_OUT_MAX`]; the oldest is dropped beyond).
pub(crate) type RtcpOut = Arc<Mutex<VecDeque<Vec<u8>>>>;
/// RTCP packets an interleaved session may have waiting for its connection.
const RTCP_OUT_MAX: usize = 8;

/// Queues an RTCP packet for an interleaved session's connection thread (which frames it on
/// the RTCP channel after the RTP packets already in the pair). Never waits: the reaper
/// holds the session's lock, and the connection thread may need that lock to go on (a
/// blocking send into a full pair, with the connection thread waiting for the lock, would
/// stop both).
fn queue_rtcp(out: &RtcpOut, packet: &[u8]) {
    let mut q = out.lock().unwrap_or_else(|p| p.into_inner());
    if q.len() >= RTCP_OUT_MAX {
        q.pop_front();
    }
    q.push_back(packet.to_vec());
}

/// A session being played: its engine stream and what it was started with.
#[derive(Debug)]
struct Playing {
    handle: StreamHandle,
    packetizer: Packetizer,
    /// Unit deadlines of the playback (to name the next unit's RTP time after a pause).
    units: Arc<[penstock_core::schedule::UnitPlan]>,
    /// The playback's start on the media timeline (ns).
    start_time_ns: u64,
    /// When unit 0 was due (moves by each pause).
    anchor: penstock_core::time::Instant,
    link: Option<RtcpLink>,
    /// For interleaved transport: the sender session writing the BYE into the relay.
    tcp_rtcp: Option<penstock_core::rtp::SenderSession>,
    paused_at: Option<penstock_core::time::Instant>,
    seen: LatenessCounts,
    rtcp_reports_seen: u64,
    rtcp_lost_seen: i64,
    /// When the stream ended (the BYE follows [`BYE_DELAY`] later).
    ended_at: Option<Instant>,
    /// How its start was found.
    seek: Seek,
}

/// What a session plays.
#[derive(Debug)]
enum SessionMedia {
    /// A file beneath the root (or a volume partition) and its PCR plan.
    File { file: Source, media: Arc<Media> },
    /// A live source (`[rtsp.live.NAME]`).
    Live(Arc<live::LiveSource>),
    /// A plain MP4 file: its tracks, each its own RTP session, sent by one sender thread
    /// ([`mp4`]).
    Mp4(Box<mp4::Mp4Session>),
}

/// A session receiving a live source.
#[derive(Debug)]
struct LivePlaying {
    sub: Arc<live::Subscriber>,
    link: Option<RtcpLink>,
    tcp_rtcp: Option<penstock_core::rtp::SenderSession>,
    rtcp_reports_seen: u64,
    rtcp_lost_seen: i64,
}

/// One RTSP session (see the module doc).
#[derive(Debug)]
pub struct Session {
    pub id: String,
    /// The file's path beneath the root, as the client named it.
    path: String,
    /// The track URL of SETUP (RTP-Info's `url`).
    track_url: String,
    media: SessionMedia,
    live: Option<LivePlaying>,
    transport: Transport,
    state: SessionState,
    /// SSRC, and the sequence number and RTP time at media time 0 of this session.
    base: Packetizer,
    /// The sequence number of the next packet after the last stream.
    next_sequence: u16,
    /// The scale of the last PLAY (`Scale`; kept by a PLAY without one).
    scale: penstock_core::track::Speed,
    admitted: Option<Admitted>,
    /// When `admitted` was reserved: one not played within `setup_timeout` is given back.
    admitted_at: Instant,
    /// The address that set the session up (`sessions_per_address_max`).
    client: std::net::IpAddr,
    playing: Option<Playing>,
    /// Paused longer than `pause_hold_ms`: the stream was stopped and its reservation given
    /// back; the media time a PLAY without Range resumes from (asking admission afresh).
    resume_from_ns: Option<u64>,
    last_seen: Instant,
    /// For its access-log line: when SETUP made it, the client's `User-Agent`, and what
    /// its finished streams sent (a seek or a released pause replaces the stream).
    created: Instant,
    user_agent: Option<String>,
    played: bool,
    done_bytes: u64,
    done_lateness: [u64; penstock_driver::LATENESS_BUCKETS],
    /// Its place under the viewer's token `sessions` cap (docs/security.md), given back
    /// when the session is dropped (TEARDOWN, its timeout, the server's end).
    viewer_hold: Option<crate::auth::SessionHold>,
    /// The tenant it is admitted for (a JWT's `tenant` claim): its share holds the session's
    /// reservation, and its bytes are counted for it when it ends.
    tenant: Option<String>,
}

impl Session {
    /// What the session sent over its life (its finished streams, or its MP4 sender's or
    /// live subscription's count).
    fn sent_bytes(&self) -> u64 {
        match &self.media {
            SessionMedia::Mp4(m) => m.sent_bytes.load(Ordering::Relaxed),
            SessionMedia::Live(_) => self
                .live
                .as_ref()
                .map_or(0, |l| l.sub.octets.load(Ordering::Acquire)),
            SessionMedia::File { .. } => self.done_bytes,
        }
    }

    /// Counts what a stream taken out of `playing` sent, for the session's access-log line.
    fn count_stream(&mut self, h: &StreamHandle) {
        self.done_bytes += h.counters().bytes_sent;
        for (d, n) in self.done_lateness.iter_mut().zip(h.lateness().buckets) {
            *d += n;
        }
    }
}

/// Why a session ended, for the metrics.
#[derive(Debug, Clone, Copy)]
enum EndReason {
    Teardown,
    Timeout,
    ConnectionClosed,
    Shutdown,
    /// The operator ended it (the API's kick).
    Kicked,
    /// The viewer's token was revoked (`[auth] deny_file`).
    Revoked,
}

impl EndReason {
    fn word(self) -> &'static str {
        match self {
            EndReason::Teardown => "teardown",
            EndReason::Timeout => "timeout",
            EndReason::ConnectionClosed => "connection_closed",
            EndReason::Shutdown => "shutdown",
            EndReason::Kicked => "kicked",
            EndReason::Revoked => "revoked",
        }
    }
}

/// What the RTSP threads share.
pub struct RtspShared {
    pub(crate) cfg: RtspConfig,
    /// `[volumes]`: partitions played at `vol/NAME/PART` (none configured: `vol/` is an
    /// ordinary path beneath the root).
    volumes: crate::config::VolumesConfig,
    root: confine::Root,
    pub(crate) engine: Arc<Engine>,
    pub(crate) metrics: Arc<Metrics>,
    sessions: Mutex<HashMap<String, Arc<Mutex<Session>>>>,
    media: Mutex<MediaCache>,
    port_cursor: Mutex<u16>,
    connections: AtomicUsize,
    /// Connections open per client address (`connections_per_address_max`); an address
    /// with none is removed.
    per_address: Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Sessions per client address (`sessions_per_address_max`), changed under the lock of
    /// `sessions` as sessions are added and removed.
    sessions_per_address: Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Per client address: sessions whose admission the setup timeout gave back unplayed,
    /// and when the first of them in the current window did (`unplayed_setups_max`).
    unplayed: Mutex<HashMap<std::net::IpAddr, (u32, Instant)>>,
    next_conn_id: AtomicUsize,
    stop: AtomicBool,
    /// The live sources by path.
    live: HashMap<String, Arc<live::LiveSource>>,
    /// The live sources' counts as last put into the metrics.
    live_seen: Mutex<HashMap<String, [u64; 4]>>,
    /// The cluster's membership, for redirects of opens admission refuses (set once, after
    /// the membership starts).
    pub(crate) cluster: std::sync::OnceLock<Arc<crate::cluster::View>>,
    /// `[origin]`: files missing beneath the root are played from a copy of the origin's
    /// object (docs/origin.md).
    pub(crate) origin: std::sync::OnceLock<Arc<crate::origin::Origin>>,
    /// The key-frame indexes HLS keeps (`crate::hls`): a file without tracks seeks by its
    /// key frames. Unset (an RTSP server alone): seeks go by PCR.
    hls: std::sync::OnceLock<Arc<crate::hls::Hls>>,
    /// Who may watch (`crate::auth`; unset: every path is open).
    pub(crate) viewers: std::sync::OnceLock<Arc<crate::auth::Viewers>>,
    /// The access log (`[log] access`): one line per session at its end.
    access_log: std::sync::OnceLock<crate::access_log::LineSink>,
}

impl std::fmt::Debug for RtspShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtspShared")
            .field("sessions", &self.session_count())
            .finish()
    }
}

/// The running RTSP server: its addresses and threads.
#[derive(Debug)]
pub struct RtspServer {
    shared: Arc<RtspShared>,
    /// Stops the live sources' threads (and their recordings).
    live_stop: Arc<AtomicBool>,
    addrs: Vec<SocketAddr>,
    /// Those of `addrs` that are `rtsps://` listeners.
    tls_addrs: Vec<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
}

/// Random bits from the kernel (session ids, SSRCs, sequence starts).
pub(crate) fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    // /dev/urandom does not fail once open; if it cannot be opened, the clock's low bits
    // still make ids that differ (not secret: a session id is not a credential here, the
    // transport's peer is).
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b = t.to_ne_bytes();
    }
    u64::from_ne_bytes(b)
}

/// A scale as RTSP writes it: `2`, `0.5`, `1.25`.
pub(crate) fn scale_text(s: penstock_core::track::Speed) -> String {
    let whole = s.num() / s.den();
    let frac = s.num() % s.den();
    if frac == 0 {
        return whole.to_string();
    }
    let t = format!("{:.6}", s.num() as f64 / s.den() as f64);
    t.trim_end_matches('0').to_string()
}

/// The wall clock as a 64-bit NTP timestamp (sender reports).
fn wall_ntp() -> u64 {
    let unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    penstock_core::rtp::ntp_from_unix_ns(unix_ns)
}

impl RtspServer {
    /// Binds `cfg.listen` and starts the accept threads and the reaper. `root` is opened
    /// again (its own descriptor: the RTSP server keeps it for its life).
    pub(crate) fn start(
        cfg: &RtspConfig,
        volumes: &crate::config::VolumesConfig,
        root: &std::path::Path,
        engine: Arc<Engine>,
        metrics: Arc<Metrics>,
        hls: &Arc<crate::hls::Hls>,
        tls: Option<Arc<crate::tls::Tls>>,
    ) -> Result<RtspServer, crate::ServerError> {
        let root_fd = confine::Root::open(root).map_err(|source| crate::ServerError::Root {
            path: root.to_path_buf(),
            source,
        })?;
        let addrs = cfg.listen.resolve_rtsp().map_err(|e| {
            crate::ServerError::Config(crate::ConfigError::Invalid(format!("rtsp.listen: {e}")))
        })?;
        let mut listeners = Vec::new();
        for (a, is_tls) in addrs {
            // An rtsps:// listener without [tls] is refused by the configuration's check;
            // here too, never a plain listener where TLS was asked.
            let tls = match (is_tls, &tls) {
                (false, _) => None,
                (true, Some(t)) => Some(t.clone()),
                (true, None) => {
                    return Err(crate::ServerError::Config(crate::ConfigError::Invalid(
                        format!("rtsp.listen: rtsps://{a} needs [tls] certificates"),
                    )));
                }
            };
            let l = bind_listener(a).map_err(|source| crate::ServerError::Bind {
                what: "rtsp",
                addr: a.to_string(),
                source,
            })?;
            l.set_nonblocking(true)?;
            listeners.push((l, tls));
        }
        // Live sources start with the server: a recording runs whether anyone watches or not.
        let live_stop = Arc::new(AtomicBool::new(false));
        let mut live_sources = HashMap::new();
        let mut threads = Vec::new();
        for (name, lc) in &cfg.live {
            let started = match live::start(name, lc, live_stop.clone(), hls) {
                Ok(s) => s,
                Err(e) => {
                    live_stop.store(true, Ordering::Release);
                    for t in threads {
                        let _ = JoinHandle::join(t);
                    }
                    return Err(e);
                }
            };
            threads.extend(started.threads);
            live_sources.insert(name.clone(), started.source);
        }
        let shared = Arc::new(RtspShared {
            cfg: cfg.clone(),
            volumes: volumes.clone(),
            root: root_fd,
            engine,
            metrics,
            sessions: Mutex::new(HashMap::new()),
            media: Mutex::new(MediaCache::default()),
            port_cursor: Mutex::new(cfg.rtp_port_min & !1),
            connections: AtomicUsize::new(0),
            per_address: Mutex::new(HashMap::new()),
            sessions_per_address: Mutex::new(HashMap::new()),
            unplayed: Mutex::new(HashMap::new()),
            next_conn_id: AtomicUsize::new(1),
            origin: std::sync::OnceLock::new(),
            hls: std::sync::OnceLock::new(),
            viewers: std::sync::OnceLock::new(),
            access_log: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
            live: live_sources,
            live_seen: Mutex::new(HashMap::new()),
            cluster: std::sync::OnceLock::new(),
        });
        let mut bound = Vec::new();
        let mut tls_addrs = Vec::new();
        for (l, tls) in listeners {
            let a = l.local_addr()?;
            bound.push(a);
            if tls.is_some() {
                tls_addrs.push(a);
            }
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("rtsp-accept".into())
                    .spawn(move || accept_loop(&s, &l, tls.as_ref()))?,
            );
        }
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("rtsp-reaper".into())
                .spawn(move || reaper(&s))?,
        );
        Ok(RtspServer {
            shared,
            live_stop,
            addrs: bound,
            tls_addrs,
            threads,
        })
    }

    /// Refused opens are redirected to other nodes of `view` from now on.
    pub fn set_cluster(&self, view: Arc<crate::cluster::View>) {
        let _ = self.shared.cluster.set(view);
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Whether `a` (one of [`RtspServer::addrs`]) is an `rtsps://` listener.
    pub fn is_tls(&self, a: SocketAddr) -> bool {
        self.tls_addrs.contains(&a)
    }

    /// The control protocol's `STATE *` lines of the sessions (`RtspShared::state_lines`).
    /// Plays files missing beneath the root from `origin` (set once, before clients come).
    pub(crate) fn set_origin(&self, origin: Arc<crate::origin::Origin>) {
        let _ = self.shared.origin.set(origin);
    }

    /// Seeks in files without tracks go by the key-frame indexes of `hls` (shared with the
    /// HTTP server: one index per file version).
    pub(crate) fn set_viewers(&self, viewers: Arc<crate::auth::Viewers>) {
        let _ = self.shared.viewers.set(viewers);
    }

    /// Each session's end is a line of the access log (docs/rtsp.md, "Access log").
    pub(crate) fn set_access_log(&self, sink: crate::access_log::LineSink) {
        let _ = self.shared.access_log.set(sink);
    }

    pub(crate) fn set_hls(&self, hls: Arc<crate::hls::Hls>) {
        let _ = self.shared.hls.set(hls);
    }

    pub fn state_source(&self) -> crate::streams::StateSource {
        let shared = self.shared.clone();
        Box::new(move || shared.state_lines())
    }

    /// A function that ends session `id` now (the API's kick: its stream cancelled, its
    /// reservation given back, its end logged as `kicked`); false: no such session. The
    /// client's connection stays open and its next request gets 454 Session Not Found.
    pub fn kicker(&self) -> crate::api::Kick {
        let shared = self.shared.clone();
        Box::new(move |id| {
            if shared.session(id).is_none() {
                return false;
            }
            shared.end_session(id, EndReason::Kicked);
            true
        })
    }

    /// Sessions now.
    pub fn sessions(&self) -> usize {
        self.shared.session_count()
    }

    /// Stops accepting, ends every session (their streams cancelled), joins the threads.
    /// Connections end at their next turn (within their poll interval).
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let all: Vec<String> = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for id in all {
            self.shared.end_session(&id, EndReason::Shutdown);
        }
        self.live_stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RtspServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connections the kernel queues for the accept loop (std's `bind` asks 128: a burst of
/// players, or a flood the loop refuses one by one, would overflow it and have SYNs dropped
/// and retried for seconds).
const LISTEN_BACKLOG: i32 = 1024;

fn bind_listener(a: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(a), Type::STREAM.cloexec(), None)?;
    s.set_reuse_address(true)?;
    s.bind(&a.into())?;
    s.listen(LISTEN_BACKLOG)?;
    Ok(s.into())
}

/// A connection an `rtsps://` listener cannot take (a limit, no descriptor): closed without
/// the plain 503, which would be clear text where the client waits for a TLS handshake.
fn refuse_on(tls: Option<&Arc<crate::tls::Tls>>, s: std::net::TcpStream, why: &str) {
    if tls.is_some() {
        tracing::debug!("rtsps connection refused ({why}): closed");
        drop(s);
    } else {
        conn::refuse(s, why);
    }
}

fn accept_loop(shared: &Arc<RtspShared>, l: &TcpListener, tls: Option<&Arc<crate::tls::Tls>>) {
    // Out of descriptors, a waiting connection is refused through this one.
    let mut spare = crate::listen::spare_descriptor();
    while !shared.stop.load(Ordering::Acquire) {
        match l.accept() {
            Ok((s, peer)) => {
                let n = shared.connections.fetch_add(1, Ordering::AcqRel);
                if n >= shared.cfg.connections_max {
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    shared.metrics.error("rtsp_connections_max");
                    refuse_on(
                        tls,
                        s,
                        &format!(
                            "rtsp.connections_max {} reached",
                            shared.cfg.connections_max
                        ),
                    );
                    continue;
                }
                let Some(place) = AddressPlace::take(shared, peer.ip()) else {
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    shared.metrics.error("rtsp_connections_per_address_max");
                    refuse_on(
                        tls,
                        s,
                        &format!(
                            "rtsp.connections_per_address_max {} reached for {}",
                            shared.cfg.connections_per_address_max,
                            peer.ip()
                        ),
                    );
                    continue;
                };
                let id = shared.next_conn_id.fetch_add(1, Ordering::AcqRel) as u64;
                tracing::debug!(
                    "rtsp connection {peer}: accepted (fd {})",
                    std::os::fd::AsRawFd::as_raw_fd(&s)
                );
                let sh = shared.clone();
                let tls = tls.cloned();
                let spawned =
                    std::thread::Builder::new()
                        .name("rtsp-conn".into())
                        .spawn(move || {
                            conn::serve(&sh, s, peer, id, tls.as_deref());
                            sh.connection_closed(id);
                            drop(place);
                            sh.connections.fetch_sub(1, Ordering::AcqRel);
                        });
                if spawned.is_err() {
                    // The closure (and the place in it) was dropped with the error.
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    shared.metrics.error("rtsp_thread_spawn");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = rustix::event::poll(
                    &mut [rustix::event::PollFd::new(l, rustix::event::PollFlags::IN)],
                    Some(&rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: ACCEPT_POLL.as_nanos() as i64,
                    }),
                );
            }
            Err(e) => {
                shared.metrics.accept_failed("rtsp", &e.to_string());
                // Out of descriptors: the spare makes room to refuse one waiting connection
                // (503, closed) instead of leaving it in silence.
                if crate::listen::out_of_descriptors(&e) && spare.take().is_some() {
                    let refused = l.accept().ok();
                    let was_one = refused.is_some();
                    if let Some((s, _)) = refused {
                        shared.metrics.error("rtsp_out_of_descriptors");
                        refuse_on(tls, s, "the server is out of descriptors: try again later");
                    }
                    spare = crate::listen::spare_descriptor();
                    // Accept fails with EMFILE even when nobody waits: then back off, never
                    // spin.
                    if was_one && spare.is_some() {
                        continue;
                    }
                }
                // EMFILE and friends: count, back off as the other listeners do.
                std::thread::sleep(ACCEPT_POLL);
                if spare.is_none() {
                    spare = crate::listen::spare_descriptor();
                }
            }
        }
    }
}

/// One connection's place among its address's `connections_per_address_max`, given back
/// when dropped.
struct AddressPlace {
    shared: Arc<RtspShared>,
    ip: std::net::IpAddr,
}

impl AddressPlace {
    /// A place for a connection from `ip`, or `None` when that address holds its maximum.
    fn take(shared: &Arc<RtspShared>, ip: std::net::IpAddr) -> Option<AddressPlace> {
        let mut m = shared.per_address.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= shared.cfg.connections_per_address_max {
            return None;
        }
        *n += 1;
        Some(AddressPlace {
            shared: shared.clone(),
            ip,
        })
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut m = self
            .shared
            .per_address
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

fn reaper(shared: &Arc<RtspShared>) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(REAP_INTERVAL);
        let all: Vec<Arc<Mutex<Session>>> = shared
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let timeout = shared.cfg.session_timeout();
        let setup_timeout = shared.cfg.setup_timeout();
        let pause_hold = shared.cfg.pause_hold();
        let mut expired = Vec::new();
        let mut revoked = Vec::new();
        let viewers = shared.viewers.get();
        for s in all {
            // A session busy with a request is looked at next turn.
            let Ok(mut s) = s.try_lock() else { continue };
            shared.turn(&mut s);
            // An MP4 session's receiver reports (UDP) count as the client being alive.
            if let SessionMedia::Mp4(m) = &s.media
                && m.alive.swap(false, Ordering::AcqRel)
            {
                s.last_seen = Instant::now();
            }
            // Set up and not played in time: its reservation goes back (a PLAY later asks
            // admission afresh), so that SETUPs without PLAY hold no capacity for long.
            // (An MP4 session has no engine stream: it is unplayed only while Ready.)
            let mp4_played =
                matches!(s.media, SessionMedia::Mp4(_)) && s.state != SessionState::Ready;
            if s.playing.is_none()
                && !mp4_played
                && s.admitted.is_some()
                && s.admitted_at.elapsed() > setup_timeout
            {
                s.admitted = None;
                if let SessionMedia::Mp4(m) = &mut s.media {
                    m.reserved = None;
                }
                shared.metrics.error("rtsp_setup_timeout");
                shared.count_unplayed(s.client);
                tracing::debug!(
                    "rtsp session {}: not played within rtsp.setup_timeout_ms, its admission given back",
                    s.id
                );
            }
            // Paused for longer than `pause_hold_ms`: the stream stops and its reservation
            // goes back (a PLAY later resumes where it was, asking admission afresh).
            let now = penstock_driver::clock::now();
            if s.state == SessionState::Paused
                && s.playing.as_ref().is_some_and(|p| {
                    p.ended_at.is_none()
                        && p.paused_at
                            .is_some_and(|at| now.saturating_duration_since(at) > pause_hold)
                })
            {
                shared.release_paused(&mut s);
            }
            // An MP4 session paused that long gives its reservation back the same way (its
            // sender is stopped already; a PLAY asks admission afresh, docs/rtsp.md).
            let s = &mut *s;
            if s.state == SessionState::Paused
                && let SessionMedia::Mp4(m) = &mut s.media
                && m.reserved.is_some()
                && m.paused_at.is_some_and(|at| at.elapsed() > pause_hold)
            {
                s.admitted = None;
                m.reserved = None;
                shared.metrics.error("rtsp_pause_released");
                tracing::debug!(
                    "rtsp session {}: MP4 paused longer than rtsp.pause_hold_ms, its admission given back",
                    s.id
                );
            }
            if s.last_seen.elapsed() > timeout {
                expired.push(s.id.clone());
            } else if let (Some(v), Some(j)) =
                (viewers, s.viewer_hold.as_ref().and_then(|h| h.jti()))
                && v.is_revoked(j)
            {
                revoked.push(s.id.clone());
            }
        }
        for id in expired {
            shared.end_session(&id, EndReason::Timeout);
        }
        for id in revoked {
            tracing::info!(session = %id, "rtsp session ended: its viewer's token was revoked");
            shared.end_session(&id, EndReason::Revoked);
        }
        shared.live_metrics();
    }
}

impl RtspShared {
    /// Stops a paused session's stream, giving its admission reservation back; the session
    /// stays (paused), remembering where a PLAY resumes ([`Session::resume_from_ns`]).
    fn release_paused(&self, s: &mut Session) {
        let Some(p) = s.playing.take() else {
            return;
        };
        s.count_stream(&p.handle);
        let sent = p.handle.counters().units_sent;
        p.handle.cancel();
        let at_ns = usize::try_from(sent)
            .ok()
            .and_then(|i| p.units.get(i))
            .map(|u| u.offset_ns);
        let from_ns = match (at_ns, &s.media) {
            (Some(at), _) => p.start_time_ns + p.packetizer.scale.media_ns(at),
            (None, SessionMedia::File { media, .. }) => media.end_ns(),
            (None, SessionMedia::Live(_) | SessionMedia::Mp4(_)) => 0,
        };
        s.next_sequence = p.packetizer.sequence(sent);
        s.resume_from_ns = Some(from_ns);
        self.metrics.error("rtsp_pause_released");
        tracing::debug!(
            "rtsp session {}: paused longer than rtsp.pause_hold_ms, its stream stopped and its admission given back (a PLAY resumes at npt={})",
            s.id,
            penstock_core::rtsp::npt_text(from_ns)
        );
    }

    /// One more session of `ip` given back unplayed (the window is `session_timeout`).
    fn count_unplayed(&self, ip: std::net::IpAddr) {
        let window = self.cfg.session_timeout();
        let mut m = self.unplayed.lock().unwrap_or_else(|p| p.into_inner());
        // Old windows go (the table holds only addresses with a current window).
        m.retain(|_, (_, since)| since.elapsed() < window);
        let e = m.entry(ip).or_insert((0, Instant::now()));
        e.0 = e.0.saturating_add(1);
    }

    /// Whether `ip` set up `unplayed_setups_max` sessions that it never played within the
    /// current window: its SETUPs are refused until the window is over.
    fn unplayed_too_often(&self, ip: std::net::IpAddr) -> bool {
        let m = self.unplayed.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ip).is_some_and(|(n, since)| {
            *n >= self.cfg.unplayed_setups_max && since.elapsed() < self.cfg.session_timeout()
        })
    }

    fn session_count(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    fn session(&self, id: &str) -> Option<Arc<Mutex<Session>>> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Removes a session: its stream cancelled, its reservation, sockets and buffers given
    /// back as its parts drop.
    fn end_session(&self, id: &str, why: EndReason) {
        let s = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(s) = s {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = s.playing.take() {
                p.handle.cancel();
                s.count_stream(&p.handle);
            }
            self.log_session_end(&s, why);
            if let Some(t) = &s.tenant {
                crate::tenants::add_bytes(&self.metrics, t, s.sent_bytes());
            }
            if let (Some(l), SessionMedia::Live(src)) = (s.live.take(), &s.media) {
                src.unsubscribe(&l.sub);
            }
            s.admitted = None;
            let mut per = self
                .sessions_per_address
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = per.get_mut(&s.client) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    per.remove(&s.client);
                }
            }
            drop(per);
            self.metrics.rtsp_sessions.dec();
            self.metrics.rtsp_session_ended(why.word());
        }
    }

    /// The session's access-log line (with `[log] access` on): what it sent over its life,
    /// from SETUP to `why`.
    fn log_session_end(&self, s: &Session, why: EndReason) {
        let Some(sink) = self.access_log.get() else {
            return;
        };
        let bytes = s.sent_bytes();
        let late_p99_ns = match &s.media {
            SessionMedia::File { .. } => {
                penstock_core::lateness::lateness_bucket_quantile_ns(&s.done_lateness, 990_000)
            }
            _ => None,
        };
        // The presentation's URL: a track's SETUP URL without its `/trackID=N`.
        let url = match s.track_url.rsplit_once("/trackID=") {
            Some((base, n)) if n.bytes().all(|b| b.is_ascii_digit()) => base,
            _ => s.track_url.as_str(),
        };
        let line = crate::access_log::rtsp_session_line(
            &crate::access_log::RtspSessionEnd {
                peer: s.client,
                method: if s.played || bytes > 0 {
                    "PLAY"
                } else {
                    "SETUP"
                },
                url,
                user_agent: s.user_agent.as_deref(),
                bytes,
                elapsed: s.created.elapsed(),
                transport: match s.transport {
                    Transport::Udp { .. } => "udp",
                    Transport::Interleaved { .. } => "tcp",
                },
                tls: s.transport.tls(),
                late_p99_ns,
                end: why.word(),
            },
            std::time::SystemTime::now(),
        );
        sink.send(line);
    }

    /// One `STATE` line per session: `rtsp-<id> <ready|running|paused> path=<path>
    /// transport=<udp|tcp> sent=<payload bytes> units=<RTP packets> class=rt [late_max_ns=<n>
    /// misses=<n>]` (docs/control-protocol.md).
    fn state_lines(&self) -> Vec<String> {
        let all: Vec<Arc<Mutex<Session>>> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut lines: Vec<(String, String)> = all
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                let state = match s.state {
                    SessionState::Ready => "ready",
                    SessionState::Playing => "running",
                    SessionState::Paused => "paused",
                };
                let transport = match s.transport {
                    Transport::Udp { .. } => "udp",
                    Transport::Interleaved { .. } => "tcp",
                };
                let mut line = format!(
                    "rtsp-{} {state} path={} transport={transport}{} class=rt",
                    s.id,
                    s.path.replace(char::is_whitespace, "%20"),
                    s.transport
                        .tls()
                        .map_or(String::new(), |t| format!(" tls={t}"))
                );
                if let Some(t) = &s.tenant {
                    line += &format!(" tenant={t}");
                }
                if let Some(l) = &s.live {
                    line += &format!(
                        " live=yes sent={} units={} dropped={}",
                        l.sub.octets.load(Ordering::Acquire),
                        l.sub.packets.load(Ordering::Acquire),
                        l.sub.dropped.load(Ordering::Acquire)
                    );
                }
                if let Some(p) = &s.playing {
                    let c = p.handle.counters();
                    let l = p.handle.lateness();
                    line += &format!(
                        " sent={} units={} late_max_ns={} misses={} seek={} scale={}",
                        c.bytes_sent,
                        c.units_sent,
                        l.max_ns,
                        l.misses,
                        p.seek.word(),
                        scale_text(p.packetizer.scale)
                    );
                }
                (s.id.clone(), line)
            })
            .collect();
        lines.sort();
        let mut lines: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
        // One line per segmented recording of a live source (docs/control-protocol.md).
        let mut names: Vec<&String> = self.live.keys().collect();
        names.sort();
        for name in names {
            if let Some(r) = &self.live[name].record_stats {
                lines.push(format!(
                    "record-{} running bytes={} segments={} deletions={} deleted_bytes={} oldest_unix_s={} deletion_errors={}",
                    name.replace(char::is_whitespace, "%20"),
                    r.bytes(),
                    r.segments.load(Ordering::Acquire),
                    r.deletions.load(Ordering::Acquire),
                    r.deleted_bytes.load(Ordering::Acquire),
                    r.oldest_unix_s.load(Ordering::Acquire),
                    r.deletion_errors.load(Ordering::Acquire),
                ));
            }
        }
        lines
    }

    /// The interleaved sessions of a connection end with it.
    fn connection_closed(&self, conn_id: u64) {
        // The table's lock is not held while a session's is taken (a request may hold that).
        let all: Vec<Arc<Mutex<Session>>> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let ids: Vec<String> = all
            .iter()
            .filter_map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                matches!(s.transport, Transport::Interleaved { conn_id: c, .. } if c == conn_id)
                    .then(|| s.id.clone())
            })
            .collect();
        for id in ids {
            self.end_session(&id, EndReason::ConnectionClosed);
        }
    }

    /// The units of a recording's independent frames, from the frame track beside `path`
    /// (`PATH.time`, `.packet`, `.frame`, opened beneath the root like the media); `None`
    /// when there are no tracks or they cannot be read (seeks then go by PCR). Tracks that
    /// disagree with the media are used up to their readable prefix, as `--timing tracks`
    /// does.
    fn track_keys(&self, path: &str, media_len: u64, plan: &TsPlan) -> Option<Vec<usize>> {
        use std::io::Read;
        let read = |p: &std::path::Path| -> io::Result<Vec<u8>> {
            let rel = p
                .to_str()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not UTF-8"))?;
            match self.root.open_path(rel) {
                Ok(confine::Opened::File { mut file, .. }) => {
                    let mut v = Vec::new();
                    file.read_to_end(&mut v)?;
                    Ok(v)
                }
                _ => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no such file beneath the root",
                )),
            }
        };
        let rec = penstock_driver::record::load_tracks_with(
            std::path::Path::new(path),
            media_len,
            self.cfg.plan_entries_max,
            read,
        );
        self.keys_of(path, rec, plan)
    }

    /// `file`'s key-frame index (`crate::hls`: from its cache, else read now and kept there
    /// for HLS too); `None` without HLS's indexes or when the file has none (not TS with a
    /// video stream and key frames).
    fn key_frame_index(&self, path: &str, file: &File) -> Option<Arc<penstock_core::hls::TsIndex>> {
        match self.hls.get()?.index_now(file) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::debug!("rtsp {path}: no key-frame index, seeks go by PCR: {e}");
                None
            }
        }
    }

    /// The plan's units holding the independent frames of a recording's loaded tracks (`None`
    /// when they did not load or list no frame).
    fn keys_of(
        &self,
        path: &str,
        rec: Result<penstock_driver::record::LoadedRecording, penstock_driver::record::LoadError>,
        plan: &TsPlan,
    ) -> Option<Vec<usize>> {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("rtsp {path}: no index tracks, seeks go by PCR: {e}");
                return None;
            }
        };
        let readable = rec.report.readable_packets;
        let keys = plan.key_units(
            rec.frame
                .records
                .iter()
                .filter(|f| f.packet_index < readable)
                .map(|f| f.media_offset_bytes),
        );
        if keys.is_empty() {
            tracing::debug!("rtsp {path}: the frame track has no entry, seeks go by PCR");
            return None;
        }
        tracing::debug!(
            "rtsp {path}: seeks go by the frame track ({} independent frames)",
            keys.len()
        );
        Some(keys)
    }

    /// The plan of an opened file or partition, from the cache when it is unchanged.
    fn media_for(
        &self,
        source: &Source,
        path: &str,
    ) -> Result<Arc<Media>, penstock_driver::media::MediaError> {
        let key = match source {
            Source::File(file) => {
                let m = file.metadata()?;
                MediaKey::File(
                    m.dev(),
                    m.ino(),
                    m.len(),
                    m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                )
            }
            Source::Partition { key, .. } => key.0.clone(),
        };
        {
            let c = self.media.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = c.entries.iter().find(|e| e.key == key) {
                return Ok(hit.clone());
            }
        }
        // Planned without the lock: a big file takes a while, other files need not wait.
        let limits = PcrLimits {
            plan_entries_max: self.cfg.plan_entries_max,
            ..PcrLimits::default()
        };
        let mut pts_start_ns = None;
        let (pid, plan, keys, keys_from) = match source {
            Source::File(file) => {
                let (pid, plan) = penstock_driver::media::pcr_plan(file, &limits)?;
                let len = file.metadata()?.len();
                let index = self.key_frame_index(path, file);
                pts_start_ns = index.as_ref().map(|i| {
                    i.first_pts % (1 << 33) * 1_000_000_000 / penstock_core::hls::PTS_TICKS_PER_S
                });
                match self.track_keys(path, len, &plan) {
                    Some(keys) => (pid, plan, Some(keys), Seek::Track),
                    None => {
                        let keys = index.map(|i| index_keys(path, &i, &plan));
                        (pid, plan, keys, Seek::KeyFrame)
                    }
                }
            }
            Source::Partition { pio, tracks, .. } => {
                // Planned through the page cache (a reader of its own: the session's keeps
                // the members as the volume opened them, O_DIRECT or not, for the engine).
                let mut reader = pio.try_clone_reader()?;
                reader.make_buffered()?;
                let (pid, plan) = penstock_driver::media::pcr_plan_with(
                    |buf, offset| reader.read_at(buf, offset),
                    &limits,
                )?;
                let keys = tracks.as_deref().and_then(|prefix| {
                    let rec = penstock_driver::record::load_tracks(
                        prefix,
                        pio.size_bytes,
                        self.cfg.plan_entries_max,
                    );
                    self.keys_of(path, rec, &plan)
                });
                (pid, plan, keys, Seek::Track)
            }
        };
        let media = Arc::new(Media {
            key: key.clone(),
            pid,
            plan,
            keys,
            keys_from,
            pts_start_ns,
        });
        let mut c = self.media.lock().unwrap_or_else(|p| p.into_inner());
        c.entries.retain(|e| !e.key.same_media(&key));
        c.entries.push_front(media.clone());
        c.entries.truncate(self.cfg.media_cached_max);
        Ok(media)
    }

    /// The partition a path `vol/NAME/PART` names, when `[volumes]` configures volumes
    /// (`None`: the path is an ordinary one beneath the root). `Err(404)` for anything that
    /// is not a ready partition of a configured volume, as over HTTP.
    fn open_partition(&self, path: &str) -> Option<Result<Source, (u16, String)>> {
        use penstock_driver::volume::{Access, Volume, VolumeError};
        let rest = path.strip_prefix("vol/")?;
        if self.volumes.members.is_empty() {
            return None;
        }
        let not_found = || Some(Err((404, "no such volume partition".to_string())));
        let Some((vname, pname)) = rest.split_once('/') else {
            return not_found();
        };
        let valid = |n: &str| penstock_core::volume::Name::new(n).is_ok();
        if !valid(vname) || !valid(pname) {
            return not_found();
        }
        let Some(member) = self.volumes.members.get(vname) else {
            return not_found();
        };
        let opened = Volume::open(member, Access::Shared).and_then(|v| {
            let g = v.meta().partition(pname).map_or(0, |p| p.generation);
            Ok((v.partition_io(pname, false)?, g))
        });
        let (pio, generation) = match opened {
            Ok(x) => x,
            Err(VolumeError::NoSuchPartition { .. } | VolumeError::NotReady { .. }) => {
                return not_found();
            }
            Err(e) => {
                tracing::warn!(volume = vname, error = %e, "RTSP: a configured volume does not open");
                return Some(Err((500, format!("volume {vname}: {e}"))));
            }
        };
        let (dev, ino) = std::fs::metadata(member).map_or((0, 0), |m| (m.dev(), m.ino()));
        let key = MediaKey::Partition(dev, ino, pname.to_string(), generation, pio.size_bytes);
        let tracks = self
            .volumes
            .tracks
            .as_ref()
            .map(|d| d.join(vname).join(pname));
        Some(Ok(Source::Partition {
            pio: Box::new(pio),
            key: MediaKeyOf(key),
            tracks,
        }))
    }

    /// A server port pair on `ip`: RTP on an even port, RTCP on the next, both free.
    fn port_pair(&self, ip: std::net::IpAddr) -> io::Result<(UdpSocket, UdpSocket)> {
        let min = (self.cfg.rtp_port_min + 1) & !1;
        let max = self.cfg.rtp_port_max;
        let pairs = (max.saturating_sub(min) / 2).max(1);
        let mut cursor = self.port_cursor.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..pairs {
            let p = if *cursor < min || cursor.saturating_add(1) > max {
                min
            } else {
                *cursor
            };
            *cursor = p.saturating_add(2);
            let Ok(rtp) = UdpSocket::bind((ip, p)) else {
                continue;
            };
            let Ok(rtcp) = UdpSocket::bind((ip, p + 1)) else {
                continue;
            };
            return Ok((rtp, rtcp));
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "no free UDP port pair in rtsp.rtp_port_min {} ..= rtsp.rtp_port_max {}",
                self.cfg.rtp_port_min, self.cfg.rtp_port_max
            ),
        ))
    }

    /// The live sources' counts into the metrics.
    fn live_metrics(&self) {
        let mut seen = self.live_seen.lock().unwrap_or_else(|p| p.into_inner());
        for (name, src) in &self.live {
            let c = &src.counts;
            let now = [
                c.datagrams_in.load(Ordering::Acquire),
                c.garbage.load(Ordering::Acquire),
                c.session_dropped.load(Ordering::Acquire),
                c.record_dropped.load(Ordering::Acquire),
            ];
            self.metrics.live_source(
                name,
                now,
                seen.entry(name.clone()).or_default(),
                src.sessions(),
            );
            if let Some(r) = &src.record_stats {
                self.metrics.recording(name, r);
            }
        }
    }

    /// One reaper turn of a live session: RTCP sender reports out, receiver reports in, and
    /// the BYE once the source has gone idle.
    fn turn_live(&self, s: &mut Session) {
        let Some(l) = &mut s.live else { return };
        let counts = penstock_driver::rtcp::RtpCounts {
            packets: l.sub.packets.load(Ordering::Acquire),
            octets: l.sub.octets.load(Ordering::Acquire),
        };
        let ended = l.sub.ended.load(Ordering::Acquire);
        if let Some(rtcp) = &l.tcp_rtcp {
            let st = rtcp.stats();
            if st.reports > l.rtcp_reports_seen {
                self.metrics.rtcp_report("rt", st, &mut l.rtcp_lost_seen);
                l.rtcp_reports_seen = st.reports;
            }
        }
        if let Some(link) = &mut l.link {
            if ended {
                if let Err(e) = link.finish(counts, "end of live source") {
                    tracing::debug!("rtsp session {}: RTCP BYE not sent: {e}", s.id);
                }
            } else if let Err(e) = link.turn(counts) {
                tracing::debug!("rtsp session {}: RTCP stopped: {e}", s.id);
                l.link = None;
            } else {
                let st = link.stats();
                if st.reports > l.rtcp_reports_seen {
                    s.last_seen = Instant::now();
                    self.metrics.rtcp_report("rt", st, &mut l.rtcp_lost_seen);
                    l.rtcp_reports_seen = st.reports;
                }
            }
        }
        if let (Some(rtcp), Transport::Interleaved { rtcp_out, .. }) =
            (&mut l.tcp_rtcp, &s.transport)
            && !l.sub.paused.load(Ordering::Acquire)
        {
            let now = penstock_driver::clock::now();
            let info = penstock_core::rtp::rtcp::SenderInfo {
                ntp: wall_ntp(),
                rtp_timestamp: l.sub.packetizer.timestamp(
                    u64::try_from(now.saturating_duration_since(l.sub.anchor).as_nanos())
                        .unwrap_or(u64::MAX),
                ),
                packets: counts.packets as u32,
                octets: counts.octets as u32,
            };
            let mut out = [0u8; 1500];
            let r = if ended {
                rtcp.end(&info, "end of live source", &mut out)
            } else {
                rtcp.poll_report(now, &info, &mut out)
            };
            if let Ok(Some(n)) = r {
                queue_rtcp(rtcp_out, &out[..n]);
            }
        }
        if ended {
            // As at the end of a file: the session stays, as if paused; a PLAY subscribes
            // it again (when the source sends again).
            if let (Some(l), SessionMedia::Live(src)) = (s.live.take(), &s.media) {
                src.unsubscribe(&l.sub);
                s.next_sequence = l.sub.next_sequence();
            }
            s.state = SessionState::Paused;
        }
    }

    /// One reaper turn of a session: RTCP, metrics, the end of its media.
    fn turn(&self, s: &mut Session) {
        if s.live.is_some() {
            return self.turn_live(s);
        }
        let Some(p) = &mut s.playing else { return };
        let counts = {
            let c = p.handle.counters();
            penstock_driver::rtcp::RtpCounts {
                packets: c.units_sent,
                octets: c.bytes_sent,
            }
        };
        self.metrics
            .add_lateness("rt", &p.handle.lateness(), &mut p.seen);
        if let Some(link) = &mut p.link {
            if let Err(e) = link.turn(counts) {
                tracing::debug!("rtsp session {}: RTCP stopped: {e}", s.id);
                p.link = None;
            } else {
                let st = link.stats();
                if st.reports > p.rtcp_reports_seen {
                    // A receiver report: the client is there (RFC 2326 §12.37).
                    s.last_seen = Instant::now();
                    self.metrics.rtcp_report("rt", st, &mut p.rtcp_lost_seen);
                    p.rtcp_reports_seen = st.reports;
                }
            }
        }
        // Interleaved: receiver reports came in on the connection (`conn.rs`, `rtcp_in`).
        if let Some(rtcp) = &p.tcp_rtcp {
            let st = rtcp.stats();
            if st.reports > p.rtcp_reports_seen {
                self.metrics.rtcp_report("rt", st, &mut p.rtcp_lost_seen);
                p.rtcp_reports_seen = st.reports;
            }
        }
        // Interleaved: sender reports go through the relay like the RTP packets (the
        // connection thread frames them on the RTCP channel).
        if let (Some(rtcp), Transport::Interleaved { rtcp_out, .. }, None, None) =
            (&mut p.tcp_rtcp, &s.transport, p.ended_at, p.paused_at)
        {
            let now = penstock_driver::clock::now();
            let info = penstock_core::rtp::rtcp::SenderInfo {
                ntp: wall_ntp(),
                rtp_timestamp: p.packetizer.timestamp(
                    u64::try_from(now.saturating_duration_since(p.anchor).as_nanos())
                        .unwrap_or(u64::MAX),
                ),
                packets: counts.packets as u32,
                octets: counts.octets as u32,
            };
            let mut out = [0u8; 1500];
            if let Ok(Some(n)) = rtcp.poll_report(now, &info, &mut out) {
                queue_rtcp(rtcp_out, &out[..n]);
            }
        }
        if p.ended_at.is_none() {
            let Some(result) = p.handle.wait_timeout(Duration::ZERO) else {
                return;
            };
            p.ended_at = Some(Instant::now());
            match &result {
                Err(e) => {
                    tracing::info!("rtsp session {}: stream ended: {e}", s.id);
                    self.metrics.error("rtsp_stream_failed");
                }
                Ok(_) => tracing::debug!(
                    "rtsp session {}: end of media, {} packets of {} planned",
                    s.id,
                    counts.packets,
                    p.units.len()
                ),
            }
        }
        if p.ended_at.is_some_and(|t| t.elapsed() < BYE_DELAY) {
            return;
        }
        // The end of the media (or a failure): BYE, and the stream's resources back.
        let Some(mut p) = s.playing.take() else {
            return;
        };
        s.count_stream(&p.handle);
        if let Some(link) = &mut p.link
            && let Err(e) = link.finish(counts, "end of stream")
        {
            tracing::debug!("rtsp session {}: RTCP BYE not sent: {e}", s.id);
        }
        if let (Some(rtcp), Transport::Interleaved { rtcp_out, .. }) =
            (&mut p.tcp_rtcp, &s.transport)
        {
            let info = penstock_core::rtp::rtcp::SenderInfo {
                ntp: wall_ntp(),
                rtp_timestamp: p
                    .packetizer
                    .timestamp(p.units.last().map_or(0, |u| u.offset_ns)),
                packets: counts.packets as u32,
                octets: counts.octets as u32,
            };
            let mut out = [0u8; 1500];
            if let Ok(Some(n)) = rtcp.end(&info, "end of stream", &mut out) {
                queue_rtcp(rtcp_out, &out[..n]);
            }
        }
        s.next_sequence = p.packetizer.sequence(counts.packets);
        // At the end of the media the session is as if paused there: clients send PAUSE or
        // TEARDOWN when they see the end (GStreamer does), and a PLAY plays it again (from
        // its Range, or from the start).
        s.state = SessionState::Paused;
    }
}
