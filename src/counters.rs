//! The counters both shells keep under the same `serving_picker.*` names
//! (Envoy shows them with its prefix for the extension: `wasmcustom.`,
//! `dynamicmodulescustom.`). Each shell names its own other counters and
//! gauges in its metrics module.

/// Requests given a host of the ready tier.
pub const PICK_READY: &str = "serving_picker.pick.ready";
/// Requests given a serving and terminating host (nothing ready).
pub const PICK_TERMINATING_FALLBACK: &str = "serving_picker.pick.terminating_fallback";
/// Picks by the topology mode that chose the host, indexed by
/// `plan::Topology as usize` (no hint in play, node hints, zone hints).
pub const PICK_TOPOLOGY: [&str; 3] = [
    "serving_picker.pick.topology.none",
    "serving_picker.pick.topology.node",
    "serving_picker.pick.topology.zone",
];
/// Requests refused because no host of the cluster is serving.
pub const REJECT_NO_SERVING: &str = "serving_picker.reject.no_serving";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Topology;

    #[test]
    fn topology_names_follow_the_enum() {
        for t in [Topology::None, Topology::Node, Topology::Zone] {
            assert_eq!(
                PICK_TOPOLOGY[t as usize],
                format!("serving_picker.pick.topology.{}", t.name())
            );
        }
    }
}
