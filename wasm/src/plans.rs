//! Turning admin output into the plans the leader publishes.

use crate::admin_json::{join_live_health, EndpointsDump, LiveHealth};
use crate::config::PluginConfig;
use serving_picker_core::drain::draining_hosts;
use serving_picker_core::host::ClusterHosts;
use serving_picker_core::plan::{plan_cluster_at, sort_by_name, ClusterPlan, PlannedHost};

/// The weight that marks a planned host as draining, never picked: planning gives every host it
/// picks from a weight of at least 1, so the snapshot's format carries draining hosts unchanged.
pub const DRAINING_WEIGHT: u32 = 0;

/// A cluster's plan, with its draining hosts (`drain::draining_hosts`) listed after the picked
/// ones at [`DRAINING_WEIGHT`] when `drain_window_ms` is set.
fn plan_with_drain(c: &ClusterHosts, config: &PluginConfig) -> ClusterPlan {
    let zone = config.selection.zone_preference();
    let node = config.selection.local_node.as_deref();
    let mut plan = plan_cluster_at(c, zone.as_ref(), node);
    if config.drain.is_some() {
        let hosts = c.hosts.iter().map(|h| (h.address.as_str(), h.conditions()));
        let mut draining = draining_hosts(hosts);
        draining.sort_unstable();
        draining.dedup();
        for address in draining {
            plan.hosts.push(PlannedHost {
                address: address.to_string(),
                weight: DRAINING_WEIGHT,
            });
        }
    }
    plan
}

/// Plans for every managed cluster, sorted by name so that equal endpoints
/// encode to equal bytes (and an unchanged refresh publishes nothing).
pub fn build_plans(
    dump: EndpointsDump,
    live: Option<&LiveHealth>,
    config: &PluginConfig,
) -> Vec<ClusterPlan> {
    let clusters = join_live_health(dump, live);
    let mut plans: Vec<ClusterPlan> = clusters
        .iter()
        .filter(|c| config.manages(&c.name))
        .map(|c| plan_with_drain(c, config))
        .collect();
    sort_by_name(&mut plans, |p| &p.cluster);
    plans.dedup_by(|later, kept| later.cluster == kept.cluster);
    plans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_json::{parse_clusters, parse_config_dump};
    use crate::config::parse_config;
    use serving_picker_core::contract::Tier;

    const DUMP: &str = r#"{"configs":[{"static_endpoint_configs":[
      {"endpoint_config":{"cluster_name":"zeta","endpoints":[{"lb_endpoints":[
        {"endpoint":{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}},
         "metadata":{"filter_metadata":{"k8s.endpointslice":{"serving":true,"terminating":true}}}},
        {"endpoint":{"address":{"socket_address":{"address":"10.0.0.2","port_value":80}}}}]}]}},
      {"endpoint_config":{"cluster_name":"envoy_admin","endpoints":[{"lb_endpoints":[
        {"endpoint":{"address":{"socket_address":{"address":"127.0.0.1","port_value":9901}}}}]}]}},
      {"endpoint_config":{"cluster_name":"alpha","endpoints":[]}}]}]}"#;

    #[test]
    fn managed_clusters_sorted_admin_excluded() {
        let dump = parse_config_dump(DUMP.as_bytes(), "k8s.endpointslice").unwrap();
        let plans = build_plans(dump, None, &PluginConfig::default());
        let names: Vec<_> = plans.iter().map(|p| p.cluster.as_str()).collect();
        assert_eq!(names, ["alpha", "zeta"]);
        assert_eq!(plans[0].tier, Tier::NoServing);
        assert_eq!(plans[1].tier, Tier::Ready);
        assert_eq!(plans[1].hosts[0].address, "10.0.0.2:80");
    }

    #[test]
    fn live_failure_moves_the_tier() {
        let dump = parse_config_dump(DUMP.as_bytes(), "k8s.endpointslice").unwrap();
        let live = parse_clusters(
            br#"{"cluster_statuses":[{"name":"zeta","host_statuses":[
              {"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}},
              {"address":{"socket_address":{"address":"10.0.0.2","port_value":80}},
               "health_status":{"failed_outlier_check":true}}]}]}"#,
        )
        .unwrap();
        let plans = build_plans(dump, Some(&live), &PluginConfig::default());
        assert_eq!(plans[1].tier, Tier::TerminatingFallback);
        assert_eq!(plans[1].hosts[0].address, "10.0.0.1:80");
    }

    #[test]
    fn allow_list() {
        let dump = parse_config_dump(DUMP.as_bytes(), "k8s.endpointslice").unwrap();
        let config = parse_config(br#"{"clusters":["zeta","missing"]}"#).unwrap();
        let plans = build_plans(dump, None, &config);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].cluster, "zeta");
    }

    /// zeta: 10.0.0.1 serving+terminating, 10.0.0.2 ready (row 5).
    #[test]
    fn draining_hosts_follow_the_picked_ones_only_with_a_window() {
        let dump = || parse_config_dump(DUMP.as_bytes(), "k8s.endpointslice").unwrap();
        let without = build_plans(dump(), None, &PluginConfig::default());
        let zeta = without.iter().find(|p| p.cluster == "zeta").unwrap();
        assert!(zeta.hosts.iter().all(|h| h.weight > DRAINING_WEIGHT));
        let config = parse_config(br#"{"drain_window_ms":3000}"#).unwrap();
        let with = build_plans(dump(), None, &config);
        let zeta = with.iter().find(|p| p.cluster == "zeta").unwrap();
        let draining: Vec<&str> = zeta
            .hosts
            .iter()
            .filter(|h| h.weight == DRAINING_WEIGHT)
            .map(|h| h.address.as_str())
            .collect();
        assert_eq!(draining, vec!["10.0.0.1:80"]);
        assert_eq!(zeta.hosts.last().unwrap().weight, DRAINING_WEIGHT);
    }
}
