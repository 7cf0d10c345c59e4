//! The index -> the published snapshot of EDS resources.
//!
//! A source sends `Update`s (a slice applied or deleted, or a full list);
//! the publisher applies every update waiting, updates the clusters whose
//! Service changed from the changed slices only (each cluster keeps its
//! merged view and its encoded endpoints: see `view`, `assignment`), and
//! publishes a new snapshot when an assignment changed. Nothing is published as ready before the first full list: a
//! half-built index never reaches Envoy.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use envoy_types::pb::google::protobuf::Any;
use tokio::sync::{mpsc, watch};

use crate::eds::assignment::{Encoder, Output, CLA_TYPE_URL};
use crate::eds::response_bytes::resource_entry;
use crate::model::cluster::ClusterSpec;
use crate::model::index::{Index, IpFamily};
use crate::model::port_view::{EndpointChange, PortView};
use crate::model::slice::{ServiceKey, SliceKey};
use crate::source::{next_batch, Change, Update};
use crate::telemetry::metrics::Metrics;

/// One EDS resource as published.
#[derive(Debug)]
pub struct Resource {
    pub name: String,
    /// Changes whenever the assignment does (unique within this process).
    pub version: u64,
    /// The encoded ClusterLoadAssignment as a DiscoveryResponse's resource
    /// entry (`response_bytes::resource_entry`): encoded once per version, shared
    /// by every stream that sends it.
    pub entry: Bytes,
    /// Where the ClusterLoadAssignment starts in `entry`.
    value_at: usize,
    pub endpoints: usize,
    /// When the source got the change that produced this version.
    pub changed_at: Instant,
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
        let (entry, value_at) = resource_entry(CLA_TYPE_URL, value);
        Resource {
            name: name.to_string(),
            version,
            entry,
            value_at,
            endpoints,
            changed_at,
        }
    }

    /// The encoded ClusterLoadAssignment.
    pub fn value(&self) -> &[u8] {
        self.entry.get(self.value_at..).unwrap_or_default()
    }

    /// As an `Any` (a copy).
    pub fn to_any(&self) -> Any {
        Any {
            type_url: CLA_TYPE_URL.to_string(),
            value: self.value().to_vec(),
        }
    }
}

/// What the xDS streams serve.
#[derive(Debug)]
pub struct Snapshot {
    /// `<boot id>-<n>`: unique across restarts of the companion.
    pub version: String,
    /// False until the first full list: streams answer nothing before.
    pub ready: bool,
    pub resources: BTreeMap<String, Arc<Resource>>,
}

impl Snapshot {
    pub fn empty() -> Snapshot {
        Snapshot {
            version: String::new(),
            ready: false,
            resources: BTreeMap::new(),
        }
    }
}

/// Index + clusters -> snapshots. Driven synchronously (`apply`), so that
/// tests and benchmarks need no runtime.
pub struct Publisher {
    index: Index,
    clusters: Vec<ClusterSpec>,
    /// Per cluster (same order): its merged endpoints and their encoding,
    /// kept up to date slice by slice.
    served: Vec<Served>,
    by_service: HashMap<ServiceKey, Vec<usize>>,
    output: Output,
    resources: BTreeMap<String, Arc<Resource>>,
    boot: String,
    counter: u64,
    ready: bool,
}

/// One cluster's state between changes.
struct Served {
    view: PortView,
    encoder: Encoder,
}

impl Publisher {
    pub fn new(clusters: Vec<ClusterSpec>, family: IpFamily, output: Output) -> Publisher {
        let mut by_service: HashMap<ServiceKey, Vec<usize>> = HashMap::new();
        for (i, c) in clusters.iter().enumerate() {
            by_service.entry(c.service.clone()).or_default().push(i);
        }
        let served = clusters
            .iter()
            .map(|c| Served {
                view: PortView::new(&c.port_name, family),
                encoder: Encoder::new(),
            })
            .collect();
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Publisher {
            index: Index::new(),
            clusters,
            served,
            by_service,
            output,
            resources: BTreeMap::new(),
            boot: boot.to_string(),
            counter: 0,
            ready: false,
        }
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn clusters(&self) -> &[ClusterSpec] {
        &self.clusters
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Each cluster with its endpoints now (the status page), and whether
    /// the tiered output is on.
    pub fn port_endpoints(
        &self,
    ) -> (
        bool,
        impl Iterator<Item = (&ClusterSpec, Vec<crate::model::endpoint::Endpoint>)>,
    ) {
        let ports = self
            .clusters
            .iter()
            .zip(&self.served)
            .map(|(c, s)| (c, s.view.endpoints()));
        (self.output.tiered(), ports)
    }

    /// Applies updates; returns the new snapshot when something an Envoy
    /// would see changed (an assignment, or readiness).
    pub fn apply(&mut self, updates: Vec<Update>) -> Option<Snapshot> {
        let earliest = updates.iter().map(|u| u.received).min()?;
        let was_ready = self.ready;
        // The slices that changed, by the Service they left or joined.
        let mut slices: BTreeMap<ServiceKey, BTreeSet<String>> = BTreeMap::new();
        let mut note = |service: ServiceKey, name: &str| {
            slices.entry(service).or_default().insert(name.to_string());
        };
        for u in updates {
            match u.change {
                Change::Apply(s) => {
                    let name = s.key.name.clone();
                    for service in self.index.apply(s) {
                        note(service, &name);
                    }
                }
                Change::Delete(k) => {
                    if let Some(service) = self.index.delete(&k) {
                        note(service, &k.name);
                    }
                }
                Change::Replace(all) => {
                    for (k, service) in self.index.replace_slices(all) {
                        note(service, &k.name);
                    }
                    self.ready = true;
                }
            }
        }
        if !self.ready {
            return None;
        }
        let mut changed = !was_ready;
        if !was_ready {
            // The first full list: every cluster from every slice known.
            for i in 0..self.clusters.len() {
                let service = &self.clusters[i].service;
                let names: Vec<String> = self
                    .index
                    .slices_of(service)
                    .map(|s| s.key.name.clone())
                    .collect();
                changed |= self.refresh(i, &names, earliest);
            }
        } else {
            for (service, names) in &slices {
                let names: Vec<String> = names.iter().cloned().collect();
                for i in self.by_service.get(service).cloned().unwrap_or_default() {
                    changed |= self.refresh(i, &names, earliest);
                }
            }
        }
        changed.then(|| self.snapshot())
    }

    /// Re-reads slices `names` of cluster `i`'s Service; true when its
    /// assignment changed (or was never published).
    fn refresh(&mut self, i: usize, names: &[String], changed_at: Instant) -> bool {
        let (Some(spec), Some(served)) = (self.clusters.get(i), self.served.get_mut(i)) else {
            return false;
        };
        let mut changes = Vec::new();
        for name in names {
            let key = SliceKey {
                namespace: spec.service.namespace.clone(),
                name: name.clone(),
            };
            let slice = self.index.slice(&key).filter(|s| s.service == spec.service);
            served.view.put(name, slice, &mut changes);
        }
        let published = self.resources.contains_key(&spec.name);
        if published {
            // Whether the assignment changed is the net change's to say.
            changes = net(changes);
        }
        let mut changed = false;
        for c in &changes {
            changed |= served.encoder.apply(c, &self.output);
        }
        if !changed && published {
            return false;
        }
        let value = served.encoder.assemble(&spec.name, &self.output);
        self.counter += 1;
        let resource = Resource::new(
            &spec.name,
            self.counter,
            &value,
            served.view.len(),
            changed_at,
        );
        self.resources.insert(spec.name.clone(), Arc::new(resource));
        true
    }

    fn snapshot(&mut self) -> Snapshot {
        self.counter += 1;
        Snapshot {
            version: format!("{}-{}", self.boot, self.counter),
            ready: self.ready,
            resources: self.resources.clone(),
        }
    }
}

/// One change per address, from the first state to the last (several
/// slices, or several updates of a batch, may change one address); none
/// where they cancel out.
fn net(mut changes: Vec<EndpointChange>) -> Vec<EndpointChange> {
    if changes.len() < 2 {
        return changes;
    }
    // Stable: an address's changes stay in order.
    changes.sort_by_key(|c| c.addr);
    changes.dedup_by(|later, first| {
        let same = later.addr == first.addr;
        if same {
            first.new = later.new.take();
        }
        same
    });
    changes.retain(|c| c.old != c.new);
    changes
}

/// Runs the publisher: takes every update waiting at once, publishes the
/// result. Ends when every source has gone.
pub async fn run(
    mut publisher: Publisher,
    mut updates: mpsc::Receiver<Update>,
    snapshots: watch::Sender<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
) {
    while let Some(batch) = next_batch(&mut updates).await {
        let n = batch.len();
        let started = Instant::now();
        let snapshot = publisher.apply(batch);
        metrics.applied(
            n,
            publisher.index(),
            publisher.is_ready(),
            started.elapsed(),
        );
        if let Some(s) = snapshot {
            tracing::info!(
                version = %s.version,
                ready = s.ready,
                updates = n,
                slices = publisher.index().slice_count(),
                endpoints = publisher.index().endpoint_count(),
                build_us = started.elapsed().as_micros() as u64,
                "snapshot published"
            );
            metrics.published();
            let (priorities, ports) = publisher.port_endpoints();
            metrics.status().set_services(&s.version, priorities, ports);
            snapshots.send_replace(Arc::new(s));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::{endpoint, slice_key};
    use crate::model::slice::{Slice, SliceEndpoint};
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use prost::Message;

    fn spec(name: &str, svc: &str) -> ClusterSpec {
        format!("{name}=ns/{svc}:http").parse().unwrap()
    }

    /// IPv4 (every address here is), port `http` = 80, no conditions set.
    fn slice(name: &str, svc: &str, ips: &[&str]) -> Slice {
        let eps = ips.iter().map(|ip| endpoint(ip)).collect();
        crate::model::fixtures::slice(name, svc, &[("http", 80)], eps)
    }

    fn cla(s: &Snapshot, name: &str) -> ClusterLoadAssignment {
        ClusterLoadAssignment::decode(s.resources[name].value()).unwrap()
    }

    #[test]
    fn nothing_ready_before_the_first_full_list() {
        let mut p = Publisher::new(vec![spec("a", "web")], IpFamily::Auto, Output::default());
        // An apply before any full list: the index grows, nothing is ready.
        let s = p.apply(vec![Update::now(Change::Apply(slice(
            "w1",
            "web",
            &["10.0.0.1"],
        )))]);
        assert!(s.is_none(), "no snapshot before the first full list");
        let s = p
            .apply(vec![Update::now(Change::Replace(vec![slice(
                "w1",
                "web",
                &["10.0.0.1"],
            )]))])
            .unwrap();
        assert!(s.ready);
        assert_eq!(cla(&s, "a").endpoints[0].lb_endpoints.len(), 1);
    }

    #[test]
    fn only_changed_clusters_get_new_versions_and_empty_services_are_empty_assignments() {
        let mut p = Publisher::new(
            vec![spec("a", "web"), spec("b", "api"), spec("c", "none")],
            IpFamily::Auto,
            Output::default(),
        );
        let s1 = p
            .apply(vec![Update::now(Change::Replace(vec![
                slice("w1", "web", &["10.0.0.1"]),
                slice("a1", "api", &["10.0.1.1"]),
            ]))])
            .unwrap();
        assert_eq!(s1.resources.len(), 3);
        assert!(
            cla(&s1, "c").endpoints.is_empty(),
            "no slices: empty assignment"
        );
        let (va, vb) = (s1.resources["a"].version, s1.resources["b"].version);

        // A change to web's slice: only a moves.
        let s2 = p
            .apply(vec![Update::now(Change::Apply(slice(
                "w1",
                "web",
                &["10.0.0.1", "10.0.0.2"],
            )))])
            .unwrap();
        assert!(s2.resources["a"].version > va);
        assert_eq!(s2.resources["b"].version, vb);
        assert_ne!(s2.version, s1.version);
        // The same slice again, or a slice of a Service nobody serves: nothing.
        assert!(p
            .apply(vec![Update::now(Change::Apply(slice(
                "w1",
                "web",
                &["10.0.0.1", "10.0.0.2"]
            )))])
            .is_none());
        assert!(p
            .apply(vec![Update::now(Change::Apply(slice(
                "x1",
                "other",
                &["10.0.9.1"]
            )))])
            .is_none());
        // A batch: several updates, one snapshot.
        let s3 = p
            .apply(vec![
                Update::now(Change::Delete(slice_key("w1"))),
                Update::now(Change::Apply(slice("a1", "api", &["10.0.1.2"]))),
            ])
            .unwrap();
        assert!(cla(&s3, "a").endpoints.is_empty());
        assert_eq!(cla(&s3, "b").endpoints[0].lb_endpoints.len(), 1);
    }

    #[test]
    fn kept_slice_by_slice_assignments_equal_fresh_builds() {
        use crate::eds::assignment::cluster_load_assignment;
        // A small deterministic generator (xorshift).
        fn below(state: &mut u64, n: u64) -> u64 {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state % n
        }
        fn random_slice(r: &mut u64, name: &str) -> Slice {
            let mut s = slice(name, ["web", "api"][below(r, 2) as usize], &[]);
            let flag = |n: u64| [None, Some(true), Some(false)][n as usize];
            for _ in 0..below(r, 8) {
                s.endpoints.push(SliceEndpoint {
                    address: std::net::IpAddr::from([10, 0, 0, below(r, 12) as u8]),
                    ready: flag(below(r, 3)),
                    serving: flag(below(r, 3)),
                    terminating: flag(below(r, 3)),
                    zone: (below(r, 3) > 0).then(|| format!("z{}", below(r, 3)).into()),
                    node_name: None,
                    hints_zones: None,
                    hints_nodes: None,
                });
            }
            s
        }
        let r = &mut 0x2545_F491_4F6C_DD1Du64;
        for priorities in [false, true] {
            let out = Output::with_tiers(priorities);
            let specs = vec![spec("a", "web"), spec("b", "api")];
            let mut p = Publisher::new(specs.clone(), IpFamily::Auto, out.clone());
            let mut last: BTreeMap<String, (u64, Vec<u8>)> = BTreeMap::new();
            for step in 0..400 {
                let names = ["s1", "s2", "s3", "s4"];
                let mut batch = Vec::new();
                for _ in 0..=below(r, 2) {
                    let name = names[below(r, 4) as usize];
                    batch.push(Update::now(match below(r, 10) {
                        0 => Change::Replace(names.iter().map(|n| random_slice(r, n)).collect()),
                        1 | 2 => Change::Delete(slice_key(name)),
                        _ => Change::Apply(random_slice(r, name)),
                    }));
                }
                if step == 0 {
                    batch.push(Update::now(Change::Replace(vec![])));
                }
                let snap = p.apply(batch);
                for c in &specs {
                    let fresh = cluster_load_assignment(
                        &c.name,
                        &p.index()
                            .endpoints(&c.service, &c.port_name, IpFamily::Auto),
                        &out,
                    );
                    let r = &p.resources[&c.name];
                    let decoded = ClusterLoadAssignment::decode(r.value()).unwrap();
                    assert_eq!(decoded, fresh, "step {step}, {}", c.name);
                    // A new version exactly when the bytes changed.
                    if let Some((version, bytes)) = last.get(&c.name) {
                        assert_eq!(
                            r.version == *version,
                            r.value() == bytes.as_slice(),
                            "step {step}"
                        );
                    }
                    last.insert(c.name.clone(), (r.version, r.value().to_vec()));
                    if let Some(s) = &snap {
                        assert_eq!(s.resources[&c.name].version, r.version);
                    }
                }
            }
        }
    }
}
