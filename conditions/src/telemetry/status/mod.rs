//! The status page on the metrics port: what the companion decided and who
//! took it. `/debug/services` (JSON) and `/debug/services.html` (the same,
//! as a page) show, per managed Service port (each `--cluster`), every
//! endpoint with its conditions, zone, node and hints, the tier it is in
//! and the priority it gets; per subscriber (each Envoy, by node id) the
//! version it last ACKed and how long ago, its last NACK with Envoy's error
//! message, and how many streams it has open; beside each node id, the
//! peers (client addresses) that used it and the peer that sent its last
//! ACK and NACK: a node id is the client's word, so one sent from an
//! unexpected peer (a forged ACK or NACK) shows as such.
//!
//! A row is keyed by the node id cut to [`MAX_NODE_ID`] characters, the
//! length the xDS server keeps, in every call: an id's length never makes
//! it another's row.
//!
//! Bounded like every other answer of the companion: at most
//! [`MAX_ENDPOINT_ROWS`] endpoint rows over all ports, [`MAX_SUBSCRIBERS`]
//! subscriber records (the oldest disconnected one goes first), strings cut
//! to [`MAX_TEXT`] characters, a NACK message to [`MAX_NACK_MESSAGE`]; the
//! answer says how many rows it left out. Served on the metrics listener
//! only, with its limits (`--metrics-max-connections`,
//! `--metrics-header-timeout`).
//!
//! Each endpoint's part in stream drain, as the core decides it
//! ([`draining_hosts`]): draining (terminating while a ready endpoint of
//! its port exists: Envoys with `drain_window_ms` end its long-lived
//! streams within the window), or serving+terminating and the port's only
//! serving choice (rows 3 and 4: its streams are never ended early). The
//! counts of streams ended live in Envoy's stats; the page names them.
//!
//! The page is one typed model ([`Page`]): the JSON is its serialization
//! and the HTML is rendered from the same structs.
//!
//! Also the gauge `serving_picker_conditions_service_serving_endpoints`
//! per cluster: 0 is a Service port with no serving endpoint.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::Value;

use serving_picker_core::contract::Tier;
use serving_picker_core::drain::draining_hosts;

use crate::model::cluster::ClusterSpec;
use crate::model::endpoint::Endpoint;
use crate::telemetry::metric_group;

mod html;

/// Endpoint rows shown, over all ports.
pub const MAX_ENDPOINT_ROWS: usize = 1000;
/// Subscriber records kept (by node id).
pub const MAX_SUBSCRIBERS: usize = 256;
/// Any name shown is cut to this many characters.
pub const MAX_TEXT: usize = 253;
/// A node id (a subscriber row's key) is kept to this many characters.
pub const MAX_NODE_ID: usize = 256;
/// Peers (client addresses) kept per subscriber row.
pub const MAX_PEERS_PER_NODE: usize = 4;
/// A NACK's error message is cut to this many characters.
pub const MAX_NACK_MESSAGE: usize = 512;

type ClusterLabel = Vec<(&'static str, String)>;

metric_group! {
    /// The page's gauge.
    struct BoardMetrics {
        serving_endpoints: Family<ClusterLabel, Gauge> = ("service_serving_endpoints", "Serving endpoints of each managed Service port, by cluster (0: requests get the no-serving 503)"),
    }
}

/// The page: `/debug/services` is its JSON, `/debug/services.html` its HTML.
#[derive(Clone, Debug, Serialize)]
struct Page {
    snapshot_version: Option<String>,
    published_seconds_ago: Option<f64>,
    /// Tiers written as EDS priorities.
    priority_output: bool,
    services: Vec<PortRow>,
    subscribers: Vec<SubscriberRow>,
    programming_latency: ProgrammingLatency,
    xds_retained_bytes: Retained,
    native_lb_team_policies: Vec<TeamPolicy>,
    bounds: Bounds,
}

/// One managed Service port.
#[derive(Clone, Debug, Serialize)]
struct PortRow {
    cluster: String,
    service: String,
    port_name: String,
    #[serde(rename = "endpoints_total")]
    total: usize,
    serving: usize,
    /// The tier Envoy serves this port from (its best non-empty one).
    #[serde(rename = "serves_from_tier")]
    serves_from: &'static str,
    /// Its endpoints in stream drain, over all of them (shown or not).
    stream_drain: PortDrain,
    endpoints: Vec<EndpointRow>,
}

/// One endpoint as the page shows it.
#[derive(Clone, Debug, Serialize)]
struct EndpointRow {
    address: String,
    ready: bool,
    serving: bool,
    terminating: bool,
    zone: Option<String>,
    node_name: Option<String>,
    hints_zones: Option<String>,
    hints_nodes: Option<String>,
    tier: &'static str,
    /// With the tiered output: the priority written, `None` when left out;
    /// without: 0.
    priority: Option<u32>,
    /// What Envoy is told of its health.
    health: &'static str,
    /// Its part in stream drain, `None`: none.
    stream_drain: Option<StreamDrain>,
}

/// An endpoint's part in stream drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum StreamDrain {
    /// Terminating while its port has a ready endpoint: Envoys with a
    /// drain window end its long-lived streams within the window.
    Draining,
    /// Serving+terminating and its port's only serving choice (rows 3
    /// and 4): its streams are never ended early.
    OnlyServingChoice,
}

impl StreamDrain {
    fn text(self) -> &'static str {
        match self {
            StreamDrain::Draining => "draining",
            StreamDrain::OnlyServingChoice => "only serving choice",
        }
    }
}

/// A port's endpoints in stream drain.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct PortDrain {
    draining: usize,
    only_serving_choice: usize,
}

#[derive(Clone, Debug, Serialize)]
struct SubscriberRow {
    node: String,
    peer: String,
    peers: Vec<String>,
    peers_left_out: usize,
    open_streams: usize,
    acked_version: Option<String>,
    acked_seconds_ago: Option<f64>,
    acked_by_peer: Option<String>,
    last_nack: Option<NackRow>,
    last_programmed: Option<Programmed>,
}

#[derive(Clone, Debug, Serialize)]
struct NackRow {
    version: String,
    message: String,
    seconds_ago: f64,
    peer: String,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Programmed {
    changes: usize,
    slowest_seconds: f64,
    seconds_ago: f64,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct ProgrammingLatency {
    changes_acked: u64,
    recent: usize,
    p50_seconds: Option<f64>,
    p99_seconds: Option<f64>,
    max_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Retained {
    held: usize,
    limit: usize,
}

#[derive(Clone, Debug, Serialize)]
struct TeamPolicy {
    shape: &'static str,
    clusters: u64,
    example: String,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct Bounds {
    max_endpoint_rows: usize,
    endpoint_rows_left_out: usize,
    max_port_rows: usize,
    ports_left_out: usize,
    max_subscribers: usize,
    max_text_chars: usize,
    max_node_id_chars: usize,
    max_nack_message_chars: usize,
}

#[derive(Clone, Debug)]
struct Nack {
    version: String,
    message: String,
    at: Instant,
    /// The peer that sent it.
    peer: String,
}

#[derive(Clone, Debug, Default)]
struct Subscriber {
    /// The peer of its newest stream.
    peer: String,
    /// The distinct peer addresses (without ports) that opened a stream,
    /// ACKed or NACKed as this node, at most [`MAX_PEERS_PER_NODE`].
    peers: Vec<String>,
    /// Requests from peers beyond those kept (not told apart: telling
    /// them apart would keep them).
    peers_left_out: usize,
    streams: usize,
    /// The version, when, and the peer that sent the ACK.
    acked: Option<(String, Instant, String)>,
    nack: Option<Nack>,
    last_seen: Option<Instant>,
    /// Its last ACK that confirmed changes: how many, the slowest, when.
    programmed: Option<(usize, Duration, Instant)>,
}

/// Programming latencies kept for the page's percentiles.
pub const PROGRAMMING_KEPT: usize = 4096;

/// The most recent programming latencies (a ring), for the page.
#[derive(Default)]
struct Programming {
    recent: std::collections::VecDeque<Duration>,
    total: u64,
}

/// Where the page reads its Service ports from when they are not pushed
/// (mode `eds`: the publisher, at most `max` ports, the rest counted).
pub trait PortSource: Send + Sync {
    /// (priority output on, ports with their endpoints, ports left out).
    fn ports(&self, max: usize) -> (bool, Vec<(ClusterSpec, Vec<Endpoint>)>, usize);
}

/// Service ports listed on the page at most (each with its summary; the
/// endpoint rows are bounded apart).
pub const MAX_PORT_ROWS: usize = 1000;

#[derive(Default)]
struct Services {
    ports: Vec<PortRow>,
    left_out: usize,
    priorities: bool,
    published: Option<(String, Instant)>,
}

/// The page's state: written by the publisher and the xDS streams, read by
/// the metrics listener.
pub struct Board {
    services: Mutex<Services>,
    subscribers: Mutex<BTreeMap<String, Subscriber>>,
    serving_endpoints: Family<ClusterLabel, Gauge>,
    source: Mutex<Option<Arc<dyn PortSource>>>,
    programming: Mutex<Programming>,
    /// Bytes the xDS streams keep, and their limit.
    xds_retained: Mutex<(usize, usize)>,
    /// Envoy Gateway's last PostTranslateModify: the clusters that keep a
    /// team's load balancer, by shape (clusters, one of them).
    team_policies: Mutex<Vec<(&'static str, u64, String)>>,
}

/// A subscriber row's key: the node id as the xDS server keeps it.
fn node_key(node: &str) -> String {
    cut(node, MAX_NODE_ID)
}

/// A peer without its port (a client reconnects from another port).
fn peer_host(peer: &str) -> String {
    match peer.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().to_string(),
        Err(_) => cut(peer, MAX_TEXT),
    }
}

impl Subscriber {
    fn saw_peer(&mut self, peer: &str) {
        let host = peer_host(peer);
        if self.peers.contains(&host) {
            return;
        }
        if self.peers.len() < MAX_PEERS_PER_NODE {
            self.peers.push(host);
        } else {
            self.peers_left_out += 1;
        }
    }
}

fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Board {
    /// A board whose gauge is registered in `registry`.
    pub fn new(registry: &mut Registry) -> Board {
        Board {
            services: Mutex::new(Services::default()),
            subscribers: Mutex::new(BTreeMap::new()),
            serving_endpoints: BoardMetrics::register(registry).serving_endpoints,
            source: Mutex::new(None),
            programming: Mutex::new(Programming::default()),
            xds_retained: Mutex::new((0, 0)),
            team_policies: Mutex::new(Vec::new()),
        }
    }

    /// The clusters of the last PostTranslateModify that keep a team's
    /// load balancer: (shape, clusters, one of them); one row per shape.
    pub fn set_team_policies(&self, rows: &[(&'static str, u64, String)]) {
        *lock(&self.team_policies) = rows
            .iter()
            .map(|(shape, n, c)| (*shape, *n, cut(c, MAX_TEXT)))
            .collect();
    }

    /// Reads the ports from `source` when the page is asked for, rather
    /// than having them pushed at every snapshot (work per change stays in
    /// proportion to the change).
    pub fn set_source(&self, source: Arc<dyn PortSource>) {
        *lock(&self.source) = Some(source);
    }

    /// The serving endpoints of one port (`service_serving_endpoints`).
    pub fn set_port_serving(&self, cluster: &str, serving: usize) {
        self.serving_endpoints
            .get_or_create(&vec![("cluster", cut(cluster, MAX_TEXT))])
            .set(serving as i64);
    }

    /// A port no longer served: its gauge series goes.
    pub fn remove_port(&self, cluster: &str) {
        self.serving_endpoints
            .remove(&vec![("cluster", cut(cluster, MAX_TEXT))]);
    }

    /// The snapshot version now published (with a port source).
    pub fn set_version(&self, version: &str) {
        lock(&self.services).published = Some((cut(version, MAX_TEXT), Instant::now()));
    }

    /// `node` ACKed changes, each `latencies` after it happened.
    pub fn programmed(&self, node: &str, latencies: &[Duration]) {
        let worst = latencies.iter().copied().max().unwrap_or_default();
        {
            let mut subs = lock(&self.subscribers);
            let s = Board::subscriber(&mut subs, node);
            s.programmed = Some((latencies.len(), worst, Instant::now()));
        }
        let mut p = lock(&self.programming);
        p.total += latencies.len() as u64;
        let skip = latencies.len().saturating_sub(PROGRAMMING_KEPT);
        for d in latencies.iter().skip(skip) {
            if p.recent.len() == PROGRAMMING_KEPT {
                p.recent.pop_front();
            }
            p.recent.push_back(*d);
        }
    }

    fn programming_latency(&self) -> ProgrammingLatency {
        let p = lock(&self.programming);
        let mut v: Vec<Duration> = p.recent.iter().copied().collect();
        v.sort_unstable();
        let at = |q: f64| {
            v.get(((v.len() as f64 - 1.0) * q).round() as usize)
                .map(|d| millis(*d))
        };
        ProgrammingLatency {
            changes_acked: p.total,
            recent: v.len(),
            p50_seconds: at(0.5),
            p99_seconds: at(0.99),
            max_seconds: at(1.0),
        }
    }

    /// The assignment of every cluster, as published in snapshot `version`,
    /// all at once (the companion sets a source the page reads when asked:
    /// `set_source`).
    #[cfg(test)]
    pub fn set_services<'a>(
        &self,
        version: &str,
        priorities: bool,
        ports: impl Iterator<Item = (&'a ClusterSpec, Vec<Endpoint>)>,
    ) {
        let (rows, left_out) = self.rows(ports, priorities, true);
        self.keep_rows(version, priorities, rows, left_out);
    }

    /// The page's rows of these ports (endpoint rows bounded over all), and
    /// the endpoint rows left out; `priorities`: the tiered output is on;
    /// `gauge`: also set each port's gauge.
    fn rows<'a>(
        &self,
        ports: impl Iterator<Item = (&'a ClusterSpec, Vec<Endpoint>)>,
        priorities: bool,
        gauge: bool,
    ) -> (Vec<PortRow>, usize) {
        let mut rows = Vec::new();
        let mut budget = MAX_ENDPOINT_ROWS;
        let mut left_out = 0;
        for (spec, mut eps) in ports {
            eps.sort_by_key(|e| (e.conditions.tier() as u8, e.addr));
            let serving = eps.iter().filter(|e| e.conditions.serving).count();
            let serves_from = eps
                .iter()
                .map(|e| e.conditions.tier())
                .min_by_key(|t| *t as u8)
                .unwrap_or(Tier::NoServing);
            if gauge {
                self.set_port_serving(&spec.name, serving);
            }
            let total = eps.len();
            let shown = total.min(budget);
            budget -= shown;
            left_out += total - shown;
            let drains = stream_drains(&eps);
            let mut port_drain = PortDrain::default();
            for d in drains.iter().flatten() {
                match d {
                    StreamDrain::Draining => port_drain.draining += 1,
                    StreamDrain::OnlyServingChoice => port_drain.only_serving_choice += 1,
                }
            }
            let opt = |s: &Option<Arc<str>>| s.as_deref().map(|v| cut(v, MAX_TEXT));
            let endpoints = eps
                .iter()
                .zip(drains)
                .take(shown)
                .map(|(e, stream_drain)| EndpointRow {
                    address: e.addr.to_string(),
                    ready: e.conditions.ready,
                    serving: e.conditions.serving,
                    terminating: e.conditions.terminating,
                    zone: opt(&e.zone),
                    node_name: opt(&e.node_name),
                    hints_zones: opt(&e.hints_zones),
                    hints_nodes: opt(&e.hints_nodes),
                    tier: e.conditions.tier().name(),
                    priority: if priorities {
                        e.conditions.tier().priority()
                    } else {
                        Some(0)
                    },
                    // The tiered output leaves a not serving endpoint out of EDS.
                    health: match (e.conditions.serving, priorities) {
                        (true, _) => "HEALTHY",
                        (false, true) => "not sent",
                        (false, false) => "UNHEALTHY",
                    },
                    stream_drain,
                })
                .collect();
            rows.push(PortRow {
                cluster: cut(&spec.name, MAX_TEXT),
                service: cut(&spec.service.to_string(), MAX_TEXT),
                port_name: cut(&spec.port_name, MAX_TEXT),
                total,
                serving,
                serves_from: serves_from.name(),
                stream_drain: port_drain,
                endpoints,
            });
        }
        (rows, left_out)
    }

    #[cfg(test)]
    fn keep_rows(&self, version: &str, priorities: bool, rows: Vec<PortRow>, left_out: usize) {
        let mut services = lock(&self.services);
        // A port that is gone leaves no series behind (its last value
        // would keep an alert firing).
        let now: std::collections::HashSet<&str> =
            rows.iter().map(|r| r.cluster.as_str()).collect();
        for gone in services
            .ports
            .iter()
            .filter(|old| !now.contains(old.cluster.as_str()))
        {
            self.serving_endpoints
                .remove(&vec![("cluster", gone.cluster.clone())]);
        }
        *services = Services {
            ports: rows,
            left_out,
            priorities,
            published: Some((cut(version, MAX_TEXT), Instant::now())),
        };
    }

    fn subscriber<'a>(
        subs: &'a mut BTreeMap<String, Subscriber>,
        node: &str,
    ) -> &'a mut Subscriber {
        let node = node_key(node);
        if !subs.contains_key(&node) && subs.len() >= MAX_SUBSCRIBERS {
            // Room for a new node: the disconnected one seen longest ago goes.
            let oldest = subs
                .iter()
                .filter(|(_, s)| s.streams == 0)
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| k.clone())
                .or_else(|| subs.keys().next().cloned());
            if let Some(k) = oldest {
                subs.remove(&k);
            }
        }
        subs.entry(node).or_default()
    }

    /// A stream of `node` (from `peer`) sent its first request with a node.
    pub fn stream_opened(&self, node: &str, peer: &str) {
        let mut subs = lock(&self.subscribers);
        let s = Board::subscriber(&mut subs, node);
        s.streams += 1;
        s.peer = cut(peer, MAX_TEXT);
        s.saw_peer(peer);
        s.last_seen = Some(Instant::now());
    }

    /// A stream of `node` ended.
    pub fn stream_closed(&self, node: &str) {
        let mut subs = lock(&self.subscribers);
        if let Some(s) = subs.get_mut(&node_key(node)) {
            s.streams = s.streams.saturating_sub(1);
            s.last_seen = Some(Instant::now());
        }
    }

    /// `node` ACKed `version`, on a stream from `peer`.
    pub fn acked(&self, node: &str, peer: &str, version: &str) {
        let mut subs = lock(&self.subscribers);
        let s = Board::subscriber(&mut subs, node);
        let now = Instant::now();
        s.acked = Some((cut(version, MAX_TEXT), now, cut(peer, MAX_TEXT)));
        s.saw_peer(peer);
        s.last_seen = Some(now);
    }

    /// `node` refused the response after `version` with `message`, on a
    /// stream from `peer`.
    pub fn nacked(&self, node: &str, peer: &str, version: &str, message: &str) {
        let mut subs = lock(&self.subscribers);
        let s = Board::subscriber(&mut subs, node);
        let now = Instant::now();
        s.nack = Some(Nack {
            version: cut(version, MAX_TEXT),
            message: cut(message, MAX_NACK_MESSAGE),
            at: now,
            peer: cut(peer, MAX_TEXT),
        });
        s.saw_peer(peer);
        s.last_seen = Some(now);
    }

    /// Bytes the xDS streams keep between requests, and their limit
    /// (`--max-retained-bytes`).
    pub fn set_xds_retained(&self, bytes: usize, limit: usize) {
        *lock(&self.xds_retained) = (bytes, limit);
    }

    /// The page's model, as of now.
    fn page(&self) -> Page {
        let ago = |t: Instant| round(t.elapsed());
        let source = lock(&self.source).clone();
        let mut pulled = None;
        let mut ports_left_out = 0;
        if let Some(src) = source {
            let (priorities, ports, left) = src.ports(MAX_PORT_ROWS);
            ports_left_out = left;
            let (rows, left_out) =
                self.rows(ports.iter().map(|(c, e)| (c, e.clone())), priorities, false);
            pulled = Some((priorities, rows, left_out));
        }
        let services = lock(&self.services);
        let (priorities, ports, left_out) = match pulled {
            Some(pulled) => pulled,
            None => (
                services.priorities,
                services.ports.clone(),
                services.left_out,
            ),
        };
        let subscribers = lock(&self.subscribers)
            .iter()
            .map(|(node, s)| SubscriberRow {
                node: node.clone(),
                peer: s.peer.clone(),
                peers: s.peers.clone(),
                peers_left_out: s.peers_left_out,
                open_streams: s.streams,
                acked_version: s.acked.as_ref().map(|a| a.0.clone()),
                acked_seconds_ago: s.acked.as_ref().map(|a| ago(a.1)),
                acked_by_peer: s.acked.as_ref().map(|a| a.2.clone()),
                last_nack: s.nack.as_ref().map(|n| NackRow {
                    version: n.version.clone(),
                    message: n.message.clone(),
                    seconds_ago: ago(n.at),
                    peer: n.peer.clone(),
                }),
                last_programmed: s.programmed.map(|(changes, worst, at)| Programmed {
                    changes,
                    slowest_seconds: millis(worst),
                    seconds_ago: ago(at),
                }),
            })
            .collect();
        let (held, limit) = *lock(&self.xds_retained);
        Page {
            snapshot_version: services.published.as_ref().map(|p| p.0.clone()),
            published_seconds_ago: services.published.as_ref().map(|p| ago(p.1)),
            priority_output: priorities,
            services: ports,
            subscribers,
            programming_latency: self.programming_latency(),
            xds_retained_bytes: Retained { held, limit },
            native_lb_team_policies: lock(&self.team_policies)
                .iter()
                .map(|(shape, clusters, example)| TeamPolicy {
                    shape,
                    clusters: *clusters,
                    example: example.clone(),
                })
                .collect(),
            bounds: Bounds {
                max_endpoint_rows: MAX_ENDPOINT_ROWS,
                endpoint_rows_left_out: left_out,
                max_port_rows: MAX_PORT_ROWS,
                ports_left_out,
                max_subscribers: MAX_SUBSCRIBERS,
                max_text_chars: MAX_TEXT,
                max_node_id_chars: MAX_NODE_ID,
                max_nack_message_chars: MAX_NACK_MESSAGE,
            },
        }
    }

    /// The page as JSON.
    pub fn json(&self) -> Value {
        serde_json::to_value(self.page()).unwrap_or_else(|e| {
            // Not reached: the model holds strings, numbers and lists only.
            tracing::error!(error = %e, "status page: the model did not serialize");
            Value::Null
        })
    }

    /// The page as HTML (rendered here, no script: every load is current).
    pub fn html(&self) -> String {
        html::render(&self.page())
    }
}

/// Each endpoint's part in stream drain, in order: the core names the
/// draining ones ([`draining_hosts`]); a serving+terminating one it does
/// not name is its port's only serving choice (no endpoint is ready).
fn stream_drains(eps: &[Endpoint]) -> Vec<Option<StreamDrain>> {
    let addresses: Vec<String> = eps.iter().map(|e| e.addr.to_string()).collect();
    let draining: std::collections::HashSet<&str> = draining_hosts(
        addresses
            .iter()
            .zip(eps)
            .map(|(a, e)| (a.as_str(), e.conditions.host())),
    )
    .into_iter()
    .collect();
    addresses
        .iter()
        .zip(eps)
        .map(|(a, e)| {
            if draining.contains(&a.as_str()) {
                Some(StreamDrain::Draining)
            } else if e.conditions.serving && e.conditions.terminating {
                Some(StreamDrain::OnlyServingChoice)
            } else {
                None
            }
        })
        .collect()
}

fn round(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// Seconds to the millisecond.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::endpoint;
    use serde_json::json;

    fn ep(ip: &str, serving: bool, terminating: bool) -> Endpoint {
        let mut e = endpoint(ip);
        e.serving = Some(serving);
        e.ready = Some(serving && !terminating);
        e.terminating = Some(terminating);
        Endpoint::new(&e, 80)
    }

    #[test]
    fn rows_tiers_bounds_and_subscribers() {
        let mut r = Registry::default();
        let b = Board::new(&mut r);
        let spec: ClusterSpec = "web=ns/web:http".parse().unwrap();
        let many: Vec<Endpoint> = (0..1200)
            .map(|i| ep(&format!("10.1.{}.{}", i / 250, i % 250 + 1), true, false))
            .collect();
        let spec2: ClusterSpec = "big=ns/big:http".parse().unwrap();
        b.set_services(
            "v1",
            true,
            [
                (
                    &spec,
                    vec![
                        ep("10.0.0.3", false, false),
                        ep("10.0.0.2", true, true),
                        ep("10.0.0.1", true, false),
                    ],
                ),
                (&spec2, many),
            ]
            .into_iter(),
        );
        b.stream_opened("envoy-1", "127.0.0.1:5000");
        b.acked("envoy-1", "127.0.0.1:5000", "v1");
        b.nacked("envoy-1", "127.0.0.1:5000", "v1", &"<bad>".repeat(200));
        let j = b.json();
        let web = &j["services"][0];
        assert_eq!(web["serves_from_tier"], "ready");
        assert_eq!(web["endpoints"][0]["address"], "10.0.0.1:80");
        assert_eq!(web["endpoints"][1]["tier"], "terminating_fallback");
        assert_eq!(web["endpoints"][1]["priority"], 1);
        assert_eq!(web["endpoints"][2]["priority"], Value::Null);
        assert_eq!(web["endpoints"][2]["health"], "not sent");
        assert_eq!(web["endpoints"][1]["health"], "HEALTHY");
        assert_eq!(j["services"][1]["endpoints"].as_array().unwrap().len(), 997);
        assert_eq!(j["bounds"]["endpoint_rows_left_out"], 203);
        let s = &j["subscribers"][0];
        assert_eq!(s["acked_version"], "v1");
        assert_eq!(
            s["last_nack"]["message"].as_str().unwrap().len(),
            MAX_NACK_MESSAGE
        );
        let html = b.html();
        assert!(html.contains("&lt;bad&gt;") && !html.contains("<bad>"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains("service_serving_endpoints{cluster=\"web\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn endpoints_in_drain_and_the_only_serving_choice_are_shown() {
        let b = Board::new(&mut Registry::default());
        let row_5: ClusterSpec = "web=ns/web:http".parse().unwrap();
        let row_3: ClusterSpec = "api=ns/api:http".parse().unwrap();
        let mut gone = endpoint("10.0.0.3");
        gone.serving = Some(false);
        gone.ready = Some(false);
        gone.terminating = Some(true);
        b.set_services(
            "v1",
            true,
            [
                (
                    &row_5,
                    vec![
                        ep("10.0.0.1", true, false),
                        ep("10.0.0.2", true, true),
                        Endpoint::new(&gone, 80),
                        ep("10.0.0.4", false, false),
                    ],
                ),
                (
                    &row_3,
                    vec![ep("10.0.1.1", true, true), ep("10.0.1.2", false, false)],
                ),
            ]
            .into_iter(),
        );
        let j = b.json();
        let drain_of = |port: usize, address: &str| {
            j["services"][port]["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["address"] == address)
                .map(|e| e["stream_drain"].clone())
                .unwrap()
        };
        // Row 5: every terminating endpoint drains beside the ready one.
        assert_eq!(drain_of(0, "10.0.0.2:80"), "draining");
        assert_eq!(drain_of(0, "10.0.0.3:80"), "draining");
        assert_eq!(drain_of(0, "10.0.0.1:80"), Value::Null);
        assert_eq!(drain_of(0, "10.0.0.4:80"), Value::Null);
        assert_eq!(
            j["services"][0]["stream_drain"],
            json!({"draining": 2, "only_serving_choice": 0})
        );
        // Row 3: the terminating endpoint is the only serving choice.
        assert_eq!(drain_of(1, "10.0.1.1:80"), "only_serving_choice");
        assert_eq!(drain_of(1, "10.0.1.2:80"), Value::Null);
        assert_eq!(
            j["services"][1]["stream_drain"],
            json!({"draining": 0, "only_serving_choice": 1})
        );
        let h = b.html();
        assert!(
            h.contains("data-address=\"10.0.0.2:80\">")
                && h.contains("<td class=\"drain\">draining</td>"),
            "{h}"
        );
        assert!(
            h.contains("<td class=\"drain\">only serving choice</td>"),
            "{h}"
        );
        assert!(h.contains("<b class=\"draining\">2</b> draining"), "{h}");
        assert!(h.contains("<b class=\"only-serving-choice\">1</b>"), "{h}");
        for name in [
            "serving_picker.drain.ended.{grpc,http1,http2,websocket}.reset",
            "serving_picker_drain_ended_grpc_reset",
            "dynamicmodulescustom.serving_picker.drain.ended.{grpc.trailers_unavailable,",
            "envoy_dynamicmodulescustom_serving_picker_drain_ended_grpc_trailers_unavailable",
        ] {
            assert!(h.contains(name), "{name} not named: {h}");
        }
    }

    #[test]
    fn a_port_without_terminating_endpoints_says_nothing_of_drain() {
        let b = Board::new(&mut Registry::default());
        let spec: ClusterSpec = "web=ns/web:http".parse().unwrap();
        b.set_services(
            "v1",
            false,
            [(&spec, vec![ep("10.0.0.1", true, false)])].into_iter(),
        );
        let j = b.json();
        assert_eq!(
            j["services"][0]["stream_drain"],
            json!({"draining": 0, "only_serving_choice": 0})
        );
        assert!(!b.html().contains("class=\"stream-drain\""));
    }

    /// The JSON's names and shape are what its readers (tests, the runbook)
    /// parse: every key, at every level.
    #[test]
    fn the_json_keeps_its_names_and_shape() {
        let b = Board::new(&mut Registry::default());
        let spec: ClusterSpec = "web=ns/web:http".parse().unwrap();
        b.set_services(
            "v1",
            true,
            [(&spec, vec![ep("10.0.0.1", true, false)])].into_iter(),
        );
        b.stream_opened("envoy-1", "10.0.0.9:1");
        b.acked("envoy-1", "10.0.0.9:1", "v1");
        b.nacked("envoy-1", "10.0.0.9:1", "v1", "no");
        b.programmed("envoy-1", &[Duration::from_millis(5)]);
        b.set_team_policies(&[("maglev", 1, "c".into())]);
        let j = b.json();
        let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
        assert_eq!(
            keys(&j),
            [
                "bounds",
                "native_lb_team_policies",
                "priority_output",
                "programming_latency",
                "published_seconds_ago",
                "services",
                "snapshot_version",
                "subscribers",
                "xds_retained_bytes"
            ]
        );
        assert_eq!(
            keys(&j["services"][0]),
            [
                "cluster",
                "endpoints",
                "endpoints_total",
                "port_name",
                "serves_from_tier",
                "service",
                "serving",
                "stream_drain"
            ]
        );
        assert_eq!(
            keys(&j["services"][0]["endpoints"][0]),
            [
                "address",
                "health",
                "hints_nodes",
                "hints_zones",
                "node_name",
                "priority",
                "ready",
                "serving",
                "stream_drain",
                "terminating",
                "tier",
                "zone"
            ]
        );
        let s = &j["subscribers"][0];
        assert_eq!(
            keys(s),
            [
                "acked_by_peer",
                "acked_seconds_ago",
                "acked_version",
                "last_nack",
                "last_programmed",
                "node",
                "open_streams",
                "peer",
                "peers",
                "peers_left_out"
            ]
        );
        assert_eq!(
            keys(&s["last_nack"]),
            ["message", "peer", "seconds_ago", "version"]
        );
        assert_eq!(
            keys(&s["last_programmed"]),
            ["changes", "seconds_ago", "slowest_seconds"]
        );
        assert_eq!(
            keys(&j["programming_latency"]),
            [
                "changes_acked",
                "max_seconds",
                "p50_seconds",
                "p99_seconds",
                "recent"
            ]
        );
        assert_eq!(keys(&j["xds_retained_bytes"]), ["held", "limit"]);
        assert_eq!(
            keys(&j["native_lb_team_policies"][0]),
            ["clusters", "example", "shape"]
        );
        assert_eq!(
            keys(&j["bounds"]),
            [
                "endpoint_rows_left_out",
                "max_endpoint_rows",
                "max_nack_message_chars",
                "max_node_id_chars",
                "max_port_rows",
                "max_subscribers",
                "max_text_chars",
                "ports_left_out"
            ]
        );
        // The HTML prints the same model: a number as the JSON writes it.
        assert!(b.html().contains("<td>HEALTHY</td>"));
        assert!(b.html().contains("1 (0.005 s)"), "{}", b.html());
    }

    #[test]
    fn programming_latency_shows_percentiles_and_per_subscriber() {
        let b = Board::new(&mut Registry::default());
        let all: Vec<Duration> = (1..=100u64).map(Duration::from_millis).collect();
        b.programmed("envoy-1", &all[..50]);
        b.programmed("envoy-1", &all[50..]);
        let j = b.json();
        let p = &j["programming_latency"];
        assert_eq!(p["changes_acked"], 100);
        assert_eq!(p["p50_seconds"], 0.051);
        assert_eq!(p["p99_seconds"], 0.099);
        assert_eq!(p["max_seconds"], 0.1);
        assert_eq!(
            j["subscribers"][0]["last_programmed"]["slowest_seconds"],
            0.1
        );
        assert!(b.html().contains("id=\"programming\""));
    }

    struct Ports(Vec<(ClusterSpec, Vec<Endpoint>)>);
    impl PortSource for Ports {
        fn ports(&self, max: usize) -> (bool, Vec<(ClusterSpec, Vec<Endpoint>)>, usize) {
            let shown = self.0.iter().take(max).cloned().collect();
            (false, shown, self.0.len().saturating_sub(max))
        }
    }

    #[test]
    fn ports_read_from_a_source_are_bounded() {
        let b = Board::new(&mut Registry::default());
        let ports = (0..MAX_PORT_ROWS + 5)
            .map(|i| {
                let spec: ClusterSpec = format!("ns/s{i:05}:http=ns/s{i:05}:http").parse().unwrap();
                (
                    spec,
                    vec![ep(
                        &format!("10.0.{}.{}", i / 250, i % 250 + 1),
                        true,
                        false,
                    )],
                )
            })
            .collect();
        b.set_source(Arc::new(Ports(ports)));
        let j = b.json();
        assert_eq!(j["services"].as_array().unwrap().len(), MAX_PORT_ROWS);
        assert_eq!(j["bounds"]["ports_left_out"], 5);
        assert_eq!(j["services"][0]["endpoints"][0]["tier"], "ready");
    }

    #[test]
    fn clusters_that_keep_a_teams_load_balancer_are_shown() {
        let b = Board::new(&mut Registry::default());
        assert!(!b.html().contains("team-policies"), "nothing to show");
        let long = "c".repeat(400);
        b.set_team_policies(&[("maglev", 3, "<x>".into()), ("slow_start", 1, long)]);
        let j = b.json();
        assert_eq!(j["native_lb_team_policies"][0]["shape"], "maglev");
        assert_eq!(j["native_lb_team_policies"][0]["clusters"], 3);
        assert_eq!(
            j["native_lb_team_policies"][1]["example"]
                .as_str()
                .unwrap()
                .len(),
            MAX_TEXT
        );
        let h = b.html();
        assert!(
            h.contains("<td>maglev</td><td>3</td><td>&lt;x&gt;</td>"),
            "{h}"
        );
        b.set_team_policies(&[]);
        assert!(!b.html().contains("team-policies"));
    }

    #[test]
    fn subscriber_records_are_bounded() {
        let b = Board::new(&mut Registry::default());
        for i in 0..(MAX_SUBSCRIBERS + 50) {
            b.stream_opened(&format!("n{i}"), "p");
            b.stream_closed(&format!("n{i}"));
        }
        assert_eq!(
            b.json()["subscribers"].as_array().unwrap().len(),
            MAX_SUBSCRIBERS
        );
    }

    #[test]
    fn node_ids_of_any_length_keep_their_own_rows() {
        let b = Board::new(&mut Registry::default());
        // Ids the xDS server keeps whole (up to MAX_NODE_ID characters),
        // alike in their first MAX_TEXT characters.
        let long = |c: char| format!("{}{c}", "n".repeat(MAX_NODE_ID - 1));
        b.stream_opened("short", "10.0.0.1:1000");
        for c in ['a', 'b'] {
            b.stream_opened(&long(c), "10.0.0.2:2000");
            b.acked(&long(c), "10.0.0.2:2000", "v1");
        }
        let j = b.json();
        let rows = j["subscribers"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "each id its own row: {rows:?}");
        assert!(rows.iter().all(|r| r["open_streams"] == 1));
        b.stream_closed(&long('a'));
        b.stream_closed(&long('b'));
        let j = b.json();
        let open: Vec<&Value> = j["subscribers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["open_streams"])
            .collect();
        assert_eq!(open, [&json!(0), &json!(0), &json!(1)], "closes count down");
        // At the subscriber bound, an ACK of a known long id evicts nobody.
        for i in 0..(MAX_SUBSCRIBERS - 3) {
            b.stream_opened(&format!("x{i}"), "10.0.0.9:1");
        }
        b.acked(&long('a'), "10.0.0.2:2000", "v2");
        let j = b.json();
        assert_eq!(j["subscribers"].as_array().unwrap().len(), MAX_SUBSCRIBERS);
        assert!(j["subscribers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["node"] == "short"));
    }

    #[test]
    fn a_forged_ack_or_nack_shows_its_peer_beside_the_node() {
        let b = Board::new(&mut Registry::default());
        b.stream_opened("envoy-1", "10.0.0.1:4000");
        b.stream_opened("envoy-1", "10.0.0.1:4001");
        b.acked("envoy-1", "10.0.0.1:4001", "v1");
        let j = b.json();
        assert_eq!(j["subscribers"][0]["peers"], json!(["10.0.0.1"]));
        b.nacked("envoy-1", "192.0.2.7:5555", "v1", "forged");
        let j = b.json();
        let s = &j["subscribers"][0];
        assert_eq!(s["peers"], json!(["10.0.0.1", "192.0.2.7"]));
        assert_eq!(s["last_nack"]["peer"], "192.0.2.7:5555");
        assert_eq!(s["acked_by_peer"], "10.0.0.1:4001");
        assert!(b.html().contains("from 192.0.2.7:5555"));
        for i in 0..10 {
            b.acked("envoy-1", &format!("192.0.2.{i}:1"), "v1");
        }
        let s = &b.json()["subscribers"][0];
        assert_eq!(s["peers"].as_array().unwrap().len(), MAX_PEERS_PER_NODE);
        // 192.0.2.7 is kept; 0 and 1 fill the row; 7 others left out.
        assert_eq!(s["peers_left_out"], 7);
    }

    #[test]
    fn a_port_no_longer_shown_leaves_no_gauge_series() {
        let mut r = Registry::default();
        let b = Board::new(&mut r);
        let web: ClusterSpec = "web=ns/web:http".parse().unwrap();
        let api: ClusterSpec = "api=ns/api:http".parse().unwrap();
        let render = |r: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, r).unwrap();
            text
        };
        b.set_services(
            "v1",
            false,
            [(&web, vec![]), (&api, vec![ep("10.0.0.1", true, false)])].into_iter(),
        );
        let text = render(&r);
        assert!(
            text.contains("service_serving_endpoints{cluster=\"web\"} 0"),
            "{text}"
        );
        b.set_services("v2", false, [(&api, vec![])].into_iter());
        let text = render(&r);
        assert!(!text.contains("cluster=\"web\""), "{text}");
        assert!(
            text.contains("service_serving_endpoints{cluster=\"api\"} 0"),
            "{text}"
        );
    }
}
