//! Host metadata replaced while the module reads it: Envoy 1.40 with four
//! workers under load, the EDS file renamed into place in a loop for about
//! 20 s (`METADATA_CHURN_SECONDS`), every version replacing both hosts'
//! metadata (zone, node, hints change) while their conditions stay: A
//! serving, B not. Each version makes Envoy replace the metadata of the
//! hosts in place on its main thread, where the module's main-thread
//! instance reads it and publishes a copy that the four workers' instances
//! build from (docs/native.md, "Host metadata and Envoy's threads"). Envoy
//! must stay up, every response must come from A, Envoy's log must hold no
//! crash, and no worker may read metadata through Envoy during the churn.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use support::load::{Load, LoadConfig};
use support::*;

const PATH: &str = "/backend/x";

fn endpoints(a: &Backend, b: &Backend, v: u64) -> Vec<Endpoint> {
    let zone = format!("zone-{}", v % 7);
    let node = format!("node-{v}");
    vec![
        Endpoint::serving(a.addr())
            .zone(&zone)
            .node_name(&node)
            .hints(&zone, &node),
        Endpoint::not_serving(b.addr())
            .zone(&zone)
            .node_name(&node)
            .hints(&zone, &node),
    ]
}

#[test]
fn metadata_replaced_under_load_on_four_workers_never_routes_to_a_not_serving_host() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .form(Form::Native)
        .tag("native-metadata-churn")
        .arg("--concurrency")
        .arg("4")
        .eds_cluster("backend", &endpoints(&a, &b, 0))
        .start();
    expect_routing(&envoy, PATH, &[], "A picked", picked(&a));
    let rebuilds_before = envoy.stat_or_zero("serving_picker.rebuilds");
    let copies_before = envoy.stat_or_zero("serving_picker.metadata.copies");
    let worker_reads_before = envoy.stat_or_zero("serving_picker.metadata.read_by_worker");
    let seconds = std::env::var("METADATA_CHURN_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig::paced(8, 100.0, PATH),
        "churn",
    );
    let start = Instant::now();
    let mut versions = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        versions += 1;
        envoy.set_endpoints("backend", &endpoints(&a, &b, versions));
        std::thread::sleep(Duration::from_millis(2));
    }
    // The last version reaches Envoy, then the load stops.
    std::thread::sleep(Duration::from_millis(500));
    let report = load.finish();
    let total = report.total("churn");
    println!(
        "metadata churn: {versions} EDS versions in {seconds} s, {} requests, by backend {:?}, failures {:?}",
        total.requests, total.by_backend, total.failure_reasons
    );
    // Envoy is up and answering.
    let ready = envoy.admin_get("/ready");
    assert_eq!(ready.status, 200, "Envoy not ready: {}", ready.summary());
    let log = std::fs::read_to_string(envoy.log_path()).unwrap_or_default();
    for crash in [
        "Caught Segmentation fault",
        "Caught Aborted",
        "Backtrace",
        "AddressSanitizer",
    ] {
        assert!(!log.contains(crash), "Envoy's log holds {crash:?}");
    }
    // Every response came from the serving host.
    assert!(
        total.requests > 1000,
        "too few requests: {}",
        total.requests
    );
    assert_eq!(
        total.by_backend.get("B").copied().unwrap_or(0),
        0,
        "not-serving B answered: {:?}",
        total.by_backend
    );
    assert_eq!(total.failures, 0, "failures: {:?}", total.failure_reasons);
    // The workers rebuilt their tables many times: the reads happened under churn.
    let rebuilds = envoy.stat_or_zero("serving_picker.rebuilds") - rebuilds_before;
    println!("metadata churn: {rebuilds} table rebuilds across the LB instances");
    assert!(
        rebuilds >= 100,
        "only {rebuilds} rebuilds: the churn did not reach the module"
    );
    // The main thread's instance read every version and published it; no worker read
    // metadata through Envoy (each had a copy), and no host waited for one long.
    let copies = envoy.stat_or_zero("serving_picker.metadata.copies") - copies_before;
    let worker_reads =
        envoy.stat_or_zero("serving_picker.metadata.read_by_worker") - worker_reads_before;
    let not_yet_read = envoy.stat_or_zero("serving_picker.metadata.hosts_not_yet_read");
    println!(
        "metadata churn: {copies} copies published, {worker_reads} worker reads through Envoy, {not_yet_read} hosts not yet in a copy"
    );
    assert!(
        copies >= 100,
        "only {copies} copies: the main thread's instance does not publish"
    );
    assert_eq!(
        worker_reads, 0,
        "a worker read metadata through Envoy under churn"
    );
}
