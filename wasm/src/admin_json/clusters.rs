//! `/clusters?format=json`: Envoy's live view of every host (the EDS
//! status, DRAINING included, and failing checks); per-host `stats` are
//! skipped unparsed.

use super::fields::{health_of, host_address, Address, HealthName};
use super::AdminJsonError;
use rustc_hash::FxBuildHasher;
use serde::Deserialize;
use serving_picker_core::contract::EdsHealth;
use std::collections::HashMap;

#[derive(Deserialize)]
struct ClustersJson<'a> {
    #[serde(default, borrow)]
    cluster_statuses: Vec<ClusterStatus<'a>>,
}

#[derive(Deserialize)]
struct ClusterStatus<'a> {
    name: String,
    eds_service_name: Option<String>,
    #[serde(default, borrow)]
    host_statuses: Vec<HostStatus<'a>>,
}

#[derive(Deserialize)]
struct HostStatus<'a> {
    #[serde(borrow)]
    address: Option<Address<'a>>,
    health_status: Option<HostHealthFlags>,
}

#[derive(Deserialize, Default)]
struct HostHealthFlags {
    eds_health_status: Option<HealthName>,
    #[serde(default)]
    failed_active_health_check: bool,
    #[serde(default)]
    failed_outlier_check: bool,
    #[serde(default)]
    active_hc_timeout: bool,
    #[serde(default)]
    excluded_via_immediate_hc_fail: bool,
    #[serde(default)]
    pending_dynamic_removal: bool,
}

/// Envoy's live view of one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveHost {
    /// Its configured EDS status; a host kept pending removal reads `Draining`.
    pub eds: EdsHealth,
    /// Failing active health checks, timed out, or ejected by outlier detection.
    pub failing: bool,
}

/// Envoy's live view of one cluster's hosts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveCluster {
    /// The config dump lists an EDS cluster under its service name.
    pub eds_service_name: Option<String>,
    /// Its hosts by `IP:PORT`.
    pub hosts: HashMap<String, LiveHost, FxBuildHasher>,
}

/// `/clusters?format=json`, per cluster name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveHealth {
    /// Each cluster by its Envoy name.
    pub clusters: HashMap<String, LiveCluster, FxBuildHasher>,
}

/// Reads `/clusters?format=json` (hosts without a socket address are skipped).
pub fn parse_clusters(body: &[u8]) -> Result<LiveHealth, AdminJsonError> {
    let parsed: ClustersJson = serde_json::from_slice(body)
        .map_err(|e| AdminJsonError(format!("/clusters is not the expected JSON: {e}")))?;
    let mut live = LiveHealth::default();
    for cluster in parsed.cluster_statuses {
        let mut hosts =
            HashMap::with_capacity_and_hasher(cluster.host_statuses.len(), FxBuildHasher);
        for host in cluster.host_statuses {
            let Ok(address) = host_address(host.address.as_ref()) else {
                continue;
            };
            let f = host.health_status.unwrap_or_default();
            let failing = f.failed_active_health_check
                || f.failed_outlier_check
                || f.active_hc_timeout
                || f.excluded_via_immediate_hc_fail;
            let mut eds = health_of(f.eds_health_status);
            // Gone from EDS, kept by Envoy while it passes its checks: a pod
            // that left the Service drains, below the ready hosts.
            if f.pending_dynamic_removal
                && !matches!(eds, EdsHealth::Unhealthy | EdsHealth::Timeout)
            {
                eds = EdsHealth::Draining;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_json::fixtures::CLUSTERS;

    #[test]
    fn malformed_clusters_json() {
        assert!(parse_clusters(b"<html>").is_err());
        assert!(parse_clusters(&CLUSTERS.as_bytes()[..100]).is_err());
        assert!(parse_clusters(b"{\"cluster_statuses\":[{}]}").is_err());
        assert_eq!(parse_clusters(b"{}").unwrap(), LiveHealth::default());
    }
}
