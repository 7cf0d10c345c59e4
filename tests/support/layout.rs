//! The layout guard of the end-to-end crate and its harness: every
//! end-to-end test lives in the one test binary (`tests/e2e/`), every
//! harness file in this library, each declared by its parent module (or,
//! under `bin/`, a `[[bin]]` of the harness's Cargo.toml). A test file left in the old layout (`tests/*.rs`,
//! one binary per file) or a file no `mod` names would never be compiled, so
//! its tests would silently not run: this makes that loud.

use std::path::{Path, PathBuf};

/// The families of the test binary, one folder each under `tests/e2e/`.
const FAMILIES: &str = "wasm (the filter only), native (the LB policy only), \
companion (the conditions companion in the chain) or both (a scenario run against both forms)";

/// The end-to-end crate's folder, `tests/` (the harness is `tests/support/`).
fn crate_dir() -> PathBuf {
    let support = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    support.parent().map_or(support.clone(), Path::to_path_buf)
}

/// `.rs` files below `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
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

/// The names `mod name;` declares in a module file (`pub`, `pub(crate)`
/// and attributes on lines of their own allowed).
fn declared_modules(module_file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(module_file).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut l = line.trim();
            if let Some(rest) = l.strip_prefix("pub") {
                l = rest.trim_start();
                if let Some(rest) = l.strip_prefix('(') {
                    l = rest.split_once(')').map_or("", |(_, r)| r).trim_start();
                }
            }
            let name = l.strip_prefix("mod ")?.trim().strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// The file that declares the modules of `dir`'s files: `root_file` for the
/// tree's root, else `dir/mod.rs` or `dir.rs`.
fn module_file_of(dir: &Path, root: &Path, root_file: &str) -> PathBuf {
    if dir == root {
        return root.join(root_file);
    }
    let mod_rs = dir.join("mod.rs");
    if mod_rs.is_file() {
        return mod_rs;
    }
    dir.with_extension("rs")
}

/// Files under `root` that no parent module declares.
fn undeclared(root: &Path, root_file: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for file in rust_files(root) {
        let Some(stem) = file.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let Some(dir) = file.parent() else { continue };
        let (name, parent_dir) = if stem == "mod" {
            match (dir.file_name().and_then(|s| s.to_str()), dir.parent()) {
                (Some(n), Some(p)) => (n.to_string(), p.to_path_buf()),
                _ => continue,
            }
        } else if dir == root && stem == root_file.trim_end_matches(".rs") {
            continue;
        } else {
            (stem.to_string(), dir.to_path_buf())
        };
        let declaring = module_file_of(&parent_dir, root, root_file);
        if declaring == file || !declared_modules(&declaring).contains(&name) {
            bad.push(format!(
                "{} is not compiled: no `mod {name};` in {}",
                relative(&file),
                relative(&declaring)
            ));
        }
    }
    bad
}

fn relative(p: &Path) -> String {
    let base = crate_dir();
    let base = base.parent().unwrap_or(&base);
    p.strip_prefix(base).unwrap_or(p).display().to_string()
}

#[test]
fn no_test_file_outside_the_e2e_binary() {
    let dir = crate_dir();
    let stray: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "rs"))
        .collect();
    let mut msg = String::new();
    for p in &stray {
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("name");
        let module = stem.strip_prefix("e2e_").unwrap_or(stem);
        msg.push_str(&format!(
            "{} is a test file in the old layout (one binary per file): nothing builds it, so its \
             tests do not run. Move it to tests/e2e/<family>/{module}.rs, family one of {FAMILIES}; \
             add `mod {module};` to tests/e2e/<family>/mod.rs and drop its `mod support;` line \
             (the harness is the `support` crate: `use support::*;` works as before). Run it \
             with `cargo test -p serving-picker-e2e --test e2e <family>::{module}::`.\n",
            relative(p)
        ));
    }
    assert!(msg.is_empty(), "\n{msg}");
}

#[test]
fn every_file_of_the_binary_and_the_harness_is_a_declared_module() {
    let dir = crate_dir();
    let mut bad = undeclared(&dir.join("e2e"), "main.rs");
    let support = dir.join("support");
    bad.extend(
        undeclared(&support, "lib.rs")
            .into_iter()
            .filter(|b| !b.starts_with("tests/support/bin/")),
    );
    // The harness's binaries are targets of its Cargo.toml instead.
    let manifest = std::fs::read_to_string(support.join("Cargo.toml")).unwrap();
    for bin in rust_files(&support.join("bin")) {
        let name = bin.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !manifest.contains(&format!("path = \"bin/{name}\"")) {
            bad.push(format!(
                "{} is not compiled: no [[bin]] with path = \"bin/{name}\" in tests/support/Cargo.toml",
                relative(&bin)
            ));
        }
    }
    let families: Vec<String> = declared_modules(&dir.join("e2e/main.rs"));
    for family in ["wasm", "native", "companion", "both"] {
        if !families.iter().any(|f| f == family) {
            bad.push(format!("tests/e2e/main.rs declares no `mod {family};`"));
        }
    }
    assert!(
        bad.is_empty(),
        "\n{}\nA test of one form goes to tests/e2e/<family>/<name>.rs, family one of {FAMILIES}, \
         declared with `mod <name>;` in that family's mod.rs; a harness file to tests/support/, \
         declared in tests/support/lib.rs.",
        bad.join("\n")
    );
}

/// `env!("CARGO_MANIFEST_DIR")` is the crate's folder (`tests/` for the
/// tests, `tests/support/` for the harness): a path to a file of the
/// repository starts at `support::repo_root()` instead.
#[test]
fn repository_paths_start_at_the_repo_root() {
    let dir = crate_dir();
    let mut files = rust_files(&dir.join("e2e"));
    files.extend(rust_files(&dir.join("support")));
    let needle = concat!("env!(\"", "CARGO_MANIFEST_DIR");
    let bad: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("support/lib.rs") && !f.ends_with("support/layout.rs"))
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains(needle)))
        .map(|f| relative(f))
        .collect();
    assert!(
        bad.is_empty(),
        "{bad:?} use CARGO_MANIFEST_DIR, which is tests/ or tests/support/: start repository paths at \
         support::repo_root() (crate::repo_root() in the harness)"
    );
}

#[test]
fn the_guard_sees_an_undeclared_file() {
    let root = std::env::temp_dir().join(format!("e2e-layout-{}", std::process::id()));
    let fam = root.join("wasm");
    std::fs::create_dir_all(&fam).unwrap();
    std::fs::write(root.join("main.rs"), "mod wasm;\n").unwrap();
    std::fs::write(
        fam.join("mod.rs"),
        "mod known;\n#[cfg(test)]\npub(crate) mod other;\n",
    )
    .unwrap();
    for f in ["known.rs", "other.rs", "stray.rs"] {
        std::fs::write(fam.join(f), "").unwrap();
    }
    let bad = undeclared(&root, "main.rs");
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("stray.rs") && bad[0].contains("mod stray;"),
        "{bad:?}"
    );
}
