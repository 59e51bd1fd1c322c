//! Timing from the media: the unit plan of an MPEG-TS file from its program clock reference.
//!
//! Two passes over the file's bytes, each fed in chunks of any size (the caller reads; nothing
//! here does I/O):
//! 1. [`PcrPidProbe`] chooses the **PCR PID** as players do: the `PCR_PID` of the PMT of the
//!    first program in the PAT, when the PAT and that PMT (each whole in one packet, CRC good)
//!    appear in the first [`PcrLimits::probe_packets`] packets; else the first PID that carries
//!    a PCR there. A PMT whose `PCR_PID` is 0x1FFF (no PCR) is passed over the same way.
//! 2. [`PcrPlanner`] reads every packet from the start, takes the PCRs of that PID and cuts the
//!    file into units of [`PcrLimits::packets_per_unit`] packets (7 × 188 = 1316 bytes by
//!    default: one datagram, RTP payload of RFC 2250). A unit is due at the **PCR time of its
//!    first packet**:
//!    - between two PCRs, packet times are interpolated linearly in the packet index (a TS
//!      multiplex runs at a constant rate between PCRs: ISO/IEC 13818-1 §2.4.2.2);
//!    - before the first PCR they are extrapolated backwards at the first interval's rate, and
//!      after the last one forwards at the last interval's rate;
//!    - the 42-bit PCR wraps every 26.5 hours: a step is taken modulo [`PCR_MODULUS`], and a
//!      step of more than half the modulus is a backward jump.
//!
//! **Discontinuities.** A PCR is not continuous with the one before it when its packet has
//! the `discontinuity_indicator` (a new time base), when it lies behind the previous one
//! (a backward jump, as at the splice of two files), or when it lies more than
//! [`PcrLimits::pcr_gap_ns_max`] ahead (a gap: ISO/IEC 13818-1 wants a PCR every 100 ms). The
//! timeline is then **spliced**: the packets since the previous PCR keep the rate of the last
//! continuous interval, and the new time base continues from there. So the plan's time never
//! goes backwards and never jumps, whatever the PCRs do; a discontinuity before any
//! continuous interval is known sends the packets up to it at the previous PCR's time.
//!
//! Deadlines are offsets from the first packet (which is due at 0): exact integer arithmetic
//! in 27 MHz ticks (floor of the interpolation), converted to ns rounded up, so a deadline is
//! within one tick of its packet's PCR-derived time and never decreases along the plan.
//!
//! **Refusals** ([`TsError`]): not TS (no sync byte at 0; a hint when it looks like 192-byte
//! M2TS), sync lost at a later packet, no PCR in the probe, fewer than 2 PCRs on the PCR PID,
//! no continuous interval between them, a plan larger than [`PcrLimits::plan_entries_max`].
//! A partial packet at the end of the file (a truncated copy) is not planned: the plan covers
//! the whole packets and says how many bytes it left ([`TsPlan::tail_bytes`]).
//!
//! **Memory.** The planner keeps O(1) state besides its output: the plan holds one
//! [`UnitPlan`] (16 bytes) per unit and one [`PcrPoint`] (16 bytes) per PCR, 1.3 % of the
//! file at 7 packets per unit and a PCR every 40 ms at 8 Mbit/s; their count is capped by
//! `plan_entries_max` (default 4 Mi entries, 64 MiB, a file of about 5 GB).

use crate::schedule::UnitPlan;
use crate::track::Playback;

use super::packet::{NULL_PID, PCR_MODULUS, TS_PACKET_BYTES, TS_SYNC_BYTE, parse_packet};
use super::psi::{PAT_PID, pat_first_program, pmt_pcr_pid};

/// Packets the probe reads for a PAT and PMT before it settles for the first PID carrying a
/// PCR (9.4 MB: several seconds of any broadcast multiplex, which repeats its PAT and PMT at
/// least every 100 ms).
pub const PROBE_PACKETS_DEFAULT: u64 = 50_000;
/// A PCR more than this ahead of the previous one is a gap, spliced like a discontinuity.
pub const PCR_GAP_NS_MAX_DEFAULT: u64 = 1_000_000_000;
/// Most entries (units and PCR points, 16 bytes each) of one plan: 64 MiB.
pub const PLAN_ENTRIES_MAX_DEFAULT: u64 = 4 << 20;
/// TS packets per unit by default (and at most): 7 × 188 = 1316 bytes fits a 1500-byte MTU
/// with IP, UDP and RTP headers.
pub const PACKETS_PER_UNIT_MAX: u8 = 7;

/// The planner's limits, each with a default above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcrLimits {
    /// Packets read for the PAT and PMT before the first PID carrying a PCR is taken.
    pub probe_packets: u64,
    /// A forward PCR step longer than this is a gap (spliced).
    pub pcr_gap_ns_max: u64,
    /// Most units plus PCR points one plan may hold.
    pub plan_entries_max: u64,
    /// TS packets per unit, 1..=7.
    pub packets_per_unit: u8,
}

impl Default for PcrLimits {
    fn default() -> PcrLimits {
        PcrLimits {
            probe_packets: PROBE_PACKETS_DEFAULT,
            pcr_gap_ns_max: PCR_GAP_NS_MAX_DEFAULT,
            plan_entries_max: PLAN_ENTRIES_MAX_DEFAULT,
            packets_per_unit: PACKETS_PER_UNIT_MAX,
        }
    }
}

/// Why a file cannot be timed by its PCR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TsError {
    #[error("not MPEG-TS: the file is empty (no 188-byte packet)")]
    Empty,
    #[error(
        "not MPEG-TS: no sync byte 0x47 at byte 0{}",
        if *m2ts { " (it looks like 192-byte M2TS packets, which are not supported: remux to TS, e.g. ffmpeg -i IN -c copy -f mpegts OUT)" } else { "" }
    )]
    NotTs { m2ts: bool },
    #[error(
        "MPEG-TS sync lost at byte {offset_bytes} (packet {packet} has no sync byte 0x47): damaged, or not a TS file"
    )]
    SyncLost { packet: u64, offset_bytes: u64 },
    #[error(
        "no PCR in the first {packets} packets: nothing to time the stream by (pace it with --rate instead)"
    )]
    NoPcr { packets: u64 },
    #[error("PID {pid:#x} carries {found} PCR(s): at least 2 are needed to know the stream's rate")]
    TooFewPcrs { pid: u16, found: u64 },
    #[error(
        "none of the {pcrs} PCRs of PID {pid:#x} continues the one before it (each is a discontinuity, a jump back or a gap): the stream's rate is unknown"
    )]
    NoPcrInterval { pid: u16, pcrs: u64 },
    #[error(
        "the plan would hold more than {entries_max} entries (units and PCRs) after {bytes} bytes of the file: raise the limit (16 bytes each) or play a part of the file"
    )]
    PlanTooLarge { entries_max: u64, bytes: u64 },
    #[error("{0} TS packets per unit: 1 to 7")]
    PacketsPerUnit(u8),
}

/// What a [`Framer`] calls with each packet and its index: `Ok(false)` stops the framing (the
/// rest of the bytes is not read, not even for its sync bytes).
type OnPacket<'a> = dyn FnMut(u64, &[u8; TS_PACKET_BYTES]) -> Result<bool, TsError> + 'a;

/// Cuts bytes fed in chunks of any size into 188-byte packets, checking the sync byte.
#[derive(Debug, Clone)]
struct Framer {
    carry: [u8; TS_PACKET_BYTES],
    carry_len: usize,
    packets: u64,
}

impl Framer {
    fn new() -> Framer {
        Framer {
            carry: [0; TS_PACKET_BYTES],
            carry_len: 0,
            packets: 0,
        }
    }

    fn feed(&mut self, mut bytes: &[u8], f: &mut OnPacket<'_>) -> Result<(), TsError> {
        if self.carry_len > 0 {
            let take = (TS_PACKET_BYTES - self.carry_len).min(bytes.len());
            self.carry[self.carry_len..self.carry_len + take].copy_from_slice(&bytes[..take]);
            self.carry_len += take;
            bytes = &bytes[take..];
            if self.carry_len < TS_PACKET_BYTES {
                return Ok(());
            }
            let p = self.carry;
            self.carry_len = 0;
            if !self.packet(&p, f)? {
                return Ok(());
            }
        }
        let mut chunks = bytes.chunks_exact(TS_PACKET_BYTES);
        for p in &mut chunks {
            let p: &[u8; TS_PACKET_BYTES] = p.try_into().expect("chunks_exact gives 188 bytes");
            if !self.packet(p, f)? {
                return Ok(());
            }
        }
        let rest = chunks.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carry_len = rest.len();
        Ok(())
    }

    fn packet(&mut self, p: &[u8; TS_PACKET_BYTES], f: &mut OnPacket<'_>) -> Result<bool, TsError> {
        let i = self.packets;
        if p[0] != TS_SYNC_BYTE {
            return Err(if i == 0 {
                // M2TS: a 4-byte timecode, then the TS packet's sync byte.
                TsError::NotTs {
                    m2ts: p[4] == TS_SYNC_BYTE,
                }
            } else {
                TsError::SyncLost {
                    packet: i,
                    offset_bytes: i * TS_PACKET_BYTES as u64,
                }
            });
        }
        self.packets += 1;
        f(i, p)
    }
}

/// How the PCR PID was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcrPidSource {
    /// The PMT of program `program` (on PID `pmt_pid`) names it.
    Pmt { program: u16, pmt_pid: u16 },
    /// The first PID that carried a PCR (no usable PAT/PMT in the probe).
    FirstPcr,
}

/// The PCR PID and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcrPid {
    pub pid: u16,
    pub source: PcrPidSource,
}

/// Pass 1: chooses the PCR PID (see the module doc). Feed the file from its start with
/// [`PcrPidProbe::handle`] until it answers, or to the end and call [`PcrPidProbe::finish`].
#[derive(Debug, Clone)]
pub struct PcrPidProbe {
    framer: Framer,
    probe_packets: u64,
    program: Option<(u16, u16)>,
    first_pcr_pid: Option<u16>,
    decided: Option<PcrPid>,
}

impl PcrPidProbe {
    pub fn new(limits: &PcrLimits) -> PcrPidProbe {
        PcrPidProbe {
            framer: Framer::new(),
            probe_packets: limits.probe_packets.max(1),
            program: None,
            first_pcr_pid: None,
            decided: None,
        }
    }

    /// Reads more of the file; `Some` once the PCR PID is chosen (feed no more).
    pub fn handle(&mut self, bytes: &[u8]) -> Result<Option<PcrPid>, TsError> {
        if self.decided.is_some() {
            return Ok(self.decided);
        }
        let (probe_packets, program, first, decided) = (
            self.probe_packets,
            &mut self.program,
            &mut self.first_pcr_pid,
            &mut self.decided,
        );
        // The probe reads no packet past its decision or its limit: the same bytes give the
        // same answer however they are cut into chunks.
        if self.framer.packets >= self.probe_packets {
            return self.finish().map(Some);
        }
        self.framer.feed(bytes, &mut |i, raw| {
            let more = i + 1 < probe_packets;
            let Some(p) = parse_packet(raw) else {
                return Ok(more);
            };
            if p.transport_error {
                return Ok(more);
            }
            if p.pcr.is_some() && first.is_none() && p.pid != NULL_PID {
                *first = Some(p.pid);
            }
            if !p.payload_unit_start {
                return Ok(more);
            }
            if p.pid == PAT_PID && program.is_none() {
                *program = pat_first_program(p.payload);
            } else if let Some((number, pmt_pid)) = *program
                && p.pid == pmt_pid
                && let Some(pcr_pid) = pmt_pcr_pid(p.payload)
                && pcr_pid != NULL_PID
            {
                *decided = Some(PcrPid {
                    pid: pcr_pid,
                    source: PcrPidSource::Pmt {
                        program: number,
                        pmt_pid,
                    },
                });
                return Ok(false);
            }
            Ok(more)
        })?;
        if self.decided.is_none() && self.framer.packets >= self.probe_packets {
            return self.finish().map(Some);
        }
        Ok(self.decided)
    }

    /// The choice at the end of the input (or of the probe).
    pub fn finish(&mut self) -> Result<PcrPid, TsError> {
        if let Some(d) = self.decided {
            return Ok(d);
        }
        if self.framer.packets == 0 {
            return Err(
                if self.framer.carry_len > 0 && self.framer.carry[0] != TS_SYNC_BYTE {
                    TsError::NotTs { m2ts: false }
                } else {
                    TsError::Empty
                },
            );
        }
        let pid = self.first_pcr_pid.ok_or(TsError::NoPcr {
            packets: self.framer.packets.min(self.probe_packets),
        })?;
        let d = PcrPid {
            pid,
            source: PcrPidSource::FirstPcr,
        };
        self.decided = Some(d);
        Ok(d)
    }
}

/// A PCR of the PCR PID: the byte offset of its packet and its time on the plan's timeline
/// (ns after the first packet; spliced across discontinuities like the units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcrPoint {
    pub offset_bytes: u64,
    pub time_ns: u64,
}

/// The plan of a TS file: what [`PcrPlanner::finish`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TsPlan {
    pub pcr_pid: u16,
    /// Units covering packets `0 .. packets`, in order; unit `n` starts at byte
    /// `n · packets_per_unit · 188`.
    pub units: Vec<UnitPlan>,
    /// Every PCR of the PCR PID, in file order (for seeking: [`TsPlan::pcr_at_or_before`]).
    pub pcrs: Vec<PcrPoint>,
    /// Whole packets planned (`media_bytes / 188`).
    pub packets: u64,
    /// Bytes planned: the whole packets from byte 0.
    pub media_bytes: u64,
    /// Bytes after the last whole packet, not planned (a truncated file).
    pub tail_bytes: u64,
    /// PCRs not continuous with the one before them (spliced).
    pub discontinuities: u64,
    pub packets_per_unit: u8,
}

impl TsPlan {
    /// Bytes of a full unit.
    pub fn unit_bytes(&self) -> u64 {
        u64::from(self.packets_per_unit) * TS_PACKET_BYTES as u64
    }

    /// The plan's length in time: the last unit's deadline.
    pub fn duration_ns(&self) -> u64 {
        self.units.last().map_or(0, |u| u.offset_ns)
    }

    /// **Seeking by PCR**: the last PCR at or before `time_ns` on the plan's timeline, `None`
    /// when `time_ns` is before the first PCR. (For RTSP `Range: npt=`; `--from` with
    /// `--timing pcr`.)
    pub fn pcr_at_or_before(&self, time_ns: u64) -> Option<PcrPoint> {
        let n = self.pcrs.partition_point(|p| p.time_ns <= time_ns);
        n.checked_sub(1).map(|i| self.pcrs[i])
    }

    /// What to send to play from `from_ns` (`None`: the start): from the unit holding the
    /// last PCR at or before it (the start when there is none), to the end; deadlines made
    /// relative to that unit.
    pub fn playback_from(&self, from_ns: Option<u64>) -> Playback {
        let first = from_ns
            .and_then(|t| self.pcr_at_or_before(t))
            .map_or(0, |p| p.offset_bytes / self.unit_bytes());
        self.playback_at_unit(usize::try_from(first).unwrap_or(usize::MAX))
    }

    /// The units holding the independent frames that start at byte offsets `keys` (a file's
    /// key-frame index, or a recording's frame track), in file order, each once: what
    /// [`TsPlan::playback_from_key`] seeks by.
    pub fn key_units(&self, keys: impl IntoIterator<Item = u64>) -> Vec<usize> {
        let mut units: Vec<usize> = keys.into_iter().map(|k| self.unit_at_offset(k)).collect();
        units.sort_unstable();
        units.dedup();
        units
    }

    /// **Seeking by key frame** (RTSP `Range: npt=` and `penstock stream --from`, one rule):
    /// what to send to play from `from_ns`: from the last of `key_units` (in order, from
    /// [`TsPlan::key_units`]) whose unit starts at or before `from_ns`, so that the first
    /// picture sent decodes; from the start when none does.
    pub fn playback_from_key(&self, key_units: &[usize], from_ns: u64) -> Playback {
        let n = key_units
            .partition_point(|&k| self.units.get(k).is_some_and(|u| u.offset_ns <= from_ns));
        let first = n.checked_sub(1).map_or(0, |i| key_units[i]);
        self.playback_at_unit(first)
    }

    /// The unit holding byte `offset` of the media (the last unit for one past the end).
    pub fn unit_at_offset(&self, offset: u64) -> usize {
        usize::try_from(offset / self.unit_bytes())
            .unwrap_or(usize::MAX)
            .min(self.units.len().saturating_sub(1))
    }

    /// What to send to play from unit `first` (the last unit when past the end) to the end;
    /// deadlines made relative to it. (Seeking by a recording's frame track picks `first`.)
    pub fn playback_at_unit(&self, first: usize) -> Playback {
        let first = first.min(self.units.len().saturating_sub(1));
        let t0 = self.units.get(first).map_or(0, |u| u.offset_ns);
        let media_offset_bytes = first as u64 * self.unit_bytes();
        Playback {
            first_packet: first as u64 * u64::from(self.packets_per_unit),
            media_offset_bytes,
            media_bytes: self.media_bytes - media_offset_bytes,
            start_time_ns: t0,
            units: self.units[first..]
                .iter()
                .map(|u| UnitPlan {
                    offset_ns: u.offset_ns - t0,
                    size_bytes: u.size_bytes,
                })
                .collect(),
        }
    }
}

/// A PCR whose time on the plan's timeline is known.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    packet: u64,
    /// 27 MHz ticks on the plan's (spliced) timeline; the first PCR is at 0.
    t: i128,
    /// The PCR as read (modulo [`PCR_MODULUS`]).
    raw: u64,
}

/// Pass 2: the unit plan (see the module doc). Feed the whole file from its start with
/// [`PcrPlanner::handle`], then call [`PcrPlanner::finish`].
#[derive(Debug, Clone)]
pub struct PcrPlanner {
    pid: u16,
    limits: PcrLimits,
    gap_ticks_max: u64,
    framer: Framer,
    prev: Option<Anchor>,
    /// Ticks and packets of the last continuous interval.
    rate: Option<(u64, u64)>,
    /// The time of packet 0 on the timeline (the plan's zero), once known.
    origin: Option<i128>,
    next_unit: u64,
    pcrs_seen: u64,
    discontinuities: u64,
    units: Vec<UnitPlan>,
    pcrs: Vec<PcrPoint>,
}

/// `floor(a / b)` for `b > 0`.
fn floor_div(a: i128, b: i128) -> i128 {
    a.div_euclid(b)
}

/// Ticks to ns, rounded up (a unit is never due before its PCR time).
fn ticks_to_ns(ticks: i128) -> u64 {
    let ticks = u128::try_from(ticks.max(0)).unwrap_or(0);
    u64::try_from((ticks * 1000).div_ceil(27)).unwrap_or(u64::MAX)
}

impl PcrPlanner {
    pub fn new(pcr_pid: u16, limits: &PcrLimits) -> Result<PcrPlanner, TsError> {
        if !(1..=PACKETS_PER_UNIT_MAX).contains(&limits.packets_per_unit) {
            return Err(TsError::PacketsPerUnit(limits.packets_per_unit));
        }
        Ok(PcrPlanner {
            pid: pcr_pid,
            limits: *limits,
            gap_ticks_max: u64::try_from(u128::from(limits.pcr_gap_ns_max) * 27 / 1000)
                .unwrap_or(u64::MAX),
            framer: Framer::new(),
            prev: None,
            rate: None,
            origin: None,
            next_unit: 0,
            pcrs_seen: 0,
            discontinuities: 0,
            units: Vec::new(),
            pcrs: Vec::new(),
        })
    }

    /// Reads more of the file (chunks of any size, in order).
    pub fn handle(&mut self, bytes: &[u8]) -> Result<(), TsError> {
        let mut framer = std::mem::replace(&mut self.framer, Framer::new());
        let r = framer.feed(bytes, &mut |i, raw| {
            let Some(p) = parse_packet(raw) else {
                return Ok(true);
            };
            match p.pcr {
                Some(pcr) if p.pid == self.pid && !p.transport_error => {
                    self.on_pcr(i, pcr, p.discontinuity).map(|()| true)
                }
                _ => Ok(true),
            }
        });
        self.framer = framer;
        r
    }

    fn on_pcr(&mut self, packet: u64, raw: u64, discontinuity: bool) -> Result<(), TsError> {
        self.pcrs_seen += 1;
        let Some(a) = self.prev else {
            self.prev = Some(Anchor { packet, t: 0, raw });
            return Ok(());
        };
        let step = (raw + PCR_MODULUS - a.raw) % PCR_MODULUS;
        let n = packet - a.packet;
        let continuous = !discontinuity && step <= PCR_MODULUS / 2 && step <= self.gap_ticks_max;
        let t = if continuous {
            self.rate = Some((step, n));
            a.t + i128::from(step)
        } else {
            self.discontinuities += 1;
            a.t + self.rate.map_or(0, |(ticks, packets)| {
                floor_div(i128::from(ticks) * i128::from(n), i128::from(packets))
            })
        };
        let b = Anchor { packet, t, raw };
        self.resolve(a, b)?;
        self.prev = Some(b);
        Ok(())
    }

    /// The time of `packet` on the line through anchors `a` and `b` (`a.packet < b.packet`).
    fn time_between(a: Anchor, b: Anchor, packet: u64) -> i128 {
        let dp = i128::from(packet) - i128::from(a.packet);
        a.t + floor_div((b.t - a.t) * dp, i128::from(b.packet - a.packet))
    }

    /// The interval `a → b` is known: `a`'s PCR point and the units starting before `b`.
    fn resolve(&mut self, a: Anchor, b: Anchor) -> Result<(), TsError> {
        let origin = *self
            .origin
            .get_or_insert_with(|| Self::time_between(a, b, 0));
        self.push_pcr(a, origin)?;
        let ppu = u64::from(self.limits.packets_per_unit);
        while self.next_unit * ppu < b.packet {
            let t = Self::time_between(a, b, self.next_unit * ppu);
            self.push_unit(t - origin)?;
        }
        Ok(())
    }

    fn check_room(&self) -> Result<(), TsError> {
        if (self.units.len() + self.pcrs.len()) as u64 >= self.limits.plan_entries_max {
            return Err(TsError::PlanTooLarge {
                entries_max: self.limits.plan_entries_max,
                bytes: self.framer.packets * TS_PACKET_BYTES as u64,
            });
        }
        Ok(())
    }

    fn push_pcr(&mut self, a: Anchor, origin: i128) -> Result<(), TsError> {
        self.check_room()?;
        self.pcrs.push(PcrPoint {
            offset_bytes: a.packet * TS_PACKET_BYTES as u64,
            time_ns: ticks_to_ns(a.t - origin),
        });
        Ok(())
    }

    fn push_unit(&mut self, ticks: i128) -> Result<(), TsError> {
        self.check_room()?;
        self.units.push(UnitPlan {
            offset_ns: ticks_to_ns(ticks),
            // Full until the end is known (finish shortens the last one).
            size_bytes: u32::from(self.limits.packets_per_unit) * TS_PACKET_BYTES as u32,
        });
        self.next_unit += 1;
        Ok(())
    }

    /// The end of the file: the plan, or why there is none.
    pub fn finish(mut self) -> Result<TsPlan, TsError> {
        let packets = self.framer.packets;
        if packets == 0 {
            return Err(
                if self.framer.carry_len > 0 && self.framer.carry[0] != TS_SYNC_BYTE {
                    TsError::NotTs { m2ts: false }
                } else {
                    TsError::Empty
                },
            );
        }
        let (Some(last), Some(origin)) = (self.prev, self.origin) else {
            return Err(TsError::TooFewPcrs {
                pid: self.pid,
                found: self.pcrs_seen,
            });
        };
        let Some((ticks, per)) = self.rate else {
            return Err(TsError::NoPcrInterval {
                pid: self.pid,
                pcrs: self.pcrs_seen,
            });
        };
        self.push_pcr(last, origin)?;
        let ppu = u64::from(self.limits.packets_per_unit);
        while self.next_unit * ppu < packets {
            let dp = i128::from(self.next_unit * ppu) - i128::from(last.packet);
            let t = last.t + floor_div(i128::from(ticks) * dp, i128::from(per));
            self.push_unit(t - origin)?;
        }
        let last_start = (self.next_unit - 1) * ppu;
        let last_unit = self.units.last_mut().expect("packets > 0 gives a unit");
        last_unit.size_bytes = ((packets - last_start) * TS_PACKET_BYTES as u64) as u32;
        Ok(TsPlan {
            pcr_pid: self.pid,
            units: self.units,
            pcrs: self.pcrs,
            packets,
            media_bytes: packets * TS_PACKET_BYTES as u64,
            tail_bytes: self.framer.carry_len as u64,
            discontinuities: self.discontinuities,
            packets_per_unit: self.limits.packets_per_unit,
        })
    }
}

/// Both passes over bytes already in memory (tests, the fuzz target): the PCR PID and the plan.
pub fn plan_bytes(bytes: &[u8], limits: &PcrLimits) -> Result<(PcrPid, TsPlan), TsError> {
    let mut probe = PcrPidProbe::new(limits);
    let pid = match probe.handle(bytes)? {
        Some(pid) => pid,
        None => probe.finish()?,
    };
    let mut planner = PcrPlanner::new(pid.pid, limits)?;
    planner.handle(bytes)?;
    Ok((pid, planner.finish()?))
}
