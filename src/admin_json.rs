//! Parsing Envoy admin output: `/config_dump?include_eds` (endpoints and
//! metadata) and `/clusters?format=json` (live health).

use crate::conditions::{effective, read_metadata, Conditions, EdsHealth, Health, MetaFlags};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;

/// One host as the filter needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRecord {
    /// `IP:PORT` (IPv6 as `[IP]:PORT`), the override header's value.
    pub address: String,
    pub weight: u32,
    pub priority: u32,
    pub flags: MetaFlags,
    pub zone: Option<String>,
    pub health: Health,
}

impl HostRecord {
    pub fn conditions(&self) -> Conditions {
        effective(&self.flags, &self.health)
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct ClusterHosts {
    pub name: String,
    pub hosts: Vec<HostRecord>,
}

/// Everything a config dump says about endpoints, plus what had to be skipped.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EndpointsDump {
    pub clusters: Vec<ClusterHosts>,
    /// Log lines for ignored values and skipped hosts (never fatal).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminJsonError(pub String);

impl std::fmt::Display for AdminJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Accepts an admin answer before its body is read: a 200 within the size
/// limit. No `:status` means the call failed (unreachable, reset, timeout).
pub fn check_admin_response(
    what: &str,
    status: Option<&[u8]>,
    body_size: usize,
    max_body: usize,
) -> Result<(), AdminJsonError> {
    match status {
        None => Err(AdminJsonError(format!(
            "{what}: no answer from the admin cluster (unreachable, reset or timed out)"
        ))),
        Some(b"200") if body_size > max_body => Err(AdminJsonError(format!(
            "{what}: body of {body_size} bytes exceeds max_admin_body_bytes ({max_body})"
        ))),
        Some(b"200") => Ok(()),
        Some(other) => Err(AdminJsonError(format!(
            "{what}: admin answered HTTP {}",
            String::from_utf8_lossy(other)
        ))),
    }
}

// --- config_dump shapes (unknown fields are skipped by serde) ---

#[derive(Deserialize)]
struct ConfigDump {
    configs: Vec<DumpEntry>,
}

/// Either an `EndpointsConfigDump` (whole or masked) or, with `resource=`, a
/// single Static/DynamicEndpointConfig. Other config types leave all empty.
#[derive(Deserialize)]
struct DumpEntry {
    #[serde(default)]
    static_endpoint_configs: Vec<EndpointConfigEntry>,
    #[serde(default)]
    dynamic_endpoint_configs: Vec<EndpointConfigEntry>,
    endpoint_config: Option<LoadAssignment>,
}

#[derive(Deserialize)]
struct EndpointConfigEntry {
    endpoint_config: Option<LoadAssignment>,
}

#[derive(Deserialize)]
struct LoadAssignment {
    cluster_name: String,
    #[serde(default)]
    endpoints: Vec<LocalityEndpoints>,
}

#[derive(Deserialize)]
struct LocalityEndpoints {
    #[serde(default)]
    lb_endpoints: Vec<LbEndpoint>,
    #[serde(default)]
    priority: u32,
    locality: Option<Locality>,
}

#[derive(Deserialize)]
struct Locality {
    zone: Option<String>,
}

#[derive(Deserialize)]
struct LbEndpoint {
    endpoint: Option<Endpoint>,
    health_status: Option<String>,
    metadata: Option<Metadata>,
    load_balancing_weight: Option<u32>,
}

#[derive(Deserialize)]
struct Endpoint {
    address: Option<Address>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    filter_metadata: HashMap<String, Value>,
}

#[derive(Deserialize)]
struct Address {
    socket_address: Option<SocketAddress>,
}

#[derive(Deserialize)]
struct SocketAddress {
    address: String,
    port_value: Option<u32>,
}

/// `IP:PORT` for a socket address, or why it cannot be overridden to.
fn host_address(address: Option<&Address>) -> Result<String, String> {
    let socket = address
        .and_then(|a| a.socket_address.as_ref())
        .ok_or("not a socket address")?;
    let port = socket.port_value.ok_or("no port_value")?;
    if port == 0 || port > 65535 {
        return Err(format!("port {port} out of range"));
    }
    match socket.address.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Ok(format!("{ip}:{port}")),
        Ok(IpAddr::V6(ip)) => Ok(format!("[{ip}]:{port}")),
        Err(_) => Err(format!("{:?} is not an IP address", socket.address)),
    }
}

fn convert(assignment: LoadAssignment, namespace: &str, notes: &mut Vec<String>) -> ClusterHosts {
    let mut hosts = Vec::new();
    let cluster = assignment.cluster_name;
    for group in assignment.endpoints {
        let locality_zone = group
            .locality
            .and_then(|l| l.zone)
            .filter(|z| !z.is_empty());
        for lb in group.lb_endpoints {
            let address = match host_address(lb.endpoint.as_ref().and_then(|e| e.address.as_ref()))
            {
                Ok(a) => a,
                Err(why) => {
                    notes.push(format!("cluster {cluster}: host skipped: {why}"));
                    continue;
                }
            };
            let ns = lb
                .metadata
                .as_ref()
                .and_then(|m| m.filter_metadata.get(namespace));
            let reading = read_metadata(ns);
            for odd in &reading.odd {
                notes.push(format!(
                    "cluster {cluster} host {address}: metadata {namespace}.{} = {} is not of the expected type; read as absent",
                    odd.key, odd.found
                ));
            }
            hosts.push(HostRecord {
                address,
                weight: lb.load_balancing_weight.unwrap_or(1).max(1),
                priority: group.priority,
                flags: reading.flags,
                zone: reading.zone.or_else(|| locality_zone.clone()),
                health: Health {
                    eds: None,
                    coarse: EdsHealth::from_name(lb.health_status.as_deref()),
                    failing: false,
                },
            });
        }
    }
    ClusterHosts {
        name: cluster,
        hosts,
    }
}

/// Parses a config dump (`include_eds`, optionally masked or `resource=`-filtered).
pub fn parse_config_dump(body: &[u8], namespace: &str) -> Result<EndpointsDump, AdminJsonError> {
    let dump: ConfigDump = serde_json::from_slice(body)
        .map_err(|e| AdminJsonError(format!("config_dump is not the expected JSON: {e}")))?;
    let mut out = EndpointsDump::default();
    for entry in dump.configs {
        let listed = entry
            .static_endpoint_configs
            .into_iter()
            .chain(entry.dynamic_endpoint_configs)
            .filter_map(|e| e.endpoint_config);
        for assignment in listed.chain(entry.endpoint_config) {
            let cluster = convert(assignment, namespace, &mut out.notes);
            out.clusters.push(cluster);
        }
    }
    Ok(out)
}

// --- /clusters?format=json shapes ---

#[derive(Deserialize)]
struct ClustersJson {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    name: String,
    eds_service_name: Option<String>,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Deserialize)]
struct HostStatus {
    address: Option<Address>,
    health_status: Option<HostHealthFlags>,
}

#[derive(Deserialize, Default)]
struct HostHealthFlags {
    eds_health_status: Option<String>,
    #[serde(default)]
    failed_active_health_check: bool,
    #[serde(default)]
    failed_outlier_check: bool,
    #[serde(default)]
    active_hc_timeout: bool,
    #[serde(default)]
    excluded_via_immediate_hc_fail: bool,
}

/// Envoy's live view of one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveHost {
    pub eds: EdsHealth,
    pub failing: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveCluster {
    /// The config dump lists an EDS cluster under its service name.
    pub eds_service_name: Option<String>,
    pub hosts: HashMap<String, LiveHost>,
}

/// `/clusters?format=json`, per cluster name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveHealth {
    pub clusters: HashMap<String, LiveCluster>,
}

pub fn parse_clusters(body: &[u8]) -> Result<LiveHealth, AdminJsonError> {
    let parsed: ClustersJson = serde_json::from_slice(body)
        .map_err(|e| AdminJsonError(format!("/clusters is not the expected JSON: {e}")))?;
    let mut live = LiveHealth::default();
    for cluster in parsed.cluster_statuses {
        let mut hosts = HashMap::with_capacity(cluster.host_statuses.len());
        for host in cluster.host_statuses {
            let Ok(address) = host_address(host.address.as_ref()) else {
                continue;
            };
            let f = host.health_status.unwrap_or_default();
            let failing = f.failed_active_health_check
                || f.failed_outlier_check
                || f.active_hc_timeout
                || f.excluded_via_immediate_hc_fail;
            let eds = EdsHealth::from_name(f.eds_health_status.as_deref());
            hosts.insert(address, LiveHost { eds, failing });
        }
        let eds_service_name = cluster.eds_service_name.filter(|s| !s.is_empty());
        live.clusters.insert(
            cluster.name,
            LiveCluster {
                eds_service_name,
                hosts,
            },
        );
    }
    Ok(live)
}

/// Whether the dump leaves some host's health open. Envoy's coarse verdict
/// in the dump says UNHEALTHY for EDS DRAINING/UNHEALTHY, failed active checks
/// and outlier ejection alike; only `/clusters` tells them apart. When every
/// host reads HEALTHY or DEGRADED, and `known` (the last live view) names every
/// cluster of the dump, the live view would add nothing.
pub fn needs_live_health(dump: &EndpointsDump, known: Option<&LiveHealth>) -> bool {
    let Some(known) = known else {
        return true;
    };
    let settled = |h: &HostRecord| {
        matches!(
            h.health.coarse,
            EdsHealth::Healthy | EdsHealth::Degraded | EdsHealth::Unknown
        )
    };
    let claimed = |name: &str| {
        known
            .clusters
            .iter()
            .any(|(n, c)| c.eds_service_name.as_deref().unwrap_or(n) == name)
    };
    dump.clusters
        .iter()
        .any(|c| !claimed(&c.name) || !c.hosts.iter().all(settled))
}

/// The live view the dump implies when `needs_live_health` is false: the
/// cluster names (and service names) of `known`, the hosts of the dump.
pub fn implied_live_health(dump: &EndpointsDump, known: &LiveHealth) -> LiveHealth {
    let mut live = LiveHealth::default();
    for (name, cluster) in &known.clusters {
        let listed_as = cluster.eds_service_name.as_deref().unwrap_or(name);
        let Some(entry) = dump.clusters.iter().find(|c| c.name == listed_as) else {
            continue;
        };
        let hosts = entry
            .hosts
            .iter()
            .map(|h| {
                let eds = if h.health.coarse == EdsHealth::Degraded {
                    EdsHealth::Degraded
                } else {
                    EdsHealth::Healthy
                };
                (
                    h.address.clone(),
                    LiveHost {
                        eds,
                        failing: false,
                    },
                )
            })
            .collect();
        live.clusters.insert(
            name.clone(),
            LiveCluster {
                eds_service_name: cluster.eds_service_name.clone(),
                hosts,
            },
        );
    }
    live
}

/// Joins the dump with live health: each Envoy cluster gets its hosts under
/// its own name (an EDS service name maps back to every cluster using it),
/// hosts Envoy no longer has are dropped, and live health is filled in.
/// Without a live view, or for a dump entry no live cluster claims, the dump
/// stands as it is.
pub fn join_live_health(dump: EndpointsDump, live: Option<&LiveHealth>) -> Vec<ClusterHosts> {
    let Some(live) = live else {
        return dump.clusters;
    };
    let mut by_dump_name: HashMap<&str, Vec<(&str, &LiveCluster)>> = HashMap::new();
    for (name, cluster) in &live.clusters {
        let listed_as = cluster.eds_service_name.as_deref().unwrap_or(name);
        by_dump_name
            .entry(listed_as)
            .or_default()
            .push((name, cluster));
    }
    let mut out = Vec::with_capacity(dump.clusters.len());
    for entry in dump.clusters {
        let Some(owners) = by_dump_name.get(entry.name.as_str()) else {
            out.push(entry);
            continue;
        };
        for (name, cluster) in owners {
            let hosts = entry
                .hosts
                .iter()
                .filter_map(|h| {
                    let seen = cluster.hosts.get(&h.address)?;
                    let mut host = h.clone();
                    host.health.eds = Some(seen.eds);
                    host.health.failing = seen.failing;
                    Some(host)
                })
                .collect();
            out.push(ClusterHosts {
                name: (*name).to_string(),
                hosts,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "k8s.endpointslice";
    // Real Envoy 1.40 output; see tests/fixtures/README.md for how it was made.
    const MASKED: &str = include_str!("../tests/fixtures/config_dump_endpoints_masked.json");
    const FULL: &str = include_str!("../tests/fixtures/config_dump_include_eds.json");
    const STATIC: &str = include_str!("../tests/fixtures/config_dump_static_endpoints.json");
    const DYNAMIC: &str = include_str!("../tests/fixtures/config_dump_dynamic_endpoints.json");
    const CLUSTERS: &str = include_str!("../tests/fixtures/clusters.json");

    fn cluster<'a>(clusters: &'a [ClusterHosts], name: &str) -> &'a ClusterHosts {
        clusters.iter().find(|c| c.name == name).unwrap()
    }

    fn view(c: &ClusterHosts) -> Vec<(String, Conditions)> {
        c.hosts
            .iter()
            .map(|h| (h.address.clone(), h.conditions()))
            .collect()
    }

    #[test]
    fn every_dump_shape_lists_the_same_clusters() {
        let names = |body: &str| {
            let mut n: Vec<String> = parse_config_dump(body.as_bytes(), NS)
                .unwrap()
                .clusters
                .into_iter()
                .map(|c| c.name)
                .collect();
            n.sort();
            n
        };
        let masked = names(MASKED);
        assert_eq!(masked.len(), 9, "{masked:?}");
        assert!(masked.contains(&"cds_backend_svc".to_string()));
        assert_eq!(names(FULL), masked);
        let mut split = names(STATIC);
        split.extend(names(DYNAMIC));
        split.sort();
        assert_eq!(split, masked);
    }

    #[test]
    fn real_dump_hosts_weights_zones_priorities() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let backend = cluster(&dump.clusters, "backend");
        let addrs: Vec<_> = backend.hosts.iter().map(|h| h.address.as_str()).collect();
        assert_eq!(
            addrs,
            ["127.0.0.1:20101", "127.0.0.1:20102", "127.0.0.1:20103"]
        );
        let weights: Vec<_> = backend.hosts.iter().map(|h| h.weight).collect();
        assert_eq!(weights, [1, 3, 1]);
        assert_eq!(
            backend.hosts[1].conditions(),
            Conditions::SERVING_TERMINATING
        );
        // 20103 is DRAINING, but the dump alone says UNHEALTHY.
        assert_eq!(backend.hosts[2].conditions(), Conditions::NOT_SERVING);
        let eds = cluster(&dump.clusters, "eds_backend");
        let prio: Vec<_> = eds.hosts.iter().map(|h| h.priority).collect();
        assert_eq!(prio, [0, 0, 0, 1, 1]);
        assert_eq!(
            eds.hosts[3].zone.as_deref(),
            Some("zone-b"),
            "locality zone fills in"
        );
        assert_eq!(
            eds.hosts[1].flags,
            MetaFlags::default(),
            "odd types read as absent"
        );
        let odd: Vec<_> = dump.notes.iter().filter(|n| n.contains("20202")).collect();
        assert_eq!(odd.len(), 2, "{:?}", dump.notes);
        assert!(
            odd.iter().any(|n| n.contains("serving = \"yes\"")),
            "{odd:?}"
        );
    }

    #[test]
    fn real_live_health_joins_by_service_name_and_sees_draining() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        assert_eq!(
            live.clusters["cds_backend"].eds_service_name.as_deref(),
            Some("cds_backend_svc")
        );
        let joined = join_live_health(dump, Some(&live));
        assert!(joined.iter().all(|c| c.name != "cds_backend_svc"));
        let backend = cluster(&joined, "backend");
        assert_eq!(
            backend.hosts[2].conditions(),
            Conditions::SERVING_TERMINATING,
            "DRAINING"
        );
        let cds = view(cluster(&joined, "cds_backend"));
        assert_eq!(
            cds,
            [
                ("127.0.0.1:20201".into(), Conditions::READY),
                ("127.0.0.1:20202".into(), Conditions::SERVING_TERMINATING),
                // Metadata says serving; active health checks fail it.
                ("127.0.0.1:20399".into(), Conditions::NOT_SERVING),
            ]
        );
        let outlier = view(cluster(&joined, "outlier_backend"));
        assert_eq!(outlier[0].1, Conditions::NOT_SERVING, "ejected");
        assert_eq!(outlier[1].1, Conditions::READY);
        let eds = view(cluster(&joined, "eds_backend"));
        assert_eq!(eds[2].1, Conditions::NOT_SERVING, "EDS UNHEALTHY");
    }

    #[test]
    fn live_health_is_needed_only_where_the_dump_leaves_it_open() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        // Never without a live view to know cluster names from.
        assert!(needs_live_health(&dump, None));
        // The fixture has DRAINING/failing hosts (coarse UNHEALTHY).
        assert!(needs_live_health(&dump, Some(&live)));
        let mut healthy = dump.clone();
        for c in &mut healthy.clusters {
            c.hosts.retain(|h| h.health.coarse != EdsHealth::Unhealthy);
        }
        assert!(!needs_live_health(&healthy, Some(&live)));
        // A cluster no live view has named yet (a new CDS cluster) needs it.
        let mut new_cluster = healthy.clone();
        new_cluster.clusters.push(ClusterHosts {
            name: "new_svc".into(),
            hosts: vec![],
        });
        assert!(needs_live_health(&new_cluster, Some(&live)));
    }

    #[test]
    fn implied_live_health_joins_like_the_real_one() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        let mut healthy = dump.clone();
        for c in &mut healthy.clusters {
            c.hosts.retain(|h| h.health.coarse != EdsHealth::Unhealthy);
        }
        let implied = implied_live_health(&healthy, &live);
        let mut real = live.clone();
        // The real view of the same hosts: drop those the healthy dump lacks.
        for (name, c) in real.clusters.iter_mut() {
            let listed_as = c.eds_service_name.clone().unwrap_or(name.clone());
            let Some(entry) = healthy.clusters.iter().find(|d| d.name == listed_as) else {
                continue;
            };
            c.hosts
                .retain(|a, _| entry.hosts.iter().any(|h| &h.address == a));
        }
        let joined = |l: &LiveHealth| {
            let mut v: Vec<_> = join_live_health(healthy.clone(), Some(l))
                .into_iter()
                .map(|c| (c.name.clone(), view(&c)))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_eq!(joined(&implied), joined(&real));
        assert!(
            joined(&implied).iter().any(|(n, _)| n == "cds_backend"),
            "service name mapped back"
        );
    }

    #[test]
    fn join_drops_hosts_envoy_no_longer_has() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let mut live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        let backend = live.clusters.get_mut("backend").unwrap();
        backend.hosts.remove("127.0.0.1:20102");
        live.clusters.remove("retry_backend");
        let joined = join_live_health(dump, Some(&live));
        assert_eq!(cluster(&joined, "backend").hosts.len(), 2);
        // Not in the live view at all: the dump stands.
        assert_eq!(cluster(&joined, "retry_backend").hosts.len(), 3);
    }

    #[test]
    fn odd_addresses_are_skipped_with_a_note() {
        let body = r#"{"configs":[{"static_endpoint_configs":[{"endpoint_config":{"cluster_name":"c","endpoints":[{"lb_endpoints":[
           {"endpoint":{"address":{"socket_address":{"address":"::1","port_value":18082}}}},
           {"endpoint":{"address":{"pipe":{"path":"/tmp/x"}}}},
           {"endpoint":{"address":{"socket_address":{"address":"db.local","port_value":5432}}}},
           {"endpoint":{"address":{"socket_address":{"address":"10.0.0.1","port_value":0}}}},
           {"endpoint":{"address":{"socket_address":{"address":"10.0.0.1"}}}},
           {}]}]}}]}]}"#;
        let dump = parse_config_dump(body.as_bytes(), NS).unwrap();
        let addrs: Vec<_> = dump.clusters[0]
            .hosts
            .iter()
            .map(|h| h.address.as_str())
            .collect();
        assert_eq!(addrs, ["[::1]:18082"]);
        assert_eq!(dump.notes.len(), 5, "{:?}", dump.notes);
        assert!(dump.notes.iter().any(|n| n.contains("db.local")));
    }

    #[test]
    fn resource_filtered_shape() {
        let dump = parse_config_dump(DYNAMIC.as_bytes(), NS).unwrap();
        assert_eq!(dump.clusters.len(), 1);
        assert_eq!(dump.clusters[0].name, "cds_backend_svc");
    }

    #[test]
    fn malformed_dumps_are_errors() {
        for body in [
            "",
            "{",
            "[]",
            "{\"configs\":{}}",
            "{\"configs\":[{\"endpoint_config\":{}}]}",
            "null",
            "<html>",
        ] {
            assert!(parse_config_dump(body.as_bytes(), NS).is_err(), "{body:?}");
        }
        // Truncated real output.
        assert!(parse_config_dump(&MASKED.as_bytes()[..MASKED.len() / 2], NS).is_err());
        // Deep nesting is refused by serde_json's recursion limit, not a crash.
        let deep = format!(
            "{{\"configs\":[{}{}]}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(parse_config_dump(deep.as_bytes(), NS).is_err());
    }

    #[test]
    fn admin_response_checks() {
        assert!(check_admin_response("x", Some(b"200"), 10, 10).is_ok());
        let e = check_admin_response("x", Some(b"200"), 11, 10).unwrap_err();
        assert!(e.0.contains("exceeds"), "{e}");
        let e = check_admin_response("x", Some(b"500"), 0, 10).unwrap_err();
        assert!(e.0.contains("HTTP 500"), "{e}");
        let e = check_admin_response("x", None, 0, 10).unwrap_err();
        assert!(e.0.contains("unreachable"), "{e}");
    }

    #[test]
    fn malformed_clusters_json() {
        assert!(parse_clusters(b"<html>").is_err());
        assert!(parse_clusters(&CLUSTERS.as_bytes()[..100]).is_err());
        assert!(parse_clusters(b"{\"cluster_statuses\":[{}]}").is_err());
        assert_eq!(parse_clusters(b"{}").unwrap(), LiveHealth::default());
    }
}
