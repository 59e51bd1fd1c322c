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
    ("m4s", "video/iso.segment"),
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

/// The `Content-Type` for a path, from its last extension, case-insensitively.
pub fn content_type_for_path(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or(path);
    let Some((stem, ext)) = name.rsplit_once('.') else {
        return DEFAULT_CONTENT_TYPE;
    };
    if stem.is_empty() {
        // `.bashrc` is a hidden file without an extension.
        return DEFAULT_CONTENT_TYPE;
    }
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
        assert_eq!(content_type_for_path("/x.m4s"), "video/iso.segment");
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
