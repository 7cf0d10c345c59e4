//! Test double (tests and the `testing` feature only): what Envoy Gateway
//! 1.6 and later sends the hook, a model of its translator for the tests
//! and benchmarks that play EG. Read from envoyproxy/gateway
//! (`internal/gatewayapi/route.go` `getIREndpointsFromEndpointSlice`,
//! `internal/xds/translator/cluster.go` `buildXdsClusterLoadAssignment`,
//! `metadata.go`, `helpers.go` naming), versions 1.6 through main:
//!
//! - every address of every slice endpoint is sent; `DRAINING` when
//!   `terminating || !serving` (both set), else when `ready == false`;
//!   otherwise `UNKNOWN` (0, absent on the wire); endpoint weight 1; no
//!   endpoint metadata (unless the backend has TLS);
//! - one cluster per route rule, `httproute/<ns>/<route>/rule/<i>`, one
//!   locality per backendRef `j` (counted before zero-weight refs are left
//!   out), `region: <cluster>/backend/<j>`, locality weight = the ref's
//!   weight (default 1), priority 0, and the `envoy-gateway` resources
//!   metadata naming the Service and the ref's port number;
//! - zone-aware Services (`trafficDistribution`, `topology-mode: Auto`):
//!   one cluster per backendRef, `.../rule/<i>/backend/<j>`, one locality
//!   per zone with `zone` set and no region.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address, HealthStatus, Locality, Metadata, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, UInt32Value, Value};

use super::naming::{EG_METADATA_NAMESPACE, EG_RESOURCES_KEY};
use crate::model::slice::ServiceKey;

/// One entry of EG's `resources` metadata list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRef {
    /// `kind` (`Service`, or another kind the hook leaves alone).
    pub kind: String,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// `sectionName`: the backendRef's port, the Service port number, when set.
    pub section_name: Option<String>,
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// EG's locality metadata (`buildXdsMetadata`).
pub fn resource_metadata(refs: &[ResourceRef]) -> Metadata {
    let values = refs
        .iter()
        .map(|r| {
            let mut fields = BTreeMap::new();
            fields.insert("kind".to_string(), string(&r.kind));
            fields.insert("name".to_string(), string(&r.name));
            fields.insert("namespace".to_string(), string(&r.namespace));
            if let Some(s) = &r.section_name {
                fields.insert("sectionName".to_string(), string(s));
            }
            Value {
                kind: Some(Kind::StructValue(Struct {
                    fields: fields.into_iter().collect(),
                })),
            }
        })
        .collect();
    let mut md = Metadata::default();
    md.filter_metadata.insert(
        EG_METADATA_NAMESPACE.to_string(),
        Struct {
            fields: [(
                EG_RESOURCES_KEY.to_string(),
                Value {
                    kind: Some(Kind::ListValue(ListValue { values })),
                },
            )]
            .into_iter()
            .collect(),
        },
    );
    md
}

/// EG >= 1.6's drain rule, verbatim: with both `serving` and `terminating`
/// set, `terminating || !serving`; otherwise `ready == false`.
pub fn eg_draining(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> bool {
    match (serving, terminating) {
        (Some(s), Some(t)) => t || !s,
        _ => ready == Some(false),
    }
}

/// One endpoint as EG's IR holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgEndpoint {
    /// The endpoint's address and the slice port.
    pub addr: SocketAddr,
    /// EG marks it `DRAINING` (`eg_draining`).
    pub draining: bool,
    /// The slice endpoint's zone (zone-aware Services only).
    pub zone: Option<String>,
}

/// One backendRef of a rule: a Service port and the endpoints EG found.
#[derive(Clone, Debug)]
pub struct BackendRef {
    /// The Service the backendRef names.
    pub service: ServiceKey,
    /// The backendRef's port: the Service port number.
    pub port: u16,
    /// `None`: unset (1). `Some(0)`: left out of the assignment.
    pub weight: Option<u32>,
    /// The Service's endpoints on that port, as EG found them.
    pub endpoints: Vec<EgEndpoint>,
}

/// An lb_endpoint as EG writes it.
pub fn eg_lb_endpoint(ep: &EgEndpoint) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: ep.addr.ip().to_string(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                        ep.addr.port(),
                    ))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })),
        health_status: if ep.draining {
            HealthStatus::Draining as i32
        } else {
            HealthStatus::Unknown as i32
        },
        load_balancing_weight: Some(UInt32Value { value: 1 }),
        ..Default::default()
    }
}

fn locality(
    r: &BackendRef,
    locality: Locality,
    endpoints: impl Iterator<Item = LbEndpoint>,
) -> LocalityLbEndpoints {
    LocalityLbEndpoints {
        locality: Some(locality),
        lb_endpoints: endpoints.collect(),
        load_balancing_weight: Some(UInt32Value {
            value: r.weight.unwrap_or(1),
        }),
        priority: 0,
        metadata: Some(resource_metadata(&[ResourceRef {
            kind: "Service".into(),
            namespace: r.service.namespace.clone(),
            name: r.service.name.clone(),
            section_name: Some(r.port.to_string()),
        }])),
        ..Default::default()
    }
}

/// EG's rule cluster name.
pub fn rule_cluster(route_ns: &str, route: &str, rule: usize) -> String {
    format!("httproute/{route_ns}/{route}/rule/{rule}")
}

/// The assignments EG sends for one HTTPRoute rule: one cluster with one
/// locality per backendRef, or (`zonal`) one cluster per backendRef with a
/// locality per zone.
pub fn rule_assignments(
    route_ns: &str,
    route: &str,
    rule: usize,
    refs: &[BackendRef],
    zonal: bool,
) -> Vec<ClusterLoadAssignment> {
    let cluster = rule_cluster(route_ns, route, rule);
    let kept = refs.iter().enumerate().filter(|(_, r)| r.weight != Some(0));
    if !zonal {
        let endpoints = kept
            .map(|(j, r)| {
                locality(
                    r,
                    Locality {
                        region: format!("{cluster}/backend/{j}"),
                        ..Default::default()
                    },
                    r.endpoints.iter().map(eg_lb_endpoint),
                )
            })
            .collect();
        return vec![ClusterLoadAssignment {
            cluster_name: cluster,
            endpoints,
            ..Default::default()
        }];
    }
    kept.map(|(j, r)| {
        let mut zones: BTreeMap<&str, Vec<LbEndpoint>> = BTreeMap::new();
        for ep in &r.endpoints {
            zones
                .entry(ep.zone.as_deref().unwrap_or(""))
                .or_default()
                .push(eg_lb_endpoint(ep));
        }
        ClusterLoadAssignment {
            cluster_name: format!("{cluster}/backend/{j}"),
            endpoints: zones
                .into_iter()
                .map(|(zone, eps)| {
                    locality(
                        r,
                        Locality {
                            zone: zone.to_string(),
                            ..Default::default()
                        },
                        eps.into_iter(),
                    )
                })
                .collect(),
            ..Default::default()
        }
    })
    .collect()
}

/// The Cluster EG's translator writes for a route rule's Service backends
/// (the shape of envoyproxy/gateway@v1.8.3 and @v1.9.0
/// `internal/xds/translator/testdata/out/xds-ir/http-route.clusters.yaml`,
/// kept in `platforms/eg-xds/`): EDS over ADS with its own name as the
/// service name, least request with the locality weighted config, empty
/// `commonLbConfig`, `ignoreHealthOnHostRemoval`. `tests/e2e` checks this
/// shape against the fixture through a real Envoy's config dump.
pub fn eg_rule_cluster(name: &str) -> envoy_types::pb::envoy::config::cluster::v3::Cluster {
    use envoy_types::pb::envoy::config::cluster::v3::{
        circuit_breakers::Thresholds, cluster, load_balancing_policy, CircuitBreakers, Cluster,
        LoadBalancingPolicy,
    };
    use envoy_types::pb::envoy::config::core::v3::{
        config_source, AggregatedConfigSource, ApiVersion, ConfigSource, TypedExtensionConfig,
    };
    use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::{
        locality_lb_config, LocalityLbConfig,
    };
    use envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest;
    use envoy_types::pb::google::protobuf::{Any, Duration};
    use prost::Message;
    let least_request = LeastRequest {
        locality_lb_config: Some(LocalityLbConfig {
            locality_config_specifier: Some(
                locality_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                    Default::default(),
                ),
            ),
        }),
        ..Default::default()
    };
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ConfigSource {
                resource_api_version: ApiVersion::V3 as i32,
                config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                    AggregatedConfigSource::default(),
                )),
                ..Default::default()
            }),
            service_name: name.to_string(),
        }),
        connect_timeout: Some(Duration {
            seconds: 10,
            nanos: 0,
        }),
        dns_lookup_family: cluster::DnsLookupFamily::V4Preferred as i32,
        per_connection_buffer_limit_bytes: Some(UInt32Value { value: 32768 }),
        circuit_breakers: Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                max_retries: Some(UInt32Value { value: 1024 }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        common_lb_config: Some(cluster::CommonLbConfig::default()),
        ignore_health_on_host_removal: true,
        load_balancing_policy: Some(LoadBalancingPolicy {
            policies: vec![load_balancing_policy::Policy {
                typed_extension_config: Some(TypedExtensionConfig {
                    name: "envoy.load_balancing_policies.least_request".to_string(),
                    typed_config: Some(Any {
                        type_url: "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest".to_string(),
                        value: least_request.encode_to_vec(),
                    }),
                }),
            }],
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn drain_rule_is_egs() {
        // Ready pod; serving+terminating; not serving; new pod not ready.
        assert!(!eg_draining(Some(true), Some(true), Some(false)));
        assert!(eg_draining(Some(false), Some(true), Some(true)));
        assert!(eg_draining(Some(false), Some(false), Some(true)));
        assert!(eg_draining(Some(false), Some(false), Some(false)));
        // Nil serving/terminating: ready decides; nil ready is ready.
        assert!(!eg_draining(None, None, None));
        assert!(eg_draining(Some(false), None, None));
        assert!(eg_draining(Some(false), Some(true), None));
    }
}
