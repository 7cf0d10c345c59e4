//! The admin answers the parsers' tests read: real Envoy 1.40 output (see
//! tests/fixtures/README.md for how it was made), and helpers to look at
//! what they parse into.

use super::ClusterHosts;
use serving_picker_core::contract::Conditions;

pub const NS: &str = "k8s.endpointslice";
pub const MASKED: &str = include_str!("../../tests/fixtures/config_dump_endpoints_masked.json");
pub const FULL: &str = include_str!("../../tests/fixtures/config_dump_include_eds.json");
pub const STATIC: &str = include_str!("../../tests/fixtures/config_dump_static_endpoints.json");
pub const DYNAMIC: &str = include_str!("../../tests/fixtures/config_dump_dynamic_endpoints.json");
pub const CLUSTERS: &str = include_str!("../../tests/fixtures/clusters.json");

pub fn cluster<'a>(clusters: &'a [ClusterHosts], name: &str) -> &'a ClusterHosts {
    clusters.iter().find(|c| c.name == name).unwrap()
}

pub fn view(c: &ClusterHosts) -> Vec<(String, Conditions)> {
    c.hosts
        .iter()
        .map(|h| (h.address.clone(), h.conditions()))
        .collect()
}
