//! Turning admin output into the plans the leader publishes.

use crate::admin_json::{join_live_health, EndpointsDump, LiveHealth};
use crate::config::PluginConfig;
use serving_picker_core::plan::{plan_cluster_at, sort_by_name, ClusterPlan};

/// Plans for every managed cluster, sorted by name so that equal endpoints
/// encode to equal bytes (and an unchanged refresh publishes nothing).
pub fn build_plans(
    dump: EndpointsDump,
    live: Option<&LiveHealth>,
    config: &PluginConfig,
) -> Vec<ClusterPlan> {
    let clusters = join_live_health(dump, live);
    let zone = config.selection.zone_preference();
    let node = config.selection.local_node.as_deref();
    let mut plans: Vec<ClusterPlan> = clusters
        .iter()
        .filter(|c| config.manages(&c.name))
        .map(|c| plan_cluster_at(c, zone.as_ref(), node))
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
}
