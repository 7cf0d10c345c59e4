//! The index -> the published snapshot of EDS resources.
//!
//! A source sends `Update`s (a slice applied or deleted, or a full list);
//! the publisher applies every update waiting, rebuilds only the clusters
//! whose Service changed, and publishes a new snapshot when an assignment
//! changed. Nothing is published as ready before the first full list: a
//! half-built index never reaches Envoy.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::google::protobuf::Any;
use tokio::sync::{mpsc, watch};

use crate::assignment::{Encoder, Output, CLA_TYPE_URL};
use crate::cluster::ClusterSpec;
use crate::index::{Index, IpFamily};
use crate::metrics::Metrics;
use crate::slice::{ServiceKey, Slice, SliceKey};

/// A change from a source.
#[derive(Clone, Debug)]
pub enum Change {
    Apply(Slice),
    Delete(SliceKey),
    /// Every slice there is (a full list): the index becomes exactly this,
    /// and is complete from then on.
    Replace(Vec<Slice>),
}

/// A change and when the source got it (for the lag figures).
#[derive(Clone, Debug)]
pub struct Update {
    pub change: Change,
    pub received: Instant,
}

impl Update {
    pub fn now(change: Change) -> Update {
        Update {
            change,
            received: Instant::now(),
        }
    }
}

/// One EDS resource as published.
#[derive(Debug)]
pub struct Resource {
    pub name: String,
    /// Changes whenever the assignment does (unique within this process).
    pub version: u64,
    /// The encoded ClusterLoadAssignment.
    pub any: Any,
    pub endpoints: usize,
    /// When the source got the change that produced this version.
    pub changed_at: Instant,
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
    by_service: HashMap<ServiceKey, Vec<usize>>,
    family: IpFamily,
    output: Output,
    encoders: HashMap<String, Encoder>,
    resources: BTreeMap<String, Arc<Resource>>,
    boot: String,
    counter: u64,
    ready: bool,
}

impl Publisher {
    pub fn new(clusters: Vec<ClusterSpec>, family: IpFamily, output: Output) -> Publisher {
        let mut by_service: HashMap<ServiceKey, Vec<usize>> = HashMap::new();
        for (i, c) in clusters.iter().enumerate() {
            by_service.entry(c.service.clone()).or_default().push(i);
        }
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Publisher {
            index: Index::new(),
            clusters,
            by_service,
            family,
            output,
            encoders: HashMap::new(),
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

    /// Applies updates; returns the new snapshot when something an Envoy
    /// would see changed (an assignment, or readiness).
    pub fn apply(&mut self, updates: Vec<Update>) -> Option<Snapshot> {
        let earliest = updates.iter().map(|u| u.received).min()?;
        let was_ready = self.ready;
        let mut services: BTreeSet<ServiceKey> = BTreeSet::new();
        for u in updates {
            match u.change {
                Change::Apply(s) => services.extend(self.index.apply(s)),
                Change::Delete(k) => services.extend(self.index.delete(&k)),
                Change::Replace(all) => {
                    services.extend(self.index.replace(all));
                    self.ready = true;
                }
            }
        }
        let rebuild: BTreeSet<usize> = if !self.ready {
            BTreeSet::new()
        } else if !was_ready {
            (0..self.clusters.len()).collect()
        } else {
            services
                .iter()
                .filter_map(|s| self.by_service.get(s))
                .flatten()
                .copied()
                .collect()
        };
        let mut changed = self.ready != was_ready;
        for i in rebuild {
            changed |= self.rebuild(i, earliest);
        }
        changed.then(|| self.snapshot())
    }

    /// Rebuilds one cluster; true when its assignment changed.
    fn rebuild(&mut self, i: usize, changed_at: Instant) -> bool {
        let Some(spec) = self.clusters.get(i) else {
            return false;
        };
        let endpoints = self
            .index
            .endpoints(&spec.service, &spec.port_name, self.family);
        let encoder = self.encoders.entry(spec.name.clone()).or_default();
        let changed = encoder.update(&endpoints, &self.output);
        if !changed && self.resources.contains_key(&spec.name) {
            return false;
        }
        let value = encoder.assemble(&spec.name, &self.output);
        self.counter += 1;
        let resource = Resource {
            name: spec.name.clone(),
            version: self.counter,
            any: Any {
                type_url: CLA_TYPE_URL.to_string(),
                value,
            },
            endpoints: endpoints.len(),
            changed_at,
        };
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

/// Runs the publisher: takes every update waiting at once, publishes the
/// result. Ends when every source has gone.
pub async fn run(
    mut publisher: Publisher,
    mut updates: mpsc::Receiver<Update>,
    snapshots: watch::Sender<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
) {
    while let Some(first) = updates.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = updates.try_recv() {
            batch.push(more);
        }
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
            snapshots.send_replace(Arc::new(s));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::slice::{AddressType, SliceEndpoint, SlicePort};
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use prost::Message;

    fn spec(name: &str, svc: &str) -> ClusterSpec {
        format!("{name}=ns/{svc}:http").parse().unwrap()
    }

    fn slice(name: &str, svc: &str, ips: &[&str]) -> Slice {
        Slice {
            key: SliceKey {
                namespace: "ns".into(),
                name: name.into(),
            },
            service: ServiceKey {
                namespace: "ns".into(),
                name: svc.into(),
            },
            address_type: AddressType::IPv4,
            ports: vec![SlicePort {
                name: "http".into(),
                port: 80,
            }],
            endpoints: ips
                .iter()
                .map(|ip| SliceEndpoint {
                    address: ip.parse().unwrap(),
                    ready: None,
                    serving: None,
                    terminating: None,
                    zone: None,
                    node_name: None,
                    hints_zones: None,
                    hints_nodes: None,
                })
                .collect(),
        }
    }

    fn cla(s: &Snapshot, name: &str) -> ClusterLoadAssignment {
        ClusterLoadAssignment::decode(s.resources[name].any.value.as_slice()).unwrap()
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
                Update::now(Change::Delete(SliceKey {
                    namespace: "ns".into(),
                    name: "w1".into(),
                })),
                Update::now(Change::Apply(slice("a1", "api", &["10.0.1.2"]))),
            ])
            .unwrap();
        assert!(cla(&s3, "a").endpoints.is_empty());
        assert_eq!(cla(&s3, "b").endpoints[0].lb_endpoints.len(), 1);
    }
}
