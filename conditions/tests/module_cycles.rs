//! No two modules of the companion import each other, directly or through
//! others (ARCHITECTURE.md: "no circle"): read from the sources, each
//! module's `crate::…` and `super::…` paths outside comments and its tests,
//! a module and its own parent or children aside.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every module under `dir` (`a::b` for `a/b.rs` or `a/b/mod.rs`) and its text.
fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut p = prefix.to_vec();
            p.push(name);
            modules(&path, &p, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut p = prefix.to_vec();
            if name != "mod" {
                p.push(name);
            }
            if p.is_empty() || p == ["main"] || p == ["lib"] {
                continue;
            }
            out.insert(p.join("::"), std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The text without its `#[cfg(test)] mod tests` and comment lines.
fn code(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at]);
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The words of a path starting at `from` (`a::b::{c, d}` gives `a`, `b`).
fn path_at(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        out.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

fn graph(mods: &BTreeMap<String, String>) -> Graph {
    let mut g = Graph::new();
    for (m, text) in mods {
        let text = code(text);
        let parent: Vec<String> = {
            let mut p: Vec<String> = m.split("::").map(String::from).collect();
            p.pop();
            p
        };
        let mut edges = BTreeSet::new();
        let mut add = |path: Vec<String>| {
            for k in (1..=path.len()).rev() {
                let c = path[..k].join("::");
                if mods.contains_key(&c) {
                    if c != *m {
                        edges.insert(c);
                    }
                    break;
                }
            }
        };
        for (at, _) in text.match_indices("crate::") {
            add(path_at(&text[at + "crate::".len()..]));
        }
        for (at, _) in text.match_indices("super::") {
            if text[..at].ends_with("::") {
                continue;
            }
            let rest = &text[at + "super::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let mut p = parent.clone();
                    p.extend(path_at(item.trim()));
                    add(p);
                }
            } else {
                let mut p = parent.clone();
                p.extend(path_at(rest));
                add(p);
            }
        }
        g.insert(m.clone(), edges);
    }
    g
}

/// `a` is `b` or one of its ancestors.
fn ancestor(a: &str, b: &str) -> bool {
    b.starts_with(&format!("{a}::"))
}

/// A cycle of modules that are not each other's ancestors, if any.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in g.get(m).into_iter().flatten() {
            if ancestor(next, m) || ancestor(m, next) {
                continue;
            }
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_modules_of_the_companion_import_each_other() {
    let mut mods = BTreeMap::new();
    modules(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &[],
        &mut mods,
    );
    assert!(mods.contains_key("xds::protocol") && mods.contains_key("preflight::checks"));
    let g = graph(&mods);
    assert!(
        g["xds::sotw"].contains("xds::protocol"),
        "the reader sees imports"
    );
    assert_eq!(cycle(&g), None);
}

#[test]
fn the_reader_finds_a_circle_through_super_and_crate_paths() {
    let mods: BTreeMap<String, String> = [
        ("p", ""),
        ("p::a", "use super::b::X;\n"),
        ("p::b", "use crate::p::c::Y;\n"),
        ("p::c", "use super::{a, d};\n// use crate::p::d;\n"),
        ("p::d", ""),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_string(), t.to_string()))
    .collect();
    let g = graph(&mods);
    assert_eq!(
        cycle(&g).map(|c| c.len()),
        Some(4),
        "a -> b -> c -> a: {g:?}"
    );
    let mut g = g;
    g.get_mut("p::c").unwrap().remove("p::a");
    assert_eq!(cycle(&g), None, "{g:?}");
}
