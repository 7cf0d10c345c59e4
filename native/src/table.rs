//! A worker's routing table for one cluster: built from Envoy's hosts when
//! the load balancer is created and on every membership update (adds,
//! removals, and the 0/0 updates Envoy sends for metadata, weight and health
//! changes), then read per request with an O(1) pick.
//!
//! The decision is the core's (`plan_weights`); this module only reads hosts
//! into `HostRecord`s and maps the planned hosts (by record index) back to
//! what `choose_host` must answer: (priority, index into that priority's
//! healthy hosts).
//! Indexes shift between updates, so everything is keyed by address and the
//! table is rebuilt whole.

use rustc_hash::FxHashMap;
use serving_picker_core::config::SelectionConfig;
use serving_picker_core::contract::{key, EdsHealth, MetaFlags, Tier};
use serving_picker_core::drain::draining_hosts;
use serving_picker_core::health::{effective, Health};
use serving_picker_core::host::HostRecord;
use serving_picker_core::picker::Picker;
use serving_picker_core::plan::{hints_used, merge_listings, plan_weights, Topology, Weights};
use serving_picker_core::topology::TopologyMeta;

/// Envoy's health of a host as `lb_get_host_health` answers it (Envoy's
/// coarse health: EDS DRAINING, failed checks and ejection all read
/// unhealthy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostHealth {
    /// Not offered for picking.
    Unhealthy,
    /// Offered, only when too few hosts are healthy.
    Degraded,
    /// Offered.
    Healthy,
}

/// What the table reads of a cluster's hosts: Envoy through the ABI in
/// production, plain vectors in tests and benchmarks.
pub trait HostSource {
    /// How many priorities the cluster has.
    fn priority_count(&self) -> usize;
    /// How many hosts priority `priority` has.
    fn host_count(&self, priority: u32) -> usize;
    /// How many of them Envoy offers as healthy.
    fn healthy_count(&self, priority: u32) -> usize;
    /// Address of the `index`th healthy host of the priority.
    fn healthy_address(&self, priority: u32, index: usize) -> Option<&str>;
    /// Address of host `index` of the priority.
    fn address(&self, priority: u32, index: usize) -> Option<&str>;
    /// The host's load-balancing weight.
    fn weight(&self, priority: u32, index: usize) -> u32;
    /// Envoy's coarse health of the host.
    fn health(&self, priority: u32, index: usize) -> HostHealth;
    /// The zone of the host's locality.
    fn locality_zone(&self, priority: u32, index: usize) -> Option<&str>;
    /// A bool in the host's filter_metadata[`ns`][`key`]; `None` when absent or not a bool.
    fn metadata_bool(&self, priority: u32, index: usize, ns: &str, key: &str) -> Option<bool>;
    /// A string in the host's filter_metadata[`ns`][`key`]; `None` when absent or not a string.
    fn metadata_str(&self, priority: u32, index: usize, ns: &str, key: &str) -> Option<&str>;
}

/// One pickable host: where Envoy has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The priority it is listed at.
    pub priority: u32,
    /// Index into the priority's healthy hosts: `choose_host`'s answer.
    pub healthy_index: u32,
    /// Index into the priority's hosts (what `should_select_another_host` takes).
    pub host_index: u32,
}

/// The per-worker table: the tier and its hosts, ready for O(1) picks.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The tier new requests are served from.
    pub tier: Tier,
    /// The hint that chose the hosts (counted per pick).
    pub topology: Topology,
    slots: Vec<Slot>,
    picker: Option<Picker>,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            tier: Tier::NoServing,
            topology: Topology::None,
            slots: Vec::new(),
            picker: None,
        }
    }
}

/// A rebuild's result: the table, and what it found on the way.
#[derive(Debug)]
pub struct Built {
    /// The hosts the table can pick.
    pub table: Table,
    /// Hosts the metadata (or EDS status) calls serving that Envoy does not
    /// offer as healthy (EDS DRAINING/UNHEALTHY/DEGRADED, failed active
    /// health checks, outlier ejection): they cannot be picked. Sorted.
    pub not_offered: Vec<String>,
    /// All hosts read, all priorities.
    pub hosts: usize,
    /// Hosts skipped because Envoy gave no (UTF-8) address.
    pub unreadable: usize,
    /// The hosts whose open streams drain (`serving_picker_core::drain::draining_hosts`:
    /// terminating while a ready host exists), by address.
    pub draining: Vec<String>,
}

/// Each host's index in its priority's healthy list. Envoy builds that list
/// by filtering the hosts in order, so one merge pass matches them; if the
/// order ever differs, an address map does it.
fn healthy_indexes(src: &impl HostSource, p: u32, hosts: &[Option<&str>]) -> Vec<Option<u32>> {
    let healthy = src.healthy_count(p).min(u32::MAX as usize);
    let mut out = vec![None; hosts.len()];
    let mut h = 0usize;
    let mut next = if healthy > 0 {
        src.healthy_address(p, 0)
    } else {
        None
    };
    for (i, addr) in hosts.iter().enumerate() {
        if h < healthy && addr.is_some() && *addr == next {
            out[i] = Some(h as u32);
            h += 1;
            next = if h < healthy {
                src.healthy_address(p, h)
            } else {
                None
            };
        }
    }
    if h == healthy {
        return out;
    }
    // Not a subsequence in order: match by address.
    let mut by_addr: FxHashMap<&str, u32> = FxHashMap::default();
    for k in 0..healthy {
        if let Some(a) = src.healthy_address(p, k) {
            by_addr.entry(a).or_insert(k as u32);
        }
    }
    hosts
        .iter()
        .map(|a| a.and_then(|a| by_addr.get(a).copied()))
        .collect()
}

/// The conditions in a host's metadata. Each read is an ABI call (a lock,
/// two map lookups in Envoy): a present `serving` wins over `ready`, and
/// `terminating` cannot matter to a host whose metadata says not serving.
fn read_flags(src: &impl HostSource, p: u32, i: usize, ns: &str) -> MetaFlags {
    let serving = src.metadata_bool(p, i, ns, key::SERVING);
    let ready = match serving {
        Some(_) => None,
        None => src.metadata_bool(p, i, ns, key::READY),
    };
    let terminating = match serving.or(ready) {
        Some(false) => None,
        _ => src.metadata_bool(p, i, ns, key::TERMINATING),
    };
    MetaFlags {
        ready,
        serving,
        terminating,
    }
}

fn text(value: Option<&str>) -> String {
    value.map(str::to_string).unwrap_or_default()
}

/// Which metadata strings the plan can use, beyond the conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetadataKeys {
    /// The zone of serving hosts: a local zone is set.
    pub zone: bool,
    /// The zone hint lists of ready hosts (`hints_used`).
    pub zone_hints: bool,
    /// The node hint lists of ready hosts (`hints_used`).
    pub node_hints: bool,
}

/// The metadata strings `build` reads under `cfg`.
pub fn metadata_keys(cfg: &SelectionConfig) -> MetadataKeys {
    let zone_pref = cfg.zone_preference();
    let (zone_hints, node_hints) = hints_used(zone_pref.as_ref(), cfg.local_node.as_deref());
    MetadataKeys {
        zone: zone_pref.is_some(),
        zone_hints,
        node_hints,
    }
}

/// What `build` reads of each host beyond its conditions: the metadata
/// namespace, and which keys the plan can use.
struct Wanted<'c> {
    ns: &'c str,
    keys: MetadataKeys,
}

/// One host as the core's record, its address left out (the plan answers
/// by index), and whether its metadata (or EDS status) calls it serving
/// though Envoy does not offer it (`offered`: in the healthy list).
fn read_host(
    src: &impl HostSource,
    want: &Wanted,
    p: u32,
    i: usize,
    offered: bool,
) -> (HostRecord, bool) {
    let flags = read_flags(src, p, i, want.ns);
    let (health, weight, serving_not_offered) = if offered {
        // In the healthy list: healthy, by Envoy's definition.
        let health = Health {
            eds: None,
            coarse: EdsHealth::Healthy,
            failing: false,
        };
        (health, src.weight(p, i), false)
    } else {
        let coarse = match src.health(p, i) {
            HostHealth::Healthy => EdsHealth::Healthy,
            HostHealth::Degraded => EdsHealth::Degraded,
            HostHealth::Unhealthy => EdsHealth::Unhealthy,
        };
        let mut health = Health {
            eds: None,
            coarse,
            failing: false,
        };
        let serving = effective(&flags, &health).serving;
        // Envoy will not route to it: not serving, whatever the metadata says.
        health.failing = true;
        // Never planned: its weight does not matter.
        (health, 1, serving)
    };
    let now = effective(&flags, &health);
    let zone = if want.keys.zone && now.serving {
        src.metadata_str(p, i, want.ns, key::ZONE)
            .filter(|z| !z.is_empty())
            .or_else(|| src.locality_zone(p, i).filter(|z| !z.is_empty()))
            .map(str::to_string)
    } else {
        None
    };
    let ready = now.serving && !now.terminating;
    let hints = |used: bool, key| {
        if used && ready {
            text(src.metadata_str(p, i, want.ns, key))
        } else {
            String::new()
        }
    };
    let topology = TopologyMeta {
        node_name: String::new(),
        hints_zones: hints(want.keys.zone_hints, key::HINTS_ZONES),
        hints_nodes: hints(want.keys.node_hints, key::HINTS_NODES),
    };
    let record = HostRecord {
        // The plan answers by index: the address stays with the caller.
        address: String::new(),
        weight,
        priority: p,
        flags,
        zone,
        topology,
        health,
    };
    (record, serving_not_offered)
}

/// Reads every host and plans the cluster. Reads only what the plan can
/// use: the zone of serving hosts when a local zone is set, the hints of
/// ready hosts when a local zone or node can match them (`hints_used`),
/// never `node_name`. (Keeping the record buffers between rebuilds made no
/// measurable difference in Envoy, whose allocator reuses the freed memory,
/// and would keep over a megabyte per instance of a 10,000-host cluster.)
pub fn build(src: &impl HostSource, cfg: &SelectionConfig) -> Built {
    let zone_pref = cfg.zone_preference();
    let local_node = cfg.local_node.as_deref();
    let want = Wanted {
        ns: cfg.metadata_namespace.as_str(),
        keys: metadata_keys(cfg),
    };
    let priorities = src.priority_count().min(u32::MAX as usize) as u32;
    let total: usize = (0..priorities).map(|p| src.host_count(p)).sum();
    let mut records = Vec::with_capacity(total);
    // Per record: where Envoy offers it (`None`: not in the healthy list),
    // and its address (borrowed from Envoy for this call).
    let mut offered: Vec<Option<Slot>> = Vec::with_capacity(total);
    let mut addresses: Vec<&str> = Vec::with_capacity(total);
    let mut not_offered = Vec::new();
    let mut unreadable = 0usize;
    for p in 0..priorities {
        let count = src.host_count(p).min(u32::MAX as usize);
        let all: Vec<Option<&str>> = (0..count).map(|i| src.address(p, i)).collect();
        let healthy = healthy_indexes(src, p, &all);
        for (i, (addr, healthy_index)) in all.iter().zip(healthy).enumerate() {
            let Some(addr) = *addr else {
                unreadable += 1;
                continue;
            };
            let (record, serving_not_offered) =
                read_host(src, &want, p, i, healthy_index.is_some());
            if serving_not_offered {
                not_offered.push(addr.to_string());
            }
            records.push(record);
            offered.push(healthy_index.map(|h| Slot {
                priority: p,
                healthy_index: h,
                host_index: i as u32,
            }));
            addresses.push(addr);
        }
    }
    let hosts = records.len() + unreadable;
    let plan = plan_weights(&records, zone_pref.as_ref(), local_node);
    not_offered.sort();
    not_offered.dedup();
    let draining = draining_hosts(
        addresses
            .iter()
            .zip(&records)
            .map(|(a, r)| (*a, r.conditions())),
    )
    .into_iter()
    .map(str::to_string)
    .collect();
    Built {
        table: table_of(&plan, &offered, &addresses),
        not_offered,
        hosts,
        unreadable,
        draining,
    }
}

/// The planned hosts (by record index) mapped back to where Envoy offers
/// them, ready for picks. A host listed twice (same address, e.g. in two
/// localities) is one pick with both weights, at its first planned listing.
fn table_of(plan: &Weights, offered: &[Option<Slot>], addresses: &[&str]) -> Table {
    let merged = merge_listings(&plan.hosts, |i| addresses.get(i).copied());
    let mut slots: Vec<Slot> = Vec::with_capacity(merged.len());
    let mut weights: Vec<u32> = Vec::with_capacity(merged.len());
    for (index, weight) in merged {
        // Every planned host is offered (the others are not serving).
        if let Some(Some(slot)) = offered.get(index) {
            slots.push(*slot);
            weights.push(weight);
        }
    }
    let picker = Picker::new(&weights);
    let tier = if picker.is_some() {
        plan.tier
    } else {
        Tier::NoServing
    };
    Table {
        tier,
        topology: plan.topology,
        slots,
        picker,
    }
}

/// One request's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Send the request to this host.
    Host {
        /// Where Envoy has it.
        slot: Slot,
        /// The tier it comes from.
        tier: Tier,
        /// A retry predicate refused the first pick and another host was taken.
        moved: bool,
    },
    /// No serving host: `choose_host` answers none (a 503).
    NoServing,
}

impl Table {
    /// Hosts that new requests may go to.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The table picks nothing.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Heap bytes held by the table (the benchmark's figure).
    #[cfg(any(test, feature = "testing"))]
    pub fn heap_bytes(&self) -> usize {
        let picker = match &self.picker {
            Some(Picker::Alias(_)) => self.slots.len() * (8 + 4),
            _ => 0,
        };
        self.slots.capacity() * std::mem::size_of::<Slot>() + picker
    }

    /// The `sequence`-th pick. When `avoid` refuses the pick (a retry whose
    /// predicate wants another host), up to `attempts` other hosts of the
    /// tier are tried in turn; if all are refused, the last one stands (as
    /// Envoy's own load balancers do).
    #[inline]
    pub fn choose(
        &self,
        sequence: u64,
        attempts: u32,
        mut avoid: impl FnMut(&Slot) -> bool,
    ) -> Choice {
        let Some(picker) = &self.picker else {
            return Choice::NoServing;
        };
        let n = self.slots.len();
        let first = picker.pick(sequence);
        let Some(mut slot) = self.slots.get(first).copied() else {
            return Choice::NoServing;
        };
        let mut moved = false;
        let tries = (attempts as usize).min(n.saturating_sub(1));
        for k in 1..=tries {
            if !avoid(&slot) {
                break;
            }
            match self.slots.get((first + k) % n) {
                Some(next) => {
                    slot = *next;
                    moved = true;
                }
                None => break,
            }
        }
        Choice::Host {
            slot,
            tier: self.tier,
            moved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self as fake, FakeCluster, FakeHost};

    fn cluster(hosts: Vec<FakeHost>) -> FakeCluster {
        FakeCluster {
            priorities: vec![hosts],
        }
    }

    fn built(c: &FakeCluster) -> Built {
        build(c, &SelectionConfig::default())
    }

    /// Addresses picked over `n` picks (no retries).
    fn picks(c: &FakeCluster, n: u64) -> Vec<String> {
        let b = built(c);
        (0..n)
            .filter_map(|s| match b.table.choose(s, 0, |_| false) {
                Choice::Host { slot, .. } => Some(
                    c.healthy_address(slot.priority, slot.healthy_index as usize)
                        .unwrap()
                        .to_string(),
                ),
                Choice::NoServing => None,
            })
            .collect()
    }

    const A: &str = "10.0.0.1:80";
    const B: &str = "10.0.0.2:80";
    const C: &str = "10.0.0.3:80";

    #[test]
    fn the_table_rows() {
        let ready = |a| FakeHost::new(a).conditions(true, true, false);
        let st = |a| FakeHost::new(a).conditions(false, true, true);
        let ns = |a| FakeHost::new(a).conditions(false, false, false);
        let tns = |a| FakeHost::new(a).conditions(false, false, true);
        assert_eq!(built(&cluster(vec![ready(A)])).table.tier, Tier::Ready);
        assert_eq!(picks(&cluster(vec![ready(A)]), 3), [A, A, A]);
        for rows in [vec![ns(A)], vec![tns(A)], vec![]] {
            let b = built(&cluster(rows));
            assert_eq!(b.table.tier, Tier::NoServing);
            assert_eq!(b.table.choose(0, 0, |_| false), Choice::NoServing);
        }
        let b = built(&cluster(vec![st(A)]));
        assert_eq!(b.table.tier, Tier::TerminatingFallback);
        assert_eq!(picks(&cluster(vec![st(A), ns(B)]), 2), [A, A]);
        assert_eq!(picks(&cluster(vec![st(A), ready(B)]), 2), [B, B]);
        assert_eq!(picks(&cluster(vec![tns(A), ready(B)]), 2), [B, B]);
    }

    #[test]
    fn answers_index_the_healthy_list() {
        // A is out of Envoy's healthy list: B is healthy index 0, C index 1.
        let c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false).not_offered(),
            FakeHost::new(B).conditions(true, true, false),
            FakeHost::new(C).conditions(true, true, false),
        ]);
        let b = built(&c);
        let mut seen: Vec<Slot> = (0..4)
            .filter_map(|s| match b.table.choose(s, 0, |_| false) {
                Choice::Host { slot, .. } => Some(slot),
                Choice::NoServing => None,
            })
            .collect();
        seen.sort_by_key(|s| s.healthy_index);
        seen.dedup();
        assert_eq!(
            seen,
            [
                Slot {
                    priority: 0,
                    healthy_index: 0,
                    host_index: 1
                },
                Slot {
                    priority: 0,
                    healthy_index: 1,
                    host_index: 2
                }
            ]
        );
        assert_eq!(b.not_offered, [A]);
    }

    #[test]
    fn serving_but_not_offered_falls_back_to_terminating() {
        // Ready A is ejected: terminating B is the only pickable serving host.
        let c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false).not_offered(),
            FakeHost::new(B).conditions(false, true, true),
        ]);
        let b = built(&c);
        assert_eq!(b.table.tier, Tier::TerminatingFallback);
        assert_eq!(picks(&c, 2), [B, B]);
        assert_eq!(b.not_offered, [A]);
        // Not serving by metadata and not offered: not counted.
        let c = cluster(vec![FakeHost::new(A)
            .conditions(false, false, false)
            .not_offered()]);
        assert!(built(&c).not_offered.is_empty());
        // No metadata, Envoy says unhealthy (EDS UNHEALTHY/DRAINING): not counted.
        assert!(built(&cluster(vec![FakeHost::new(A).not_offered()]))
            .not_offered
            .is_empty());
    }

    #[test]
    fn no_metadata_reads_coarse_health() {
        let c = cluster(vec![FakeHost::new(A), FakeHost::new(B)]);
        let mut got = picks(&c, 4);
        got.sort();
        assert_eq!(got, [A, A, B, B]);
        // Degraded: Envoy keeps it out of the healthy list; serving by status.
        let mut d = FakeHost::new(C);
        d.health = HostHealth::Degraded;
        d.offered = false;
        let b = built(&cluster(vec![d]));
        assert_eq!(b.table.tier, Tier::NoServing);
        assert_eq!(b.not_offered, [C]);
    }

    #[test]
    fn lowest_priority_with_a_serving_host() {
        let c = FakeCluster {
            priorities: vec![
                vec![FakeHost::new(A).conditions(false, false, false)],
                vec![FakeHost::new(B).conditions(true, true, false)],
            ],
        };
        let b = built(&c);
        match b.table.choose(0, 0, |_| false) {
            Choice::Host { slot, tier, .. } => {
                assert_eq!(
                    (slot.priority, slot.healthy_index, tier),
                    (1, 0, Tier::Ready)
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn weights_and_zone() {
        let c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false).weight(1),
            FakeHost::new(B).conditions(true, true, false).weight(3),
        ]);
        let got = picks(&c, 400);
        let b_share = got.iter().filter(|a| *a == B).count() as f64 / 400.0;
        assert!((b_share - 0.75).abs() < 0.02, "{b_share}");

        let c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false).zone("z1"),
            FakeHost::new(B).conditions(true, true, false).zone("z2"),
        ]);
        let cfg = SelectionConfig {
            local_zone: Some("z1".into()),
            ..SelectionConfig::default()
        };
        let b = build(&c, &cfg);
        assert_eq!(b.table.len(), 1);
        // The metadata zone wins over the locality's.
        let mut a = FakeHost::new(A).conditions(true, true, false).zone("z2");
        a.strings
            .push(("k8s.endpointslice".into(), "zone".into(), "z1".into()));
        let c = cluster(vec![
            a,
            FakeHost::new(B).conditions(true, true, false).zone("z2"),
        ]);
        let b = build(&c, &cfg);
        assert_eq!(b.table.len(), 1);
        assert_eq!(
            b.table.choose(0, 0, |_| false),
            b.table.choose(1, 0, |_| false)
        );
    }

    #[test]
    fn retries_move_to_another_host_of_the_tier() {
        let c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false),
            FakeHost::new(B).conditions(true, true, false),
            FakeHost::new(C).conditions(true, true, false),
        ]);
        let t = built(&c).table;
        // Refuse whatever host index 0 is: the pick moves on.
        for s in 0..6 {
            match t.choose(s, 3, |slot| slot.host_index == 0) {
                Choice::Host { slot, moved, .. } => {
                    assert_ne!(slot.host_index, 0);
                    assert_eq!(moved, s % 3 == 0);
                }
                Choice::NoServing => panic!(),
            }
        }
        // No attempts allowed: the predicate is not even asked.
        assert!(matches!(
            t.choose(0, 0, |_| panic!("asked")),
            Choice::Host { moved: false, .. }
        ));
        // A single-host tier stays put.
        let one = built(&cluster(vec![FakeHost::new(A)])).table;
        assert!(matches!(
            one.choose(0, 5, |_| true),
            Choice::Host { moved: false, .. }
        ));
        // Everything refused: bounded, the last one stands.
        assert!(matches!(
            t.choose(0, 100, |_| true),
            Choice::Host { moved: true, .. }
        ));
    }

    #[test]
    fn duplicate_addresses_and_unreadable_hosts() {
        let mut c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false),
            FakeHost::new(A).conditions(true, true, false).weight(2),
        ]);
        let b = built(&c);
        assert_eq!(b.table.len(), 1);
        assert_eq!(b.hosts, 2);
        // A host whose address cannot be read (the fake: an empty one) is
        // counted and skipped.
        c.priorities[0].push(FakeHost::new(""));
        c.priorities[0].push(FakeHost::new(B));
        let b = built(&c);
        assert_eq!((b.table.len(), b.unreadable, b.hosts), (2, 1, 4));
    }

    /// Healthy hosts listed in another order than all hosts: matched by address.
    struct Reordered(FakeCluster);

    impl HostSource for Reordered {
        fn priority_count(&self) -> usize {
            self.0.priority_count()
        }
        fn host_count(&self, p: u32) -> usize {
            self.0.host_count(p)
        }
        fn healthy_count(&self, p: u32) -> usize {
            self.0.healthy_count(p)
        }
        fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
            let n = self.0.healthy_count(p);
            self.0.healthy_address(p, n.checked_sub(i + 1)?)
        }
        fn address(&self, p: u32, i: usize) -> Option<&str> {
            self.0.address(p, i)
        }
        fn weight(&self, p: u32, i: usize) -> u32 {
            self.0.weight(p, i)
        }
        fn health(&self, p: u32, i: usize) -> HostHealth {
            self.0.health(p, i)
        }
        fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
            self.0.locality_zone(p, i)
        }
        fn metadata_bool(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<bool> {
            self.0.metadata_bool(p, i, ns, key)
        }
        fn metadata_str(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<&str> {
            self.0.metadata_str(p, i, ns, key)
        }
    }

    #[test]
    fn healthy_list_in_another_order_is_matched_by_address() {
        let src = Reordered(cluster(vec![
            FakeHost::new(A).conditions(true, true, false),
            FakeHost::new(B).conditions(true, true, false).not_offered(),
            FakeHost::new(C).conditions(false, true, true),
        ]));
        // Healthy list (reversed): [C, A]. Ready A is healthy index 1.
        let b = build(&src, &SelectionConfig::default());
        assert_eq!(
            b.table.choose(0, 0, |_| false),
            Choice::Host {
                slot: Slot {
                    priority: 0,
                    healthy_index: 1,
                    host_index: 0
                },
                tier: Tier::Ready,
                moved: false
            }
        );
        assert_eq!(b.not_offered, [B]);
    }

    fn hinted(a: &str, zones: &str) -> FakeHost {
        let mut h = FakeHost::new(a).conditions(true, true, false);
        h.strings.push((
            "k8s.endpointslice".into(),
            "hints_zones".into(),
            zones.into(),
        ));
        h
    }

    #[test]
    fn reads_only_what_the_plan_uses() {
        let c = cluster(vec![
            FakeHost::new(A).conditions(true, true, false),
            FakeHost::new(B).conditions(false, false, true),
            FakeHost::new(C).conditions(true, true, false).not_offered(),
        ]);
        let src = fake::Indexed::new(&c);
        let b = build(&src, &SelectionConfig::default());
        assert_eq!(b.table.len(), 1);
        // A: address, healthy address, serving, terminating, weight.
        // B: address, healthy address, serving (false: terminating cannot
        // matter), weight. C: address, serving, terminating, health.
        // No hints, no zone, no node_name.
        assert_eq!(src.reads(), 5 + 4 + 4);
        // A local zone: the zone and both hint lists of the ready host A;
        // the zone of nobody else (B is not serving, C not offered).
        let cfg = SelectionConfig {
            local_zone: Some("z1".into()),
            ..SelectionConfig::default()
        };
        let src = fake::Indexed::new(&c);
        build(&src, &cfg);
        // A's zone: metadata, then the locality (neither set).
        assert_eq!(src.reads(), 5 + 4 + 4 + 2 + 2);
    }

    #[test]
    fn zone_hints_choose_hosts_only_with_a_local_zone() {
        let c = cluster(vec![hinted(A, "z1"), hinted(B, "z2")]);
        assert_eq!(built(&c).table.len(), 2);
        let cfg = SelectionConfig {
            local_zone: Some("z1".into()),
            ..SelectionConfig::default()
        };
        let b = build(&c, &cfg);
        assert_eq!((b.table.len(), b.table.topology), (1, Topology::Zone));
        match b.table.choose(0, 0, |_| false) {
            Choice::Host { slot, .. } => assert_eq!(slot.host_index, 0),
            Choice::NoServing => panic!(),
        }
        // A not-offered hinted host neither votes nor is picked.
        let c = cluster(vec![hinted(A, "z1").not_offered(), hinted(B, "z2")]);
        let b = build(&c, &cfg);
        assert_eq!((b.table.len(), b.table.topology), (1, Topology::None));
    }

    #[test]
    fn ten_thousand_hosts_fit_in_memory_and_pick_in_range() {
        let c = fake::big_cluster(10_000, 10);
        let b = built(&c);
        assert_eq!(b.table.len(), 9_000);
        assert_eq!(b.not_offered.len(), 1_000);
        assert!(b.table.heap_bytes() < 2 << 20);
        for s in 0..20_000 {
            match b.table.choose(s, 0, |_| false) {
                Choice::Host { slot, .. } => assert!((slot.healthy_index as usize) < 9_000),
                Choice::NoServing => panic!(),
            }
        }
    }
}
