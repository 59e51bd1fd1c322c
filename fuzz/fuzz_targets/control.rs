#![no_main]
//! Arbitrary bytes as control-protocol input: framed into lines, each parsed. Every line
//! that parses must print back to text that parses to the same command; the reply parser
//! must survive the same bytes.
use libfuzzer_sys::fuzz_target;
use penstock_core::control::{Limits, ReplyParser, next_line, parse_command, parse_command_bytes};

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
        if let Ok(s) = std::str::from_utf8(line) {
            let _ = replies.push_line(s);
        }
        rest = &rest[consumed_bytes..];
    }
});
