//! ARCHITECTURE.md's invariants that a reading of the sources can check (issue 34): which
//! crate may depend on which, where `unsafe` may be and that each block says why it is sound,
//! and that the core does no I/O and reads no clock. Module cycles: `tests/imports.rs`.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The code of a source file: `//` comments and string literals blanked (a doc that says
/// "unsafe" or a message that names a clock is not code), and the `#[cfg(test)] mod tests`
/// at its end left out.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if !in_str && c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && prev != '\'' {
                in_str = !in_str;
                out.push('"');
            } else {
                out.push(if in_str { ' ' } else { c });
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.push('\n');
    }
    out
}

/// The workspace crates a crate's `[dependencies]` name (not its dev-dependencies).
fn internal_deps(krate: &str) -> Vec<String> {
    let toml = std::fs::read_to_string(workspace().join("crates").join(krate).join("Cargo.toml"))
        .expect("Cargo.toml");
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in toml.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l == "[dependencies]";
            continue;
        }
        if in_deps && l.starts_with("penstock-") {
            deps.push(l.split(['.', ' ', '=']).next().unwrap_or("").to_string());
        }
    }
    deps.sort();
    deps
}

#[test]
fn crates_depend_only_downward() {
    // Each crate and the workspace crates it may use (ARCHITECTURE.md, "Bird's-eye view").
    let allowed: &[(&str, &[&str])] = &[
        ("core", &[]),
        ("uring", &[]),
        ("driver", &["penstock-core", "penstock-uring"]),
        ("sim", &["penstock-core"]),
        (
            "server",
            &["penstock-core", "penstock-driver", "penstock-uring"],
        ),
        ("bench", &["penstock-core", "penstock-driver"]),
        ("mount", &["penstock-core", "penstock-driver"]),
        (
            "libpenstock",
            &["penstock-core", "penstock-driver", "penstock-server"],
        ),
        (
            "penstock",
            &[
                "penstock-bench",
                "penstock-core",
                "penstock-driver",
                "penstock-mount",
                "penstock-server",
                "penstock-uring",
            ],
        ),
    ];
    for (krate, may) in allowed {
        for dep in internal_deps(krate) {
            assert!(
                may.contains(&dep.as_str()),
                "crates/{krate} depends on {dep}, which ARCHITECTURE.md does not allow it"
            );
        }
    }
    assert!(
        internal_deps("driver").contains(&"penstock-core".to_string()),
        "the dependency reader lost driver → core"
    );
}

/// Where `unsafe` may be: the io_uring crate (with the raw system calls, socket activation's
/// descriptors among them) and the C library's boundary.
const UNSAFE_ALLOWED: &[&str] = &["crates/uring/", "crates/libpenstock/"];

#[test]
fn unsafe_lives_only_where_architecture_md_says_and_each_block_says_why() {
    let root = workspace();
    let mut found = 0;
    for krate in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let src = krate.expect("an entry").path().join("src");
        if !src.is_dir() {
            continue;
        }
        for file in sources(&src) {
            let rel = file
                .strip_prefix(&root)
                .expect("inside")
                .display()
                .to_string();
            let text = std::fs::read_to_string(&file).expect("readable");
            let code = code_of(&text);
            let lines: Vec<&str> = text.lines().collect();
            for (n, line) in code.lines().enumerate() {
                // A block, an unsafe fn or impl, an extern block — not a function pointer
                // type (`unsafe extern "C" fn(…)`), which is safe to name.
                let uses = line.contains("unsafe {")
                    || line.contains("unsafe fn ")
                    || line.contains("unsafe impl")
                    || (line.contains("unsafe extern") && !line.contains("fn("));
                if !uses {
                    continue;
                }
                found += 1;
                assert!(
                    UNSAFE_ALLOWED.iter().any(|a| rel.starts_with(a)),
                    "{rel}:{}: `unsafe` outside the places ARCHITECTURE.md names",
                    n + 1
                );
                // A `// SAFETY:` (or a `# Safety` doc for an unsafe fn) within the lines above.
                let above = &lines[n.saturating_sub(12)..=n];
                assert!(
                    above
                        .iter()
                        .any(|l| l.contains("SAFETY:") || l.contains("# Safety")),
                    "{rel}:{}: an `unsafe` without a `// SAFETY:` comment above it",
                    n + 1
                );
            }
        }
    }
    assert!(found > 10, "the reader found only {found} unsafe uses");
}

#[test]
fn the_core_does_no_io_and_reads_no_clock() {
    let root = workspace();
    let banned = [
        "std::fs",
        "std::net::TcpStream",
        "std::net::UdpSocket",
        "std::net::TcpListener",
        "Instant::now",
        "SystemTime::now",
        "std::thread",
        "std::process",
        "std::env::var",
    ];
    let files = sources(&root.join("crates/core/src"));
    assert!(files.len() > 20, "the core's sources were not found");
    for file in files {
        let code = code_of(&std::fs::read_to_string(&file).expect("readable"));
        for b in banned {
            assert!(
                !code.contains(b),
                "{}: the core uses {b} (it takes time and bytes from its caller)",
                file.display()
            );
        }
    }
}

#[test]
fn the_readers_see_what_they_must() {
    let code = code_of(
        "let s = \"unsafe { x }\"; // unsafe {\nunsafe { y }\n#[cfg(test)]\nmod tests {\nunsafe { z }\n}",
    );
    assert_eq!(code.matches("unsafe {").count(), 1, "{code}");
    assert!(code.contains("unsafe { y }"));
}
