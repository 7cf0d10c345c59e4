//! The index -> the published EDS resources.
//!
//! A source sends `Update`s (a slice applied or deleted, or a full list);
//! the publisher applies every update waiting, updates the resources whose
//! Service changed from the changed slices only (each keeps its merged
//! view and its encoded endpoints: see `port_view`, `assignment`), puts the
//! new versions in the shared [`Table`] and publishes a [`Snapshot`] that
//! names what changed, so that work downstream is in proportion to the
//! change, not to the number of resources. Nothing is published as ready
//! before the first full list: a half-built index never reaches Envoy.
//!
//! Resources are the `--cluster` names and, with `--manage`, every Service
//! port of the selected Services under its template name
//! (`model::cluster::template_name`). A template port that no slice has any
//! more is published empty (Envoy keeps the cluster, with no hosts, as for
//! a Service without slices), then forgotten after [`TOMBSTONE_TTL`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

use crate::eds::assignment::{Encoder, Output};
use crate::eds::metrics::PublishMetrics;
pub use crate::eds::snapshot::{name_hash, Resource, Snapshot, Table};
use crate::model::cluster::{template_name, ClusterSpec};
use crate::model::endpoint::Endpoint;
use crate::model::index::{Index, IpFamily};
use crate::model::port_view::{EndpointChange, PortView};
use crate::model::slice::{ServiceKey, SliceKey};
use crate::source::{next_batch, Change, Update};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::status::PortSource;

/// How long a template port that no slice has any more stays published
/// (empty) before it is forgotten.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(60);

/// One served resource's state between changes.
struct Served {
    service: ServiceKey,
    port_name: String,
    /// Made by `--manage` (not a `--cluster`).
    template: bool,
    view: PortView,
    encoder: Encoder,
    published: Option<Arc<Resource>>,
}

/// Index + resources -> snapshots. Driven synchronously (`apply`), so that
/// tests and benchmarks need no runtime.
pub struct Publisher {
    index: Index,
    family: IpFamily,
    output: Output,
    clusters: Vec<ClusterSpec>,
    /// Every Service port of the Services `--manage` selects is served.
    manage: bool,
    served: HashMap<Arc<str>, Served>,
    by_service: HashMap<ServiceKey, Vec<Arc<str>>>,
    /// Template ports no slice has any more, and since when.
    tombstones: BTreeMap<Arc<str>, Instant>,
    table: Arc<Table>,
    boot: String,
    counter: u64,
    seq: u64,
    ready: bool,
}

impl Publisher {
    /// A publisher of `clusters` (the `--cluster` specs), reading endpoints of `family`, writing
    /// `output`.
    pub fn new(clusters: Vec<ClusterSpec>, family: IpFamily, output: Output) -> Publisher {
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut p = Publisher {
            index: Index::new(),
            family,
            output,
            clusters: clusters.clone(),
            manage: false,
            served: HashMap::new(),
            by_service: HashMap::new(),
            tombstones: BTreeMap::new(),
            table: Arc::new(Table::default()),
            boot: boot.to_string(),
            counter: 0,
            seq: 0,
            ready: false,
        };
        for c in clusters {
            p.add(
                Arc::from(c.name.as_str()),
                c.service,
                c.port_name,
                None,
                false,
            );
        }
        p
    }

    /// Also serves every Service port of every Service in the index under
    /// its template name (`--manage`).
    pub fn managing(mut self, manage: bool) -> Publisher {
        self.manage = manage;
        self
    }

    fn add(
        &mut self,
        name: Arc<str>,
        service: ServiceKey,
        port_name: String,
        port_number: Option<u16>,
        template: bool,
    ) {
        if self.served.contains_key(&name) {
            return;
        }
        self.by_service
            .entry(service.clone())
            .or_default()
            .push(name.clone());
        self.served.insert(
            name,
            Served {
                view: PortView::with_number(&port_name, port_number, self.family),
                service,
                port_name,
                template,
                encoder: Encoder::new(),
                published: None,
            },
        );
    }

    /// The index of every slice applied.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The `--cluster` specs.
    pub fn clusters(&self) -> &[ClusterSpec] {
        &self.clusters
    }

    /// The first full list is in.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The resources served, shared with the streams.
    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// How many resources are served.
    pub fn resource_count(&self) -> usize {
        self.served.len()
    }

    /// Each cluster with its endpoints now (the status page), in name
    /// order, at most `max` of them, and whether the tiered output is on.
    pub fn port_endpoints_upto(&self, max: usize) -> (bool, Vec<(ClusterSpec, Vec<Endpoint>)>) {
        let mut names: Vec<&Arc<str>> = self.served.keys().collect();
        names.sort_unstable();
        let ports = names
            .into_iter()
            .take(max)
            .filter_map(|n| {
                let s = self.served.get(n)?;
                Some((
                    ClusterSpec {
                        name: n.to_string(),
                        service: s.service.clone(),
                        port_name: s.port_name.clone(),
                    },
                    s.view.endpoints(),
                ))
            })
            .collect();
        (self.output.tiered(), ports)
    }

    /// The template ports of `service` its slices have now: (name, port
    /// name, number of an unnamed port).
    fn template_ports(&self, service: &ServiceKey) -> BTreeSet<(String, String, Option<u16>)> {
        let mut ports = BTreeSet::new();
        for slice in self.index.slices_of(service) {
            for p in &slice.ports {
                let number = p.name.is_empty().then_some(p.port);
                ports.insert((
                    template_name(service, &p.name, p.port),
                    p.name.clone(),
                    number,
                ));
            }
        }
        ports
    }

    /// Applies updates; returns the new snapshot when something an Envoy
    /// would see changed (an assignment, or readiness).
    pub fn apply(&mut self, updates: Vec<Update>) -> Option<Snapshot> {
        let earliest = updates.iter().map(|u| u.received).min()?;
        let was_ready = self.ready;
        // The slices that changed, by the Service they left or joined, and
        // when the earliest change to each Service happened.
        let mut slices: BTreeMap<ServiceKey, (BTreeSet<String>, SystemTime)> = BTreeMap::new();
        let mut note = |service: ServiceKey, name: &str, at: SystemTime| {
            let e = slices
                .entry(service)
                .or_insert_with(|| (BTreeSet::new(), at));
            e.0.insert(name.to_string());
            e.1 = e.1.min(at);
        };
        for u in updates {
            let at = u.started();
            match u.change {
                Change::Apply(s) => {
                    let name = s.key.name.clone();
                    for service in self.index.apply(s) {
                        note(service, &name, at);
                    }
                }
                Change::Delete(k) => {
                    if let Some(service) = self.index.delete(&k) {
                        note(service, &k.name, at);
                    }
                }
                Change::Replace(all) => {
                    for (k, service) in self.index.replace_slices(all) {
                        note(service, &k.name, at);
                    }
                    self.ready = true;
                }
            }
        }
        if !self.ready {
            return None;
        }
        let mut changed = Vec::new();
        if !was_ready {
            // The first full list: every resource from every slice known.
            let now = SystemTime::now();
            let mut services: Vec<ServiceKey> = self.by_service.keys().cloned().collect();
            if self.manage {
                services.extend(self.index.services().cloned());
            }
            services.sort();
            services.dedup();
            for service in services {
                let names: Vec<String> = self
                    .index
                    .slices_of(&service)
                    .map(|s| s.key.name.clone())
                    .collect();
                self.refresh_service(&service, &names, earliest, now, &mut changed);
            }
        } else {
            for (service, (names, at)) in &slices {
                let names: Vec<String> = names.iter().cloned().collect();
                self.refresh_service(service, &names, earliest, *at, &mut changed);
            }
        }
        if changed.is_empty() && was_ready {
            return None;
        }
        self.table.put(&changed, &[]);
        Some(self.snapshot(changed.iter().map(|r| r.hash).collect()))
    }

    /// Updates every resource of `service` from its slices `names`; the
    /// new versions go to `changed`.
    fn refresh_service(
        &mut self,
        service: &ServiceKey,
        names: &[String],
        changed_at: Instant,
        trigger: SystemTime,
        changed: &mut Vec<Arc<Resource>>,
    ) {
        let mut present = BTreeSet::new();
        if self.manage {
            for (name, port_name, number) in self.template_ports(service) {
                let name: Arc<str> = Arc::from(name.as_str());
                present.insert(name.clone());
                self.tombstones.remove(&name);
                if !self.served.contains_key(&name) {
                    self.add(name, service.clone(), port_name, number, true);
                }
            }
        }
        let resources = self.by_service.get(service).cloned().unwrap_or_default();
        for name in resources {
            let fresh = self
                .served
                .get(&name)
                .is_some_and(|s| s.published.is_none());
            let all: Vec<String>;
            let which: &[String] = if fresh {
                // A new resource reads every slice of its Service.
                all = self
                    .index
                    .slices_of(service)
                    .map(|s| s.key.name.clone())
                    .collect();
                &all
            } else {
                names
            };
            if let Some(r) = self.refresh(&name, which, changed_at, trigger) {
                changed.push(r);
            }
            let gone = self
                .served
                .get(&name)
                .is_some_and(|s| s.template && !present.contains(&name));
            if gone {
                self.tombstones.entry(name).or_insert_with(Instant::now);
            }
        }
    }

    /// Re-reads slices `names` of resource `name`'s Service; its new
    /// version when its assignment changed (or was never published).
    fn refresh(
        &mut self,
        name: &Arc<str>,
        names: &[String],
        changed_at: Instant,
        trigger: SystemTime,
    ) -> Option<Arc<Resource>> {
        let served = self.served.get_mut(name)?;
        let mut changes = Vec::new();
        for slice_name in names {
            let key = SliceKey {
                namespace: served.service.namespace.clone(),
                name: slice_name.clone(),
            };
            let slice = self
                .index
                .slice(&key)
                .filter(|s| s.service == served.service);
            served.view.put(slice_name, slice, &mut changes);
        }
        let published = served.published.is_some();
        if published {
            // Whether the assignment changed is the net change's to say.
            changes = net(changes);
        }
        let mut assignment_changed = false;
        for c in &changes {
            assignment_changed |= served.encoder.apply(c, &self.output);
        }
        if !assignment_changed && published {
            return None;
        }
        let value = served.encoder.assemble(name, &self.output);
        self.counter += 1;
        let resource = Arc::new(Resource::triggered(
            name,
            self.counter,
            &value,
            served.view.len(),
            changed_at,
            trigger,
        ));
        served.published = Some(resource.clone());
        Some(resource)
    }

    /// Forgets the template ports that have had no slice for
    /// [`TOMBSTONE_TTL`] (their last, empty, assignment stays with the
    /// Envoys that have it); their names.
    pub fn forget_tombstones(&mut self, now: Instant) -> Vec<Arc<str>> {
        let old: Vec<Arc<str>> = self
            .tombstones
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= TOMBSTONE_TTL)
            .map(|(n, _)| n.clone())
            .collect();
        let mut hashes = Vec::new();
        for name in &old {
            self.tombstones.remove(name);
            if let Some(s) = self.served.remove(name) {
                if let Some(list) = self.by_service.get_mut(&s.service) {
                    list.retain(|n| n != name);
                    if list.is_empty() {
                        self.by_service.remove(&s.service);
                    }
                }
                hashes.push(name_hash(name));
            }
        }
        self.table.put(&[], &hashes);
        old
    }

    fn snapshot(&mut self, changed: Vec<u64>) -> Snapshot {
        self.counter += 1;
        let after = self.seq;
        self.seq = self.counter;
        Snapshot {
            version: format!("{}-{}", self.boot, self.counter),
            ready: self.ready,
            table: self.table.clone(),
            seq: self.seq,
            after,
            changed: Arc::from(changed),
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

/// The publisher, shared with the status page (which reads its ports).
pub struct SharedPublisher(Mutex<Publisher>);

impl SharedPublisher {
    fn lock(&self) -> std::sync::MutexGuard<'_, Publisher> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PortSource for SharedPublisher {
    fn ports(&self, max: usize) -> (bool, Vec<(ClusterSpec, Vec<Endpoint>)>, usize) {
        let p = self.lock();
        let (priorities, ports) = p.port_endpoints_upto(max);
        (priorities, ports, p.resource_count().saturating_sub(max))
    }
}

/// Runs the publisher: takes every update waiting at once, publishes the
/// result; forgets old template tombstones now and then. Ends when every
/// source has gone. Reports in `counts` (the index, the snapshots) and
/// `metrics` (readiness, the status page).
pub async fn run(
    publisher: Publisher,
    mut updates: mpsc::Receiver<Update>,
    snapshots: watch::Sender<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
    counts: PublishMetrics,
) {
    let shared = Arc::new(SharedPublisher(Mutex::new(publisher)));
    metrics.status().set_source(shared.clone());
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let batch = tokio::select! {
            b = next_batch(&mut updates) => match b {
                Some(b) => b,
                None => break,
            },
            _ = tick.tick() => {
                let forgotten = shared.lock().forget_tombstones(Instant::now());
                for name in &forgotten {
                    // A port that is gone leaves no gauge series behind.
                    metrics.status().remove_port(name);
                }
                if !forgotten.is_empty() {
                    tracing::info!(forgotten = forgotten.len(), "Service ports without slices for a minute: no longer served");
                }
                continue;
            }
        };
        let n = batch.len();
        let started = Instant::now();
        let mut publisher = shared.lock();
        let snapshot = publisher.apply(batch);
        counts.applied(
            n,
            publisher.index(),
            publisher.is_ready(),
            started.elapsed(),
        );
        metrics.set_ready(publisher.is_ready());
        if let Some(s) = snapshot {
            tracing::debug!(
                version = %s.version,
                ready = s.ready,
                updates = n,
                changed = s.changed.len(),
                slices = publisher.index().slice_count(),
                endpoints = publisher.index().endpoint_count(),
                build_us = started.elapsed().as_micros() as u64,
                "snapshot published"
            );
            if !was_logged_ready(&s) {
                tracing::info!(
                    version = %s.version,
                    resources = publisher.resource_count(),
                    slices = publisher.index().slice_count(),
                    endpoints = publisher.index().endpoint_count(),
                    build_ms = started.elapsed().as_millis() as u64,
                    "first full list in: snapshot published"
                );
            }
            counts.published();
            for h in s.changed.iter() {
                if let Some(r) = s.table.get(*h) {
                    let serving = publisher.serving_of(&r.name);
                    metrics.status().set_port_serving(&r.name, serving);
                }
            }
            metrics.status().set_version(&s.version);
            drop(publisher);
            snapshots.send_replace(Arc::new(s));
        }
    }
}

/// The first ready snapshot follows an unready one (logged at info).
fn was_logged_ready(s: &Snapshot) -> bool {
    s.after != 0
}

impl Publisher {
    /// Serving endpoints of resource `name` now (the no-serving gauge).
    pub fn serving_of(&self, name: &str) -> usize {
        self.served
            .get(name)
            .map(|s| {
                s.view
                    .endpoints()
                    .iter()
                    .filter(|e| e.conditions.serving)
                    .count()
            })
            .unwrap_or(0)
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
        ClusterLoadAssignment::decode(s.resource(name).unwrap().value()).unwrap()
    }

    fn version(s: &Snapshot, name: &str) -> u64 {
        s.resource(name).unwrap().version
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
        assert_eq!(s1.table.len(), 3);
        assert_eq!(s1.changed.len(), 3, "the first snapshot changes everything");
        assert!(
            cla(&s1, "c").endpoints.is_empty(),
            "no slices: empty assignment"
        );
        let (va, vb) = (version(&s1, "a"), version(&s1, "b"));

        // A change to web's slice: only a moves.
        let s2 = p
            .apply(vec![Update::now(Change::Apply(slice(
                "w1",
                "web",
                &["10.0.0.1", "10.0.0.2"],
            )))])
            .unwrap();
        assert!(version(&s2, "a") > va);
        assert_eq!(version(&s2, "b"), vb);
        assert_ne!(s2.version, s1.version);
        // The snapshot names what changed, and follows the one before.
        assert_eq!(&s2.changed[..], &[name_hash("a")]);
        assert_eq!(s2.after, s1.seq);
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
                    let r = p.table().by_name(&c.name).unwrap();
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
                        assert_eq!(version(s, &c.name), r.version);
                    }
                }
            }
        }
    }

    #[test]
    fn manage_serves_every_service_port_by_template_name() {
        let mut p = Publisher::new(
            vec![spec("explicit", "web")],
            IpFamily::Auto,
            Output::default(),
        )
        .managing(true);
        let mut two_ports = crate::model::fixtures::slice(
            "w1",
            "web",
            &[("http", 80), ("admin", 9000)],
            vec![endpoint("10.0.0.1")],
        );
        let unnamed =
            crate::model::fixtures::slice("a1", "api", &[("", 8080)], vec![endpoint("10.0.1.1")]);
        let s = p
            .apply(vec![Update::now(Change::Replace(vec![
                two_ports.clone(),
                unnamed,
            ]))])
            .unwrap();
        assert_eq!(
            s.table.names(),
            ["explicit", "ns/api:8080", "ns/web:admin", "ns/web:http"]
        );
        let admin = cla(&s, "ns/web:admin");
        assert_eq!(admin.cluster_name, "ns/web:admin");
        let lb = &admin.endpoints[0].lb_endpoints[0];
        let Some(
            envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(e),
        ) = &lb.host_identifier
        else {
            panic!("no endpoint")
        };
        let Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(sa)) =
            &e.address.as_ref().unwrap().address
        else {
            panic!("no address")
        };
        assert_eq!(
            sa.port_specifier,
            Some(
                envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(
                    9000
                )
            )
        );
        // A new Service appears: its ports alone change.
        let s2 = p
            .apply(vec![Update::now(Change::Apply(
                crate::model::fixtures::slice(
                    "d1",
                    "db",
                    &[("pg", 5432)],
                    vec![endpoint("10.0.2.1")],
                ),
            ))])
            .unwrap();
        assert_eq!(&s2.changed[..], &[name_hash("ns/db:pg")]);
        // A port goes from the Service: published empty, then forgotten.
        two_ports.ports.retain(|p| p.name == "http");
        let s3 = p
            .apply(vec![Update::now(Change::Apply(two_ports))])
            .unwrap();
        assert!(s3.changed.contains(&name_hash("ns/web:admin")));
        assert!(cla(&s3, "ns/web:admin").endpoints.is_empty());
        assert!(p.forget_tombstones(Instant::now()).is_empty(), "not yet");
        assert_eq!(
            p.forget_tombstones(Instant::now() + TOMBSTONE_TTL),
            vec![Arc::<str>::from("ns/web:admin")]
        );
        assert!(
            s3.resource("ns/web:admin").is_none(),
            "the table forgets it"
        );
        assert!(s3.resource("ns/web:http").is_some());
    }

    #[test]
    fn the_trigger_time_travels_with_the_version() {
        let mut p = Publisher::new(vec![spec("a", "web")], IpFamily::Auto, Output::default());
        p.apply(vec![Update::now(Change::Replace(vec![]))]).unwrap();
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_796_479_200);
        let s = p
            .apply(vec![Update::triggered(
                Change::Apply(slice("w1", "web", &["10.0.0.1"])),
                Some(at),
            )])
            .unwrap();
        assert_eq!(s.resource("a").unwrap().trigger, at);
    }
}
