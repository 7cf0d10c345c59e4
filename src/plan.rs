//! Tier choice per cluster, done once per endpoint change (KEP-1669 parity):
//! serving and not terminating if any, else serving and terminating, else none.
//! Inside the tier, load goes where Envoy's own load balancer would send it:
//! - **Priorities**: Envoy's priority load with the default overprovisioning
//!   factor (140): priority P takes min(100%, 1.4 x its tier hosts / all its
//!   hosts) of what the higher priorities left, and the rest spills to the
//!   next one; when the priorities' health adds up to less than 100% the loads
//!   are scaled up to 100% (Envoy's normalisation; never panic mode: hosts
//!   outside the tier get nothing).
//! - **Zones** (`local_zone`), within each priority: the local zone takes all
//!   of the priority's load when it holds at least an even share (1/zones) of
//!   the tier's weight there, else it takes `share x zones` and the rest
//!   spills to the other zones by weight: with the gateway's replicas spread
//!   evenly across the zones (Envoy's zone-aware routing with equal local
//!   shares), no zone gets more than its share of the traffic. Below
//!   `min_share` the local zone is not preferred at all.
//!
//! - **Topology hints** (kube-proxy's CategorizeEndpoints, cluster-wide
//!   service), among the ready tier only: when every ready host has node
//!   hints and one is hinted for `local_node`, the ready hosts hinted for it;
//!   else when every ready host has zone hints and one is hinted for the
//!   local zone, those; else all of them. "Ready" is the tier's sense:
//!   serving and not terminating after Envoy's health, so an ejected or
//!   failing host neither votes nor takes traffic (kube-proxy with that
//!   endpoint gone). The priorities' health is counted before the filter,
//!   so hints choose hosts inside a priority, not the load between them.
//!   The zone share rule above applies only when no ready host carries a
//!   hint; the terminating fallback ignores hints, as kube-proxy does.
//!
//! The outcome is one weighted host list: the original weights when one
//! priority and no zone rule decide, else weights scaled to the load.

use crate::contract::Tier;
use crate::host::{ClusterHosts, HostRecord};
use crate::topology::{has_hints, hinted};
use rustc_hash::FxBuildHasher;
use std::collections::hash_map::{Entry, HashMap};

/// Which hint decided the ready hosts (kube-proxy's topology mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Topology {
    /// No hint in play: every host of the tier.
    #[default]
    None = 0,
    /// The ready hosts hinted for `local_node`.
    Node = 1,
    /// The ready hosts hinted for the local zone.
    Zone = 2,
}

impl Topology {
    /// The hint of its code (`Topology as u8`), as the wasm filter's shared plans store it; `None`
    /// for any other byte.
    pub fn from_code(code: u8) -> Option<Topology> {
        match code {
            0 => Some(Topology::None),
            1 => Some(Topology::Node),
            2 => Some(Topology::Zone),
            _ => None,
        }
    }

    /// The hint's name in logs.
    pub fn name(self) -> &'static str {
        match self {
            Topology::None => "none",
            Topology::Node => "node",
            Topology::Zone => "zone",
        }
    }
}

/// A host new requests may go to, and its weight among the plan's hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedHost {
    /// `IP:PORT`, as the cluster lists it (`HostRecord::address`).
    pub address: String,
    /// Its share of the cluster's new requests, relative to the other planned hosts' weights.
    pub weight: u32,
}

/// The hosts new requests of one cluster may go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterPlan {
    /// The cluster's name (`ClusterHosts::name`).
    pub cluster: String,
    /// The tier the hosts come from (KEP-1669: the best non-empty one).
    pub tier: Tier,
    /// The hint that chose the hosts (`None` outside the ready tier).
    pub topology: Topology,
    /// The hosts, each address once (its listings' weights summed), by
    /// address; empty for `Tier::NoServing`.
    pub hosts: Vec<PlannedHost>,
}

/// Whether and how the local zone is preferred (`local_zone`, `local_zone_min_share`).
#[derive(Clone, Debug, PartialEq)]
pub struct ZonePreference {
    /// This Envoy's zone.
    pub local_zone: String,
    /// The local zone is used alone when it holds at least this share of the tier's weight.
    pub min_share: f64,
}

/// Envoy's default overprovisioning factor (percent).
pub const OVERPROVISIONING_FACTOR: u64 = 140;

/// Total of the scaled weights when load is split (fits u32 per host).
const SCALE: f64 = 1_000_000_000.0;

/// A host of the cluster with its index there.
type Indexed<'a> = (usize, &'a HostRecord);

fn weight_of(hosts: &[Indexed]) -> u64 {
    hosts.iter().map(|(_, h)| u64::from(h.weight)).sum()
}

/// Each host's fraction of one priority's load (summing to 1), or `None`
/// when the zone rule keeps the hosts' own weights.
fn zone_split(group: &[Indexed], zone: Option<&ZonePreference>) -> Option<Vec<f64>> {
    let pref = zone?;
    let local = |h: &HostRecord| h.zone.as_deref() == Some(pref.local_zone.as_str());
    let total = weight_of(group) as f64;
    let local_weight: u64 = group
        .iter()
        .filter(|(_, h)| local(h))
        .map(|(_, h)| u64::from(h.weight))
        .sum();
    let share = local_weight as f64 / total;
    if local_weight == 0 || share < pref.min_share {
        return None;
    }
    // Distinct zones by a linear scan: a group's zones are few, and a sort
    // would cost the wasm module kilobytes.
    let mut zones: Vec<Option<&str>> = Vec::new();
    for (_, h) in group {
        if !zones.contains(&h.zone.as_deref()) {
            zones.push(h.zone.as_deref());
        }
    }
    // All of it when the zone holds an even share, else its share's worth.
    let local_load = (share * zones.len() as f64).min(1.0);
    let rest = total - local_weight as f64;
    Some(
        group
            .iter()
            .map(|(_, h)| {
                let w = f64::from(h.weight);
                if local(h) {
                    local_load * w / local_weight as f64
                } else if rest > 0.0 {
                    (1.0 - local_load) * w / rest
                } else {
                    0.0
                }
            })
            .collect(),
    )
}

/// kube-proxy's topology mode over the ready hosts: node hints, then zone
/// hints, each only when every ready host has some and one names us.
pub fn topology_mode(
    ready: &[(usize, &HostRecord)],
    zone: Option<&str>,
    node: Option<&str>,
) -> Topology {
    let (zone, node) = (zone.unwrap_or_default(), node.unwrap_or_default());
    // (every host has node hints, one names us), the same for zones.
    let (mut all_nodes, mut for_node, mut all_zones, mut for_zone) = (true, false, true, false);
    for (_, h) in ready {
        let t = &h.topology;
        all_nodes &= has_hints(&t.hints_nodes);
        for_node |= hinted(&t.hints_nodes, node);
        all_zones &= has_hints(&t.hints_zones);
        for_zone |= hinted(&t.hints_zones, zone);
    }
    if all_nodes && for_node {
        Topology::Node
    } else if all_zones && for_zone {
        Topology::Zone
    } else {
        Topology::None
    }
}

/// `plan_cluster_at` without a local node (no node hints can match): the
/// tests' shorthand.
#[cfg(test)]
fn plan_cluster(cluster: &ClusterHosts, zone: Option<&ZonePreference>) -> ClusterPlan {
    plan_cluster_at(cluster, zone, None)
}

/// Sorts `items` by `name`, equal names kept in their order. One sort
/// (of `(&str, usize)`) serves every item type: each sort instantiation
/// costs the wasm module kilobytes.
pub fn sort_by_name<T>(items: &mut Vec<T>, name: impl Fn(&T) -> &str) {
    let mut order: Vec<(&str, usize)> = items.iter().map(&name).zip(0..).collect();
    order.sort_unstable();
    let order: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
    let mut taken: Vec<Option<T>> = items.drain(..).map(Some).collect();
    items.extend(
        order
            .into_iter()
            .filter_map(|i| taken.get_mut(i).and_then(Option::take)),
    );
}

/// The tier's hosts and their load, by index into the hosts they were
/// planned from: what `plan_cluster_at` names, and what a form that keeps
/// its own per-host data (the native module) maps back without addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weights {
    /// The tier the hosts come from.
    pub tier: Tier,
    /// The hint that chose them (`None` outside the ready tier).
    pub topology: Topology,
    /// (index into the hosts, weight), priority by priority in the hosts'
    /// order; a host listed twice is here twice (`plan_cluster_at` merges
    /// them by address).
    pub hosts: Vec<(usize, u32)>,
}

/// Which hint lists the plan can consult, for hosts of the ready tier only:
/// (zone hints, node hints). The zone hints need a local zone to match; the
/// node hints need a local node, or a local zone (any hint turns the zone
/// share rule off). A form may skip reading the others.
pub fn hints_used(zone: Option<&ZonePreference>, node: Option<&str>) -> (bool, bool) {
    (zone.is_some(), zone.is_some() || node.is_some())
}

/// The plan of one cluster for an Envoy in `zone`'s local zone and on `node`.
pub fn plan_cluster_at(
    cluster: &ClusterHosts,
    zone: Option<&ZonePreference>,
    node: Option<&str>,
) -> ClusterPlan {
    let weights = plan_weights(&cluster.hosts, zone, node);
    let address = |i: usize| cluster.hosts.get(i).map(|h| h.address.as_str());
    // A plain loop: an iterator chain here costs the wasm module bytes.
    let mut hosts = Vec::with_capacity(weights.hosts.len());
    for (i, weight) in merge_listings(&weights.hosts, address) {
        if let Some(address) = address(i) {
            hosts.push(PlannedHost {
                address: address.to_string(),
                weight,
            });
        }
    }
    sort_by_name(&mut hosts, |h| &h.address);
    ClusterPlan {
        cluster: cluster.name.clone(),
        tier: weights.tier,
        topology: weights.topology,
        hosts,
    }
}

/// One host listed more than once (the same address in two localities, or
/// two priorities) is one host with the weights summed, at its first
/// listing: `weights` are (host index, weight) as `Weights::hosts` has them,
/// `key` names a host by its index (the caller's address; `None` is never
/// merged). Hashed, not sorted: the native module rebuilds 10,000-host
/// tables with it.
pub fn merge_listings<'k>(
    weights: &[(usize, u32)],
    key: impl Fn(usize) -> Option<&'k str>,
) -> Vec<(usize, u32)> {
    let mut merged: Vec<(usize, u32)> = Vec::with_capacity(weights.len());
    let mut first: HashMap<&str, usize, FxBuildHasher> =
        HashMap::with_capacity_and_hasher(weights.len(), FxBuildHasher);
    for &(i, weight) in weights {
        let Some(k) = key(i) else {
            merged.push((i, weight));
            continue;
        };
        match first.entry(k) {
            Entry::Occupied(at) => {
                if let Some((_, w)) = merged.get_mut(*at.get()) {
                    *w = w.saturating_add(weight);
                }
            }
            Entry::Vacant(at) => {
                at.insert(merged.len());
                merged.push((i, weight));
            }
        }
    }
    merged
}

/// `plan_cluster_at`'s decision, by host index (no addresses read): the
/// tier, the topology hint inside it, then Envoy's priority load split by
/// zone or weight.
pub fn plan_weights(
    hosts: &[HostRecord],
    zone: Option<&ZonePreference>,
    node: Option<&str>,
) -> Weights {
    // The tier's hosts set the priorities' health; the hints choose among them.
    let (tier, in_tier) = tier_hosts(hosts);
    let local_zone = zone.map(|z| z.local_zone.as_str());
    let topology = match tier {
        Tier::Ready => topology_mode(&in_tier, local_zone, node),
        _ => Topology::None,
    };
    // The hosts the topology chooses.
    let here = |h: &HostRecord| match topology {
        Topology::Node => hinted(&h.topology.hints_nodes, node.unwrap_or_default()),
        Topology::Zone => hinted(&h.topology.hints_zones, local_zone.unwrap_or_default()),
        Topology::None => true,
    };
    // The zone share rule only when no host of the tier carries a hint.
    let zone = zone.filter(|_| {
        tier != Tier::Ready
            || !in_tier.iter().any(|(_, h)| {
                has_hints(&h.topology.hints_zones) || has_hints(&h.topology.hints_nodes)
            })
    });
    let groups = priority_groups(hosts, &in_tier, here);
    Weights {
        tier,
        topology,
        hosts: load_weights(&groups, zone),
    }
}

/// The tier (KEP-1672: serving and not terminating if any, else serving
/// and terminating, else none) and its hosts, in the hosts' order.
fn tier_hosts(hosts: &[HostRecord]) -> (Tier, Vec<Indexed<'_>>) {
    // Plain loops in here and below: iterator chains over index pairs cost
    // the wasm module bytes.
    let (mut ready, mut terminating): (Vec<Indexed>, Vec<Indexed>) = (Vec::new(), Vec::new());
    for host in hosts.iter().enumerate() {
        match host.1.conditions().tier() {
            Tier::Ready => ready.push(host),
            Tier::TerminatingFallback => terminating.push(host),
            Tier::NoServing => {}
        }
    }
    if !ready.is_empty() {
        (Tier::Ready, ready)
    } else if terminating.is_empty() {
        (Tier::NoServing, terminating)
    } else {
        (Tier::TerminatingFallback, terminating)
    }
}

/// Per priority (lowest first): the tier's hosts there that `here` keeps,
/// and the priority's health, as Envoy counts it from the tier's share of
/// all the priority's hosts (before the topology filter).
fn priority_groups<'a>(
    hosts: &[HostRecord],
    in_tier: &[Indexed<'a>],
    here: impl Fn(&HostRecord) -> bool,
) -> Vec<(Vec<Indexed<'a>>, f64)> {
    let mut groups: Vec<(Vec<Indexed>, f64)> = Vec::new();
    let mut after = None;
    while let Some(p) = in_tier
        .iter()
        .filter(|(_, h)| here(h))
        .map(|(_, h)| h.priority)
        .filter(|p| after.is_none_or(|a| *p > a))
        .min()
    {
        after = Some(p);
        let mut group: Vec<Indexed> = Vec::new();
        for &host in in_tier {
            if host.1.priority == p && here(host.1) {
                group.push(host);
            }
        }
        let all = hosts.iter().filter(|h| h.priority == p).count() as u64;
        let there = in_tier.iter().filter(|(_, h)| h.priority == p).count();
        // Unrounded, unlike Envoy's integer percent: one serving host of
        // 10,000 has some health (Envoy's 0 would mean panic mode, which
        // this never enters), so the tier is never left without load.
        let health = (OVERPROVISIONING_FACTOR as f64 * there as f64 / all.max(1) as f64).min(100.0);
        groups.push((group, health));
    }
    groups
}

/// Envoy's priority load over the groups, each priority's share split by
/// the zone rule or by weight: (host index, weight), the hosts' own weights
/// when one priority and no zone rule decide, else weights scaled to the
/// load.
fn load_weights(
    groups: &[(Vec<Indexed>, f64)],
    zone: Option<&ZonePreference>,
) -> Vec<(usize, u32)> {
    // Each priority takes its health of what is left; the sum is scaled to
    // 100% when the priorities' health falls short of it.
    let total_health: f64 = groups.iter().map(|g| g.1).sum::<f64>().min(100.0);
    let mut left = 100.0;
    let mut weighted: Vec<(Indexed, f64)> = Vec::new();
    let mut split = false;
    for (group, health) in groups {
        let load = health.min(left);
        left -= load;
        if load <= 0.0 {
            break;
        }
        let load = load / total_health;
        split |= load < 1.0;
        let fractions = zone_split(group, zone);
        split |= fractions.is_some();
        let total = weight_of(group) as f64;
        for (k, host) in group.iter().enumerate() {
            let fraction = match &fractions {
                Some(f) => f.get(k).copied().unwrap_or(0.0),
                None => f64::from(host.1.weight) / total,
            };
            weighted.push((*host, load * fraction));
        }
    }
    let mut out = Vec::with_capacity(weighted.len());
    for ((i, h), load) in weighted {
        if !split {
            out.push((i, h.weight));
        } else if load > 0.0 {
            // At least 1: a host with load keeps a place in the list.
            out.push((i, ((load * SCALE + 0.5) as u32).max(1)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Conditions, MetaFlags};
    use crate::health::Health;

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
            topology: Default::default(),
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

    /// Each host's share of the load, by address.
    fn shares(p: &ClusterPlan) -> Vec<(String, f64)> {
        let total: f64 = p.hosts.iter().map(|h| f64::from(h.weight)).sum();
        p.hosts
            .iter()
            .map(|h| (h.address.clone(), f64::from(h.weight) / total))
            .collect()
    }

    fn close(got: &[(String, f64)], want: &[(&str, f64)]) -> bool {
        got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|((a, s), (b, w))| a == b && (s - w).abs() < 1e-6)
    }

    fn cluster(hosts: Vec<HostRecord>) -> ClusterHosts {
        ClusterHosts {
            name: "c".into(),
            hosts,
        }
    }

    #[test]
    fn local_zone_takes_its_even_share_and_spills_the_rest() {
        let pref = |min_share| ZonePreference {
            local_zone: "z1".into(),
            min_share,
        };
        // An even share (1/2 of two zones) or more: the local zone alone.
        let even = plan_cluster(
            &cluster(vec![zoned(A, "z1", 1), zoned(B, "z2", 1)]),
            Some(&pref(0.2)),
        );
        assert!(close(&shares(&even), &[(A, 1.0)]), "{even:?}");
        // A third of the weight in two zones: 2/3 local, 1/3 spills.
        let third = plan_cluster(
            &cluster(vec![zoned(A, "z1", 1), zoned(B, "z2", 2)]),
            Some(&pref(0.3)),
        );
        assert!(
            close(&shares(&third), &[(A, 2.0 / 3.0), (B, 1.0 / 3.0)]),
            "{third:?}"
        );
        // Issue 16: a zone with 20% of the weight took 100%; now 40%.
        let fifth = plan_cluster(
            &cluster(vec![zoned(A, "z1", 1), zoned(B, "z2", 4)]),
            Some(&pref(0.2)),
        );
        assert!(close(&shares(&fifth), &[(A, 0.4), (B, 0.6)]), "{fifth:?}");
        // Below min_share: no preference, the hosts' own weights.
        let too_little = plan_cluster(
            &cluster(vec![zoned(A, "z1", 1), zoned(B, "z2", 3)]),
            Some(&pref(0.3)),
        );
        assert_eq!(
            too_little
                .hosts
                .iter()
                .map(|h| h.weight)
                .collect::<Vec<_>>(),
            [1, 3]
        );
        let none_local = plan_cluster(&cluster(vec![zoned(B, "z2", 1)]), Some(&pref(0.3)));
        assert_eq!(none_local.hosts.len(), 1);
    }

    fn at(addr: &str, priority: u32, c: Conditions) -> HostRecord {
        let mut h = host(addr, c);
        h.priority = priority;
        h
    }

    /// Issue 16: P0 = one ready host of four, P1 = two ready hosts. Envoy
    /// gives P0 min(100, 1.4 x 1/4) = 35% and P1 the other 65%: about a
    /// third each (the filter used to send everything to the P0 host).
    #[test]
    fn one_serving_host_among_many_still_takes_the_load() {
        // 1 of 10,000: Envoy's integer health would round to 0.
        let mut hosts: Vec<HostRecord> = (0..9_999)
            .map(|i| {
                host(
                    &format!("10.1.{}.{}:80", i / 256, i % 256),
                    Conditions::NOT_SERVING,
                )
            })
            .collect();
        hosts.push(host(A, Conditions::READY));
        let p = plan_cluster(&cluster(hosts.clone()), None);
        assert_eq!((p.tier, p.hosts.len()), (Tier::Ready, 1));
        assert_eq!(p.hosts[0].address, A);
        // ... and beside a small healthy priority 1, it keeps its share.
        hosts.push(at(B, 1, Conditions::READY));
        let p = plan_cluster(&cluster(hosts), None);
        assert_eq!(p.hosts.len(), 2, "{p:?}");
        assert!(p.hosts.iter().all(|h| h.weight > 0));
    }

    #[test]
    fn priorities_spill_like_envoys_priority_load() {
        const C: &str = "10.0.0.3:80";
        const D: &str = "10.0.0.4:80";
        const E: &str = "10.0.0.5:80";
        const F: &str = "10.0.0.6:80";
        let p = plan_cluster(
            &cluster(vec![
                at(A, 0, Conditions::READY),
                at(C, 0, Conditions::NOT_SERVING),
                at(D, 0, Conditions::NOT_SERVING),
                at(F, 0, Conditions::SERVING_TERMINATING),
                at(B, 1, Conditions::READY),
                at(E, 1, Conditions::READY),
            ]),
            None,
        );
        assert_eq!(p.tier, Tier::Ready);
        assert!(
            close(&shares(&p), &[(A, 0.35), (B, 0.325), (E, 0.325)]),
            "{p:?}"
        );
        // Both priorities short (35% each): scaled up to half each.
        let short = plan_cluster(
            &cluster(vec![
                at(A, 0, Conditions::READY),
                at(C, 0, Conditions::NOT_SERVING),
                at(D, 0, Conditions::NOT_SERVING),
                at(F, 0, Conditions::NOT_SERVING),
                at(B, 1, Conditions::READY),
                at(E, 1, Conditions::NOT_SERVING),
                at("10.0.0.7:80", 1, Conditions::NOT_SERVING),
                at("10.0.0.8:80", 1, Conditions::NOT_SERVING),
            ]),
            None,
        );
        assert!(close(&shares(&short), &[(A, 0.5), (B, 0.5)]), "{short:?}");
        // 3 of 4 ready at P0: 1.4 x 3/4 >= 100%: P1 gets nothing.
        let full = plan_cluster(
            &cluster(vec![
                at(A, 0, Conditions::READY),
                at(C, 0, Conditions::READY),
                at(D, 0, Conditions::READY),
                at(F, 0, Conditions::NOT_SERVING),
                at(B, 1, Conditions::READY),
            ]),
            None,
        );
        assert_eq!(
            full.hosts
                .iter()
                .map(|h| h.address.as_str())
                .collect::<Vec<_>>(),
            [A, C, D]
        );
        assert!(full.hosts.iter().all(|h| h.weight == 1), "own weights kept");
    }

    fn hinted_host(addr: &str, c: Conditions, zones: &str, nodes: &str) -> HostRecord {
        let mut h = host(addr, c);
        h.topology.hints_zones = zones.into();
        h.topology.hints_nodes = nodes.into();
        h
    }

    fn local(zone: Option<&str>) -> Option<ZonePreference> {
        zone.map(|z| ZonePreference {
            local_zone: z.into(),
            min_share: 0.2,
        })
    }

    /// kube-proxy's TestCategorizeEndpoints, cluster-wide cases (upstream
    /// and Antrea's node-hint ones): (zone, node, hosts, expected, mode).
    #[test]
    fn kube_proxy_categorize_endpoints() {
        const R: Conditions = Conditions::READY;
        const U: Conditions = Conditions::NOT_SERVING;
        const ST: Conditions = Conditions::SERVING_TERMINATING;
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Vec<(&'a str, Conditions, &'a str, &'a str)>,
            Vec<&'a str>,
            Topology,
        );
        let four = |n1: &'static str| {
            vec![
                ("10.1.2.3:80", R, "zone-a", n1),
                ("10.1.2.4:80", R, "zone-b", "node-2"),
                ("10.1.2.5:80", R, "zone-c", "node-3"),
                ("10.1.2.6:80", R, "zone-a", "node-4"),
            ]
        };
        let cases: Vec<Case> = vec![
            (
                Some("zone-a"),
                None,
                vec![
                    ("10.1.2.3:80", R, "zone-a", ""),
                    ("10.1.2.4:80", R, "zone-b", ""),
                    ("10.1.2.5:80", R, "zone-c", ""),
                    ("10.1.2.6:80", R, "zone-a", ""),
                ],
                vec!["10.1.2.3:80", "10.1.2.6:80"],
                Topology::Zone,
            ),
            (
                None,
                None,
                vec![("10.1.2.3:80", R, "zone-a", "")],
                vec!["10.1.2.3:80"],
                Topology::None,
            ),
            (
                Some("zone-b"),
                None,
                vec![("10.1.2.3:80", R, "zone-a", "")],
                vec!["10.1.2.3:80"],
                Topology::None,
            ),
            (
                Some("zone-a"),
                None,
                vec![
                    ("10.1.2.3:80", R, "zone-a", ""),
                    ("10.1.2.4:80", R, "zone-b", ""),
                    ("10.1.2.5:80", R, "zone-c", ""),
                    ("10.1.2.6:80", U, "zone-a", ""),
                ],
                vec!["10.1.2.3:80"],
                Topology::Zone,
            ),
            (
                Some("zone-a"),
                None,
                vec![
                    ("10.1.2.3:80", U, "zone-a", ""),
                    ("10.1.2.4:80", R, "zone-b", ""),
                    ("10.1.2.5:80", R, "zone-c", ""),
                    ("10.1.2.6:80", U, "zone-a", ""),
                ],
                vec!["10.1.2.4:80", "10.1.2.5:80"],
                Topology::None,
            ),
            (
                Some("zone-a"),
                None,
                vec![
                    ("10.1.2.3:80", R, "zone-a", ""),
                    ("10.1.2.4:80", R, "zone-b", ""),
                    ("10.1.2.5:80", R, "", ""),
                    ("10.1.2.6:80", R, "zone-a", ""),
                ],
                vec!["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"],
                Topology::None,
            ),
            (
                Some("zone-c"),
                None,
                vec![
                    ("10.1.2.3:80", R, "zone-a,zone-b,zone-c", ""),
                    ("10.1.2.4:80", R, "zone-b,zone-c", ""),
                    ("10.1.2.5:80", R, "zone-b,zone-d", ""),
                    ("10.1.2.6:80", R, "zone-c", ""),
                ],
                vec!["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"],
                Topology::Zone,
            ),
            (
                None,
                None,
                vec![("10.0.0.0:80", U, "", ""), ("10.0.0.1:80", U, "", "")],
                vec![],
                Topology::None,
            ),
            (
                None,
                None,
                vec![("10.0.0.0:80", U, "", ""), ("10.0.0.1:80", R, "", "")],
                vec!["10.0.0.1:80"],
                Topology::None,
            ),
            (
                None,
                None,
                vec![("10.0.0.0:80", ST, "", ""), ("10.0.0.1:80", ST, "", "")],
                vec!["10.0.0.0:80", "10.0.0.1:80"],
                Topology::None,
            ),
            (
                Some("zone-a"),
                Some("node-1"),
                four("node-1"),
                vec!["10.1.2.3:80"],
                Topology::Node,
            ),
            (
                Some("zone-a"),
                Some("node-1"),
                vec![
                    ("10.1.2.3:80", R, "zone-a", "node-1"),
                    ("10.1.2.4:80", R, "", ""),
                    ("10.1.2.5:80", R, "zone-c", "node-3"),
                    ("10.1.2.6:80", R, "zone-a", "node-4"),
                ],
                vec!["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"],
                Topology::None,
            ),
            (
                Some("zone-a"),
                Some("node-0"),
                four("node-1"),
                vec!["10.1.2.3:80", "10.1.2.6:80"],
                Topology::Zone,
            ),
            // Hinted ones terminating: the fallback ignores hints.
            (
                Some("zone-a"),
                None,
                vec![
                    ("10.0.0.0:80", ST, "zone-b", ""),
                    ("10.0.0.1:80", U, "zone-a", ""),
                ],
                vec!["10.0.0.0:80"],
                Topology::None,
            ),
        ];
        for (i, (zone, node, eps, want, mode)) in cases.into_iter().enumerate() {
            let hosts = eps
                .iter()
                .map(|(a, c, z, n)| hinted_host(a, *c, z, n))
                .collect();
            let p = plan_cluster_at(&cluster(hosts), local(zone).as_ref(), node);
            let got: Vec<&str> = p.hosts.iter().map(|h| h.address.as_str()).collect();
            assert_eq!((got, p.topology), (want, mode), "case {i}");
            // Own weights (one priority, no share rule).
            assert!(p.hosts.iter().all(|h| h.weight == 1), "case {i}");
        }
    }

    #[test]
    fn hints_win_over_the_zone_share_and_keep_priority_load() {
        // Hints present (even unusable ones): no share rule, own weights.
        let mut a = zoned(A, "z1", 1);
        let mut b = zoned(B, "z2", 3);
        a.topology.hints_zones = "z2".into();
        b.topology.hints_zones = "z2".into();
        let p = plan_cluster(
            &cluster(vec![a.clone(), b.clone()]),
            local(Some("z1")).as_ref(),
        );
        assert_eq!((p.topology, p.hosts.len()), (Topology::None, 2));
        assert_eq!(p.hosts.iter().map(|h| h.weight).collect::<Vec<_>>(), [1, 3]);
        // Without hints the share rule still decides (z1 alone: 1/4 < 1/2).
        a.topology.hints_zones.clear();
        b.topology.hints_zones.clear();
        let p = plan_cluster(&cluster(vec![a, b]), local(Some("z1")).as_ref());
        assert!(close(&shares(&p), &[(A, 0.5), (B, 0.5)]), "{p:?}");
        // P0: two ready hosts, one hinted here; P1 one ready: P0 is at full
        // health (hints do not move load between priorities).
        let mut far = at("10.0.0.9:80", 1, Conditions::READY);
        far.topology.hints_zones = "z1".into();
        let p = plan_cluster(
            &cluster(vec![
                hinted_host(A, Conditions::READY, "z1", ""),
                hinted_host(B, Conditions::READY, "z2", ""),
                far,
            ]),
            local(Some("z1")).as_ref(),
        );
        assert_eq!(p.topology, Topology::Zone);
        assert_eq!(p.hosts.len(), 1, "{p:?}");
        assert_eq!(p.hosts[0].address, A);
        // A failing hinted host: not ready, so the other one is the only vote.
        let mut down = hinted_host(A, Conditions::READY, "z1", "");
        down.health.failing = true;
        let p = plan_cluster(
            &cluster(vec![down, hinted_host(B, Conditions::READY, "z2", "")]),
            local(Some("z1")).as_ref(),
        );
        assert_eq!((p.topology, p.hosts.len()), (Topology::None, 1));
        assert_eq!(p.hosts[0].address, B);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn any_host() -> impl Strategy<Value = HostRecord> {
            (0u8..8, 1u32..5, 0u32..3, 0u8..4, 0u8..3).prop_map(|(ip, weight, priority, c, z)| {
                let c = [
                    Conditions::READY,
                    Conditions::SERVING_TERMINATING,
                    Conditions::NOT_SERVING,
                    TERMINATING_NOT_SERVING,
                ][usize::from(c)];
                let mut h = host(&format!("10.0.0.{ip}:80"), c);
                h.weight = weight;
                h.priority = priority;
                h.zone = (z > 0).then(|| format!("z{z}"));
                h
            })
        }

        const NAMES: [&str; 4] = ["", "a", "b", "a,b"];

        fn hinted_any() -> impl Strategy<Value = HostRecord> {
            (0u8..8, 0u8..4, 0u8..4, 0u8..4, 0u8..3, any::<bool>()).prop_map(
                |(ip, c, zones, nodes, z, failing)| {
                    let c = [
                        Conditions::READY,
                        Conditions::SERVING_TERMINATING,
                        Conditions::NOT_SERVING,
                        TERMINATING_NOT_SERVING,
                    ][usize::from(c)];
                    let mut h = host(&format!("10.0.0.{ip}:80"), c);
                    h.zone = (z > 0).then(|| format!("z{z}"));
                    h.topology.hints_zones = NAMES[usize::from(zones)].replace(',', ",,");
                    h.topology.hints_nodes = NAMES[usize::from(nodes)].into();
                    h.health.failing = failing && ip % 3 == 0;
                    h
                },
            )
        }

        /// kube-proxy's CategorizeEndpoints and topologyModeFromHints, as
        /// quoted, with sets for hints and IsReady = ready and healthy.
        fn reference(hosts: &[HostRecord], zone: &str, node: &str) -> Vec<String> {
            let set = |list: &str| -> Vec<String> {
                list.split(',')
                    .map(|s| s.to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            };
            let ready = |h: &HostRecord| {
                let c = h.conditions();
                c.serving && !c.terminating
            };
            let (mut has_ready, mut for_node, mut all_node) = (false, false, true);
            let (mut for_zone, mut all_zone) = (false, true);
            for h in hosts.iter().filter(|h| ready(h)) {
                has_ready = true;
                let nodes = set(&h.topology.hints_nodes);
                if nodes.is_empty() {
                    all_node = false;
                } else if nodes.iter().any(|n| n == node) {
                    for_node = true;
                }
                let zones = set(&h.topology.hints_zones);
                if zones.is_empty() {
                    all_zone = false;
                } else if zones.iter().any(|z| z == zone) {
                    for_zone = true;
                }
            }
            let mode = if !has_ready {
                ""
            } else if all_node && for_node {
                "node"
            } else if all_zone && for_zone {
                "zone"
            } else {
                ""
            };
            let mut out: Vec<String> = hosts
                .iter()
                .filter(|h| {
                    ready(h)
                        && match mode {
                            "node" => set(&h.topology.hints_nodes).iter().any(|n| n == node),
                            "zone" => set(&h.topology.hints_zones).iter().any(|z| z == zone),
                            _ => true,
                        }
                })
                .map(|h| h.address.clone())
                .collect();
            if out.is_empty() {
                out = hosts
                    .iter()
                    .filter(|h| {
                        let c = h.conditions();
                        c.serving && c.terminating
                    })
                    .map(|h| h.address.clone())
                    .collect();
            }
            out.sort();
            out.dedup();
            out
        }

        proptest! {
            #[test]
            fn topology_is_kube_proxys(
                hosts in prop::collection::vec(hinted_any(), 0..10),
                zone in 0usize..3,
                node in 0usize..3,
            ) {
                let zone = ["", "a", "b"][zone];
                let node = ["", "a", "b"][node];
                let pref = ZonePreference { local_zone: zone.into(), min_share: 0.2 };
                let p = plan_cluster_at(
                    &cluster(hosts.clone()),
                    (!zone.is_empty()).then_some(&pref),
                    (!node.is_empty()).then_some(node),
                );
                let got: Vec<String> = p.hosts.iter().map(|h| h.address.clone()).collect();
                let hints = hosts.iter().any(|h| {
                    let c = h.conditions();
                    c.serving && !c.terminating
                        && (has_hints(&h.topology.hints_zones) || has_hints(&h.topology.hints_nodes))
                });
                if hints || zone.is_empty() || p.tier != Tier::Ready {
                    // No share rule in play: exactly kube-proxy's set, own weights.
                    prop_assert_eq!(&got, &reference(&hosts, zone, node));
                    for ph in &p.hosts {
                        let own: u32 = hosts.iter().filter(|h| h.address == ph.address && {
                            let c = h.conditions();
                            c.serving && (p.tier != Tier::Ready || !c.terminating)
                        }).map(|h| h.weight).sum();
                        if p.topology == Topology::None {
                            prop_assert_eq!(ph.weight, own);
                        }
                    }
                }
                // Without hints, the node changes nothing.
                if !hints {
                    prop_assert_eq!(p.topology, Topology::None);
                    prop_assert_eq!(&p, &plan_cluster(&cluster(hosts.clone()), (!zone.is_empty()).then_some(&pref)));
                }
            }
        }

        proptest! {
            #[test]
            fn plans_stay_in_the_tier_and_follow_priority_load(
                hosts in prop::collection::vec(any_host(), 0..10),
                zoned in any::<bool>(),
                min_share in 0.05f64..1.0,
            ) {
                let pref = ZonePreference { local_zone: "z1".into(), min_share };
                let c = cluster(hosts.clone());
                let p = plan_cluster(&c, zoned.then_some(&pref));
                let in_tier = |h: &HostRecord| {
                    let k = h.conditions();
                    k.serving && (p.tier != Tier::Ready || !k.terminating)
                };
                // Only hosts of the tier, each once, each with some load.
                for planned in &p.hosts {
                    prop_assert!(hosts.iter().any(|h| h.address == planned.address && in_tier(h)));
                    prop_assert!(planned.weight > 0);
                }
                let mut addrs: Vec<_> = p.hosts.iter().map(|h| &h.address).collect();
                addrs.dedup();
                prop_assert_eq!(addrs.len(), p.hosts.len());
                prop_assert_eq!(p.hosts.is_empty(), p.tier == Tier::NoServing);
                let tier: Vec<&HostRecord> = hosts.iter().filter(|h| in_tier(h)).collect();
                if let Some(top) = tier.iter().map(|h| h.priority).min() {
                    // The tier's first priority always takes load.
                    prop_assert!(p.hosts.iter().any(|ph| tier
                        .iter()
                        .any(|h| h.priority == top && h.address == ph.address)));
                    // A priority at full health (1.4 x tier/all >= 1) leaves
                    // nothing to the ones after it.
                    let all = hosts.iter().filter(|h| h.priority == top).count() as u64;
                    let there = tier.iter().filter(|h| h.priority == top).count() as u64;
                    if OVERPROVISIONING_FACTOR * there >= 100 * all {
                        for ph in &p.hosts {
                            prop_assert!(hosts.iter().any(|h| h.address == ph.address && h.priority == top));
                        }
                    }
                    // One priority, no zone rule: the hosts' own weights.
                    if !zoned && tier.iter().all(|h| h.priority == top) {
                        let own: u64 = tier.iter().map(|h| u64::from(h.weight)).sum();
                        let planned: u64 = p.hosts.iter().map(|h| u64::from(h.weight)).sum();
                        prop_assert_eq!(own, planned);
                    }
                }
            }
        }
    }
}
