//! The filter names its build in Envoy's log when Envoy starts a VM of it:
//! the version and the commit (`serving_picker_core::build_info`), the
//! identity the native module's load line and the companion's `--version`
//! carry too. `make test-release` runs it on the wasm file of the image.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use support::*;

const STARTS: &str = "starts in this VM";

/// Every VM of the filter (the main thread's and each worker's) logs
/// `serving_picker: wasm filter 0.1.0 (commit …) starts in this VM` once,
/// when Envoy starts it; requests and refreshes log no more of them.
#[test]
fn each_vm_names_the_filters_version_and_commit() {
    let a = Backend::start("A");
    let envoy = EnvoyBuilder::new()
        .tag("wasm-identity")
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .start();
    expect_routing(&envoy, "/backend/x", &[], "A", picked(&a));
    let want = format!(
        "serving_picker: wasm filter {} {STARTS}",
        expected_build_identity()
    );
    // Envoy flushes its log every second or so.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut lines = envoy.log_lines(STARTS);
    // A VM per worker (--concurrency 2) and the main thread's.
    while lines.len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        lines = envoy.log_lines(STARTS);
    }
    assert!(
        lines.len() >= 3,
        "one line per VM, 3 VMs at least:\n{lines:#?}"
    );
    assert!(
        lines.iter().all(|l| l.ends_with(&want)),
        "every line should end with {want:?}:\n{lines:#?}"
    );
    let started = lines.len();
    for _ in 0..5 {
        assert_batch(&envoy, "/backend/x", &[], 10, "A", picked(&a));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        envoy.log_lines(STARTS).len(),
        started,
        "requests and refreshes start no VM"
    );
}
