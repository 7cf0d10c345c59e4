//! Never override what a team set: the clusters Envoy Gateway's translator
//! generates for every BackendTrafficPolicy load balancer, at v1.8.3 and
//! v1.9.0 (`tests/fixtures/eg-lb/`, copied from EG's translator testdata:
//! see its README), rebuilt as protobuf from the YAML, go through
//! PostTranslateModify's cluster edit with a "yes" verdict. Only EG's
//! default (least request, locality weighted, nothing else) gets the
//! module; every other cluster comes back byte for byte, counted by shape.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

use envoy_types::pb::envoy::config::cluster::v3::{
    cluster, load_balancing_policy, Cluster, LoadBalancingPolicy,
};
use envoy_types::pb::envoy::config::core::v3::{config_source, ConfigSource, TypedExtensionConfig};
use envoy_types::pb::envoy::extensions::load_balancing_policies as lbp;
use envoy_types::pb::google::protobuf::{
    Any, BoolValue, Duration, FloatValue, UInt32Value, UInt64Value,
};
use prost::Message;
use serde_json::{json, Map, Value};
use serving_picker_conditions::envoy_gateway::native_lb::{
    apply, ClusterOutcome, NativePolicy, POLICY_EXTENSION,
};

const PREFIX: &str = "type.googleapis.com/envoy.extensions.load_balancing_policies.";

/// Takes `key` out of `obj` (every key must be taken: a field the
/// converter does not know fails the test rather than being dropped).
fn take(obj: &mut Map<String, Value>, key: &str) -> Option<Value> {
    obj.remove(key)
}

fn done(obj: Map<String, Value>, what: &str) {
    assert!(
        obj.is_empty(),
        "{what}: fields not converted: {:?}",
        obj.keys()
    );
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn duration(v: Value) -> Duration {
    let s = v.as_str().unwrap();
    let secs = s.strip_suffix('s').unwrap();
    let f: f64 = secs.parse().unwrap();
    Duration {
        seconds: f.trunc() as i64,
        nanos: ((f.fract()) * 1e9).round() as i32,
    }
}

fn uint(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap(),
        other => other.as_u64().unwrap(),
    }
}

fn locality(v: Value) -> lbp::common::v3::LocalityLbConfig {
    use lbp::common::v3::locality_lb_config::{
        zone_aware_lb_config::ForceLocalZone, LocalityConfigSpecifier, LocalityWeightedLbConfig,
        ZoneAwareLbConfig,
    };
    let mut m = object(v);
    let spec = if let Some(w) = take(&mut m, "localityWeightedLbConfig") {
        done(object(w), "localityWeightedLbConfig");
        LocalityConfigSpecifier::LocalityWeightedLbConfig(LocalityWeightedLbConfig {})
    } else {
        let mut z = object(take(&mut m, "zoneAwareLbConfig").unwrap());
        let cfg = ZoneAwareLbConfig {
            min_cluster_size: take(&mut z, "minClusterSize")
                .map(|v| UInt64Value { value: uint(&v) }),
            routing_enabled: take(&mut z, "routingEnabled").map(|v| {
                let mut p = object(v);
                let value = take(&mut p, "value").unwrap().as_f64().unwrap();
                done(p, "routingEnabled");
                envoy_types::pb::envoy::r#type::v3::Percent { value }
            }),
            force_local_zone: take(&mut z, "forceLocalZone").map(|v| {
                let mut f = object(v);
                let min = take(&mut f, "minSize").map(|v| UInt32Value {
                    value: uint(&v) as u32,
                });
                done(f, "forceLocalZone");
                ForceLocalZone { min_size: min }
            }),
            ..Default::default()
        };
        done(z, "zoneAwareLbConfig");
        LocalityConfigSpecifier::ZoneAwareLbConfig(cfg)
    };
    done(m, "localityLbConfig");
    lbp::common::v3::LocalityLbConfig {
        locality_config_specifier: Some(spec),
    }
}

fn slow_start(v: Value) -> lbp::common::v3::SlowStartConfig {
    let mut m = object(v);
    let window = take(&mut m, "slowStartWindow").map(duration);
    done(m, "slowStartConfig");
    lbp::common::v3::SlowStartConfig {
        slow_start_window: window,
        ..Default::default()
    }
}

fn typed(v: Value) -> Any {
    let mut m = object(v);
    let type_url = take(&mut m, "@type").unwrap().as_str().unwrap().to_string();
    let kind = type_url
        .strip_prefix(PREFIX)
        .unwrap_or_else(|| panic!("{type_url}"));
    let value = match kind {
        "least_request.v3.LeastRequest" => lbp::least_request::v3::LeastRequest {
            locality_lb_config: take(&mut m, "localityLbConfig").map(locality),
            slow_start_config: take(&mut m, "slowStartConfig").map(slow_start),
            ..Default::default()
        }
        .encode_to_vec(),
        "round_robin.v3.RoundRobin" => lbp::round_robin::v3::RoundRobin {
            locality_lb_config: take(&mut m, "localityLbConfig").map(locality),
            slow_start_config: take(&mut m, "slowStartConfig").map(slow_start),
        }
        .encode_to_vec(),
        "random.v3.Random" => lbp::random::v3::Random {
            locality_lb_config: take(&mut m, "localityLbConfig").map(locality),
        }
        .encode_to_vec(),
        "maglev.v3.Maglev" => lbp::maglev::v3::Maglev {
            table_size: take(&mut m, "tableSize").map(|v| UInt64Value { value: uint(&v) }),
            locality_weighted_lb_config: take(&mut m, "localityWeightedLbConfig").map(|w| {
                done(object(w), "localityWeightedLbConfig");
                Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec(),
        "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin" => {
            lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin {
                enable_oob_load_report: take(&mut m, "enableOobLoadReport").map(|v| BoolValue {
                    value: v.as_bool().unwrap(),
                }),
                oob_reporting_period: take(&mut m, "oobReportingPeriod").map(duration),
                blackout_period: take(&mut m, "blackoutPeriod").map(duration),
                weight_expiration_period: take(&mut m, "weightExpirationPeriod").map(duration),
                weight_update_period: take(&mut m, "weightUpdatePeriod").map(duration),
                error_utilization_penalty: take(&mut m, "errorUtilizationPenalty").map(|v| {
                    FloatValue {
                        value: v.as_f64().unwrap() as f32,
                    }
                }),
                metric_names_for_computing_utilization: take(
                    &mut m,
                    "metricNamesForComputingUtilization",
                )
                .map(|v| {
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|s| s.as_str().unwrap().to_string())
                        .collect()
                })
                .unwrap_or_default(),
                slow_start_config: take(&mut m, "slowStartConfig").map(slow_start),
                oob_reporting_config: take(&mut m, "oobReportingConfig").map(|v| {
                    let mut o = object(v);
                    let cfg = lbp::common::v3::OrcaOobReportingConfig {
                        port_value: take(&mut o, "portValue").map_or(0, |v| uint(&v) as u32),
                        authority: take(&mut o, "authority")
                            .map(|v| v.as_str().unwrap().to_string())
                            .unwrap_or_default(),
                        ..Default::default()
                    };
                    done(o, "oobReportingConfig");
                    cfg
                }),
            }
            .encode_to_vec()
        }
        "wrr_locality.v3.WrrLocality" => lbp::wrr_locality::v3::WrrLocality {
            endpoint_picking_policy: take(&mut m, "endpointPickingPolicy").map(policy),
        }
        .encode_to_vec(),
        "override_host.v3.OverrideHost" => lbp::override_host::v3::OverrideHost {
            override_host_sources: take(&mut m, "overrideHostSources")
                .map(|v| {
                    v.as_array()
                        .unwrap()
                        .iter()
                        .map(|s| {
                            let mut o = object(s.clone());
                            let src = lbp::override_host::v3::override_host::OverrideHostSource {
                                header: take(&mut o, "header")
                                    .map(|v| v.as_str().unwrap().to_string())
                                    .unwrap_or_default(),
                                ..Default::default()
                            };
                            done(o, "overrideHostSource");
                            src
                        })
                        .collect()
                })
                .unwrap_or_default(),
            fallback_policy: take(&mut m, "fallbackPolicy").map(policy),
            ..Default::default()
        }
        .encode_to_vec(),
        other => panic!("no converter for {other}"),
    };
    done(m, kind);
    Any { type_url, value }
}

fn policy(v: Value) -> LoadBalancingPolicy {
    let mut m = object(v);
    let policies = take(&mut m, "policies")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut p = object(p.clone());
            let mut t = object(take(&mut p, "typedExtensionConfig").unwrap());
            let config = TypedExtensionConfig {
                name: take(&mut t, "name").unwrap().as_str().unwrap().to_string(),
                typed_config: take(&mut t, "typedConfig").map(typed),
            };
            done(t, "typedExtensionConfig");
            done(p, "policy");
            load_balancing_policy::Policy {
                typed_extension_config: Some(config),
            }
        })
        .collect();
    done(m, "loadBalancingPolicy");
    LoadBalancingPolicy { policies }
}

/// The cluster EG generated, as protobuf: every field that bears on the
/// load balancer converted exactly (an unconverted one fails), the rest
/// (circuit breakers, protocol options) left out: the edit keeps every
/// byte it does not set either way.
fn cluster(v: &Value) -> Cluster {
    let mut m = object(v.clone());
    let mut c = Cluster {
        name: take(&mut m, "name").unwrap().as_str().unwrap().to_string(),
        ignore_health_on_host_removal: take(&mut m, "ignoreHealthOnHostRemoval")
            .is_some_and(|v| v.as_bool().unwrap()),
        connect_timeout: take(&mut m, "connectTimeout").map(duration),
        per_connection_buffer_limit_bytes: take(&mut m, "perConnectionBufferLimitBytes").map(|v| {
            UInt32Value {
                value: uint(&v) as u32,
            }
        }),
        load_balancing_policy: take(&mut m, "loadBalancingPolicy").map(policy),
        ..Default::default()
    };
    assert_eq!(take(&mut m, "type"), Some(json!("EDS")), "{}", c.name);
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
        cluster::DiscoveryType::Eds as i32,
    ));
    let mut eds = object(take(&mut m, "edsClusterConfig").unwrap());
    c.eds_cluster_config = Some(cluster::EdsClusterConfig {
        service_name: take(&mut eds, "serviceName")
            .map(|v| v.as_str().unwrap().to_string())
            .unwrap_or_default(),
        eds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                Default::default(),
            )),
            resource_api_version: 2,
            ..Default::default()
        }),
    });
    let mut common = object(take(&mut m, "commonLbConfig").unwrap());
    c.common_lb_config = Some(cluster::CommonLbConfig {
        healthy_panic_threshold: take(&mut common, "healthyPanicThreshold").map(|v| {
            let mut p = object(v);
            let value = take(&mut p, "value").map_or(0.0, |v| v.as_f64().unwrap());
            done(p, "healthyPanicThreshold");
            envoy_types::pb::envoy::r#type::v3::Percent { value }
        }),
        ..Default::default()
    });
    done(common, "commonLbConfig");
    if take(&mut m, "dnsLookupFamily") == Some(json!("V4_PREFERRED")) {
        c.dns_lookup_family = cluster::DnsLookupFamily::V4Preferred as i32;
    }
    for ignored in ["circuitBreakers", "typedExtensionProtocolOptions"] {
        take(&mut m, ignored);
    }
    done(m, &c.name);
    c
}

/// Whether EG wrote its default load balancer on `v` (read from the YAML,
/// independently of the code under test): least request with the locality
/// weighted config and nothing else, and no panic threshold.
fn is_egs_default(v: &Value) -> bool {
    let default = json!({"policies": [{"typedExtensionConfig": {
        "name": "envoy.load_balancing_policies.least_request",
        "typedConfig": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
            "localityLbConfig": {"localityWeightedLbConfig": {}},
        },
    }}]});
    v["loadBalancingPolicy"] == default
        && v["commonLbConfig"].get("healthyPanicThreshold").is_none()
}

fn fixtures(tag: &str) -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/eg-lb")
        .join(tag);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let clusters: Value = serde_saphyr::from_str(&text).unwrap();
        for c in clusters.as_array().unwrap() {
            let file = f.file_name().unwrap().to_string_lossy().to_string();
            out.push((file, c.clone()));
        }
    }
    out
}

fn every_load_balancer_of(tag: &str, min_shapes: &[&str]) {
    let policy = NativePolicy::new("k8s.endpointslice");
    let mut shapes: BTreeMap<String, usize> = BTreeMap::new();
    let mut defaults = 0;
    let all = fixtures(tag);
    assert!(all.len() >= 20, "{tag}: {} clusters", all.len());
    for (file, v) in &all {
        let c = cluster(v);
        let bytes = c.encode_to_vec();
        let (out, outcome) = apply(&bytes, |_| Some(true), &policy);
        if is_egs_default(v) {
            defaults += 1;
            assert_eq!(outcome, ClusterOutcome::Set, "{tag} {file} {}", c.name);
            let got = Cluster::decode(out.unwrap().as_slice()).unwrap();
            let name = &got.load_balancing_policy.as_ref().unwrap().policies[0]
                .typed_extension_config
                .as_ref()
                .unwrap()
                .name;
            assert_eq!(name, POLICY_EXTENSION);
        } else {
            assert_eq!(out, None, "{tag} {file} {}: EG's bytes untouched", c.name);
            let ClusterOutcome::TeamPolicy(shape) = outcome else {
                panic!("{tag} {file} {}: {outcome:?}", c.name);
            };
            *shapes.entry(shape.name().to_string()).or_default() += 1;
        }
    }
    assert!(defaults >= 1, "{tag}: EG's default is among the fixtures");
    for s in min_shapes {
        assert!(shapes.contains_key(*s), "{tag}: no {s} in {shapes:?}");
    }
    assert!(!shapes.contains_key("other"), "{tag}: {shapes:?}");
}

#[test]
fn eg_1_9_keeps_every_team_load_balancer_byte_for_byte() {
    every_load_balancer_of(
        "v1.9.0",
        &[
            "round_robin",
            "random",
            "maglev",
            "slow_start",
            "prefer_local",
            "backend_utilization",
            "endpoint_override",
            "panic_threshold",
        ],
    );
}

#[test]
fn eg_1_8_keeps_every_team_load_balancer_byte_for_byte() {
    every_load_balancer_of(
        "v1.8.3",
        &[
            "round_robin",
            "random",
            "maglev",
            "slow_start",
            "prefer_local",
            "backend_utilization",
            "endpoint_override",
            "panic_threshold",
        ],
    );
}
