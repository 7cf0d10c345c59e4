//! Topology: inside the chosen tier the filter prefers the local zone
//! (`local_zone`, else Envoy's own `node.locality.zone` in the wasm form) when
//! it holds at least `local_zone_min_share` of the tier's weight, else it uses
//! the whole tier.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use support::*;

#[test]
fn local_zone_is_preferred_when_it_holds_enough_weight() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let config = plugin_config(json!({"local_zone": "zone-a", "local_zone_min_share": 0.3}));
    let envoy = EnvoyBuilder::new()
        .tag("zone-prefer")
        .with_filter(Some(&config))
        .eds_cluster(
            "backend",
            &[
                Endpoint::serving(a.addr()).zone("zone-a"),
                Endpoint::serving(b.addr()).zone("zone-b"),
                // Local, but terminating: the ready tier does not contain it.
                Endpoint::serving_terminating(c.addr()).zone("zone-a"),
            ],
        )
        .start();
    // zone-a holds 1 of the ready tier's 2 weight (0.5 >= 0.3): A only.
    expect_routing(&envoy, "/backend/x", &[], "A (local zone)", picked(&a));

    // zone-a now holds 1 of 4 (0.25 < 0.3): the whole ready tier.
    let d = Backend::start("D");
    let e = Backend::start("E");
    envoy.set_endpoints(
        "backend",
        &[
            Endpoint::serving(a.addr()).zone("zone-a"),
            Endpoint::serving(b.addr()).zone("zone-b"),
            Endpoint::serving(d.addr()).zone("zone-b"),
            Endpoint::serving(e.addr()).zone("zone-c"),
            Endpoint::serving_terminating(c.addr()).zone("zone-a"),
        ],
    );
    let all = [&a, &b, &d, &e];
    // Every worker moves to the new plan within a few refreshes; from then on
    // each worker is exact round robin over the four ready hosts, so a batch of
    // 80 split over two workers gives each host 20 ± 2.
    let mut last = Default::default();
    let even = |counts: &std::collections::BTreeMap<String, usize>| {
        ["A", "B", "D", "E"]
            .iter()
            .all(|n| counts.get(*n).is_some_and(|c| c.abs_diff(20) <= 2))
    };
    wait_until(
        "exact round robin over the ready tier",
        SETTLE_TIMEOUT,
        || {
            let rs = batch(&envoy, "/backend/x", &[], 80);
            let all_picked = rs.iter().all(picked_any(&all));
            last = per_backend(&rs);
            all_picked && even(&last)
        },
    );
    let rs = assert_batch(
        &envoy,
        "/backend/x",
        &[],
        80,
        "ready tier",
        picked_any(&all),
    );
    let counts = per_backend(&rs);
    assert!(
        even(&counts),
        "round robin over the tier: {counts:?} (before: {last:?})"
    );
}

#[test]
fn weight_decides_the_local_share() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let config = plugin_config(json!({"local_zone": "zone-a", "local_zone_min_share": 0.3}));
    // zone-a: weight 1 of 5 (0.2 < 0.3) although it is half the hosts.
    let envoy = EnvoyBuilder::new()
        .tag("zone-weight")
        .with_filter(Some(&config))
        .eds_cluster(
            "backend",
            &[
                Endpoint::serving(a.addr()).zone("zone-a").weight(1),
                Endpoint::serving(b.addr()).zone("zone-b").weight(4),
            ],
        )
        .start();
    let both = [&a, &b];
    settle(
        &envoy,
        "/backend/x",
        &[],
        "picked by the filter",
        picked_any(&both),
    );
    let rs = assert_batch(
        &envoy,
        "/backend/x",
        &[],
        200,
        "both zones",
        picked_any(&both),
    );
    let b_share = per_backend(&rs).get("B").copied().unwrap_or(0) as f64 / 200.0;
    assert!((b_share - 0.8).abs() < 0.05, "B share {b_share}");
}

/// Without `local_zone` the wasm filter takes Envoy's own zone (bootstrap
/// `node.locality.zone`, or `--service-zone` which overrides it); `local_zone`
/// in the configuration wins over both.
#[test]
fn local_zone_defaults_to_envoys_node_locality() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let endpoints = [
        Endpoint::serving(a.addr()).zone("zone-a"),
        Endpoint::serving(b.addr()).zone("zone-b"),
    ];
    let node = "Envoy's node.locality.zone";
    // (config, `--service-zone`, the zone used, its host, where it came from)
    for (config, service_zone, zone, local, source) in [
        (json!({}), None, "zone-a", &a, node),
        // `--service-zone` replaces the bootstrap's zone, as a DaemonSet passes it.
        (json!({}), Some("zone-b"), "zone-b", &b, node),
        (
            json!({"local_zone": "zone-b"}),
            None,
            "zone-b",
            &b,
            "local_zone",
        ),
    ] {
        let mut builder = EnvoyBuilder::new()
            .tag("zone-from-node")
            .with_filter(Some(&plugin_config(config)))
            .bootstrap_hook(support::tweak::node_zone("zone-a"))
            .eds_cluster("backend", &endpoints);
        if let Some(z) = service_zone {
            builder = builder.arg("--service-zone").arg(z);
        }
        let envoy = builder.start();
        // Each zone holds half the tier's weight (>= the default 0.2): the local one only.
        expect_routing(
            &envoy,
            "/backend/x",
            &[],
            "the local zone's host",
            picked(local),
        );
        let lines = envoy.log_lines("serving_picker: local zone");
        // One per VM (the main thread's and each worker's), each naming the zone and its source.
        assert!(
            !lines.is_empty()
                && lines
                    .iter()
                    .all(|l| l.ends_with(&format!("local zone \"{zone}\" from {source}"))),
            "{lines:#?}"
        );
    }
}
