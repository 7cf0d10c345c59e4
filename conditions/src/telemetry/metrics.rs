//! The companion's Prometheus registry and the counters most subsystems
//! update, readiness (the first full list of EndpointSlices) and serving
//! (the gRPC server takes calls); served by `net::admin`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::model::index::Index;
use crate::telemetry::metric_group;

/// Label sets of fixed names and values (a metric family's key).
pub type Labels = Vec<(&'static str, &'static str)>;
type OwnedLabels = Vec<(&'static str, String)>;

/// Every metric the companion exports (prefix `serving_picker_conditions_`).
pub struct Metrics {
    registry: Registry,
    ready: AtomicBool,
    serving: AtomicBool,
    source: SourceMetrics,
    xds: XdsMetrics,
    connections: ConnectionMetrics,
    limits: LimitMetrics,
    admin: AdminMetrics,
    // status page (crate::telemetry::status): its state and gauge
    status: Arc<crate::telemetry::status::Board>,
}

metric_group! {
    /// The source and the index.
    pub struct SourceMetrics {
        watch_events: Family<Labels, Counter> = ("watch_events", "Events from the source, by kind (apply, delete, init, init_apply, init_done, files_reload)"),
        source_errors: Family<Labels, Counter> = ("source_errors", "Source errors, by kind (watch, file)"),
        last_success: Gauge<f64, AtomicU64> = ("source_last_success_timestamp_seconds", "Unix time of the source's last success: a full list or a watch event (Kubernetes API), a read of the slice directory (files); 0 before the first"),
        last_change: Gauge<f64, AtomicU64> = ("source_last_change_timestamp_seconds", "Unix time of the last EndpointSlice change the source saw after its first list (a watch event, a changed slice file); 0 before"),
        index_slices: Gauge = ("index_slices", "EndpointSlices in the index"),
        index_endpoints: Gauge = ("index_endpoints", "Endpoints over all indexed slices"),
        ready_gauge: Gauge = ("ready", "1 once the first full list of EndpointSlices is in"),
        updates: Counter = ("updates", "Source updates applied to the index"),
        snapshots: Counter = ("snapshots", "Snapshots published"),
        build_seconds: Histogram = ("snapshot_build_seconds", "Time to apply a batch of updates and rebuild the changed assignments", seconds_buckets()),
    }
}

metric_group! {
    /// The xDS streams.
    pub struct XdsMetrics {
        streams: Gauge = ("xds_streams", "Connected xDS streams"),
        pushes: Counter = ("xds_pushes", "xDS responses a stream started to hand to HTTP/2 (built from the newest snapshot when the stream had room); xds_responses_sent counts those fully handed"),
        pushed_resources: Counter = ("xds_pushed_resources", "ClusterLoadAssignments in the responses counted by xds_pushes"),
        acks: Counter = ("xds_acks", "xDS responses Envoy accepted"),
        nacks: Counter = ("xds_nacks", "xDS responses Envoy rejected"),
        push_lag_seconds: Histogram = ("xds_push_lag_seconds", "From a source change to a response carrying the assignment it produced started on a stream", seconds_buckets()),
        ack_seconds: Histogram = ("xds_ack_seconds", "From a response sent to Envoy's ACK (Envoy's time to apply it, plus the round trip)", seconds_buckets()),
        responses_sent: Counter = ("xds_responses_sent", "xDS responses whose every byte was handed to HTTP/2 (which holds at most the peer's window beyond what the socket took)"),
        sent_bytes: Counter = ("xds_sent_bytes", "Bytes of the responses counted by xds_responses_sent (gRPC framing included)"),
        coalesced: Counter = ("xds_coalesced", "Snapshots that replaced a response due and not yet taken by its stream (the stream gets the newest state in one response)"),
        resets: Family<Labels, Counter> = ("xds_resets", "xDS streams cut by the companion, by reason (send-timeout: a due response not taken within --send-timeout; the connection is closed)"),
        refused: Family<Labels, Counter> = ("xds_refused", "xDS streams and gRPC connections refused with RESOURCE_EXHAUSTED, by the limit (flag) that refused them"),
        subscribers: Family<OwnedLabels, Gauge> = ("xds_subscribers", "xDS streams subscribed to each cluster (EDS resource)"),
        oldest_unsent_seconds: Gauge<f64, AtomicU64> = ("xds_oldest_unsent_response_seconds", "Age of the oldest response due and not taken by its stream (a stream is cut at --send-timeout)"),
        unknown_names: Counter = ("xds_unknown_resource_names", "Resource names requested that no --cluster defines (not kept)"),
        largest_request_bytes: Gauge = ("xds_largest_request_bytes", "Largest xDS request message received (see limit{limit=\"max-request-bytes\"})"),
        request_buffer_bytes: Gauge = ("xds_request_buffer_bytes", "Request bytes held beyond each message's first 64 KiB (see limit{limit=\"request-buffer-bytes\"})"),
        subscriptions: Gauge = ("xds_subscriptions", "Resource names subscribed over all xDS streams (see limit{limit=\"max-subscriptions\"})"),
        programming_seconds: Histogram = ("programming_duration_seconds", "From a change (the slice's endpoints.kubernetes.io/last-change-trigger-time, else when the companion saw it) to each Envoy's ACK of the response carrying it, per Envoy: kube-proxy's network_programming_duration_seconds for the companion's subscribers", programming_buckets()),
    }
}

metric_group! {
    /// The gRPC listener's connections.
    pub struct ConnectionMetrics {
        connections: Gauge = ("grpc_connections", "gRPC connections open (see limit{limit=\"max-connections\"})"),
        pending_handshakes: Gauge = ("grpc_pending_handshakes", "gRPC connections accepted whose TLS handshake is not done yet; they hold no max-connections slot (see limit{limit=\"max-pending-handshakes\"})"),
    }
}

metric_group! {
    /// Each limit's value and its hits.
    pub struct LimitMetrics {
        limit_hits: Family<Labels, Counter> = ("limit_hits", "Times a limit was hit, by its flag (max-connections, max-pending-handshakes, handshake-timeout, max-streams-per-connection, max-streams, max-resource-names, max-subscriptions, max-request-bytes, request-buffer-bytes, max-response-bytes, send-timeout, metrics-max-connections, metrics-header-timeout)"),
        limits: Family<Labels, Gauge> = ("limit", "Each limit's configured value, by its flag (durations in seconds)"),
    }
}

metric_group! {
    /// The admin port.
    pub struct AdminMetrics {
        http_connections: Gauge = ("metrics_connections", "Connections open on the metrics port (see limit{limit=\"metrics-max-connections\"})"),
    }
}

/// 1 ms .. ~9 min: kube-proxy's range (0.25 s .. 300 s), finer below a second.
fn programming_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// Now as Unix time in seconds (0 before the epoch: a clock that wrong is
/// not worth a panic).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn seconds_buckets() -> Histogram {
    // 50 us .. ~13 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 19))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("serving_picker_conditions");
        let r = &mut registry;
        // Registered (and so rendered) in this order.
        let source = SourceMetrics::register(r);
        let xds = XdsMetrics::register(r);
        let connections = ConnectionMetrics::register(r);
        let limits = LimitMetrics::register(r);
        let admin = AdminMetrics::register(r);
        let status = Arc::new(crate::telemetry::status::Board::new(r));
        Metrics {
            registry,
            ready: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            source,
            xds,
            connections,
            limits,
            admin,
            status,
        }
    }

    /// For a mode's own metrics, registered before the Metrics is shared
    /// (`envoy_gateway::service::HookMetrics`).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn watch_event(&self, kind: &'static str) {
        self.source
            .watch_events
            .get_or_create(&vec![("kind", kind)])
            .inc();
    }

    /// A source starts: its errors of `kind` from 0, so that an alert on
    /// increase() sees the first one.
    pub fn source_started(&self, error_kind: &'static str) {
        drop(
            self.source
                .source_errors
                .get_or_create(&vec![("kind", error_kind)]),
        );
    }

    /// The source succeeded (a full list, a watch event, a directory
    /// read); `changed`: it saw a slice change after its first list.
    pub fn source_progress(&self, changed: bool) {
        let now = unix_now();
        self.source.last_success.set(now);
        if changed {
            self.source.last_change.set(now);
        }
    }

    pub fn source_error(&self, kind: &'static str) {
        self.source
            .source_errors
            .get_or_create(&vec![("kind", kind)])
            .inc();
    }

    /// After the publisher applied `n` updates.
    pub fn applied(&self, n: usize, index: &Index, ready: bool, took: Duration) {
        self.source.updates.inc_by(n as u64);
        self.source.index_slices.set(index.slice_count() as i64);
        self.source
            .index_endpoints
            .set(index.endpoint_count() as i64);
        self.source.ready_gauge.set(i64::from(ready));
        self.ready.store(ready, Ordering::SeqCst);
        self.source.build_seconds.observe(took.as_secs_f64());
    }

    pub fn published(&self) {
        self.source.snapshots.inc();
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The gRPC server takes calls (true) or is shutting down (false).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    pub fn stream_opened(&self) {
        self.xds.streams.inc();
    }

    pub fn stream_closed(&self) {
        self.xds.streams.dec();
    }

    /// A limit's configured value (`limit` gauge).
    pub fn set_limit(&self, name: &'static str, value: i64) {
        self.limits
            .limits
            .get_or_create(&vec![("limit", name)])
            .set(value);
        // Its hits from 0, so that an alert on increase() sees the first one.
        drop(self.limits.limit_hits.get_or_create(&vec![("limit", name)]));
    }

    /// A limit was hit.
    pub fn limit_hit(&self, name: &'static str) {
        self.limits
            .limit_hits
            .get_or_create(&vec![("limit", name)])
            .inc();
    }

    /// A stream or connection refused with RESOURCE_EXHAUSTED.
    pub fn xds_refused(&self, name: &'static str) {
        self.xds.refused.get_or_create(&vec![("limit", name)]).inc();
    }

    pub fn connection_opened(&self) {
        self.connections.connections.inc();
    }

    pub fn connection_closed(&self) {
        self.connections.connections.dec();
    }

    /// Connections waiting for their TLS handshake (`grpc_pending_handshakes`).
    pub fn set_pending_handshakes(&self, n: usize) {
        self.connections.pending_handshakes.set(n as i64);
    }

    /// A request message of `bytes`.
    pub fn request_received(&self, bytes: usize) {
        let bytes = bytes as i64;
        if bytes > self.xds.largest_request_bytes.get() {
            self.xds.largest_request_bytes.set(bytes);
        }
    }

    pub fn set_request_buffer_bytes(&self, n: usize) {
        self.xds.request_buffer_bytes.set(n as i64);
    }

    pub fn unknown_names(&self, n: usize) {
        self.xds.unknown_names.inc_by(n as u64);
    }

    pub fn coalesced(&self) {
        self.xds.coalesced.inc();
    }

    /// A response of `bytes` fully handed to HTTP/2.
    pub fn sent(&self, bytes: usize) {
        self.xds.responses_sent.inc();
        self.xds.sent_bytes.inc_by(bytes as u64);
    }

    pub fn stream_reset(&self, reason: &'static str) {
        self.xds
            .resets
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }

    pub fn set_oldest_unsent(&self, age: Duration) {
        self.xds.oldest_unsent_seconds.set(age.as_secs_f64());
    }

    pub fn set_subscribers(&self, cluster: &str, n: i64) {
        self.xds
            .subscribers
            .get_or_create(&vec![("cluster", cluster.to_string())])
            .set(n);
    }

    /// A response started with `resources` assignments, `lags` from each one's change.
    pub fn pushed(&self, resources: usize, lags: impl Iterator<Item = Duration>) {
        self.xds.pushes.inc();
        self.xds.pushed_resources.inc_by(resources as u64);
        for l in lags {
            self.xds.push_lag_seconds.observe(l.as_secs_f64());
        }
    }

    pub fn acked(&self, after: Option<Duration>) {
        self.xds.acks.inc();
        if let Some(d) = after {
            self.xds.ack_seconds.observe(d.as_secs_f64());
        }
    }

    pub fn nacked(&self) {
        self.xds.nacks.inc();
    }

    /// One Envoy applied a change `after` it happened.
    pub fn observe_programming(&self, after: Duration) {
        self.xds.programming_seconds.observe(after.as_secs_f64());
    }

    pub fn set_subscriptions(&self, n: usize) {
        self.xds.subscriptions.set(n as i64);
    }

    /// The status page's state (`/debug/services`).
    /// The admin port's open connections.
    pub fn set_http_connections(&self, open: usize) {
        self.admin.http_connections.set(open as i64);
    }

    pub fn status(&self) -> &crate::telemetry::status::Board {
        &self.status
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn renders_the_counters() {
        let m = Metrics::new();
        m.watch_event("apply");
        m.nacked();
        m.applied(1, &Index::new(), true, Duration::from_micros(10));
        assert!(m.is_ready());
        let text = m.render();
        assert!(
            text.contains("serving_picker_conditions_watch_events_total{kind=\"apply\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("serving_picker_conditions_xds_nacks_total 1"),
            "{text}"
        );
        assert!(text.contains("serving_picker_conditions_ready 1"), "{text}");
    }
}
