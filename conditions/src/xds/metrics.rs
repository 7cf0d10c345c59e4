//! The xDS server's metrics, and the companion's answer to its
//! [`Callbacks`]: [`MetricsCallbacks`] records each event in them, in the
//! limits and in the status page.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::telemetry::metric_group;
use crate::telemetry::metrics::{seconds_buckets, Labels, Metrics};
use crate::xds::Callbacks;

type OwnedLabels = Vec<(&'static str, String)>;

metric_group! {
    /// The xDS streams' metrics (prefix `serving_picker_conditions_`), after
    /// the publisher's in `/metrics`.
    #[derive(Clone)]
    pub struct XdsMetrics {
        streams: Gauge = ("xds_streams", "Connected xDS streams"),
        pushes: Counter = ("xds_pushes", "xDS responses a stream started to hand to HTTP/2 (built from the newest snapshot when the stream had room); xds_responses_sent counts those fully handed"),
        pushed_resources: Counter = ("xds_pushed_resources", "ClusterLoadAssignments in the responses counted by xds_pushes"),
        acks: Counter = ("xds_acks", "xDS responses Envoy accepted"),
        nacks: Counter = ("xds_nacks", "xDS responses Envoy rejected"),
        nacks_by_peer: Family<Labels, Counter> = ("xds_nacks_by_peer_class", "xDS responses rejected, by the class of the peer that sent the NACK (loopback, private, public, unknown); the node id is the client's word, the peer is not"),
        retained_bytes: Gauge = ("xds_retained_bytes", "Bytes the xDS streams keep between requests: subscriptions (32 bytes a name) and names to answer removed (see limit{limit=\"max-retained-bytes\"})"),
        push_lag_seconds: Histogram = ("xds_push_lag_seconds", "From a source change to a response carrying the assignment it produced started on a stream", seconds_buckets()),
        ack_seconds: Histogram = ("xds_ack_seconds", "From a response sent to Envoy's ACK (Envoy's time to apply it, plus the round trip)", seconds_buckets()),
        responses_sent: Counter = ("xds_responses_sent", "xDS responses whose every byte was handed to HTTP/2 (which holds at most the peer's window beyond what the socket took)"),
        sent_bytes: Counter = ("xds_sent_bytes", "Bytes of the responses counted by xds_responses_sent (gRPC framing included)"),
        coalesced: Counter = ("xds_coalesced", "Snapshots that replaced a response due and not yet taken by its stream (the stream gets the newest state in one response)"),
        resets: Family<Labels, Counter> = ("xds_resets", "xDS streams cut by the companion, by reason (send-timeout: a due response not taken within --send-timeout; the connection is closed)"),
        refused: Family<Labels, Counter> = ("xds_refused", "xDS streams and gRPC connections refused with RESOURCE_EXHAUSTED, by the limit (flag) that refused them"),
        subscribers: Family<OwnedLabels, Gauge> = ("xds_subscribers", "xDS streams subscribed to each cluster (EDS resource)"),
        send_held_seconds: Counter<f64, AtomicU64> = ("xds_send_held_seconds", "Time due responses waited for their stream's share of the response work (--max-stream-send-rate after --max-stream-send-burst; each wait is counted in limit_hits_total{limit=\"max-stream-send-rate\"}): a client that keeps asking for large responses waits on itself"),
        request_held_seconds: Counter<f64, AtomicU64> = ("xds_request_held_seconds", "Time xDS streams were not read because their requests changed more names than their share (--max-stream-request-rate after --max-stream-request-burst; each wait is counted in limit_hits_total{limit=\"max-stream-request-rate\"}): a client that keeps subscribing and unsubscribing waits on itself"),
        oldest_unsent_seconds: Gauge<f64, AtomicU64> = ("xds_oldest_unsent_response_seconds", "Age of the oldest response due and not taken by its stream (a stream is cut at --send-timeout)"),
        unknown_names: Counter = ("xds_unknown_resource_names", "Resource names requested that no --cluster defines (a state-of-the-world stream keeps none; a delta stream keeps each until a response answers it removed, within xds_retained_bytes)"),
        largest_request_bytes: Gauge = ("xds_largest_request_bytes", "Largest xDS request message received (see limit{limit=\"max-request-bytes\"})"),
        request_buffer_bytes: Gauge = ("xds_request_buffer_bytes", "Request bytes held beyond each message's first 64 KiB (see limit{limit=\"request-buffer-bytes\"})"),
        subscriptions: Gauge = ("xds_subscriptions", "Resource names subscribed over all xDS streams (see limit{limit=\"max-subscriptions\"})"),
        programming_seconds: Histogram = ("programming_duration_seconds", "From a change (the slice's endpoints.kubernetes.io/last-change-trigger-time, else when the companion saw it) to each Envoy's ACK of the response carrying it, per Envoy: kube-proxy's network_programming_duration_seconds for the companion's subscribers", programming_buckets()),
    }
}

/// 1 ms .. ~9 min: kube-proxy's range (0.25 s .. 300 s), finer below a second.
fn programming_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// The companion's answer to the xDS server's events: the xDS metrics, the
/// limits' and the status page (`Metrics`).
pub struct MetricsCallbacks {
    xds: XdsMetrics,
    metrics: Arc<Metrics>,
}

impl MetricsCallbacks {
    /// Records in `xds` and in `metrics` (its limits and status page).
    pub fn new(xds: XdsMetrics, metrics: Arc<Metrics>) -> MetricsCallbacks {
        MetricsCallbacks { xds, metrics }
    }
}

impl Callbacks for MetricsCallbacks {
    fn limit_set(&self, limit: &'static str, value: i64) {
        self.metrics.set_limit(limit, value);
    }
    fn limit_hit(&self, limit: &'static str) {
        self.metrics.limit_hit(limit);
    }
    fn stream_refused(&self, limit: &'static str) {
        self.xds
            .refused
            .get_or_create(&vec![("limit", limit)])
            .inc();
    }
    fn stream_opened(&self) {
        self.xds.streams.inc();
    }
    fn stream_identified(&self, node: &str, peer: &str) {
        self.metrics.status().stream_opened(node, peer);
    }
    fn stream_closed(&self, node: &str) {
        self.xds.streams.dec();
        if !node.is_empty() {
            self.metrics.status().stream_closed(node);
        }
    }
    fn request_received(&self, bytes: usize) {
        let bytes = bytes as i64;
        if bytes > self.xds.largest_request_bytes.get() {
            self.xds.largest_request_bytes.set(bytes);
        }
    }
    fn request_buffer_bytes(&self, held: usize) {
        self.xds.request_buffer_bytes.set(held as i64);
    }
    fn unknown_names(&self, n: usize) {
        self.xds.unknown_names.inc_by(n as u64);
    }
    fn response_started(&self, resources: usize, lags: &[Duration]) {
        self.xds.pushes.inc();
        self.xds.pushed_resources.inc_by(resources as u64);
        for l in lags {
            self.xds.push_lag_seconds.observe(l.as_secs_f64());
        }
    }
    fn response_sent(&self, bytes: usize) {
        self.xds.responses_sent.inc();
        self.xds.sent_bytes.inc_by(bytes as u64);
    }
    fn acked(&self, node: &str, peer: &str, version: &str, after: Option<Duration>) {
        self.xds.acks.inc();
        if let Some(d) = after {
            self.xds.ack_seconds.observe(d.as_secs_f64());
        }
        self.metrics.status().acked(node, peer, version);
    }
    fn nacked(&self, node: &str, peer: &str, version: &str, message: &str) {
        self.xds.nacks.inc();
        self.xds
            .nacks_by_peer
            .get_or_create(&vec![("peer_class", peer_class(peer))])
            .inc();
        self.metrics.status().nacked(node, peer, version, message);
    }
    fn programmed(&self, node: &str, triggers: &[SystemTime]) {
        let now = SystemTime::now();
        let latencies: Vec<Duration> = triggers
            .iter()
            .map(|t| now.duration_since(*t).unwrap_or(Duration::ZERO))
            .collect();
        for d in &latencies {
            self.xds.programming_seconds.observe(d.as_secs_f64());
        }
        self.metrics.status().programmed(node, &latencies);
    }
    fn subscriptions(&self, n: usize) {
        self.xds.subscriptions.set(n as i64);
    }
    fn coalesced(&self) {
        self.xds.coalesced.inc();
    }
    fn oldest_unsent(&self, age: Duration) {
        self.xds.oldest_unsent_seconds.set(age.as_secs_f64());
    }
    fn subscribers(&self, cluster: &str, n: i64) {
        self.xds
            .subscribers
            .get_or_create(&vec![("cluster", cluster.to_string())])
            .set(n);
    }
    fn stream_reset(&self, reason: &'static str) {
        self.xds
            .resets
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }
    fn send_held(&self, _node: &str, wait: Duration) {
        self.metrics
            .limit_hit(crate::limits::names::MAX_STREAM_SEND_RATE);
        self.xds.send_held_seconds.inc_by(wait.as_secs_f64());
    }
    fn request_held(&self, _node: &str, wait: Duration) {
        self.metrics
            .limit_hit(crate::limits::names::MAX_STREAM_REQUEST_RATE);
        self.xds.request_held_seconds.inc_by(wait.as_secs_f64());
    }
    fn retained_bytes(&self, bytes: usize, limit: usize) {
        self.xds.retained_bytes.set(bytes as i64);
        self.metrics.status().set_xds_retained(bytes, limit);
    }
}

/// The class of a peer address, for a metric's label: `loopback`,
/// `private` (RFC 1918, shared 100.64/10, link-local, IPv6 unique local:
/// inside a cluster), `public`, or `unknown` (no address).
pub fn peer_class(peer: &str) -> &'static str {
    use std::net::{IpAddr, SocketAddr};
    let Ok(addr) = peer.parse::<SocketAddr>() else {
        return "unknown";
    };
    let ip = match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        ip if ip.is_loopback() => "loopback",
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_private() || v4.is_link_local() || (a == 100 && (64..128).contains(&b)) {
                "private"
            } else {
                "public"
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80 {
                "private"
            } else {
                "public"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn peers_are_classed_by_address() {
        assert_eq!(peer_class("127.0.0.1:5000"), "loopback");
        assert_eq!(peer_class("[::1]:5000"), "loopback");
        assert_eq!(peer_class("10.1.2.3:5000"), "private");
        assert_eq!(peer_class("100.64.0.1:1"), "private");
        assert_eq!(peer_class("[fd00::1]:1"), "private");
        assert_eq!(peer_class("[::ffff:192.168.0.1]:1"), "private");
        assert_eq!(peer_class("192.0.2.7:1"), "public");
        assert_eq!(peer_class("[2001:db8::1]:1"), "public");
        assert_eq!(peer_class("-"), "unknown");
    }
}
