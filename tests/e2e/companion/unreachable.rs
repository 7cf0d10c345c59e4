//! The companion unreachable, with a real Envoy 1.40 fed by it (ADS, the
//! native form) and a second route on a static cluster of the same Envoy:
//!
//! - an Envoy that has its assignment keeps it while the companion is gone
//!   (requests on the companion's cluster keep going to the pod it last
//!   heard of), and the other route is untouched;
//! - an Envoy that starts while the companion is gone has no endpoints for
//!   the companion's cluster: its route answers 503 (never a pod the
//!   companion did not vouch for), and the other route answers 200.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::companion::{eds_from_companion, Companion, SliceDir, XdsApi};
use support::envoy::fresh_dir;
use support::*;

const CLUSTER: &str = "backend";
const SERVICE: &str = "web";
const OTHER: &str = "other";

fn envoy(tag: &str, companion: &Companion, other: &Backend) -> Envoy {
    EnvoyBuilder::new()
        .tag(tag)
        .eds_cluster(CLUSTER, &[])
        .static_cluster(OTHER, &[Endpoint::serving(other.addr())])
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), XdsApi::Ads))
        // Envoy waits this long for a first assignment before it opens its
        // listener (15 s by default).
        .bootstrap_hook(|b: &mut Value, _: &Path| {
            for c in b["static_resources"]["clusters"].as_array_mut().unwrap() {
                if c["type"] == "EDS" {
                    c["eds_cluster_config"]["eds_config"]["initial_fetch_timeout"] = "1s".into();
                }
            }
        })
        .form(Form::Native)
        .start()
}

#[test]
fn an_unreachable_companion_stays_on_the_routes_that_use_it() {
    set_current_form(Form::Native);
    let a = Backend::start("A");
    let b = Backend::start("B");
    let other = Backend::start("O");
    let slices = SliceDir::create(&fresh_dir("unreachable-slices"));
    slices.set_endpoints(
        SERVICE,
        &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
    );
    let mut companion = Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &[]);
    let had = envoy("unreachable-had", &companion, &other);
    expect_routing(&had, "/backend/x", &[], "A before", served_by(&a));
    expect_routing(&had, "/other/x", &[], "O before", served_by(&other));

    companion.kill();
    for i in 0..30 {
        let r = had.get("/backend/x", &[]);
        assert!(
            served_by(&a)(&r),
            "request {i} with the companion gone: {r:?}"
        );
        let r = had.get("/other/x", &[]);
        assert!(served_by(&other)(&r), "other route, request {i}: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let fresh = envoy("unreachable-fresh", &companion, &other);
    for i in 0..20 {
        let r = fresh.get("/backend/x", &[]);
        assert_eq!(r.status, 503, "request {i} without an assignment: {r:?}");
        let r = fresh.get("/other/x", &[]);
        assert!(served_by(&other)(&r), "other route, request {i}: {r:?}");
    }
    assert_eq!(
        fresh.stat("cluster.backend.membership_total"),
        Some(0),
        "an Envoy that never heard from the companion has no endpoints"
    );
    // The assignment it had: A (B, not serving, is not sent).
    assert_eq!(had.stat("cluster.backend.membership_total"), Some(1));
}
