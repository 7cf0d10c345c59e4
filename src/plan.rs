//! Tier choice per cluster, done once per endpoint change (KEP-1672 parity):
//! serving and not terminating if any, else serving and terminating, else none.
//! Inside the tier: the lowest priority present, then the local zone when it
//! holds enough of the tier's weight.

use crate::host::{ClusterHosts, HostRecord};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Serving and not terminating.
    Ready = 1,
    /// Nothing ready: serving but terminating (a pod in preStop).
    TerminatingFallback = 2,
    /// No serving host at all.
    NoServing = 3,
}

impl Tier {
    pub fn from_code(code: u8) -> Option<Tier> {
        match code {
            1 => Some(Tier::Ready),
            2 => Some(Tier::TerminatingFallback),
            3 => Some(Tier::NoServing),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::Ready => "ready",
            Tier::TerminatingFallback => "terminating_fallback",
            Tier::NoServing => "no_serving",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedHost {
    pub address: String,
    pub weight: u32,
}

/// The hosts new requests of one cluster may go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterPlan {
    pub cluster: String,
    pub tier: Tier,
    pub hosts: Vec<PlannedHost>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ZonePreference {
    pub local_zone: String,
    /// The local zone is used alone when it holds at least this share of the tier's weight.
    pub min_share: f64,
}

fn weight_of(hosts: &[&HostRecord]) -> u64 {
    hosts.iter().map(|h| u64::from(h.weight)).sum()
}

pub fn plan_cluster(cluster: &ClusterHosts, zone: Option<&ZonePreference>) -> ClusterPlan {
    let serving = cluster.hosts.iter().filter(|h| h.conditions().serving);
    let ready: Vec<&HostRecord> = serving
        .clone()
        .filter(|h| !h.conditions().terminating)
        .collect();
    let (tier, mut chosen) = if !ready.is_empty() {
        (Tier::Ready, ready)
    } else {
        let fallback: Vec<&HostRecord> = serving.collect();
        if fallback.is_empty() {
            (Tier::NoServing, fallback)
        } else {
            (Tier::TerminatingFallback, fallback)
        }
    };
    if let Some(top) = chosen.iter().map(|h| h.priority).min() {
        chosen.retain(|h| h.priority == top);
    }
    if let Some(pref) = zone {
        let local: Vec<&HostRecord> = chosen
            .iter()
            .copied()
            .filter(|h| h.zone.as_deref() == Some(pref.local_zone.as_str()))
            .collect();
        let total = weight_of(&chosen);
        if !local.is_empty() && weight_of(&local) as f64 >= pref.min_share * total as f64 {
            chosen = local;
        }
    }
    let mut hosts: Vec<PlannedHost> = chosen
        .into_iter()
        .map(|h| PlannedHost {
            address: h.address.clone(),
            weight: h.weight,
        })
        .collect();
    // A host listed twice (e.g. in two localities) is one host with both weights.
    hosts.sort_by(|a, b| a.address.cmp(&b.address));
    hosts.dedup_by(|later, kept| {
        let same = later.address == kept.address;
        if same {
            kept.weight = kept.weight.saturating_add(later.weight);
        }
        same
    });
    ClusterPlan {
        cluster: cluster.name.clone(),
        tier,
        hosts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::{Conditions, Health, MetaFlags};

    fn host(addr: &str, c: Conditions) -> HostRecord {
        HostRecord {
            address: addr.into(),
            weight: 1,
            priority: 0,
            flags: MetaFlags {
                ready: None,
                serving: Some(c.serving),
                terminating: Some(c.terminating),
            },
            zone: None,
            health: Health::UNKNOWN,
        }
    }

    fn plan(hosts: Vec<HostRecord>) -> (Tier, Vec<String>) {
        let p = plan_cluster(
            &ClusterHosts {
                name: "c".into(),
                hosts,
            },
            None,
        );
        (p.tier, p.hosts.into_iter().map(|h| h.address).collect())
    }

    const A: &str = "10.0.0.1:80";
    const B: &str = "10.0.0.2:80";
    const TERMINATING_NOT_SERVING: Conditions = Conditions {
        serving: false,
        terminating: true,
    };

    #[test]
    fn the_table() {
        use Conditions as C;
        // A serving -> A
        assert_eq!(plan(vec![host(A, C::READY)]), (Tier::Ready, vec![A.into()]));
        // A not serving (terminating or not) -> nobody
        assert_eq!(
            plan(vec![host(A, C::NOT_SERVING)]),
            (Tier::NoServing, vec![])
        );
        assert_eq!(
            plan(vec![host(A, TERMINATING_NOT_SERVING)]),
            (Tier::NoServing, vec![])
        );
        // A serving+terminating -> A
        assert_eq!(
            plan(vec![host(A, C::SERVING_TERMINATING)]),
            (Tier::TerminatingFallback, vec![A.into()])
        );
        // A serving+terminating, B not yet serving -> A
        assert_eq!(
            plan(vec![
                host(A, C::SERVING_TERMINATING),
                host(B, C::NOT_SERVING)
            ]),
            (Tier::TerminatingFallback, vec![A.into()])
        );
        // A serving+terminating, B serving -> B
        assert_eq!(
            plan(vec![host(A, C::SERVING_TERMINATING), host(B, C::READY)]),
            (Tier::Ready, vec![B.into()])
        );
        // A terminating not serving, B serving -> B
        assert_eq!(
            plan(vec![host(A, TERMINATING_NOT_SERVING), host(B, C::READY)]),
            (Tier::Ready, vec![B.into()])
        );
        // No hosts at all
        assert_eq!(plan(vec![]), (Tier::NoServing, vec![]));
    }

    #[test]
    fn lowest_priority_of_the_tier() {
        let mut failover = host(B, Conditions::READY);
        failover.priority = 1;
        assert_eq!(
            plan(vec![host(A, Conditions::READY), failover.clone()]).1,
            vec![A.to_string()]
        );
        // Priority 0 only terminating: the ready tier still wins, at priority 1.
        assert_eq!(
            plan(vec![host(A, Conditions::SERVING_TERMINATING), failover]),
            (Tier::Ready, vec![B.into()])
        );
    }

    #[test]
    fn duplicate_addresses_merge_weights() {
        let mut a2 = host(A, Conditions::READY);
        a2.weight = 4;
        let p = plan_cluster(
            &ClusterHosts {
                name: "c".into(),
                hosts: vec![host(A, Conditions::READY), a2],
            },
            None,
        );
        assert_eq!(
            p.hosts,
            vec![PlannedHost {
                address: A.into(),
                weight: 5
            }]
        );
    }

    fn zoned(addr: &str, zone: &str, weight: u32) -> HostRecord {
        let mut h = host(addr, Conditions::READY);
        h.zone = Some(zone.into());
        h.weight = weight;
        h
    }

    #[test]
    fn local_zone_when_it_holds_enough_weight() {
        let pref = ZonePreference {
            local_zone: "z1".into(),
            min_share: 0.3,
        };
        let cluster = |hosts| ClusterHosts {
            name: "c".into(),
            hosts,
        };
        let enough = plan_cluster(
            &cluster(vec![zoned(A, "z1", 1), zoned(B, "z2", 2)]),
            Some(&pref),
        );
        assert_eq!(enough.hosts.len(), 1);
        assert_eq!(enough.hosts[0].address, A);
        let too_little = plan_cluster(
            &cluster(vec![zoned(A, "z1", 1), zoned(B, "z2", 3)]),
            Some(&pref),
        );
        assert_eq!(too_little.hosts.len(), 2, "0.25 < 0.3: use the whole tier");
        let none_local = plan_cluster(&cluster(vec![zoned(B, "z2", 1)]), Some(&pref));
        assert_eq!(none_local.hosts.len(), 1);
    }
}
