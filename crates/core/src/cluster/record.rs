//! What a node publishes in etcd under `PREFIX/nodes/NAME`, attached to its lease: its
//! addresses and what it can still take. One `key=value` per line, UTF-8, at most
//! [`RECORD_BYTES_MAX`] bytes:
//!
//! ```text
//! penstock-node=1
//! name=edge-1
//! http=10.0.0.1:8080
//! rtsp=10.0.0.1:8554
//! control=10.0.0.1:7070
//! rt_bytes_per_s=12500000
//! rt_bytes_per_s_left=9000000
//! streams=3
//! streams_max=64
//! cache_bytes=-
//! ```
//!
//! `rtsp`, `control` and `cache_bytes` may be `-` (none; `cache_bytes` is `-` on a node
//! without an origin cache). Keys a newer version adds are skipped by older readers; a
//! missing required key, a duplicate key or a bad value refuses the record. Text rather than JSON: readable with
//! `etcdctl get`, and no serializer in the core.

use std::fmt::Write as _;

/// Longest record accepted.
pub const RECORD_BYTES_MAX: usize = 4096;

/// A node's name: 1 to 63 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit (usable
/// as an etcd key part, an HAProxy server name and a Prometheus label value as it is).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(String);

impl NodeName {
    pub fn new(s: &str) -> Result<NodeName, RecordError> {
        let ok = !s.is_empty()
            && s.len() <= 63
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(NodeName(s.to_string()))
        } else {
            Err(RecordError(format!(
                "node name {s:?}: 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A record that cannot be read (or a name or address that cannot be written into one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RecordError(pub String);

/// One node as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub name: NodeName,
    /// `host:port` of its HTTP server (what HAProxy connects to).
    pub http: String,
    /// `host:port` of its RTSP server, if it has one.
    pub rtsp: Option<String>,
    /// `host:port` of its control protocol TCP listener, if it has one.
    pub control: Option<String>,
    /// Network bandwidth admission may reserve for rt streams, and what is not reserved.
    pub rt_bytes_per_s: u64,
    pub rt_bytes_per_s_left: u64,
    /// Admitted streams now, and the most admission takes.
    pub streams: u32,
    pub streams_max: u32,
    /// Bytes in the origin cache (none until the node has one).
    pub cache_bytes: Option<u64>,
    /// The node's key for peer fills (lower-case hex, random per start): a node filling
    /// from another sends its name and this key, and the other honours the fill only when
    /// they match its listing (docs/origin.md). Anyone who can read etcd can read it, as
    /// they can read or change the membership itself. Absent in a record of an older node.
    pub fill_key: Option<String>,
    /// `host:port` of its first `https://` listener, if it has one: peer fills from this node
    /// go there over TLS (docs/origin.md). Absent in a record of an older node.
    pub https: Option<String>,
}

/// Checks a fill key: 16 to 64 lower-case hex digits.
pub fn check_fill_key(k: &str) -> Result<(), RecordError> {
    if (16..=64).contains(&k.len()) && k.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(RecordError(
            "fill_key: not 16 to 64 lower-case hex digits".into(),
        ))
    }
}

/// Checks a `host:port` address: a port, and a host of name characters or an IP literal
/// (`[v6]` bracketed) — nothing that could break a line of the record or of HAProxy's file.
pub fn check_address(what: &str, a: &str) -> Result<(), RecordError> {
    let bad = || {
        RecordError(format!(
            "{what} {a:?}: not HOST:PORT (a name, an IPv4 address or [IPv6], and a port)"
        ))
    };
    let (host, port) = a.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    };
    if host_ok { Ok(()) } else { Err(bad()) }
}

impl NodeRecord {
    /// The record's text.
    pub fn encode(&self) -> String {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        let mut s = String::with_capacity(256);
        // Writing to a String cannot fail.
        let _ = write!(
            s,
            "penstock-node=1\nname={}\nhttp={}\nrtsp={}\ncontrol={}\nrt_bytes_per_s={}\n\
             rt_bytes_per_s_left={}\nstreams={}\nstreams_max={}\ncache_bytes={}\nfill_key={}\n\
             https={}\n",
            self.name,
            self.http,
            opt(&self.rtsp),
            opt(&self.control),
            self.rt_bytes_per_s,
            self.rt_bytes_per_s_left,
            self.streams,
            self.streams_max,
            self.cache_bytes
                .map_or_else(|| "-".into(), |b| b.to_string()),
            opt(&self.fill_key),
            opt(&self.https),
        );
        s
    }

    /// Reads a record's text.
    pub fn decode(text: &str) -> Result<NodeRecord, RecordError> {
        if text.len() > RECORD_BYTES_MAX {
            return Err(RecordError(format!(
                "record of {} bytes, more than {RECORD_BYTES_MAX}",
                text.len()
            )));
        }
        const KEYS: [&str; 12] = [
            "penstock-node",
            "name",
            "http",
            "rtsp",
            "control",
            "rt_bytes_per_s",
            "rt_bytes_per_s_left",
            "streams",
            "streams_max",
            "cache_bytes",
            "fill_key",
            "https",
        ];
        let mut vals: [Option<&str>; 12] = [None; 12];
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| RecordError(format!("line {line:?}: not key=value")))?;
            // A key of a newer version: skipped.
            let Some(i) = KEYS.iter().position(|x| *x == k) else {
                continue;
            };
            if vals[i].replace(v).is_some() {
                return Err(RecordError(format!("key {k} twice")));
            }
        }
        let get = |i: usize| vals[i].ok_or_else(|| RecordError(format!("no {}", KEYS[i])));
        if get(0)? != "1" {
            return Err(RecordError(format!(
                "record version {:?}, this penstock reads 1",
                get(0)?
            )));
        }
        let num = |i: usize| -> Result<u64, RecordError> {
            let v = get(i)?;
            v.parse::<u64>()
                .map_err(|_| RecordError(format!("{} {v:?}: not a number", KEYS[i])))
        };
        let num32 = |i: usize| -> Result<u32, RecordError> {
            u32::try_from(num(i)?).map_err(|_| RecordError(format!("{}: too large", KEYS[i])))
        };
        let addr = |i: usize| -> Result<Option<String>, RecordError> {
            match get(i)? {
                "-" => Ok(None),
                a => {
                    check_address(KEYS[i], a)?;
                    Ok(Some(a.to_string()))
                }
            }
        };
        let http = addr(2)?.ok_or_else(|| RecordError("http: none".into()))?;
        let rt_bytes_per_s = num(5)?;
        let rt_bytes_per_s_left = num(6)?;
        if rt_bytes_per_s_left > rt_bytes_per_s {
            return Err(RecordError(format!(
                "rt_bytes_per_s_left {rt_bytes_per_s_left} above rt_bytes_per_s {rt_bytes_per_s}"
            )));
        }
        Ok(NodeRecord {
            name: NodeName::new(get(1)?)?,
            http,
            rtsp: addr(3)?,
            control: addr(4)?,
            rt_bytes_per_s,
            rt_bytes_per_s_left,
            streams: num32(7)?,
            streams_max: num32(8)?,
            cache_bytes: match get(9)? {
                "-" => None,
                _ => Some(num(9)?),
            },
            // Optional: a record of a node older than the key has none.
            fill_key: match vals[10] {
                None | Some("-") => None,
                Some(k) => {
                    check_fill_key(k)?;
                    Some(k.to_string())
                }
            },
            https: match vals[11] {
                None | Some("-") => None,
                Some(a) => {
                    check_address("https", a)?;
                    Some(a.to_string())
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn host() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z][a-z0-9.-]{0,20}".prop_map(|s| s),
            any::<[u8; 4]>().prop_map(|b| std::net::Ipv4Addr::from(b).to_string()),
            any::<[u16; 8]>().prop_map(|b| format!("[{}]", std::net::Ipv6Addr::from(b))),
        ]
    }

    fn record() -> impl Strategy<Value = NodeRecord> {
        (
            "[a-z0-9][a-z0-9._-]{0,30}",
            host(),
            any::<u16>(),
            proptest::option::of((host(), any::<u16>())),
            proptest::option::of((host(), any::<u16>())),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            proptest::option::of(any::<u64>()),
            proptest::option::of("[0-9a-f]{16,64}"),
            proptest::option::of((host(), any::<u16>())),
        )
            .prop_map(
                |(name, h, p, r, c, a, b, s, sm, cache, key, tls)| NodeRecord {
                    name: NodeName::new(&name).unwrap(),
                    http: format!("{h}:{p}"),
                    rtsp: r.map(|(h, p)| format!("{h}:{p}")),
                    control: c.map(|(h, p)| format!("{h}:{p}")),
                    rt_bytes_per_s: a.max(b),
                    rt_bytes_per_s_left: a.min(b),
                    streams: s,
                    streams_max: sm,
                    cache_bytes: cache,
                    fill_key: key,
                    https: tls.map(|(h, p)| format!("{h}:{p}")),
                },
            )
    }

    proptest! {
        #[test]
        fn a_record_reads_back_as_written(r in record()) {
            prop_assert_eq!(NodeRecord::decode(&r.encode()), Ok(r));
        }

        /// Bytes from etcd never panic the reader, and a record it reads is a fixed point of
        /// encode-then-decode.
        #[test]
        fn any_text_is_read_or_refused(s in "(?s).{0,600}") {
            if let Ok(r) = NodeRecord::decode(&s) {
                prop_assert_eq!(NodeRecord::decode(&r.encode()), Ok(r));
            }
        }

        /// A line dropped from a record: refused (every key is required; `-` says none).
        #[test]
        fn a_missing_key_refuses_the_record(r in record(), drop in 0usize..10) {
            let text: String = r.encode().lines().enumerate().filter(|&(i, _)| i != drop).map(|(_, l)| format!("{l}\n")).collect();
            prop_assert!(NodeRecord::decode(&text).is_err());
        }
    }

    #[test]
    fn bad_records_say_what_is_wrong() {
        let good = "penstock-node=1\nname=a\nhttp=127.0.0.1:80\nrtsp=-\ncontrol=-\nrt_bytes_per_s=10\nrt_bytes_per_s_left=5\nstreams=0\nstreams_max=4\ncache_bytes=-\n";
        assert!(NodeRecord::decode(good).is_ok());
        let newer = format!("{good}gpu=yes\n");
        assert!(
            NodeRecord::decode(&newer).is_ok(),
            "unknown keys are skipped"
        );
        for (bad, says) in [
            (good.replace("name=a", "name=a b"), "node name"),
            (
                good.replace("http=127.0.0.1:80", "http=x\nserver evil"),
                "not key=value",
            ),
            (
                good.replace("http=127.0.0.1:80", "http=host"),
                "not HOST:PORT",
            ),
            (
                good.replace("penstock-node=1", "penstock-node=2"),
                "version",
            ),
            (good.replace("left=5", "left=50"), "above"),
            (format!("{good}name=b\n"), "twice"),
            (format!("{good}fill_key=0123\n"), "fill_key"),
            (format!("{good}fill_key={}\n", "G".repeat(32)), "fill_key"),
        ] {
            let e = NodeRecord::decode(&bad).unwrap_err().0;
            assert!(e.contains(says), "{e}");
        }
        // A record without a key (an older node's) has none.
        assert_eq!(NodeRecord::decode(good).unwrap().fill_key, None);
        assert_eq!(
            NodeRecord::decode(&format!("{good}fill_key={}\n", "ab".repeat(16)))
                .unwrap()
                .fill_key,
            Some("ab".repeat(16))
        );
        assert!(NodeName::new("-a").is_err());
        assert!(NodeName::new(&"a".repeat(64)).is_err());
    }
}
