//! One endpoint (address:port of a Service port) and what Envoy gets for
//! it, as the core's metadata contract (`serving_picker_core::contract`)
//! has it: the conditions (the EndpointSlice API's nil rules applied), zone,
//! node and hints as metadata, a health status, and with the priority
//! output a priority.

use std::net::SocketAddr;
use std::sync::Arc;

use serving_picker_core::contract::{
    metadata_fields, MetaFlags, MetadataValue, SliceConditions, TopologyFields,
};

use crate::model::slice::SliceEndpoint;

/// A slice endpoint's conditions, the API's nil rules applied.
pub fn conditions_of(ep: &SliceEndpoint) -> SliceConditions {
    MetaFlags {
        ready: ep.ready,
        serving: ep.serving,
        terminating: ep.terminating,
    }
    .resolve()
}

/// One endpoint of a Service port, as resolved from its slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The slice endpoint's first address, at the slice's port number.
    pub addr: SocketAddr,
    /// Its conditions, nil rules applied.
    pub conditions: SliceConditions,
    /// `zone`, when set.
    pub zone: Option<Arc<str>>,
    /// `nodeName`, when set.
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
            conditions: conditions_of(ep),
            zone: ep.zone.clone(),
            node_name: ep.node_name.clone(),
            hints_zones: ep.hints_zones.clone(),
            hints_nodes: ep.hints_nodes.clone(),
        }
    }

    /// Takes in a later copy of this endpoint (another slice's, or a
    /// repeat in one slice): the most cautious conditions of the two
    /// (`index` says why), this copy's zone, node and hints.
    pub fn absorb(&mut self, copy: &Endpoint) {
        self.conditions = self.conditions.cautious(copy.conditions);
    }

    /// The metadata fields, in the order written (the contract's).
    pub fn metadata_fields(&self) -> Vec<(&'static str, MetadataValue<'_>)> {
        metadata_fields(
            self.conditions,
            TopologyFields {
                zone: self.zone.as_deref(),
                node_name: self.node_name.as_deref(),
                hints_zones: self.hints_zones.as_deref(),
                hints_nodes: self.hints_nodes.as_deref(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::{conds as c, endpoint};

    fn ep(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> SliceEndpoint {
        SliceEndpoint {
            ready,
            serving,
            terminating,
            ..endpoint("10.0.0.1")
        }
    }

    #[test]
    fn conditions_follow_the_api() {
        assert_eq!(conditions_of(&ep(None, None, None)), c(true, true, false));
        // A present serving wins over ready (terminating pods: ready=false, serving=true).
        assert_eq!(
            conditions_of(&ep(Some(false), Some(true), Some(true))),
            c(false, true, true)
        );
    }

    #[test]
    fn metadata_fields_hints_joined_and_absent_when_empty() {
        let mut e = Endpoint::new(&ep(None, None, None), 80);
        let keys: Vec<&str> = e.metadata_fields().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, vec!["ready", "serving", "terminating"]);
        e.zone = Some("z1".into());
        e.node_name = Some("n1".into());
        e.hints_zones = crate::model::slice::joined(["z1", "z2"].into_iter());
        e.hints_nodes = crate::model::slice::joined(["n1"].into_iter());
        let f = e.metadata_fields();
        assert_eq!(f[3], ("zone", MetadataValue::Str("z1")));
        assert_eq!(f[4], ("node_name", MetadataValue::Str("n1")));
        assert_eq!(f[5], ("hints_zones", MetadataValue::Str("z1,z2")));
        assert_eq!(f[6], ("hints_nodes", MetadataValue::Str("n1")));
    }
}
