//! HLS cut from the media's own index: a TS file's key frames ([`ts_index`]) give segments
//! that are byte ranges of the file itself, and [`playlist`] writes the media playlist
//! (RFC 8216) that names them. The server answers `GET /PATH/index.m3u8` with it and each
//! segment is an ordinary range request of PATH (sendfile: no segment files, no remux).
//! A directory of renditions of one title gets a multivariant playlist ([`master`]) whose
//! figures are measured from the cut segments and read from the streams ([`media`]).

pub mod live;
pub mod master;
pub mod media;
pub mod playlist;
pub mod session;
pub mod ts_index;

pub use live::{
    Blocking, LiveFile, LiveIndex, LiveKeyFrame, LiveSegment, LiveView, TsPsi, find_psi,
    key_frame_in,
};
pub use master::{Variant, bandwidth, i_frame_bandwidth, master_playlist};
pub use media::{
    Adts, H264Sps, H265Sps, MediaError, StreamInfo, parse_adts, parse_h264_sps, parse_h265_sps,
    stream_info,
};
pub use playlist::{
    IFrame, Segment, i_frame_map, i_frame_playlist, i_frames, map_range, media_playlist, segments,
};
pub use ts_index::{
    AudioStream, KeyFrame, PTS_TICKS_PER_S, SPS_SCAN_BYTES, TsIndex, TsIndexError, TsIndexLimits,
    TsIndexer, VideoCodec,
};

#[cfg(test)]
mod tests;
