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
    pub weight: u32,
    pub priority: u32,
    pub flags: MetaFlags,
    pub zone: Option<String>,
    /// `node_name` and the zone and node hints.
    pub topology: TopologyMeta,
    pub health: Health,
}

impl HostRecord {
    pub fn conditions(&self) -> Conditions {
        effective(&self.flags, &self.health)
    }
}

/// One cluster's hosts.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ClusterHosts {
    pub name: String,
    pub hosts: Vec<HostRecord>,
}
