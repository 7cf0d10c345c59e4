//! Test doubles: hosts in plain vectors (what `table::build` reads in tests
//! and benchmarks), and a recording stand-in for Envoy's side of a policy
//! (logs, metrics) and for a request. Compiled for tests and with the
//! `testing` feature only (`make bench-native`): never in the release .so.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::policy::{Level, Proxy, Request};
use crate::table::{HostHealth, HostSource, Slot};

/// One host as Envoy would list it.
#[derive(Clone, Debug)]
pub struct FakeHost {
    /// `IP:PORT`.
    pub address: String,
    /// Its load-balancing weight.
    pub weight: u32,
    /// Envoy's coarse health of it.
    pub health: HostHealth,
    /// In the priority's healthy list (Envoy would route to it).
    pub offered: bool,
    /// The zone of its locality.
    pub locality_zone: Option<String>,
    /// (namespace, key, value)
    pub bools: Vec<(String, String, bool)>,
    /// String metadata: (namespace, key, value).
    pub strings: Vec<(String, String, String)>,
}

impl FakeHost {
    /// A healthy, offered host of weight 1, no locality, no metadata.
    pub fn new(address: &str) -> FakeHost {
        FakeHost {
            address: address.into(),
            weight: 1,
            health: HostHealth::Healthy,
            offered: true,
            locality_zone: None,
            bools: Vec::new(),
            strings: Vec::new(),
        }
    }

    /// EndpointSlice conditions in `k8s.endpointslice`.
    pub fn conditions(mut self, ready: bool, serving: bool, terminating: bool) -> FakeHost {
        for (k, v) in [
            ("ready", ready),
            ("serving", serving),
            ("terminating", terminating),
        ] {
            self.bools.push(("k8s.endpointslice".into(), k.into(), v));
        }
        self
    }

    /// With this weight.
    pub fn weight(mut self, w: u32) -> FakeHost {
        self.weight = w;
        self
    }

    /// Envoy keeps it out of the healthy list (failed check, ejection,
    /// EDS DRAINING/UNHEALTHY).
    pub fn not_offered(mut self) -> FakeHost {
        self.offered = false;
        self.health = HostHealth::Unhealthy;
        self
    }

    /// In this zone's locality.
    pub fn zone(mut self, z: &str) -> FakeHost {
        self.locality_zone = Some(z.into());
        self
    }

    /// With the string `value` at filter_metadata[`ns`][`key`].
    pub fn string(mut self, ns: &str, key: &str, value: &str) -> FakeHost {
        self.strings.push((ns.into(), key.into(), value.into()));
        self
    }
}

/// Hosts per priority.
#[derive(Clone, Debug, Default)]
pub struct FakeCluster {
    /// Each priority's hosts, in the order Envoy lists them.
    pub priorities: Vec<Vec<FakeHost>>,
}

impl FakeCluster {
    /// A cluster of these priorities' hosts.
    pub fn of(priorities: Vec<Vec<FakeHost>>) -> FakeCluster {
        FakeCluster { priorities }
    }

    fn host(&self, p: u32, i: usize) -> Option<&FakeHost> {
        self.priorities.get(p as usize)?.get(i)
    }

    fn healthy(&self, p: u32) -> impl Iterator<Item = &FakeHost> {
        self.priorities
            .get(p as usize)
            .into_iter()
            .flatten()
            .filter(|h| h.offered)
    }
}

impl HostSource for FakeCluster {
    fn priority_count(&self) -> usize {
        self.priorities.len()
    }
    fn host_count(&self, p: u32) -> usize {
        self.priorities.get(p as usize).map_or(0, Vec::len)
    }
    fn healthy_count(&self, p: u32) -> usize {
        self.healthy(p).count()
    }
    fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
        self.healthy(p).nth(i).map(|h| h.address.as_str())
    }
    fn address(&self, p: u32, i: usize) -> Option<&str> {
        // An empty address stands for one Envoy could not give (not UTF-8).
        self.host(p, i)
            .map(|h| h.address.as_str())
            .filter(|a| !a.is_empty())
    }
    fn weight(&self, p: u32, i: usize) -> u32 {
        self.host(p, i).map_or(0, |h| h.weight)
    }
    fn health(&self, p: u32, i: usize) -> HostHealth {
        self.host(p, i).map_or(HostHealth::Unhealthy, |h| h.health)
    }
    fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
        self.host(p, i)?.locality_zone.as_deref()
    }
    fn metadata_bool(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<bool> {
        let h = self.host(p, i)?;
        h.bools
            .iter()
            .rev()
            .find(|(n, k, _)| n == ns && k == key)
            .map(|(_, _, v)| *v)
    }
    fn metadata_str(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<&str> {
        let h = self.host(p, i)?;
        h.strings
            .iter()
            .rev()
            .find(|(n, k, _)| n == ns && k == key)
            .map(|(_, _, v)| v.as_str())
    }
}

/// A `FakeCluster` with its healthy lists indexed (O(1) reads, as
/// Envoy's are): what the benchmark reads. Counts the per-host reads
/// (each an ABI call in Envoy).
pub struct Indexed<'a> {
    cluster: &'a FakeCluster,
    healthy: Vec<Vec<usize>>,
    reads: Cell<usize>,
}

impl<'a> Indexed<'a> {
    /// Indexes `cluster`'s healthy lists.
    pub fn new(cluster: &'a FakeCluster) -> Indexed<'a> {
        let healthy = cluster
            .priorities
            .iter()
            .map(|hs| (0..hs.len()).filter(|i| hs[*i].offered).collect())
            .collect();
        Indexed {
            cluster,
            healthy,
            reads: Cell::new(0),
        }
    }

    /// Per-host reads so far.
    pub fn reads(&self) -> usize {
        self.reads.get()
    }

    fn read(&self) -> &FakeCluster {
        self.reads.set(self.reads.get() + 1);
        self.cluster
    }
}

impl HostSource for Indexed<'_> {
    fn priority_count(&self) -> usize {
        self.cluster.priority_count()
    }
    fn host_count(&self, p: u32) -> usize {
        self.cluster.host_count(p)
    }
    fn healthy_count(&self, p: u32) -> usize {
        self.healthy.get(p as usize).map_or(0, Vec::len)
    }
    fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
        let at = *self.healthy.get(p as usize)?.get(i)?;
        self.read().address(p, at)
    }
    fn address(&self, p: u32, i: usize) -> Option<&str> {
        self.read().address(p, i)
    }
    fn weight(&self, p: u32, i: usize) -> u32 {
        self.read().weight(p, i)
    }
    fn health(&self, p: u32, i: usize) -> HostHealth {
        self.read().health(p, i)
    }
    fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
        self.read().locality_zone(p, i)
    }
    fn metadata_bool(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<bool> {
        self.read().metadata_bool(p, i, ns, key)
    }
    fn metadata_str(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<&str> {
        self.read().metadata_str(p, i, ns, key)
    }
}

/// `n` ready hosts at priority 0 (10.x.y.z:8080), every `healthy_every`-th
/// one (when not 0) out of Envoy's healthy list.
pub fn big_cluster(n: usize, unhealthy_every: usize) -> FakeCluster {
    let hosts = (0..n)
        .map(|i| {
            let h = FakeHost::new(&format!(
                "10.{}.{}.{}:8080",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            ))
            .conditions(true, true, false)
            .zone(if i % 3 == 0 { "zone-a" } else { "zone-b" });
            if unhealthy_every != 0 && i % unhealthy_every == 0 {
                h.not_offered()
            } else {
                h
            }
        })
        .collect();
    FakeCluster {
        priorities: vec![hosts],
    }
}

/// What a `RecordingProxy` saw.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Every line logged, in order.
    pub logs: Vec<(Level, String)>,
    /// Metric names by id, in definition order.
    pub defined: Vec<String>,
    /// Counter and gauge values by name.
    pub values: BTreeMap<String, i64>,
}

/// Envoy's side of a policy configuration, recorded: logs and metrics.
#[derive(Debug)]
pub struct RecordingProxy {
    recorded: Mutex<Recorded>,
    /// The level Envoy would print from (Info: debug lines are skipped).
    pub min_level: Level,
    /// Metric names whose definition fails (as Envoy's may).
    pub refuse_metrics: Vec<String>,
}

impl Default for RecordingProxy {
    fn default() -> Self {
        RecordingProxy {
            recorded: Mutex::new(Recorded::default()),
            min_level: Level::Info,
            refuse_metrics: Vec::new(),
        }
    }
}

impl RecordingProxy {
    /// Prints from `min_level` on.
    pub fn at_level(min_level: Level) -> RecordingProxy {
        RecordingProxy {
            min_level,
            ..RecordingProxy::default()
        }
    }

    /// Refuses to define these metrics.
    pub fn refusing(names: &[&str]) -> RecordingProxy {
        RecordingProxy {
            refuse_metrics: names.iter().map(|n| n.to_string()).collect(),
            ..RecordingProxy::default()
        }
    }

    /// What was logged and counted so far.
    pub fn recorded(&self) -> MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A counter's or gauge's value (0 when never touched).
    pub fn value(&self, name: &str) -> i64 {
        self.recorded().values.get(name).copied().unwrap_or(0)
    }

    /// Lines logged at `level` that contain `needle`.
    pub fn lines(&self, level: Level, needle: &str) -> Vec<String> {
        self.recorded()
            .logs
            .iter()
            .filter(|(l, m)| *l == level && m.contains(needle))
            .map(|(_, m)| m.clone())
            .collect()
    }

    fn define(&self, name: &str) -> Option<usize> {
        if self.refuse_metrics.iter().any(|n| n == name) {
            return None;
        }
        let mut r = self.recorded();
        r.defined.push(name.to_string());
        Some(r.defined.len() - 1)
    }

    fn add(&self, id: usize, delta: i64) {
        let mut r = self.recorded();
        if let Some(name) = r.defined.get(id).cloned() {
            *r.values.entry(name).or_insert(0) += delta;
        }
    }
}

impl Proxy for RecordingProxy {
    fn log(&self, level: Level, message: &str) {
        self.recorded().logs.push((level, message.to_string()));
    }
    fn log_enabled(&self, level: Level) -> bool {
        level >= self.min_level
    }
    fn define_counter(&self, name: &str) -> Option<usize> {
        self.define(name)
    }
    fn define_gauge(&self, name: &str) -> Option<usize> {
        self.define(name)
    }
    fn increment_counter(&self, id: usize, by: u64) {
        self.add(id, by as i64);
    }
    fn set_gauge(&self, id: usize, value: u64) {
        let mut r = self.recorded();
        if let Some(name) = r.defined.get(id).cloned() {
            r.values.insert(name, value as i64);
        }
    }
    fn add_gauge(&self, id: usize, delta: i64) {
        self.add(id, delta);
    }
    fn thread_cpu_micros(&self) -> u64 {
        0
    }
}

/// A request: its retry budget, and the hosts its retry predicate refuses
/// (by index into their priority's hosts).
#[derive(Debug, Default)]
pub struct FakeRequest {
    /// The route's `host_selection_retry_max_attempts`.
    pub retry_count: u32,
    /// Host indexes the retry predicate refuses.
    pub refused_host_indexes: Vec<u32>,
}

impl Request for FakeRequest {
    fn host_selection_retry_count(&self) -> u32 {
        self.retry_count
    }
    fn should_select_another_host(&self, slot: &Slot) -> bool {
        self.refused_host_indexes.contains(&slot.host_index)
    }
}

/// One stream as the drain filter sees it: its request headers and version, where it went,
/// and how it was ended.
#[derive(Debug, Default)]
pub struct FakeStream {
    headers: Vec<(String, String)>,
    version: Option<String>,
    cluster: Option<String>,
    upstream: Option<String>,
    sent_trailers: std::cell::RefCell<Vec<(String, String)>>,
    reset: Cell<bool>,
}

impl FakeStream {
    /// With a request header.
    pub fn header(mut self, name: &str, value: &str) -> FakeStream {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// With an HTTP version (`HTTP/1.1`, `HTTP/2`).
    pub fn version(mut self, version: &str) -> FakeStream {
        self.version = Some(version.into());
        self
    }

    /// Routed to `cluster`, host `address`.
    pub fn routed(mut self, cluster: &str, address: &str) -> FakeStream {
        self.cluster = Some(cluster.into());
        self.upstream = Some(address.into());
        self
    }

    /// The trailers the filter ended the response with.
    pub fn trailers(&self) -> Vec<(String, String)> {
        self.sent_trailers.borrow().clone()
    }

    /// Whether the filter reset the stream.
    pub fn was_reset(&self) -> bool {
        self.reset.get()
    }
}

impl crate::http_filter::Stream for FakeStream {
    fn request_header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
    fn http_version(&self) -> Option<String> {
        self.version.clone()
    }
    fn cluster(&self) -> Option<String> {
        self.cluster.clone()
    }
    fn upstream_address(&self) -> Option<String> {
        self.upstream.clone()
    }
    fn send_trailers(&self, trailers: &[(&str, &str)]) {
        self.sent_trailers
            .borrow_mut()
            .extend(trailers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    }
    fn reset(&self) {
        self.reset.set(true);
    }
}
