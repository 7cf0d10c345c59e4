//! What the publisher publishes and the xDS streams read: each resource
//! as published ([`Resource`]: its encoded bytes and version), every
//! resource served now ([`Table`]) and what changed since the snapshot
//! before ([`Snapshot`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Instant, SystemTime};

use bytes::Bytes;

use crate::eds::assignment::CLA_TYPE_URL;
use crate::eds::response_bytes::{delta_entry_parts, resource_entry};

/// A resource name's key: a 64-bit hash, keyed per process (a client
/// cannot make up names that collide with served ones).
pub fn name_hash(name: &str) -> u64 {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let mut h = KEYS.get_or_init(Default::default).build_hasher();
    h.write(name.as_bytes());
    h.finish()
}

/// A version of an assignment's content, the same in every process (the
/// delta protocol's resource version: a client that reconnects with it,
/// even to a restarted companion, is not sent the same bytes again).
fn content_version(value: &[u8]) -> String {
    let mut h = std::hash::DefaultHasher::new();
    h.write(value);
    format!("{:016x}", h.finish())
}

/// One EDS resource as published.
#[derive(Debug)]
pub struct Resource {
    /// The resource name (the `--cluster` name, or a managed port's template name).
    pub name: String,
    /// [`name_hash`] of the name.
    pub hash: u64,
    /// Changes whenever the assignment does (unique within this process,
    /// growing).
    pub version: u64,
    /// The encoded ClusterLoadAssignment as a DiscoveryResponse's resource
    /// entry (`response_bytes::resource_entry`): encoded once per version,
    /// shared by every stream that sends it.
    pub entry: Bytes,
    /// Where the ClusterLoadAssignment starts in `entry`.
    value_at: usize,
    /// The delta protocol's entry (a `Resource` of a
    /// DeltaDiscoveryResponse) is `delta_head`, the assignment, `delta_tail`.
    pub delta_head: Bytes,
    /// The bytes after the assignment in the delta entry.
    pub delta_tail: Bytes,
    /// The delta protocol's version of this content.
    pub delta_version: String,
    /// Endpoints in the assignment.
    pub endpoints: usize,
    /// When the source got the change that produced this version.
    pub changed_at: Instant,
    /// When the change that produced this version happened (the slice's
    /// trigger time, else when the companion saw it): programming latency
    /// starts here.
    pub trigger: SystemTime,
}

impl Resource {
    /// Resource `name` at `version` whose ClusterLoadAssignment is `value`.
    pub fn new(
        name: &str,
        version: u64,
        value: &[u8],
        endpoints: usize,
        changed_at: Instant,
    ) -> Resource {
        Resource::triggered(
            name,
            version,
            value,
            endpoints,
            changed_at,
            SystemTime::now(),
        )
    }

    /// As [`Resource::new`], for a change that happened at `trigger`.
    pub fn triggered(
        name: &str,
        version: u64,
        value: &[u8],
        endpoints: usize,
        changed_at: Instant,
        trigger: SystemTime,
    ) -> Resource {
        let (entry, value_at) = resource_entry(CLA_TYPE_URL, value);
        let delta_version = content_version(value);
        let (delta_head, delta_tail) =
            delta_entry_parts(name, &delta_version, CLA_TYPE_URL, value.len());
        Resource {
            name: name.to_string(),
            hash: name_hash(name),
            version,
            entry,
            value_at,
            delta_head,
            delta_tail,
            delta_version,
            endpoints,
            changed_at,
            trigger,
        }
    }

    /// The encoded ClusterLoadAssignment.
    pub fn value(&self) -> &[u8] {
        self.entry.get(self.value_at..).unwrap_or_default()
    }

    /// The encoded ClusterLoadAssignment, shared (not copied).
    pub fn value_bytes(&self) -> Bytes {
        self.entry.slice(self.value_at.min(self.entry.len())..)
    }

    /// Bytes of this resource's entry in a delta response.
    pub fn delta_len(&self) -> usize {
        self.delta_head.len() + self.value().len() + self.delta_tail.len()
    }

    /// As an `Any` (a copy), for the benchmarks that build responses the
    /// way a control plane without shared bytes would.
    #[cfg(any(test, feature = "testing"))]
    pub fn to_any(&self) -> envoy_types::pb::google::protobuf::Any {
        envoy_types::pb::google::protobuf::Any {
            type_url: CLA_TYPE_URL.to_string(),
            value: self.value().to_vec(),
        }
    }
}

/// Every resource served now, by [`name_hash`]: written by the publisher,
/// read by the streams when they build a response (always the newest).
#[derive(Debug, Default)]
pub struct Table {
    map: RwLock<HashMap<u64, Arc<Resource>>>,
}

impl Table {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, Arc<Resource>>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The resource whose name hashes to `hash`.
    pub fn get(&self, hash: u64) -> Option<Arc<Resource>> {
        self.read().get(&hash).cloned()
    }

    /// The resource named `name`.
    pub fn by_name(&self, name: &str) -> Option<Arc<Resource>> {
        self.get(name_hash(name)).filter(|r| r.name == name)
    }

    /// How many resources are served.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// No resource is served.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Every resource name (tests, benchmarks).
    #[cfg(any(test, feature = "testing"))]
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.read().values().map(|r| r.name.clone()).collect();
        v.sort();
        v
    }

    /// Every resource (tests, benchmarks).
    #[cfg(any(test, feature = "testing"))]
    pub fn all(&self) -> Vec<Arc<Resource>> {
        self.read().values().cloned().collect()
    }

    /// Puts new versions in, forgets resources by key.
    pub(crate) fn put(&self, resources: &[Arc<Resource>], forget: &[u64]) {
        let mut m = self.map.write().unwrap_or_else(|p| p.into_inner());
        for r in resources {
            m.insert(r.hash, r.clone());
        }
        for h in forget {
            m.remove(h);
        }
    }
}

/// What the xDS streams serve: the newest [`Table`], and what changed in
/// it since the snapshot before.
#[derive(Debug)]
pub struct Snapshot {
    /// `<boot id>-<n>`: unique across restarts of the companion.
    pub version: String,
    /// False until the first full list: streams answer nothing before.
    pub ready: bool,
    /// The resources served, each at its newest version.
    pub table: Arc<Table>,
    /// This snapshot's number, and the one it follows: `changed` lists the
    /// resources (by [`name_hash`]) that changed or appeared in between.
    pub seq: u64,
    /// The number of the snapshot this one follows.
    pub after: u64,
    /// The resources that changed or appeared since that one.
    pub changed: Arc<[u64]>,
}

impl Snapshot {
    /// The snapshot before the first: not ready, nothing in it.
    pub fn empty() -> Snapshot {
        Snapshot {
            version: String::new(),
            ready: false,
            table: Arc::new(Table::default()),
            seq: 0,
            after: 0,
            changed: Arc::from(Vec::new()),
        }
    }

    /// The resource named `name` now.
    pub fn resource(&self, name: &str) -> Option<Arc<Resource>> {
        self.table.by_name(name)
    }
}
