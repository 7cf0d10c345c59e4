//! One endpoint (address:port of a Service port) and what Envoy gets for it:
//! metadata `k8s.endpointslice` {ready, serving, terminating, zone,
//! node_name, hints_zones, hints_nodes}, a health status, and with the
//! priority output a priority.
//!
//! Nil conditions follow the discovery/v1 API: nil `ready` is true, nil
//! `serving` defers to `ready` (so it is true when both are nil), nil
//! `terminating` is false.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::slice::SliceEndpoint;

/// An endpoint's effective conditions (nil rules applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    /// The conditions as the API defines them for nil values.
    pub fn of(ep: &SliceEndpoint) -> Conditions {
        let ready = ep.ready.unwrap_or(true);
        Conditions {
            ready,
            serving: ep.serving.unwrap_or(ready),
            terminating: ep.terminating.unwrap_or(false),
        }
    }

    /// The most cautious view of two copies of one endpoint: ready and
    /// serving only if both say so, terminating if either does (a pod never
    /// stops terminating). See `index` for when copies disagree.
    pub fn cautious(self, other: Conditions) -> Conditions {
        Conditions {
            ready: self.ready && other.ready,
            serving: self.serving && other.serving,
            terminating: self.terminating || other.terminating,
        }
    }

    /// EDS health: serving endpoints HEALTHY, the others UNHEALTHY.
    pub fn health(self) -> Health {
        if self.serving {
            Health::Healthy
        } else {
            Health::Unhealthy
        }
    }

    /// The priority output: serving and not terminating at 0, serving and
    /// terminating at 1, not serving left out (`None`). Left out rather than
    /// UNHEALTHY: with every host unhealthy Envoy's panic mode would route
    /// to them.
    pub fn priority(self) -> Option<u32> {
        match (self.serving, self.terminating) {
            (true, false) => Some(0),
            (true, true) => Some(1),
            (false, _) => None,
        }
    }
}

/// The EDS health status an endpoint gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy,
}

/// One endpoint of a Service port, as resolved from its slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub conditions: Conditions,
    pub zone: Option<Arc<str>>,
    pub node_name: Option<Arc<str>>,
    /// Comma-separated zone hints; `None` without.
    pub hints_zones: Option<Arc<str>>,
    /// Comma-separated node hints; `None` without.
    pub hints_nodes: Option<Arc<str>>,
}

impl Endpoint {
    /// An endpoint of a slice at this port.
    pub fn new(ep: &SliceEndpoint, port: u16) -> Endpoint {
        Endpoint {
            addr: SocketAddr::new(ep.address, port),
            conditions: Conditions::of(ep),
            zone: ep.zone.clone(),
            node_name: ep.node_name.clone(),
            hints_zones: ep.hints_zones.clone(),
            hints_nodes: ep.hints_nodes.clone(),
        }
    }

    /// The metadata fields, in the order written: booleans always, strings
    /// only when set (hints comma-separated, absent when there are none).
    pub fn metadata_fields(&self) -> Vec<(&'static str, MetadataValue)> {
        let c = self.conditions;
        let mut v = vec![
            ("ready", MetadataValue::Bool(c.ready)),
            ("serving", MetadataValue::Bool(c.serving)),
            ("terminating", MetadataValue::Bool(c.terminating)),
        ];
        for (key, value) in [
            ("zone", &self.zone),
            ("node_name", &self.node_name),
            ("hints_zones", &self.hints_zones),
            ("hints_nodes", &self.hints_nodes),
        ] {
            if let Some(s) = value {
                v.push((key, MetadataValue::Str(s.clone())));
            }
        }
        v
    }
}

/// A metadata value (both forms read booleans and strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataValue {
    Bool(bool),
    Str(Arc<str>),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::fixtures::{conds as c, endpoint};

    fn ep(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> SliceEndpoint {
        SliceEndpoint {
            ready,
            serving,
            terminating,
            ..endpoint("10.0.0.1")
        }
    }

    #[test]
    fn nil_conditions_follow_the_api() {
        assert_eq!(Conditions::of(&ep(None, None, None)), c(true, true, false));
        // serving nil defers to ready.
        assert_eq!(
            Conditions::of(&ep(Some(false), None, None)),
            c(false, false, false)
        );
        // A present serving wins over ready (terminating pods: ready=false, serving=true).
        assert_eq!(
            Conditions::of(&ep(Some(false), Some(true), Some(true))),
            c(false, true, true)
        );
        assert_eq!(
            Conditions::of(&ep(None, Some(false), None)),
            c(true, false, false)
        );
    }

    #[test]
    fn health_and_priority_per_seed_row_state() {
        let ready = c(true, true, false);
        let st = c(false, true, true);
        let tns = c(false, false, true);
        let ns = c(false, false, false);
        assert_eq!(ready.health(), Health::Healthy);
        assert_eq!(st.health(), Health::Healthy);
        assert_eq!(tns.health(), Health::Unhealthy);
        assert_eq!(ns.health(), Health::Unhealthy);
        assert_eq!(ready.priority(), Some(0));
        assert_eq!(st.priority(), Some(1));
        assert_eq!(tns.priority(), None);
        assert_eq!(ns.priority(), None);
    }

    #[test]
    fn cautious_merge() {
        assert_eq!(
            c(true, true, false).cautious(c(false, true, true)),
            c(false, true, true)
        );
        assert_eq!(
            c(true, true, false).cautious(c(false, false, false)),
            c(false, false, false)
        );
    }

    #[test]
    fn metadata_fields_hints_joined_and_absent_when_empty() {
        let mut e = Endpoint::new(&ep(None, None, None), 80);
        let keys: Vec<&str> = e.metadata_fields().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, vec!["ready", "serving", "terminating"]);
        e.zone = Some("z1".into());
        e.node_name = Some("n1".into());
        e.hints_zones = crate::slice::joined(["z1", "z2"].into_iter());
        e.hints_nodes = crate::slice::joined(["n1"].into_iter());
        let f = e.metadata_fields();
        assert_eq!(f[3], ("zone", MetadataValue::Str("z1".into())));
        assert_eq!(f[4], ("node_name", MetadataValue::Str("n1".into())));
        assert_eq!(f[5], ("hints_zones", MetadataValue::Str("z1,z2".into())));
        assert_eq!(f[6], ("hints_nodes", MetadataValue::Str("n1".into())));
    }
}
