//! RTSP of plain MP4 files (docs/rtsp.md, "MP4 files"; issue 36 item 3): the movie's sample
//! index (`penstock_core::mp4`), one RTP session per track (H.264 RFC 6184, H.265 RFC 7798,
//! AAC RFC 3640 — `penstock_core::rtp::mp4`), each SETUP by its `trackID=N` control URL into
//! the same RTSP session.
//!
//! **One session-level sender, not an engine stream per track.** The tracks of a movie are
//! interleaved in the file and must leave on one clock (lip-sync): a thread per played
//! session walks the tracks' samples in decode-time order, sleeps until each is due
//! (`anchor + its decode time − the start's presentation time`), reads it with one `pread`
//! and sends its RTP packets with `sendmsg` — three iovecs each: the 12-byte RTP header, the
//! payload-format prefix (FU or AU header) and the sample's bytes; no packet buffer. It is a
//! **copying sender**: the sample passes through user space once (the read). The engine's
//! zero-copy path (O_DIRECT into registered buffers, SEND_ZC) serves MPEG-TS only so far.
//!
//! **Clock.** Every track's RTP time is its own random base plus the sample's presentation
//! time (edit list applied) at the payload's clock; each track's RTCP sender report maps the
//! wall clock (NTP) to "the presentation time now" on the same anchor, so a player lines the
//! tracks up (lip-sync) from the reports.
//!
//! Admission, limits and metrics are the TS path's: SETUP of the first track reserves the
//! movie's rate (all tracks' samples as one unit plan, class `rt`) with the engine's
//! admission, held until TEARDOWN; the session counts against `sessions_max` and
//! `sessions_per_address_max`.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use penstock_core::mp4::{Movie, Mp4Limits, TrackKind, Trick, TrickFrame};
use penstock_core::rtp::RtpHeader;
use penstock_core::rtp::mp4::{self as rtp_mp4, Piece, TrackRtp};
use penstock_core::rtp::rtcp::{SenderInfo, write_sender_report};
use penstock_core::schedule::UnitPlan;
use penstock_core::stream::Extent;
use penstock_core::stream::plan::Pacing;
use penstock_driver::{DiskClass, StreamSpec};

/// Bytes of an RTP payload at most (a 1500-byte Ethernet MTU less IPv6 (40), UDP (8) and the
/// RTP header (12), with room to spare).
pub const PAYLOAD_BYTES_MAX: usize = 1400;
/// How long the sender sleeps at most before it looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);
/// From PLAY to the first sample's time: the reply leaves first.
const START_DELAY: Duration = Duration::from_millis(20);
/// A sender report per track at this interval (and one at the start, for lip-sync at once).
const SR_INTERVAL: Duration = Duration::from_secs(5);
/// Whether a path names an MP4 file (by its extension).
pub(crate) fn is_mp4_path(path: &str) -> bool {
    let p = path.to_ascii_lowercase();
    [".mp4", ".m4v", ".m4a", ".mov"]
        .iter()
        .any(|e| p.ends_with(e))
}

/// A movie served over RTSP: its sample index and each track's RTP description.
#[derive(Debug)]
pub(crate) struct Mp4Media {
    pub movie: Movie,
    pub rtp: Vec<TrackRtp>,
    pub duration_ns: u64,
}

impl Mp4Media {
    /// The movie behind `file` (moov read with one range read and indexed), or why not (the
    /// 415's text: a truncated moov, a codec other than H.264/H.265/AAC named).
    pub fn open(file: &File) -> Result<Mp4Media, String> {
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let movie = penstock_driver::media::mp4_movie(file, len, &Mp4Limits::default())
            .map_err(|e| e.to_string())?;
        let rtp: Vec<TrackRtp> = movie
            .tracks
            .iter()
            .enumerate()
            .map(|(i, t)| TrackRtp::of(t, i))
            .collect();
        let duration_ns = movie
            .tracks
            .iter()
            .zip(&rtp)
            .map(|(t, r)| {
                let end =
                    t.end_dts as i64 + i64::from(t.samples.last().map_or(0, |s| s.cts_offset));
                r.presentation_ns(end).max(0) as u64
            })
            .max()
            .unwrap_or(0);
        Ok(Mp4Media {
            movie,
            rtp,
            duration_ns,
        })
    }

    /// The SDP (`control`: an absolute base and a query, for a signed URL).
    pub fn sdp(
        &self,
        session_id: u64,
        origin: std::net::IpAddr,
        control: Option<(&str, &str)>,
    ) -> String {
        let tracks: Vec<_> = self
            .movie
            .tracks
            .iter()
            .zip(self.rtp.iter().copied())
            .collect();
        penstock_core::rtsp::mp4_sdp(&tracks, session_id, origin, self.duration_ns, control)
    }

    /// The index of the track with id `id`.
    pub fn track_index(&self, id: u32) -> Option<usize> {
        self.movie.tracks.iter().position(|t| t.id == id)
    }

    /// What admission is asked for: every track's samples, merged by decode time, as one
    /// unit plan of class `rt` (the movie's rate, its peaks included).
    pub fn admission_spec(&self) -> StreamSpec {
        let mut units: Vec<UnitPlan> = Vec::new();
        for (t, r) in self.movie.tracks.iter().zip(&self.rtp) {
            let first = t.samples.first().map_or(0, |s| s.dts as i64);
            for s in &t.samples {
                let ns = r.presentation_ns(s.dts as i64 - first + r.media_time as i64);
                units.push(UnitPlan {
                    offset_ns: ns.max(0) as u64,
                    size_bytes: s.size.max(1),
                });
            }
        }
        units.sort_by_key(|u| u.offset_ns);
        units_spec(units)
    }

    /// What admission is asked for a trick play: the key frames it sends, when they are due
    /// (`penstock_core::mp4::trick`).
    pub fn trick_spec(&self, frames: &[TrickFrame]) -> StreamSpec {
        let samples = &self.movie.tracks[self.lead()].samples;
        units_spec(
            frames
                .iter()
                .map(|f| UnitPlan {
                    offset_ns: f.due_ns,
                    size_bytes: samples[f.sample].size.max(1),
                })
                .collect(),
        )
    }

    /// The track a seek and a trick play follow: the first video track (else the first).
    pub fn lead(&self) -> usize {
        self.movie
            .tracks
            .iter()
            .position(|t| t.kind == TrackKind::Video)
            .unwrap_or(0)
    }

    /// The sample of the lead track presented at or before `from_ns` (npt), for a trick
    /// play's start (the planner snaps it to the sync sample at or before it).
    pub fn lead_sample_at(&self, from_ns: u64) -> usize {
        let lead = self.lead();
        let (t, r) = (&self.movie.tracks[lead], &self.rtp[lead]);
        let target =
            r.media_time as u128 + u128::from(from_ns) * u128::from(r.timescale) / 1_000_000_000;
        let dts = u64::try_from(target).unwrap_or(u64::MAX);
        t.samples
            .partition_point(|s| s.dts <= dts)
            .saturating_sub(1)
    }

    /// Where a playback from `from_ns` (npt; `None` or 0: the start, every sample) begins: per track the first
    /// sample to send, and the presentation time (ns) the playback starts at. Video starts
    /// at its sync sample at or before `from_ns`; the other tracks at their first sample
    /// presented at or after that time.
    pub fn start(&self, from_ns: Option<u64>) -> (Vec<usize>, i64) {
        let from = from_ns.unwrap_or(0);
        let tracks = &self.movie.tracks;
        let lead = self.lead();
        let pts = |i: usize, k: usize| {
            let s = &tracks[i].samples[k];
            self.rtp[i].presentation_ns(s.dts as i64 + i64::from(s.cts_offset))
        };
        let mut firsts = vec![0usize; tracks.len()];
        if from_ns.unwrap_or(0) == 0 {
            // From the start: every sample of every track (an AAC priming frame before
            // presentation 0 included), the clock from the earliest.
            let start_ns = (0..tracks.len())
                .filter(|&i| !tracks[i].samples.is_empty())
                .map(|i| {
                    pts(i, 0).min(self.rtp[i].presentation_ns(tracks[i].samples[0].dts as i64))
                })
                .min()
                .unwrap_or(0)
                .min(0);
            return (firsts, start_ns);
        }
        let mut start_ns = 0i64;
        if let Some(t) = tracks.get(lead)
            && !t.samples.is_empty()
        {
            let r = &self.rtp[lead];
            let target =
                r.media_time as u128 + u128::from(from) * u128::from(r.timescale) / 1_000_000_000;
            let k = t.sync_at_or_before(u64::try_from(target).unwrap_or(u64::MAX));
            firsts[lead] = k;
            start_ns = pts(lead, k);
        }
        for (i, t) in tracks.iter().enumerate() {
            if i == lead {
                continue;
            }
            firsts[i] = (0..t.samples.len())
                .find(|&k| pts(i, k) >= start_ns)
                .unwrap_or(t.samples.len());
        }
        (firsts, start_ns)
    }
}

/// A unit plan as an admission request of class `rt`.
fn units_spec(units: Vec<UnitPlan>) -> StreamSpec {
    let bytes: u64 = units.iter().map(|u| u64::from(u.size_bytes)).sum();
    StreamSpec {
        extent: Extent {
            offset: 0,
            length: Some(bytes.max(1)),
        },
        pacing: Pacing::Units(units.into()),
        class: Some(DiskClass::Rt),
        ..StreamSpec::opened()
    }
}

/// A trick play's sending: the lead track's key frames (`penstock_core::mp4::trick`), stamped
/// from `ts_start` on by their due times.
#[derive(Debug, Clone)]
pub(crate) struct TrickSend {
    /// The lead track's place among the session's tracks.
    pub slot: usize,
    pub frames: Vec<TrickFrame>,
    /// The RTP time of the first frame.
    pub ts_start: u32,
}

/// Where a track's RTP goes.
#[derive(Debug)]
pub(crate) enum Out {
    /// RTP to the client's port (a connected socket); RTCP from the RTP port + 1 to
    /// `client_rtcp`.
    Udp {
        rtp: UdpSocket,
        rtcp: UdpSocket,
        client_rtcp: SocketAddr,
    },
    /// Interleaved: each packet one datagram into the connection's pair, which the
    /// connection thread frames on the track's channels (RTCP by its packet type).
    Pair(UnixDatagram),
}

impl Out {
    fn rtp_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Out::Udp { rtp, .. } => rtp.as_fd(),
            Out::Pair(p) => p.as_fd(),
        }
    }

    fn send_rtcp(&self, packet: &[u8]) {
        // RTCP is best effort: a report lost is sent again in SR_INTERVAL.
        let _ = match self {
            Out::Udp {
                rtcp, client_rtcp, ..
            } => rtcp.send_to(packet, client_rtcp).map(|_| ()),
            Out::Pair(p) => p.send(packet).map(|_| ()),
        };
    }

    /// Receiver reports waiting on the RTCP socket (UDP): drained, and whether any came.
    fn drain_reports(&self) -> bool {
        let Out::Udp { rtcp, .. } = self else {
            return false;
        };
        let mut buf = [0u8; 1500];
        let mut any = false;
        while let Ok(n) = rtcp.recv(&mut buf) {
            any |= n > 0;
        }
        any
    }
}

/// One track of a session: its identity on RTP and where the next playback resumes.
#[derive(Debug)]
pub(crate) struct Mp4Track {
    /// Its index in the movie's tracks.
    pub index: usize,
    /// Its SETUP URL (RTP-Info's `url`).
    pub url: String,
    pub ssrc: u32,
    /// RTP time of presentation 0.
    pub ts_base: u32,
    pub next_seq: u16,
    /// The first sample not sent (where a PLAY without Range resumes).
    pub next_sample: usize,
    /// Where its packets go (taken by the sender while it plays, given back when it stops).
    pub out: Option<Out>,
}

impl Mp4Track {
    /// Track `index` set up at `url` with the RTP identity of `base` (its SSRC, first
    /// sequence number and RTP time), sending to `out`, from its first sample.
    pub fn new(
        index: usize,
        url: String,
        base: &penstock_core::rtp::Packetizer,
        out: Out,
    ) -> Mp4Track {
        Mp4Track {
            index,
            url,
            ssrc: base.ssrc,
            ts_base: base.timestamp_start,
            next_seq: base.sequence_start,
            next_sample: 0,
            out: Some(out),
        }
    }
}

/// What the sender hands back when it stops: per track the next sequence number and sample.
type Progress = Vec<(u16, usize)>;

/// What a sender thread returns: where each track stopped, its outputs, and (a trick play)
/// the last key frame it sent.
type Stopped = (Progress, Vec<Out>, Option<usize>);

/// A playing sender thread.
#[derive(Debug)]
pub(crate) struct Sender {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Stopped>,
}

/// An MP4 session's media and tracks.
#[derive(Debug)]
pub(crate) struct Mp4Session {
    pub media: Arc<Mp4Media>,
    pub file: File,
    pub tracks: Vec<Mp4Track>,
    pub sender: Option<Sender>,
    /// Set by the sender when a receiver report arrives (the reaper counts the client alive).
    pub alive: Arc<AtomicBool>,
    /// Set by the sender when every track reached its end.
    pub ended: Arc<AtomicBool>,
    /// RTP payload bytes the sender threads sent (the session's access-log line).
    pub sent_bytes: Arc<AtomicU64>,
    pub cname: String,
    pub rtcp_interval: Duration,
    /// The scale of the playing (or last) PLAY.
    pub trick: Trick,
    /// What the session's admission reservation was asked for (`None`: it holds none — a
    /// pause past `pause_hold_ms` or a SETUP not played in time gave it back).
    pub reserved: Option<Trick>,
    /// Where a trick play stopped (the lead track's sample of its last key frame): the next
    /// PLAY without Range starts there.
    pub trick_stopped_at: Option<usize>,
    /// When PAUSE stopped the sender (the reaper gives the reservation back past
    /// `pause_hold_ms`).
    pub paused_at: Option<Instant>,
}

impl Mp4Session {
    /// Stops the sender (if any), taking back its outputs and where each track stopped.
    pub fn stop(&mut self) {
        let Some(s) = self.sender.take() else { return };
        s.stop.store(true, Ordering::Release);
        match s.handle.join() {
            Ok((progress, outs, trick_at)) => {
                for ((t, (seq, next)), out) in self.tracks.iter_mut().zip(progress).zip(outs) {
                    t.next_seq = seq;
                    t.next_sample = next;
                    t.out = Some(out);
                }
                if trick_at.is_some() {
                    self.trick_stopped_at = trick_at;
                }
            }
            Err(_) => tracing::warn!("rtsp mp4 sender panicked"),
        }
    }

    /// Starts sending from each track's `next_sample`, the first sample due at
    /// `start_ns` (presentation time) `START_DELAY` from now — or, with `trick`, the lead
    /// track's key frames only, the first due `START_DELAY` from now. Returns per track the
    /// first sequence number and RTP time.
    pub fn play(
        &mut self,
        start_ns: i64,
        send_timeout: Duration,
        trick: Option<TrickSend>,
    ) -> io::Result<Vec<(u16, u32)>> {
        self.stop();
        let mut outs = Vec::new();
        for t in &mut self.tracks {
            outs.push(
                t.out
                    .take()
                    .ok_or_else(|| io::Error::other("track output missing"))?,
            );
        }
        for o in &outs {
            if let Out::Pair(p) = o {
                p.set_write_timeout(Some(send_timeout))?;
            }
        }
        let file = self.file.try_clone()?;
        let media = self.media.clone();
        let info: Vec<(u16, u32)> = self
            .tracks
            .iter()
            .enumerate()
            .map(|(k, t)| {
                if let Some(x) = trick.as_ref().filter(|x| x.slot == k) {
                    return (t.next_seq, x.ts_start);
                }
                let r = &media.rtp[t.index];
                let ts = media.movie.tracks[t.index]
                    .samples
                    .get(t.next_sample)
                    .map_or(t.ts_base, |s| {
                        r.timestamp(t.ts_base, s.dts as i64 + i64::from(s.cts_offset))
                    });
                (t.next_seq, ts)
            })
            .collect();
        let plan = SendPlan {
            tracks: self
                .tracks
                .iter()
                .map(|t| (t.index, t.ssrc, t.ts_base, t.next_seq, t.next_sample))
                .collect(),
            start_ns,
            cname: self.cname.clone(),
            rtcp_interval: self.rtcp_interval,
            trick,
        };
        self.paused_at = None;
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, alive, ended) = (stop.clone(), self.alive.clone(), self.ended.clone());
        let sent_bytes = self.sent_bytes.clone();
        ended.store(false, Ordering::Release);
        let handle = std::thread::Builder::new()
            .name("rtsp-mp4".into())
            .spawn(move || {
                let flags = Flags {
                    stop: &stop2,
                    alive: &alive,
                    ended: &ended,
                    sent_bytes: &sent_bytes,
                };
                send_loop(&media, &file, plan, outs, &flags)
            })?;
        self.sender = Some(Sender { stop, handle });
        Ok(info)
    }
}

impl Drop for Mp4Session {
    fn drop(&mut self) {
        if let Some(s) = &self.sender {
            // Not joined here (the session's lock may be held): the thread sees the flag
            // within STOP_POLL (or its send timeout) and ends.
            s.stop.store(true, Ordering::Release);
        }
    }
}

struct SendPlan {
    /// Per track: index in the movie, SSRC, RTP base, next sequence number, first sample.
    tracks: Vec<(usize, u32, u32, u16, usize)>,
    start_ns: i64,
    cname: String,
    rtcp_interval: Duration,
    /// A trick play: the lead track's key frames only (the other tracks send nothing).
    trick: Option<TrickSend>,
}

fn wall_ntp() -> u64 {
    super::wall_ntp()
}

/// The sender thread: samples of all tracks in due order, each read once and sent as RTP.
/// What a sender thread shares with its session.
struct Flags<'a> {
    stop: &'a AtomicBool,
    alive: &'a AtomicBool,
    ended: &'a AtomicBool,
    sent_bytes: &'a AtomicU64,
}

fn send_loop(
    media: &Mp4Media,
    file: &File,
    plan: SendPlan,
    outs: Vec<Out>,
    flags: &Flags<'_>,
) -> Stopped {
    let Flags {
        stop,
        alive,
        ended,
        sent_bytes,
    } = *flags;
    let anchor = Instant::now() + START_DELAY;
    let mut next: Vec<usize> = plan.tracks.iter().map(|t| t.4).collect();
    let mut seq: Vec<u16> = plan.tracks.iter().map(|t| t.3).collect();
    let mut packets = vec![0u32; plan.tracks.len()];
    let mut octets = vec![0u32; plan.tracks.len()];
    let mut buf: Vec<u8> = Vec::new();
    let mut pieces: Vec<Piece> = Vec::new();
    let mut next_sr = Instant::now();
    let interval = plan
        .rtcp_interval
        .max(Duration::from_millis(100))
        .min(SR_INTERVAL);
    // The presentation time now (ns), on the playback's clock.
    let now_pres = |now: Instant| -> i64 {
        if now >= anchor {
            plan.start_ns + now.duration_since(anchor).as_nanos() as i64
        } else {
            plan.start_ns - anchor.duration_since(now).as_nanos() as i64
        }
    };
    let trick = plan.trick.as_ref();
    let send_reports = |packets: &[u32], octets: &[u32], bye: bool| {
        let pres = now_pres(Instant::now());
        let ntp = wall_ntp();
        for (k, &(i, ssrc, base, ..)) in plan.tracks.iter().enumerate() {
            let r = &media.rtp[i];
            // A trick play's clock: the lead track's RTP time runs on from its first frame's
            // with the wall clock; the other tracks send nothing (their BYE only).
            let base = match trick {
                Some(t) if t.slot == k => t.ts_start,
                Some(_) if !bye => continue,
                _ => base,
            };
            let rtp_time = base.wrapping_add(r.rtp_ticks(pres) as u32);
            let info = SenderInfo {
                ntp,
                rtp_timestamp: rtp_time,
                packets: packets[k],
                octets: octets[k],
            };
            let mut buf = [0u8; 600];
            let bye = bye.then_some("end of media");
            if let Ok(n) = write_sender_report(ssrc, &plan.cname, &info, bye, &mut buf) {
                outs[k].send_rtcp(&buf[..n]);
            }
        }
    };
    let mut failed = false;
    // A trick play: the next of its frames, and the last sent.
    let mut trick_pos = 0usize;
    let mut trick_sent: Option<usize> = None;
    loop {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let now = Instant::now();
        if now >= next_sr {
            send_reports(&packets, &octets, false);
            next_sr = now + interval;
        }
        if outs.iter().any(Out::drain_reports) {
            alive.store(true, Ordering::Release);
        }
        // The track whose next sample is due first (by decode time), or a trick play's
        // next key frame: (the track's slot, when it is due, its sample).
        let mut best: Option<(usize, i64, usize)> = None;
        if let Some(t) = trick {
            best = t
                .frames
                .get(trick_pos)
                .map(|f| (t.slot, f.due_ns as i64, f.sample));
        } else {
            for (k, &(i, ..)) in plan.tracks.iter().enumerate() {
                if let Some(s) = media.movie.tracks[i].samples.get(next[k]) {
                    let due = media.rtp[i].presentation_ns(s.dts as i64);
                    if best.is_none_or(|(_, d, _)| due < d) {
                        best = Some((k, due, next[k]));
                    }
                }
            }
        }
        let Some((k, due_ns, sample)) = best else {
            // Every track at its end: the last reports with a BYE, after the last packets
            // had time to drain (as the TS path's BYE_DELAY).
            let until = Instant::now() + Duration::from_millis(500);
            while Instant::now() < until && !stop.load(Ordering::Acquire) {
                std::thread::sleep(STOP_POLL);
            }
            send_reports(&packets, &octets, true);
            ended.store(true, Ordering::Release);
            break;
        };
        let wait_ns = due_ns - now_pres(now);
        if wait_ns > 0 {
            std::thread::sleep(
                Duration::from_nanos(wait_ns as u64).min(STOP_POLL).min(
                    next_sr
                        .saturating_duration_since(now)
                        .max(Duration::from_millis(1)),
                ),
            );
            continue;
        }
        let (i, ssrc, base, ..) = plan.tracks[k];
        let track = &media.movie.tracks[i];
        let r = &media.rtp[i];
        let s = track.samples[sample];
        let ts = match trick {
            Some(t) => {
                trick_pos += 1;
                trick_sent = Some(sample);
                t.ts_start.wrapping_add(r.rtp_ticks(due_ns) as u32)
            }
            None => {
                next[k] += 1;
                r.timestamp(base, s.dts as i64 + i64::from(s.cts_offset))
            }
        };
        buf.resize(s.size as usize, 0);
        if let Err(e) = file.read_exact_at(&mut buf, s.offset) {
            tracing::warn!("rtsp mp4: reading sample at {}: {e}", s.offset);
            break;
        }
        if let Err(e) = rtp_mp4::packetize(r.format, &buf, PAYLOAD_BYTES_MAX, &mut pieces) {
            // A sample that cannot be cut is skipped (the player sees a gap in time only).
            tracing::debug!("rtsp mp4: track {} sample {sample}: {e}", track.id);
            continue;
        }
        for packet in rtp_mp4::packets(&pieces) {
            let h = RtpHeader {
                marker: packet.last().is_some_and(|p| p.marker),
                payload_type: r.payload_type,
                sequence: seq[k],
                timestamp: ts,
                ssrc,
            }
            .encode();
            // The RTP header, then each piece's prefix and its bytes of the sample.
            let mut iov = Vec::with_capacity(1 + 2 * packet.len());
            iov.push(io::IoSlice::new(&h));
            for p in packet {
                iov.push(io::IoSlice::new(p.prefix()));
                iov.push(io::IoSlice::new(&buf[p.range.clone()]));
            }
            match send_vectored(outs[k].rtp_fd(), &iov) {
                Ok(()) => {}
                // The client's port closed (ICMP unreachable): its packets are lost, as
                // a network would lose them; the session ends by teardown or timeout.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => {
                    tracing::debug!("rtsp mp4: sending: {e}");
                    failed = true;
                    break;
                }
            }
            let len: usize = packet.iter().map(Piece::payload_len).sum();
            seq[k] = seq[k].wrapping_add(1);
            packets[k] = packets[k].wrapping_add(1);
            octets[k] = octets[k].wrapping_add(len as u32);
            sent_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        if failed {
            break;
        }
    }
    let progress = seq.into_iter().zip(next).collect();
    (progress, outs, trick_sent)
}

/// One datagram from the iovecs (sendmsg: no packet buffer).
fn send_vectored(fd: std::os::fd::BorrowedFd<'_>, iov: &[io::IoSlice<'_>]) -> io::Result<()> {
    loop {
        match rustix::net::sendmsg(
            fd,
            iov,
            &mut rustix::net::SendAncillaryBuffer::default(),
            rustix::net::SendFlags::empty(),
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// An output for a track from a session's transport (its own duplicates).
pub(crate) fn out_of(t: &super::Transport) -> io::Result<Out> {
    Ok(match t {
        super::Transport::Udp {
            rtp,
            rtcp,
            client_rtcp,
        } => {
            let rtcp = rtcp.try_clone()?;
            rtcp.set_nonblocking(true)?;
            Out::Udp {
                rtp: rtp.try_clone()?,
                rtcp,
                client_rtcp: *client_rtcp,
            }
        }
        super::Transport::Interleaved { engine_end, .. } => Out::Pair(engine_end.try_clone()?),
    })
}
