//! `--json [FILE]`, the same on every command that has it: the flag alone writes one JSON
//! object to stdout (and the command's human lines go to stderr, so stdout parses as JSON);
//! with a file name the object goes to that file and stdout keeps its usual lines.
//!
//! Commands with positional arguments (`stream`, `record`) take the file as `--json=FILE`,
//! so that `--json SRC DST` keeps meaning stdout; the benches (no positionals) also accept
//! `--json FILE`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The value clap gives a bare `--json`.
pub const STDOUT: &str = "-";

/// Whether `--json` sends its object to stdout.
pub fn json_on_stdout(dest: Option<&Path>) -> bool {
    dest.is_some_and(|p| p == Path::new(STDOUT))
}

/// Writes `v` where `--json` said: stdout for `-`, else the file (pretty-printed, with a
/// final newline).
pub fn write_json(dest: &Path, v: &serde_json::Value) -> Result<()> {
    if dest == Path::new(STDOUT) {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{v}")?;
        out.flush()?;
        return Ok(());
    }
    let text = serde_json::to_string_pretty(v)? + "\n";
    std::fs::write(dest, text).with_context(|| format!("writing {}", dest.display()))
}

/// Where human-readable lines go: stderr when the JSON object takes stdout.
pub fn human(dest: Option<&Path>) -> Box<dyn Write> {
    if json_on_stdout(dest) {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    }
}

/// `Option<PathBuf>` as clap fills it (kept for the signatures that take an owned option).
pub fn dest(opt: &Option<PathBuf>) -> Option<&Path> {
    opt.as_deref()
}
