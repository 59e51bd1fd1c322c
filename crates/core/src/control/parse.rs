//! Lines → [`Command`]s. Verbs, option names and keywords are case-insensitive; endpoint
//! tokens, class names and tokens are kept as written.

use std::time::{Duration, UNIX_EPOCH};

use super::command::{
    Class, Command, DataPath, DiskTune, KtSchedule, OpenSpec, StartTime, StreamId, StreamSelector,
    Token,
};
use super::{ControlError, Limits};
use crate::schedule::LatePolicy;
use crate::units::{parse_duration, parse_rate, parse_size};

/// Finds the first line in `buf`: `Ok(Some((line, consumed_bytes)))` with the line's bytes
/// without `\n` or `\r\n`, `Ok(None)` when no complete line is there yet.
///
/// `Err(LineTooLong)` as soon as `buf` holds more than [`Limits::line_bytes_max`] bytes
/// (plus the CRLF) without a line end: the server replies 414 and closes, since it cannot
/// find where the next command starts without reading the rest of an unbounded line.
pub fn next_line<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(&'a [u8], usize)>, ControlError> {
    let window = &buf[..buf.len().min(limits.line_bytes_max.saturating_add(2))];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        if buf.len() >= limits.line_bytes_max.saturating_add(2) {
            return Err(ControlError::LineTooLong {
                limit_bytes: limits.line_bytes_max,
            });
        }
        return Ok(None);
    };
    let line = &buf[..lf];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > limits.line_bytes_max {
        return Err(ControlError::LineTooLong {
            limit_bytes: limits.line_bytes_max,
        });
    }
    Ok(Some((line, lf + 1)))
}

/// [`parse_command`] on raw bytes (what [`next_line`] returns).
pub fn parse_command_bytes(line: &[u8], limits: &Limits) -> Result<Command, ControlError> {
    parse_command_bytes_on(line, limits, None)
}

/// [`parse_command_on`] on raw bytes (what [`next_line`] returns).
pub fn parse_command_bytes_on(
    line: &[u8],
    limits: &Limits,
    own: Option<StreamId>,
) -> Result<Command, ControlError> {
    if line.len() > limits.line_bytes_max {
        return Err(ControlError::LineTooLong {
            limit_bytes: limits.line_bytes_max,
        });
    }
    let line = std::str::from_utf8(line).map_err(|_| ControlError::NotUtf8)?;
    parse_command_on(line, limits, own)
}

/// Parses one command line (a trailing `\r\n` or `\n` is allowed). Never panics.
pub fn parse_command(line: &str, limits: &Limits) -> Result<Command, ControlError> {
    parse_command_on(line, limits, None)
}

/// Parses one command line read on a stream's *own* control descriptor (Cues' `cue()`
/// descriptor), where `own` is that stream: a stream command may leave its id out
/// (`START`, `SEEK 4096`, `STATE`, `CLOSE NOW`) and then means `own`. With the id given the
/// line means what it means anywhere; `own: None` is [`parse_command`]. Whether a given id
/// other than `own` may be driven there is the executor's question, not the parser's.
pub fn parse_command_on(
    line: &str,
    limits: &Limits,
    own: Option<StreamId>,
) -> Result<Command, ControlError> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.len() > limits.line_bytes_max {
        return Err(ControlError::LineTooLong {
            limit_bytes: limits.line_bytes_max,
        });
    }
    if line.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ControlError::ControlCharacter);
    }
    let mut words = line.split_ascii_whitespace();
    let Some(verb) = words.next() else {
        return Err(ControlError::Empty);
    };
    // Bounded by the line length: at most line_bytes_max / 2 words.
    let args: Vec<&str> = words.collect();
    let verb_is = |v: &str| verb.eq_ignore_ascii_case(v);

    if verb_is("OPEN") {
        return parse_open(&args, limits);
    }
    if verb_is("CUE") {
        return match parse_open(&args, limits) {
            Ok(Command::Open(spec)) => Ok(Command::Cue(spec)),
            Err(ControlError::Arity { .. }) => Err(ControlError::Arity {
                verb: "CUE",
                expected: "CUE <src> <dst> [options]",
            }),
            other => other,
        };
    }
    // A stream command's id and value: `<id> <value>`, or on a stream's own descriptor
    // `<value>` alone.
    let id_and = |verb: &'static str, expected: &'static str, own_expected: &'static str| match (
        args.as_slice(),
        own,
    ) {
        ([id, v], _) => Ok((stream_id(id)?, *v)),
        ([v], Some(own)) => Ok((own, *v)),
        (_, None) => Err(ControlError::Arity { verb, expected }),
        (_, Some(_)) => Err(ControlError::Arity {
            verb,
            expected: own_expected,
        }),
    };
    // A stream command's id alone: `<id>`, or nothing on a stream's own descriptor.
    let id_only = |verb: &'static str, expected: &'static str, own_expected: &'static str| match (
        args.as_slice(),
        own,
    ) {
        ([id], _) => stream_id(id),
        ([], Some(own)) => Ok(own),
        (_, None) => Err(ControlError::Arity { verb, expected }),
        (_, Some(_)) => Err(ControlError::Arity {
            verb,
            expected: own_expected,
        }),
    };
    let (name, cmd): (&'static str, Command) = if verb_is("SEEK") {
        let (id, n) = id_and("SEEK", "SEEK <id> <offset>", "SEEK [<id>] <offset>")?;
        (
            "SEEK",
            Command::Seek {
                id,
                offset_bytes: size("offset", n)?,
            },
        )
    } else if verb_is("UNIT") {
        let (id, n) = id_and("UNIT", "UNIT <id> <size>", "UNIT [<id>] <size>")?;
        (
            "UNIT",
            Command::Unit {
                id,
                unit_bytes: nonzero_size("unit", n)?,
            },
        )
    } else if verb_is("LENGTH") {
        let (id, n) = id_and("LENGTH", "LENGTH <id> <size>", "LENGTH [<id>] <size>")?;
        (
            "LENGTH",
            Command::Length {
                id,
                length_bytes: size("length", n)?,
            },
        )
    } else if verb_is("RATE") {
        let (id, r) = id_and("RATE", "RATE <id> <rate>", "RATE [<id>] <rate>")?;
        ("RATE", Command::Rate { id, rate: rate(r)? })
    } else if verb_is("SCHEDULE") {
        let (id, s) = id_and(
            "SCHEDULE",
            "SCHEDULE <id> <k>,<t>",
            "SCHEDULE [<id>] <k>,<t>",
        )?;
        (
            "SCHEDULE",
            Command::Schedule {
                id,
                schedule: schedule(s)?,
            },
        )
    } else if verb_is("START") {
        // On a stream's own descriptor the id may be left out: `START`, `START AT <time>`.
        let expected = if own.is_some() {
            "START [<id>] [AT <+duration or RFC 3339 time>]"
        } else {
            "START <id> [AT <+duration or RFC 3339 time>]"
        };
        let arity = || ControlError::Arity {
            verb: "START",
            expected,
        };
        let (id, at) = match (args.as_slice(), own) {
            ([id], _) => (stream_id(id)?, None),
            ([id, at, time], _) if at.eq_ignore_ascii_case("AT") => {
                (stream_id(id)?, Some(start_time(time)?))
            }
            ([], Some(own)) => (own, None),
            ([at, time], Some(own)) if at.eq_ignore_ascii_case("AT") => {
                (own, Some(start_time(time)?))
            }
            _ => return Err(arity()),
        };
        ("START", Command::Start { id, at })
    } else if verb_is("PAUSE") {
        let id = id_only("PAUSE", "PAUSE <id>", "PAUSE [<id>]")?;
        ("PAUSE", Command::Pause { id })
    } else if verb_is("RESUME") {
        let id = id_only("RESUME", "RESUME <id>", "RESUME [<id>]")?;
        ("RESUME", Command::Resume { id })
    } else if verb_is("CLASS") {
        let (id, c) = id_and("CLASS", "CLASS <id> <class>", "CLASS [<id>] <class>")?;
        (
            "CLASS",
            Command::Class {
                id,
                class: class(c)?,
            },
        )
    } else if verb_is("STATE") {
        let sel = match (args.as_slice(), own) {
            ([sel], _) => selector(sel, limits)?,
            ([], Some(own)) => StreamSelector::Ids(vec![own]),
            (_, None) => {
                return Err(ControlError::Arity {
                    verb: "STATE",
                    expected: "STATE <id>[,<id>...] or STATE *",
                });
            }
            (_, Some(_)) => {
                return Err(ControlError::Arity {
                    verb: "STATE",
                    expected: "STATE [<id>[,<id>...] or *]",
                });
            }
        };
        ("STATE", Command::State(sel))
    } else if verb_is("CLOSE") {
        let is_now = |w: &str| w.eq_ignore_ascii_case("NOW");
        let (id, now) = match (args.as_slice(), own) {
            ([now], Some(own)) if is_now(now) => (own, true),
            ([id], _) => (stream_id(id)?, false),
            ([id, now], _) if is_now(now) => (stream_id(id)?, true),
            ([], Some(own)) => (own, false),
            (_, None) => {
                return Err(ControlError::Arity {
                    verb: "CLOSE",
                    expected: "CLOSE <id> [NOW]",
                });
            }
            (_, Some(_)) => {
                return Err(ControlError::Arity {
                    verb: "CLOSE",
                    expected: "CLOSE [<id>] [NOW]",
                });
            }
        };
        ("CLOSE", Command::Close { id, now })
    } else if verb_is("AUTH") {
        let [t] = exact(&args, "AUTH", "AUTH <token>")?;
        ("AUTH", Command::Auth(Token(t.to_string())))
    } else if verb_is("TUNE") {
        ("TUNE", parse_tune(&args, limits)?)
    } else if verb_is("STATS") {
        let [] = exact(&args, "STATS", "no argument")?;
        ("STATS", Command::Stats)
    } else if verb_is("HELP") {
        let [] = exact(&args, "HELP", "no argument")?;
        ("HELP", Command::Help)
    } else if verb_is("QUIT") {
        let [] = exact(&args, "QUIT", "no argument")?;
        ("QUIT", Command::Quit)
    } else {
        return Err(ControlError::UnknownVerb(verb.chars().take(32).collect()));
    };
    debug_assert_eq!(name, cmd.verb());
    Ok(cmd)
}

fn exact<'a, const N: usize>(
    args: &[&'a str],
    verb: &'static str,
    expected: &'static str,
) -> Result<[&'a str; N], ControlError> {
    <[&str; N]>::try_from(args).map_err(|_| ControlError::Arity { verb, expected })
}

fn parse_open(args: &[&str], limits: &Limits) -> Result<Command, ControlError> {
    let [src, dst, options @ ..] = args else {
        return Err(ControlError::Arity {
            verb: "OPEN",
            expected: "OPEN <src> <dst> [options]",
        });
    };
    Ok(Command::Open(Box::new(open_spec(
        src, dst, options, limits,
    )?)))
}

/// `OPEN`'s options given apart from a command line (the C library's `penstock_cue(engine,
/// src, dst, options)`): `options` is what would follow `OPEN src dst`, words separated by
/// white space (empty: none). `src` and `dst` are kept as given, spaces included: the
/// endpoint parser judges them.
pub fn parse_open_options(
    src: &str,
    dst: &str,
    options: &str,
    limits: &Limits,
) -> Result<OpenSpec, ControlError> {
    if options.len() > limits.line_bytes_max {
        return Err(ControlError::LineTooLong {
            limit_bytes: limits.line_bytes_max,
        });
    }
    if options.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ControlError::ControlCharacter);
    }
    let words: Vec<&str> = options.split_ascii_whitespace().collect();
    open_spec(src, dst, &words, limits)
}

fn open_spec(
    src: &str,
    dst: &str,
    options: &[&str],
    limits: &Limits,
) -> Result<OpenSpec, ControlError> {
    if options.len() > limits.open_options_max {
        return Err(ControlError::TooManyOptions {
            limit: limits.open_options_max,
        });
    }
    let mut o = OpenSpec::new(src, dst);
    for opt in options {
        if opt.eq_ignore_ascii_case("DETACHED") {
            if o.detached {
                return Err(ControlError::DuplicateOption("DETACHED"));
            }
            o.detached = true;
            continue;
        }
        if opt.eq_ignore_ascii_case("TRUNCATE") {
            if o.truncate {
                return Err(ControlError::DuplicateOption("TRUNCATE"));
            }
            o.truncate = true;
            continue;
        }
        let Some((key, value)) = opt.split_once('=') else {
            return Err(ControlError::UnknownOption(opt.chars().take(32).collect()));
        };
        let key = key.to_ascii_lowercase();
        match key.as_str() {
            "class" => set(&mut o.class, "class", class(value)?)?,
            "rate" => set(&mut o.rate, "rate", rate(value)?)?,
            "period" => set(&mut o.period, "period", nonzero_duration("period", value)?)?,
            "unit" => set(&mut o.unit_bytes, "unit", nonzero_size("unit", value)?)?,
            "schedule" => set(&mut o.schedule, "schedule", schedule(value)?)?,
            "pause" => set(&mut o.pause, "pause", schedule(value)?)?,
            "buffers" => set(&mut o.buffers, "buffers", buffers(value)?)?,
            "offset" => set(&mut o.offset_bytes, "offset", size("offset", value)?)?,
            "length" => set(&mut o.length_bytes, "length", size("length", value)?)?,
            "path" => set(&mut o.path, "path", data_path(value)?)?,
            "late" => set(&mut o.late, "late", late_policy(value)?)?,
            "cache" => set(
                &mut o.cache,
                "cache",
                value
                    .to_ascii_lowercase()
                    .parse()
                    .map_err(|_| bad("cache", value, "keep, bypass or drop"))?,
            )?,
            _ => return Err(ControlError::UnknownOption(key.chars().take(32).collect())),
        }
    }
    Ok(o)
}

/// `TUNE disk [rt_quantum=SIZE] [bulk_quantum=SIZE] [NAME_quantum=SIZE…] [inflight=N]`.
fn parse_tune(args: &[&str], limits: &Limits) -> Result<Command, ControlError> {
    const EXPECTED: &str =
        "TUNE disk [rt_quantum=SIZE] [bulk_quantum=SIZE] [NAME_quantum=SIZE...] [inflight=N]";
    let [target, options @ ..] = args else {
        return Err(ControlError::Arity {
            verb: "TUNE",
            expected: EXPECTED,
        });
    };
    if !target.eq_ignore_ascii_case("disk") {
        return Err(bad("TUNE target", target, "disk"));
    }
    if options.len() > limits.open_options_max {
        return Err(ControlError::TooManyOptions {
            limit: limits.open_options_max,
        });
    }
    let mut t = DiskTune::default();
    for opt in options {
        let Some((key, value)) = opt.split_once('=') else {
            return Err(ControlError::UnknownOption(opt.chars().take(32).collect()));
        };
        match key.to_ascii_lowercase().as_str() {
            "rt_quantum" => set(
                &mut t.rt_quantum_bytes,
                "rt_quantum",
                nonzero_size("rt_quantum", value)?,
            )?,
            "bulk_quantum" => set(
                &mut t.bulk_quantum_bytes,
                "bulk_quantum",
                nonzero_size("bulk_quantum", value)?,
            )?,
            "inflight" => set(
                &mut t.inflight_max,
                "inflight",
                digits_u64(value)
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("inflight", value, "a count from 1 to 4294967295"))?,
            )?,
            other => {
                // A configured class's quantum: `NAME_quantum=SIZE` (the name as written).
                let name = key
                    .len()
                    .checked_sub("_quantum".len())
                    .filter(|_| other.ends_with("_quantum"))
                    .map(|n| &key[..n]);
                let Some(Class::Named(name)) = name.and_then(|n| class(n).ok()) else {
                    return Err(ControlError::UnknownOption(
                        other.chars().take(32).collect(),
                    ));
                };
                if t.class_quanta.iter().any(|(n, _)| *n == name) {
                    return Err(ControlError::DuplicateOption("NAME_quantum"));
                }
                let q = nonzero_size("NAME_quantum", value)?;
                t.class_quanta.push((name, q));
            }
        }
    }
    Ok(Command::TuneDisk(t))
}

/// `+DURATION` (after the server reads the line) or an RFC 3339 date-time.
fn start_time(s: &str) -> Result<StartTime, ControlError> {
    const EXPECTED: &str = "+DURATION like +250ms, or an RFC 3339 time like \
                            2026-11-24T12:00:00.5Z or 2026-11-24T13:00:00+01:00";
    if let Some(d) = s.strip_prefix('+') {
        return parse_duration(d)
            .map(StartTime::In)
            .map_err(|_| bad("AT", s, EXPECTED));
    }
    rfc3339_unix_ns(s)
        .map(|unix_ns| StartTime::At { unix_ns })
        .ok_or_else(|| bad("AT", s, EXPECTED))
}

/// RFC 3339 §5.6 `date-time` — `YYYY-MM-DDTHH:MM:SS[.frac]` then `Z` or `±HH:MM` — as
/// nanoseconds since the epoch (UTC); `None` when malformed or outside 1970..2554.
/// humantime reads the UTC form; an offset is taken off here.
fn rfc3339_unix_ns(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let n = b.len();
    let (utc, offset_s): (std::borrow::Cow<'_, str>, i64) = if s.ends_with('Z') {
        (s.into(), 0)
    } else if n > 6 && matches!(b[n - 6], b'+' | b'-') && b[n - 3] == b':' {
        let two = |i: usize| -> Option<i64> {
            (b[i].is_ascii_digit() && b[i + 1].is_ascii_digit())
                .then(|| i64::from(b[i] - b'0') * 10 + i64::from(b[i + 1] - b'0'))
        };
        let (hh, mm) = (two(n - 5)?, two(n - 2)?);
        if hh > 23 || mm > 59 {
            return None;
        }
        let sign = if b[n - 6] == b'+' { 1 } else { -1 };
        // b[n - 6] is ASCII, so n - 6 is a character boundary.
        (
            format!("{}Z", &s[..n - 6]).into(),
            sign * (hh * 3600 + mm * 60),
        )
    } else {
        return None;
    };
    let t = humantime::parse_rfc3339(&utc).ok()?;
    let ns = i128::try_from(t.duration_since(UNIX_EPOCH).ok()?.as_nanos()).ok()?
        - i128::from(offset_s) * 1_000_000_000;
    u64::try_from(ns).ok()
}

fn late_policy(s: &str) -> Result<LatePolicy, ControlError> {
    s.parse().map_err(|_| bad("late", s, "send or skip"))
}

fn set<T>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<(), ControlError> {
    if slot.is_some() {
        return Err(ControlError::DuplicateOption(name));
    }
    *slot = Some(value);
    Ok(())
}

fn bad(name: &'static str, value: &str, expected: &'static str) -> ControlError {
    ControlError::BadValue {
        name,
        value: value.chars().take(64).collect(),
        expected,
    }
}

/// `1*DIGIT` into a u64: no sign, no spaces, no overflow (`u64::from_str` accepts `+1`).
fn digits_u64(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn stream_id(s: &str) -> Result<StreamId, ControlError> {
    digits_u64(s)
        .map(StreamId)
        .ok_or_else(|| ControlError::BadStreamId(s.chars().take(32).collect()))
}

fn selector(s: &str, limits: &Limits) -> Result<StreamSelector, ControlError> {
    if s == "*" {
        return Ok(StreamSelector::All);
    }
    let mut ids = Vec::new();
    for part in s.split(',') {
        if ids.len() == limits.state_ids_max {
            return Err(ControlError::TooManyIds {
                limit: limits.state_ids_max,
            });
        }
        ids.push(stream_id(part)?);
    }
    Ok(StreamSelector::Ids(ids))
}

fn size(name: &'static str, s: &str) -> Result<u64, ControlError> {
    parse_size(s).map_err(|_| bad(name, s, "a size like 4096, 64KiB, 1MiB"))
}

fn nonzero_size(name: &'static str, s: &str) -> Result<u64, ControlError> {
    match size(name, s)? {
        0 => Err(bad(name, s, "a non-zero size")),
        n => Ok(n),
    }
}

fn nonzero_duration(name: &'static str, s: &str) -> Result<Duration, ControlError> {
    match parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(bad(name, s, "a non-zero duration like 33.333ms")),
    }
}

fn rate(s: &str) -> Result<crate::units::Rate, ControlError> {
    parse_rate(s).map_err(|_| bad("rate", s, "30/s, 29.97/s, 8Mbit/s or 100MB/s"))
}

fn schedule(s: &str) -> Result<KtSchedule, ControlError> {
    const EXPECTED: &str = "K,T: K blocks (1 or more) then a pause T, like 8,10ms";
    let (k, t) = s
        .split_once(',')
        .ok_or_else(|| bad("schedule", s, EXPECTED))?;
    let blocks = digits_u64(k)
        .and_then(|k| u32::try_from(k).ok())
        .filter(|&k| k > 0)
        .ok_or_else(|| bad("schedule", s, EXPECTED))?;
    let delay = parse_duration(t).map_err(|_| bad("schedule", s, EXPECTED))?;
    Ok(KtSchedule { blocks, delay })
}

fn buffers(s: &str) -> Result<u32, ControlError> {
    digits_u64(s)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| bad("buffers", s, "a count from 1 to 4294967295"))
}

fn class(s: &str) -> Result<Class, ControlError> {
    if s.eq_ignore_ascii_case("rt") {
        return Ok(Class::Rt);
    }
    if s.eq_ignore_ascii_case("bulk") {
        return Ok(Class::Bulk);
    }
    // The engine's rule for a class name (`stream::plan::ClassName`), in one place.
    match crate::stream::plan::ClassName::new(s) {
        Ok(_) => Ok(Class::Named(s.to_string())),
        Err(_) => Err(bad("class", s, "rt, bulk or a configured class name")),
    }
}

fn data_path(s: &str) -> Result<DataPath, ControlError> {
    DataPath::ALL
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s))
        .map(|(_, p)| *p)
        .ok_or_else(|| bad("path", s, "auto, copy, sendfile, splice or uring"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Rate;

    fn p(s: &str) -> Result<Command, ControlError> {
        parse_command(s, &Limits::default())
    }

    fn round_trip(c: &Command) {
        let text = c.to_string();
        assert_eq!(p(&text).as_ref(), Ok(c), "{text}");
    }

    #[test]
    fn cue_is_open_whose_reply_carries_a_descriptor() {
        let c = p("cue fd /a/b.ts rate=1MB/s DETACHED").unwrap();
        let Command::Cue(o) = &c else { panic!("{c:?}") };
        assert_eq!((o.src.as_str(), o.dst.as_str()), ("fd", "/a/b.ts"));
        assert!(o.detached && o.rate.is_some());
        assert_eq!(c.verb(), "CUE");
        round_trip(&c);
        assert_eq!(
            p("CUE fd"),
            Err(ControlError::Arity {
                verb: "CUE",
                expected: "CUE <src> <dst> [options]"
            })
        );
        assert!(matches!(
            p("CUE a b rate=fast"),
            Err(ControlError::BadValue { .. } | ControlError::UnknownOption(_))
        ));
    }

    #[test]
    fn truncate_is_a_keyword_of_open_once() {
        let c = p("OPEN a file:/rec/x.ts truncate").unwrap();
        let Command::Open(o) = &c else {
            panic!("{c:?}")
        };
        assert!(o.truncate && !o.detached);
        assert_eq!(c.to_string(), "OPEN a file:/rec/x.ts TRUNCATE");
        assert_eq!(
            p("OPEN a b TRUNCATE truncate"),
            Err(ControlError::DuplicateOption("TRUNCATE"))
        );
    }

    #[test]
    fn open_with_everything() {
        let c = p(
            "open file:/m/a.ts tcp:10.0.0.2:9000 class=rt rate=30/s period=33.333ms unit=1KiB \
                   schedule=8,10ms buffers=4 offset=1MiB length=100MB path=SENDFILE detached",
        )
        .unwrap();
        let Command::Open(o) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(o.src, "file:/m/a.ts");
        assert_eq!(o.dst, "tcp:10.0.0.2:9000");
        assert_eq!(o.class, Some(Class::Rt));
        assert_eq!(o.rate, Some(Rate::UnitsPerSecond { num: 30, den: 1 }));
        assert_eq!(o.period, Some(Duration::from_micros(33_333)));
        assert_eq!(o.unit_bytes, Some(1024));
        assert_eq!(
            o.schedule,
            Some(KtSchedule {
                blocks: 8,
                delay: Duration::from_millis(10)
            })
        );
        assert_eq!(o.buffers, Some(4));
        assert_eq!(o.offset_bytes, Some(1 << 20));
        assert_eq!(o.length_bytes, Some(100_000_000));
        assert_eq!(o.path, Some(DataPath::Sendfile));
        assert!(o.detached);
        assert_eq!(
            c.to_string(),
            "OPEN file:/m/a.ts tcp:10.0.0.2:9000 class=rt rate=30/s period=33333us unit=1024 \
             schedule=8,10ms buffers=4 offset=1048576 length=100000000 path=sendfile DETACHED"
        );
        round_trip(&c);
    }

    #[test]
    fn open_minimal_and_named_class() {
        let c = p("OPEN a b").unwrap();
        assert_eq!(c, Command::Open(Box::new(OpenSpec::new("a", "b"))));
        let c = p("OPEN a b class=Gold_1 rate=8Mbit/s").unwrap();
        let Command::Open(o) = &c else { panic!() };
        assert_eq!(o.class, Some(Class::Named("Gold_1".into())));
        assert_eq!(o.rate, Some(Rate::BitsPerSecond(8_000_000)));
        round_trip(&c);
        round_trip(&p("OPEN a b rate=29.97/s").unwrap());
    }

    #[test]
    fn open_errors() {
        assert!(matches!(
            p("OPEN a"),
            Err(ControlError::Arity { verb: "OPEN", .. })
        ));
        assert_eq!(
            p("OPEN a b rate=1/s rate=2/s"),
            Err(ControlError::DuplicateOption("rate"))
        );
        assert_eq!(
            p("OPEN a b DETACHED detached"),
            Err(ControlError::DuplicateOption("DETACHED"))
        );
        assert_eq!(
            p("OPEN a b color=red"),
            Err(ControlError::UnknownOption("color".into()))
        );
        assert_eq!(
            p("OPEN a b fast"),
            Err(ControlError::UnknownOption("fast".into()))
        );
        for bad in [
            "unit=0",
            "unit=lots",
            "period=0",
            "period=-1s",
            "rate=0/s",
            "rate=fast",
            "schedule=0,10ms",
            "schedule=8",
            "schedule=8,soon",
            "schedule=99999999999,1s",
            "buffers=0",
            "buffers=+4",
            "offset=-1",
            "length=1.3B",
            "path=carrier-pigeon",
            "class=9lives",
            "class=",
            "class=a.b",
        ] {
            assert!(
                matches!(
                    p(&format!("OPEN a b {bad}")),
                    Err(ControlError::BadValue { .. })
                ),
                "{bad}"
            );
        }
        let many = " buffers=1".repeat(17);
        assert_eq!(
            p(&format!("OPEN a b{many}")),
            Err(ControlError::TooManyOptions { limit: 16 })
        );
    }

    #[test]
    fn stream_commands() {
        let id = StreamId(42);
        assert_eq!(
            p("seek 42 1MiB"),
            Ok(Command::Seek {
                id,
                offset_bytes: 1 << 20
            })
        );
        assert_eq!(
            p("UNIT 42 64KiB"),
            Ok(Command::Unit {
                id,
                unit_bytes: 65536
            })
        );
        assert_eq!(
            p("LENGTH 42 0"),
            Ok(Command::Length {
                id,
                length_bytes: 0
            })
        );
        assert_eq!(
            p("Rate 42 25/s"),
            Ok(Command::Rate {
                id,
                rate: Rate::UnitsPerSecond { num: 25, den: 1 }
            })
        );
        assert_eq!(
            p("SCHEDULE 42 4,0"),
            Ok(Command::Schedule {
                id,
                schedule: KtSchedule {
                    blocks: 4,
                    delay: Duration::ZERO
                }
            })
        );
        assert_eq!(p("START 42"), Ok(Command::Start { id, at: None }));
        assert_eq!(p("PAUSE 42\r\n"), Ok(Command::Pause { id }));
        assert_eq!(p("  RESUME\t42  "), Ok(Command::Resume { id }));
        assert_eq!(p("CLOSE 42"), Ok(Command::Close { id, now: false }));
        assert_eq!(p("close 42 now"), Ok(Command::Close { id, now: true }));
        assert_eq!(p("STATE *"), Ok(Command::State(StreamSelector::All)));
        assert_eq!(
            p("STATE 1,2,18446744073709551615"),
            Ok(Command::State(StreamSelector::Ids(vec![
                StreamId(1),
                StreamId(2),
                StreamId(u64::MAX)
            ])))
        );
        assert_eq!(p("STATS"), Ok(Command::Stats));
        assert_eq!(p("help"), Ok(Command::Help));
        assert_eq!(p("QUIT"), Ok(Command::Quit));
        assert_eq!(p("AUTH s3cr3t"), Ok(Command::Auth(Token("s3cr3t".into()))));
    }

    #[test]
    fn start_at_relative_and_rfc3339() {
        let id = StreamId(7);
        let at = |s: &str| match p(&format!("START 7 AT {s}")) {
            Ok(Command::Start { id: i, at: Some(a) }) if i == id => Ok(a),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(at("+250ms"), Ok(StartTime::In(Duration::from_millis(250))));
        // 2026-11-24T12:00:00Z is 1,795,521,600 s after the epoch.
        let noon_ns = 1_795_521_600 * 1_000_000_000u64;
        assert_eq!(
            at("2026-11-24T12:00:00Z"),
            Ok(StartTime::At { unix_ns: noon_ns })
        );
        assert_eq!(
            at("2026-11-24T12:00:00.5Z"),
            Ok(StartTime::At {
                unix_ns: noon_ns + 500_000_000
            })
        );
        assert_eq!(
            at("2026-11-24T13:30:00+01:30"),
            Ok(StartTime::At { unix_ns: noon_ns })
        );
        assert_eq!(
            at("2026-11-24T07:00:00-05:00"),
            Ok(StartTime::At { unix_ns: noon_ns })
        );
        assert_eq!(
            p("start 7 at 2026-11-24T12:00:00Z").unwrap().to_string(),
            "START 7 AT 2026-11-24T12:00:00.000000000Z"
        );
        assert_eq!(p("START 7 AT +1s").unwrap().to_string(), "START 7 AT +1s");
        for bad in [
            "soon",
            "+",
            "+-1s",
            "250ms",
            "2026-11-24t12:00:00Z",
            "2026-11-24T12:00:00",
            "2026-11-24T12:00:00+24:00",
            "2026-11-24T12:00:00+01:60",
            "2026-13-24T12:00:00Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+00:01",
            "2600-01-01T00:00:00Z",
            "2026-11-24T12:00:00+é:00",
        ] {
            assert!(
                matches!(at(bad), Err(ControlError::BadValue { name: "AT", .. })),
                "{bad}: {:?}",
                at(bad)
            );
        }
        assert!(matches!(
            p("START 7 AT"),
            Err(ControlError::Arity { verb: "START", .. })
        ));
        assert!(matches!(
            p("START 7 AT 2026-11-24 12:00:00Z"),
            Err(ControlError::Arity { verb: "START", .. })
        ));
        assert!(matches!(
            p("START 7 WHEN +1s"),
            Err(ControlError::Arity { verb: "START", .. })
        ));
    }

    #[test]
    fn tune_disk() {
        assert_eq!(
            p("tune DISK rt_quantum=4MiB bulk_quantum=1MiB inflight=8"),
            Ok(Command::TuneDisk(DiskTune {
                rt_quantum_bytes: Some(4 << 20),
                bulk_quantum_bytes: Some(1 << 20),
                inflight_max: Some(8),
                class_quanta: vec![],
            }))
        );
        assert_eq!(
            p("TUNE disk Gold_quantum=2MiB bronze-1_quantum=512KiB"),
            Ok(Command::TuneDisk(DiskTune {
                class_quanta: vec![("Gold".into(), 2 << 20), ("bronze-1".into(), 512 << 10)],
                ..DiskTune::default()
            }))
        );
        assert_eq!(
            p("TUNE disk gold_quantum=1 gold_quantum=2"),
            Err(ControlError::DuplicateOption("NAME_quantum"))
        );
        for bad in ["_quantum=1", "9x_quantum=1", "a.b_quantum=1", "gold=1"] {
            assert!(
                matches!(
                    p(&format!("TUNE disk {bad}")),
                    Err(ControlError::UnknownOption(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            p("class 7 Gold"),
            Ok(Command::Class {
                id: StreamId(7),
                class: Class::Named("Gold".into())
            })
        );
        assert_eq!(p("CLASS 7 RT").unwrap().to_string(), "CLASS 7 rt");
        assert!(matches!(
            p("CLASS 7"),
            Err(ControlError::Arity { verb: "CLASS", .. })
        ));
        let o = p("OPEN a b pause=4,40ms").unwrap();
        assert!(
            matches!(&o, Command::Open(o) if o.pause == Some(KtSchedule {
                blocks: 4,
                delay: Duration::from_millis(40)
            }))
        );
        let q = p("TUNE disk").unwrap();
        assert!(matches!(&q, Command::TuneDisk(t) if t.is_query()));
        assert_eq!(q.to_string(), "TUNE disk");
        assert_eq!(
            p("TUNE disk inflight=2").unwrap().to_string(),
            "TUNE disk inflight=2"
        );
        assert!(matches!(
            p("TUNE"),
            Err(ControlError::Arity { verb: "TUNE", .. })
        ));
        assert!(matches!(
            p("TUNE net rate=1"),
            Err(ControlError::BadValue {
                name: "TUNE target",
                ..
            })
        ));
        assert_eq!(
            p("TUNE disk inflight=1 inflight=2"),
            Err(ControlError::DuplicateOption("inflight"))
        );
        assert_eq!(
            p("TUNE disk speed=11"),
            Err(ControlError::UnknownOption("speed".into()))
        );
        for bad in [
            "rt_quantum=0",
            "bulk_quantum=lots",
            "inflight=0",
            "inflight=+1",
            "inflight=4294967296",
        ] {
            assert!(
                matches!(
                    p(&format!("TUNE disk {bad}")),
                    Err(ControlError::BadValue { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn open_cache_policy() {
        let c = p("OPEN a b cache=Bypass").unwrap();
        let Command::Open(o) = &c else { panic!() };
        assert_eq!(o.cache, Some(crate::stream::CachePolicy::Bypass));
        assert_eq!(c.to_string(), "OPEN a b cache=bypass");
        assert!(matches!(
            p("OPEN a b cache=never"),
            Err(ControlError::BadValue { name: "cache", .. })
        ));
    }

    #[test]
    fn open_late_policy() {
        let c = p("OPEN a b rate=30/s late=SKIP").unwrap();
        let Command::Open(o) = &c else { panic!() };
        assert_eq!(o.late, Some(LatePolicy::Skip));
        assert_eq!(c.to_string(), "OPEN a b rate=30/s late=skip");
        assert!(matches!(
            p("OPEN a b late=drop"),
            Err(ControlError::BadValue { name: "late", .. })
        ));
        assert_eq!(
            p("OPEN a b late=send late=skip"),
            Err(ControlError::DuplicateOption("late"))
        );
    }

    #[test]
    fn command_errors() {
        assert_eq!(p(""), Err(ControlError::Empty));
        assert_eq!(p("   \t "), Err(ControlError::Empty));
        assert_eq!(p("FLY 1"), Err(ControlError::UnknownVerb("FLY".into())));
        assert!(matches!(
            p("START"),
            Err(ControlError::Arity { verb: "START", .. })
        ));
        assert!(matches!(p("START 1 2"), Err(ControlError::Arity { .. })));
        assert!(matches!(
            p("CLOSE 1 LATER"),
            Err(ControlError::Arity { .. })
        ));
        assert!(matches!(p("STATS now"), Err(ControlError::Arity { .. })));
        assert!(matches!(p("AUTH"), Err(ControlError::Arity { .. })));
        assert!(matches!(p("AUTH a b"), Err(ControlError::Arity { .. })));
        assert_eq!(
            p("START 18446744073709551616"),
            Err(ControlError::BadStreamId("18446744073709551616".into()))
        );
        assert_eq!(p("START +1"), Err(ControlError::BadStreamId("+1".into())));
        assert_eq!(p("START -1"), Err(ControlError::BadStreamId("-1".into())));
        assert_eq!(p("STATE 1,,2"), Err(ControlError::BadStreamId("".into())));
        assert_eq!(p("STATE 1,*"), Err(ControlError::BadStreamId("*".into())));
        assert!(matches!(p("STATE 1, 2"), Err(ControlError::Arity { .. })));
        assert_eq!(p("START 1\u{7}"), Err(ControlError::ControlCharacter));
        assert_eq!(p("START 1\r\nSTART 2"), Err(ControlError::ControlCharacter));
        assert_eq!(p("UNIT 1 0"), Err(bad("unit", "0", "a non-zero size")));
        let limits = Limits {
            state_ids_max: 3,
            line_bytes_max: 20,
            ..Limits::default()
        };
        assert_eq!(
            parse_command("STATE 1,2,3,4", &limits),
            Err(ControlError::TooManyIds { limit: 3 })
        );
        assert!(parse_command("STATE 1,2,3", &limits).is_ok());
        assert_eq!(
            parse_command(&format!("AUTH {}", "x".repeat(20)), &limits),
            Err(ControlError::LineTooLong { limit_bytes: 20 })
        );
        assert_eq!(
            parse_command_bytes(b"START \xff", &limits),
            Err(ControlError::NotUtf8)
        );
    }

    #[test]
    fn on_a_streams_own_descriptor_the_id_may_be_left_out() {
        let own = StreamId(7);
        let o = |s: &str| parse_command_on(s, &Limits::default(), Some(own));
        assert_eq!(o("START"), Ok(Command::Start { id: own, at: None }));
        assert!(matches!(
            o("START AT +250ms"),
            Ok(Command::Start { id, at: Some(_) }) if id == own
        ));
        assert!(matches!(
            o("START 9 AT +1s"),
            Ok(Command::Start {
                id: StreamId(9),
                at: Some(_)
            })
        ));
        assert!(o("START AT").is_err());
        assert_eq!(o("pause"), Ok(Command::Pause { id: own }));
        assert_eq!(o("RESUME"), Ok(Command::Resume { id: own }));
        assert_eq!(
            o("SEEK 4KiB"),
            Ok(Command::Seek {
                id: own,
                offset_bytes: 4096
            })
        );
        assert_eq!(
            o("LENGTH 10"),
            Ok(Command::Length {
                id: own,
                length_bytes: 10
            })
        );
        assert_eq!(
            o("UNIT 1316"),
            Ok(Command::Unit {
                id: own,
                unit_bytes: 1316
            })
        );
        assert_eq!(
            o("RATE 30/s"),
            Ok(Command::Rate {
                id: own,
                rate: Rate::UnitsPerSecond { num: 30, den: 1 }
            })
        );
        assert!(matches!(
            o("SCHEDULE 8,10ms"),
            Ok(Command::Schedule { id, .. }) if id == own
        ));
        assert_eq!(
            o("STATE"),
            Ok(Command::State(StreamSelector::Ids(vec![own])))
        );
        assert_eq!(
            o("CLOSE"),
            Ok(Command::Close {
                id: own,
                now: false
            })
        );
        assert_eq!(o("close now"), Ok(Command::Close { id: own, now: true }));
        // With the id, a line means what it means anywhere (another id included).
        assert_eq!(o("SEEK 9 5"), p("SEEK 9 5"));
        assert_eq!(o("CLOSE 9 NOW"), p("CLOSE 9 NOW"));
        assert_eq!(o("STATE *"), p("STATE *"));
        // Still refused: too many words, a bad value, and (without an own stream) no id.
        assert!(matches!(
            o("START 1 2"),
            Err(ControlError::Arity {
                expected: "START [<id>] [AT <+duration or RFC 3339 time>]",
                ..
            })
        ));
        assert!(matches!(o("SEEK"), Err(ControlError::Arity { .. })));
        assert!(matches!(o("UNIT 0"), Err(ControlError::BadValue { .. })));
        assert!(matches!(
            o("CLOSE LATER"),
            Err(ControlError::BadStreamId(_))
        ));
        assert!(matches!(
            parse_command_on("START", &Limits::default(), None),
            Err(ControlError::Arity {
                expected: "START <id> [AT <+duration or RFC 3339 time>]",
                ..
            })
        ));
        assert_eq!(
            parse_command_bytes_on(b"STATE", &Limits::default(), Some(own)),
            o("STATE")
        );
    }

    #[test]
    fn open_options_apart_from_a_line() {
        let limits = Limits::default();
        let o = parse_open_options(
            "fd:3",
            "my file.ts",
            " rate=30/s  unit=1316 DETACHED",
            &limits,
        )
        .unwrap();
        assert_eq!(o.src, "fd:3");
        assert_eq!(o.dst, "my file.ts");
        assert_eq!(o.rate, Some(Rate::UnitsPerSecond { num: 30, den: 1 }));
        assert_eq!(o.unit_bytes, Some(1316));
        assert!(o.detached);
        assert_eq!(
            parse_open_options("a", "b", "", &limits),
            Ok(OpenSpec::new("a", "b"))
        );
        // The same refusals as in a line.
        assert_eq!(
            parse_open_options("a", "b", "colour=red", &limits),
            Err(ControlError::UnknownOption("colour".into()))
        );
        assert!(matches!(
            parse_open_options("a", "b", "unit=0", &limits),
            Err(ControlError::BadValue { .. })
        ));
        assert_eq!(
            parse_open_options("a", "b", "unit=1\nSTART", &limits),
            Err(ControlError::ControlCharacter)
        );
        assert_eq!(
            parse_open_options("a", "b", &"x".repeat(5000), &limits),
            Err(ControlError::LineTooLong { limit_bytes: 4096 })
        );
    }

    #[test]
    fn errors_map_to_reply_codes() {
        assert_eq!(p("FLY").unwrap_err().reply_code().code(), 400);
        let e = ControlError::LineTooLong { limit_bytes: 1 };
        assert_eq!(e.to_reply().to_string(), "414 line longer than 1 bytes\n");
    }

    #[test]
    fn token_is_redacted_in_debug() {
        let c = p("AUTH hunter2").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.to_string(), "AUTH hunter2");
    }

    #[test]
    fn line_framing() {
        let l = Limits {
            line_bytes_max: 8,
            ..Limits::default()
        };
        assert_eq!(next_line(b"", &l), Ok(None));
        assert_eq!(next_line(b"START 1", &l), Ok(None));
        assert_eq!(
            next_line(b"START 1\r\nSTA", &l),
            Ok(Some((&b"START 1"[..], 9)))
        );
        assert_eq!(next_line(b"QUIT\nHELP\n", &l), Ok(Some((&b"QUIT"[..], 5))));
        assert_eq!(next_line(b"\n", &l), Ok(Some((&b""[..], 1))));
        assert_eq!(
            next_line(b"12345678\r\n", &l),
            Ok(Some((&b"12345678"[..], 10)))
        );
        assert_eq!(
            next_line(b"123456789\n", &l),
            Err(ControlError::LineTooLong { limit_bytes: 8 })
        );
        assert_eq!(
            next_line(b"1234567890", &l),
            Err(ControlError::LineTooLong { limit_bytes: 8 })
        );
        assert_eq!(next_line(b"123456789", &l), Ok(None));
    }

    #[test]
    fn rate_and_duration_text_round_trip() {
        for r in [
            "30/s", "29.97/s", "30.0/s", "0.5/s", "8Mbit/s", "100MB/s", "1KiB/s", "1bit/s",
        ] {
            let rate = parse_rate(r).unwrap();
            let text = super::super::command::RateText(rate).to_string();
            assert_eq!(parse_rate(&text), Ok(rate), "{r} -> {text}");
        }
        for d in [0u64, 1, 999, 1000, 33_333_000, 1_000_000_000, 5_000_000_001] {
            let d = Duration::from_nanos(d);
            let text = super::super::command::DurationText(d).to_string();
            assert_eq!(parse_duration(&text), Ok(d), "{text}");
        }
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn id() -> impl Strategy<Value = StreamId> {
            any::<u64>().prop_map(StreamId)
        }

        fn rate_strategy() -> impl Strategy<Value = Rate> {
            prop_oneof![
                (1u64..1_000_000, 0u32..=9).prop_map(|(n, k)| Rate::UnitsPerSecond {
                    num: n,
                    den: 10u64.pow(k)
                }),
                (1u64..u64::MAX / 2).prop_map(Rate::BitsPerSecond),
            ]
        }

        fn duration_strategy() -> impl Strategy<Value = Duration> {
            (0u64..1_000_000_000_000).prop_map(Duration::from_nanos)
        }

        fn start_time_strategy() -> impl Strategy<Value = StartTime> {
            prop_oneof![
                duration_strategy().prop_map(StartTime::In),
                any::<u64>().prop_map(|unix_ns| StartTime::At { unix_ns }),
            ]
        }

        fn named_class() -> impl Strategy<Value = String> {
            "[a-zA-Z][a-zA-Z0-9_-]{0,31}".prop_filter("built-in", |s| {
                !s.eq_ignore_ascii_case("rt") && !s.eq_ignore_ascii_case("bulk")
            })
        }

        fn token() -> impl Strategy<Value = String> {
            "[!-~]{1,24}"
        }

        fn open_strategy() -> impl Strategy<Value = Command> {
            (
                (
                    token(),
                    token(),
                    proptest::option::of(prop_oneof![
                        Just(Class::Rt),
                        Just(Class::Bulk),
                        "[a-zA-Z][a-zA-Z0-9_-]{0,31}"
                            .prop_filter("built-in", |s| !s.eq_ignore_ascii_case("rt")
                                && !s.eq_ignore_ascii_case("bulk"))
                            .prop_map(Class::Named),
                    ]),
                ),
                (
                    proptest::option::of(rate_strategy()),
                    proptest::option::of(duration_strategy().prop_filter("nz", |d| !d.is_zero())),
                ),
                (
                    proptest::option::of(1u64..u64::MAX),
                    proptest::option::of((1u32.., duration_strategy())),
                    proptest::option::of((1u32.., duration_strategy())),
                ),
                (
                    proptest::option::of(1u32..),
                    proptest::option::of(any::<u64>()),
                    proptest::option::of(any::<u64>()),
                ),
                (
                    proptest::option::of(proptest::sample::select(
                        DataPath::ALL.map(|(_, p)| p).to_vec(),
                    )),
                    any::<bool>(),
                    any::<bool>(),
                    proptest::option::of(proptest::sample::select(
                        LatePolicy::ALL.map(|(_, p)| p).to_vec(),
                    )),
                    proptest::option::of(proptest::sample::select(vec![
                        crate::stream::CachePolicy::Keep,
                        crate::stream::CachePolicy::Bypass,
                        crate::stream::CachePolicy::Drop,
                    ])),
                ),
            )
                .prop_map(
                    |(
                        (src, dst, class),
                        (rate, period),
                        (unit, sched, pause),
                        (buffers, offset, length),
                        (path, detached, truncate, late, cache),
                    )| {
                        Command::Open(Box::new(OpenSpec {
                            src,
                            dst,
                            class,
                            rate,
                            period,
                            unit_bytes: unit,
                            schedule: sched.map(|(blocks, delay)| KtSchedule { blocks, delay }),
                            pause: pause.map(|(blocks, delay)| KtSchedule { blocks, delay }),
                            buffers,
                            offset_bytes: offset,
                            length_bytes: length,
                            path,
                            detached,
                            truncate,
                            late,
                            cache,
                        }))
                    },
                )
        }

        fn command_strategy() -> impl Strategy<Value = Command> {
            prop_oneof![
                open_strategy(),
                (id(), any::<u64>()).prop_map(|(id, n)| Command::Seek {
                    id,
                    offset_bytes: n
                }),
                (id(), 1u64..).prop_map(|(id, n)| Command::Unit { id, unit_bytes: n }),
                (id(), any::<u64>()).prop_map(|(id, n)| Command::Length {
                    id,
                    length_bytes: n
                }),
                (id(), rate_strategy()).prop_map(|(id, rate)| Command::Rate { id, rate }),
                (id(), 1u32.., duration_strategy()).prop_map(|(id, blocks, delay)| {
                    Command::Schedule {
                        id,
                        schedule: KtSchedule { blocks, delay },
                    }
                }),
                (id(), proptest::option::of(start_time_strategy()))
                    .prop_map(|(id, at)| Command::Start { id, at }),
                (
                    proptest::option::of(1u64..),
                    proptest::option::of(1u64..),
                    proptest::option::of(1u32..),
                    proptest::collection::btree_map(named_class(), 1u64.., 0..4),
                )
                    .prop_map(|(rt, bulk, inflight, named)| Command::TuneDisk(
                        DiskTune {
                            rt_quantum_bytes: rt,
                            bulk_quantum_bytes: bulk,
                            inflight_max: inflight,
                            class_quanta: named.into_iter().collect(),
                        }
                    )),
                (
                    id(),
                    prop_oneof![
                        Just(Class::Rt),
                        Just(Class::Bulk),
                        named_class().prop_map(Class::Named)
                    ]
                )
                    .prop_map(|(id, class)| Command::Class { id, class }),
                id().prop_map(|id| Command::Pause { id }),
                id().prop_map(|id| Command::Resume { id }),
                Just(Command::State(StreamSelector::All)),
                proptest::collection::vec(id(), 1..20)
                    .prop_map(|v| Command::State(StreamSelector::Ids(v))),
                (id(), any::<bool>()).prop_map(|(id, now)| Command::Close { id, now }),
                Just(Command::Stats),
                token().prop_map(|t| Command::Auth(Token(t))),
                Just(Command::Help),
                Just(Command::Quit),
            ]
        }

        proptest! {
            #[test]
            fn command_text_command(c in command_strategy()) {
                let text = c.to_string();
                prop_assert_eq!(parse_command(&text, &Limits::default()), Ok(c), "{}", text);
            }

            /// On a stream's own descriptor a canonical line means the same command, and so
            /// does the line with the own stream's id left out.
            #[test]
            fn own_descriptor_lines(c in command_strategy(), other in id(), take in any::<bool>()) {
                let l = Limits::default();
                // Half the time the descriptor's own stream is the command's.
                let own = match &c {
                    Command::State(StreamSelector::Ids(ids)) if take => ids[0],
                    c if take => c.stream_id().unwrap_or(other),
                    _ => other,
                };
                let text = c.to_string();
                prop_assert_eq!(parse_command_on(&text, &l, Some(own)), Ok(c.clone()), "{}", text);
                let id = format!(" {own}");
                let short = match &c {
                    Command::State(StreamSelector::Ids(ids)) if ids == &[own] => "STATE".to_string(),
                    c if c.stream_id() == Some(own) => text.replacen(&id, "", 1),
                    _ => return Ok(()),
                };
                prop_assert_eq!(parse_command_on(&short, &l, Some(own)), Ok(c), "{}", short);
            }

            #[test]
            fn never_panics(line in "\\PC{0,200}", own in proptest::option::of(id())) {
                // And what parses is a fixed point: its canonical line parses to itself.
                if let Ok(c) = parse_command(&line, &Limits::default()) {
                    prop_assert_eq!(parse_command(&c.to_string(), &Limits::default()), Ok(c.clone()), "{}", line);
                }
                let _ = parse_command_on(&line, &Limits::default(), own);
            }

            #[test]
            fn near_miss_lines_never_panic(
                verb in prop_oneof![Just("OPEN"), Just("STATE"), Just("SEEK"), Just("SCHEDULE"), Just("close"), Just("TUNE"), Just("START")],
                rest in "[ a-z0-9=,*./:-]{0,80}",
            ) {
                if let Ok(c) = parse_command(&format!("{verb} {rest}"), &Limits::default()) {
                    // What parses, round-trips.
                    prop_assert_eq!(parse_command(&c.to_string(), &Limits::default()), Ok(c));
                }
            }
        }
    }
}
