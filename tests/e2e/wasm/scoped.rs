//! Policies only where they are used, in real Envoy configs shaped as the
//! platforms render the shipped examples:
//! - Envoy Gateway with the EnvoyExtensionPolicy and the BackendTrafficPolicy
//!   (endpointOverride) targeting one HTTPRoute: the filter in the listener,
//!   disabled, enabled on that route by an empty `FilterConfig`
//!   (envoyproxy/gateway@v1.9.0: internal/xds/translator/wasm.go), the
//!   override_host policy on that route's cluster only, EG's least_request
//!   on the others (internal/xds/translator/cluster.go). A client's
//!   `x-gateway-destination-endpoint` on another route reaches no pod it
//!   names; on the managed route the filter removes it. For contrast, the
//!   Gateway-targeted shape (override_host on every cluster) lets it steer.
//! - Istio with the shipped EnvoyFilter's early header mutation: a client's
//!   header is gone before any filter runs, so with the filter missing
//!   (FAIL_OPEN after a failed pull) Envoy's balancer picks, and with it the
//!   filter still steers.
//!
//! Each test states its expectation in its doc comment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use serde_json::{json, Value};
use support::tweak::cluster_mut;
use support::*;

/// EG's names: the wasm filter of policy default/serving-picker, and the
/// clusters of two HTTPRoutes' first rules.
const EG_FILTER: &str =
    "envoy.filters.http.wasm/envoyextensionpolicy/default/serving-picker/wasm/0";
const WEB: &str = "httproute/default/web/rule/0";
const OTHER: &str = "httproute/default/other/rule/0";

fn hcm(bootstrap: &mut Value) -> &mut Value {
    &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]
}

/// EG's least_request, as on a cluster no policy names.
fn least_request() -> Value {
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.least_request",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"}
    }}]})
}

/// The bootstrap as EG renders it. `route_targeted`: the shipped example
/// (both policies on HTTPRoute `web`); else both on the Gateway (the filter
/// enabled on every route, the override on every cluster).
fn eg_shape(route_targeted: bool) -> impl Fn(&mut Value, &Path) + 'static {
    move |bootstrap: &mut Value, _dir: &Path| {
        let filters = hcm(bootstrap)["http_filters"].as_array_mut().unwrap();
        let wasm = filters
            .iter_mut()
            .find(|f| f["name"] == "envoy.filters.http.wasm")
            .unwrap();
        wasm["name"] = json!(EG_FILTER);
        wasm["disabled"] = json!(true);
        let enable = json!({EG_FILTER: {
            "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}
        }});
        let mut web = json!({"match": {"prefix": "/web/"}, "route": {"cluster": WEB},
                             "typed_per_filter_config": enable});
        let mut other = json!({"match": {"prefix": "/other/"}, "route": {"cluster": OTHER}});
        if !route_targeted {
            other["typed_per_filter_config"] = web["typed_per_filter_config"].clone();
        }
        web["name"] = json!("httproute/default/web/rule/0/match/0");
        other["name"] = json!("httproute/default/other/rule/0/match/0");
        hcm(bootstrap)["route_config"]["virtual_hosts"][0]["routes"] = json!([web, other]);
        for name in [WEB, OTHER] {
            let c = cluster_mut(bootstrap, name);
            if let Some(o) = c.as_object_mut() {
                o.remove("common_lb_config");
            }
        }
        if route_targeted {
            cluster_mut(bootstrap, OTHER)["load_balancing_policy"] = least_request();
        }
    }
}

/// A (serving) and B (not ready: UNHEALTHY from the companion) on the
/// managed route's cluster; C (serving) and D (not ready: DRAINING, as EG
/// sends it) on the other route's.
fn eg_envoy(tag: &str, route_targeted: bool) -> (Envoy, [Backend; 4]) {
    let [a, b, c, d] = ["A", "B", "C", "D"].map(Backend::start);
    let config = plugin_config(json!({"clusters": [WEB]}));
    let envoy = EnvoyBuilder::new()
        .tag(tag)
        .with_filter(Some(&config))
        .eds_cluster(
            WEB,
            &[
                Endpoint::serving(a.addr()),
                Endpoint::not_serving(b.addr()).health_status("UNHEALTHY"),
            ],
        )
        .eds_cluster(
            OTHER,
            &[
                Endpoint::serving(c.addr()),
                Endpoint::not_serving(d.addr()).health_status("DRAINING"),
            ],
        )
        .bootstrap_hook(eg_shape(route_targeted))
        .start();
    (envoy, [a, b, c, d])
}

/// Both policies on HTTPRoute `web`, as shipped. Expected: on `/other/`
/// a client's header naming D (not ready, DRAINING) is ignored: every
/// request goes to C through EG's least_request, D is never reached, and C
/// receives the header untouched (it meant nothing to Envoy). On `/web/` a
/// client's header naming B is replaced by the filter's pick: A, never B.
#[test]
fn a_client_header_on_another_route_reaches_no_pod_it_names() {
    let (envoy, [a, b, c, d]) = eg_envoy("scoped-eg-route", true);
    settle(
        &envoy,
        "/web/x",
        &[],
        "A picked on the managed route",
        picked(&a),
    );
    let d_addr = d.addr().to_string();
    let b_addr = b.addr().to_string();
    let rs = assert_batch(
        &envoy,
        "/other/x",
        &[(OVERRIDE_HEADER, d_addr.as_str())],
        BATCH,
        "other route: EG's balancer, the client's header ignored",
        served_by(&c),
    );
    assert_eq!(
        d.count(),
        0,
        "a client's header steered to D on another route"
    );
    assert!(
        c.override_values().iter().all(|v| *v == d_addr) && c.override_values().len() == rs.len(),
        "C receives the client's header as sent: {:?}",
        c.override_values()
    );
    assert_batch(
        &envoy,
        "/web/x",
        &[(OVERRIDE_HEADER, b_addr.as_str())],
        BATCH,
        "managed route: the filter's pick replaces the client's header",
        picked(&a),
    );
    assert_eq!(
        b.count(),
        0,
        "a client's header steered to B on the managed route"
    );
    println!(
        "route-targeted: /other/ with the header naming D: {:?}; D reached {} times",
        tally(&rs),
        d.count()
    );
}

/// For contrast, the override where the filter does not run: the
/// extension policy on HTTPRoute `web` and the traffic policy on the
/// Gateway (override_host on `other` too). Expected: a client's header on
/// `/other/` naming D (not ready, DRAINING) steers every request to D
/// (override_host checks no health): why both policies take the same
/// targets, and why the example targets routes.
#[test]
fn an_override_where_the_filter_does_not_run_lets_clients_steer() {
    let [a, _b, c, d] = ["A", "B", "C", "D"].map(Backend::start);
    let envoy = EnvoyBuilder::new()
        .tag("scoped-eg-override-alone")
        .with_filter(Some(&plugin_config(json!({"clusters": [WEB]}))))
        .eds_cluster(WEB, &[Endpoint::serving(a.addr())])
        .eds_cluster(
            OTHER,
            &[
                Endpoint::serving(c.addr()),
                Endpoint::not_serving(d.addr()).health_status("DRAINING"),
            ],
        )
        .bootstrap_hook(eg_shape(true))
        .bootstrap_hook(|bootstrap: &mut Value, _dir: &Path| {
            // As a Gateway-targeted traffic policy sets it: on every cluster.
            let policy = cluster_mut(bootstrap, WEB)["load_balancing_policy"].clone();
            cluster_mut(bootstrap, OTHER)["load_balancing_policy"] = policy;
        })
        .start();
    settle(&envoy, "/web/x", &[], "A picked", picked(&a));
    let d_addr = d.addr().to_string();
    let rs = batch(
        &envoy,
        "/other/x",
        &[(OVERRIDE_HEADER, d_addr.as_str())],
        BATCH,
    );
    println!(
        "override without the filter: /other/ with the header naming D: {:?}",
        tally(&rs)
    );
    assert_eq!(
        d.count(),
        BATCH as u64,
        "the override alone honours the client's header (C got {})",
        c.count()
    );
}

/// An early header mutation removing the header (the shipped Istio
/// EnvoyFilter's), A serving and B not serving (UNHEALTHY) on a cluster
/// with the override policy. Expected: without the wasm filter (FAIL_OPEN
/// after a failed pull) a client's header naming B is gone before routing:
/// Envoy's balancer serves A, B never reached; with the filter, A is picked
/// (the filter sets its header after the early removal).
#[test]
fn an_early_header_removal_keeps_clients_from_steering_with_or_without_the_filter() {
    let early_removal = |bootstrap: &mut Value, _dir: &Path| {
        hcm(bootstrap)["early_header_mutation_extensions"] = json!([{
            "name": "envoy.http.early_header_mutation.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
                "mutations": [{"remove": OVERRIDE_HEADER}]
            }
        }]);
    };
    for with_filter in [false, true] {
        let a = Backend::start("A");
        let b = Backend::start("B");
        let config = plugin_config(json!({}));
        let envoy = EnvoyBuilder::new()
            .tag(&format!("scoped-early-removal-{with_filter}"))
            .with_filter(with_filter.then_some(config.as_str()))
            .eds_cluster(
                "backend",
                &[
                    Endpoint::serving(a.addr()),
                    Endpoint::not_serving(b.addr()).health_status("UNHEALTHY"),
                ],
            )
            .bootstrap_hook(early_removal)
            .start();
        let b_addr = b.addr().to_string();
        let header = [(OVERRIDE_HEADER, b_addr.as_str())];
        if with_filter {
            settle(&envoy, "/backend/x", &header, "A picked", picked(&a));
            assert_batch(&envoy, "/backend/x", &header, BATCH, "A picked", picked(&a));
        } else {
            assert_batch(
                &envoy,
                "/backend/x",
                &header,
                BATCH,
                "no filter: Envoy's balancer, the header removed early",
                |r| passed_through(r) && served_by(&a)(r),
            );
        }
        assert_eq!(b.count(), 0, "with_filter {with_filter}: B reached");
    }
}
