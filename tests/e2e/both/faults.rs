//! Faults around both forms in a real Envoy: a backend killed under load,
//! live health (active health checks, outlier detection). The filter's own
//! faults (its admin API, stale snapshots, hot reload, client headers) are
//! in `wasm::faults`. Each test states its expectation in its doc comment.

use std::time::Duration;

use serde_json::json;
use support::load::{Load, LoadConfig};
use support::tweak::{
    envoy_yaml_outlier_detection, envoy_yaml_retry_policy, health_check_port, merge_cluster,
};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

/// Two serving hosts, a steady load (8 keep-alive clients, 600 req/s),
/// envoy.yaml's retry policy (connect-failure,reset,refused-stream; 2
/// retries) and outlier detection; A is killed (listener and connections
/// closed at once, no preStop) in the middle. Expected: no user-visible
/// error (the override header lists the other serving host for the retries;
/// requests in flight on A are reset and retried), and once outlier detection
/// ejects A, the filter no longer names A at all.
///
/// Two cluster settings differ from envoy.yaml, which fails this test as it
/// stands (measured: ~390 of ~1800 requests failed in the 3 s after the kill):
/// - `outlier_detection.max_ejection_percent: 50`: the default (10 %) never
///   ejects one host of two, so A is never ejected, the filter keeps picking
///   it and every second request needs a retry;
/// - `circuit_breakers.thresholds.max_retries: 100`: the default (3
///   concurrent retries) overflows when the requests in flight on A are reset
///   together (12 failures with the first fix alone).
fn backend_killed_under_load_gives_no_user_errors(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("fault-kill-under-load")
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .retry_policy(envoy_yaml_retry_policy())
        .bootstrap_hook(merge_cluster(CLUSTER, {
            let mut outlier = envoy_yaml_outlier_detection();
            outlier["max_ejection_percent"] = json!(50);
            json!({
                "outlier_detection": outlier,
                "circuit_breakers": {"thresholds": [{"max_retries": 100}]}
            })
        }))
        .start();
    settle(&envoy, PATH, &[], "filter routes to A or B", |r| {
        filter_routed_to(&a)(r) || filter_routed_to(&b)(r)
    });
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig::paced(8, 75.0, PATH),
        "A and B serving",
    );
    std::thread::sleep(Duration::from_millis(1500));
    load.phase("A killed");
    a.stop();
    std::thread::sleep(Duration::from_millis(3000));
    let report = load.finish();
    let table = report.phase_table("backend killed under load");
    println!("{table}");
    let retries = envoy.stat_or_zero("cluster.backend.upstream_rq_retry");
    let overflow = envoy.stat_or_zero("cluster.backend.upstream_rq_retry_overflow");
    let ejected = envoy.stat_or_zero("cluster.backend.outlier_detection.ejections_enforced_total");
    println!("retries {retries}, retry overflows {overflow}, outlier ejections {ejected}");
    assert_eq!(
        report.failures(),
        0,
        "a backend killed while another serves must not show (retries {retries}, \
         overflows {overflow}, ejections {ejected})\n{table}"
    );
    assert!(report.served_by_in("A", Duration::ZERO, report.end) > 0);
    assert!(ejected >= 1, "outlier detection should have ejected A");
    // A is ejected: the filter's live-health merge drops it from the tier.
    expect_routing(
        &envoy,
        PATH,
        &[],
        "A ejected: B alone, A not even a retry alternate",
        picked(&b),
    );
}

/// A STATIC cluster with an active HTTP health check; each host's check goes
/// to its own health port (`health_check_config.port_value`), so a host can
/// fail its checks while still answering requests. Both hosts say serving in
/// their metadata. Expected: while A's health port answers, both are picked;
/// once it is gone (A fails active HC: A still serves requests, so a wrong
/// pick would show as a 200 from A), only B is picked and A is not even a
/// retry alternate; when A's health port is back, A is picked again.
fn host_failing_active_health_checks_is_not_served(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let hc_a = Backend::start("hcA");
    let hc_b = Backend::start("hcB");
    let hc_a_addr = hc_a.addr();
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("fault-active-hc")
        .static_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .bootstrap_hook(merge_cluster(
            CLUSTER,
            json!({"health_checks": [{
                "timeout": "0.2s",
                "interval": "0.2s",
                "no_traffic_interval": "0.2s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "http_health_check": {"path": "/healthz"}
            }]}),
        ))
        .bootstrap_hook(health_check_port(CLUSTER, a.addr(), hc_a.addr().port()))
        .bootstrap_hook(health_check_port(CLUSTER, b.addr(), hc_b.addr().port()))
        .start();
    let both = |r: &Response| filter_routed_to(&a)(r) || filter_routed_to(&b)(r);
    let rs = expect_routing(&envoy, PATH, &[], "both healthy: A or B picked", both);
    let counts = per_backend(&rs);
    assert!(
        counts.contains_key("A") && counts.contains_key("B"),
        "{counts:?}"
    );

    hc_a.stop();
    expect_routing(
        &envoy,
        PATH,
        &[],
        "A fails active HC: B alone, A not even a retry alternate",
        picked(&b),
    );
    let clusters = envoy.admin_get("/clusters").body;
    let a_flags = format!("{}::health_flags::/failed_active_hc", a.addr());
    assert!(
        clusters.contains(&a_flags),
        "/clusters should show A failing active HC ({a_flags}):\n{clusters}"
    );
    a.reset();
    assert_batch(&envoy, PATH, &[], BATCH, "B alone", picked(&b));
    assert_eq!(
        a.count(),
        0,
        "A was served while failing active health checks"
    );

    let _hc_a_back = Backend::start_at("hcA", hc_a_addr);
    // B alone also satisfies `both`: wait for A itself (its next check passes).
    wait_until("A picked again after recovering", SETTLE_TIMEOUT, || {
        filter_routed_to(&a)(&envoy.get(PATH, &[]))
    });
    expect_routing(&envoy, PATH, &[], "A healthy again: A or B picked", both);
}

/// Outlier detection (local-origin failures, 30 s ejection) with the retry
/// policy. A is stopped until it is ejected, then comes back at the same
/// address: alive, its metadata says serving, but it is still ejected.
/// Expected: the filter does not pick it (override_host would send a request
/// there regardless of the ejection), only B is picked and A is not even a
/// retry alternate; no request fails on the way (the retries take B).
fn host_ejected_by_outlier_detection_is_not_served(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let a_addr = a.addr();
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("fault-outlier")
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .retry_policy(envoy_yaml_retry_policy())
        .bootstrap_hook(merge_cluster(
            CLUSTER,
            json!({"outlier_detection": {
                "consecutive_local_origin_failure": 2,
                "split_external_local_origin_errors": true,
                "interval": "1s",
                "base_ejection_time": "30s",
                "max_ejection_percent": 50
            }}),
        ))
        .start();
    let both = |r: &Response| filter_routed_to(&a)(r) || filter_routed_to(&b)(r);
    expect_routing(&envoy, PATH, &[], "A or B picked", both);
    a.stop();
    let mut seen = Vec::new();
    wait_until(
        "outlier detection to eject A",
        Duration::from_secs(10),
        || {
            seen.push(envoy.get(PATH, &[]));
            envoy.stat_or_zero("cluster.backend.outlier_detection.ejections_active") == 1
        },
    );
    let failed: Vec<String> = seen
        .iter()
        .filter(|r| r.status != 200)
        .map(|r| r.summary())
        .collect();
    assert!(
        failed.is_empty(),
        "requests failed while A was down: {failed:?}"
    );
    drop(a);
    let a2 = Backend::start_at("A", a_addr);
    expect_routing(
        &envoy,
        PATH,
        &[],
        "A ejected (alive again, metadata serving): B alone",
        picked(&b),
    );
    a2.reset();
    assert_batch(&envoy, PATH, &[], BATCH, "B alone", picked(&b));
    assert_eq!(
        a2.count(),
        0,
        "A was served while ejected by outlier detection"
    );
}

both_forms!(
    backend_killed_under_load_gives_no_user_errors,
    host_failing_active_health_checks_is_not_served,
    host_ejected_by_outlier_detection_is_not_served,
);
