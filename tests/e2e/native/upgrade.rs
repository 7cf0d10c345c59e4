//! An Envoy upgrade with the one native module: an Envoy with a module
//! cluster is restarted in turn as each Envoy of
//! `SERVING_PICKER_UPGRADE_ENVOYS` (space-separated executables, oldest
//! first: 1.38.x, 1.39.x, 1.40.0 from `make test-compat-quick`), with the
//! same .so and the same configuration, under a steady load. Beside it, a
//! plain Envoy (round robin, no module) is restarted the same way under the
//! same load. Every failed request of either is one sent while that Envoy was
//! restarting (from its SIGTERM to the new one's /ready); after each restart
//! the module Envoy says which tested release it loaded into and serves
//! through the module. The figures (failed requests and restart gaps, per
//! restart, module beside plain) are printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use support::envoy::envoy_release_of;
use support::load::{Load, LoadConfig, LoadReport};
use support::ports::free_port;
use support::{Backend, Endpoint, Envoy, EnvoyBuilder, Form};

pub const ENVOYS_VAR: &str = "SERVING_PICKER_UPGRADE_ENVOYS";
const CLUSTER: &str = "backend";
/// How long each Envoy serves between restarts.
const STEADY: Duration = Duration::from_millis(2000);
/// A request sent this long before a SIGTERM may still be in flight when
/// Envoy exits: it belongs to the restart.
const IN_FLIGHT: Duration = Duration::from_millis(100);

fn envoys() -> Vec<PathBuf> {
    let list = std::env::var(ENVOYS_VAR).unwrap_or_else(|_| {
        panic!("{ENVOYS_VAR} is not set: the Envoy executables to restart through, oldest first (make test-compat-quick sets it)")
    });
    let envoys: Vec<PathBuf> = list.split_whitespace().map(PathBuf::from).collect();
    assert!(
        envoys.len() >= 2,
        "{ENVOYS_VAR}={list:?}: two Envoys at least"
    );
    for e in &envoys {
        assert!(e.is_file(), "{ENVOYS_VAR}: no Envoy at {}", e.display());
    }
    envoys
}

/// One Envoy's run: when each of its processes was stopped and when the
/// next one answered /ready.
struct Restarts {
    /// (release, SIGTERM to the old one, /ready of the new one), from the
    /// start of the load.
    windows: Vec<(String, Duration, Duration)>,
}

fn module_envoy(bin: &std::path::Path, port: u16, endpoints: &[Endpoint]) -> Envoy {
    EnvoyBuilder::new()
        .form(Form::Native)
        .tag("upgrade-module")
        .binary(bin)
        .listen_port(port)
        .eds_cluster(CLUSTER, endpoints)
        .start()
}

fn plain_envoy(bin: &std::path::Path, port: u16, endpoints: &[Endpoint]) -> Envoy {
    EnvoyBuilder::new()
        .with_filter(None)
        .tag("upgrade-plain")
        .binary(bin)
        .listen_port(port)
        .eds_cluster(CLUSTER, endpoints)
        // Envoy's default: round robin.
        .bootstrap_hook(|b, _| {
            for c in b["static_resources"]["clusters"].as_array_mut().unwrap() {
                if let Some(c) = c.as_object_mut() {
                    c.remove("load_balancing_policy");
                }
            }
        })
        .start()
}

/// The module Envoy loaded the module into `release`'s minor, a tested
/// release, and picks through it.
fn check_module_envoy(envoy: &Envoy, release: &str) {
    let minor = release.rsplit_once('.').unwrap().0;
    let wanted = format!("loads into Envoy {minor}, a tested release");
    // The log is flushed every 100 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while envoy.log_lines(&wanted).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !envoy.log_lines(&wanted).is_empty(),
        "Envoy {release}: no line {wanted:?} in {}",
        envoy.log_path().display()
    );
    let picks = envoy.stat_or_zero("serving_picker.pick.ready");
    assert!(
        picks > 0,
        "Envoy {release}: the module picked nothing: {:?}",
        envoy.stats_matching("serving_picker")
    );
}

/// Every failure of `report` was sent during one of the restarts; the
/// failures per restart (the one whose window holds it).
fn failures_per_restart(what: &str, report: &LoadReport, restarts: &Restarts) -> Vec<usize> {
    let mut per = vec![0; restarts.windows.len()];
    let mut outside = Vec::new();
    for r in report.records.iter().filter(|r| r.failed()) {
        match restarts
            .windows
            .iter()
            .position(|(_, stop, ready)| r.sent + IN_FLIGHT >= *stop && r.sent <= *ready)
        {
            Some(i) => per[i] += 1,
            None => outside.push(r),
        }
    }
    assert!(
        outside.is_empty(),
        "{what}: {} requests failed outside the restarts ({:?}); first: {:?}\n{}",
        outside.len(),
        restarts
            .windows
            .iter()
            .map(|(v, s, r)| format!("{v}: {s:?}..{r:?}"))
            .collect::<Vec<_>>(),
        outside.first(),
        report.phase_table(what)
    );
    per
}

#[test]
fn upgrade_restarts_through_every_envoy_with_the_same_module() {
    let bins = envoys();
    let releases: Vec<String> = bins.iter().map(|b| envoy_release_of(b)).collect();
    let a = Backend::start("A");
    let b = Backend::start("B");
    let endpoints = [Endpoint::serving(a.addr()), Endpoint::serving(b.addr())];
    let (module_port, plain_port) = (free_port(), free_port());
    let mut module = module_envoy(&bins[0], module_port, &endpoints);
    let mut plain = plain_envoy(&bins[0], plain_port, &endpoints);

    // Two paced clients on each, 100 requests/s each, 1 s at most per request.
    let config = LoadConfig {
        timeout: Duration::from_secs(1),
        ..LoadConfig::paced(2, 100.0, "/")
    };
    let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let module_load = Load::start(at(module_port), config.clone(), &releases[0]);
    let plain_load = Load::start(at(plain_port), config, &releases[0]);
    let mut module_restarts = Restarts {
        windows: Vec::new(),
    };
    let mut plain_restarts = Restarts {
        windows: Vec::new(),
    };
    std::thread::sleep(STEADY);
    check_module_envoy(&module, &releases[0]);
    for (bin, release) in bins.iter().zip(&releases).skip(1) {
        module_load.phase(&format!("restart as {release}"));
        plain_load.phase(&format!("restart as {release}"));
        // The module Envoy, then the plain one: their gaps do not overlap.
        let stop = module_load.now();
        let status = module.terminate();
        drop(module);
        module = module_envoy(bin, module_port, &endpoints);
        module_restarts
            .windows
            .push((release.clone(), stop, module_load.now()));
        let stop = plain_load.now();
        plain.terminate();
        drop(plain);
        plain = plain_envoy(bin, plain_port, &endpoints);
        plain_restarts
            .windows
            .push((release.clone(), stop, plain_load.now()));
        assert!(
            status.is_some_and(|s| s.success()),
            "the module Envoy before {release} exited with {status:?}"
        );
        std::thread::sleep(STEADY);
        check_module_envoy(&module, release);
    }
    let module_report = module_load.finish();
    let plain_report = plain_load.finish();
    println!("{}", module_report.phase_table("module Envoy (one .so)"));
    println!("{}", plain_report.phase_table("plain Envoy (round robin)"));

    let module_failed = failures_per_restart("module Envoy", &module_report, &module_restarts);
    let plain_failed = failures_per_restart("plain Envoy", &plain_report, &plain_restarts);
    println!("upgrade run: failed requests and restart gap (SIGTERM to /ready), module Envoy beside plain Envoy, 2 clients x 100 requests/s each");
    println!(
        "{:<24} {:>14} {:>12} {:>14} {:>12}",
        "restart", "module failed", "module gap", "plain failed", "plain gap"
    );
    for (i, (release, stop, ready)) in module_restarts.windows.iter().enumerate() {
        let (_, pstop, pready) = &plain_restarts.windows[i];
        println!(
            "{:<24} {:>14} {:>9} ms {:>14} {:>9} ms",
            format!("{} -> {release}", releases[i]),
            module_failed[i],
            (*ready - *stop).as_millis(),
            plain_failed[i],
            (*pready - *pstop).as_millis()
        );
    }
    println!(
        "upgrade run totals: module Envoy {} of {} requests failed, plain Envoy {} of {}",
        module_report.failures(),
        module_report.requests(),
        plain_report.failures(),
        plain_report.requests()
    );
    // Both Envoys served between the restarts, through both backends.
    for (what, report) in [("module", &module_report), ("plain", &plain_report)] {
        for backend in ["A", "B"] {
            assert!(
                report.records.iter().any(|r| r.backend() == Some(backend)),
                "{what} Envoy: nothing served by {backend}"
            );
        }
    }
}
