//! The native form on Envoy Gateway without an EnvoyPatchPolicy: the
//! PostTranslateModify hook puts the dynamic-module load-balancing policy on
//! exactly the clusters whose endpoints the companion wrote.
//!
//! **Which clusters.** EG hands PostTranslateModify its Clusters, but no
//! ClusterLoadAssignment and nothing that names a Service (a cluster's
//! `envoy-gateway` metadata names the route). The Services are in the
//! assignments, which the same translation hands to PostEndpointsModify
//! first: EG's `Translate` builds every cluster with `addXdsCluster`, which
//! calls PostEndpointsModify for each EDS assignment, and calls
//! PostTranslateModify once at the end (envoyproxy/gateway@v1.9.0
//! `internal/xds/translator/translator.go`, `extension.go`; the same at
//! v1.8.3). So every PostEndpointsModify answer leaves a **verdict** for its
//! cluster name, and PostTranslateModify sets the policy on an EDS cluster
//! (named by its `eds_cluster_config.service_name`, else its name) whose
//! verdict, recorded on the same connection since its last
//! PostTranslateModify (`verdicts`: the same translation), says yes, and
//! whose load balancer is EG's default (`team_policy`: a team's
//! BackendTrafficPolicy is never replaced). A cluster is eligible when the
//! hook wrote its whole assignment:
//! - every locality names a managed Service (no unmanaged Service, no
//!   `Backend`, no locality without EG's metadata), and all of them one
//!   backendRef: the module balances by host weight, so backendRef weights
//!   between several backends would be lost;
//! - every endpoint carries the index's conditions (no doubt left as EG
//!   sent it: the module cannot pick a DRAINING host);
//! - the answer was the edited one (not EG's own sent back over a limit,
//!   before the first list, or too big).
//!
//! Anything else keeps EG's policy, which with the tiered output follows the
//! behaviour table too: a missing verdict costs the module's extras
//! (topology hints, instant changes). The module never lands on an
//! assignment the companion did not write in the same translation
//! (`verdicts`; tests: `verdicts::tests`, `conditions/tests/eg_translate.rs`
//! `a_verdict_counts_only_for_the_translation_on_its_connection`,
//! `a_call_refused_over_a_limit_leaves_no_verdict`).
//!
//! **On the wire.** EG takes the answer's lists as the final ones
//! (`processExtensionPostTranslationHook`): a cluster missing from the answer
//! is a cluster removed. So every resource comes back, in order, byte for
//! byte, but the `load_balancing_policy` of the clusters set (and their
//! `common_lb_config.override_host_status`, when EG left it unset: the set
//! envoy-sessions.yaml ships). A request with a field this version does not
//! know is refused (an error: EG with `failOpen` keeps its own resources)
//! rather than answered without it.

use bytes::{Buf, BufMut, Bytes};
use envoy_types::pb::envoy::config::cluster::v3::{
    cluster::CommonLbConfig, load_balancing_policy, LoadBalancingPolicy,
};
use envoy_types::pb::envoy::config::core::v3::{
    HealthStatus, HealthStatusSet, TypedExtensionConfig,
};
use envoy_types::pb::envoy::extensions::dynamic_modules::v3::DynamicModuleConfig;
use envoy_types::pb::envoy::extensions::load_balancing_policies::dynamic_modules::v3::DynamicModulesLoadBalancerConfig;
use envoy_types::pb::google::protobuf::{Any, StringValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

use super::field_edit::{fields, len_field_size, put_len_head, Malformed};
use super::hook::Answer;
use super::team_policy::{self, Shape};
use crate::telemetry::metric_group;
use crate::telemetry::metrics::Labels;

/// The dynamic-module load-balancing policy's extension name.
pub const POLICY_EXTENSION: &str = "envoy.load_balancing_policies.dynamic_modules";
/// The module (`lib<name>.so` in `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`) and
/// its policy name.
pub const MODULE_NAME: &str = "serving_picker";
/// Cluster verdicts remembered at most (`--native-lb-max-clusters`).
pub const DEFAULT_MAX_VERDICTS: usize = 65_536;

// Field numbers (envoy.config.cluster.v3.Cluster and its messages).
const CLUSTER_NAME: u32 = 1;
const CLUSTER_TYPE: u32 = 2;
const CLUSTER_EDS_CONFIG: u32 = 3;
const CLUSTER_COMMON_LB_CONFIG: u32 = 27;
const CLUSTER_LOAD_BALANCING_POLICY: u32 = 41;
const EDS_SERVICE_NAME: u32 = 2;
const DISCOVERY_TYPE_EDS: u64 = 3;
const COMMON_ZONE_AWARE: u32 = 2;
const COMMON_LOCALITY_WEIGHTED: u32 = 3;
const COMMON_CONSISTENT_HASHING: u32 = 7;
const COMMON_OVERRIDE_HOST_STATUS: u32 = 8;

/// Whether a PostEndpointsModify answer leaves its cluster eligible for
/// the native policy (module doc).
pub fn eligible(answer: &Answer) -> bool {
    answer.managed && answer.not_services == 0 && answer.backends == 1 && answer.doubts.is_empty()
}

/// The fields the hook writes on an eligible cluster, encoded once.
#[derive(Clone, Debug)]
pub struct NativePolicy {
    /// Cluster field `load_balancing_policy`, key and length included.
    load_balancing_policy: Vec<u8>,
    /// Cluster field `common_lb_config` holding only `override_host_status`.
    override_host_status: Vec<u8>,
}

impl NativePolicy {
    /// The module's policy reading conditions from `metadata_namespace`.
    pub fn new(metadata_namespace: &str) -> NativePolicy {
        let config = serde_json::json!({ "metadata_namespace": metadata_namespace }).to_string();
        let module = DynamicModulesLoadBalancerConfig {
            dynamic_module_config: Some(DynamicModuleConfig {
                name: MODULE_NAME.to_string(),
                ..Default::default()
            }),
            lb_policy_name: MODULE_NAME.to_string(),
            lb_policy_config: Some(Any {
                type_url: "type.googleapis.com/google.protobuf.StringValue".to_string(),
                value: StringValue { value: config }.encode_to_vec(),
            }),
        };
        let policy = LoadBalancingPolicy {
            policies: vec![load_balancing_policy::Policy {
                typed_extension_config: Some(TypedExtensionConfig {
                    name: POLICY_EXTENSION.to_string(),
                    typed_config: Some(Any {
                        type_url: "type.googleapis.com/envoy.extensions.load_balancing_policies.dynamic_modules.v3.DynamicModulesLoadBalancerConfig".to_string(),
                        value: module.encode_to_vec(),
                    }),
                }),
            }],
        };
        let statuses = CommonLbConfig {
            override_host_status: Some(HealthStatusSet {
                statuses: vec![HealthStatus::Unknown as i32, HealthStatus::Healthy as i32],
            }),
            ..Default::default()
        };
        NativePolicy {
            load_balancing_policy: field(CLUSTER_LOAD_BALANCING_POLICY, &policy.encode_to_vec()),
            override_host_status: field(CLUSTER_COMMON_LB_CONFIG, &statuses.encode_to_vec()),
        }
    }
}

fn field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(len_field_size(number, payload.len()));
    put_len_head(&mut out, number, payload.len());
    out.extend_from_slice(payload);
    out
}

/// What happened to one cluster of a PostTranslateModify call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterOutcome {
    /// The native policy written.
    Set,
    /// Its assignment was not wholly the companion's (module doc).
    NotEligible,
    /// No fresh verdict: EG did not ask about its assignment lately.
    NoVerdict,
    /// Not an EDS cluster (DNS, static, dynamic forward proxy): never ours.
    NotEds,
    /// Its load balancer is not EG's default: a team set it (`team_policy`).
    TeamPolicy(Shape),
    /// EG's `common_lb_config` has a locality or hashing setting that
    /// cannot go with a `load_balancing_policy`: left as EG wrote it.
    Unexpected,
    /// It does not decode: left as EG sent it.
    Undecodable,
}

impl ClusterOutcome {
    /// Every outcome, in the order the metric's label values are created.
    pub const ALL: [ClusterOutcome; 7] = [
        ClusterOutcome::Set,
        ClusterOutcome::NotEligible,
        ClusterOutcome::NoVerdict,
        ClusterOutcome::NotEds,
        ClusterOutcome::TeamPolicy(Shape::Other),
        ClusterOutcome::Unexpected,
        ClusterOutcome::Undecodable,
    ];

    /// The `outcome` label value of `eg_native_lb_clusters_total`.
    pub fn name(self) -> &'static str {
        match self {
            ClusterOutcome::Set => "set",
            ClusterOutcome::NotEligible => "not_eligible",
            ClusterOutcome::NoVerdict => "no_verdict",
            ClusterOutcome::NotEds => "not_eds",
            ClusterOutcome::TeamPolicy(_) => "team_policy",
            ClusterOutcome::Unexpected => "unexpected_lb_config",
            ClusterOutcome::Undecodable => "undecodable",
        }
    }
}

/// The name a cluster's assignment goes by: `eds_cluster_config.service_name`,
/// else the cluster's name; `None` for a cluster that is not EDS.
fn assignment_name(cluster: &[u8]) -> Result<Option<String>, Malformed> {
    let (mut name, mut service_name, mut eds) = (None, None, false);
    for f in fields(cluster) {
        let f = f?;
        match (f.number, f.wire_type) {
            (CLUSTER_NAME, WireType::LengthDelimited) => name = Some(f.payload),
            (CLUSTER_TYPE, WireType::Varint) => eds = f.varint == DISCOVERY_TYPE_EDS,
            (CLUSTER_EDS_CONFIG, WireType::LengthDelimited) => {
                for g in fields(f.payload) {
                    let g = g?;
                    if g.number == EDS_SERVICE_NAME && g.wire_type == WireType::LengthDelimited {
                        service_name = Some(g.payload);
                    }
                }
            }
            (CLUSTER_NAME | CLUSTER_TYPE | CLUSTER_EDS_CONFIG, _) => return Err(Malformed),
            _ => {}
        }
    }
    if !eds {
        return Ok(None);
    }
    let chosen = service_name.filter(|s| !s.is_empty()).or(name);
    let text = std::str::from_utf8(chosen.unwrap_or_default()).map_err(|_| Malformed)?;
    Ok(Some(text.to_string()))
}

/// The name of the encoded cluster `cluster` (empty when it has none or
/// does not decode), cut to 256 characters.
pub fn cluster_name(cluster: &[u8]) -> String {
    fields(cluster)
        .flatten()
        .find(|f| f.number == CLUSTER_NAME && f.wire_type == WireType::LengthDelimited)
        .map(|f| {
            String::from_utf8_lossy(f.payload)
                .chars()
                .take(256)
                .collect()
        })
        .unwrap_or_default()
}

/// The cluster with the native policy, if its load balancer is EG's default
/// and `verdict` (by assignment name) says so; `None`: unchanged (send
/// EG's bytes).
pub fn apply(
    cluster: &[u8],
    verdict: impl Fn(&str) -> Option<bool>,
    policy: &NativePolicy,
) -> (Option<Vec<u8>>, ClusterOutcome) {
    let name = match assignment_name(cluster) {
        Err(Malformed) => return (None, ClusterOutcome::Undecodable),
        Ok(None) => return (None, ClusterOutcome::NotEds),
        Ok(Some(name)) => name,
    };
    match team_policy::shape(cluster) {
        Shape::Default => {}
        team => return (None, ClusterOutcome::TeamPolicy(team)),
    }
    match verdict(&name) {
        None => return (None, ClusterOutcome::NoVerdict),
        Some(false) => return (None, ClusterOutcome::NotEligible),
        Some(true) => {}
    }
    let mut has_statuses = false;
    for f in fields(cluster).flatten() {
        if f.number != CLUSTER_COMMON_LB_CONFIG {
            continue;
        }
        for g in fields(f.payload) {
            let Ok(g) = g else {
                return (None, ClusterOutcome::Undecodable);
            };
            match g.number {
                COMMON_ZONE_AWARE | COMMON_LOCALITY_WEIGHTED | COMMON_CONSISTENT_HASHING => {
                    return (None, ClusterOutcome::Unexpected)
                }
                COMMON_OVERRIDE_HOST_STATUS => has_statuses = true,
                _ => {}
            }
        }
    }
    let mut out = Vec::with_capacity(
        cluster.len() + policy.load_balancing_policy.len() + policy.override_host_status.len(),
    );
    for f in fields(cluster).flatten() {
        if f.number != CLUSTER_LOAD_BALANCING_POLICY {
            out.extend_from_slice(f.raw);
        }
    }
    out.extend_from_slice(&policy.load_balancing_policy);
    if !has_statuses {
        // A second occurrence of an embedded message merges into the first.
        out.extend_from_slice(&policy.override_host_status);
    }
    (Some(out), ClusterOutcome::Set)
}

/// `PostTranslateModifyRequest` as the server takes it: every resource as
/// its encoded bytes, and the numbers of any field this version does not
/// know (a resource list EG added would otherwise be answered empty, which
/// EG would take as "remove them all").
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawPostTranslateModifyRequest {
    /// PostTranslateExtensionContext, encoded.
    pub post_translate_context: Option<Bytes>,
    /// envoy.config.cluster.v3.Cluster, each encoded.
    pub clusters: Vec<Bytes>,
    /// envoy.extensions.transport_sockets.tls.v3.Secret, each encoded.
    pub secrets: Vec<Bytes>,
    /// envoy.config.listener.v3.Listener, each encoded.
    pub listeners: Vec<Bytes>,
    /// envoy.config.route.v3.RouteConfiguration, each encoded.
    pub routes: Vec<Bytes>,
    /// Field numbers not in EG's message as read (v1.8 and v1.9).
    pub unknown_fields: Vec<u32>,
}

impl Message for RawPostTranslateModifyRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        use prost::encoding::bytes;
        if let Some(c) = &self.post_translate_context {
            bytes::encode(1, c, buf);
        }
        bytes::encode_repeated(2, &self.clusters, buf);
        bytes::encode_repeated(3, &self.secrets, buf);
        bytes::encode_repeated(4, &self.listeners, buf);
        bytes::encode_repeated(5, &self.routes, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        use prost::encoding::bytes;
        match tag {
            1 => bytes::merge(
                wire_type,
                self.post_translate_context.get_or_insert_with(Bytes::new),
                buf,
                ctx,
            ),
            2 => bytes::merge_repeated(wire_type, &mut self.clusters, buf, ctx),
            3 => bytes::merge_repeated(wire_type, &mut self.secrets, buf, ctx),
            4 => bytes::merge_repeated(wire_type, &mut self.listeners, buf, ctx),
            5 => bytes::merge_repeated(wire_type, &mut self.routes, buf, ctx),
            _ => {
                self.unknown_fields.push(tag);
                prost::encoding::skip_field(wire_type, tag, buf, ctx)
            }
        }
    }

    fn encoded_len(&self) -> usize {
        use prost::encoding::bytes;
        self.post_translate_context
            .as_ref()
            .map_or(0, |c| bytes::encoded_len(1, c))
            + bytes::encoded_len_repeated(2, &self.clusters)
            + bytes::encoded_len_repeated(3, &self.secrets)
            + bytes::encoded_len_repeated(4, &self.listeners)
            + bytes::encoded_len_repeated(5, &self.routes)
    }

    fn clear(&mut self) {
        *self = RawPostTranslateModifyRequest::default();
    }
}

metric_group! {
    /// PostTranslateModify's metrics (prefix `serving_picker_conditions_eg_`).
    #[derive(Clone)]
    pub struct NativeLbMetrics {
        calls: Family<Labels, Counter> = ("eg_translate_calls", "PostTranslateModify calls, by result (modified, unchanged; disabled: \
             --native-lb-policy off, every resource sent back; refused: a field this version does not know; \
             over_calls, over_bytes, answer_too_big: every resource sent back)"),
        clusters: Family<Labels, Counter> = ("eg_native_lb_clusters", "Clusters of PostTranslateModify calls, by outcome (set, not_eligible, \
             no_verdict, not_eds, team_policy: a load balancer other than Envoy Gateway's default, kept; unexpected_lb_config, undecodable)"),
        team_policies: Family<Labels, Counter> = ("eg_native_lb_team_policies", "Clusters of PostTranslateModify calls that keep the load balancer \
             a BackendTrafficPolicy (or a Service's topology setting) gave them, by shape (slow_start, prefer_local, round_robin, random, \
             maglev, ring_hash, backend_utilization, endpoint_override, panic_threshold, least_request_settings, other)"),
        verdicts: Gauge = ("eg_native_lb_verdicts", "Cluster verdicts PostEndpointsModify left for PostTranslateModify (limit: eg_native_lb_max_verdicts)"),
        max_verdicts: Gauge = ("eg_native_lb_max_verdicts", "Cluster verdicts remembered at most (--native-lb-max-clusters); \
             a cluster over it keeps Envoy Gateway's policy"),
        verdicts_refused: Counter = ("eg_native_lb_verdicts_refused", "Verdicts not remembered: the table was full (count or bytes)"),
        verdict_bytes: Gauge = ("eg_native_lb_verdict_bytes", "Bytes the verdicts waiting for PostTranslateModify count for (limit: eg_native_lb_max_verdict_bytes)"),
        max_verdict_bytes: Gauge = ("eg_native_lb_max_verdict_bytes", "Bytes the verdicts may hold (--native-lb-max-verdict-bytes); \
             a verdict over it is not kept and its cluster keeps Envoy Gateway's policy"),
        verdict_connections: Gauge = ("eg_native_lb_verdict_connections", "Connections with verdicts waiting for their PostTranslateModify"),
        verdict_keys_too_long: Counter = ("eg_native_lb_verdict_keys_too_long", "Verdicts not kept: the cluster name is over 1 KiB"),
    }
}

/// The `result` label values of `eg_translate_calls_total`.
pub const CALL_RESULTS: [&str; 7] = [
    "modified",
    "unchanged",
    "disabled",
    "refused",
    "over_calls",
    "over_bytes",
    "answer_too_big",
];

impl NativeLbMetrics {
    /// Every label value from 0 (an alert on increase() sees the first).
    pub fn zero(&self) {
        for result in CALL_RESULTS {
            drop(self.calls.get_or_create(&vec![("result", result)]));
        }
        for o in ClusterOutcome::ALL {
            drop(self.clusters.get_or_create(&vec![("outcome", o.name())]));
        }
        for shape in Shape::TEAM {
            drop(
                self.team_policies
                    .get_or_create(&vec![("shape", shape.name())]),
            );
        }
    }

    /// `n` clusters of a call kept a team's load balancer of `shape`.
    pub fn team_policy(&self, shape: Shape, n: u64) {
        if n > 0 {
            self.team_policies
                .get_or_create(&vec![("shape", shape.name())])
                .inc_by(n);
        }
    }

    /// One call with `result` (`eg_translate_calls_total`).
    pub fn call(&self, result: &'static str) {
        self.calls.get_or_create(&vec![("result", result)]).inc();
    }

    /// `n` clusters of a call with `outcome`.
    pub fn cluster(&self, outcome: ClusterOutcome, n: u64) {
        if n > 0 {
            self.clusters
                .get_or_create(&vec![("outcome", outcome.name())])
                .inc_by(n);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
    use envoy_types::pb::envoy::config::core::v3::{config_source, ConfigSource};

    fn eg_cluster(name: &str) -> Cluster {
        Cluster {
            name: name.to_string(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(cluster::EdsClusterConfig {
                eds_config: Some(ConfigSource {
                    config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                        Default::default(),
                    )),
                    ..Default::default()
                }),
                service_name: name.to_string(),
            }),
            common_lb_config: Some(CommonLbConfig::default()),
            ignore_health_on_host_removal: true,
            load_balancing_policy: Some(LoadBalancingPolicy {
                policies: vec![load_balancing_policy::Policy {
                    typed_extension_config: Some(TypedExtensionConfig {
                        name: "envoy.load_balancing_policies.least_request".into(),
                        typed_config: Some(Any {
                            type_url: "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest".into(),
                            value: vec![],
                        }),
                    }),
                }],
            }),
            ..Default::default()
        }
    }

    fn module_config(c: &Cluster) -> DynamicModulesLoadBalancerConfig {
        let p = c.load_balancing_policy.as_ref().unwrap();
        assert_eq!(p.policies.len(), 1);
        let t = p.policies[0].typed_extension_config.as_ref().unwrap();
        assert_eq!(t.name, POLICY_EXTENSION);
        DynamicModulesLoadBalancerConfig::decode(t.typed_config.as_ref().unwrap().value.as_slice())
            .unwrap()
    }

    #[test]
    fn an_eligible_cluster_gets_the_module_and_keeps_everything_else() {
        let policy = NativePolicy::new("k8s.endpointslice");
        let mut src = eg_cluster("httproute/shop/app/rule/0").encode_to_vec();
        // A field this version of the protos does not know (111, varint 1).
        src.extend_from_slice(&[0xf8, 0x06, 0x01]);
        let (out, outcome) = apply(
            &src,
            |n| (n == "httproute/shop/app/rule/0").then_some(true),
            &policy,
        );
        assert_eq!(outcome, ClusterOutcome::Set);
        let out = out.unwrap();
        assert!(out.windows(3).any(|w| w == [0xf8, 0x06, 0x01]));
        let got = Cluster::decode(out.as_slice()).unwrap();
        let m = module_config(&got);
        assert_eq!(m.dynamic_module_config.unwrap().name, MODULE_NAME);
        assert_eq!(m.lb_policy_name, MODULE_NAME);
        let cfg = StringValue::decode(m.lb_policy_config.unwrap().value.as_slice()).unwrap();
        let cfg: serde_json::Value = serde_json::from_str(&cfg.value).unwrap();
        assert_eq!(cfg["metadata_namespace"], "k8s.endpointslice");
        assert_eq!(
            got.common_lb_config
                .clone()
                .unwrap()
                .override_host_status
                .unwrap()
                .statuses,
            vec![HealthStatus::Unknown as i32, HealthStatus::Healthy as i32]
        );
        // Everything else as EG wrote it.
        let mut expected = eg_cluster("httproute/shop/app/rule/0");
        expected.load_balancing_policy = got.load_balancing_policy.clone();
        expected.common_lb_config = got.common_lb_config.clone();
        assert_eq!(got, expected);
    }

    #[test]
    fn only_a_fresh_yes_for_an_eds_cluster_sets_it() {
        let policy = NativePolicy::new("ns");
        let src = eg_cluster("c").encode_to_vec();
        assert_eq!(
            apply(&src, |_| None, &policy),
            (None, ClusterOutcome::NoVerdict)
        );
        assert_eq!(
            apply(&src, |_| Some(false), &policy),
            (None, ClusterOutcome::NotEligible)
        );
        // Named by its EDS service name when it has one.
        let mut named = eg_cluster("c");
        if let Some(eds) = named.eds_cluster_config.as_mut() {
            eds.service_name = "assignment-c".into();
        }
        let (out, _) = apply(
            &named.encode_to_vec(),
            |n| (n == "assignment-c").then_some(true),
            &policy,
        );
        assert!(out.is_some());
        // A DNS cluster of the same name is never touched.
        let mut dns = eg_cluster("c");
        dns.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::StrictDns as i32,
        ));
        assert_eq!(
            apply(&dns.encode_to_vec(), |_| Some(true), &policy),
            (None, ClusterOutcome::NotEds)
        );
        // A locality setting that cannot go with a load_balancing_policy.
        let mut weighted = eg_cluster("c");
        weighted.common_lb_config = Some(CommonLbConfig {
            locality_config_specifier: Some(
                cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                    Default::default(),
                ),
            ),
            ..Default::default()
        });
        assert_eq!(
            apply(&weighted.encode_to_vec(), |_| Some(true), &policy),
            (None, ClusterOutcome::Unexpected)
        );
        // EG's own override set is kept.
        let mut statuses = eg_cluster("c");
        statuses.common_lb_config = Some(CommonLbConfig {
            override_host_status: Some(HealthStatusSet {
                statuses: vec![HealthStatus::Healthy as i32],
            }),
            ..Default::default()
        });
        let (out, _) = apply(&statuses.encode_to_vec(), |_| Some(true), &policy);
        let got = Cluster::decode(out.unwrap().as_slice()).unwrap();
        assert_eq!(
            got.common_lb_config
                .unwrap()
                .override_host_status
                .unwrap()
                .statuses,
            vec![HealthStatus::Healthy as i32]
        );
        assert_eq!(
            apply(&src[..src.len() - 2], |_| Some(true), &policy).1,
            ClusterOutcome::Undecodable
        );
    }

    #[test]
    fn the_raw_request_keeps_every_resource_and_names_unknown_fields() {
        let msg = RawPostTranslateModifyRequest {
            post_translate_context: Some(Bytes::from_static(b"")),
            clusters: vec![Bytes::from_static(b"\x0a\x01c")],
            secrets: vec![Bytes::from_static(b"\x0a\x01s")],
            listeners: vec![],
            routes: vec![Bytes::from_static(b"\x0a\x01r")],
            unknown_fields: vec![],
        };
        let mut wire = msg.encode_to_vec();
        assert_eq!(
            RawPostTranslateModifyRequest::decode(wire.as_slice()).unwrap(),
            msg
        );
        // A field 6 (a resource list of a later EG).
        wire.extend_from_slice(&[0x32, 0x01, 0x00]);
        let got = RawPostTranslateModifyRequest::decode(wire.as_slice()).unwrap();
        assert_eq!(got.unknown_fields, vec![6]);
        assert_eq!(got.clusters, msg.clusters);
    }
}
