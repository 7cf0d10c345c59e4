//! Host metadata as the main thread's load balancer read it, for every
//! instance of the cluster.
//!
//! Envoy's metadata getters (`lb_get_host_metadata_bool`, `_string`) hand the
//! module a value inside metadata whose last owner can be the main thread:
//! an EDS update replaces a host's metadata there while a worker may still be
//! reading the old one (docs/native.md, "Host metadata and Envoy's
//! threads"). So only the main thread's instance reads metadata through
//! Envoy (the main thread is the only writer: nothing is freed under it). It
//! publishes what it read here, per host, with a generation; every instance
//! builds its table from the published copy (`BoardSource`), and a worker
//! whose table predates the latest copy rebuilds before its next pick.
//!
//! Until the main thread's instance has published once, a worker reads
//! through Envoy as before (nothing to copy yet). A host the copy does not
//! list (its worker saw the update first) reads as not serving until the
//! copy catches up: unknown conditions never route.
//!
//! Everything kept is bounded in bytes: a string over [`MAX_VALUE_BYTES`] is
//! not kept (read as absent, counted), and a copy stops keeping strings past
//! [`MAX_BOARD_BYTES`].

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;
use serving_picker_core::contract::key;

use crate::table::{HostHealth, HostSource, MetadataKeys};

/// The longest metadata string kept, in bytes. Zones are at most 63
/// characters; hint lists name a few zones or nodes (at most 8 each).
pub const MAX_VALUE_BYTES: usize = 4096;

/// The most one cluster's copy keeps, in bytes (addresses and strings).
pub const MAX_BOARD_BYTES: usize = 64 << 20;

/// The metadata of one host listing, as the plan reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostMetadata {
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
    zone: Option<Box<str>>,
    hints_zones: Option<Box<str>>,
    hints_nodes: Option<Box<str>>,
}

impl HostMetadata {
    fn bool_value(&self, name: &str) -> Option<bool> {
        match name {
            key::READY => self.ready,
            key::SERVING => self.serving,
            key::TERMINATING => self.terminating,
            _ => None,
        }
    }

    fn str_value(&self, name: &str) -> Option<&str> {
        match name {
            key::ZONE => self.zone.as_deref(),
            key::HINTS_ZONES => self.hints_zones.as_deref(),
            key::HINTS_NODES => self.hints_nodes.as_deref(),
            _ => None,
        }
    }
}

/// One listing: where Envoy has it and what its metadata said.
#[derive(Debug)]
struct Listing {
    address: Box<str>,
    metadata: HostMetadata,
}

/// One cluster's metadata, read on the main thread.
#[derive(Debug)]
pub struct Snapshot {
    cluster: String,
    namespace: String,
    /// Per priority, the hosts in Envoy's order.
    priorities: Vec<Vec<Listing>>,
    /// (priority, address) to the first listing, for a worker whose host
    /// list is not the main thread's (rare: built on first use).
    by_address: OnceLock<FxHashMap<(u32, Box<str>), usize>>,
    /// Bytes kept (addresses, strings).
    pub bytes: usize,
    /// Strings not kept: over [`MAX_VALUE_BYTES`], or past [`MAX_BOARD_BYTES`].
    pub dropped_values: u64,
}

/// Reads a string, kept only within the byte bounds.
fn bounded(value: Option<&str>, bytes: &mut usize, dropped: &mut u64) -> Option<Box<str>> {
    let value = value?;
    if value.len() > MAX_VALUE_BYTES || *bytes + value.len() > MAX_BOARD_BYTES {
        *dropped += 1;
        return None;
    }
    *bytes += value.len();
    Some(value.into())
}

/// Reads one host's metadata through Envoy: the keys the plan can use
/// (`table::build`), whatever Envoy's health of the host (so that a worker
/// that sees another health finds what it asks for).
fn read_host(
    src: &impl HostSource,
    p: u32,
    i: usize,
    ns: &str,
    keys: MetadataKeys,
    bytes: &mut usize,
    dropped: &mut u64,
) -> HostMetadata {
    let serving = src.metadata_bool(p, i, ns, key::SERVING);
    let ready = match serving {
        Some(_) => None,
        None => src.metadata_bool(p, i, ns, key::READY),
    };
    let says_serving = serving.or(ready) != Some(false);
    let terminating = if says_serving {
        src.metadata_bool(p, i, ns, key::TERMINATING)
    } else {
        None
    };
    let says_ready = says_serving && terminating != Some(true);
    let mut string = |wanted: bool, name: &str| {
        if wanted {
            bounded(src.metadata_str(p, i, ns, name), bytes, dropped)
        } else {
            None
        }
    };
    HostMetadata {
        ready,
        serving,
        terminating,
        zone: string(keys.zone && says_serving, key::ZONE),
        hints_zones: string(keys.zone_hints && says_ready, key::HINTS_ZONES),
        hints_nodes: string(keys.node_hints && says_ready, key::HINTS_NODES),
    }
}

/// Reads every host's metadata through Envoy. Only the main thread's
/// instance calls this.
pub fn read(src: &impl HostSource, cluster: &str, ns: &str, keys: MetadataKeys) -> Snapshot {
    let mut bytes = 0usize;
    let mut dropped = 0u64;
    let priorities = src.priority_count().min(u32::MAX as usize) as u32;
    let mut listed = Vec::with_capacity(priorities as usize);
    for p in 0..priorities {
        let count = src.host_count(p);
        let mut hosts = Vec::with_capacity(count);
        for i in 0..count {
            // A host without an address is skipped by the table too.
            let Some(address) = src.address(p, i) else {
                hosts.push(Listing {
                    address: "".into(),
                    metadata: HostMetadata::default(),
                });
                continue;
            };
            let metadata = read_host(src, p, i, ns, keys, &mut bytes, &mut dropped);
            bytes += address.len();
            hosts.push(Listing {
                address: address.into(),
                metadata,
            });
        }
        listed.push(hosts);
    }
    Snapshot {
        cluster: cluster.to_string(),
        namespace: ns.to_string(),
        priorities: listed,
        by_address: OnceLock::new(),
        bytes,
        dropped_values: dropped,
    }
}

impl Snapshot {
    /// The metadata of Envoy's host `i` of priority `p` at `address`: the
    /// listing at the same place when it is that address (the host lists
    /// agree), else the first listing of that address in the priority.
    fn find(&self, p: u32, i: usize, address: &str) -> Option<&HostMetadata> {
        let listings = self.priorities.get(p as usize)?;
        if let Some(same) = listings.get(i).filter(|l| &*l.address == address) {
            return Some(&same.metadata);
        }
        let index = *self
            .by_address
            .get_or_init(|| self.index_by_address())
            .get(&(p, Box::<str>::from(address)))?;
        listings.get(index).map(|l| &l.metadata)
    }

    fn index_by_address(&self) -> FxHashMap<(u32, Box<str>), usize> {
        let mut index = FxHashMap::default();
        for (p, listings) in self.priorities.iter().enumerate() {
            for (i, listing) in listings.iter().enumerate() {
                if !listing.address.is_empty() {
                    index
                        .entry((p as u32, listing.address.clone()))
                        .or_insert(i);
                }
            }
        }
        index
    }
}

/// The latest copy of a cluster's metadata, shared by its instances.
#[derive(Debug, Default)]
pub struct MetadataBoard {
    /// Bumped after each publish: a worker compares it with the one its
    /// table was built at (one atomic load per pick).
    generation: AtomicU64,
    latest: Mutex<Option<Arc<Snapshot>>>,
}

impl MetadataBoard {
    /// The number of copies published so far (0: none yet).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Publishes the main thread's copy.
    pub fn publish(&self, snapshot: Arc<Snapshot>) {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(snapshot);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The generation seen, then the latest copy of `cluster` (`None`
    /// before the first publish). Read in that order, a publish in between
    /// only makes the caller rebuild once more.
    pub fn latest(&self, cluster: &str) -> (u64, Option<Arc<Snapshot>>) {
        let seen = self.generation();
        let snapshot = match self.latest.lock() {
            Ok(latest) => latest.clone().filter(|s| s.cluster == cluster),
            Err(_) => None,
        };
        (seen, snapshot)
    }
}

/// Envoy's hosts with their metadata from a copy: addresses, weights,
/// health and localities are the calling thread's (Envoy's, safe on any
/// thread: they never change for a host), metadata the copy's.
pub struct BoardSource<'a, S> {
    hosts: &'a S,
    snapshot: &'a Snapshot,
    /// The last host looked up: the table asks up to six keys of a host in a row.
    last: Cell<Option<(u32, usize, Option<&'a HostMetadata>)>>,
    /// Hosts the copy does not list (read as not serving).
    unknown: Cell<usize>,
}

impl<'a, S: HostSource> BoardSource<'a, S> {
    /// `hosts` with the metadata of `snapshot`.
    pub fn new(hosts: &'a S, snapshot: &'a Snapshot) -> Self {
        BoardSource {
            hosts,
            snapshot,
            last: Cell::new(None),
            unknown: Cell::new(0),
        }
    }

    /// Hosts read as not serving because the copy does not list them.
    pub fn unknown_hosts(&self) -> usize {
        self.unknown.get()
    }

    fn metadata(&self, p: u32, i: usize) -> Option<&'a HostMetadata> {
        if let Some((lp, li, found)) = self.last.get() {
            if (lp, li) == (p, i) {
                return found;
            }
        }
        let found = self
            .hosts
            .address(p, i)
            .and_then(|address| self.snapshot.find(p, i, address));
        self.last.set(Some((p, i, found)));
        found
    }
}

impl<S: HostSource> HostSource for BoardSource<'_, S> {
    fn priority_count(&self) -> usize {
        self.hosts.priority_count()
    }
    fn host_count(&self, p: u32) -> usize {
        self.hosts.host_count(p)
    }
    fn healthy_count(&self, p: u32) -> usize {
        self.hosts.healthy_count(p)
    }
    fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
        self.hosts.healthy_address(p, i)
    }
    fn address(&self, p: u32, i: usize) -> Option<&str> {
        self.hosts.address(p, i)
    }
    fn weight(&self, p: u32, i: usize) -> u32 {
        self.hosts.weight(p, i)
    }
    fn health(&self, p: u32, i: usize) -> HostHealth {
        self.hosts.health(p, i)
    }
    fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
        self.hosts.locality_zone(p, i)
    }
    fn metadata_bool(&self, p: u32, i: usize, ns: &str, name: &str) -> Option<bool> {
        if ns != self.snapshot.namespace {
            return None;
        }
        match self.metadata(p, i) {
            Some(found) => found.bool_value(name),
            None if name == key::SERVING => {
                // Not read by the main thread yet: never routed to.
                self.unknown.set(self.unknown.get() + 1);
                Some(false)
            }
            None => None,
        }
    }
    fn metadata_str(&self, p: u32, i: usize, ns: &str, name: &str) -> Option<&str> {
        if ns != self.snapshot.namespace {
            return None;
        }
        self.metadata(p, i).and_then(|found| found.str_value(name))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::testing::{FakeCluster, FakeHost};
    use serving_picker_core::config::SelectionConfig;

    const NS: &str = "k8s.endpointslice";
    const ALL_KEYS: MetadataKeys = MetadataKeys {
        zone: true,
        zone_hints: true,
        node_hints: true,
    };

    fn host(address: &str, ready: bool, serving: bool, terminating: bool) -> FakeHost {
        FakeHost::new(address)
            .conditions(ready, serving, terminating)
            .string(NS, "zone", "zone-a")
            .string(NS, "hints_zones", "zone-a")
            .string(NS, "hints_nodes", "node-1")
    }

    /// Every key the table reads answers the same through the copy as
    /// through Envoy, for each combination of conditions.
    #[test]
    fn the_copy_answers_what_envoy_answers_for_every_key_the_plan_reads() {
        let mut hosts = Vec::new();
        for (n, (r, s, t)) in [
            (true, true, false),
            (false, true, true),
            (false, false, true),
            (false, false, false),
        ]
        .into_iter()
        .enumerate()
        {
            hosts.push(host(&format!("10.0.0.{n}:80"), r, s, t));
        }
        let cluster = FakeCluster::of(vec![hosts]);
        let snapshot = read(&cluster, "c", NS, ALL_KEYS);
        let copy = BoardSource::new(&cluster, &snapshot);
        for i in 0..4 {
            for name in [key::SERVING, key::READY, key::TERMINATING] {
                let direct = cluster.metadata_bool(0, i, NS, name);
                let served = copy.metadata_bool(0, i, NS, name);
                // The copy skips what cannot matter: `ready` behind a present
                // `serving`, `terminating` behind "not serving".
                if served.is_some() {
                    assert_eq!(served, direct, "host {i} key {name}");
                }
            }
            let serving = cluster.metadata_bool(0, i, NS, key::SERVING) == Some(true);
            assert_eq!(
                copy.metadata_str(0, i, NS, key::ZONE).is_some(),
                serving,
                "host {i}: the zone of a serving host is kept"
            );
        }
        assert_eq!(copy.unknown_hosts(), 0);
    }

    /// The table built from the copy equals the table built through Envoy.
    #[test]
    fn a_table_from_the_copy_equals_the_table_from_envoy() {
        let hosts = vec![
            host("10.0.0.1:80", false, true, true),
            host("10.0.0.2:80", true, true, false),
            host("10.0.0.3:80", true, true, false),
            host("10.0.0.4:80", false, false, false),
        ];
        let cluster = FakeCluster::of(vec![hosts]);
        let config = SelectionConfig {
            local_zone: Some("zone-a".into()),
            ..SelectionConfig::default()
        };
        let keys = crate::table::metadata_keys(&config);
        let snapshot = read(&cluster, "c", NS, keys);
        let direct = crate::table::build(&cluster, &config);
        let copied = crate::table::build(&BoardSource::new(&cluster, &snapshot), &config);
        assert_eq!(direct.table, copied.table);
        assert_eq!(direct.draining, copied.draining);
        assert_eq!(direct.not_offered, copied.not_offered);
    }

    /// A worker whose host list has a host the copy does not know reads it
    /// as not serving: it is never picked until the copy lists it.
    #[test]
    fn a_host_the_copy_does_not_list_is_never_picked() {
        let old = FakeCluster::of(vec![vec![host("10.0.0.1:80", false, false, true)]]);
        let snapshot = read(&old, "c", NS, ALL_KEYS);
        // The worker sees B added (ready) before the main thread's copy has it.
        let now = FakeCluster::of(vec![vec![
            host("10.0.0.1:80", false, false, true),
            host("10.0.0.2:80", true, true, false),
        ]]);
        let source = BoardSource::new(&now, &snapshot);
        let built = crate::table::build(&source, &SelectionConfig::default());
        assert!(built.table.is_empty(), "{:?}", built.table);
        assert_eq!(source.unknown_hosts(), 1);
    }

    /// Host lists that differ (a removal shifted indexes) are matched by
    /// address; a host listed twice in a priority takes its first listing.
    #[test]
    fn shifted_indexes_are_matched_by_address() {
        let before = FakeCluster::of(vec![vec![
            host("10.0.0.1:80", true, true, false),
            host("10.0.0.2:80", false, false, false),
            host("10.0.0.3:80", false, true, true),
        ]]);
        let snapshot = read(&before, "c", NS, ALL_KEYS);
        let after = FakeCluster::of(vec![vec![
            host("10.0.0.2:80", false, false, false),
            host("10.0.0.3:80", false, true, true),
        ]]);
        let source = BoardSource::new(&after, &snapshot);
        assert_eq!(source.metadata_bool(0, 0, NS, key::SERVING), Some(false));
        assert_eq!(source.metadata_bool(0, 1, NS, key::SERVING), Some(true));
        assert_eq!(source.metadata_bool(0, 1, NS, key::TERMINATING), Some(true));
        assert_eq!(source.unknown_hosts(), 0);
    }

    /// Strings past the bounds are not kept, and counted.
    #[test]
    fn long_strings_are_not_kept_and_are_counted() {
        let long = "z".repeat(MAX_VALUE_BYTES + 1);
        let cluster = FakeCluster::of(vec![vec![FakeHost::new("10.0.0.1:80")
            .conditions(true, true, false)
            .string(NS, "zone", &long)
            .string(NS, "hints_zones", "zone-a")]]);
        let snapshot = read(&cluster, "c", NS, ALL_KEYS);
        assert_eq!(snapshot.dropped_values, 1);
        let source = BoardSource::new(&cluster, &snapshot);
        assert_eq!(source.metadata_str(0, 0, NS, key::ZONE), None);
        assert_eq!(
            source.metadata_str(0, 0, NS, key::HINTS_ZONES),
            Some("zone-a")
        );
        assert!(snapshot.bytes < 100, "{}", snapshot.bytes);
    }

    /// A copy of another cluster (or none) is not used; a publish moves the generation.
    #[test]
    fn the_board_serves_its_cluster_and_counts_publishes() {
        let board = MetadataBoard::default();
        let (generation, none) = board.latest("c");
        assert_eq!(generation, 0);
        assert!(none.is_none());
        let cluster = FakeCluster::of(vec![vec![host("10.0.0.1:80", true, true, false)]]);
        board.publish(Arc::new(read(&cluster, "c", NS, ALL_KEYS)));
        let (generation, snapshot) = board.latest("c");
        assert_eq!(generation, 1);
        assert!(snapshot.is_some());
        assert!(board.latest("other").1.is_none());
    }
}
