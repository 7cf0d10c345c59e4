//! The per-worker routing table built from a snapshot: the hot path is one
//! hash lookup and one O(1) pick. A new snapshot rebuilds only the clusters
//! whose part of it changed.

use crate::codec::{self, DecodeError};
use crate::plans::DRAINING_WEIGHT;
use rustc_hash::FxBuildHasher;
use serving_picker_core::contract::Tier;
use serving_picker_core::picker::Picker;
use serving_picker_core::plan::{ClusterPlan, Topology};
use std::cell::Cell;
use std::collections::HashMap;

/// Keyed by cluster names from Envoy's configuration, not by clients: a
/// keyed hash (SipHash, most of a pick's time, and kilobytes of module)
/// protects nothing here.
type Routes = HashMap<String, Route, FxBuildHasher>;

struct Route {
    tier: Tier,
    topology: Topology,
    /// Per host, the override header's value: the host, then `alternates`
    /// more hosts of the tier (cycled), which Envoy uses for retries.
    values: Vec<String>,
    picker: Option<Picker>,
    /// This worker's pick sequence for the cluster (carried across rebuilds).
    next: Cell<u64>,
    /// The snapshot section it was built from: an equal one keeps the route.
    section: Vec<u8>,
    /// Hosts whose open streams drain (`plans::DRAINING_WEIGHT`), never picked.
    draining: Vec<String>,
}

impl Route {
    fn new(mut plan: ClusterPlan, next: u64, alternates: usize, section: &[u8]) -> Route {
        let (hosts, draining): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.hosts)
            .into_iter()
            .partition(|h| h.weight != DRAINING_WEIGHT);
        plan.hosts = hosts;
        let draining = draining.into_iter().map(|h| h.address).collect();
        let weights: Vec<u32> = plan.hosts.iter().map(|h| h.weight).collect();
        let picker = Picker::new(&weights);
        let tier = if picker.is_none() {
            Tier::NoServing
        } else {
            plan.tier
        };
        let addresses: Vec<String> = plan.hosts.into_iter().map(|h| h.address).collect();
        Route {
            tier,
            topology: plan.topology,
            values: header_values(&addresses, alternates),
            picker,
            next: Cell::new(next),
            section: section.to_vec(),
            draining,
        }
    }
}

/// What an update did: routes kept as they were, routes built anew.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuild {
    /// Clusters whose section was unchanged: their route (and pick sequence) kept.
    pub kept: usize,
    /// Clusters whose route was built from a new or changed section.
    pub built: usize,
}

/// What a request to a cluster gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Override to `host` (`IP:PORT`, then the retry alternates), chosen
    /// from `tier` by `topology`.
    Pick {
        /// The header value: the picked host, then the retry alternates.
        host: &'a str,
        /// The tier the host comes from.
        tier: Tier,
        /// The hint that chose the tier's hosts.
        topology: Topology,
    },
    /// The cluster is known and nothing in it is serving.
    NoServing,
    /// The snapshot does not know the cluster.
    Unknown,
}

/// A worker's routes, one per cluster of the snapshot it took: each with its picker, its header
/// values and its pick sequence.
#[derive(Default)]
pub struct RoutingTable {
    routes: Routes,
    /// Retry alternates in each header value (fixed for a table's life, so a
    /// kept route's values stay right).
    alternates: usize,
}

impl RoutingTable {
    /// An empty table; each header value names `alternates` retry hosts after the pick.
    pub fn new(alternates: usize) -> RoutingTable {
        RoutingTable {
            routes: Routes::default(),
            alternates,
        }
    }

    /// Takes in a published snapshot. A cluster whose section is byte-equal
    /// to the one its route was built from keeps the route; a changed one is
    /// rebuilt and carries the pick sequence on, so that a rebuild does not
    /// send the next burst to its first host. A bad snapshot changes nothing.
    pub fn update(&mut self, snapshot: &[u8]) -> Result<Rebuild, DecodeError> {
        let sections = codec::sections(snapshot)?;
        // Decode what changed before touching a route.
        let mut fresh = Vec::with_capacity(sections.len());
        for section in &sections {
            let same = self
                .routes
                .get(section.cluster)
                .is_some_and(|r| r.section == section.bytes);
            fresh.push(match same {
                true => None,
                false => Some(codec::decode_section(section.bytes)?),
            });
        }
        let mut old = std::mem::take(&mut self.routes);
        self.routes.reserve(sections.len());
        let mut rebuild = Rebuild::default();
        for (section, plan) in sections.iter().zip(fresh) {
            // A name listed twice: the first wins, as in `build_plans`.
            if self.routes.contains_key(section.cluster) {
                continue;
            }
            let route = match (plan, old.remove(section.cluster)) {
                (None, Some(kept)) => {
                    rebuild.kept += 1;
                    kept
                }
                (Some(plan), previous) => {
                    rebuild.built += 1;
                    let next = previous.map_or(0, |r| r.next.get());
                    Route::new(plan, next, self.alternates, section.bytes)
                }
                // Not reached: an equal section means there was a route.
                (None, None) => continue,
            };
            self.routes.insert(section.cluster.to_string(), route);
        }
        Ok(rebuild)
    }

    /// What a request to `cluster` gets; a pick advances the cluster's sequence.
    pub fn decide(&self, cluster: &str) -> Decision<'_> {
        let Some(route) = self.routes.get(cluster) else {
            return Decision::Unknown;
        };
        let Some(picker) = &route.picker else {
            return Decision::NoServing;
        };
        let sequence = route.next.get();
        route.next.set(sequence.wrapping_add(1));
        match route.values.get(picker.pick(sequence)) {
            Some(host) => Decision::Pick {
                host,
                tier: route.tier,
                topology: route.topology,
            },
            None => Decision::NoServing,
        }
    }

    /// Clusters in the table.
    pub fn cluster_count(&self) -> usize {
        self.routes.len()
    }

    /// Each cluster with the hosts whose streams drain (none listed: no host drains).
    pub fn draining(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.routes
            .iter()
            .map(|(cluster, r)| (cluster.as_str(), r.draining.as_slice()))
    }

    /// Hosts over every cluster's plan.
    pub fn host_count(&self) -> usize {
        self.routes.values().map(|r| r.values.len()).sum()
    }
}

/// `host,next,next+1...`: `alternates` more hosts after the pick, in list
/// order, cycling the tier (so repeating hosts when it has fewer). Envoy's
/// override_host consumes one address per attempt and falls back to its own
/// load balancer, which picks any host, once the list runs out: every retry
/// the route makes needs an entry of the tier.
fn header_values(addresses: &[String], alternates: usize) -> Vec<String> {
    let n = addresses.len();
    let extra = alternates;
    (0..n)
        .map(|i| {
            let mut value = String::with_capacity((extra + 1) * 22);
            for k in 0..=extra {
                if k > 0 {
                    value.push(',');
                }
                value.push_str(&addresses[(i + k) % n]);
            }
            value
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serving_picker_core::plan::PlannedHost;

    fn plans() -> Vec<ClusterPlan> {
        let host = |a: &str, w| PlannedHost {
            address: a.into(),
            weight: w,
        };
        vec![
            ClusterPlan {
                cluster: "a".into(),
                tier: Tier::Ready,
                topology: Topology::Node,
                hosts: vec![host("1.1.1.1:1", 1), host("2.2.2.2:2", 1)],
            },
            ClusterPlan {
                cluster: "b".into(),
                tier: Tier::TerminatingFallback,
                topology: Topology::None,
                hosts: vec![host("3.3.3.3:3", 1)],
            },
            ClusterPlan {
                cluster: "none".into(),
                tier: Tier::NoServing,
                topology: Topology::None,
                hosts: vec![],
            },
        ]
    }

    fn table(plans: &[ClusterPlan], alternates: usize) -> RoutingTable {
        let mut t = RoutingTable::new(alternates);
        t.update(&codec::encode(plans)).unwrap();
        t
    }

    #[test]
    fn draining_hosts_are_listed_and_never_picked() {
        let mut plans = plans();
        plans[0].hosts.push(PlannedHost {
            address: "9.9.9.9:9".into(),
            weight: DRAINING_WEIGHT,
        });
        let t = table(&plans, 1);
        for _ in 0..8 {
            let Decision::Pick { host, .. } = t.decide("a") else {
                panic!("a pick")
            };
            assert!(!host.contains("9.9.9.9"), "{host}");
        }
        let draining: Vec<(&str, &[String])> =
            t.draining().filter(|(_, d)| !d.is_empty()).collect();
        assert_eq!(draining, vec![("a", &["9.9.9.9:9".to_string()][..])]);
        assert_eq!(t.host_count(), 3);
    }

    #[test]
    fn decisions() {
        let t = table(&plans(), 0);
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "1.1.1.1:1",
                tier: Tier::Ready,
                topology: Topology::Node,
            }
        );
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "2.2.2.2:2",
                tier: Tier::Ready,
                topology: Topology::Node,
            }
        );
        assert_eq!(
            t.decide("b"),
            Decision::Pick {
                host: "3.3.3.3:3",
                tier: Tier::TerminatingFallback,
                topology: Topology::None,
            }
        );
        assert_eq!(t.decide("none"), Decision::NoServing);
        assert_eq!(t.decide("other"), Decision::Unknown);
        assert_eq!((t.cluster_count(), t.host_count()), (3, 3));
    }

    #[test]
    fn clusters_have_their_own_sequence_and_keep_it_across_rebuilds() {
        let mut t = table(&plans(), 0);
        // Interleaving clusters must not starve a host of either.
        let mut seen = Vec::new();
        for _ in 0..2 {
            seen.push(t.decide("a"));
            let _ = t.decide("b");
        }
        assert_ne!(seen[0], seen[1]);
        let first_after_rebuild = |t: &RoutingTable| match t.decide("a") {
            Decision::Pick { host, .. } => host.to_string(),
            other => format!("{other:?}"),
        };
        let _ = t.decide("a");
        // "a" changed (its second host), so its route is rebuilt; the
        // sequence goes on (3 picks made: the next is its second host, where
        // a fresh sequence would start at the first).
        let mut changed = plans();
        changed[0].hosts[1].address = "9.9.9.9:9".into();
        let rebuild = t.update(&codec::encode(&changed)).unwrap();
        assert_eq!(rebuild, Rebuild { kept: 2, built: 1 });
        assert_eq!(first_after_rebuild(&t), "9.9.9.9:9");
    }

    #[test]
    fn an_update_rebuilds_only_changed_clusters_and_drops_gone_ones() {
        let mut t = table(&plans(), 0);
        let again = t.update(&codec::encode(&plans())).unwrap();
        assert_eq!(again, Rebuild { kept: 3, built: 0 });
        let mut changed = plans();
        changed[1].tier = Tier::Ready;
        changed.remove(2);
        let rebuild = t.update(&codec::encode(&changed)).unwrap();
        assert_eq!(rebuild, Rebuild { kept: 1, built: 1 });
        assert_eq!(t.decide("none"), Decision::Unknown);
        assert_eq!(
            t.decide("b"),
            Decision::Pick {
                host: "3.3.3.3:3",
                tier: Tier::Ready,
                topology: Topology::None,
            }
        );
        assert_eq!((t.cluster_count(), t.host_count()), (2, 3));
    }

    #[test]
    fn a_bad_snapshot_changes_nothing() {
        let mut t = table(&plans(), 0);
        let mut bytes = codec::encode(&plans());
        // The last cluster's tier byte: framing intact, content bad.
        let tier_at = bytes.len() - 4 - 1;
        bytes[tier_at] = 0xee;
        assert!(t.update(&bytes).is_err());
        assert!(t.update(b"garbage").is_err());
        assert_eq!((t.cluster_count(), t.host_count()), (3, 3));
        assert_eq!(t.decide("none"), Decision::NoServing);
    }

    #[test]
    fn retry_alternates_follow_the_pick() {
        let t = table(&plans(), 2);
        // Two hosts: the tier cycles so that both retries stay in it.
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "1.1.1.1:1,2.2.2.2:2,1.1.1.1:1",
                tier: Tier::Ready,
                topology: Topology::Node,
            }
        );
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "2.2.2.2:2,1.1.1.1:1,2.2.2.2:2",
                tier: Tier::Ready,
                topology: Topology::Node,
            }
        );
        // One host: it takes every attempt (never Envoy's round robin).
        assert_eq!(
            t.decide("b"),
            Decision::Pick {
                host: "3.3.3.3:3,3.3.3.3:3,3.3.3.3:3",
                tier: Tier::TerminatingFallback,
                topology: Topology::None,
            }
        );
        let v = header_values(&["a".into(), "b".into(), "c".into(), "d".into()], 2);
        assert_eq!(v, ["a,b,c", "b,c,d", "c,d,a", "d,a,b"]);
    }
}
