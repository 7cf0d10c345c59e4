//! Which Envoy this build is for, and whether the Envoy loading it is that
//! one.
//!
//! A build targets one Envoy minor, chosen by a cargo feature (`envoy-1-38`,
//! `envoy-1-39`, `envoy-1-40`, the default); `make build` writes one .so per
//! minor (docs/compatibility.md). Envoy itself only compares the ABI version
//! string `program_init` returns and logs a warning on a mismatch, then
//! loads the module anyway; a callback whose signature differs would then be
//! undefined behaviour. So `program_init` identifies the running Envoy by
//! the set of `envoy_dynamic_module_callback_*` symbols its executable
//! exports (identical across the patch releases of a minor, different for
//! every minor) and refuses, with a log line saying which build to load,
//! when that is not the Envoy this build is for. A refusal is a null
//! answer, which makes Envoy fail the configuration that loads the module
//! ("Failed to initialize dynamic module").
//!
//! `SERVING_PICKER_ENVOY_CHECK=warn` turns a refusal into a warning (for an
//! Envoy build this table does not know), except when Envoy lacks a
//! callback the module calls: that would abort Envoy at the first call.

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::path::Path;

use object::{Object, ObjectSymbol};

/// One Envoy minor this module can be built for.
#[derive(Debug, PartialEq, Eq)]
pub struct EnvoyRelease {
    /// "1.40"
    pub minor: &'static str,
    /// What Envoy's `ENVOY_DYNAMIC_MODULES_ABI_VERSION` is in that release.
    pub abi_version: &'static CStr,
    /// How many `envoy_dynamic_module_callback_*` symbols it exports, and
    /// their FNV-1a hash (`fingerprint`); the lists are native/abi/*.callbacks.
    pub callbacks: usize,
    /// Their FNV-1a hash, as `fingerprint` computes it.
    pub callbacks_fnv: u64,
}

/// Every Envoy minor with the dynamic-module load-balancing policy.
pub const KNOWN: [EnvoyRelease; 3] = [
    EnvoyRelease {
        minor: "1.38",
        abi_version: c"v0.1.0",
        callbacks: 521,
        callbacks_fnv: 0xcbdd_d9e3_f830_24fe,
    },
    EnvoyRelease {
        minor: "1.39",
        abi_version: c"v0.1.0",
        callbacks: 607,
        callbacks_fnv: 0x2511_9e31_12f3_c651,
    },
    EnvoyRelease {
        minor: "1.40",
        abi_version: c"v0.2.0",
        callbacks: 781,
        callbacks_fnv: 0x833c_4c3f_2b6d_f218,
    },
];

#[cfg(any(
    all(feature = "envoy-1-38", feature = "envoy-1-39"),
    all(feature = "envoy-1-38", feature = "envoy-1-40"),
    all(feature = "envoy-1-39", feature = "envoy-1-40"),
))]
compile_error!(
    "enable exactly one envoy-1-NN feature (--no-default-features --features envoy-1-38)"
);
#[cfg(not(any(feature = "envoy-1-38", feature = "envoy-1-39", feature = "envoy-1-40")))]
compile_error!("enable one envoy-1-NN feature (the default is envoy-1-40)");

/// The Envoy this build is for.
#[cfg(feature = "envoy-1-38")]
pub const BUILT_FOR: &EnvoyRelease = &KNOWN[0];
/// The Envoy this build is for.
#[cfg(feature = "envoy-1-39")]
pub const BUILT_FOR: &EnvoyRelease = &KNOWN[1];
/// The Envoy this build is for.
#[cfg(feature = "envoy-1-40")]
pub const BUILT_FOR: &EnvoyRelease = &KNOWN[2];

/// The prefix of every callback Envoy exports to dynamic modules.
pub const CALLBACK_PREFIX: &str = "envoy_dynamic_module_callback_";

/// The callbacks the module calls: abi.rs's declarations (tests/e2e/native/abi.rs
/// checks that the .so imports exactly these).
pub const IMPORTED: [&str; 21] = [
    "envoy_dynamic_module_callback_lb_config_decrement_gauge",
    "envoy_dynamic_module_callback_lb_config_define_counter",
    "envoy_dynamic_module_callback_lb_config_define_gauge",
    "envoy_dynamic_module_callback_lb_config_increment_counter",
    "envoy_dynamic_module_callback_lb_config_increment_gauge",
    "envoy_dynamic_module_callback_lb_config_set_gauge",
    "envoy_dynamic_module_callback_lb_context_get_host_selection_retry_count",
    "envoy_dynamic_module_callback_lb_context_should_select_another_host",
    "envoy_dynamic_module_callback_lb_get_cluster_name",
    "envoy_dynamic_module_callback_lb_get_healthy_host_address",
    "envoy_dynamic_module_callback_lb_get_healthy_hosts_count",
    "envoy_dynamic_module_callback_lb_get_host_address",
    "envoy_dynamic_module_callback_lb_get_host_health",
    "envoy_dynamic_module_callback_lb_get_host_locality",
    "envoy_dynamic_module_callback_lb_get_host_metadata_bool",
    "envoy_dynamic_module_callback_lb_get_host_metadata_string",
    "envoy_dynamic_module_callback_lb_get_host_weight",
    "envoy_dynamic_module_callback_lb_get_hosts_count",
    "envoy_dynamic_module_callback_lb_get_priority_set_size",
    "envoy_dynamic_module_callback_log",
    "envoy_dynamic_module_callback_log_enabled",
];

/// The variable that turns a refusal into a warning (`warn`).
pub const CHECK_VAR: &str = "SERVING_PICKER_ENVOY_CHECK";

/// Count and FNV-1a hash of a set of callback names (each followed by a
/// newline, in byte order: what `LC_ALL=C sort -u` of the lists gives).
pub fn fingerprint<'a>(names: impl IntoIterator<Item = &'a str>) -> (usize, u64) {
    let sorted: BTreeSet<&str> = names.into_iter().collect();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in &sorted {
        for byte in name.bytes().chain(std::iter::once(b'\n')) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    (sorted.len(), hash)
}

/// What the running Envoy is, by its exported callbacks.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// A release this module knows.
    Release(&'static EnvoyRelease),
    /// Not a release this module knows (newer, or a custom build): how many
    /// callbacks it exports, and which of the module's imports it lacks.
    Unknown {
        /// How many callbacks it exports.
        callbacks: usize,
        /// The module's imports it does not export (the module would not load).
        missing: Vec<&'static str>,
    },
    /// The executable's symbols could not be read.
    Unreadable(String),
}

/// Identifies an Envoy by the callbacks it exports.
pub fn identify(exported: &BTreeSet<String>) -> Seen {
    let (count, fnv) = fingerprint(exported.iter().map(String::as_str));
    if let Some(release) = KNOWN
        .iter()
        .find(|r| r.callbacks == count && r.callbacks_fnv == fnv)
    {
        return Seen::Release(release);
    }
    Seen::Unknown {
        callbacks: count,
        missing: IMPORTED
            .iter()
            .copied()
            .filter(|name| !exported.contains(*name))
            .collect(),
    }
}

/// The `envoy_dynamic_module_callback_*` symbols an executable defines in
/// its dynamic symbol table (what `nm -D --defined-only` lists).
pub fn exported_callbacks(executable: &Path) -> Result<BTreeSet<String>, String> {
    let file = std::fs::File::open(executable)
        .map_err(|e| format!("cannot open {}: {e}", executable.display()))?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache)
        .map_err(|e| format!("cannot parse {}: {e}", executable.display()))?;
    Ok(elf
        .dynamic_symbols()
        .filter(|s| s.is_definition())
        .filter_map(|s| s.name().ok())
        .filter(|name| name.starts_with(CALLBACK_PREFIX))
        .map(str::to_string)
        .collect())
}

/// Load, or not, and the line that says why.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Load; `warning` when only the override lets it.
    Load {
        /// The line to log.
        message: String,
        /// Whether to log it as a warning.
        warning: bool,
    },
    /// Refuse, and the line that says why.
    Refuse(String),
}

fn build_hint(release: &EnvoyRelease) -> String {
    if release.minor == KNOWN[KNOWN.len() - 1].minor {
        "target/release/libserving_picker.so".to_string()
    } else {
        format!("target/envoy-{}/libserving_picker.so", release.minor)
    }
}

/// The decision for the Envoy `seen` under this build (`built_for`), with
/// `SERVING_PICKER_ENVOY_CHECK=warn` or not.
pub fn verdict(seen: &Seen, built_for: &EnvoyRelease, warn_only: bool) -> Verdict {
    let this = format!(
        "serving_picker: this module is built for Envoy {} (dynamic-module ABI {})",
        built_for.minor,
        built_for.abi_version.to_string_lossy()
    );
    let (problem, overridable) = match seen {
        Seen::Release(r) if *r == built_for => {
            return Verdict::Load {
                message: format!("{this} and runs in Envoy {}", r.minor),
                warning: false,
            }
        }
        Seen::Release(r) => (
            format!(
                "this Envoy is {} (ABI {}): load the module built for Envoy {} (`make build` writes {})",
                r.minor,
                r.abi_version.to_string_lossy(),
                r.minor,
                build_hint(r)
            ),
            true,
        ),
        Seen::Unknown { missing, .. } if !missing.is_empty() => (
            format!(
                "this Envoy does not export callbacks the module calls ({}): it is not an Envoy the module supports",
                missing.join(", ")
            ),
            false,
        ),
        Seen::Unknown { callbacks, .. } => (
            format!(
                "this Envoy's dynamic-module ABI is none the module knows ({callbacks} callbacks exported; known: {}): a newer release or a custom build",
                KNOWN
                    .iter()
                    .map(|r| format!("{} ({})", r.minor, r.callbacks))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            true,
        ),
        Seen::Unreadable(why) => (
            format!("the running Envoy could not be identified ({why})"),
            true,
        ),
    };
    if overridable && warn_only {
        Verdict::Load {
            message: format!("{this}; {problem}; loading anyway ({CHECK_VAR}=warn)"),
            warning: true,
        }
    } else if overridable {
        Verdict::Refuse(format!(
            "{this} and refuses to load: {problem} ({CHECK_VAR}=warn loads it anyway, at your own risk)"
        ))
    } else {
        Verdict::Refuse(format!("{this} and refuses to load: {problem}"))
    }
}

/// Whether `SERVING_PICKER_ENVOY_CHECK` asks for a warning instead of a
/// refusal (`warn`); any other value than `warn` or `strict` is reported.
pub fn warn_only(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("strict") => Ok(false),
        Some("warn") => Ok(true),
        Some(other) => Err(format!(
            "serving_picker: {CHECK_VAR}={other:?} is neither \"strict\" nor \"warn\": strict"
        )),
    }
}

/// The running Envoy (`/proc/self/exe`), identified.
pub fn running_envoy() -> Seen {
    match exported_callbacks(Path::new("/proc/self/exe")) {
        Ok(exported) => identify(&exported),
        Err(e) => Seen::Unreadable(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn list(minor: &str) -> BTreeSet<String> {
        let text = match minor {
            "1.38" => include_str!("../abi/envoy-1.38.callbacks"),
            "1.39" => include_str!("../abi/envoy-1.39.callbacks"),
            "1.40" => include_str!("../abi/envoy-1.40.callbacks"),
            other => panic!("no list for {other}"),
        };
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn the_known_fingerprints_are_those_of_the_lists() {
        for release in &KNOWN {
            let names = list(release.minor);
            let (count, fnv) = fingerprint(names.iter().map(String::as_str));
            assert_eq!(
                (count, fnv),
                (release.callbacks, release.callbacks_fnv),
                "Envoy {}: native/abi/envoy-{}.callbacks has {count} names, hash {fnv:#x}",
                release.minor,
                release.minor
            );
            assert_eq!(identify(&names), Seen::Release(release));
            // Every minor exports every callback the module calls.
            assert!(
                IMPORTED.iter().all(|i| names.contains(*i)),
                "{}",
                release.minor
            );
        }
    }

    #[test]
    fn order_and_duplicates_do_not_change_the_fingerprint() {
        assert_eq!(fingerprint(["b", "a", "b"]), fingerprint(["a", "b"]));
        assert_ne!(fingerprint(["a", "b"]), fingerprint(["a", "c"]));
        assert_ne!(fingerprint(["ab"]), fingerprint(["a", "b"]));
    }

    #[test]
    fn a_newer_or_custom_envoy_is_unknown_and_its_gaps_are_named() {
        let mut newer = list("1.40");
        newer.insert(format!("{CALLBACK_PREFIX}lb_something_new"));
        assert_eq!(
            identify(&newer),
            Seen::Unknown {
                callbacks: KNOWN[2].callbacks + 1,
                missing: vec![]
            }
        );
        let mut custom = list("1.40");
        custom.remove("envoy_dynamic_module_callback_log");
        match identify(&custom) {
            Seen::Unknown { missing, .. } => {
                assert_eq!(missing, ["envoy_dynamic_module_callback_log"])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verdicts() {
        let (v38, v40) = (&KNOWN[0], &KNOWN[2]);
        match verdict(&Seen::Release(v40), v40, false) {
            Verdict::Load { message, warning } => {
                assert!(!warning);
                assert!(message.contains("built for Envoy 1.40"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Another release: refused, naming the build to load.
        match verdict(&Seen::Release(v38), v40, false) {
            Verdict::Refuse(m) => {
                assert!(
                    m.contains("built for Envoy 1.40 (dynamic-module ABI v0.2.0)"),
                    "{m}"
                );
                assert!(m.contains("this Envoy is 1.38 (ABI v0.1.0)"), "{m}");
                assert!(m.contains("target/envoy-1.38/libserving_picker.so"), "{m}");
                assert!(m.contains("SERVING_PICKER_ENVOY_CHECK=warn"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        match verdict(&Seen::Release(v40), v38, false) {
            Verdict::Refuse(m) => assert!(m.contains("target/release/libserving_picker.so"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The override: a warning instead.
        assert!(matches!(
            verdict(&Seen::Release(v38), v40, true),
            Verdict::Load { warning: true, .. }
        ));
        let unknown = Seen::Unknown {
            callbacks: 900,
            missing: vec![],
        };
        assert!(matches!(verdict(&unknown, v40, false), Verdict::Refuse(_)));
        assert!(matches!(
            verdict(&unknown, v40, true),
            Verdict::Load { warning: true, .. }
        ));
        assert!(matches!(
            verdict(&Seen::Unreadable("x".into()), v40, false),
            Verdict::Refuse(_)
        ));
        // A missing callback is refused even with the override.
        let lacking = Seen::Unknown {
            callbacks: 10,
            missing: vec!["envoy_dynamic_module_callback_log"],
        };
        match verdict(&lacking, v40, true) {
            Verdict::Refuse(m) => assert!(m.contains("envoy_dynamic_module_callback_log"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_check_variable() {
        assert_eq!(warn_only(None), Ok(false));
        assert_eq!(warn_only(Some("strict")), Ok(false));
        assert_eq!(warn_only(Some("warn")), Ok(true));
        assert!(warn_only(Some("off")).unwrap_err().contains("\"off\""));
    }

    #[test]
    fn an_executable_without_envoy_callbacks_reads_as_empty() {
        // This test binary: a real ELF, no Envoy callbacks defined.
        let exe = std::env::current_exe().unwrap();
        assert!(exported_callbacks(&exe).unwrap().is_empty());
        assert!(exported_callbacks(Path::new("/nonexistent")).is_err());
        let seen = identify(&BTreeSet::new());
        assert!(
            matches!(seen, Seen::Unknown { callbacks: 0, ref missing } if missing.len() == IMPORTED.len())
        );
    }
}
