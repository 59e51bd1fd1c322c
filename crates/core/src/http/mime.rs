//! `Content-Type` from a file name's extension: media types first (what penstock serves),
//! then the common web types. Unknown → `application/octet-stream`, which makes browsers
//! download rather than guess (no content sniffing on our side).

/// Extension (lower case) → media type. Textual types carry `charset=utf-8`.
const TYPES: &[(&str, &str)] = &[
    // Streaming media.
    ("ts", "video/mp2t"),
    ("m2ts", "video/mp2t"),
    ("mp4", "video/mp4"),
    ("m4v", "video/mp4"),
    // What HLS (RFC 8216 §3.3) and DASH players expect of fMP4 segments.
    ("m4s", "video/mp4"),
    ("m4a", "audio/mp4"),
    ("m3u8", "application/vnd.apple.mpegurl"),
    ("m3u", "audio/x-mpegurl"),
    ("mpd", "application/dash+xml"),
    ("webm", "video/webm"),
    ("mkv", "video/x-matroska"),
    ("mka", "audio/x-matroska"),
    ("mov", "video/quicktime"),
    ("avi", "video/x-msvideo"),
    ("mpg", "video/mpeg"),
    ("mpeg", "video/mpeg"),
    ("ogv", "video/ogg"),
    ("mp3", "audio/mpeg"),
    ("aac", "audio/aac"),
    ("flac", "audio/flac"),
    ("wav", "audio/wav"),
    ("ogg", "audio/ogg"),
    ("oga", "audio/ogg"),
    ("opus", "audio/ogg"),
    ("vtt", "text/vtt; charset=utf-8"),
    ("srt", "application/x-subrip"),
    // Web.
    ("html", "text/html; charset=utf-8"),
    ("htm", "text/html; charset=utf-8"),
    ("txt", "text/plain; charset=utf-8"),
    ("md", "text/markdown; charset=utf-8"),
    ("css", "text/css; charset=utf-8"),
    ("csv", "text/csv; charset=utf-8"),
    ("js", "text/javascript; charset=utf-8"),
    ("mjs", "text/javascript; charset=utf-8"),
    ("json", "application/json"),
    ("xml", "application/xml"),
    ("wasm", "application/wasm"),
    ("pdf", "application/pdf"),
    ("zip", "application/zip"),
    ("gz", "application/gzip"),
    ("tar", "application/x-tar"),
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
    ("avif", "image/avif"),
    ("svg", "image/svg+xml"),
    ("ico", "image/x-icon"),
    ("woff", "font/woff"),
    ("woff2", "font/woff2"),
];

/// The type for anything we do not recognise.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// The last extension of a path's file name (`a/b.tar.gz` → `gz`), as written; `None` for
/// no extension or a hidden file's name (`.bashrc`).
pub fn extension_of(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let (stem, ext) = name.rsplit_once('.')?;
    (!stem.is_empty() && !ext.is_empty()).then_some(ext)
}

/// Whether `t` may be sent as a `Content-Type`: `type/subtype` of RFC 9110 tokens, then
/// optional `; name=value` parameters, printable ASCII only (configured types are checked
/// with this before they can reach a head).
pub fn is_valid_media_type(t: &str) -> bool {
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    let token = |s: &str| !s.is_empty() && s.chars().all(tchar);
    let mut parts = t.split(';');
    let Some((ty, sub)) = parts.next().and_then(|m| m.trim().split_once('/')) else {
        return false;
    };
    token(ty)
        && token(sub)
        && parts.all(|p| {
            p.trim().split_once('=').is_some_and(|(n, v)| {
                token(n.trim()) && !v.is_empty() && v.chars().all(|c| c.is_ascii_graphic())
            })
        })
}

/// The `Content-Type` for a path, from its last extension, case-insensitively.
pub fn content_type_for_path(path: &str) -> &'static str {
    let Some(ext) = extension_of(path) else {
        return DEFAULT_CONTENT_TYPE;
    };
    TYPES
        .iter()
        .find(|(e, _)| e.eq_ignore_ascii_case(ext))
        .map_or(DEFAULT_CONTENT_TYPE, |(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        assert_eq!(content_type_for_path("/a/seg-001.ts"), "video/mp2t");
        assert_eq!(content_type_for_path("/a/MOVIE.MP4"), "video/mp4");
        assert_eq!(
            content_type_for_path("/live/index.m3u8"),
            "application/vnd.apple.mpegurl"
        );
        assert_eq!(content_type_for_path("/x.mpd"), "application/dash+xml");
        assert_eq!(content_type_for_path("/x.m4s"), "video/mp4");
        assert_eq!(content_type_for_path("/x.wasm"), "application/wasm");
        assert_eq!(
            content_type_for_path("/index.html"),
            "text/html; charset=utf-8"
        );
        assert_eq!(content_type_for_path("/x.tar.gz"), "application/gzip");
        assert_eq!(content_type_for_path("/README"), DEFAULT_CONTENT_TYPE);
        assert_eq!(content_type_for_path("/.mp4"), DEFAULT_CONTENT_TYPE);
        assert_eq!(content_type_for_path("/dir.mp4/file"), DEFAULT_CONTENT_TYPE);
        assert_eq!(content_type_for_path("/x.unknown"), DEFAULT_CONTENT_TYPE);
    }
}

#[cfg(test)]
mod media_type_tests {
    use super::*;

    #[test]
    fn extensions_and_types() {
        assert_eq!(extension_of("/a/b.tar.GZ"), Some("GZ"));
        assert_eq!(extension_of("/a/.bashrc"), None);
        assert_eq!(extension_of("/a.d/b"), None);
        assert_eq!(extension_of("/a/b."), None);
        for ok in [
            "video/mp2t",
            "text/plain; charset=utf-8",
            "application/vnd.apple.mpegurl",
        ] {
            assert!(is_valid_media_type(ok), "{ok}");
        }
        for bad in [
            "",
            "video",
            "video/",
            "/x",
            "a b/c",
            "text/plain\r\nX: y",
            "a/b; c",
            "a/b;=1",
            "a/é",
        ] {
            assert!(!is_valid_media_type(bad), "{bad:?}");
        }
    }
}
