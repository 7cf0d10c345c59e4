//! Which Envoy loads the module, and whether it may.
//!
//! One build serves every Envoy minor with the dynamic-module load-balancing
//! policy (1.38, 1.39, 1.40: docs/compatibility.md). Envoy itself only
//! compares the ABI version string `program_init` returns and logs a warning
//! on a mismatch, then loads the module anyway. So `program_init` identifies
//! the running Envoy by the set of `envoy_dynamic_module_callback_*` symbols
//! its executable exports (identical across the patch releases of a minor,
//! different for every minor) and answers that release's own ABI version
//! string.
//!
//! An Envoy whose callback set is none of the tested releases' (a later
//! minor, or another build of a supported one) still exports every callback
//! the module calls when it gets this far: the module is linked with
//! `-z now`, so the dynamic linker resolves every callback when Envoy opens
//! it and a missing one fails that `dlopen`, naming the symbol. It loads,
//! under upstream's promise that a module built for Envoy 1.N loads in
//! 1.(N+1) (envoyproxy/envoy#43219), with a warning line and the gauge
//! `serving_picker.envoy.untested` at 1. Refused (a null answer, which makes
//! Envoy fail the configuration that loads the module: "Failed to initialize
//! dynamic module") are only an Envoy that lacks a callback the module calls
//! (named in the line) or has no load-balancing policy for modules, and, with
//! `SERVING_PICKER_ENVOY_CHECK=strict`, every Envoy that is not a tested
//! release.

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use object::{Object, ObjectSymbol};

/// One Envoy minor the module is tested with.
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

/// Every Envoy minor with the dynamic-module load-balancing policy, oldest
/// first: the releases the module is tested with.
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

/// The newest tested release: the ABI version answered to any other Envoy.
pub const NEWEST: &EnvoyRelease = &KNOWN[KNOWN.len() - 1];

/// The prefix of every callback Envoy exports to dynamic modules.
pub const CALLBACK_PREFIX: &str = "envoy_dynamic_module_callback_";
/// Every callback of the load-balancing policy for modules starts so.
pub const LB_CALLBACK_PREFIX: &str = "envoy_dynamic_module_callback_lb_";

/// The callbacks the module calls: abi.rs's declarations (tests/e2e/native/abi.rs
/// checks that the .so imports exactly these).
pub const IMPORTED: [&str; 33] = [
    "envoy_dynamic_module_callback_http_filter_config_define_counter",
    "envoy_dynamic_module_callback_http_filter_config_define_gauge",
    "envoy_dynamic_module_callback_http_filter_get_attribute_string",
    "envoy_dynamic_module_callback_http_filter_increment_counter",
    "envoy_dynamic_module_callback_http_filter_reset_stream",
    "envoy_dynamic_module_callback_http_filter_scheduler_commit",
    "envoy_dynamic_module_callback_http_filter_scheduler_delete",
    "envoy_dynamic_module_callback_http_filter_scheduler_new",
    "envoy_dynamic_module_callback_http_filter_set_gauge",
    "envoy_dynamic_module_callback_http_get_cluster_name",
    "envoy_dynamic_module_callback_http_get_header",
    "envoy_dynamic_module_callback_http_send_response_trailers",
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

/// The variable that chooses which Envoys the module loads into.
pub const CHECK_VAR: &str = "SERVING_PICKER_ENVOY_CHECK";

/// The gauge (`dynamicmodulescustom.serving_picker.envoy.untested` in
/// /stats), defined by every configuration: 1 when the running Envoy is not
/// a tested release, 0 when it is.
pub const UNTESTED_GAUGE: &str = "serving_picker.envoy.untested";

/// What `SERVING_PICKER_ENVOY_CHECK` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckMode {
    /// `warn`, the default: a tested release loads; any other Envoy that
    /// exports every callback the module calls loads with a warning.
    Warn,
    /// `strict`: only a tested release loads.
    Strict,
}

/// The mode `SERVING_PICKER_ENVOY_CHECK` names (unset or empty: `warn`), or
/// the default and a line saying the value was not understood.
pub fn check_mode(value: Option<&str>) -> Result<CheckMode, String> {
    match value {
        None | Some("") | Some("warn") => Ok(CheckMode::Warn),
        Some("strict") => Ok(CheckMode::Strict),
        Some(other) => Err(format!(
            "serving_picker: {CHECK_VAR}={other:?} is neither \"warn\" nor \"strict\": warn"
        )),
    }
}

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
    /// Not a tested release (a later one, or another build): how many
    /// callbacks it exports, whether any is the load-balancing policy's, and
    /// which of the module's imports it lacks.
    Unknown {
        /// How many callbacks it exports.
        callbacks: usize,
        /// Whether one of them is a load-balancing policy callback.
        lb_policy: bool,
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
        lb_policy: exported.iter().any(|n| n.starts_with(LB_CALLBACK_PREFIX)),
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
    /// Load, answering Envoy with `abi_version`.
    Load {
        /// The ABI version string to answer Envoy.
        abi_version: &'static CStr,
        /// Whether the Envoy is a tested release (else: a warning line and
        /// the gauge).
        tested: bool,
        /// The line to log.
        message: String,
    },
    /// Refuse, and the line that says why.
    Refuse(String),
}

fn tested_list() -> String {
    KNOWN
        .iter()
        .map(|r| format!("{} ({} callbacks)", r.minor, r.callbacks))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The decision for the Envoy `seen`, in `mode`; `build` names the module
/// (its version and commit: `build_identity!`) in the line.
pub fn verdict(seen: &Seen, mode: CheckMode, build: &str) -> Verdict {
    let this = format!("serving_picker {build}");
    let abi = |r: &EnvoyRelease| r.abi_version.to_string_lossy().into_owned();
    let untested = |what: String| {
        if mode == CheckMode::Strict {
            Verdict::Refuse(format!(
                "{this} refuses to load: {what}; {CHECK_VAR}=strict loads it only into a tested release: {}",
                tested_list()
            ))
        } else {
            Verdict::Load {
                abi_version: NEWEST.abi_version,
                tested: false,
                message: format!(
                    "{this} loads into an Envoy it is not tested with: {what}. Every callback it calls is there; \
                     upstream promises that a module for Envoy 1.N loads in 1.(N+1). It answers ABI {} (Envoy {}'s). \
                     Tested: {}; gauge {UNTESTED_GAUGE} = 1 ({CHECK_VAR}=strict refuses such an Envoy)",
                    abi(NEWEST),
                    NEWEST.minor,
                    tested_list()
                ),
            }
        }
    };
    match seen {
        Seen::Release(r) => Verdict::Load {
            abi_version: r.abi_version,
            tested: true,
            message: format!(
                "{this} loads into Envoy {}, a tested release (dynamic-module ABI {})",
                r.minor,
                abi(r)
            ),
        },
        Seen::Unknown {
            lb_policy: false, ..
        } => Verdict::Refuse(format!(
            "{this} refuses to load: this Envoy has no load-balancing policy for dynamic modules \
             (no {LB_CALLBACK_PREFIX}* callback; Envoy 1.38 and later have it)"
        )),
        Seen::Unknown { missing, .. } if !missing.is_empty() => Verdict::Refuse(format!(
            "{this} refuses to load: this Envoy does not export callbacks the module calls: {}",
            missing.join(", ")
        )),
        Seen::Unknown { callbacks, .. } => untested(format!(
            "its {callbacks} callbacks are none of the tested releases' sets (a later release or another build)"
        )),
        Seen::Unreadable(why) => untested(format!(
            "the running Envoy could not be identified ({why})"
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

/// Whether program_init loaded the module into an Envoy that is not a
/// tested release (what the gauge says).
static UNTESTED: AtomicBool = AtomicBool::new(false);

/// Records whether the running Envoy is untested (program_init).
pub fn set_untested(untested: bool) {
    UNTESTED.store(untested, Ordering::Relaxed);
}

/// Whether the running Envoy is untested (the gauge's value).
pub fn untested() -> bool {
    UNTESTED.load(Ordering::Relaxed)
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
                lb_policy: true,
                missing: vec![]
            }
        );
        let mut custom = list("1.40");
        custom.remove("envoy_dynamic_module_callback_log");
        match identify(&custom) {
            Seen::Unknown {
                missing, lb_policy, ..
            } => {
                assert!(lb_policy);
                assert_eq!(missing, ["envoy_dynamic_module_callback_log"])
            }
            other => panic!("{other:?}"),
        }
        // 1.37: dynamic modules, but no load-balancing policy for them.
        let no_lb: BTreeSet<String> = list("1.38")
            .into_iter()
            .filter(|n| !n.starts_with(LB_CALLBACK_PREFIX))
            .collect();
        assert!(matches!(
            identify(&no_lb),
            Seen::Unknown {
                lb_policy: false,
                ..
            }
        ));
    }

    fn loaded(v: Verdict) -> (&'static CStr, bool, String) {
        match v {
            Verdict::Load {
                abi_version,
                tested,
                message,
            } => (abi_version, tested, message),
            Verdict::Refuse(m) => panic!("refused: {m}"),
        }
    }

    fn refused(v: Verdict) -> String {
        match v {
            Verdict::Refuse(m) => m,
            other => panic!("loaded: {other:?}"),
        }
    }

    #[test]
    fn every_tested_release_loads_with_its_own_abi_version() {
        for mode in [CheckMode::Warn, CheckMode::Strict] {
            for r in &KNOWN {
                let (abi, tested, m) = loaded(verdict(&Seen::Release(r), mode, "0.1.0"));
                assert_eq!(abi, r.abi_version);
                assert!(tested);
                assert!(
                    m.contains(&format!(
                        "serving_picker 0.1.0 loads into Envoy {}, a tested release (dynamic-module ABI {})",
                        r.minor,
                        r.abi_version.to_string_lossy()
                    )),
                    "{m}"
                );
            }
        }
        assert_eq!(KNOWN[0].abi_version, c"v0.1.0");
        assert_eq!(KNOWN[1].abi_version, c"v0.1.0");
        assert_eq!(KNOWN[2].abi_version, c"v0.2.0");
    }

    #[test]
    fn another_envoy_with_every_callback_loads_with_a_warning_unless_strict() {
        let later = Seen::Unknown {
            callbacks: 900,
            lb_policy: true,
            missing: vec![],
        };
        let (abi, tested, m) = loaded(verdict(&later, CheckMode::Warn, "0.1.0"));
        assert_eq!(abi, NEWEST.abi_version);
        assert!(!tested);
        assert!(
            m.contains("its 900 callbacks are none of the tested releases"),
            "{m}"
        );
        assert!(
            m.contains("1.38 (521 callbacks), 1.39 (607 callbacks), 1.40 (781 callbacks)"),
            "{m}"
        );
        assert!(m.contains(UNTESTED_GAUGE), "{m}");
        let m = refused(verdict(&later, CheckMode::Strict, "0.1.0"));
        assert!(m.contains("SERVING_PICKER_ENVOY_CHECK=strict"), "{m}");
        // Unreadable: the same (reaching program_init proves that every
        // callback resolved, the module being linked with -z now).
        let unreadable = Seen::Unreadable("x".into());
        assert!(!loaded(verdict(&unreadable, CheckMode::Warn, "0.1.0")).1);
        assert!(refused(verdict(&unreadable, CheckMode::Strict, "0.1.0")).contains("(x)"));
    }

    #[test]
    fn an_envoy_lacking_a_callback_or_the_policy_is_refused_in_every_mode() {
        for mode in [CheckMode::Warn, CheckMode::Strict] {
            let lacking = Seen::Unknown {
                callbacks: 10,
                lb_policy: true,
                missing: vec!["envoy_dynamic_module_callback_log"],
            };
            let m = refused(verdict(&lacking, mode, "0.1.0"));
            assert!(
                m.contains(
                    "does not export callbacks the module calls: envoy_dynamic_module_callback_log"
                ),
                "{m}"
            );
            let no_lb = Seen::Unknown {
                callbacks: 10,
                lb_policy: false,
                missing: vec!["envoy_dynamic_module_callback_lb_get_hosts_count"],
            };
            let m = refused(verdict(&no_lb, mode, "0.1.0"));
            assert!(
                m.contains("no load-balancing policy for dynamic modules"),
                "{m}"
            );
        }
    }

    #[test]
    fn the_check_variable() {
        assert_eq!(check_mode(None), Ok(CheckMode::Warn));
        assert_eq!(check_mode(Some("")), Ok(CheckMode::Warn));
        assert_eq!(check_mode(Some("warn")), Ok(CheckMode::Warn));
        assert_eq!(check_mode(Some("strict")), Ok(CheckMode::Strict));
        assert!(check_mode(Some("off")).unwrap_err().contains("\"off\""));
    }

    #[test]
    fn the_untested_flag() {
        set_untested(true);
        assert!(untested());
        set_untested(false);
        assert!(!untested());
    }

    #[test]
    fn an_executable_without_envoy_callbacks_reads_as_empty() {
        // This test binary: a real ELF, no Envoy callbacks defined.
        let exe = std::env::current_exe().unwrap();
        assert!(exported_callbacks(&exe).unwrap().is_empty());
        assert!(exported_callbacks(Path::new("/nonexistent")).is_err());
        let seen = identify(&BTreeSet::new());
        assert!(
            matches!(seen, Seen::Unknown { callbacks: 0, lb_policy: false, ref missing } if missing.len() == IMPORTED.len())
        );
    }
}
