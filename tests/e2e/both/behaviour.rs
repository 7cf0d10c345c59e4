//! Behaviour of both forms in a real Envoy beyond the table: hosts without
//! metadata, EDS health_status, weights, condition values of the wrong
//! type, a present `serving` over `ready`, several clusters, the 503.
//! The filter's own behaviour (client headers, passthrough, the allow-list,
//! the admin API, counters, the change gate) is in `wasm::behaviour`.

use support::scenario::{ep, walk, Expect::*, Published::*, Step};
use support::*;

scenarios! {
    hosts_without_metadata_are_served_like_ready {
        tag: "no-metadata",
        // Not serving by metadata, C proves the module knows the endpoints.
        endpoints: &[ep("A", NoMetadata), ep("B", NoMetadata), ep("C", NotServing)],
        expect: Picked(&["A", "B"]),
        native: None,
    }
    health_status_healthy_gets_traffic_draining_does_not {
        tag: "health-healthy-draining",
        // C: healthy for Envoy, not serving by metadata.
        endpoints: &[ep("A", Health("HEALTHY")), ep("B", Health("DRAINING")), ep("C", NotServing)],
        expect: Picked(&["A"]),
        native: None,
    }
    health_status_only_draining_still_gets_traffic {
        tag: "health-draining-only",
        endpoints: &[ep("B", Health("DRAINING"))],
        expect: Picked(&["B"]),
        // Terminating endpoints must reach Envoy as HEALTHY/UNKNOWN for the
        // native form (docs/native.md).
        native: Some((
            "Envoy keeps a DRAINING host out of its healthy list, the only one the module picks from",
            NoServing,
        )),
    }
    /// Envoy alone would route to them (panic mode); the module must not.
    health_status_unhealthy_and_timeout_are_not_serving {
        tag: "health-unhealthy",
        endpoints: &[ep("A", Health("UNHEALTHY")), ep("D", Health("TIMEOUT"))],
        expect: NoServing,
        native: None,
    }
    health_status_degraded_and_unknown_are_serving {
        tag: "health-degraded",
        endpoints: &[ep("A", Health("DEGRADED")), ep("D", Health("UNKNOWN")), ep("B", Health("DRAINING"))],
        expect: Picked(&["A", "D"]),
        native: Some((
            "Envoy keeps a DEGRADED host in its degraded list, not the healthy one the module picks from",
            Picked(&["D"]),
        )),
    }
    weights_spread_traffic {
        tag: "weights",
        endpoints: &[
            ep("A", Serving).weight(1),
            ep("B", Serving).weight(3),
            // Heavy but not serving: Envoy's own weighted RR would send it half.
            ep("C", NotServing).weight(4),
        ],
        expect: Share { among: &["A", "B"], backend: "B", share: 0.75 },
        native: None,
    }
    /// `serving` decides when present; `ready` only when it is absent.
    present_serving_wins_over_ready {
        tag: "serving-over-ready",
        endpoints: &[
            ep("A", Conditions(r#"{"ready": false, "serving": true}"#)),
            ep("B", Conditions(r#"{"ready": true, "serving": false}"#)),
            ep("C", Conditions(r#"{"ready": true}"#)),
            ep("D", Conditions(r#"{"ready": false}"#)),
        ],
        expect: Picked(&["A", "C"]),
        native: None,
    }
}

/// Condition values of the wrong type are read as absent (the API's nil
/// rules: serving, not terminating).
const WRONG_TYPED: &[Step] = &[
    Step {
        what: "A (serving: \"yes\" = absent = serving)",
        endpoints: &[
            ep("A", Conditions(r#"{"serving": "yes"}"#)),
            ep("B", NotServing),
        ],
        expect: Picked(&["A"]),
    },
    Step {
        what: "A (terminating: \"true\", ready: 1 = absent too) and serving B: both tier 1",
        endpoints: &[
            ep(
                "A",
                Conditions(r#"{"serving": "yes", "terminating": "true", "ready": 1}"#),
            ),
            ep("B", Serving),
        ],
        expect: Picked(&["A", "B"]),
    },
    Step {
        what: "B starts terminating: A (terminating: \"true\" = not terminating) over B",
        endpoints: &[
            ep(
                "A",
                Conditions(r#"{"serving": "yes", "terminating": "true", "ready": 1}"#),
            ),
            ep("B", ServingTerminating),
        ],
        expect: Picked(&["A"]),
    },
];

fn wrong_typed_metadata_is_read_as_absent(form: Form) {
    walk(form, "wrong-typed", WRONG_TYPED);
}

fn several_clusters_each_by_its_own_conditions(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let d = Backend::start("D");
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("several-clusters")
        .eds_cluster(
            "alpha",
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .eds_cluster(
            "beta",
            &[Endpoint::not_serving(c.addr()), Endpoint::serving(d.addr())],
        )
        .start();
    expect_routing(&envoy, "/alpha/x", &[], "alpha -> A", picked(&a));
    expect_routing(&envoy, "/beta/x", &[], "beta -> D", picked(&d));
    expect_routing(
        &envoy,
        "/",
        &[],
        "/ (first cluster, alpha) -> A",
        picked(&a),
    );
    // Rolling update in alpha only.
    envoy.set_endpoints(
        "alpha",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(
        &envoy,
        "/alpha/x",
        &[],
        "alpha after update -> B",
        picked(&b),
    );
    assert_batch(
        &envoy,
        "/beta/x",
        &[],
        BATCH,
        "beta unchanged -> D",
        picked(&d),
    );
    // Then beta loses its serving host while alpha keeps B.
    envoy.set_endpoints(
        "beta",
        &[
            Endpoint::not_serving(c.addr()),
            Endpoint::terminating_not_serving(d.addr()),
        ],
    );
    expect_routing(
        &envoy,
        "/beta/x",
        &[],
        "beta -> 503",
        no_serving_503("beta"),
    );
    assert_batch(
        &envoy,
        "/alpha/x",
        &[],
        BATCH,
        "alpha still -> B",
        picked(&b),
    );
}

fn no_serving_endpoint_is_a_clear_503(form: Form) {
    let a = Backend::start("A");
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("clear-503")
        .eds_cluster("checkout", &[Endpoint::not_serving(a.addr())])
        .start();
    settle(
        &envoy,
        "/checkout/x",
        &[],
        "503 no-serving-endpoint",
        no_serving_503("checkout"),
    );
    a.reset();
    let r = envoy.get("/checkout/x", &[]);
    assert_eq!(r.status, 503, "{}", r.summary());
    assert_eq!(
        r.header("x-serving-picker"),
        Some("no-serving-endpoint"),
        "{}",
        r.summary()
    );
    assert!(
        r.body.contains("no-serving-endpoint"),
        "body lacks no-serving-endpoint: {:?}",
        r.body
    );
    assert!(
        r.body.contains("checkout"),
        "body lacks the cluster name: {:?}",
        r.body
    );
    // A client header cannot get around it.
    let a_addr = a.addr().to_string();
    assert_batch(
        &envoy,
        "/checkout/x",
        &[(OVERRIDE_HEADER, a_addr.as_str())],
        BATCH,
        "503 even with a client override header",
        no_serving_503("checkout"),
    );
    assert_eq!(a.count(), 0, "the not-serving host was reached");
}

both_forms!(
    several_clusters_each_by_its_own_conditions,
    no_serving_endpoint_is_a_clear_503,
    wrong_typed_metadata_is_read_as_absent,
);
