//! A host as every form sees it: address, weight, priority, the conditions
//! its metadata carries and what Envoy knows of its health.

use crate::contract::{Conditions, MetaFlags};
use crate::health::{effective, Health};
use crate::topology::TopologyMeta;

/// One host of a cluster, whichever shell read it.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRecord {
    /// `IP:PORT` (IPv6 as `[IP]:PORT`).
    pub address: String,
    /// The endpoint's load-balancing weight (EDS `load_balancing_weight`, 1 when unset).
    pub weight: u32,
    /// The EDS priority it is listed at (0 is the highest).
    pub priority: u32,
    /// The conditions its metadata carries (`contract::key`), each maybe absent.
    pub flags: MetaFlags,
    /// The zone of its EDS locality, when set.
    pub zone: Option<String>,
    /// `node_name` and the zone and node hints.
    pub topology: TopologyMeta,
    /// What Envoy knows of its health.
    pub health: Health,
}

impl HostRecord {
    /// Its effective conditions: the metadata's, else the EDS status, with Envoy's health on top
    /// (`health::effective`).
    pub fn conditions(&self) -> Conditions {
        effective(&self.flags, &self.health)
    }
}

/// One cluster's hosts.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ClusterHosts {
    /// The cluster's name (its EDS service name where the form reads the dump).
    pub name: String,
    /// Its hosts, every priority, in the order Envoy lists them.
    pub hosts: Vec<HostRecord>,
}
