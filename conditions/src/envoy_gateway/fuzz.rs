//! The PostEndpointsModify field editor (`hook::modify`) fed fuzzed assignments: EG's own shapes
//! (one locality per backendRef, or one per zone) over managed and unmanaged Services with any
//! conditions, EG's DRAINING marks right or stale, and bytes cut or of any content. Invariants,
//! each named:
//! - `no_panic`: any bytes give an answer or `Malformed`, never a panic;
//! - `unmanaged_identical`: an assignment that names no managed Service is not rewritten (the
//!   service sends EG's bytes back);
//! - `output_decodes`: a rewritten assignment decodes as a ClusterLoadAssignment, with EG's
//!   cluster name;
//! - `endpoints_kept`: it lists every endpoint EG sent, once, none added; the tiered output
//!   leaves out only endpoints the index says are not serving, and counts them;
//! - `never_serving_where_kubernetes_says_not`: an endpoint the index says is not serving never
//!   goes out HEALTHY and never with `serving: true`.
//!
//! Short runs in `make test` (PROPTEST_CASES), long ones in `make fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::value::Kind;
use proptest::prelude::*;
use prost::Message;
use serving_picker_core::contract::MetaFlags;

use super::hook::{lb_addr, modify};
use super::prepared::PreparedIndex;
use super::testing::{eg_draining, rule_assignments, BackendRef, EgEndpoint};
use crate::eds::assignment::Output;
use crate::model::slice::{ServiceKey, Slice};
use crate::source::Change;

const MANAGED: [&str; 2] = ["web", "api"];
const PORT: u16 = 8080;

type Conds = (Option<bool>, Option<bool>, Option<bool>);
/// A backendRef: (Service: 0..=1 managed, 2 unmanaged), the endpoints EG lists (host byte and the
/// conditions its DRAINING mark comes from: stale or not), its weight.
type Ref = (usize, Vec<(u8, Conds)>, Option<u32>);

fn conds() -> impl Strategy<Value = Conds> {
    let flag = || proptest::option::of(any::<bool>());
    (flag(), flag(), flag())
}

fn svc(name: &str) -> ServiceKey {
    ServiceKey {
        namespace: "shop".into(),
        name: name.into(),
    }
}

/// A slice of `service` read from kubectl JSON, as every source reads slices.
fn slice(service: &str, eps: &[(u8, Conds)]) -> Slice {
    let obj = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-1"), "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
        "endpoints": eps.iter().map(|(host, (r, s, t))| serde_json::json!({
            "addresses": [format!("10.0.0.{host}")], "zone": "zone-a",
            "conditions": {"ready": r, "serving": s, "terminating": t}
        })).collect::<Vec<_>>(),
    });
    Slice::from_k8s(&serde_json::from_value(obj).unwrap())
        .unwrap()
        .0
}

#[derive(Clone, Debug)]
struct Case {
    /// Per managed Service: its slice endpoints (host byte, conditions).
    slices: Vec<Vec<(u8, Conds)>>,
    /// The backendRefs.
    refs: Vec<Ref>,
    zonal: bool,
    tiered: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let eps = || proptest::collection::vec((1u8..8, conds()), 0..6);
    (
        proptest::collection::vec(eps(), MANAGED.len()),
        proptest::collection::vec((0usize..3, eps(), proptest::option::of(0u32..3)), 1..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(slices, refs, zonal, tiered)| Case {
            slices,
            refs,
            zonal,
            tiered,
        })
}

fn service_name(i: usize) -> &'static str {
    MANAGED.get(i).copied().unwrap_or("unmanaged")
}

fn build(case: &Case) -> (PreparedIndex, Vec<ClusterLoadAssignment>) {
    let mut index = PreparedIndex::new();
    let slices = case
        .slices
        .iter()
        .enumerate()
        .map(|(i, eps)| slice(MANAGED[i], eps))
        .collect();
    index.edit([Change::Replace(slices)]);
    let refs: Vec<BackendRef> = case
        .refs
        .iter()
        .map(|(service, eps, weight)| BackendRef {
            service: svc(service_name(*service)),
            port: 80,
            weight: *weight,
            endpoints: eps
                .iter()
                .map(|(host, (r, s, t))| EgEndpoint {
                    addr: SocketAddr::new([10, 0, 0, *host].into(), PORT),
                    draining: eg_draining(*r, *s, *t),
                    zone: Some(format!("zone-{}", host % 2)),
                })
                .collect(),
        })
        .collect();
    let clas = rule_assignments("shop", "app", 0, &refs, case.zonal);
    (index, clas)
}

/// What the index says of an address of a managed Service (merged copies): serving or not.
fn index_serving(case: &Case, service: usize, host: u8) -> Option<bool> {
    let eps = case.slices.get(service)?;
    let copies: Vec<bool> = eps
        .iter()
        .filter(|(h, _)| *h == host)
        .map(|(_, (r, s, t))| {
            MetaFlags {
                ready: *r,
                serving: *s,
                terminating: *t,
            }
            .resolve()
            .serving
        })
        .collect();
    (!copies.is_empty()).then(|| copies.iter().all(|s| *s))
}

/// The Service a locality's EG metadata names (`envoy-gateway.resources[0].name`).
fn locality_service(l: &LocalityLbEndpoints) -> Option<&str> {
    let resources = l
        .metadata
        .as_ref()?
        .filter_metadata
        .get("envoy-gateway")?
        .fields
        .get("resources")?;
    let Some(Kind::ListValue(list)) = &resources.kind else {
        return None;
    };
    let Some(Kind::StructValue(first)) = &list.values.first()?.kind else {
        return None;
    };
    match &first.fields.get("name")?.kind {
        Some(Kind::StringValue(name)) => Some(name.as_str()),
        _ => None,
    }
}

fn serving_metadata(lb: &LbEndpoint) -> Option<bool> {
    let fields = &lb
        .metadata
        .as_ref()?
        .filter_metadata
        .get("k8s.endpointslice")?
        .fields;
    match fields.get("serving")?.kind {
        Some(Kind::BoolValue(b)) => Some(b),
        _ => None,
    }
}

fn addresses(cla: &ClusterLoadAssignment) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for l in &cla.endpoints {
        for lb in &l.lb_endpoints {
            let a = lb_addr(lb).map_or_else(|| "?".to_string(), |a| a.to_string());
            *out.entry(a).or_default() += 1;
        }
    }
    out
}

proptest! {
    #[test]
    fn any_bytes_give_an_answer_or_malformed(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        tiered in any::<bool>(),
    ) {
        let mut index = PreparedIndex::new();
        index.edit([Change::Replace(vec![slice("web", &[(1, (Some(true), None, None))])])]);
        // no_panic
        let _ = modify(&bytes, &index, &BTreeSet::new(), &Output::with_tiers(tiered));
    }

    #[test]
    fn eg_assignments_keep_the_table(case in case(), cut in any::<prop::sample::Index>()) {
        let (index, clas) = build(&case);
        let out = Output::with_tiers(case.tiered);
        for cla in clas {
            let bytes = cla.encode_to_vec();
            // no_panic on the assignment cut anywhere.
            let _ = modify(&bytes[..cut.index(bytes.len() + 1)], &index, &BTreeSet::new(), &out);

            let names_managed = cla
                .endpoints
                .iter()
                .any(|l| locality_service(l).is_some_and(|s| MANAGED.contains(&s)));
            let m = modify(&bytes, &index, &BTreeSet::new(), &out);
            prop_assert!(m.is_ok(), "EG's own shape is never malformed");
            let m = m.unwrap();
            let Some(edited) = m.assignment else {
                prop_assert!(!m.answer.managed, "unmanaged_identical");
                continue;
            };
            prop_assert!(names_managed, "unmanaged_identical: an assignment of no managed Service was rewritten");
            let got = ClusterLoadAssignment::decode(edited.as_slice());
            prop_assert!(got.is_ok(), "output_decodes");
            let got = got.unwrap();
            prop_assert_eq!(&got.cluster_name, &cla.cluster_name, "output_decodes");
            // endpoints_kept: all of them in the flat output; the tiered one leaves out only
            // endpoints the index says are not serving, each counted.
            let (sent, kept) = (addresses(&cla), addresses(&got));
            if case.tiered {
                let mut left_out = 0;
                for (addr, n) in &sent {
                    let k = kept.get(addr).copied().unwrap_or(0);
                    prop_assert!(k <= *n, "endpoints_kept: {} added", addr);
                    if k < *n {
                        let host = addr.parse::<SocketAddr>().ok().map(|a| match a.ip() {
                            std::net::IpAddr::V4(ip) => ip.octets()[3],
                            std::net::IpAddr::V6(_) => 0,
                        });
                        let not_serving = (0..MANAGED.len())
                            .any(|s| host.and_then(|h| index_serving(&case, s, h)) == Some(false));
                        prop_assert!(not_serving, "endpoints_kept: {} left out while serving", addr);
                        left_out += n - k;
                    }
                }
                prop_assert!(kept.keys().all(|a| sent.contains_key(a)), "endpoints_kept: one added");
                prop_assert_eq!(left_out, m.answer.dropped, "endpoints_kept: left out, uncounted");
            } else {
                prop_assert_eq!(kept, sent, "endpoints_kept");
            }
            // never_serving_where_kubernetes_says_not: per managed locality's Service.
            for l in &got.endpoints {
                let Some(service) = locality_service(l).and_then(|s| MANAGED.iter().position(|m| *m == s)) else {
                    continue;
                };
                for lb in &l.lb_endpoints {
                    let Some(addr) = lb_addr(lb) else { continue };
                    let std::net::IpAddr::V4(ip) = addr.ip() else { continue };
                    if index_serving(&case, service, ip.octets()[3]) == Some(false) {
                        prop_assert_ne!(lb.health_status, HealthStatus::Healthy as i32,
                            "never_serving_where_kubernetes_says_not: {} HEALTHY", addr);
                        prop_assert_ne!(serving_metadata(lb), Some(true),
                            "never_serving_where_kubernetes_says_not: {} serving", addr);
                    }
                }
            }
        }
    }
}
