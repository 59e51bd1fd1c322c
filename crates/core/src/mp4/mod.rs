//! MP4 (ISO BMFF) read in the core: the box walker ([`boxes`]), a movie's tracks and their
//! **sample index** ([`movie`]: per sample its offset, size, decode time and composition
//! offset; per track its sync samples), and fragmented MP4 made from it ([`write`]: the init
//! segment and each media segment's `moof` + `mdat` header; [`package`]: segments cut at video
//! sync samples, the HLS playlists and the DASH manifest that name them).
//!
//! Pure, as the rest of the core: the caller reads the file and hands bytes in. A plain MP4 is
//! indexed in two steps: [`boxes::top_level`] walks the file's top-level box headers (16 bytes
//! read per box) until it finds `moov`, which the caller then reads whole with one range read
//! (at the start with `-movflags +faststart`, at the end without), and [`movie::parse_movie`]
//! turns it into a [`Movie`].
//!
//! **Our own reader, not a crate.** `mp4-atom` (kixelated), `mp4` (alfg) and `re_mp4` (its
//! fork) were compared (2026-11): each decodes every table into owned `Vec`s of typed entries
//! (`StszBox::sample_sizes: Vec<u32>` and the like) — a second copy of each table before an
//! index is built from it — and none gives a sample index: the stsc/stco expansion into
//! byte ranges of the file, which is what a zero-copy packager sends, would be ours either
//! way. `mp4-atom` also pulls `num`, `derive_more`, `paste` and `tracing` into the core. The
//! tables this needs are a dozen fixed layouts; reading them straight from the `moov` slice,
//! every count checked against the box's own length and against [`Mp4Limits`] before
//! anything is allocated (a 2^32-entry `stsz` is refused, not attempted), is short and
//! fuzzed (`fuzz/fuzz_targets/mp4.rs`). Fragmented MP4 ([`frag`], issue 32 item 2) extends
//! this reader: the same walker, the same `moov` reader, its `moof`s read by [`frag`].
//!
//! The sample index serves RTSP too (issue 36 item 3, `crate::rtp::mp4`): samples in decode order
//! with their file byte ranges, the sync samples as a sorted list (seek: the sync sample at
//! or before a time), and each track's codec configuration (avcC / hvcC parameter sets, the
//! AAC AudioSpecificConfig) for an SDP.

pub mod boxes;
pub mod frag;
pub mod movie;
pub mod package;
pub mod timing;
pub mod trick;
pub mod write;

#[cfg(test)]
mod frag_tests;
#[cfg(test)]
mod tests;

pub use boxes::{BoxHeader, TopBox, top_level};
pub use frag::{
    FragIndexer, FragSegment, Fragment, FragmentedMp4, Need, TrackRun, index_fragmented,
};
pub use movie::{Codec, Edit, Movie, Sample, Track, TrackKind, parse_movie};
pub use package::{
    CutTrack, KeySegment, MediaSegment, Packaging, SegmentSpan, dash_manifest, hls_i_frames,
    hls_master, hls_media, key_segment, key_segments,
};
pub use timing::{Mp4PlanError, plan_mp4};
pub use trick::{Trick, TrickFrame, trick_frames};

/// Bounds on what an MP4 may make the reader allocate (a file is input like any other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mp4Limits {
    /// The largest `moov` read (it is read whole, in memory).
    pub moov_bytes_max: u64,
    /// Samples of all tracks together (24 bytes each in the index).
    pub samples_max: u64,
    /// Tracks kept (video and audio).
    pub tracks_max: usize,
    /// Top-level boxes walked before `moov` is found (in a fragmented MP4: boxes other
    /// than `moof` and `mdat` in the whole file).
    pub top_boxes_max: usize,
    /// Fragments (`moof`) of a fragmented MP4 (about 48 bytes each in the index, plus 40 per
    /// track run).
    pub fragments_max: usize,
    /// The largest `moof` read (each is read whole, in memory, once).
    pub moof_bytes_max: u64,
}

impl Default for Mp4Limits {
    fn default() -> Self {
        Mp4Limits {
            moov_bytes_max: 64 << 20,
            // A 3-hour 60 fps title with 48 kHz AAC: 648,000 video + 506,250 audio samples.
            samples_max: 1 << 22,
            tracks_max: 16,
            top_boxes_max: 4096,
            // A 3-hour title in fragments of one 60 fps frame each (low-latency CMAF).
            fragments_max: 1 << 20,
            moof_bytes_max: 16 << 20,
        }
    }
}

/// Why an MP4 has no index (each names what it found; the server answers 415 with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Mp4Error {
    #[error("not MP4: box at offset {offset}: {why}")]
    BadBox { offset: u64, why: &'static str },
    #[error("no moov box in the file")]
    NoMoov,
    #[error("moov of {0} bytes is larger than the limit of {1}")]
    MoovTooLarge(u64, u64),
    #[error("more than {0} top-level boxes before moov")]
    TooManyBoxes(usize),
    #[error("moov is truncated: {0}")]
    Truncated(&'static str),
    #[error("box {0} is missing")]
    Missing(&'static str),
    #[error("{table} claims {count} entries, more than its {bytes} bytes hold")]
    TableOverrun {
        table: &'static str,
        count: u64,
        bytes: usize,
    },
    #[error("{0} samples in the file, more than the limit of {1}")]
    TooManySamples(u64, u64),
    #[error("more than {0} tracks")]
    TooManyTracks(usize),
    #[error("track {track}: sample {sample} lies past the end of the file ({end} > {file_len})")]
    SamplePastEnd {
        track: u32,
        sample: u64,
        end: u64,
        file_len: u64,
    },
    #[error("track {track}: the sample tables disagree: {why}")]
    Inconsistent { track: u32, why: &'static str },
    #[error(
        "track {track}: unsupported codec '{codec}' (H.264 avc1/avc3, H.265 hvc1/hev1, AAC mp4a are supported)"
    )]
    UnknownCodec { track: u32, codec: String },
    #[error(
        "track {track}: edit list of {entries} entries (one edit, optionally after one empty edit, is supported)"
    )]
    EditList { track: u32, entries: u32 },
    #[error("no video or audio track")]
    NoTracks,
    /// A `moov` with `mvex`: its samples are in fragments ([`frag`] indexes them).
    #[error(
        "the movie is fragmented (its samples are in moof fragments): it is served as HLS and DASH of its own byte ranges (PATH/index.m3u8, PATH/manifest.mpd), not by RTSP"
    )]
    Fragmented,
    #[error("the movie is not fragmented (no mvex in moov)")]
    NotFragmented,
    #[error("a moof at offset {offset} comes before the moov")]
    FragmentBeforeMoov { offset: u64 },
    #[error(
        "the fragment at offset {offset} is truncated: it ends at {end}, the file at {file_len}"
    )]
    FragmentTruncated {
        offset: u64,
        end: u64,
        file_len: u64,
    },
    #[error(
        "the moof at offset {offset}: track {track}'s samples run past the end of the file ({end} > {file_len})"
    )]
    FragmentPastEnd {
        offset: u64,
        track: u32,
        end: u64,
        file_len: u64,
    },
    #[error(
        "the fragment at offset {offset}: track {track}'s samples lie outside the fragment's moof and mdat"
    )]
    FragmentDataOutside { offset: u64, track: u32 },
    #[error("the moof at offset {offset} names track {track}, which the moov does not declare")]
    FragmentBadTrack { offset: u64, track: u32 },
    #[error(
        "track {track}: the fragmented movie's moov holds samples of its own (written without empty_moov); remux with -movflags +frag_keyframe+empty_moov+default_base_moof"
    )]
    SamplesInFragmentedMoov { track: u32 },
    #[error("more than {0} fragments (moof)")]
    TooManyFragments(usize),
    #[error("the moof at offset {offset} has {bytes} bytes, more than the limit of {max}")]
    MoofTooLarge { offset: u64, bytes: u64, max: u64 },
}
