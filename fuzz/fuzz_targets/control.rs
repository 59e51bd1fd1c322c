#![no_main]
//! Arbitrary bytes as control-protocol input: framed into lines, each parsed (as on any
//! connection, and as on a stream's own descriptor, where ids may be left out). Every line
//! that parses must print back to text that parses to the same command; the reply parser
//! must survive the same bytes.
use libfuzzer_sys::fuzz_target;
use penstock_core::control::{
    Limits, ReplyParser, StreamId, next_line, parse_command, parse_command_bytes,
    parse_command_bytes_on,
};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        line_bytes_max: 512,
        ..Limits::default()
    };
    let mut rest = data;
    let mut replies = ReplyParser::new(limits.clone());
    while let Ok(Some((line, consumed_bytes))) = next_line(rest, &limits) {
        assert!(consumed_bytes > 0 && consumed_bytes <= rest.len());
        if let Ok(cmd) = parse_command_bytes(line, &limits) {
            let text = cmd.to_string();
            assert_eq!(parse_command(&text, &Limits::default()), Ok(cmd), "{text}");
        }
        // On a stream's own descriptor (ids may be left out) too: what parses prints as a
        // canonical line, with the id, that means the same anywhere.
        if let Ok(cmd) = parse_command_bytes_on(line, &limits, Some(StreamId(7))) {
            let text = cmd.to_string();
            assert_eq!(parse_command(&text, &Limits::default()), Ok(cmd), "{text}");
        }
        if let Ok(s) = std::str::from_utf8(line) {
            let _ = replies.push_line(s);
        }
        rest = &rest[consumed_bytes..];
    }
});
