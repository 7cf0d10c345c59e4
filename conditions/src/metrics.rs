//! Prometheus metrics, `/healthz`, `/readyz` (ready after the first full
//! list of EndpointSlices) and `/serving` (the gRPC server takes calls,
//! whatever the index holds: the envoy-gateway mode's readiness, since the
//! hook answers in every state), on one small HTTP/1 listener.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::index::Index;
use crate::limits::{names as limit, HttpLimits};
use crate::ratelog::LogBudget;

/// Label sets of fixed names and values (a metric family's key).
pub type Labels = Vec<(&'static str, &'static str)>;
type OwnedLabels = Vec<(&'static str, String)>;

/// Every metric the companion exports (prefix `serving_picker_conditions_`).
pub struct Metrics {
    registry: Registry,
    ready: AtomicBool,
    serving: AtomicBool,
    watch_events: Family<Labels, Counter>,
    source_errors: Family<Labels, Counter>,
    index_slices: Gauge,
    index_endpoints: Gauge,
    ready_gauge: Gauge,
    updates: Counter,
    snapshots: Counter,
    build_seconds: Histogram,
    streams: Gauge,
    pushes: Counter,
    pushed_resources: Counter,
    acks: Counter,
    nacks: Counter,
    push_lag_seconds: Histogram,
    ack_seconds: Histogram,
    responses_sent: Counter,
    sent_bytes: Counter,
    coalesced: Counter,
    resets: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    subscribers: Family<OwnedLabels, Gauge>,
    oldest_unsent_seconds: Gauge<f64, AtomicU64>,
    unknown_names: Counter,
    largest_request_bytes: Gauge,
    request_buffer_bytes: Gauge,
    connections: Gauge,
    pending_handshakes: Gauge,
    limit_hits: Family<Labels, Counter>,
    limits: Family<Labels, Gauge>,
    http_connections: Gauge,
    // status page (crate::status): its state and gauge
    status: Arc<crate::status::Board>,
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

/// `metric`, registered in `registry` as `name` with `help` (the registry
/// keeps a handle to the same metric).
pub fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("serving_picker_conditions");
        let r = &mut registry;
        // Registered (and so rendered) in this order.
        let watch_events = registered(
            r,
            "watch_events",
            "Events from the source, by kind (apply, delete, init, init_apply, init_done, files_reload)",
            Family::default(),
        );
        let source_errors = registered(
            r,
            "source_errors",
            "Source errors, by kind (watch, file)",
            Family::default(),
        );
        let index_slices = registered(
            r,
            "index_slices",
            "EndpointSlices in the index",
            Gauge::default(),
        );
        let index_endpoints = registered(
            r,
            "index_endpoints",
            "Endpoints over all indexed slices",
            Gauge::default(),
        );
        let ready_gauge = registered(
            r,
            "ready",
            "1 once the first full list of EndpointSlices is in",
            Gauge::default(),
        );
        let updates = registered(
            r,
            "updates",
            "Source updates applied to the index",
            Counter::default(),
        );
        let snapshots = registered(r, "snapshots", "Snapshots published", Counter::default());
        let build_seconds = registered(
            r,
            "snapshot_build_seconds",
            "Time to apply a batch of updates and rebuild the changed assignments",
            seconds_buckets(),
        );
        let streams = registered(r, "xds_streams", "Connected xDS streams", Gauge::default());
        let pushes = registered(
            r,
            "xds_pushes",
            "xDS responses a stream started to hand to HTTP/2 (built from the newest snapshot when the stream had room); xds_responses_sent counts those fully handed",
            Counter::default(),
        );
        let pushed_resources = registered(
            r,
            "xds_pushed_resources",
            "ClusterLoadAssignments in the responses counted by xds_pushes",
            Counter::default(),
        );
        let acks = registered(
            r,
            "xds_acks",
            "xDS responses Envoy accepted",
            Counter::default(),
        );
        let nacks = registered(
            r,
            "xds_nacks",
            "xDS responses Envoy rejected",
            Counter::default(),
        );
        let push_lag_seconds = registered(
            r,
            "xds_push_lag_seconds",
            "From a source change to a response carrying the assignment it produced started on a stream",
            seconds_buckets(),
        );
        let ack_seconds = registered(
            r,
            "xds_ack_seconds",
            "From a response sent to Envoy's ACK (Envoy's time to apply it, plus the round trip)",
            seconds_buckets(),
        );
        let responses_sent = registered(
            r,
            "xds_responses_sent",
            "xDS responses whose every byte was handed to HTTP/2 (which holds at most the peer's window beyond what the socket took)",
            Counter::default(),
        );
        let sent_bytes = registered(
            r,
            "xds_sent_bytes",
            "Bytes of the responses counted by xds_responses_sent (gRPC framing included)",
            Counter::default(),
        );
        let coalesced = registered(
            r,
            "xds_coalesced",
            "Snapshots that replaced a response due and not yet taken by its stream (the stream gets the newest state in one response)",
            Counter::default(),
        );
        let resets = registered(
            r,
            "xds_resets",
            "xDS streams cut by the companion, by reason (send-timeout: a due response not taken within --send-timeout; the connection is closed)",
            Family::default(),
        );
        let refused = registered(
            r,
            "xds_refused",
            "xDS streams and gRPC connections refused with RESOURCE_EXHAUSTED, by the limit (flag) that refused them",
            Family::default(),
        );
        let subscribers = registered(
            r,
            "xds_subscribers",
            "xDS streams subscribed to each cluster (EDS resource)",
            Family::default(),
        );
        let oldest_unsent_seconds = registered(
            r,
            "xds_oldest_unsent_response_seconds",
            "Age of the oldest response due and not taken by its stream (a stream is cut at --send-timeout)",
            Gauge::<f64, AtomicU64>::default(),
        );
        let unknown_names = registered(
            r,
            "xds_unknown_resource_names",
            "Resource names requested that no --cluster defines (not kept)",
            Counter::default(),
        );
        let largest_request_bytes = registered(
            r,
            "xds_largest_request_bytes",
            "Largest xDS request message received (see limit{limit=\"max-request-bytes\"})",
            Gauge::default(),
        );
        let request_buffer_bytes = registered(
            r,
            "xds_request_buffer_bytes",
            "Request bytes held beyond each message's first 64 KiB (see limit{limit=\"request-buffer-bytes\"})",
            Gauge::default(),
        );
        let connections = registered(
            r,
            "grpc_connections",
            "gRPC connections open (see limit{limit=\"max-connections\"})",
            Gauge::default(),
        );
        let pending_handshakes = registered(
            r,
            "grpc_pending_handshakes",
            "gRPC connections accepted whose TLS handshake is not done yet; they hold no max-connections slot (see limit{limit=\"max-pending-handshakes\"})",
            Gauge::default(),
        );
        let limit_hits = registered(
            r,
            "limit_hits",
            "Times a limit was hit, by its flag (max-connections, max-pending-handshakes, handshake-timeout, max-streams-per-connection, max-streams, max-resource-names, max-request-bytes, request-buffer-bytes, max-response-bytes, send-timeout, metrics-max-connections, metrics-header-timeout)",
            Family::default(),
        );
        let limits = registered(
            r,
            "limit",
            "Each limit's configured value, by its flag (durations in seconds)",
            Family::default(),
        );
        let http_connections = registered(
            r,
            "metrics_connections",
            "Connections open on the metrics port (see limit{limit=\"metrics-max-connections\"})",
            Gauge::default(),
        );
        // status page (crate::status)
        let status = Arc::new(crate::status::Board::new(r));
        Metrics {
            status,
            registry,
            responses_sent,
            sent_bytes,
            coalesced,
            resets,
            refused,
            subscribers,
            oldest_unsent_seconds,
            unknown_names,
            largest_request_bytes,
            request_buffer_bytes,
            connections,
            pending_handshakes,
            limit_hits,
            limits,
            http_connections,
            ready: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            watch_events,
            source_errors,
            index_slices,
            index_endpoints,
            ready_gauge,
            updates,
            snapshots,
            build_seconds,
            streams,
            pushes,
            pushed_resources,
            acks,
            nacks,
            push_lag_seconds,
            ack_seconds,
        }
    }

    /// For a mode's own metrics, registered before the Metrics is shared
    /// (`envoy_gateway::service::HookMetrics`).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn watch_event(&self, kind: &'static str) {
        self.watch_events.get_or_create(&vec![("kind", kind)]).inc();
    }

    pub fn source_error(&self, kind: &'static str) {
        self.source_errors
            .get_or_create(&vec![("kind", kind)])
            .inc();
    }

    /// After the publisher applied `n` updates.
    pub fn applied(&self, n: usize, index: &Index, ready: bool, took: Duration) {
        self.updates.inc_by(n as u64);
        self.index_slices.set(index.slice_count() as i64);
        self.index_endpoints.set(index.endpoint_count() as i64);
        self.ready_gauge.set(i64::from(ready));
        self.ready.store(ready, Ordering::SeqCst);
        self.build_seconds.observe(took.as_secs_f64());
    }

    pub fn published(&self) {
        self.snapshots.inc();
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
        self.streams.inc();
    }

    pub fn stream_closed(&self) {
        self.streams.dec();
    }

    /// A limit's configured value (`limit` gauge).
    pub fn set_limit(&self, name: &'static str, value: i64) {
        self.limits.get_or_create(&vec![("limit", name)]).set(value);
        // Its hits from 0, so that an alert on increase() sees the first one.
        drop(self.limit_hits.get_or_create(&vec![("limit", name)]));
    }

    /// A limit was hit.
    pub fn limit_hit(&self, name: &'static str) {
        self.limit_hits.get_or_create(&vec![("limit", name)]).inc();
    }

    /// A stream or connection refused with RESOURCE_EXHAUSTED.
    pub fn xds_refused(&self, name: &'static str) {
        self.refused.get_or_create(&vec![("limit", name)]).inc();
    }

    pub fn connection_opened(&self) {
        self.connections.inc();
    }

    pub fn connection_closed(&self) {
        self.connections.dec();
    }

    /// Connections waiting for their TLS handshake (`grpc_pending_handshakes`).
    pub fn set_pending_handshakes(&self, n: usize) {
        self.pending_handshakes.set(n as i64);
    }

    /// A request message of `bytes`.
    pub fn request_received(&self, bytes: usize) {
        let bytes = bytes as i64;
        if bytes > self.largest_request_bytes.get() {
            self.largest_request_bytes.set(bytes);
        }
    }

    pub fn set_request_buffer_bytes(&self, n: usize) {
        self.request_buffer_bytes.set(n as i64);
    }

    pub fn unknown_names(&self, n: usize) {
        self.unknown_names.inc_by(n as u64);
    }

    pub fn coalesced(&self) {
        self.coalesced.inc();
    }

    /// A response of `bytes` fully handed to HTTP/2.
    pub fn sent(&self, bytes: usize) {
        self.responses_sent.inc();
        self.sent_bytes.inc_by(bytes as u64);
    }

    pub fn stream_reset(&self, reason: &'static str) {
        self.resets.get_or_create(&vec![("reason", reason)]).inc();
    }

    pub fn set_oldest_unsent(&self, age: Duration) {
        self.oldest_unsent_seconds.set(age.as_secs_f64());
    }

    pub fn set_subscribers(&self, cluster: &str, n: i64) {
        self.subscribers
            .get_or_create(&vec![("cluster", cluster.to_string())])
            .set(n);
    }

    /// A response started with `resources` assignments, `lags` from each one's change.
    pub fn pushed(&self, resources: usize, lags: impl Iterator<Item = Duration>) {
        self.pushes.inc();
        self.pushed_resources.inc_by(resources as u64);
        for l in lags {
            self.push_lag_seconds.observe(l.as_secs_f64());
        }
    }

    pub fn acked(&self, after: Option<Duration>) {
        self.acks.inc();
        if let Some(d) = after {
            self.ack_seconds.observe(d.as_secs_f64());
        }
    }

    pub fn nacked(&self) {
        self.nacks.inc();
    }

    /// The status page's state (`/debug/services`).
    pub fn status(&self) -> &crate::status::Board {
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

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn route(metrics: &Metrics, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        // status page (crate::status)
        "/debug/services" => respond(
            StatusCode::OK,
            "application/json",
            metrics.status.json().to_string(),
        ),
        "/debug/services.html" => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            metrics.status.html(),
        ),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if metrics.is_ready() => respond(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: no full list of EndpointSlices yet\n".into(),
        ),
        "/serving" if metrics.is_serving() => {
            respond(StatusCode::OK, "text/plain", "serving\n".into())
        }
        "/serving" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not serving: the gRPC server is not taking calls\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

static HTTP_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

/// The metrics port's open connections, oldest first, each closable.
#[derive(Default)]
struct HttpConnections {
    next: AtomicUsize,
    open: Mutex<BTreeMap<usize, Arc<Notify>>>,
}

impl HttpConnections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Arc<Notify>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz`, `/debug/services` on `listener` until the process
/// ends. Bounded: headers must arrive within `--metrics-header-timeout`, and
/// past `--metrics-max-connections` a new connection closes the oldest, so
/// half-sent requests cannot keep the probes out.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, limits: HttpLimits) {
    metrics.set_limit(
        limit::METRICS_MAX_CONNECTIONS,
        limits.metrics_max_connections as i64,
    );
    metrics.set_limit(
        limit::METRICS_HEADER_TIMEOUT,
        limits.metrics_header_timeout.as_secs() as i64,
    );
    let conns = Arc::new(HttpConnections::default());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.metrics_header_timeout)
        .max_buf_size(16 * 1024);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = conns.next.fetch_add(1, Ordering::SeqCst);
        let close = Arc::new(Notify::new());
        {
            let mut open = conns.lock();
            while open.len() >= limits.metrics_max_connections.max(1) {
                let Some((_, oldest)) = open.pop_first() else {
                    break;
                };
                oldest.notify_one();
                metrics.limit_hit(limit::METRICS_MAX_CONNECTIONS);
                if let Some(left_out) = HTTP_LOG.allow() {
                    tracing::warn!(peer = %peer, left_out, "metrics port over --metrics-max-connections: the oldest connection is closed");
                }
            }
            open.insert(id, close.clone());
            metrics.http_connections.set(open.len() as i64);
        }
        let metrics = metrics.clone();
        let conns = conns.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let m = metrics.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = route(&m, req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::select! {
                r = http.serve_connection(io, service) => {
                    if let Err(e) = r {
                        if e.is_timeout() {
                            metrics.limit_hit(limit::METRICS_HEADER_TIMEOUT);
                            if let Some(left_out) = HTTP_LOG.allow() {
                                tracing::warn!(peer = %peer, left_out, "metrics port: headers not in within --metrics-header-timeout: closed");
                            }
                        }
                    }
                }
                _ = close.notified() => {}
            }
            let mut open = conns.lock();
            open.remove(&id);
            metrics.http_connections.set(open.len() as i64);
        });
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    crate::listener::bind(addr)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn renders_and_readiness_follows_the_index() {
        let m = Metrics::new();
        assert_eq!(
            route(&m, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(route(&m, "/healthz").status(), StatusCode::OK);
        m.watch_event("apply");
        m.nacked();
        m.applied(1, &Index::new(), true, Duration::from_micros(10));
        assert_eq!(route(&m, "/readyz").status(), StatusCode::OK);
        // /serving is the gRPC server's state, not the index's.
        assert_eq!(
            route(&m, "/serving").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.set_serving(true);
        assert_eq!(route(&m, "/serving").status(), StatusCode::OK);
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
        assert_eq!(route(&m, "/nope").status(), StatusCode::NOT_FOUND);
    }
}
