//! `[rtsp]`: the RTSP server (docs/rtsp.md). Fixed at start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, ListenAddrs, units};

/// `[rtsp]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RtspConfig {
    /// Addresses (forms as `[http] listen`, the scheme `rtsp://` or none for plain RTSP,
    /// `rtsps://` for RTSP over TLS with the `[tls]` certificates); `""` or `[]`: no RTSP
    /// server.
    pub listen: ListenAddrs,
    /// Sessions at once (set up, playing or paused); a SETUP beyond gets 453. At most
    /// `[admission] streams_max` (checked at start: the two caps agree).
    pub sessions_max: usize,
    /// Sessions at once set up from one client address; a SETUP beyond gets 453 naming it.
    pub sessions_per_address_max: usize,
    /// A session set up and not played within this long gives its admission reservation
    /// back (a PLAY after it asks admission afresh): SETUPs without PLAY hold no capacity
    /// beyond it.
    #[serde(alias = "setup_timeout", deserialize_with = "units::ms")]
    pub setup_timeout_ms: u64,
    /// Sessions of one client address whose admission `setup_timeout_ms` gave back unplayed,
    /// within one `session_timeout_ms`; beyond, that address's SETUPs get 453 until the
    /// window is over (a client that sets up, never plays, tears down and sets up again).
    pub unplayed_setups_max: u32,
    /// A session paused for longer than this has its stream stopped and its admission
    /// reservation given back (the session stays; a PLAY resumes where it paused, admitted
    /// afresh or refused with 453): a paused client kept alive holds no capacity beyond it.
    #[serde(alias = "pause_hold", deserialize_with = "units::ms")]
    pub pause_hold_ms: u64,
    /// A session with no request (and, over UDP, no RTCP receiver report) for this long is
    /// torn down; told to clients as `Session: ID;timeout=N`.
    #[serde(alias = "session_timeout", deserialize_with = "units::ms")]
    pub session_timeout_ms: u64,
    /// A request (head and body) larger than this gets 400 and the connection is closed.
    #[serde(deserialize_with = "units::size")]
    pub request_bytes_max: usize,
    /// RTSP connections at once; one beyond gets 503 and is closed.
    pub connections_max: usize,
    /// RTSP connections at once from one client address; one beyond gets 503 and is closed
    /// (a few addresses cannot take every place of `connections_max`; in effect at most
    /// `connections_max`).
    pub connections_per_address_max: usize,
    /// A request (or an interleaved frame) must be complete this long after its first byte,
    /// however slowly it trickles; else 408 and the connection is closed (slowloris).
    #[serde(alias = "request_timeout", deserialize_with = "units::ms")]
    pub request_timeout_ms: u64,
    /// Lowest and highest UDP port of the server port pairs (RTP on an even port, RTCP on
    /// the next).
    pub rtp_port_min: u16,
    pub rtp_port_max: u16,
    /// A session's engine stream that moves nothing for this long fails (the engine's
    /// `send_timeout`); over TCP also the longest wait of one write to the client.
    #[serde(deserialize_with = "units::ms")]
    pub send_timeout_ms: u64,
    /// Time between RTCP sender reports (each drawn from 0.5 to 1.5 times it).
    #[serde(deserialize_with = "units::ms")]
    pub rtcp_interval_ms: u64,
    /// TS files whose PCR plan is kept (one plan per file, shared by its sessions; a file
    /// changed on disk is planned again).
    pub media_cached_max: usize,
    /// Most entries (units and PCRs, 16 bytes each) one file's plan may hold.
    pub plan_entries_max: u64,
    /// The fastest `Scale` a PLAY may ask (fast forward: deadlines divided by the scale, the
    /// session admitted at that many times the bit rate); above it, or zero or negative: 451.
    /// An MP4 also plays down to `-scale_max` (reverse, key frames only: docs/rtsp.md).
    pub scale_max: u32,
    /// A session's engine stream reads its planned units with O_DIRECT into the engine's
    /// registered buffers where the file system allows it (no copy from the page cache
    /// into the process); `false`: through the page cache (sessions of one hot file then
    /// share its cached pages instead of each reading the disk).
    pub direct_reads: bool,
    /// RTP packets leave with io_uring's SEND_ZC from the registered buffers where the
    /// kernel has it (no copy into the socket's buffer); `false`: plain sends, which copy
    /// each datagram (docs/rtsp.md, "Zero copy").
    pub zero_copy_sends: bool,
    /// An interleaved (TCP) session's engine stream sends its frames straight to the RTSP
    /// connection's socket, taking turns with the connection thread through a writer gate
    /// (no copy through user space; the default); `false`: through a Unix socket pair that the
    /// connection thread reads and frames (a copy each way).
    pub interleaved_direct: bool,
    /// `[rtsp.live.NAME]`: live sources, played as `rtsp://HOST:PORT/NAME` (docs/rtsp.md,
    /// "Live relay").
    pub live: BTreeMap<String, LiveConfig>,
}

/// What the datagrams of a live source carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LiveFormat {
    /// Each datagram by itself: RTP carrying TS, else raw TS.
    #[default]
    Auto,
    /// Raw MPEG-TS, read as a byte stream: datagrams cut anywhere are put back into whole
    /// 188-byte packets (`penstock_core::ts::align`).
    Ts,
    /// RTP (RFC 2250) whose payload is raw MPEG-TS.
    Rtp,
}

/// `[rtsp.live.NAME]`: one live source.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LiveConfig {
    /// `udp-listen://IP:PORT`: the one socket the source's datagrams arrive on; or
    /// `publish`: a publisher sends it by RTSP ANNOUNCE and RECORD to `rtsp://HOST:PORT/NAME`
    /// (docs/rtsp.md, "Publishing").
    pub source: String,
    /// `source = "publish"`: the users (of `[auth] digest_users_file`, RTSP Digest) who may
    /// publish here; at least one.
    #[serde(default)]
    pub publishers: Vec<String>,
    /// `source = "publish"`: the largest SDP an ANNOUNCE may carry (the whole request is also
    /// bounded by `rtsp.request_bytes_max`).
    #[serde(default = "publish_sdp_default", deserialize_with = "units::size")]
    pub sdp_bytes_max: usize,
    /// `source = "publish"`: the most tracks (`m=` lines) an ANNOUNCE may describe.
    #[serde(default = "publish_tracks_default")]
    pub tracks_max: usize,
    /// `source = "publish"`: the largest interleaved frame (one RTP packet) a publisher may
    /// send; a larger one ends its connection.
    #[serde(default = "publish_frame_default", deserialize_with = "units::size")]
    pub frame_bytes_max: usize,
    /// `source = "publish"`: the largest access unit (a video frame's NAL units, an AAC
    /// frame) reassembled from RTP; a larger one is dropped.
    #[serde(default = "publish_au_default", deserialize_with = "units::size")]
    pub access_unit_bytes_max: usize,
    /// Record the datagrams (byte for byte, with index tracks, as `penstock record`): a path,
    /// into this file (or `DIR/NAME.ts` when it names an existing directory); or a table
    /// `{ dir, segment, keep, max_bytes }`, into segments (docs/recording.md "Segments and
    /// retention").
    #[serde(default)]
    pub record: Option<LiveRecord>,
    #[serde(default)]
    pub format: LiveFormat,
    /// Datagrams (of at most 7 TS packets) queued per session; a session that cannot take
    /// them drops its oldest.
    #[serde(default = "live_queue_default")]
    pub queue_datagrams_max: usize,
    /// No datagram for this long: the source has ended, its sessions get an RTCP BYE.
    #[serde(
        default = "live_idle_default",
        alias = "idle_timeout",
        deserialize_with = "units::ms"
    )]
    pub idle_timeout_ms: u64,
}

/// Where a live source records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum LiveRecord {
    /// `record = "/path/file.ts"`: one file (or `DIR/NAME.ts` in an existing directory).
    File(PathBuf),
    /// `record = { dir = "…", segment = "10m", keep = "7d", max_bytes = "500GiB" }`.
    Segments(RecordSegments),
}

impl<'de> Deserialize<'de> for LiveRecord {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = LiveRecord;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a file path, or a table { dir, segment, keep, max_bytes }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LiveRecord, E> {
                Ok(LiveRecord::File(PathBuf::from(v)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<LiveRecord, A::Error> {
                RecordSegments::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(LiveRecord::Segments)
            }
        }
        d.deserialize_any(V)
    }
}

/// `record = { … }`: a segmented recording of a live source.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSegments {
    /// The segments go into `DIR/NAME/` (created if missing), each named by its start time:
    /// `20261127T140320Z.ts`, its tracks beside it.
    pub dir: PathBuf,
    /// A new segment at the first key frame past this: a duration (`"10m"`, at least 1 s) or
    /// a size (`"256MiB"`, at least 64 KiB).
    #[serde(default = "segment_default", deserialize_with = "segment_length")]
    pub segment: SegmentLengthConfig,
    /// Delete segments that ended longer ago than this (`"7d"`); none: kept whatever their age.
    #[serde(default, deserialize_with = "units::opt_ms")]
    pub keep: Option<u64>,
    /// Delete the oldest segments while the recording takes more than this (`"500GiB"`, media
    /// and tracks; the segment being written is never deleted).
    #[serde(default, deserialize_with = "units::opt_size")]
    pub max_bytes: Option<u64>,
}

/// A segment's length as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SegmentLengthConfig {
    Ms(u64),
    Bytes(u64),
}

fn segment_default() -> SegmentLengthConfig {
    SegmentLengthConfig::Ms(600_000)
}

fn segment_length<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SegmentLengthConfig, D::Error> {
    use serde::de::Error;
    let s = String::deserialize(d)?;
    if let Ok(t) = penstock_core::units::parse_duration(&s) {
        return u64::try_from(t.as_millis())
            .map(SegmentLengthConfig::Ms)
            .map_err(|_| D::Error::custom(format!("segment {s:?} is too long")));
    }
    penstock_core::units::parse_size(&s)
        .map(SegmentLengthConfig::Bytes)
        .map_err(|_| {
            D::Error::custom(format!(
                "segment {s:?}: a duration (\"10m\", \"30s\") or a size (\"256MiB\")"
            ))
        })
}

impl RecordSegments {
    /// The core's policy.
    pub fn policy(&self) -> penstock_core::track::segments::SegmentPolicy {
        use penstock_core::track::segments::{SegmentLength, SegmentPolicy};
        SegmentPolicy {
            length: match self.segment {
                SegmentLengthConfig::Ms(ms) => SegmentLength::Duration {
                    ns: ms.saturating_mul(1_000_000),
                },
                SegmentLengthConfig::Bytes(bytes) => SegmentLength::Bytes { bytes },
            },
            keep_ns: self.keep.map(|k| k.saturating_mul(1_000_000)),
            max_bytes: self.max_bytes,
        }
    }

    /// The directory of source `name`'s segments.
    pub fn dir_of(&self, name: &str) -> PathBuf {
        self.dir.join(name.replace('/', "_"))
    }

    fn check(&self, name: &str) -> Result<(), String> {
        use penstock_core::track::segments::{SEGMENT_BYTES_MIN, SEGMENT_NS_MIN};
        match self.segment {
            SegmentLengthConfig::Ms(ms) if ms.saturating_mul(1_000_000) < SEGMENT_NS_MIN => {
                return Err(format!(
                    "live.{name}.record.segment: at least 1s (segments are named to the second)"
                ));
            }
            SegmentLengthConfig::Bytes(b) if b < SEGMENT_BYTES_MIN => {
                return Err(format!("live.{name}.record.segment: at least 64KiB"));
            }
            _ => {}
        }
        if self.dir.as_os_str().is_empty() {
            return Err(format!("live.{name}.record.dir: a directory"));
        }
        if self.keep == Some(0) || self.max_bytes == Some(0) {
            return Err(format!(
                "live.{name}.record: keep and max_bytes must be above 0 (leave one out for no limit)"
            ));
        }
        Ok(())
    }
}

fn publish_sdp_default() -> usize {
    8192
}

fn publish_tracks_default() -> usize {
    4
}

fn publish_frame_default() -> usize {
    usize::from(u16::MAX)
}

fn publish_au_default() -> usize {
    4 << 20
}

fn live_queue_default() -> usize {
    256
}

fn live_idle_default() -> u64 {
    5_000
}

impl LiveConfig {
    /// `source = "publish"`: fed by an RTSP publisher, not a socket.
    pub fn is_publish(&self) -> bool {
        self.source == "publish"
    }

    /// The publisher's limits (of the SDP, its depacketizers).
    pub fn sdp_limits(&self) -> penstock_core::rtp::announce::SdpLimits {
        penstock_core::rtp::announce::SdpLimits {
            bytes_max: self.sdp_bytes_max,
            tracks_max: self.tracks_max,
        }
    }

    /// The address of `source`.
    pub fn listen_addr(&self) -> Result<std::net::SocketAddr, String> {
        if self.source.starts_with("rtsp://") || self.source.starts_with("rtsps://") {
            return Err(format!(
                "source {:?}: pulling from an RTSP camera is not built yet (issue 39); use udp-listen://IP:PORT or \"publish\"",
                self.source
            ));
        }
        let a = self.source.strip_prefix("udp-listen://").ok_or_else(|| {
            format!(
                "source {:?}: udp-listen://IP:PORT or \"publish\"",
                self.source
            )
        })?;
        a.parse()
            .map_err(|e| format!("source {:?}: {e} (want udp-listen://IP:PORT)", self.source))
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
}

impl Default for RtspConfig {
    fn default() -> RtspConfig {
        RtspConfig {
            listen: "127.0.0.1:8554".into(),
            sessions_max: 256,
            sessions_per_address_max: 16,
            setup_timeout_ms: 10_000,
            unplayed_setups_max: 16,
            pause_hold_ms: 60_000,
            session_timeout_ms: 60_000,
            request_bytes_max: 8192,
            connections_max: 256,
            connections_per_address_max: 32,
            request_timeout_ms: 10_000,
            rtp_port_min: 20_000,
            rtp_port_max: 29_999,
            send_timeout_ms: 10_000,
            rtcp_interval_ms: 5_000,
            media_cached_max: 64,
            plan_entries_max: penstock_core::ts::pcr::PLAN_ENTRIES_MAX_DEFAULT,
            scale_max: 4,
            direct_reads: true,
            zero_copy_sends: true,
            interleaved_direct: true,
            live: BTreeMap::new(),
        }
    }
}

impl RtspConfig {
    /// Whether the RTSP server is off (`listen = ""` or `[]`).
    pub fn is_off(&self) -> bool {
        self.listen.0.iter().all(|a| a.trim().is_empty())
    }

    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms)
    }

    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }

    pub fn setup_timeout(&self) -> Duration {
        Duration::from_millis(self.setup_timeout_ms)
    }

    pub fn pause_hold(&self) -> Duration {
        Duration::from_millis(self.pause_hold_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if !self.is_off() {
            self.listen
                .check()
                .map_err(|e| ConfigError::Invalid(format!("rtsp.listen: {e}")))?;
            self.listen
                .check_family(true)
                .map_err(|e| ConfigError::Invalid(format!("rtsp.listen: {e}")))?;
        }
        if self.sessions_max == 0 || self.sessions_max > 1_000_000 {
            return bad("rtsp.sessions_max must be 1 ..= 1000000".into());
        }
        if self.sessions_per_address_max == 0 || self.unplayed_setups_max == 0 {
            return bad(
                "rtsp.sessions_per_address_max and rtsp.unplayed_setups_max must be above 0".into(),
            );
        }
        if self.setup_timeout_ms < 100 || self.setup_timeout_ms > 3_600_000 {
            return bad("rtsp.setup_timeout_ms must be 100ms ..= 1h".into());
        }
        if self.pause_hold_ms < 100 || self.pause_hold_ms > 86_400_000 {
            return bad("rtsp.pause_hold_ms must be 100ms ..= 24h".into());
        }
        if self.session_timeout_ms < 1000 || self.session_timeout_ms > 3_600_000 {
            return bad("rtsp.session_timeout_ms must be 1s ..= 1h".into());
        }
        if self.request_bytes_max < 256 || self.request_bytes_max > (1 << 20) {
            return bad("rtsp.request_bytes_max must be 256 ..= 1 MiB".into());
        }
        if self.connections_max == 0 || self.connections_max > 1_000_000 {
            return bad("rtsp.connections_max must be 1 ..= 1000000".into());
        }
        if self.connections_per_address_max == 0 {
            return bad("rtsp.connections_per_address_max must be above 0".into());
        }
        if self.request_timeout_ms < 100 || self.request_timeout_ms > 3_600_000 {
            return bad("rtsp.request_timeout_ms must be 100ms ..= 1h".into());
        }
        if self.rtp_port_min < 1024
            || self.rtp_port_max == u16::MAX
            || self.rtp_port_min.saturating_add(1) > self.rtp_port_max
        {
            return bad(format!(
                "rtsp.rtp_port_min {} ..= rtsp.rtp_port_max {}: a range of at least one pair, within 1024 ..= 65534",
                self.rtp_port_min, self.rtp_port_max
            ));
        }
        if self.send_timeout_ms == 0 || self.rtcp_interval_ms < 100 {
            return bad(
                "rtsp.send_timeout_ms must be above 0, rtsp.rtcp_interval_ms at least 100ms".into(),
            );
        }
        if self.media_cached_max == 0 || self.plan_entries_max == 0 {
            return bad("rtsp.media_cached_max and rtsp.plan_entries_max must be above 0".into());
        }
        if self.scale_max == 0
            || u64::from(self.scale_max) > penstock_core::track::playback::SPEED_MAX
        {
            return bad(format!(
                "rtsp.scale_max must be 1 ..= {}",
                penstock_core::track::playback::SPEED_MAX
            ));
        }
        if self.is_off() && !self.live.is_empty() {
            return bad("live sources need the RTSP server: rtsp.listen is off".into());
        }
        let mut addrs = Vec::new();
        for (name, l) in &self.live {
            if name.is_empty()
                || name.starts_with('/')
                || name.contains(|c: char| c.is_whitespace() || c.is_control())
                || name.split('/').any(|p| p == ".." || p == ".")
            {
                return bad(format!(
                    "live.{name:?}: a name is a URL path: not empty, no spaces, no leading /, no . or .."
                ));
            }
            if l.is_publish() {
                if l.publishers.is_empty() {
                    return bad(format!(
                        "live.{name}: source = \"publish\" needs publishers = [\"USER\", …] (users of [auth] digest_users_file): a publish path is never open"
                    ));
                }
                if !(256..=(1 << 20)).contains(&l.sdp_bytes_max)
                    || !(1..=16).contains(&l.tracks_max)
                    || !(1500..=usize::from(u16::MAX)).contains(&l.frame_bytes_max)
                    || !((64 << 10)..=(64 << 20)).contains(&l.access_unit_bytes_max)
                {
                    return bad(format!(
                        "live.{name}: sdp_bytes_max 256 ..= 1 MiB, tracks_max 1 ..= 16, frame_bytes_max 1500 ..= 65535, access_unit_bytes_max 64 KiB ..= 64 MiB"
                    ));
                }
            } else {
                if !l.publishers.is_empty() {
                    return bad(format!(
                        "live.{name}: publishers is for source = \"publish\""
                    ));
                }
                let a = l
                    .listen_addr()
                    .map_err(|e| ConfigError::Invalid(format!("live.{name}: {e}")))?;
                if addrs.contains(&a) {
                    return bad(format!("live.{name}: {a} is another live source's too"));
                }
                addrs.push(a);
            }
            if let Some(LiveRecord::Segments(r)) = &l.record {
                r.check(name).map_err(ConfigError::Invalid)?;
            }
            if l.queue_datagrams_max == 0 || l.queue_datagrams_max > 1 << 20 {
                return bad(format!(
                    "live.{name}.queue_datagrams_max must be 1 ..= 1048576"
                ));
            }
            if l.idle_timeout_ms < 100 || l.idle_timeout_ms > 86_400_000 {
                return bad(format!("live.{name}.idle_timeout must be 100ms ..= 24h"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ServerConfig;

    #[test]
    fn rtsp_is_on_at_8554_by_default_and_off_with_an_empty_listen() {
        let c: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(c.rtsp.listen.0, ["127.0.0.1:8554"]);
        assert!(!c.rtsp.is_off());
        c.check().unwrap();
        for off in ["[rtsp]\nlisten = \"\"\n", "[rtsp]\nlisten = []\n"] {
            let c: ServerConfig = toml::from_str(off).unwrap();
            assert!(c.rtsp.is_off(), "{off}");
            c.check().unwrap();
        }
    }

    #[test]
    fn rtsp_durations_and_sizes_take_units_and_bad_values_are_refused() {
        let c: ServerConfig = toml::from_str(
            "[rtsp]\nsession_timeout = \"30s\"\nrequest_bytes_max = \"4KiB\"\nsend_timeout_ms = \"2s\"\n",
        )
        .unwrap();
        assert_eq!(c.rtsp.session_timeout_ms, 30_000);
        assert_eq!(c.rtsp.request_bytes_max, 4096);
        assert_eq!(c.rtsp.send_timeout_ms, 2_000);
        for bad in [
            "[rtsp]\nsessions_max = 0\n",
            "[rtsp]\nsession_timeout = \"10ms\"\n",
            "[rtsp]\nrtp_port_min = 30000\nrtp_port_max = 30000\n",
            "[rtsp]\nrtp_port_min = 80\n",
            "[rtsp]\nlisten = \"nohost:\"\n",
            "[rtsp]\nconnections_per_address_max = 0\n",
            "[rtsp]\nrequest_timeout = \"10ms\"\n",
            "[rtsp]\nsessions_per_address_max = 0\n",
            "[rtsp]\nunplayed_setups_max = 0\n",
            "[rtsp]\nsetup_timeout = \"1ms\"\n",
            "[rtsp]\npause_hold = \"1ms\"\n",
            "[rtsp]\nsessions_max = 2000\n",
        ] {
            let c: ServerConfig = toml::from_str(bad).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        assert!(toml::from_str::<ServerConfig>("[rtsp]\nnope = 1\n").is_err());
    }

    #[test]
    fn live_sources_parse_with_units_and_bad_ones_are_refused() {
        let c: ServerConfig = toml::from_str(
            "[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = \"/tmp/x.ts\"\nidle_timeout = \"2s\"\nformat = \"rtp\"\n",
        )
        .unwrap();
        c.check().unwrap();
        let l = &c.rtsp.live["cam"];
        assert_eq!(l.idle_timeout_ms, 2_000);
        assert_eq!(l.queue_datagrams_max, 256);
        assert_eq!(l.format, super::LiveFormat::Rtp);
        assert_eq!(l.listen_addr().unwrap().port(), 5004);
        for bad in [
            "[rtsp.live.cam]\nsource = \"udp://127.0.0.1:5004\"\n",
            "[rtsp.live.cam]\nsource = \"udp-listen://nohost\"\n",
            "[rtsp.live.\"a b\"]\nsource = \"udp-listen://127.0.0.1:5004\"\n",
            "[rtsp.live.\"..\"]\nsource = \"udp-listen://127.0.0.1:5004\"\n",
            "[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nqueue_datagrams_max = 0\n",
            "[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nidle_timeout = \"1ms\"\n",
            "[rtsp.live.a]\nsource = \"udp-listen://127.0.0.1:5004\"\n[rtsp.live.b]\nsource = \"udp-listen://127.0.0.1:5004\"\n",
            "[rtsp]\nlisten = \"\"\n[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\n",
            "[rtsp.live.cam]\nsource = \"publish\"\n",
            "[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\npublishers = [\"a\"]\n",
            "[rtsp.live.cam]\nsource = \"publish\"\npublishers = [\"a\"]\ntracks_max = 0\n",
            "[auth]\ndigest_users_file = \"/nonexistent\"\n[rtsp.live.cam]\nsource = \"publish\"\npublishers = [\"a\"]\nframe_bytes_max = 100\n",
            "[rtsp.live.cam]\nsource = \"publish\"\npublishers = [\"a\"]\n",
        ] {
            let c: ServerConfig = toml::from_str(bad).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        assert!(
            toml::from_str::<ServerConfig>(
                "[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nnope = 1\n"
            )
            .is_err()
        );
    }

    #[test]
    fn the_live_form_takes_a_segmented_record_and_both_forms_are_one_config() {
        use super::{LiveRecord, SegmentLengthConfig};
        let c: ServerConfig = toml::from_str(
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"/srv/rec\", segment = \"10m\", keep = \"7d\", max_bytes = \"500GiB\" }\n\
             [live.b]\nsource = \"udp-listen://127.0.0.1:5006\"\nrecord = { dir = \"/srv/rec\", segment = \"256MiB\" }\n\
             [rtsp.live.old]\nsource = \"udp-listen://127.0.0.1:5005\"\nrecord = \"/tmp/old.ts\"\n",
        )
        .unwrap();
        c.check().unwrap();
        let all = c.live_sources();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["b", "cam", "old"]);
        let Some(LiveRecord::Segments(r)) = &all["cam"].record else {
            panic!("{:?}", all["cam"].record);
        };
        assert_eq!(r.segment, SegmentLengthConfig::Ms(600_000));
        assert_eq!(r.keep, Some(7 * 86_400_000));
        assert_eq!(r.max_bytes, Some(500 << 30));
        assert_eq!(r.dir_of("a/b"), std::path::Path::new("/srv/rec/a_b"));
        let Some(LiveRecord::Segments(b)) = &all["b"].record else {
            panic!()
        };
        assert_eq!(b.segment, SegmentLengthConfig::Bytes(256 << 20));
        assert_eq!((b.keep, b.max_bytes), (None, None));
        assert_eq!(
            all["old"].record,
            Some(LiveRecord::File("/tmp/old.ts".into()))
        );
        assert!(c.old_live_form_warning().unwrap().contains("[live.old]"));
        assert!(c.rtsp_with_live().live.contains_key("cam"));
        let fresh: ServerConfig =
            toml::from_str("[live.cam]\nsource = \"publish\"\npublishers = [\"a\"]\n").unwrap();
        assert_eq!(fresh.old_live_form_warning(), None);
        for bad in [
            // Named twice, in both forms.
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\n[rtsp.live.cam]\nsource = \"udp-listen://127.0.0.1:5005\"\n",
            "[live.cam]\nsource = \"rtsp://camera/stream\"\n",
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"/r\", segment = \"500ms\" }\n",
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"/r\", segment = \"1KiB\" }\n",
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"/r\", keep = \"0s\" }\n",
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"\" }\n",
            // Two forms' sources on one address.
            "[live.a]\nsource = \"udp-listen://127.0.0.1:5004\"\n[rtsp.live.b]\nsource = \"udp-listen://127.0.0.1:5004\"\n",
        ] {
            let c: ServerConfig = toml::from_str(bad).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        let e = toml::from_str::<ServerConfig>(
            "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"/r\", segment = \"soon\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("a duration"), "{e}");
        assert!(
            toml::from_str::<ServerConfig>(
                "[live.cam]\nsource = \"udp-listen://127.0.0.1:5004\"\nrecord = { dir = \"/r\", nope = 1 }\n"
            )
            .is_err()
        );
    }
}
