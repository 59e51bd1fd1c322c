//! HLS cut from the media's own index: a TS file's key frames ([`ts_index`]) give segments
//! that are byte ranges of the file itself, and [`playlist`] writes the media playlist
//! (RFC 8216) that names them. The server answers `GET /PATH/index.m3u8` with it and each
//! segment is an ordinary range request of PATH (sendfile: no segment files, no remux).

pub mod playlist;
pub mod ts_index;

pub use playlist::{Segment, map_range, media_playlist, segments};
pub use ts_index::{
    KeyFrame, PTS_TICKS_PER_S, TsIndex, TsIndexError, TsIndexLimits, TsIndexer, VideoCodec,
};

#[cfg(test)]
mod tests;
