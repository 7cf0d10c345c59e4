//! The companion's Prometheus registry and what every mode's plumbing
//! (`run::Plumbing`) reports: the connections on both ports, the limits,
//! the status page, readiness (the first full list of EndpointSlices) and
//! serving (the gRPC server takes calls); served by `net::admin`. The
//! source's, the publisher's and the xDS server's groups are their own
//! (`source::metrics`, `eds::metrics`, `xds::metrics`), registered first
//! (`run::Telemetry`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::telemetry::metric_group;

/// Label sets of fixed names and values (a metric family's key).
pub type Labels = Vec<(&'static str, &'static str)>;

/// The registry of every metric the companion exports (prefix
/// `serving_picker_conditions_`), and the plumbing's own.
pub struct Metrics {
    registry: Registry,
    ready: AtomicBool,
    serving: AtomicBool,
    /// `xds_refused`, registered with the xDS server's group
    /// (`xds::metrics`): the listener's refusals count there too.
    refused: Family<Labels, Counter>,
    connections: ConnectionMetrics,
    limits: LimitMetrics,
    admin: AdminMetrics,
    // status page (crate::telemetry::status): its state and gauge
    status: Arc<crate::telemetry::status::Board>,
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
        limit_hits: Family<Labels, Counter> = ("limit_hits", "Times a limit was hit, by its flag (max-connections, max-pending-handshakes, handshake-timeout, max-streams-per-connection, max-streams, max-resource-names, max-subscriptions, max-request-bytes, request-buffer-bytes, max-response-bytes, send-timeout, metrics-max-connections, metrics-header-timeout, max-connections-per-peer, preface-timeout, max-streams-per-peer, first-request-timeout, request-receive-timeout, request-buffer-bytes-per-peer, metrics-max-connections-per-peer)"),
        limits: Family<Labels, Gauge> = ("limit", "Each limit's configured value, by its flag (durations in seconds)"),
        peer_limit_hits: Family<Labels, Counter> = ("peer_limit_hits", "Times a per-peer share or deadline was hit, by its flag and the class of the peer's identity (peer_class: mtls, a client certificate on an address; address, an address alone); each hit is also in limit_hits, except max-connection-age and max-connection-age-grace (every long-lived connection's roll-off)"),
    }
}

metric_group! {
    /// The admin port.
    pub struct AdminMetrics {
        http_connections: Gauge = ("metrics_connections", "Connections open on the metrics port (see limit{limit=\"metrics-max-connections\"})"),
    }
}

/// Now as Unix time in seconds (0 before the epoch: a clock that wrong is
/// not worth a panic).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The buckets of the companion's latency histograms: 50 us .. ~13 s.
pub fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 19))
}

impl Metrics {
    /// An empty registry with the companion's prefix, for the groups that
    /// come before the plumbing's in `/metrics` (`run::Telemetry`).
    pub fn new_registry() -> Registry {
        Registry::with_prefix("serving_picker_conditions")
    }

    /// The plumbing's metrics, registered in `registry` after the groups it
    /// holds; `refused`: the xDS group's `xds_refused`, which the listener
    /// shares.
    pub fn with_registry(mut registry: Registry, refused: Family<Labels, Counter>) -> Metrics {
        let r = &mut registry;
        // Registered (and so rendered) in this order.
        let connections = ConnectionMetrics::register(r);
        let limits = LimitMetrics::register(r);
        let admin = AdminMetrics::register(r);
        let status = Arc::new(crate::telemetry::status::Board::new(r));
        Metrics {
            registry,
            ready: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            refused,
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

    /// Whether the first full list of EndpointSlices is in (`/readyz`);
    /// the publisher's `ready` gauge says the same (`eds::metrics`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// The first full list of EndpointSlices is in (`/readyz` answers 200).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The gRPC server takes calls (true) or is shutting down (false).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    /// The gRPC server takes calls (`/serving` answers 200).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
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

    /// A per-peer share or deadline was hit by a peer of this class
    /// (`mtls` or `address`): counted in `peer_limit_hits` and `limit_hits`.
    pub fn peer_limit_hit(&self, name: &'static str, peer_class: &'static str) {
        self.limits
            .peer_limit_hits
            .get_or_create(&vec![("limit", name), ("peer_class", peer_class)])
            .inc();
        self.limit_hit(name);
    }

    /// A connection reached `--max-connection-age` or its grace: counted in
    /// `peer_limit_hits` only, since every long-lived connection does (an
    /// alert on `limit_hits` must not fire on the normal roll-off).
    pub fn connection_aged(&self, name: &'static str, peer_class: &'static str) {
        self.limits
            .peer_limit_hits
            .get_or_create(&vec![("limit", name), ("peer_class", peer_class)])
            .inc();
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
        self.refused.get_or_create(&vec![("limit", name)]).inc();
    }

    /// A gRPC connection took a `--max-connections` slot (`grpc_connections`).
    pub fn connection_opened(&self) {
        self.connections.connections.inc();
    }

    /// A gRPC connection closed and gave its slot back.
    pub fn connection_closed(&self) {
        self.connections.connections.dec();
    }

    /// Connections waiting for their TLS handshake (`grpc_pending_handshakes`).
    pub fn set_pending_handshakes(&self, n: usize) {
        self.connections.pending_handshakes.set(n as i64);
    }

    /// The admin port's open connections.
    pub fn set_http_connections(&self, open: usize) {
        self.admin.http_connections.set(open as i64);
    }

    /// The status page's state (`/debug/services`).
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
