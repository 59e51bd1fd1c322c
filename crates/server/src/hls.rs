//! HLS for TS files beneath the root (docs/hls.md): `GET /PATH/index.m3u8`, PATH a `.ts`
//! file, answers a VOD media playlist whose segments are byte ranges of PATH cut at its key
//! frames (`penstock_core::hls`). The key-frame index of a file is built once, by reading it
//! through, and kept in a small cache keyed by device, inode, size and modification time, so
//! a changed file is indexed again. Segments are ordinary range requests of PATH, answered by
//! the HTTP server's range code (sendfile, or the engine).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{Arc, Mutex};

use penstock_core::hls::{
    PTS_TICKS_PER_S, TsIndex, TsIndexError, TsIndexLimits, TsIndexer, Variant, bandwidth,
    map_range, media_playlist, segments, stream_info,
};

use crate::config::HlsConfig;

/// What identifies one version of a file: device, inode, size, mtime (s, ns).
type FileKey = (u64, u64, u64, i64, i64);

/// Why a playlist cannot be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HlsError {
    /// The file is not TS with a video stream and key frames: 415.
    #[error("{0}")]
    Index(#[from] TsIndexError),
    /// Reading the file failed: 500.
    #[error("reading the file: {0}")]
    Io(#[from] std::io::Error),
}

/// The key-frame indexes of the files played, and the settings.
pub(crate) struct Hls {
    cfg: HlsConfig,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    map: HashMap<FileKey, Arc<TsIndex>>,
    /// Insertion order: the oldest goes first when the cache is full.
    order: VecDeque<FileKey>,
}

/// Bytes read at a time while indexing.
const READ_BYTES: usize = 1 << 20;

impl Hls {
    pub(crate) fn new(cfg: HlsConfig) -> Hls {
        Hls {
            cfg,
            cache: Mutex::new(Cache::default()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// The most TS files a multivariant playlist lists.
    pub(crate) fn renditions_max(&self) -> usize {
        self.cfg.renditions_max
    }

    fn target_ticks(&self) -> u64 {
        self.cfg.target_duration_ms.max(1) * PTS_TICKS_PER_S / 1000
    }

    /// The media playlist of `file`, whose segments name it as `uri` (relative to the
    /// playlist's own URL; escaped by the caller).
    pub(crate) fn playlist(&self, file: &File, uri: &str) -> Result<String, HlsError> {
        let index = self.index(file)?;
        let segs = segments(&index, self.target_ticks());
        Ok(media_playlist(&segs, uri, map_range(&index)))
    }

    /// `file` as one rendition of a multivariant playlist, its media playlist named `uri`:
    /// the bandwidth of the segments [`Hls::playlist`] cuts, the size and codecs its streams
    /// say.
    pub(crate) fn variant(&self, file: &File, uri: String) -> Result<Variant, HlsError> {
        let index = self.index(file)?;
        let (peak, average) = bandwidth(&segments(&index, self.target_ticks()));
        let info = stream_info(&index);
        Ok(Variant {
            uri,
            bandwidth: peak,
            average_bandwidth: average,
            resolution: info.resolution,
            codecs: info.codecs,
        })
    }

    /// The index of `file`, from the cache while the file is unchanged, else read now.
    fn index(&self, file: &File) -> Result<Arc<TsIndex>, HlsError> {
        let m = file.metadata()?;
        let key = (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
        if let Some(ix) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .get(&key)
        {
            return Ok(ix.clone());
        }
        let mut indexer = TsIndexer::new(TsIndexLimits::default());
        let mut buf = vec![0u8; READ_BYTES];
        let mut at = 0u64;
        while at < m.len() {
            let n = file.read_at(&mut buf, at)?;
            if n == 0 {
                break;
            }
            indexer.push(&buf[..n]);
            at += n as u64;
        }
        let ix = Arc::new(indexer.finish()?);
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if c.map.insert(key, ix.clone()).is_none() {
            c.order.push_back(key);
        }
        while c.map.len() > self.cfg.index_cache_entries.max(1) {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            c.map.remove(&old);
        }
        Ok(ix)
    }
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

/// Whether a directory entry named `name` is a rendition a multivariant playlist considers:
/// not hidden, named `.ts` or `.m2ts` (any case).
pub(crate) fn is_rendition_name(name: &str) -> bool {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    !name.starts_with('.') && matches!(ext.as_deref(), Some("ts" | "m2ts"))
}

#[cfg(test)]
mod tests {
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
    }
}
