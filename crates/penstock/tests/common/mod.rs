//! Helpers shared by the tests that run `penstock serve` as a process.
#![allow(dead_code)]

/// The HTTP address and, when the line has one, the control TCP address from `penstock
/// serve`'s start line: `penstock serve: http://HOST:PORT, control HOST:PORT, control
/// unix:PATH; http bodies: …`.
pub fn serve_addresses(line: &str) -> (String, Option<String>) {
    let rest = line
        .strip_prefix("penstock serve: http://")
        .unwrap_or_else(|| panic!("not a start line: {line:?}"));
    let field_end = |s: &str| {
        s.find([',', ';', ' '])
            .map_or(s, |i| &s[..i])
            .trim()
            .to_string()
    };
    let http = field_end(rest);
    let control = line
        .split(", control ")
        .nth(1)
        .filter(|c| !c.starts_with("unix:"))
        .map(field_end);
    (http, control)
}
