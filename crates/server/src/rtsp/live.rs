//! Live relay (issue 15 item 4, docs/rtsp.md "Live relay"): the datagrams arriving on a
//! `udp-listen://` socket (or, for a `source = "publish"`, the TS its RTSP publisher's
//! connection muxes, through a Unix datagram pair: [`PublishSlot`]), fanned out to every PLAYing session of the source's path, and
//! recorded at the same time if configured.
//!
//! One thread per source, started with the server (a recording runs whether anyone watches
//! or not), owns the one receiving socket. Each datagram is checked (raw TS: a multiple of 188
//! bytes, each packet starting with 0x47; or RTP carrying that); anything else is counted as
//! garbage and dropped. A good datagram goes, whole and unchanged, to the recorder (the
//! driver's `record::record`, in its own thread, reading one end of a Unix datagram pair: the
//! media byte for byte, with its time/packet/frame tracks), and its TS packets, in groups of
//! at most seven, into each subscriber's **bounded queue**. The thread then sends what each
//! queue holds, without blocking: a session whose socket is full keeps its queue, and when
//! the queue is full its oldest datagrams are dropped and counted — it never holds the others
//! back.
//!
//! RTP per session: its own SSRC, sequence numbers assigned when a datagram is queued (a
//! dropped one leaves a gap the client's RTCP reports as loss) and timestamps from the
//! arrival time (90 kHz since PLAY). A source silent for `idle_timeout` has ended: its
//! subscribers are marked ended and the reaper sends their RTCP BYE.

use std::collections::VecDeque;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_core::rtp::{Packetizer, RTP_HEADER_BYTES, RtpHeader};
use penstock_core::time::Instant as CoreInstant;

use crate::config::rtsp::{LiveConfig, LiveFormat, LiveRecord};

const TS_PACKET_BYTES: usize = 188;
/// TS packets per RTP packet sent to sessions (RFC 2250's usual seven: 1316 bytes).
const TS_PER_RTP: usize = 7;
/// The longest the thread waits for a datagram before it looks at idle time and the stop flag.
const POLL_MAX: Duration = Duration::from_millis(50);
/// With datagrams queued for a session whose socket was full: how soon to try again.
const RETRY: Duration = Duration::from_millis(2);
/// Datagrams received per turn at most before the queues are drained.
const RECV_PER_TURN_MAX: usize = 64;
/// The recorder's end of the pair: room for a stall of the recorder's loop.
const RECORD_SNDBUF_BYTES: usize = 8 << 20;

/// What the source's datagrams say, counted (the `/metrics` live source lines).
#[derive(Debug, Default)]
pub struct LiveCounts {
    pub datagrams_in: AtomicU64,
    /// Not TS (nor RTP carrying TS): dropped.
    pub garbage: AtomicU64,
    /// Datagrams the recorder could not take at once (its queue full): not recorded.
    pub record_dropped: AtomicU64,
    /// Datagrams dropped from slow sessions' queues (all sessions together).
    pub session_dropped: AtomicU64,
}

/// One session's subscription: its queue and numbering.
#[derive(Debug)]
pub struct Subscriber {
    /// A duplicate of the session's RTP socket (UDP, connected) or interleaved relay end;
    /// non-blocking.
    socket: OwnedFd,
    pub packetizer: Packetizer,
    /// PLAY's instant: RTP time `timestamp_start` (arrival times count from it).
    pub anchor: CoreInstant,
    queue_max: usize,
    /// (packet number, arrival offset ns, TS bytes).
    queue: Mutex<VecDeque<(u64, u64, Vec<u8>)>>,
    queued: AtomicU64,
    pub paused: AtomicBool,
    /// The source went idle: the reaper sends the BYE.
    pub ended: AtomicBool,
    pub packets: AtomicU64,
    pub octets: AtomicU64,
    pub dropped: AtomicU64,
}

impl Subscriber {
    /// The sequence number the next queued datagram will carry.
    pub fn next_sequence(&self) -> u16 {
        self.packetizer
            .sequence(self.queued.load(Ordering::Acquire))
    }

    /// Stops receiving (PAUSE): what was queued is dropped.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn offer(&self, arrival_ns: u64, ts: &[u8]) -> bool {
        if self.paused.load(Ordering::Acquire) || self.ended.load(Ordering::Acquire) {
            return false;
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropped = false;
        if q.len() >= self.queue_max {
            q.pop_front();
            self.dropped.fetch_add(1, Ordering::AcqRel);
            dropped = true;
        }
        let n = self.queued.fetch_add(1, Ordering::AcqRel);
        q.push_back((n, arrival_ns, ts.to_vec()));
        dropped
    }

    /// Sends what is queued until the socket is full. Whether anything is left.
    fn drain(&self, out: &mut Vec<u8>) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((n, at_ns, ts)) = q.front() {
            out.clear();
            out.extend_from_slice(&self.packetizer.header(*n, *at_ns));
            out.extend_from_slice(ts);
            match rustix::net::send(&self.socket, out, rustix::net::SendFlags::DONTWAIT) {
                Ok(_) => {
                    self.packets.fetch_add(1, Ordering::AcqRel);
                    self.octets.fetch_add(ts.len() as u64, Ordering::AcqRel);
                }
                Err(rustix::io::Errno::AGAIN) => return true,
                Err(rustix::io::Errno::INTR) => continue,
                // The client's port refused it (ICMP) or the relay is gone: this one is
                // lost, the session's timeout decides about the rest.
                Err(_) => {}
            }
            q.pop_front();
        }
        false
    }
}

/// One live source: its counts and subscribers, shared with the sessions.
#[derive(Debug)]
pub struct LiveSource {
    pub name: String,
    pub counts: LiveCounts,
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    queue_max: usize,
    /// No datagram for `idle_timeout` (or none yet): a PLAY is answered, but nothing flows.
    pub idle: AtomicBool,
    /// `source = "publish"`: where its publisher's TS goes, and who publishes.
    pub publish: Option<PublishSlot>,
    /// A segmented recording's figures (`record = { dir, … }`): metrics and `STATE`.
    pub record_stats: Option<Arc<penstock_driver::record::RecordStats>>,
}

/// The publishing side of a `source = "publish"` live source (docs/rtsp.md, "Publishing"):
/// one publisher at a time, whose muxed TS goes into the relay's Unix datagram pair as a
/// `udp-listen://` source's datagrams arrive on its socket.
#[derive(Debug)]
pub struct PublishSlot {
    /// The users who may publish (`publishers`).
    pub publishers: Vec<String>,
    /// The source's configuration (its limits).
    pub cfg: LiveConfig,
    feed: UnixDatagram,
    /// The connection publishing now.
    publisher: Mutex<Option<u64>>,
    /// The publisher left: once the feed is drained, the sessions end (their BYE).
    ended: AtomicBool,
    /// TS datagrams the relay could not take at once (its queue full): lost.
    pub dropped: AtomicU64,
}

impl PublishSlot {
    /// Takes the source for connection `conn`; false when another publishes.
    pub fn claim(&self, conn: u64) -> bool {
        let mut p = self.publisher.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_some_and(|c| c != conn) {
            return false;
        }
        *p = Some(conn);
        self.ended.store(false, Ordering::Release);
        true
    }

    /// Connection `conn` stops publishing: the source ends (its sessions get their BYE).
    pub fn release(&self, conn: u64) {
        let mut p = self.publisher.lock().unwrap_or_else(|p| p.into_inner());
        if *p == Some(conn) {
            *p = None;
            self.ended.store(true, Ordering::Release);
        }
    }

    /// The publisher's TS (whole packets) into the relay, in datagrams of at most seven
    /// packets (what the recorder's frame track reads); never blocks.
    pub fn feed(&self, ts: &[u8]) {
        for d in ts.chunks(TS_PER_RTP * TS_PACKET_BYTES) {
            if self.feed.send(d).is_err() {
                self.dropped.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

impl LiveSource {
    /// Subscribes a session's transport socket (`socket` is duplicated and made
    /// non-blocking).
    pub fn subscribe(
        &self,
        socket: std::os::fd::BorrowedFd<'_>,
        packetizer: Packetizer,
        anchor: CoreInstant,
    ) -> io::Result<Arc<Subscriber>> {
        let socket = socket.try_clone_to_owned()?;
        rustix::io::ioctl_fionbio(&socket, true)?;
        let s = Arc::new(Subscriber {
            socket,
            packetizer,
            anchor,
            queue_max: self.queue_max,
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            packets: AtomicU64::new(0),
            octets: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s.clone());
        Ok(s)
    }

    pub fn unsubscribe(&self, s: &Arc<Subscriber>) {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| !Arc::ptr_eq(x, s));
    }

    pub fn sessions(&self) -> usize {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// What a relay passes on of one datagram: the TS packets for its sessions, and for its
/// recorder the RTP datagram itself or (raw TS) the packets.
#[derive(Debug, PartialEq, Eq)]
pub struct Payload<'a> {
    pub ts: &'a [u8],
    /// The datagram, when it is RTP.
    pub rtp: Option<&'a [u8]>,
}

impl<'a> Payload<'a> {
    /// The datagrams the recorder gets: an RTP datagram whole; raw TS in datagrams of at most
    /// 7 packets, the most the recorder's frame track reads from one datagram
    /// (`penstock_core::track::mpegts::ts_packets`). Realigned bytes (a carried tail and the
    /// next datagram) can run to 8 packets, which the frame track would not read.
    ///
    /// A raw TS datagram is also cut before each PAT packet (PID 0): encoders write the PAT
    /// and PMT right before a key frame (ffmpeg's muxer, core's `ts::mux`), so the datagram
    /// the frame track marks as the key frame's begins with them, and a segment that starts
    /// there is a TS a player can open (docs/recording.md "Segments and retention").
    pub fn record_datagrams(&self) -> RecordDatagrams<'a> {
        match self.rtp {
            Some(d) => RecordDatagrams {
                rest: d,
                whole: true,
            },
            None => RecordDatagrams {
                rest: self.ts,
                whole: false,
            },
        }
    }
}

/// The datagrams a relay's recorder gets of one payload ([`Payload::record_datagrams`]).
#[derive(Debug, Clone)]
pub struct RecordDatagrams<'a> {
    rest: &'a [u8],
    /// RTP: the datagram whole, once.
    whole: bool,
}

impl<'a> Iterator for RecordDatagrams<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        use penstock_core::track::mpegts::TS_PACKETS_PER_DATAGRAM_MAX;
        if self.rest.is_empty() {
            return None;
        }
        let n = if self.whole {
            self.rest.len()
        } else {
            // Up to seven packets, ending before the next PAT (never before the first).
            let packets = (self.rest.len() / TS_PACKET_BYTES).min(TS_PACKETS_PER_DATAGRAM_MAX);
            let cut = (1..packets)
                .find(|&i| is_pat(&self.rest[i * TS_PACKET_BYTES..]))
                .unwrap_or(packets);
            (cut * TS_PACKET_BYTES).max(self.rest.len().min(TS_PACKET_BYTES))
        };
        let (d, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(d)
    }
}

/// The longest a PAT/PMT tail is held back for the key frame that follows it (an encoder
/// writes them back to back: microseconds apart).
const PSI_HOLD: Duration = Duration::from_millis(50);

/// What a relay gives its recorder: [`Payload::record_datagrams`], and a raw TS payload's last
/// datagram held back when it begins with a PAT and has room left, to be sent with the start
/// of the next payload (the key frame the PAT and PMT announce, when the sender cut its
/// datagrams between them) or alone after [`PSI_HOLD`]. Bytes are never reordered, only
/// regrouped (one copy of at most seven packets per PAT).
#[derive(Debug, Default)]
struct RecordFeed {
    held: Vec<u8>,
    held_at: Option<Instant>,
    scratch: Vec<u8>,
}

impl RecordFeed {
    fn push(&mut self, p: &Payload<'_>, now: Instant, send: &mut dyn FnMut(&[u8])) {
        use penstock_core::track::mpegts::TS_PACKETS_PER_DATAGRAM_MAX;
        if p.rtp.is_some() {
            self.flush(send);
            for d in p.record_datagrams() {
                send(d);
            }
            return;
        }
        let ts: &[u8] = if self.held.is_empty() {
            p.ts
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(&self.held);
            self.scratch.extend_from_slice(p.ts);
            self.held.clear();
            self.held_at = None;
            &self.scratch
        };
        let mut it = Payload { ts, rtp: None }.record_datagrams().peekable();
        while let Some(d) = it.next() {
            if it.peek().is_none()
                && is_pat(d)
                && d.len() < TS_PACKETS_PER_DATAGRAM_MAX * TS_PACKET_BYTES
            {
                self.held.extend_from_slice(d);
                self.held_at = Some(now);
            } else {
                send(d);
            }
        }
    }

    /// Sends what was held longer than [`PSI_HOLD`].
    fn flush_stale(&mut self, now: Instant, send: &mut dyn FnMut(&[u8])) {
        if self
            .held_at
            .is_some_and(|t| now.saturating_duration_since(t) >= PSI_HOLD)
        {
            self.flush(send);
        }
    }

    fn flush(&mut self, send: &mut dyn FnMut(&[u8])) {
        if !self.held.is_empty() {
            send(&self.held);
            self.held.clear();
        }
        self.held_at = None;
    }
}

/// Whether the TS packet at the start of `p` is on PID 0 (the PAT).
fn is_pat(p: &[u8]) -> bool {
    p.len() >= 3 && p[0] == 0x47 && (u16::from(p[1] & 0x1f) << 8 | u16::from(p[2])) == 0
}

/// Reads a live source's datagrams: RTP carrying TS (RFC 2250), or raw TS, which a sender may
/// cut anywhere (ffmpeg's `udp://` without `pkt_size`: 1,472-byte datagrams) and which is put
/// back into whole packets ([`penstock_core::ts::align`]).
#[derive(Debug)]
pub struct DatagramReader {
    format: LiveFormat,
    realign: penstock_core::ts::align::Realigner,
    scratch: Vec<u8>,
}

impl DatagramReader {
    pub fn new(format: LiveFormat) -> Self {
        Self {
            format,
            realign: Default::default(),
            scratch: Vec::with_capacity(2 * 65536),
        }
    }

    /// Bytes of raw TS thrown away so far: they belonged to no whole packet (a loss, garbage).
    pub fn dropped_bytes(&self) -> u64 {
        self.realign.dropped_bytes
    }

    /// The datagram's payload, or `None` when it completes no packet (garbage, or the first
    /// part of a packet that the next datagram completes).
    pub fn read<'a>(&'a mut self, d: &'a [u8]) -> Option<Payload<'a>> {
        use penstock_core::ts::align::is_aligned;
        let rtp = || {
            RtpHeader::parse(d)
                .map(|(_, p)| p)
                .filter(|p| is_aligned(p))
                .map(|ts| Payload { ts, rtp: Some(d) })
        };
        match self.format {
            LiveFormat::Rtp => rtp(),
            LiveFormat::Ts => self.raw(d),
            // A raw TS datagram starts with 0x47, which is not RTP version 2 (0x80..).
            LiveFormat::Auto => {
                if self.realign.carried() == 0 && is_aligned(d) {
                    Some(Payload { ts: d, rtp: None })
                } else if let Some(p) = rtp() {
                    Some(p)
                } else {
                    self.raw(d)
                }
            }
        }
    }

    fn raw<'a>(&'a mut self, d: &'a [u8]) -> Option<Payload<'a>> {
        let Self {
            realign, scratch, ..
        } = self;
        let ts = realign.push(d, scratch);
        (!ts.is_empty()).then_some(Payload { ts, rtp: None })
    }
}

/// A started source: the shared part and its threads.
#[derive(Debug)]
pub struct LiveRunning {
    pub source: Arc<LiveSource>,
    pub threads: Vec<JoinHandle<()>>,
}

/// Where `record` records `name`: the file, or `DIR/NAME.ts` in an existing directory.
fn record_file(record: &std::path::Path, name: &str) -> PathBuf {
    if record.is_dir() {
        record.join(format!("{}.ts", name.replace('/', "_")))
    } else {
        record.to_path_buf()
    }
}

/// How often a segmented recording's retention is checked between rotations.
const RETENTION_EVERY: Duration = Duration::from_secs(5);

/// Where a relay's datagrams come from: its UDP socket, or (a publish source) the Unix
/// datagram pair its publisher's connection feeds.
#[derive(Debug)]
enum Input {
    Udp(UdpSocket),
    Publish(UnixDatagram),
}

impl Input {
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Input::Udp(s) => s.recv(buf),
            Input::Publish(s) => s.recv(buf),
        }
    }
}

impl AsFd for Input {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Input::Udp(s) => s.as_fd(),
            Input::Publish(s) => s.as_fd(),
        }
    }
}

/// Binds the source's socket (or, for a publish source, makes its feed), starts its recorder
/// (if configured) and its thread.
pub(crate) fn start(
    name: &str,
    cfg: &LiveConfig,
    stop: Arc<AtomicBool>,
    hls: &crate::hls::Hls,
) -> Result<LiveRunning, crate::ServerError> {
    let (socket, publish) = if cfg.is_publish() {
        let (feed, theirs) = UnixDatagram::pair()?;
        feed.set_nonblocking(true)?;
        theirs.set_nonblocking(true)?;
        // Room for a stall of the relay thread (as a UDP source's receive buffer).
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&feed, RECORD_SNDBUF_BYTES);
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&theirs, RECORD_SNDBUF_BYTES);
        (
            Input::Publish(theirs),
            Some(PublishSlot {
                publishers: cfg.publishers.clone(),
                cfg: cfg.clone(),
                feed,
                publisher: Mutex::new(None),
                ended: AtomicBool::new(false),
                dropped: AtomicU64::new(0),
            }),
        )
    } else {
        let addr = cfg
            .listen_addr()
            .map_err(|e| crate::ServerError::Config(crate::ConfigError::Invalid(e)))?;
        let socket = UdpSocket::bind(addr).map_err(|source| crate::ServerError::Bind {
            what: "rtsp live source",
            addr: addr.to_string(),
            source,
        })?;
        // A large receive buffer absorbs a stall of the thread (as `penstock record` asks).
        if rustix::net::sockopt::set_socket_recv_buffer_size_force(&socket, 8 << 20).is_err() {
            let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&socket, 8 << 20);
        }
        socket.set_nonblocking(true)?;
        (Input::Udp(socket), None)
    };
    let mut threads = Vec::new();
    let mut recorder = None;
    let mut record_stats = None;
    // Where the recording goes: one file, or segments.
    let dst = cfg.record.as_ref().map(|r| match r {
        LiveRecord::File(f) => penstock_driver::record::RecordDst::File(record_file(f, name)),
        LiveRecord::Segments(s) => {
            let stats = Arc::new(penstock_driver::record::RecordStats::default());
            record_stats = Some(stats.clone());
            penstock_driver::record::RecordDst::Segments(penstock_driver::record::SegmentsDst {
                dir: s.dir_of(name),
                policy: s.policy(),
                retention_every: RETENTION_EVERY,
                stats,
            })
        }
    });
    // `/live/NAME/index.m3u8` (docs/hls.md "Live and DVR"): fed by the recorder's syncs.
    let feed = hls.register_live(
        name,
        match (&dst, &record_stats) {
            (Some(penstock_driver::record::RecordDst::File(p)), _) => {
                crate::hls_live::LiveMedia::File(p.clone())
            }
            (Some(_), Some(stats)) => crate::hls_live::LiveMedia::Segments(stats.clone()),
            _ => crate::hls_live::LiveMedia::None,
        },
    );
    if let Some(dst) = dst {
        let (ours, theirs) = UnixDatagram::pair()?;
        ours.set_nonblocking(true)?;
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&ours, RECORD_SNDBUF_BYTES);
        let stop_rec = stop.clone();
        let label = name.to_string();
        threads.push(
            std::thread::Builder::new()
                .name("rtsp-live-rec".into())
                .spawn(move || {
                    let rc = penstock_driver::record::RecordConfig::default();
                    let what = dst.tracks_prefix().display().to_string();
                    match penstock_driver::record::record_to(
                        theirs.as_fd(),
                        dst,
                        &rc,
                        &stop_rec,
                        &mut |p| feed.handle_sync(p),
                    ) {
                        Ok(r) => tracing::info!(
                            "live {label}: recorded {} datagrams, {} bytes into {what}",
                            r.packets,
                            r.media_bytes,
                        ),
                        Err(e) => tracing::error!("live {label}: recording stopped: {e}"),
                    }
                })?,
        );
        recorder = Some(ours);
    }
    let source = Arc::new(LiveSource {
        name: name.to_string(),
        counts: LiveCounts::default(),
        subscribers: Mutex::new(Vec::new()),
        queue_max: cfg.queue_datagrams_max,
        idle: AtomicBool::new(true),
        publish,
        record_stats,
    });
    let src = source.clone();
    let format = cfg.format;
    let idle_timeout = cfg.idle_timeout();
    threads.push(
        std::thread::Builder::new()
            .name("rtsp-live".into())
            .spawn(move || relay(&src, &socket, recorder, format, idle_timeout, &stop))?,
    );
    Ok(LiveRunning { source, threads })
}

fn relay(
    src: &LiveSource,
    socket: &Input,
    recorder: Option<UnixDatagram>,
    format: LiveFormat,
    idle_timeout: Duration,
    stop: &AtomicBool,
) {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut buf = vec![0u8; 65536];
    let mut reader = DatagramReader::new(format);
    let mut out = Vec::with_capacity(RTP_HEADER_BYTES + TS_PER_RTP * TS_PACKET_BYTES);
    let mut last_rx = Instant::now();
    let mut pending = false;
    let mut record_feed = RecordFeed::default();
    while !stop.load(Ordering::Acquire) {
        let wait = if pending { RETRY } else { POLL_MAX };
        let t = Timespec {
            tv_sec: 0,
            tv_nsec: wait.as_nanos() as i64,
        };
        let _ = rustix::event::poll(&mut [PollFd::new(socket, PollFlags::IN)], Some(&t));
        let subs: Vec<Arc<Subscriber>> = src
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut drained = false;
        for _ in 0..RECV_PER_TURN_MAX {
            let n = match socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("live {}: receive: {e}", src.name);
                    break;
                }
            };
            let d = &buf[..n];
            src.counts.datagrams_in.fetch_add(1, Ordering::AcqRel);
            let dropped = reader.dropped_bytes();
            let payload = reader.read(d);
            let Some(p) = payload else {
                // A partial packet waiting for its rest is not garbage; bytes thrown away are.
                if reader.dropped_bytes() > dropped || format == LiveFormat::Rtp {
                    src.counts.garbage.fetch_add(1, Ordering::AcqRel);
                }
                continue;
            };
            last_rx = Instant::now();
            src.idle.store(false, Ordering::Release);
            if let Some(r) = &recorder {
                record_feed.push(&p, Instant::now(), &mut |d| {
                    if r.send(d).is_err() {
                        src.counts.record_dropped.fetch_add(1, Ordering::AcqRel);
                    }
                });
            }
            let ts = p.ts;
            let now = penstock_driver::clock::now();
            for s in &subs {
                let at_ns = now.saturating_duration_since(s.anchor).as_nanos() as u64;
                for group in ts.chunks(TS_PER_RTP * TS_PACKET_BYTES) {
                    if s.offer(at_ns, group) {
                        src.counts.session_dropped.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        }
        if let Some(r) = &recorder {
            record_feed.flush_stale(Instant::now(), &mut |d| {
                if r.send(d).is_err() {
                    src.counts.record_dropped.fetch_add(1, Ordering::AcqRel);
                }
            });
        }
        pending = false;
        for s in &subs {
            pending |= s.drain(&mut out);
        }
        // A publisher that left ends the source at once, after what it sent.
        let unpublished = drained
            && src
                .publish
                .as_ref()
                .is_some_and(|p| p.ended.swap(false, Ordering::AcqRel));
        if unpublished {
            tracing::info!("live {}: the publisher left, sessions end", src.name);
            src.idle.store(true, Ordering::Release);
            for s in &subs {
                s.ended.store(true, Ordering::Release);
            }
        }
        if !src.idle.load(Ordering::Acquire) && last_rx.elapsed() > idle_timeout {
            // The source has ended: its sessions get their BYE from the reaper.
            src.idle.store(true, Ordering::Release);
            tracing::info!("live {}: idle for {idle_timeout:?}, sessions end", src.name);
            for s in &subs {
                s.ended.store(true, Ordering::Release);
            }
        }
    }
    // What was held for a key frame that never came (best effort: the recorder stops too).
    if let Some(r) = &recorder {
        record_feed.flush(&mut |d| {
            let _ = r.send(d);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n * 188];
        for p in v.chunks_mut(188) {
            p[0] = 0x47;
            p[3] = 0x10; // payload only (adaptation_field_control 01)
        }
        v
    }

    fn ts_of(format: LiveFormat, d: &[u8]) -> Option<Vec<u8>> {
        DatagramReader::new(format).read(d).map(|p| p.ts.to_vec())
    }

    #[test]
    fn raw_ts_rtp_ts_and_garbage_are_told_apart() {
        let raw = ts(7);
        assert_eq!(ts_of(LiveFormat::Auto, &raw).unwrap().len(), 1316);
        assert_eq!(ts_of(LiveFormat::Ts, &raw).unwrap().len(), 1316);
        assert!(ts_of(LiveFormat::Rtp, &raw).is_none());
        let mut rtp = Packetizer::mp2t(7).header(0, 0).to_vec();
        rtp.extend_from_slice(&ts(3));
        assert_eq!(ts_of(LiveFormat::Auto, &rtp).unwrap(), ts(3));
        assert_eq!(ts_of(LiveFormat::Rtp, &rtp).unwrap(), ts(3));
        // The recorder gets the RTP datagram whole.
        let mut r = DatagramReader::new(LiveFormat::Auto);
        let got: Vec<&[u8]> = r.read(&rtp).unwrap().record_datagrams().collect();
        assert_eq!(got, [&rtp[..]]);
        // Told it is raw TS, the reader finds the packets and drops the RTP header's bytes.
        let mut r = DatagramReader::new(LiveFormat::Ts);
        assert_eq!(r.read(&rtp).unwrap().ts, &ts(3)[..]);
        assert_eq!(r.dropped_bytes(), 12);
        for bad in [
            &b"hello"[..],
            &[][..],
            &[0x80u8; 200][..],
            // The start of a packet: the next datagram may complete it.
            &[0x47u8; 187][..],
        ] {
            assert!(ts_of(LiveFormat::Auto, bad).is_none(), "{bad:?}");
        }
        let mut wrong = ts(2);
        wrong[188] = 0;
        assert_eq!(
            ts_of(LiveFormat::Auto, &wrong),
            None,
            "no packet can be checked whole"
        );
    }

    #[test]
    fn raw_ts_cut_anywhere_is_passed_on_as_whole_packets() {
        let stream = ts(40);
        for format in [LiveFormat::Auto, LiveFormat::Ts] {
            let mut r = DatagramReader::new(format);
            let (mut got, mut recorded) = (Vec::new(), Vec::new());
            for d in stream.chunks(1472) {
                if let Some(p) = r.read(d) {
                    assert_eq!(p.ts.len() % 188, 0);
                    assert_eq!(p.ts[0], 0x47);
                    got.extend_from_slice(p.ts);
                    for d in p.record_datagrams() {
                        // The frame track reads 1..=7 packets a datagram.
                        assert!(penstock_core::track::mpegts::ts_packets(d).is_some());
                        recorded.extend_from_slice(d);
                    }
                }
            }
            assert_eq!(got, stream, "{format:?}");
            assert_eq!(recorded, stream, "{format:?}");
            assert_eq!(r.dropped_bytes(), 0);
        }
    }

    /// TS packets on the given PIDs.
    fn ts_pids(pids: &[u16]) -> Vec<u8> {
        let mut v = ts(pids.len());
        for (p, pid) in v.chunks_mut(188).zip(pids) {
            p[1] = (pid >> 8) as u8;
            p[2] = *pid as u8;
        }
        v
    }

    fn pid_of(p: &[u8]) -> u16 {
        (u16::from(p[1] & 0x1f) << 8) | u16::from(p[2])
    }

    #[test]
    fn the_recorder_gets_datagrams_beginning_with_the_pat_before_a_key_frame() {
        let t0 = Instant::now();
        let mut feed = RecordFeed::default();
        let mut sent: Vec<Vec<u8>> = Vec::new();
        // A sender's datagrams: [v v v v v PAT PMT] then [v(key) v v v v v v]: the PAT and
        // PMT ended the first one.
        let a = ts_pids(&[256, 256, 256, 256, 256, 0, 4096]);
        let b = ts_pids(&[256; 7]);
        for d in [&a, &b] {
            let p = Payload { ts: d, rtp: None };
            feed.push(&p, t0, &mut |d| sent.push(d.to_vec()));
        }
        let pids: Vec<Vec<u16>> = sent
            .iter()
            .map(|d| d.chunks(188).map(pid_of).collect())
            .collect();
        assert_eq!(
            pids,
            vec![
                vec![256; 5],
                vec![0, 4096, 256, 256, 256, 256, 256],
                vec![256, 256]
            ],
            "cut before the PAT, which went with the packets after it"
        );
        assert_eq!(
            sent.concat(),
            [a.clone(), b.clone()].concat(),
            "nothing reordered"
        );
        // A PAT/PMT tail with nothing after it goes alone once it is stale.
        sent.clear();
        let p = Payload { ts: &a, rtp: None };
        feed.push(&p, t0, &mut |d| sent.push(d.to_vec()));
        feed.flush_stale(t0 + PSI_HOLD / 2, &mut |d| sent.push(d.to_vec()));
        assert_eq!(sent.len(), 1, "held for the key frame");
        feed.flush_stale(t0 + PSI_HOLD, &mut |d| sent.push(d.to_vec()));
        assert_eq!(sent.concat(), a, "sent after PSI_HOLD");
    }

    #[test]
    fn a_full_queue_drops_its_oldest_and_numbers_leave_a_gap() {
        let (a, _b) = UnixDatagram::pair().unwrap();
        let src = LiveSource {
            name: "t".into(),
            counts: LiveCounts::default(),
            subscribers: Mutex::new(Vec::new()),
            queue_max: 2,
            idle: AtomicBool::new(false),
            publish: None,
            record_stats: None,
        };
        let s = src
            .subscribe(a.as_fd(), Packetizer::mp2t(1), CoreInstant::from_nanos(0))
            .unwrap();
        assert!(!s.offer(0, &ts(1)));
        assert!(!s.offer(0, &ts(1)));
        assert!(s.offer(0, &ts(1)));
        assert_eq!(s.dropped.load(Ordering::Acquire), 1);
        let q = s.queue.lock().unwrap();
        assert_eq!(q.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);
        drop(q);
        s.pause();
        assert!(!s.offer(0, &ts(1)), "a paused session takes nothing");
        assert!(s.queue.lock().unwrap().is_empty());
        assert_eq!(src.sessions(), 1);
        src.unsubscribe(&s);
        assert_eq!(src.sessions(), 0);
    }
}
