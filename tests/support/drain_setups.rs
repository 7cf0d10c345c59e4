//! Envoys for long-lived streams through a pod's termination, shared by the native form's drain
//! tests (tests/e2e/native/drain.rs) and `make drain-picture` (benches/drain/main.rs): the native
//! form with its stream-drain HTTP filter `serving_picker_drain` beside the load-balancing
//! policy, and the companion's tiered EDS output (ready endpoints at priority 0, serving and
//! terminating ones at priority 1) for plain Envoy. The pods, clients and counts are
//! `crate::streams`.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::eds::Endpoint;
use crate::envoy::{Envoy, EnvoyBuilder, Form};
use crate::streams::envoy_hook;

/// The cluster speaking HTTP/2 to the pods (gRPC, the HTTP/2 download); the first, routed `/`.
pub const H2: &str = "grpc";
/// The cluster speaking HTTP/1.1 to the same pods (websocket, the HTTP/1.1 download).
pub const H1: &str = "h1";

/// The overprovisioning factor of the companion's tiered output
/// (conditions/src/eds/assignment.rs `OVERPROVISIONING_FACTOR`): priority 1 gets no load while
/// a priority-0 host is healthy.
pub const TIERED_OVERPROVISIONING_FACTOR: u32 = 100_000;

/// The native drain filter before the router (`envoy_hook` sets the rest).
pub fn with_drain_filter(bootstrap: &mut Value, _dir: &Path) {
    let hcm = &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    if let Some(filters) = hcm["http_filters"].as_array_mut() {
        filters.insert(
            0,
            json!({
                "name": "envoy.filters.http.dynamic_modules",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
                    "dynamic_module_config": {"name": "serving_picker"},
                    "filter_name": "serving_picker_drain",
                    "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": "{}"}
                }
            }),
        );
    }
}

/// The native form (policy plugin config `policy` on both clusters) with the drain filter, the
/// clusters [`H2`] and [`H1`] fed these endpoints.
pub fn drain_envoy(tag: &str, policy: &str, endpoints: &[Endpoint]) -> Envoy {
    EnvoyBuilder::new()
        .form(Form::Native)
        .tag(tag)
        .native_config(policy)
        .bootstrap_hook(envoy_hook(H2, H1))
        .bootstrap_hook(with_drain_filter)
        .eds_cluster(H2, endpoints)
        .eds_cluster(H1, endpoints)
        .start()
}

/// The native policy's plugin config with this drain window.
pub fn window_policy(window: Duration) -> String {
    format!(r#"{{"drain_window_ms": {}}}"#, window.as_millis())
}

/// These endpoints on both clusters.
pub fn set_both(envoy: &Envoy, endpoints: &[Endpoint]) {
    envoy.set_endpoints(H2, endpoints);
    envoy.set_endpoints(H1, endpoints);
}

/// These endpoints on both clusters as the companion's tiered output writes them.
pub fn set_both_tiered(envoy: &Envoy, endpoints: &[Endpoint]) {
    for cluster in [H2, H1] {
        envoy
            .eds(cluster)
            .write_assignment(tiered_load_assignment(cluster, endpoints));
    }
}

/// The priority the companion's tiered output gives an endpoint: 0 ready, 1 serving (and so
/// terminating), none (left out) not serving.
fn tier(ep: &Endpoint) -> Option<u32> {
    let is = |v: &Option<Value>| v.as_ref().and_then(Value::as_bool) == Some(true);
    if is(&ep.ready) {
        Some(0)
    } else if is(&ep.serving) {
        Some(1)
    } else {
        None
    }
}

/// The ClusterLoadAssignment the companion's tiered output gives these endpoints: ready ones at
/// priority 0, serving ones at priority 1, not serving ones left out, and
/// `policy.overprovisioning_factor` [`TIERED_OVERPROVISIONING_FACTOR`].
pub fn tiered_load_assignment(cluster: &str, endpoints: &[Endpoint]) -> Value {
    let groups: Vec<Value> = [0u32, 1]
        .iter()
        .filter_map(|&priority| {
            let lb: Vec<Value> = endpoints
                .iter()
                .filter(|ep| tier(ep) == Some(priority))
                .map(Endpoint::to_lb_endpoint)
                .collect();
            (!lb.is_empty()).then(|| json!({"priority": priority, "lb_endpoints": lb}))
        })
        .collect();
    json!({
        "cluster_name": cluster,
        "endpoints": groups,
        "policy": {"overprovisioning_factor": TIERED_OVERPROVISIONING_FACTOR},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiered_output_puts_ready_at_0_serving_at_1_and_leaves_out_not_serving() {
        let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
        let cla = tiered_load_assignment(
            "c",
            &[
                Endpoint::serving_terminating(addr(1)),
                Endpoint::serving(addr(2)),
                Endpoint::not_serving(addr(3)),
            ],
        );
        let groups = cla["endpoints"].as_array().cloned().unwrap_or_default();
        let ports: Vec<(u64, Vec<u64>)> = groups
            .iter()
            .map(|g| {
                let ports = g["lb_endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| {
                        e["endpoint"]["address"]["socket_address"]["port_value"].as_u64()
                    })
                    .collect();
                (g["priority"].as_u64().unwrap_or(99), ports)
            })
            .collect();
        assert_eq!(ports, vec![(0, vec![2]), (1, vec![1])]);
        assert_eq!(cla["policy"]["overprovisioning_factor"], 100_000);
    }
}
