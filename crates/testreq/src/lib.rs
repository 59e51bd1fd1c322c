//! What an integration test needs, said in one place.
//!
//! A test that needs something this machine may lack (a tool on `PATH`, root, io_uring,
//! FUSE, a second device…) asks here first: `if !penstock_testreq::require("ffmpeg") {
//! return; }`. The answer is `true` when the requirement is met. When it is not:
//!
//! - with `PENSTOCK_TEST_REQUIRE=all` (what `.ci/run` exports), or with `CI` set and
//!   `PENSTOCK_TEST_REQUIRE` unset, the test **fails**, naming the requirement: a CI run
//!   where ffmpeg failed to install cannot look like one where everything ran;
//! - otherwise it prints `SKIPPED: <test> needs <what>: <why>` (the harness hides the
//!   captured output of a passing test: `--nocapture` shows it, and the summary below counts
//!   it either way).
//!
//! Either way, with `PENSTOCK_TEST_SUMMARY=DIR` set, one line per question is appended to
//! `DIR/requirements.tsv`: `ran|skipped|failed` (failed: missing under the strict mode), the
//! requirement, the test, the reason — `.ci/run`
//! adds them up per requirement at the end. Lines are written with one `write` to a file
//! opened `O_APPEND`, so concurrent test threads and processes do not interleave them.
//!
//! Tests never install what they need (no `apt-get` from a test): `.ci/run` does.
#![forbid(unsafe_code)]

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Whether a missing requirement fails the test (`PENSTOCK_TEST_REQUIRE=all`, or `CI` set
/// without `PENSTOCK_TEST_REQUIRE`) rather than skipping it.
pub fn strict() -> bool {
    match std::env::var("PENSTOCK_TEST_REQUIRE") {
        Ok(v) => v == "all",
        Err(_) => std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false"),
    }
}

/// The running test's name: libtest names each test's thread after it (`main` when the
/// binary runs one test on the main thread, `--test-threads=1`).
fn test_name() -> String {
    let t = std::thread::current();
    match t.name() {
        Some("main") | None => std::env::args()
            .skip(1)
            .find(|a| !a.starts_with('-'))
            .unwrap_or_else(|| "main".to_string()),
        Some(n) => n.to_string(),
    }
}

fn record(outcome: &str, what: &str, test: &str, why: &str) {
    let Some(dir) = std::env::var_os("PENSTOCK_TEST_SUMMARY") else {
        return;
    };
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    let line = format!(
        "{outcome}\t{}\t{}\t{}\n",
        clean(what),
        clean(test),
        clean(why)
    );
    let path = Path::new(&dir).join("requirements.tsv");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?
            .write_all(line.as_bytes())
    });
    if let Err(e) = written {
        // The summary is what CI reads: a lost line must not pass unseen.
        panic!("cannot append to {}: {e}", path.display());
    }
}

/// The one decision: `None` when `what` is present, else the reason it is missing.
/// Returns whether the test (or the part of it) should run; panics under [`strict`].
pub fn require_that(what: &str, missing: Option<String>) -> bool {
    let test = test_name();
    match missing {
        None => {
            record("ran", what, &test, "");
            true
        }
        Some(why) => {
            let strict = strict();
            record(if strict { "failed" } else { "skipped" }, what, &test, &why);
            if strict {
                panic!(
                    "{test} needs {what} ({why}); PENSTOCK_TEST_REQUIRE=all (or CI) makes a missing \
                     requirement a failure: install it (.ci/run lists what the suite needs)"
                );
            }
            println!("SKIPPED: {test} needs {what}: {why}");
            false
        }
    }
}

/// [`require_that`] on a probe's result: `Some(value)` when it succeeded.
pub fn require_ok<T, E: Display>(what: &str, probe: Result<T, E>) -> Option<T> {
    match probe {
        Ok(v) => {
            require_that(what, None);
            Some(v)
        }
        Err(e) => {
            require_that(what, Some(e.to_string()));
            None
        }
    }
}

/// The executable `name` on `PATH` (or `name` itself when it holds a `/`).
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return runnable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| runnable(p))
}

/// A tool on `PATH` (`require("ffmpeg")`).
pub fn require(tool: &str) -> bool {
    require_that(
        tool,
        which(tool)
            .is_none()
            .then(|| "not found on PATH".to_string()),
    )
}

/// Every tool of `tools`; each is recorded, the first missing one decides.
pub fn require_all(tools: &[&str]) -> bool {
    tools.iter().all(|t| require(t))
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Root (switching users, mounting, raising limits).
pub fn require_root() -> bool {
    require_that(
        "root",
        (!is_root()).then(|| format!("euid {}", rustix::process::geteuid().as_raw())),
    )
}

/// io_uring: a small ring can be set up here (seccomp, `io_uring_disabled`, old kernels
/// refuse it).
pub fn require_io_uring() -> bool {
    require_ok("io_uring", io_uring::IoUring::new(2).map(drop)).is_some()
}

/// FUSE: `/dev/fuse` opens read-write and `fusermount3` is on `PATH`.
pub fn require_fuse() -> bool {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map(drop)
        .map_err(|e| format!("/dev/fuse: {e}"));
    require_ok("fuse", dev).is_some() && require("fusermount3")
}

/// A Python 3 module importable by `python3` (`require_python_module("yaml")`).
pub fn require_python_module(module: &str) -> bool {
    let what = format!("python3 module {module}");
    let missing = match std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
    {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("import {module} failed ({s})")),
        Err(e) => Some(format!("python3: {e}")),
    };
    require_that(&what, missing)
}

/// The browser player of the HLS, live and TLS tests: `crates/server/tests/player` with
/// hls.js and playwright-core installed (`npm ci`; `.ci/run` runs it), node, and Debian's
/// Chromium. Its directory, or `None` (SKIPPED; a failure under `PENSTOCK_TEST_REQUIRE=all`).
pub fn require_browser_player() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/player");
    let ready = dir.join("node_modules/hls.js/dist/hls.min.js").is_file()
        && dir.join("node_modules/playwright-core").is_dir()
        && which("node").is_some()
        && Path::new("/usr/bin/chromium").is_file();
    require_that(
        "browser player",
        (!ready).then(|| {
            "node, chromium (apt-get install chromium) and `npm ci --prefix \
             crates/server/tests/player`"
                .to_string()
        }),
    )
    .then_some(dir)
}

/// Runs `script` (`play.mjs`, `live.mjs`, …) of the browser player in `player` on `url`
/// with `args` and `env`, under `timeout 300`, its screenshot written to the temp directory
/// under `tag`; prints what it said. Returns its last line (the JSON result), its stderr and
/// the screenshot's path.
pub fn run_browser_player(
    player: &Path,
    script: &str,
    url: &str,
    args: &[&str],
    env: &[(&str, &str)],
    tag: &str,
) -> (String, String, PathBuf) {
    let shot = std::env::temp_dir().join(format!("penstock-{tag}-{}.png", std::process::id()));
    let o = std::process::Command::new("timeout")
        .args(["300", "node"])
        .arg(player.join(script))
        .arg(url)
        .args(args)
        .envs(env.iter().copied())
        .env("SCREENSHOT", &shot)
        .output()
        .expect("node");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    println!("{out}\n{err}\nscreenshot: {}", shot.display());
    let line = out.lines().last().unwrap_or_default().to_string();
    (line, err, shot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_finds_a_shell_and_not_a_made_up_name() {
        assert!(which("sh").is_some());
        assert!(which("penstock-no-such-tool-here").is_none());
    }
}
