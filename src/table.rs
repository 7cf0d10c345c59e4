//! The per-worker routing table built from a snapshot: the hot path is one
//! hash lookup and one O(1) pick.

use crate::picker::Picker;
use crate::plan::{ClusterPlan, Tier};
use std::cell::Cell;
use std::collections::HashMap;

struct Route {
    tier: Tier,
    /// Per host, the override header's value: the host, then up to
    /// `alternates` other hosts of the tier, which Envoy uses for retries.
    values: Vec<String>,
    picker: Option<Picker>,
    /// This worker's pick sequence for the cluster (carried across rebuilds).
    next: Cell<u64>,
}

/// What a request to a cluster gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Override to `host` (`IP:PORT`, then the retry alternates), chosen from `tier`.
    Pick { host: &'a str, tier: Tier },
    /// The cluster is known and nothing in it is serving.
    NoServing,
    /// The snapshot does not know the cluster.
    Unknown,
}

#[derive(Default)]
pub struct RoutingTable {
    routes: HashMap<String, Route>,
}

impl RoutingTable {
    /// Builds the table; `previous` lends its pick sequences so a rebuild does
    /// not send the next burst of every cluster to its first host.
    pub fn build(
        plans: Vec<ClusterPlan>,
        previous: Option<&RoutingTable>,
        alternates: usize,
    ) -> RoutingTable {
        let mut routes = HashMap::with_capacity(plans.len());
        for plan in plans {
            let weights: Vec<u32> = plan.hosts.iter().map(|h| h.weight).collect();
            let picker = Picker::new(&weights);
            let tier = if picker.is_none() {
                Tier::NoServing
            } else {
                plan.tier
            };
            let next = previous
                .and_then(|p| p.routes.get(&plan.cluster))
                .map_or(0, |r| r.next.get());
            let addresses: Vec<String> = plan.hosts.into_iter().map(|h| h.address).collect();
            let values = header_values(&addresses, alternates);
            routes.insert(
                plan.cluster,
                Route {
                    tier,
                    values,
                    picker,
                    next: Cell::new(next),
                },
            );
        }
        RoutingTable { routes }
    }

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
            },
            None => Decision::NoServing,
        }
    }

    pub fn cluster_count(&self) -> usize {
        self.routes.len()
    }

    pub fn host_count(&self) -> usize {
        self.routes.values().map(|r| r.values.len()).sum()
    }
}

/// `host,next,next+1...`: the following hosts in list order, each once.
fn header_values(addresses: &[String], alternates: usize) -> Vec<String> {
    let n = addresses.len();
    let extra = alternates.min(n.saturating_sub(1));
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
    use crate::plan::PlannedHost;

    fn plans() -> Vec<ClusterPlan> {
        let host = |a: &str, w| PlannedHost {
            address: a.into(),
            weight: w,
        };
        vec![
            ClusterPlan {
                cluster: "a".into(),
                tier: Tier::Ready,
                hosts: vec![host("1.1.1.1:1", 1), host("2.2.2.2:2", 1)],
            },
            ClusterPlan {
                cluster: "b".into(),
                tier: Tier::TerminatingFallback,
                hosts: vec![host("3.3.3.3:3", 1)],
            },
            ClusterPlan {
                cluster: "none".into(),
                tier: Tier::NoServing,
                hosts: vec![],
            },
        ]
    }

    #[test]
    fn decisions() {
        let t = RoutingTable::build(plans(), None, 0);
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "1.1.1.1:1",
                tier: Tier::Ready
            }
        );
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "2.2.2.2:2",
                tier: Tier::Ready
            }
        );
        assert_eq!(
            t.decide("b"),
            Decision::Pick {
                host: "3.3.3.3:3",
                tier: Tier::TerminatingFallback
            }
        );
        assert_eq!(t.decide("none"), Decision::NoServing);
        assert_eq!(t.decide("other"), Decision::Unknown);
        assert_eq!((t.cluster_count(), t.host_count()), (3, 3));
    }

    #[test]
    fn clusters_have_their_own_sequence_and_keep_it_across_rebuilds() {
        let t = RoutingTable::build(plans(), None, 0);
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
        let rebuilt = RoutingTable::build(plans(), Some(&t), 0);
        assert_eq!(first_after_rebuild(&rebuilt), "2.2.2.2:2");
    }

    #[test]
    fn retry_alternates_follow_the_pick() {
        let t = RoutingTable::build(plans(), None, 2);
        // Two hosts: one alternate at most, never the picked host twice.
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "1.1.1.1:1,2.2.2.2:2",
                tier: Tier::Ready
            }
        );
        assert_eq!(
            t.decide("a"),
            Decision::Pick {
                host: "2.2.2.2:2,1.1.1.1:1",
                tier: Tier::Ready
            }
        );
        assert_eq!(
            t.decide("b"),
            Decision::Pick {
                host: "3.3.3.3:3",
                tier: Tier::TerminatingFallback
            }
        );
        let v = header_values(&["a".into(), "b".into(), "c".into(), "d".into()], 2);
        assert_eq!(v, ["a,b,c", "b,c,d", "c,d,a", "d,a,b"]);
    }
}
