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
//! it and a missing one fails that `dlopen`, naming the symbol. Its minor is
//! then read from the executable (Envoy's version number, a string of its
//! `.rodata`): a tested minor (another build) or the next one after the
//! newest tested loads, under upstream's promise that a module built for
//! Envoy 1.N loads in 1.(N+1) (envoyproxy/envoy#43219), with a warning line
//! and the gauge `serving_picker.envoy.untested` at 1. A later minor, or one
//! that cannot be read, is outside that promise and refused unless
//! `SERVING_PICKER_ENVOY_CHECK=any`. Refused (a null answer, which makes
//! Envoy fail the configuration that loads the module: "Failed to initialize
//! dynamic module") are also an Envoy that lacks a callback the module calls
//! (named in the line) or has no load-balancing policy for modules, and,
//! with `SERVING_PICKER_ENVOY_CHECK=strict`, every Envoy that is not a
//! tested release.

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use object::{Object, ObjectSection, ObjectSymbol};

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
    /// `warn`, the default: a tested release loads; another Envoy that
    /// exports every callback the module calls loads with a warning when
    /// its minor is a tested one or the next (upstream's promise), and is
    /// refused beyond.
    Warn,
    /// `strict`: only a tested release loads.
    Strict,
    /// `any`: every Envoy that exports every callback the module calls
    /// loads (with the warning when untested), whatever its minor: the
    /// operator's choice, past upstream's promise.
    Any,
}

/// A `SERVING_PICKER_ENVOY_CHECK` value that names no mode (the value);
/// its text is the line logged, `warn` then applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownCheckMode(pub String);

impl std::fmt::Display for UnknownCheckMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "serving_picker: {CHECK_VAR}={:?} is none of \"warn\", \"strict\", \"any\": warn",
            self.0
        )
    }
}

impl std::error::Error for UnknownCheckMode {}

/// The mode `SERVING_PICKER_ENVOY_CHECK` names (unset or empty: `warn`), or
/// why the value was not understood (then the default applies).
pub fn check_mode(value: Option<&str>) -> Result<CheckMode, UnknownCheckMode> {
    match value {
        None | Some("") | Some("warn") => Ok(CheckMode::Warn),
        Some("strict") => Ok(CheckMode::Strict),
        Some("any") => Ok(CheckMode::Any),
        Some(other) => Err(UnknownCheckMode(other.to_string())),
    }
}

/// The minor of the newest tested release (40 for "1.40").
pub fn newest_minor() -> u32 {
    minor_of(NEWEST.minor).unwrap_or(0)
}

/// The minor of "1.NN".
fn minor_of(version: &str) -> Option<u32> {
    version.strip_prefix("1.")?.parse().ok()
}

/// The first minor with the load-balancing policy for modules: version
/// numbers below it in an executable are other libraries' (c-ares is 1.34).
const FIRST_MINOR: u32 = 38;

/// The Envoy minors named by NUL-terminated version numbers in `bytes`
/// (`\01.40.0\0`, `\01.41.0-dev\0`: how Envoy's `BUILD_VERSION_NUMBER` sits
/// in `.rodata`), from 1.38 on.
pub fn minors_in(bytes: &[u8]) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    let mut at = 0;
    while let Some(i) = bytes
        .get(at..)
        .and_then(|b| b.windows(3).position(|w| w == b"\x001."))
    {
        let start = at + i + 3;
        at = start;
        if let Some(minor) = version_at(bytes.get(start..).unwrap_or_default()) {
            if minor >= FIRST_MINOR {
                out.insert(minor);
            }
        }
    }
    out
}

/// `MINOR.PATCH[-dev]\0` at the start of `rest`: the minor.
fn version_at(rest: &[u8]) -> Option<u32> {
    let digits = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_digit()).count();
    let m = digits(rest);
    if m == 0 || m > 3 || rest.get(m) != Some(&b'.') {
        return None;
    }
    let p = digits(rest.get(m + 1..)?);
    if p == 0 || p > 3 {
        return None;
    }
    let mut end = m + 1 + p;
    if rest.get(end..end + 4) == Some(b"-dev") {
        end += 4;
    }
    if rest.get(end) != Some(&0) {
        return None;
    }
    std::str::from_utf8(rest.get(..m)?).ok()?.parse().ok()
}

/// The one Envoy minor `minors` names; `None` when there is none, or more
/// than one (another library's version number beside Envoy's).
pub fn one_minor(minors: &BTreeSet<u32>) -> Option<u32> {
    match minors.len() {
        1 => minors.iter().next().copied(),
        _ => None,
    }
}

/// Why an executable could not be read (its symbols, its version numbers).
#[derive(Debug)]
pub enum ExecutableError {
    /// Opening (`what`: "open") or reading ("read") it failed.
    Io {
        /// "open" or "read".
        what: &'static str,
        /// The executable.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Not an object file this reads.
    Parse {
        /// The executable.
        path: PathBuf,
        /// Why it does not parse.
        source: object::Error,
    },
    /// No `.rodata` section.
    NoRodata(PathBuf),
}

impl std::fmt::Display for ExecutableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecutableError::Io { what, path, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
            ExecutableError::Parse { path, source } => {
                write!(f, "cannot parse {}: {source}", path.display())
            }
            ExecutableError::NoRodata(path) => write!(f, "{} has no .rodata", path.display()),
        }
    }
}

impl std::error::Error for ExecutableError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExecutableError::Io { source, .. } => Some(source),
            ExecutableError::Parse { source, .. } => Some(source),
            ExecutableError::NoRodata(_) => None,
        }
    }
}

/// The Envoy minors an executable's `.rodata` names ([`minors_in`]), read
/// in chunks of 1 MiB (Envoy's is about 10 MB).
pub fn envoy_minors(executable: &Path) -> Result<BTreeSet<u32>, ExecutableError> {
    envoy_minors_in_chunks(executable, 1 << 20)
}

fn envoy_minors_in_chunks(
    executable: &Path,
    chunk: usize,
) -> Result<BTreeSet<u32>, ExecutableError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |what| {
        move |source| ExecutableError::Io {
            what,
            path: executable.to_path_buf(),
            source,
        }
    };
    let file = std::fs::File::open(executable).map_err(io("open"))?;
    let (offset, size) = {
        let cache = object::ReadCache::new(&file);
        let elf = object::File::parse(&cache).map_err(|source| ExecutableError::Parse {
            path: executable.to_path_buf(),
            source,
        })?;
        elf.section_by_name(".rodata")
            .and_then(|s| s.file_range())
            .ok_or_else(|| ExecutableError::NoRodata(executable.to_path_buf()))?
    };
    let mut file = file;
    file.seek(SeekFrom::Start(offset)).map_err(io("read"))?;
    let mut section = file.take(size);
    let mut out = BTreeSet::new();
    // A version number across two chunks is read whole: each chunk starts
    // with the last bytes of the one before.
    const OVERLAP: usize = 16;
    let mut buf = vec![0u8; chunk.max(OVERLAP) + OVERLAP];
    let mut kept = 0;
    loop {
        let n = section
            .read(buf.get_mut(kept..).unwrap_or_default())
            .map_err(io("read"))?;
        if n == 0 {
            break;
        }
        let filled = kept + n;
        out.extend(minors_in(buf.get(..filled).unwrap_or_default()));
        kept = filled.min(OVERLAP);
        buf.copy_within(filled - kept..filled, 0);
    }
    Ok(out)
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
    /// callbacks it exports, whether any is the load-balancing policy's,
    /// which of the module's imports it lacks, and its minor.
    Unknown {
        /// How many callbacks it exports.
        callbacks: usize,
        /// Its minor (41 for 1.41), read from the executable; `None` when
        /// that could not be read or was not one number.
        minor: Option<u32>,
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
        minor: None,
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
pub fn exported_callbacks(executable: &Path) -> Result<BTreeSet<String>, ExecutableError> {
    let file = std::fs::File::open(executable).map_err(|source| ExecutableError::Io {
        what: "open",
        path: executable.to_path_buf(),
        source,
    })?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|source| ExecutableError::Parse {
        path: executable.to_path_buf(),
        source,
    })?;
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
    let newest = newest_minor();
    let untested = |what: String, minor: Option<u32>| {
        let promised = minor.is_some_and(|m| m <= newest + 1);
        if mode == CheckMode::Strict {
            Verdict::Refuse(format!(
                "{this} refuses to load: {what}; {CHECK_VAR}=strict loads it only into a tested release: {}",
                tested_list()
            ))
        } else if mode == CheckMode::Warn && !promised {
            let which = match minor {
                Some(m) => format!("this Envoy is 1.{m}"),
                None => "this Envoy's minor cannot be read from its executable".into(),
            };
            Verdict::Refuse(format!(
                "{this} refuses to load: {what}; {which}, and upstream promises only that a module for \
                 Envoy 1.N loads in 1.(N+1): tested through {}, so through 1.{}. Tested: {}; \
                 {CHECK_VAR}=any loads it into any Envoy that has every callback it calls",
                NEWEST.minor,
                newest + 1,
                tested_list()
            ))
        } else {
            let why = if promised {
                "upstream promises that a module for Envoy 1.N loads in 1.(N+1)".to_string()
            } else {
                format!("past upstream's promise (1.N loads in 1.(N+1)), as {CHECK_VAR}=any asks")
            };
            Verdict::Load {
                abi_version: NEWEST.abi_version,
                tested: false,
                message: format!(
                    "{this} loads into an Envoy it is not tested with: {what}. Every callback it calls is there; \
                     {why}. It answers ABI {} (Envoy {}'s). \
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
        Seen::Unknown {
            callbacks, minor, ..
        } => untested(
            format!(
                "its {callbacks} callbacks are none of the tested releases' sets (a later release or another build{})",
                match minor {
                    Some(m) => format!("; its version number says 1.{m}"),
                    None => String::new(),
                }
            ),
            *minor,
        ),
        Seen::Unreadable(why) => untested(
            format!("the running Envoy could not be identified ({why})"),
            None,
        ),
    }
}

/// The running Envoy (`/proc/self/exe`), identified; for a callback set no
/// tested release has, its minor is read from the executable.
pub fn running_envoy() -> Seen {
    let exe = Path::new("/proc/self/exe");
    match exported_callbacks(exe) {
        Ok(exported) => match identify(&exported) {
            Seen::Unknown {
                callbacks,
                minor: _,
                lb_policy,
                missing,
            } => Seen::Unknown {
                callbacks,
                minor: envoy_minors(exe).ok().as_ref().and_then(one_minor),
                lb_policy,
                missing,
            },
            seen => seen,
        },
        Err(e) => Seen::Unreadable(e.to_string()),
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
                minor: None,
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

    fn other_set(minor: Option<u32>) -> Seen {
        Seen::Unknown {
            callbacks: 900,
            minor,
            lb_policy: true,
            missing: vec![],
        }
    }

    #[test]
    fn another_envoy_with_every_callback_loads_with_a_warning_unless_strict() {
        let later = other_set(Some(41));
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
        assert!(m.contains("its version number says 1.41"), "{m}");
        assert!(
            m.contains("upstream promises that a module for Envoy 1.N loads in 1.(N+1)"),
            "{m}"
        );
        let m = refused(verdict(&later, CheckMode::Strict, "0.1.0"));
        assert!(m.contains("SERVING_PICKER_ENVOY_CHECK=strict"), "{m}");
        // `any` loads it too; a tested minor's other build loads in warn.
        assert!(!loaded(verdict(&later, CheckMode::Any, "0.1.0")).1);
        for minor in [38, 39, 40] {
            let (abi, tested, _) = loaded(verdict(&other_set(Some(minor)), CheckMode::Warn, "0"));
            assert_eq!((abi, tested), (NEWEST.abi_version, false), "1.{minor}");
        }
        // Unreadable: loads only with `any` (reaching program_init proves
        // that every callback resolved, the module being linked with -z now,
        // but not that upstream's promise covers this Envoy).
        let unreadable = Seen::Unreadable("x".into());
        assert!(refused(verdict(&unreadable, CheckMode::Warn, "0.1.0")).contains("cannot be read"));
        assert!(!loaded(verdict(&unreadable, CheckMode::Any, "0.1.0")).1);
        assert!(refused(verdict(&unreadable, CheckMode::Strict, "0.1.0")).contains("(x)"));
    }

    #[test]
    fn past_the_next_minor_only_any_loads_it() {
        assert_eq!(newest_minor(), 40);
        for seen in [other_set(Some(42)), other_set(Some(50)), other_set(None)] {
            let m = refused(verdict(&seen, CheckMode::Warn, "0.1.0"));
            assert!(
                m.contains("upstream promises only that a module for Envoy 1.N loads in 1.(N+1): tested through 1.40, so through 1.41"),
                "{m}"
            );
            assert!(m.contains("SERVING_PICKER_ENVOY_CHECK=any loads it"), "{m}");
            let (abi, tested, m) = loaded(verdict(&seen, CheckMode::Any, "0.1.0"));
            assert_eq!(abi, NEWEST.abi_version);
            assert!(!tested);
            assert!(m.contains("past upstream's promise"), "{m}");
            assert!(m.contains(UNTESTED_GAUGE), "{m}");
            assert!(refused(verdict(&seen, CheckMode::Strict, "0.1.0")).contains("=strict"));
        }
        assert!(refused(verdict(&other_set(Some(42)), CheckMode::Warn, "0"))
            .contains("this Envoy is 1.42"));
        // A tested release loads in every mode, `any` included.
        assert!(loaded(verdict(&Seen::Release(NEWEST), CheckMode::Any, "0")).1);
    }

    #[test]
    fn the_minor_is_read_from_the_version_number_in_rodata() {
        let rodata = b"name\x001.40.0\x00 so a non-default value\x00";
        assert_eq!(minors_in(rodata), BTreeSet::from([40]));
        assert_eq!(minors_in(b"x\x001.41.0-dev\x00y"), BTreeSet::from([41]));
        assert_eq!(minors_in(b"\x001.38.2\x00"), BTreeSet::from([38]));
        // Not version numbers, or other libraries' (below 1.38).
        for bytes in [
            &b"\x001.40.0x\x00"[..],
            b"\x001.40\x00",
            b"a1.40.0\x00",
            b"\x001.40.0",
            b"\x001..0\x00",
            b"\x001.34.5\x00",
            b"\x001.4000.0\x00",
        ] {
            assert!(minors_in(bytes).is_empty(), "{bytes:?}");
        }
        // One number is the minor; none or two are unknown.
        assert_eq!(one_minor(&BTreeSet::from([41])), Some(41));
        assert_eq!(one_minor(&BTreeSet::new()), None);
        assert_eq!(one_minor(&BTreeSet::from([40, 64])), None);
    }

    #[test]
    fn the_minor_is_read_across_chunk_boundaries_of_an_executable() {
        // An ELF with a .rodata holding a version number across a chunk
        // boundary: this test binary's own file, patched in a copy, read in
        // chunks of 64 bytes.
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let elf = object::File::parse(&*bytes).unwrap();
        let (offset, size) = elf
            .section_by_name(".rodata")
            .and_then(|s| s.file_range())
            .unwrap();
        let before = envoy_minors(&exe).unwrap();
        let mut patched = bytes.clone();
        assert!(size > 256);
        let at = offset as usize + 128 - 5;
        patched[at..at + 11].copy_from_slice(b"\x001.47.3-dev");
        patched[at + 11] = 0;
        let path = std::env::temp_dir().join(format!("sp-rodata-{}", std::process::id()));
        std::fs::write(&path, &patched).unwrap();
        let after = envoy_minors_in_chunks(&path, 64).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(!before.contains(&47), "{before:?}");
        assert!(after.contains(&47), "{after:?}");
        assert!(envoy_minors(Path::new("/nonexistent")).is_err());
    }

    #[test]
    fn an_envoy_lacking_a_callback_or_the_policy_is_refused_in_every_mode() {
        for mode in [CheckMode::Warn, CheckMode::Strict] {
            let lacking = Seen::Unknown {
                callbacks: 10,
                minor: Some(40),
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
                minor: Some(40),
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
        assert_eq!(check_mode(Some("any")), Ok(CheckMode::Any));
        assert!(check_mode(Some("off"))
            .unwrap_err()
            .to_string()
            .contains("\"off\""));
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
            matches!(seen, Seen::Unknown { callbacks: 0, lb_policy: false, ref missing, .. } if missing.len() == IMPORTED.len())
        );
    }
}
