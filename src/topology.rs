//! A host's topology keys (the contract's `node_name`, `hints_zones`,
//! `hints_nodes`) and how a hint list names a zone or a node.

/// A host's topology keys (`node_name`, `hints_zones`, `hints_nodes`), as
/// the EndpointSlice has them: the hint keys are comma-separated names, and
/// an empty string (or an absent key) is no hint.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TopologyMeta {
    /// The `node_name` key: the endpoint's Kubernetes node.
    pub node_name: String,
    /// The `hints_zones` key: the zones the endpoint is hinted for.
    pub hints_zones: String,
    /// The `hints_nodes` key: the nodes the endpoint is hinted for.
    pub hints_nodes: String,
}

/// Whether a hint list names anything (commas alone do not).
pub fn has_hints(list: &str) -> bool {
    list.bytes().any(|b| b != b',')
}

/// Whether a hint list names `name` (never the empty name). Names are
/// Kubernetes zone and node names, which hold no commas nor spaces.
pub fn hinted(list: &str, name: &str) -> bool {
    let name = name.as_bytes();
    !name.is_empty() && list.as_bytes().split(|b| *b == b',').any(|n| n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_lists() {
        assert!(hinted("zone-a,zone-b", "zone-b"));
        assert!(!hinted("zone-a,zone-b", "zone"));
        assert!(!has_hints(""));
        assert!(!has_hints(",,") && has_hints(",a,") && hinted(",a,", "a"));
        assert!(!hinted(",", ""));
    }
}
