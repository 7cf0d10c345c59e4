//! Endpoints -> Envoy's ClusterLoadAssignment (the EDS resource).
//!
//! Every lb_endpoint carries its conditions as metadata
//! (`filter_metadata[<namespace>]`) and a health status (serving HEALTHY,
//! not serving UNHEALTHY). Endpoints are grouped by priority and zone
//! (`locality.zone`), in a stable order.
//!
//! The tiered output (the default): serving and not terminating endpoints
//! are at priority 0, serving and terminating ones at priority 1, not
//! serving ones are left out, and the overprovisioning factor is so high
//! that priority 1 gets nothing while a priority-0 host is healthy. So an
//! Envoy whose picker is missing (no module, a policy that did not attach)
//! still follows KEP-1669 with its own round robin or least request, and
//! both forms read the same assignment (the tier from the metadata, the
//! priority from its locality). The flat output (`--flat-output`) puts
//! every endpoint at priority 0, not serving ones UNHEALTHY: only for an
//! Envoy that needs to see them (docs/companion.md says when).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;

use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address, HealthStatus, Locality, Metadata, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    cluster_load_assignment::Policy, lb_endpoint, ClusterLoadAssignment, Endpoint as PbEndpoint,
    LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, UInt32Value, Value};

use serving_picker_core::contract::{EdsHealth, MetadataValue};

use crate::model::endpoint::Endpoint;
use crate::model::port_view::EndpointChange;

/// Type URL of the EDS resource.
pub const CLA_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// With the tiered output: priority 1 gets load only when priority 0 has
/// no healthy host at all (Envoy's default of 140 spills early).
pub const OVERPROVISIONING_FACTOR: u32 = 100_000;

/// How endpoints are written; the same flags in both modes.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// filter_metadata namespace of the conditions.
    #[arg(long, default_value = serving_picker_core::contract::DEFAULT_NAMESPACE)]
    pub metadata_namespace: String,
    /// Accepted and ignored: the tiered output (ready endpoints at priority
    /// 0, serving+terminating at 1, not serving left out) is the default.
    #[arg(long = "priorities", conflicts_with = "flat")]
    pub priorities_flag: bool,
    /// Flat output: every endpoint at priority 0, not serving ones
    /// UNHEALTHY. An Envoy without serving-picker then spreads new requests
    /// over terminating pods too; see docs/companion.md before using it.
    #[arg(long = "flat-output")]
    pub flat: bool,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            metadata_namespace: serving_picker_core::contract::DEFAULT_NAMESPACE.to_string(),
            priorities_flag: false,
            flat: false,
        }
    }
}

impl Output {
    /// Whether the tiers go out as EDS priorities (everything but `--flat-output`).
    pub fn tiered(&self) -> bool {
        !self.flat
    }

    /// The flat output (the tests that compare both).
    #[cfg(test)]
    pub fn flat() -> Output {
        Output {
            flat: true,
            ..Output::default()
        }
    }

    /// The tiered output if `tiered`, else the flat one (the tests that run
    /// both).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_tiers(tiered: bool) -> Output {
        Output {
            flat: !tiered,
            ..Output::default()
        }
    }
}

fn value(v: &MetadataValue<'_>) -> Value {
    Value {
        kind: Some(match v {
            MetadataValue::Bool(b) => Kind::BoolValue(*b),
            MetadataValue::Str(s) => Kind::StringValue(s.to_string()),
        }),
    }
}

/// An EDS health status as Envoy's API numbers it.
pub fn health_status(h: EdsHealth) -> HealthStatus {
    match h {
        EdsHealth::Unknown => HealthStatus::Unknown,
        EdsHealth::Healthy => HealthStatus::Healthy,
        EdsHealth::Unhealthy => HealthStatus::Unhealthy,
        EdsHealth::Draining => HealthStatus::Draining,
        EdsHealth::Timeout => HealthStatus::Timeout,
        EdsHealth::Degraded => HealthStatus::Degraded,
    }
}

/// The conditions metadata struct of one endpoint.
pub fn conditions_struct(ep: &Endpoint) -> Struct {
    Struct {
        fields: ep
            .metadata_fields()
            .iter()
            .map(|(k, v)| (k.to_string(), value(v)))
            .collect(),
    }
}

/// Sets an lb_endpoint's conditions metadata and health status (other
/// metadata namespaces are kept).
pub fn set_conditions(lb: &mut LbEndpoint, ep: &Endpoint, out: &Output) {
    let md = lb.metadata.get_or_insert_with(Metadata::default);
    md.filter_metadata
        .insert(out.metadata_namespace.clone(), conditions_struct(ep));
    lb.health_status = health_status(ep.conditions.eds_health()) as i32;
}

/// One lb_endpoint.
pub fn lb_endpoint(ep: &Endpoint, out: &Output) -> LbEndpoint {
    let address = Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ep.addr.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                ep.addr.port(),
            ))),
            ..Default::default()
        })),
    };
    let mut lb = LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(PbEndpoint {
            address: Some(address),
            ..Default::default()
        })),
        ..Default::default()
    };
    set_conditions(&mut lb, ep, out);
    lb
}

/// The ClusterLoadAssignment of `cluster_name` for these endpoints (an
/// empty one when there are none: the cluster stays, with no hosts).
pub fn cluster_load_assignment(
    cluster_name: &str,
    endpoints: &[Endpoint],
    out: &Output,
) -> ClusterLoadAssignment {
    let mut groups: BTreeMap<(u32, &str), Vec<LbEndpoint>> = BTreeMap::new();
    for ep in endpoints {
        let priority = if out.tiered() {
            match ep.conditions.tier().priority() {
                Some(p) => p,
                None => continue,
            }
        } else {
            0
        };
        groups
            .entry((priority, ep.zone.as_deref().unwrap_or("")))
            .or_default()
            .push(lb_endpoint(ep, out));
    }
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints: groups
            .into_iter()
            .map(|((priority, zone), lb_endpoints)| LocalityLbEndpoints {
                locality: (!zone.is_empty()).then(|| Locality {
                    zone: zone.to_string(),
                    ..Default::default()
                }),
                lb_endpoints,
                priority,
                ..Default::default()
            })
            .collect(),
        policy: out.tiered().then(|| Policy {
            overprovisioning_factor: Some(UInt32Value {
                value: OVERPROVISIONING_FACTOR,
            }),
            ..Default::default()
        }),
        named_endpoints: HashMap::new(),
    }
}

/// Encodes assignments straight to protobuf bytes, endpoint by endpoint:
/// each endpoint's lb_endpoint is encoded when it changes and kept, in its
/// (priority, zone) group, so that a change to one slice of a
/// 10,000-endpoint Service encodes only the endpoints that changed and
/// copies the others' bytes once. The bytes decode to exactly what
/// `cluster_load_assignment` builds for the endpoints the changes lead to.
#[derive(Debug, Default)]
pub struct Encoder {
    groups: BTreeMap<GroupKey, Group>,
}

/// (priority, zone): the order of LocalityLbEndpoints. No zone sorts first,
/// as "" does in `cluster_load_assignment`.
type GroupKey = (u32, Option<Arc<str>>);

/// One LocalityLbEndpoints: its own fields, and its lb_endpoints by
/// address, each encoded as a whole field (key, length, message).
#[derive(Debug)]
struct Group {
    head: Vec<u8>,
    lbs: BTreeMap<SocketAddr, Vec<u8>>,
    /// Encoded length of the message (head and every lb_endpoint field).
    len: usize,
}

fn field_len(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

fn push_field(buf: &mut Vec<u8>, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Where an endpoint is written; `None`: left out (the tiered output
/// leaves out not serving endpoints).
fn group_of(ep: &Endpoint, out: &Output) -> Option<GroupKey> {
    let priority = if out.tiered() {
        ep.conditions.tier().priority()?
    } else {
        0
    };
    Some((priority, ep.zone.clone().filter(|z| !z.is_empty())))
}

impl Encoder {
    /// No endpoint yet.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Takes one endpoint's change (`old` must be what the encoder last
    /// took for that address); true when the assignment changed.
    pub fn apply(&mut self, change: &EndpointChange, out: &Output) -> bool {
        let old = change
            .old
            .as_ref()
            .and_then(|e| Some((e, group_of(e, out)?)));
        let new = change
            .new
            .as_ref()
            .and_then(|e| Some((e, group_of(e, out)?)));
        match (&old, &new) {
            (None, None) => return false,
            (Some((o, _)), Some((n, _))) if o == n => return false,
            _ => {}
        }
        if let Some((_, key)) = old {
            self.unplace(&key, &change.addr);
        }
        if let Some((e, key)) = new {
            self.place(key, e, out);
        }
        true
    }

    /// How many endpoints the assignment has.
    pub fn len(&self) -> usize {
        self.groups.values().map(|g| g.lbs.len()).sum()
    }

    /// No endpoint.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    fn unplace(&mut self, key: &GroupKey, addr: &SocketAddr) {
        let Some(g) = self.groups.get_mut(key) else {
            return;
        };
        if let Some(bytes) = g.lbs.remove(addr) {
            g.len -= bytes.len();
        }
        if g.lbs.is_empty() {
            self.groups.remove(key);
        }
    }

    fn place(&mut self, key: GroupKey, ep: &Endpoint, out: &Output) {
        let lb = lb_endpoint(ep, out);
        let len = lb.encoded_len();
        let mut bytes = Vec::with_capacity(field_len(len));
        push_field(&mut bytes, 2, len);
        lb.encode_raw(&mut bytes);
        let g = self
            .groups
            .entry(key)
            .or_insert_with_key(|(priority, zone)| {
                let head = LocalityLbEndpoints {
                    locality: zone.as_ref().map(|zone| Locality {
                        zone: zone.to_string(),
                        ..Default::default()
                    }),
                    priority: *priority,
                    ..Default::default()
                }
                .encode_to_vec();
                Group {
                    len: head.len(),
                    head,
                    lbs: BTreeMap::new(),
                }
            });
        g.len += bytes.len();
        if let Some(old) = g.lbs.insert(ep.addr, bytes) {
            g.len -= old.len();
        }
    }

    /// The encoded ClusterLoadAssignment of the endpoints last taken.
    pub fn assemble(&self, cluster_name: &str, out: &Output) -> Vec<u8> {
        let shell = ClusterLoadAssignment {
            cluster_name: cluster_name.to_string(),
            policy: out.tiered().then(|| Policy {
                overprovisioning_factor: Some(UInt32Value {
                    value: OVERPROVISIONING_FACTOR,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let total = shell.len()
            + self
                .groups
                .values()
                .map(|g| field_len(g.len))
                .sum::<usize>();
        let mut cla = Vec::with_capacity(total);
        cla.extend_from_slice(&shell);
        for g in self.groups.values() {
            push_field(&mut cla, 2, g.len);
            cla.extend_from_slice(&g.head);
            for lb in g.lbs.values() {
                cla.extend_from_slice(lb);
            }
        }
        cla
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serving_picker_core::contract::SliceConditions;

    fn ep(
        addr: &str,
        ready: bool,
        serving: bool,
        terminating: bool,
        zone: Option<&str>,
    ) -> Endpoint {
        Endpoint {
            addr: addr.parse().unwrap(),
            conditions: SliceConditions {
                ready,
                serving,
                terminating,
            },
            zone: zone.map(Into::into),
            node_name: Some("node-1".into()),
            hints_zones: Some("z1,z2".into()),
            hints_nodes: None,
        }
    }

    fn md<'a>(lb: &'a LbEndpoint, key: &str) -> Option<&'a Kind> {
        lb.metadata.as_ref()?.filter_metadata["k8s.endpointslice"]
            .fields
            .get(key)?
            .kind
            .as_ref()
    }

    fn addr(lb: &LbEndpoint) -> String {
        match &lb.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(e)) => match &e.address {
                Some(Address {
                    address: Some(address::Address::SocketAddress(sa)),
                }) => match sa.port_specifier {
                    Some(socket_address::PortSpecifier::PortValue(p)) => {
                        format!("{}:{p}", sa.address)
                    }
                    _ => panic!("no port"),
                },
                _ => panic!("no address"),
            },
            _ => panic!("no endpoint"),
        }
    }

    #[test]
    fn metadata_and_health() {
        let out = Output::flat();
        let lb = lb_endpoint(&ep("10.0.0.1:80", false, true, true, Some("z1")), &out);
        assert_eq!(addr(&lb), "10.0.0.1:80");
        assert_eq!(md(&lb, "ready"), Some(&Kind::BoolValue(false)));
        assert_eq!(md(&lb, "serving"), Some(&Kind::BoolValue(true)));
        assert_eq!(md(&lb, "terminating"), Some(&Kind::BoolValue(true)));
        assert_eq!(md(&lb, "zone"), Some(&Kind::StringValue("z1".into())));
        assert_eq!(
            md(&lb, "node_name"),
            Some(&Kind::StringValue("node-1".into()))
        );
        assert_eq!(
            md(&lb, "hints_zones"),
            Some(&Kind::StringValue("z1,z2".into()))
        );
        assert_eq!(md(&lb, "hints_nodes"), None);
        assert_eq!(lb.health_status, HealthStatus::Healthy as i32);
        let lb = lb_endpoint(&ep("10.0.0.1:80", false, false, true, None), &out);
        assert_eq!(lb.health_status, HealthStatus::Unhealthy as i32);
        assert_eq!(md(&lb, "zone"), None);
    }

    #[test]
    fn grouped_by_zone_all_at_priority_0_with_the_flat_output() {
        let eps = vec![
            ep("10.0.0.1:80", true, true, false, Some("z2")),
            ep("10.0.0.2:80", false, true, true, Some("z1")),
            ep("10.0.0.3:80", false, false, false, None),
        ];
        let cla = cluster_load_assignment("backend", &eps, &Output::flat());
        assert_eq!(cla.cluster_name, "backend");
        assert!(cla.policy.is_none());
        let zones: Vec<(u32, String, usize)> = cla
            .endpoints
            .iter()
            .map(|g| {
                (
                    g.priority,
                    g.locality
                        .as_ref()
                        .map(|l| l.zone.clone())
                        .unwrap_or_default(),
                    g.lb_endpoints.len(),
                )
            })
            .collect();
        assert_eq!(
            zones,
            vec![(0, "".into(), 1), (0, "z1".into(), 1), (0, "z2".into(), 1)]
        );
    }

    #[test]
    fn encoder_bytes_decode_to_the_built_assignment_across_changes() {
        /// Feeds the encoder the changes from `was` to `now`.
        fn take(enc: &mut Encoder, was: &[Endpoint], now: &[Endpoint], out: &Output) -> bool {
            let by_addr = |v: &[Endpoint]| -> BTreeMap<SocketAddr, Endpoint> {
                v.iter().map(|e| (e.addr, e.clone())).collect()
            };
            let (was, now) = (by_addr(was), by_addr(now));
            let addrs: std::collections::BTreeSet<&SocketAddr> =
                was.keys().chain(now.keys()).collect();
            let mut changed = false;
            for addr in addrs {
                let (old, new) = (was.get(addr).cloned(), now.get(addr).cloned());
                if old != new {
                    changed |= enc.apply(
                        &EndpointChange {
                            addr: *addr,
                            old,
                            new,
                        },
                        out,
                    );
                }
            }
            changed
        }
        for priorities in [false, true] {
            let out = Output::with_tiers(priorities);
            let mut eps = vec![
                ep("10.0.0.1:80", true, true, false, Some("z2")),
                ep("10.0.0.2:80", false, true, true, Some("z1")),
                ep("10.0.0.3:80", false, false, false, None),
                ep("10.0.0.4:80", true, true, false, None),
            ];
            let mut enc = Encoder::new();
            assert!(take(&mut enc, &[], &eps, &out));
            for step in 0..4 {
                let bytes = enc.assemble("backend", &out);
                let decoded = ClusterLoadAssignment::decode(bytes.as_slice()).unwrap();
                assert_eq!(
                    decoded,
                    cluster_load_assignment("backend", &eps, &out),
                    "step {step}, priorities {priorities}"
                );
                let kept = eps
                    .iter()
                    .filter(|e| !priorities || e.conditions.serving)
                    .count();
                assert_eq!(enc.len(), kept);
                // Change one endpoint, drop one, add one.
                let was = eps.clone();
                eps[step % 3].conditions.serving = !eps[step % 3].conditions.serving;
                eps.pop();
                eps.push(ep(
                    &format!("10.0.1.{step}:80"),
                    true,
                    true,
                    false,
                    Some("z1"),
                ));
                assert!(take(&mut enc, &was, &eps, &out));
            }
            // A left-out endpoint changes: the assignment does not, with
            // the priority output.
            let was = eps.clone();
            eps.push(ep("10.0.2.1:80", false, false, false, Some("z1")));
            assert_eq!(take(&mut enc, &was, &eps, &out), !priorities);
            let was = eps.clone();
            eps.pop();
            eps.push(ep("10.0.2.1:80", false, false, true, Some("z9")));
            assert_eq!(take(&mut enc, &was, &eps, &out), !priorities);
            let bytes = enc.assemble("backend", &out);
            assert_eq!(
                ClusterLoadAssignment::decode(bytes.as_slice()).unwrap(),
                cluster_load_assignment("backend", &eps, &out)
            );
            // Everything goes: an empty assignment.
            assert!(take(&mut enc, &eps, &[], &out));
            assert!(enc.is_empty());
            assert_eq!(
                ClusterLoadAssignment::decode(enc.assemble("backend", &out).as_slice()).unwrap(),
                cluster_load_assignment("backend", &[], &out)
            );
        }
    }

    #[test]
    fn priorities_is_accepted_and_the_flat_output_is_a_flag_of_its_own() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            output: Output,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.output);
        assert!(parse(&["x"]).unwrap().tiered());
        assert!(parse(&["x", "--priorities"]).unwrap().tiered());
        assert!(!parse(&["x", "--flat-output"]).unwrap().tiered());
        assert!(parse(&["x", "--priorities", "--flat-output"]).is_err());
    }

    #[test]
    fn tiered_output_by_default() {
        let out = Output::default();
        assert!(out.tiered());
        let eps = vec![
            ep("10.0.0.1:80", true, true, false, None),
            ep("10.0.0.2:80", false, true, true, None),
            ep("10.0.0.3:80", false, false, true, None),
            ep("10.0.0.4:80", false, false, false, None),
        ];
        let cla = cluster_load_assignment("backend", &eps, &out);
        let got: Vec<(u32, Vec<String>)> = cla
            .endpoints
            .iter()
            .map(|g| (g.priority, g.lb_endpoints.iter().map(addr).collect()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec!["10.0.0.1:80".to_string()]),
                (1, vec!["10.0.0.2:80".to_string()])
            ]
        );
        assert_eq!(
            cla.policy.unwrap().overprovisioning_factor.unwrap().value,
            OVERPROVISIONING_FACTOR
        );
        // No endpoint: an empty assignment, not a missing one.
        let empty = cluster_load_assignment("backend", &[], &out);
        assert!(empty.endpoints.is_empty());
        assert_eq!(empty.cluster_name, "backend");
    }
}
