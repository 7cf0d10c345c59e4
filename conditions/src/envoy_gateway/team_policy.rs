//! Which load balancer Envoy Gateway wrote on a cluster: its default, or
//! one a team set with a BackendTrafficPolicy (or a Service's topology
//! setting). The native form goes only on EG's default; every other
//! cluster keeps EG's bytes.
//!
//! EG writes the load balancer inside the cluster's `load_balancing_policy`
//! (envoyproxy/gateway@v1.9.0 `internal/xds/translator/cluster.go`,
//! `buildXdsCluster`; the same shapes at v1.8.3):
//! - no `loadBalancer` in any policy: least request with
//!   `locality_lb_config { locality_weighted_lb_config {} }`, nothing
//!   else: **EG's default**, the only shape the module replaces. The
//!   module goes only on clusters of one backendRef (`native_lb`), whose
//!   localities carry that one backendRef's weight: the locality-weighted
//!   config has nothing to weigh between them, and the module balances by
//!   host weight as least request does. A least request with no
//!   `locality_lb_config` at all counts as the default too.
//! - `type: LeastRequest` with `slowStart`: `slow_start`;
//! - `zoneAware.preferLocal`, or a Service with `trafficDistribution` or
//!   `service.kubernetes.io/topology-mode: Auto` (EG turns those into
//!   zone-aware with a forced local zone, `processPreferLocalZone` in
//!   `internal/gatewayapi/route.go`): `prefer_local`. The module's zone
//!   handling follows EndpointSlice hints, not Envoy's zone-aware
//!   thresholds (`min_cluster_size`, `force_local_zone`), so it is not the
//!   same behaviour;
//! - `type: RoundRobin`: `round_robin`; `type: Random`: `random`;
//! - `type: ConsistentHash`: `maglev` (EG writes Maglev for every hash
//!   type); `ring_hash` if a ring hash ever comes;
//! - `type: BackendUtilization`: `backend_utilization` (client-side
//!   weighted round robin, possibly inside `wrr_locality`);
//! - `endpointOverride`: `endpoint_override` (the `override_host` wrapper
//!   around any of the above);
//! - `healthCheck.panicThreshold` other than 50 (`common_lb_config`'s
//!   `healthy_panic_threshold`): `panic_threshold`, since the module does
//!   not apply Envoy's panic mode;
//! - a least request with any other setting (choice count, active request
//!   bias, full scan, a field this version does not know):
//!   `least_request_settings`;
//! - anything else (no `load_balancing_policy`, several policies, another
//!   extension, bytes that do not decode as expected): `other`.

use envoy_types::pb::envoy::config::cluster::v3::cluster::CommonLbConfig;
use envoy_types::pb::envoy::config::cluster::v3::LoadBalancingPolicy;
use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::locality_lb_config::{
    LocalityConfigSpecifier, LocalityWeightedLbConfig,
};
use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::LocalityLbConfig;
use envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest;
use prost::Message;

use super::field_edit::fields;

const CLUSTER_COMMON_LB_CONFIG: u32 = 27;
const CLUSTER_LOAD_BALANCING_POLICY: u32 = 41;

const TYPE_PREFIX: &str = "type.googleapis.com/envoy.extensions.load_balancing_policies.";

/// The load balancer a cluster carries, as far as the native form cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shape {
    /// EG's default: the module may replace it.
    Default,
    /// Least request with a slow start window.
    SlowStart,
    /// Zone-aware (preferLocal, or a Service's topology setting).
    PreferLocal,
    /// Round robin.
    RoundRobin,
    /// Random.
    Random,
    /// Maglev (EG's consistent hash).
    Maglev,
    /// Ring hash.
    RingHash,
    /// Client-side weighted round robin (EG's BackendUtilization).
    BackendUtilization,
    /// The override_host wrapper (EG's endpointOverride).
    EndpointOverride,
    /// A healthy panic threshold in `common_lb_config`.
    PanicThreshold,
    /// Least request with another setting.
    LeastRequestSettings,
    /// Anything else.
    Other,
}

impl Shape {
    /// Every team shape, in the order the metric's label values are created.
    pub const TEAM: [Shape; 11] = [
        Shape::SlowStart,
        Shape::PreferLocal,
        Shape::RoundRobin,
        Shape::Random,
        Shape::Maglev,
        Shape::RingHash,
        Shape::BackendUtilization,
        Shape::EndpointOverride,
        Shape::PanicThreshold,
        Shape::LeastRequestSettings,
        Shape::Other,
    ];

    /// The `shape` label value of `eg_native_lb_team_policies_total`.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Default => "default",
            Shape::SlowStart => "slow_start",
            Shape::PreferLocal => "prefer_local",
            Shape::RoundRobin => "round_robin",
            Shape::Random => "random",
            Shape::Maglev => "maglev",
            Shape::RingHash => "ring_hash",
            Shape::BackendUtilization => "backend_utilization",
            Shape::EndpointOverride => "endpoint_override",
            Shape::PanicThreshold => "panic_threshold",
            Shape::LeastRequestSettings => "least_request_settings",
            Shape::Other => "other",
        }
    }
}

/// The shape of the encoded cluster `cluster`'s load balancer.
pub fn shape(cluster: &[u8]) -> Shape {
    let mut policy: Option<&[u8]> = None;
    for f in fields(cluster) {
        let Ok(f) = f else {
            return Shape::Other;
        };
        match f.number {
            CLUSTER_LOAD_BALANCING_POLICY => {
                if policy.is_some() {
                    // Two occurrences merge: not a shape EG writes.
                    return Shape::Other;
                }
                policy = Some(f.payload);
            }
            CLUSTER_COMMON_LB_CONFIG => match CommonLbConfig::decode(f.payload) {
                Ok(c) if c.healthy_panic_threshold.is_some() => return Shape::PanicThreshold,
                Ok(_) => {}
                Err(_) => return Shape::Other,
            },
            _ => {}
        }
    }
    let Some(Ok(policy)) = policy.map(LoadBalancingPolicy::decode) else {
        return Shape::Other;
    };
    let [only] = policy.policies.as_slice() else {
        return Shape::Other;
    };
    let Some(typed) = only
        .typed_extension_config
        .as_ref()
        .and_then(|t| t.typed_config.as_ref())
    else {
        return Shape::Other;
    };
    let Some(kind) = typed.type_url.strip_prefix(TYPE_PREFIX) else {
        return Shape::Other;
    };
    match kind {
        "least_request.v3.LeastRequest" => least_request(&typed.value),
        "round_robin.v3.RoundRobin" => Shape::RoundRobin,
        "random.v3.Random" => Shape::Random,
        "maglev.v3.Maglev" => Shape::Maglev,
        "ring_hash.v3.RingHash" => Shape::RingHash,
        "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin"
        | "wrr_locality.v3.WrrLocality" => Shape::BackendUtilization,
        "override_host.v3.OverrideHost" => Shape::EndpointOverride,
        _ => Shape::Other,
    }
}

fn least_request(value: &[u8]) -> Shape {
    let Ok(lr) = LeastRequest::decode(value) else {
        return Shape::Other;
    };
    if lr.encode_to_vec() != value {
        // A field this version does not know, or not as EG encodes it.
        return Shape::LeastRequestSettings;
    }
    if lr.slow_start_config.is_some() {
        return Shape::SlowStart;
    }
    let zone_aware = matches!(
        lr.locality_lb_config,
        Some(LocalityLbConfig {
            locality_config_specifier: Some(LocalityConfigSpecifier::ZoneAwareLbConfig(_))
        })
    );
    if zone_aware {
        return Shape::PreferLocal;
    }
    let weighted = LeastRequest {
        locality_lb_config: Some(LocalityLbConfig {
            locality_config_specifier: Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(
                LocalityWeightedLbConfig {},
            )),
        }),
        ..LeastRequest::default()
    };
    if lr == weighted || lr == LeastRequest::default() {
        Shape::Default
    } else {
        Shape::LeastRequestSettings
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::envoy_gateway::testing::eg_rule_cluster;
    use envoy_types::pb::envoy::config::cluster::v3::load_balancing_policy;
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::SlowStartConfig;
    use envoy_types::pb::google::protobuf::{Any, Duration, UInt32Value};

    fn with_policy(type_name: &str, value: Vec<u8>) -> Vec<u8> {
        let mut c = eg_rule_cluster("c");
        c.load_balancing_policy = Some(LoadBalancingPolicy {
            policies: vec![load_balancing_policy::Policy {
                typed_extension_config: Some(TypedExtensionConfig {
                    name: "x".into(),
                    typed_config: Some(Any {
                        type_url: format!("{TYPE_PREFIX}{type_name}"),
                        value,
                    }),
                }),
            }],
        });
        c.encode_to_vec()
    }

    #[test]
    fn egs_default_and_each_team_setting() {
        assert_eq!(shape(&eg_rule_cluster("c").encode_to_vec()), Shape::Default);
        let lr = "least_request.v3.LeastRequest";
        assert_eq!(shape(&with_policy(lr, vec![])), Shape::Default);
        let slow = LeastRequest {
            slow_start_config: Some(SlowStartConfig {
                slow_start_window: Some(Duration {
                    seconds: 5,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            shape(&with_policy(lr, slow.encode_to_vec())),
            Shape::SlowStart
        );
        let choice = LeastRequest {
            choice_count: Some(UInt32Value { value: 3 }),
            ..Default::default()
        };
        assert_eq!(
            shape(&with_policy(lr, choice.encode_to_vec())),
            Shape::LeastRequestSettings
        );
        // A field this version does not know.
        assert_eq!(
            shape(&with_policy(lr, vec![0xf8, 0x06, 0x01])),
            Shape::LeastRequestSettings
        );
        assert_eq!(
            shape(&with_policy("round_robin.v3.RoundRobin", vec![])),
            Shape::RoundRobin
        );
        assert_eq!(
            shape(&with_policy("override_host.v3.OverrideHost", vec![])),
            Shape::EndpointOverride
        );
        assert_eq!(shape(&with_policy("some.v3.Other", vec![])), Shape::Other);
        let mut none = eg_rule_cluster("c");
        none.load_balancing_policy = None;
        assert_eq!(shape(&none.encode_to_vec()), Shape::Other);
        let mut panic = eg_rule_cluster("c");
        panic.common_lb_config = Some(CommonLbConfig {
            healthy_panic_threshold: Some(envoy_types::pb::envoy::r#type::v3::Percent {
                value: 0.0,
            }),
            ..Default::default()
        });
        assert_eq!(shape(&panic.encode_to_vec()), Shape::PanicThreshold);
    }
}
