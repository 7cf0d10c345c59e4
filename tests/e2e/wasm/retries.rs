//! Retries stay inside the tier (issue 16): the override header lists enough
//! addresses for every attempt the route's retry policy may make, cycling the
//! tier's hosts, so that no retry falls back to Envoy's round robin (which
//! picks not-serving and terminating hosts alike).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{json, Value};
use support::tweak::envoy_yaml_retry_policy;
use support::{tally, wait_until, Backend, Endpoint, EnvoyBuilder};

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

/// README's recommended retry policy (no host predicate).
fn readme_retry_policy() -> Value {
    json!({"retry_on": "connect-failure,reset,refused-stream", "num_retries": 2})
}

/// The only ready host refuses connections; B (not serving) and C (terminating,
/// not serving) listen. Every request fails over its retries on A alone: no
/// request may reach B or C.
fn retries_never_reach_not_serving(tag: &str, policy: Value) {
    let refusing = std::net::SocketAddr::from(([127, 0, 0, 1], support::ports::free_port()));
    let b = Backend::start("B");
    let c = Backend::start("C");
    let envoy = EnvoyBuilder::new()
        .tag(tag)
        .retry_policy(policy)
        .eds_cluster(
            CLUSTER,
            &[
                Endpoint::serving(refusing),
                Endpoint::not_serving(b.addr()),
                Endpoint::terminating_not_serving(c.addr()),
            ],
        )
        .start();
    // Requests before the first snapshot are not what this test is about.
    wait_until("the first snapshot", Duration::from_secs(10), || {
        envoy.stat_or_zero("serving_picker.snapshot.published") >= 1
    });
    std::thread::sleep(Duration::from_millis(300));
    b.reset();
    c.reset();
    let rs: Vec<_> = (0..40).map(|_| envoy.get(PATH, &[])).collect();
    let retries = envoy.stat_or_zero(&format!("cluster.{CLUSTER}.upstream_rq_retry"));
    println!(
        "{tag}: {:?}; retries {retries}; B {} C {}",
        tally(&rs),
        b.count(),
        c.count()
    );
    assert_eq!(
        (b.count(), c.count()),
        (0, 0),
        "a retry reached a not-serving host: {:?}",
        tally(&rs)
    );
    assert!(
        rs.iter().all(|r| r.status == 503),
        "every request should end in a connect-failure 503 (A refuses): {:?}",
        tally(&rs)
    );
    assert!(
        retries >= 40,
        "the retry policy should have retried on A: {retries} retries"
    );
}

#[test]
fn retries_stay_in_the_tier_with_the_readme_policy() {
    retries_never_reach_not_serving("retries-readme", readme_retry_policy());
}

/// envoy.yaml's policy adds the previous_hosts predicate: Envoy's override_host
/// policy does not consult it, so repeated addresses still serve the retries.
#[test]
fn retries_stay_in_the_tier_with_previous_hosts_predicate() {
    retries_never_reach_not_serving("retries-previous-hosts", envoy_yaml_retry_policy());
}

/// Two ready hosts, one refusing: a request that first tries the refusing one
/// retries on the other; no request fails, none reaches the not-serving host.
#[test]
fn retries_move_to_the_other_ready_host() {
    let refusing = std::net::SocketAddr::from(([127, 0, 0, 1], support::ports::free_port()));
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .tag("retries-other-ready")
        .retry_policy(readme_retry_policy())
        .eds_cluster(
            CLUSTER,
            &[
                Endpoint::serving(refusing),
                Endpoint::serving(a.addr()),
                Endpoint::not_serving(b.addr()),
            ],
        )
        .start();
    wait_until("the first snapshot", Duration::from_secs(10), || {
        envoy.stat_or_zero("serving_picker.snapshot.published") >= 1
    });
    std::thread::sleep(Duration::from_millis(300));
    b.reset();
    let rs: Vec<_> = (0..40).map(|_| envoy.get(PATH, &[])).collect();
    assert!(
        rs.iter().all(|r| r.status == 200),
        "every request should be served by A: {:?}",
        tally(&rs)
    );
    assert_eq!(b.count(), 0, "{:?}", tally(&rs));
}
