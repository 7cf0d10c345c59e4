//! The metadata contract end to end, without Envoy: whatever the companion
//! writes for a Service's endpoints (its ClusterLoadAssignment, plain or
//! with the priority output), both shells' readers put every endpoint in
//! the tier the contract gives it, and plan the same hosts:
//! - the wasm shell reads the assignment as Envoy's admin config dump shows
//!   it (JSON, `admin_json::parse_config_dump`);
//! - the native shell reads it host by host through its host callbacks
//!   (the `testing` fake, as Envoy's `lb_get_host_*` would answer).
//!
//! The contract itself is `serving_picker_core::contract`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use envoy_types::pb::envoy::config::core::v3::{address, socket_address, HealthStatus};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, LbEndpoint,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use serving_picker::table::{build, Choice};
use serving_picker::table::{HostHealth, HostSource};
use serving_picker::testing::{FakeCluster, FakeHost};
use serving_picker_conditions::eds::assignment::{cluster_load_assignment, Output};
use serving_picker_conditions::model::endpoint::Endpoint;
use serving_picker_conditions::model::slice::SliceEndpoint;
use serving_picker_core::config::SelectionConfig;
use serving_picker_core::contract::{Tier, DEFAULT_NAMESPACE};
use serving_picker_core::plan::plan_cluster_at;
use serving_picker_wasm::admin_json::parse_config_dump;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

/// An lb_endpoint's `address:port`.
fn addr(lb: &LbEndpoint) -> String {
    let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &lb.host_identifier else {
        panic!("no endpoint");
    };
    let Some(address::Address::SocketAddress(sa)) =
        e.address.as_ref().and_then(|a| a.address.as_ref())
    else {
        panic!("no socket address");
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
        panic!("no port");
    };
    SocketAddr::new(sa.address.parse().unwrap(), port as u16).to_string()
}

/// The conditions struct the companion wrote on an lb_endpoint.
fn conditions_struct(lb: &LbEndpoint) -> &Struct {
    &lb.metadata.as_ref().unwrap().filter_metadata[DEFAULT_NAMESPACE]
}

fn json_of(s: &Struct) -> Value {
    let fields = s
        .fields
        .iter()
        .map(|(k, v)| {
            let v = match &v.kind {
                Some(Kind::BoolValue(b)) => json!(b),
                Some(Kind::StringValue(s)) => json!(s),
                other => panic!("the companion writes booleans and strings, not {other:?}"),
            };
            (k.clone(), v)
        })
        .collect::<Map<_, _>>();
    Value::Object(fields)
}

/// The assignment as Envoy's `/config_dump?include_eds` prints it
/// (protobuf JSON: defaults left out, enums by name).
fn config_dump(cla: &ClusterLoadAssignment) -> String {
    let localities: Vec<Value> = cla
        .endpoints
        .iter()
        .map(|l| {
            let lbs: Vec<Value> = l
                .lb_endpoints
                .iter()
                .map(|lb| {
                    let a: SocketAddr = addr(lb).parse().unwrap();
                    let mut e = json!({
                        "endpoint": {"address": {"socket_address": {
                            "address": a.ip().to_string(), "port_value": a.port()}}},
                        "metadata": {"filter_metadata": {
                            DEFAULT_NAMESPACE: json_of(conditions_struct(lb))}},
                        "load_balancing_weight": 1,
                    });
                    let health = HealthStatus::try_from(lb.health_status).unwrap();
                    if health != HealthStatus::Unknown {
                        e["health_status"] = json!(health.as_str_name());
                    }
                    e
                })
                .collect();
            let mut locality = json!({"lb_endpoints": lbs});
            if let Some(zone) = l.locality.as_ref().map(|l| l.zone.as_str()) {
                locality["locality"] = json!({"zone": zone});
            }
            if l.priority != 0 {
                locality["priority"] = json!(l.priority);
            }
            locality
        })
        .collect();
    json!({"configs": [{
        "@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
        "dynamic_endpoint_configs": [{"endpoint_config": {
            "cluster_name": cla.cluster_name, "endpoints": localities}}]
    }]})
    .to_string()
}

/// The assignment as Envoy's host callbacks answer it: one host list per
/// priority (Envoy requires them contiguous from 0), the healthy list those
/// of EDS status HEALTHY or UNKNOWN.
fn hosts(cla: &ClusterLoadAssignment) -> FakeCluster {
    let mut cluster = FakeCluster::default();
    for l in &cla.endpoints {
        let p = l.priority as usize;
        if cluster.priorities.len() <= p {
            cluster.priorities.resize(p + 1, Vec::new());
        }
        for lb in &l.lb_endpoints {
            let mut host = FakeHost::new(&addr(lb));
            if lb.health_status == HealthStatus::Unhealthy as i32 {
                host = host.not_offered();
                assert_eq!(host.health, HostHealth::Unhealthy);
            }
            if let Some(zone) = l.locality.as_ref().map(|l| l.zone.as_str()) {
                host = host.zone(zone);
            }
            for (k, v) in &conditions_struct(lb).fields {
                let ns = DEFAULT_NAMESPACE.to_string();
                match &v.kind {
                    Some(Kind::BoolValue(b)) => host.bools.push((ns, k.clone(), *b)),
                    Some(Kind::StringValue(s)) => host.strings.push((ns, k.clone(), s.clone())),
                    other => panic!("unexpected value {other:?}"),
                }
            }
            cluster.priorities[p].push(host);
        }
    }
    cluster
}

/// The wasm shell's plan: (tier, planned addresses).
fn wasm_reads(cla: &ClusterLoadAssignment) -> (Tier, BTreeSet<String>) {
    let dump = parse_config_dump(config_dump(cla).as_bytes(), DEFAULT_NAMESPACE).unwrap();
    assert!(dump.notes.is_empty(), "{:?}", dump.notes);
    let [cluster] = dump.clusters.as_slice() else {
        panic!("one cluster: {:?}", dump.clusters);
    };
    let plan = plan_cluster_at(cluster, None, None);
    (
        plan.tier,
        plan.hosts.into_iter().map(|h| h.address).collect(),
    )
}

/// The native shell's table: (tier, addresses it can pick).
fn native_reads(cla: &ClusterLoadAssignment) -> (Tier, BTreeSet<String>) {
    let cluster = hosts(cla);
    let built = build(&cluster, &SelectionConfig::default());
    let picked = (0..built.table.len() as u64 * 4)
        .filter_map(|s| match built.table.choose(s, 0, |_| false) {
            Choice::Host { slot, .. } => Some(
                cluster
                    .healthy_address(slot.priority, slot.healthy_index as usize)
                    .unwrap()
                    .to_string(),
            ),
            Choice::NoServing => None,
        })
        .collect();
    (built.table.tier, picked)
}

fn any_condition() -> impl Strategy<Value = Option<bool>> {
    prop_oneof![Just(None), Just(Some(true)), Just(Some(false))]
}

fn any_name() -> impl Strategy<Value = Option<Arc<str>>> {
    prop_oneof![
        Just(None),
        Just(Some(Arc::from("zone-a"))),
        Just(Some(Arc::from("zone-a,zone-b"))),
    ]
}

/// A slice endpoint: any conditions (nil or not), any topology.
fn any_slice_endpoint() -> impl Strategy<Value = SliceEndpoint> {
    (
        (any_condition(), any_condition(), any_condition()),
        (any_name(), any_name(), any_name(), any_name()),
    )
        .prop_map(
            |((ready, serving, terminating), (zone, node_name, hints_zones, hints_nodes))| {
                SliceEndpoint {
                    address: [10, 0, 0, 1].into(),
                    ready,
                    serving,
                    terminating,
                    zone,
                    node_name,
                    hints_zones,
                    hints_nodes,
                }
            },
        )
}

/// What the companion writes for these endpoints (one per address).
fn written(eps: &[SliceEndpoint], priorities: bool) -> (Vec<Endpoint>, ClusterLoadAssignment) {
    let endpoints: Vec<Endpoint> = eps
        .iter()
        .zip(1u8..)
        .map(|(ep, i)| {
            let ep = SliceEndpoint {
                address: [10, 0, 0, i].into(),
                ..ep.clone()
            };
            Endpoint::new(&ep, 8080)
        })
        .collect();
    let out = Output::with_tiers(priorities);
    let cla = cluster_load_assignment("backend", &endpoints, &out);
    (endpoints, cla)
}

proptest! {
    #[test]
    fn every_endpoint_is_in_the_same_tier_for_the_writer_and_both_readers(
        eps in prop::collection::vec(any_slice_endpoint(), 1..8),
        priorities in any::<bool>(),
    ) {
        let (endpoints, cla) = written(&eps, priorities);
        // Each endpoint alone: its tier as the contract has it, as the
        // companion's priority and as Envoy Gateway's drain rule see it.
        for (ep, endpoint) in eps.iter().zip(&endpoints) {
            let tier = endpoint.conditions.tier();
            let (_, cla) = written(std::slice::from_ref(ep), priorities);
            prop_assert_eq!(wasm_reads(&cla).0, tier, "wasm, {:?}", ep);
            prop_assert_eq!(native_reads(&cla).0, tier, "native, {:?}", ep);
            prop_assert_eq!(endpoint.conditions.eg_would_drain(), tier != Tier::Ready);
            if priorities {
                let at: Vec<u32> = cla.endpoints.iter().map(|l| l.priority).collect();
                prop_assert_eq!(at, tier.priority().into_iter().collect::<Vec<_>>());
            }
        }
        // All of them: the best tier, and exactly its hosts, for both readers.
        let best = endpoints.iter().map(|e| e.conditions.tier()).min_by_key(|t| *t as u8).unwrap();
        let in_best: BTreeSet<String> = endpoints
            .iter()
            .filter(|e| e.conditions.tier() == best && best != Tier::NoServing)
            .map(|e| e.addr.to_string())
            .collect();
        let wasm = wasm_reads(&cla);
        prop_assert_eq!(&wasm, &(best, in_best));
        prop_assert_eq!(native_reads(&cla), wasm);
    }
}
