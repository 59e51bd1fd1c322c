//! Validators and conditional requests (RFC 9110 §8.8, §13): ETag, If-None-Match,
//! If-Modified-Since, If-Range. If-Match and If-Unmodified-Since (412) are not evaluated
//! yet: they guard against lost updates, which a read-only server cannot cause, so a client
//! sending them still gets the current file.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use super::date::{parse_http_date, unix_secs};
use super::request::Request;

/// A strong entity-tag, quotes included: `"<mtime_ns_hex>-<size_hex>"`, nginx's shape
/// (`"mtime-size"`) with the mtime in nanoseconds rather than seconds, so that a file
/// rewritten twice in the same second to the same size still changes its tag.
///
/// The inode is deliberately left out: two servers (or a restored backup) serving the same
/// tree then agree on tags, the reason nginx and Apache 2.4 also dropped it. The driver
/// detects an in-place change from the size and mtime of a fresh `statx`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(String);

impl ETag {
    /// The tag of a file of `len_bytes` bytes last modified at `mtime` (times before the
    /// epoch count as the epoch).
    pub fn for_file(len_bytes: u64, mtime: SystemTime) -> ETag {
        let mtime_ns = mtime.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        ETag(format!("\"{mtime_ns:x}-{len_bytes:x}\""))
    }

    /// The tag of version `generation` (of `len_bytes` bytes) of a resource that counts its
    /// versions, such as a volume partition (bumped by every committed write or truncation).
    pub fn for_generation(generation: u64, len_bytes: u64) -> ETag {
        ETag(format!("\"g{generation:x}-{len_bytes:x}\""))
    }

    /// The header value, quotes included.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The opaque part between the quotes.
    fn opaque(&self) -> &str {
        &self.0[1..self.0.len() - 1]
    }
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The outcome of the preconditions that apply to a GET or HEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Serve the file (200 or 206).
    Proceed,
    /// 304: the client's copy is current.
    NotModified,
}

/// RFC 9110 §13.2.2 steps 3 and 4 for GET/HEAD: If-None-Match (weak comparison, `*`
/// matches any existing file) → 304; only when it is absent, If-Modified-Since → 304 when
/// the file is not newer than the date (at HTTP's one-second resolution).
pub fn evaluate_preconditions(
    req: &Request,
    etag: &ETag,
    last_modified: SystemTime,
) -> Precondition {
    if let Some(inm) = &req.if_none_match {
        return match parse_entity_tags(inm) {
            Some(TagList::Any) => Precondition::NotModified,
            Some(TagList::Tags(tags)) if tags.iter().any(|t| t.opaque == etag.opaque()) => {
                Precondition::NotModified
            }
            // No match, or an unparsable list (treated as matching nothing): send the file.
            _ => Precondition::Proceed,
        };
    }
    if req
        .if_modified_since
        .is_some_and(|ims| unix_secs(last_modified) <= unix_secs(ims))
    {
        return Precondition::NotModified;
    }
    Precondition::Proceed
}

/// RFC 9110 §13.1.5: whether a `Range` may be honoured given `If-Range`. An entity-tag must
/// match strongly (a weak tag never does); a date must equal the file's Last-Modified to the
/// second. Anything else, including garbage, means "send the whole file", which is always
/// safe. `None` (no If-Range) allows the range.
pub fn if_range_allows(if_range: Option<&str>, etag: &ETag, last_modified: SystemTime) -> bool {
    let Some(v) = if_range.map(str::trim) else {
        return true;
    };
    if v.starts_with('"') || v.starts_with("W/") {
        return match parse_entity_tags(v) {
            Some(TagList::Tags(tags)) => {
                tags.len() == 1 && !tags[0].weak && tags[0].opaque == etag.opaque()
            }
            _ => false,
        };
    }
    parse_http_date(v).is_some_and(|d| unix_secs(d) == unix_secs(last_modified))
}

#[derive(Debug, PartialEq, Eq)]
struct EntityTag<'a> {
    weak: bool,
    opaque: &'a str,
}

#[derive(Debug, PartialEq, Eq)]
enum TagList<'a> {
    Any,
    Tags(Vec<EntityTag<'a>>),
}

/// `"*" / 1#entity-tag`. Quoted tags may contain commas, so this scans rather than splits.
/// `None` when malformed.
fn parse_entity_tags(v: &str) -> Option<TagList<'_>> {
    let v = v.trim();
    if v == "*" {
        return Some(TagList::Any);
    }
    let mut tags = Vec::new();
    let mut rest = v;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            break;
        }
        let (weak, quoted) = match rest.strip_prefix("W/") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let body = quoted.strip_prefix('"')?;
        let end = body.find('"')?;
        tags.push(EntityTag {
            weak,
            opaque: &body[..end],
        });
        rest = &body[end + 1..];
        let next = rest.trim_start_matches([' ', '\t']);
        if !(next.is_empty() || next.starts_with(',')) {
            return None;
        }
        rest = next;
    }
    if tags.is_empty() {
        None
    } else {
        Some(TagList::Tags(tags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Limits, Parsed, parse_request};
    use std::time::Duration;

    fn req(extra: &str) -> Request {
        let s = format!("GET /f HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        match parse_request(s.as_bytes(), &Limits::default()) {
            Ok(Parsed::Complete { request, .. }) => request,
            other => panic!("{other:?}"),
        }
    }

    fn mtime() -> SystemTime {
        UNIX_EPOCH + Duration::new(784_111_777, 123_456_789)
    }

    #[test]
    fn etag_shape() {
        let t = ETag::for_file(0x1000, UNIX_EPOCH + Duration::from_nanos(0xabc));
        assert_eq!(t.as_str(), "\"abc-1000\"");
        assert_eq!(
            ETag::for_file(1, UNIX_EPOCH - Duration::from_secs(1)).as_str(),
            "\"0-1\""
        );
        assert_ne!(
            ETag::for_file(5, mtime()),
            ETag::for_file(5, mtime() + Duration::from_nanos(1))
        );
    }

    #[test]
    fn if_none_match() {
        let tag = ETag::for_file(100, mtime());
        let t = tag.as_str();
        let eval = |h: &str| evaluate_preconditions(&req(h), &tag, mtime());
        assert_eq!(eval(""), Precondition::Proceed);
        assert_eq!(
            eval(&format!("If-None-Match: {t}\r\n")),
            Precondition::NotModified
        );
        assert_eq!(
            eval(&format!("If-None-Match: W/{t}\r\n")),
            Precondition::NotModified
        );
        assert_eq!(
            eval(&format!("If-None-Match: \"x\", {t}\r\n")),
            Precondition::NotModified
        );
        assert_eq!(
            eval(&format!("If-None-Match: \"x\"\r\nIf-None-Match: {t}\r\n")),
            Precondition::NotModified
        );
        assert_eq!(
            eval("If-None-Match: \"a,b\", \"c\"\r\n"),
            Precondition::Proceed
        );
        assert_eq!(eval("If-None-Match: *\r\n"), Precondition::NotModified);
        assert_eq!(eval("If-None-Match: \"other\"\r\n"), Precondition::Proceed);
        assert_eq!(eval("If-None-Match: garbage\r\n"), Precondition::Proceed);
        // If-None-Match present and not matching: If-Modified-Since is not looked at.
        assert_eq!(
            eval(
                "If-None-Match: \"other\"\r\nIf-Modified-Since: Fri, 31 Dec 9999 23:59:59 GMT\r\n"
            ),
            Precondition::Proceed
        );
    }

    #[test]
    fn if_modified_since() {
        let tag = ETag::for_file(100, mtime());
        let eval = |h: &str| evaluate_preconditions(&req(h), &tag, mtime());
        // Same second as the mtime (its nanoseconds are below HTTP's resolution).
        assert_eq!(
            eval("If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n"),
            Precondition::NotModified
        );
        assert_eq!(
            eval("If-Modified-Since: Sun, 06 Nov 1994 08:49:38 GMT\r\n"),
            Precondition::NotModified
        );
        assert_eq!(
            eval("If-Modified-Since: Sun, 06 Nov 1994 08:49:36 GMT\r\n"),
            Precondition::Proceed
        );
        assert_eq!(
            eval("If-Modified-Since: not a date\r\n"),
            Precondition::Proceed
        );
    }

    #[test]
    fn if_range() {
        let tag = ETag::for_file(100, mtime());
        let t = tag.as_str();
        assert!(if_range_allows(None, &tag, mtime()));
        assert!(if_range_allows(Some(t), &tag, mtime()));
        assert!(!if_range_allows(Some(&format!("W/{t}")), &tag, mtime()));
        assert!(!if_range_allows(Some("\"other\""), &tag, mtime()));
        assert!(if_range_allows(
            Some("Sun, 06 Nov 1994 08:49:37 GMT"),
            &tag,
            mtime()
        ));
        assert!(!if_range_allows(
            Some("Sun, 06 Nov 1994 08:49:38 GMT"),
            &tag,
            mtime()
        ));
        assert!(!if_range_allows(Some("garbage"), &tag, mtime()));
    }

    #[test]
    fn entity_tag_lists() {
        assert_eq!(
            parse_entity_tags("\"a\" , W/\"b\",,"),
            Some(TagList::Tags(vec![
                EntityTag {
                    weak: false,
                    opaque: "a"
                },
                EntityTag {
                    weak: true,
                    opaque: "b"
                },
            ]))
        );
        assert_eq!(parse_entity_tags("\"a\"x"), None);
        assert_eq!(parse_entity_tags("\"a"), None);
        assert_eq!(parse_entity_tags(""), None);
    }
}
