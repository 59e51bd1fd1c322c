//! The driver's modules import one another without a cycle (issue 17, item 4): each module
//! can be read, and changed, knowing only those below it. The graph is read from the sources
//! (`use crate::m…` and `crate::m::…` outside comments), so it cannot drift from the code.
//!
//! `lib.rs` declares the modules and re-exports from them: a use of a re-exported name
//! (`use crate::Engine`) is an edge to the module it comes from (`engine`), or a cycle
//! through the crate root would stay unseen (one did: engine → calibration → cpu_probe →
//! `crate::Engine`, until the send cost moved to `send_cost`, above the engine).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Module → the modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn driver_modules_import_one_another_without_a_cycle() {
    let graph = read_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // The reader must see the edges that exist, or an empty graph would pass.
    assert!(
        graph.get("engine").is_some_and(|u| u.contains("worker")),
        "the import reader lost `engine` → `worker`:\n{}",
        show(&graph)
    );
    // ... and the edges through the crate root's re-exports.
    assert!(
        graph.get("cpu_probe").is_some_and(|u| u.contains("engine")),
        "the import reader lost `cpu_probe` → `engine` (through `crate::Engine`):\n{}",
        show(&graph)
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "driver modules import one another in a cycle: {}\n\nthe graph:\n{}",
            cycle.join(" → "),
            show(&graph)
        );
    }
    println!("{}", show(&graph));
}

/// Every crate of the workspace, read the same way (the modules of `src/`, edges through its
/// root's re-exports): none has a cycle between its modules.
#[test]
fn no_crate_of_the_workspace_has_a_module_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/");
    let mut read = 0;
    for entry in std::fs::read_dir(crates).expect("crates/ is readable") {
        let src = entry.expect("a directory entry").path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = read_graph(&src);
        read += 1;
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "{}: modules import one another in a cycle: {}\n\nthe graph:\n{}",
                src.display(),
                cycle.join(" → "),
                show(&graph)
            );
        }
    }
    assert!(
        read >= 8,
        "only {read} crates found under {}",
        crates.display()
    );
}

#[test]
fn a_cycle_is_found_and_a_tree_passes() {
    let g = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let tree = g(&[("engine", "worker"), ("worker", "step"), ("engine", "step")]);
    assert_eq!(find_cycle(&tree), None);
    let looped = g(&[
        ("engine", "worker"),
        ("worker", "paths"),
        ("paths", "worker"),
    ]);
    assert_eq!(
        find_cycle(&looped),
        Some(vec!["worker".into(), "paths".into(), "worker".into()])
    );
    let crate_uses =
        uses_of("use crate::{a::X, b};\n// use crate::c;\nlet x = crate::d::f();\n$crate::e::g();");
    assert_eq!(crate_uses, ["a", "b", "d"].map(String::from).into());
    let exports = re_exports(
        "mod a;\npub use engine::{\n    Engine, EngineConfig,\n};\npub use paths::sendfile_call;\n// pub use x::Y;",
    );
    assert_eq!(exports.get("Engine").map(String::as_str), Some("engine"));
    assert_eq!(
        exports.get("EngineConfig").map(String::as_str),
        Some("engine")
    );
    assert_eq!(
        exports.get("sendfile_call").map(String::as_str),
        Some("paths")
    );
    assert_eq!(exports.get("Y"), None);
}

/// Names the crate root re-exports (`pub use m::{A, B};`, `pub use m::A;`) → their module.
fn re_exports(lib: &str) -> BTreeMap<String, String> {
    let code: String = lib
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        let names = names.trim().trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.trim();
            if !name.is_empty() && !name.contains("::") {
                out.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

/// The module graph of the crate whose sources are in `src`: a module is a file `src/m.rs`
/// (with the files under `src/m/`, if any).
fn read_graph(src: &Path) -> Graph {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    collect(src, None, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let lib = std::fs::read_to_string(src.join("lib.rs"))
        .or_else(|_| std::fs::read_to_string(src.join("main.rs")))
        .unwrap_or_default();
    let exports = re_exports(&lib);
    let mut graph = Graph::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let used = graph.entry(module.clone()).or_default();
        for u in uses_of(&text) {
            let u = exports.get(&u).cloned().unwrap_or(u);
            if u != *module && modules.contains(&u) {
                used.insert(u);
            }
        }
    }
    graph
}

fn collect(dir: &Path, module: Option<&str>, out: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name")
            .to_string();
        if path.is_dir() {
            collect(&path, Some(module.unwrap_or(&stem)), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            match module {
                Some(m) => out.push((m.to_string(), path)),
                None if stem == "lib" || stem == "main" => {}
                None => out.push((stem, path)),
            }
        }
    }
}

/// The first path segments after `crate::` in `text`, outside `//` comments: `use crate::m`,
/// `use crate::{m::X, n}` and `crate::m::f()` all name `m`.
fn uses_of(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + "crate::".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::` (a macro) or a longer name ending in `crate`
        }
        if let Some(group) = after.strip_prefix('{') {
            // `use crate::{a::X, b, c::{D, E}}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphabetic() || c == '_') => {
                        found.insert(ident_at(&group[k..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident_at(after));
        }
    }
    found
}

fn ident_at(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A cycle, as the modules along it with the first repeated at the end; `None` for a DAG.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'g>(
        m: &'g str,
        graph: &'g Graph,
        marks: &mut BTreeMap<&'g str, Mark>,
        path: &mut Vec<&'g str>,
    ) -> Option<Vec<String>> {
        match marks.get(m) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path
                    .iter()
                    .position(|p| *p == m)
                    .expect("open is on the path");
                let mut cycle: Vec<String> = path[from..].iter().map(|s| s.to_string()).collect();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(m, Mark::Open);
        path.push(m);
        for u in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(u, graph, marks, path) {
                return Some(c);
            }
        }
        path.pop();
        marks.insert(m, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut marks, &mut Vec::new()))
}

fn show(graph: &Graph) -> String {
    let mut s = String::new();
    for (m, used) in graph {
        let used: Vec<&str> = used.iter().map(String::as_str).collect();
        let _ = writeln!(s, "  {m} → {}", used.join(", "));
    }
    s
}
