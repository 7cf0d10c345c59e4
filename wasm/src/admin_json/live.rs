//! The config dump joined with the live view: each Envoy cluster's hosts
//! under its own name with their live health, and when the dump alone
//! settles every host's health (so `/clusters` need not be asked).

use super::clusters::{LiveCluster, LiveHealth, LiveHost};
use super::config_dump::EndpointsDump;
use super::{ClusterHosts, HostRecord};
use rustc_hash::FxBuildHasher;
use serving_picker_core::contract::EdsHealth;
use std::collections::HashMap;

/// Dump entries by name (their indexes), and whether a live cluster claims it.
pub type NameIndex<'a> = HashMap<&'a str, (Vec<usize>, bool), FxBuildHasher>;

/// Whether the dump leaves some host's health open. Envoy's coarse verdict
/// in the dump says UNHEALTHY for EDS DRAINING/UNHEALTHY, failed active checks
/// and outlier ejection alike; only `/clusters` tells them apart. When every
/// host reads HEALTHY or DEGRADED, and `known` (the last live view) names every
/// cluster of the dump (each once), the live view would add nothing.
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
    // A name listed twice is told apart by the hosts `/clusters` shows.
    let mut names = NameIndex::with_capacity_and_hasher(dump.clusters.len(), FxBuildHasher);
    dump.clusters.iter().any(|c| {
        names.insert(&c.name, Default::default()).is_some()
            || !claimed(&c.name)
            || !c.hosts.iter().all(settled)
    })
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
/// stands as it is. When the dump lists a name more than once (a cluster
/// named like another's EDS service name), each cluster claiming the name
/// takes the entry that holds most of its live hosts (ties: the one with
/// fewest hosts it lacks), never another cluster's.
pub fn join_live_health(dump: EndpointsDump, live: Option<&LiveHealth>) -> Vec<ClusterHosts> {
    let Some(live) = live else {
        return dump.clusters;
    };
    // Dump entries by name, and whether a live cluster claims the name.
    let mut by_name = NameIndex::default();
    for (i, entry) in dump.clusters.iter().enumerate() {
        by_name.entry(entry.name.as_str()).or_default().0.push(i);
    }
    // Per dump entry, the live clusters that take it (none: it stands as is,
    // unless its name is claimed by a cluster that took another entry).
    let mut owners: Vec<Vec<(&str, &LiveCluster)>> = vec![Vec::new(); dump.clusters.len()];
    for (name, cluster) in &live.clusters {
        let listed_as = cluster.eds_service_name.as_deref().unwrap_or(name);
        let Some((entries, claimed)) = by_name.get_mut(listed_as) else {
            continue;
        };
        *claimed = true;
        let score = |i: usize| {
            let hosts = dump.clusters.get(i).map_or(&[][..], |e| &e.hosts[..]);
            let found = hosts
                .iter()
                .filter(|h| cluster.hosts.contains_key(&h.address))
                .count();
            (found, usize::MAX - (hosts.len() - found), usize::MAX - i)
        };
        if let Some(best) = entries.iter().copied().max_by_key(|i| score(*i)) {
            if let Some(o) = owners.get_mut(best) {
                o.push((name.as_str(), cluster));
            }
        }
    }
    let name_claimed: Vec<bool> = dump
        .clusters
        .iter()
        .map(|e| by_name.get(e.name.as_str()).is_some_and(|n| n.1))
        .collect();
    let mut out = Vec::with_capacity(dump.clusters.len());
    for ((entry, owners), name_claimed) in dump.clusters.into_iter().zip(owners).zip(name_claimed) {
        let Some(((last_name, last), others)) = owners.split_last() else {
            if !name_claimed {
                out.push(entry);
            }
            continue;
        };
        let with = |mut host: HostRecord, cluster: &LiveCluster| {
            let seen = cluster.hosts.get(&host.address)?;
            host.health.eds = Some(seen.eds);
            host.health.failing = seen.failing;
            Some(host)
        };
        // Every owner but the last gets copies; the last takes the hosts.
        for (name, cluster) in others {
            out.push(ClusterHosts {
                name: (*name).to_string(),
                hosts: entry
                    .hosts
                    .iter()
                    .filter_map(|h| with(h.clone(), cluster))
                    .collect(),
            });
        }
        out.push(ClusterHosts {
            name: (*last_name).to_string(),
            hosts: entry
                .hosts
                .into_iter()
                .filter_map(|h| with(h, last))
                .collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_json::clusters::parse_clusters;
    use crate::admin_json::config_dump::parse_config_dump;
    use crate::admin_json::fixtures::{cluster, view, CLUSTERS, MASKED, NS};
    use serving_picker_core::contract::Conditions;

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

    /// STATIC `svc` and EDS `other` with `service_name: svc`: the dump lists
    /// `svc` twice; each cluster takes its own entry, whatever the order.
    #[test]
    fn a_cluster_named_like_another_clusters_service_name() {
        let entry = |addr: &str| {
            format!(
                r#"{{"endpoint_config":{{"cluster_name":"svc","endpoints":[{{"lb_endpoints":[
                {{"endpoint":{{"address":{{"socket_address":{{"address":"{addr}","port_value":80}}}}}}}}]}}]}}}}"#
            )
        };
        let (a, b) = (entry("10.0.0.1"), entry("10.0.0.2"));
        let live = parse_clusters(
            br#"{"cluster_statuses":[
              {"name":"svc","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}}]},
              {"name":"other","eds_service_name":"svc","host_statuses":[
                {"address":{"socket_address":{"address":"10.0.0.2","port_value":80}}}]}]}"#,
        )
        .unwrap();
        for (first, second) in [(&a, &b), (&b, &a)] {
            let body =
                format!(r#"{{"configs":[{{"static_endpoint_configs":[{first},{second}]}}]}}"#);
            let dump = parse_config_dump(body.as_bytes(), NS).unwrap();
            assert!(needs_live_health(&dump, Some(&live)), "a name listed twice");
            let mut joined: Vec<_> = join_live_health(dump, Some(&live))
                .into_iter()
                .map(|c| (c.name.clone(), view(&c)))
                .collect();
            joined.sort_by(|x, y| x.0.cmp(&y.0));
            assert_eq!(
                joined,
                [
                    (
                        "other".into(),
                        vec![("10.0.0.2:80".into(), Conditions::READY)]
                    ),
                    (
                        "svc".into(),
                        vec![("10.0.0.1:80".into(), Conditions::READY)]
                    ),
                ]
            );
        }
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
}
