//! The checked-in header, `include/penstock.h`, is what cbindgen makes of the crate now:
//! this test regenerates it (with `cbindgen.toml`) and fails on any difference, so a change
//! of the C API without its header cannot pass. `PENSTOCK_BLESS=1` writes the new header
//! instead (then review the diff and commit it). cargo-c installs this same file
//! (`[package.metadata.capi.install.include]`), never a header of its own.

use std::path::Path;

#[test]
fn the_checked_in_header_is_what_cbindgen_makes_of_the_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut made);
    let made = String::from_utf8(made).expect("the header is UTF-8");
    let path = dir.join("include/penstock.h");
    if std::env::var_os("PENSTOCK_BLESS").is_some() {
        std::fs::write(&path, &made).expect("write include/penstock.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != made {
        let first = checked_in
            .lines()
            .zip(made.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(checked_in.lines().count().min(made.lines().count()));
        panic!(
            "include/penstock.h differs from the crate's C API (first at line {}):\n  checked in: {:?}\n  generated:  {:?}\nRun PENSTOCK_BLESS=1 cargo test -p penstock-c --test header, review, commit.",
            first + 1,
            checked_in.lines().nth(first).unwrap_or("<end>"),
            made.lines().nth(first).unwrap_or("<end>"),
        );
    }
    // Every entry point of the crate is in it (a sanity check of the generator's reach).
    for f in [
        "penstock_engine_new",
        "penstock_engine_free",
        "penstock_config_default",
        "penstock_cue",
        "penstock_stream_open",
        "penstock_stream_start",
        "penstock_stream_pause",
        "penstock_stream_resume",
        "penstock_stream_state",
        "penstock_stream_wait",
        "penstock_stream_cancel",
        "penstock_stream_close",
        "penstock_stream(",
        "penstock_last_error",
        "penstock_last_error_code",
        "penstock_strerror",
        "penstock_version",
    ] {
        assert!(made.contains(f), "{f} is missing from the header");
    }
}
