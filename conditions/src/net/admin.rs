//! The admin HTTP server on `--metrics-listen`: `/metrics` (Prometheus),
//! `/healthz`, `/readyz` (ready after the first full list of
//! EndpointSlices), `/serving` (the gRPC server takes calls, whatever the
//! index holds: the envoy-gateway mode's readiness, since the hook answers
//! in every state) and the status page (`/debug/services`, `.html`), on
//! one small HTTP/1 listener, bounded (`--metrics-max-connections`,
//! `--metrics-max-connections-per-peer`, `--metrics-header-timeout`). The
//! status page is rendered at most once per [`DEBUG_RENDER_EVERY`] (the
//! render is kept and served meanwhile), so that a client asking for it in
//! a loop costs the companion one render a second.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::limits::{names as limit, HttpLimits};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::ratelog::LogBudget;

/// How long a render of the status page is served before the next.
pub const DEBUG_RENDER_EVERY: Duration = Duration::from_secs(1);

/// The status page's last renders (JSON, HTML), each with its time.
#[derive(Default)]
struct Renders {
    json: Mutex<Option<(Instant, Bytes)>>,
    html: Mutex<Option<(Instant, Bytes)>>,
    /// Renders made (tests).
    made: AtomicU64,
}

impl Renders {
    /// The kept render in `slot` if it is younger than
    /// [`DEBUG_RENDER_EVERY`], else a new one. Callers wait on the slot's
    /// lock, so concurrent requests make one render between them.
    fn get(
        &self,
        slot: &Mutex<Option<(Instant, Bytes)>>,
        render: impl FnOnce() -> String,
    ) -> Bytes {
        let mut kept = slot.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if let Some((at, body)) = kept.as_ref() {
            if now.duration_since(*at) < DEBUG_RENDER_EVERY {
                return body.clone();
            }
        }
        let body = Bytes::from(render());
        self.made.fetch_add(1, Ordering::Relaxed);
        *kept = Some((now, body.clone()));
        body
    }
}

/// What the admin routes read.
struct Admin {
    metrics: Arc<Metrics>,
    renders: Renders,
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    respond_bytes(status, content_type, Bytes::from(body))
}

fn respond_bytes(status: StatusCode, content_type: &str, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn route(admin: &Admin, path: &str) -> Response<Full<Bytes>> {
    let metrics = &admin.metrics;
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        // the status page (telemetry::status)
        "/debug/services" => respond_bytes(
            StatusCode::OK,
            "application/json",
            admin
                .renders
                .get(&admin.renders.json, || metrics.status().json().to_string()),
        ),
        "/debug/services.html" => respond_bytes(
            StatusCode::OK,
            "text/html; charset=utf-8",
            admin
                .renders
                .get(&admin.renders.html, || metrics.status().html()),
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

/// The metrics port's open connections, oldest first, each closable, and
/// how many each address holds.
#[derive(Default)]
struct HttpConnections {
    next: AtomicUsize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    by_id: BTreeMap<usize, (IpAddr, Arc<Notify>)>,
    per_peer: HashMap<IpAddr, usize>,
}

/// What a new connection on the metrics port costs another: none, or
/// the oldest connection of an address.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// Nothing: there was room.
    Admitted,
    /// Its own address held its share: that address's oldest is closed.
    OverPeerShare,
    /// All were open: the oldest of the address holding the most is closed.
    Displaced(IpAddr),
}

impl Open {
    /// Admits connection `id` from `ip`. An address holds at most
    /// `per_peer`: past it, its own oldest connection is closed, so a
    /// client that keeps connecting only cuts itself; when `max` are open,
    /// the oldest connection of the address holding the most is closed, so
    /// an address with few (a scrape in flight, a probe) keeps them.
    fn admit(
        &mut self,
        id: usize,
        ip: IpAddr,
        close: Arc<Notify>,
        max: usize,
        per_peer: usize,
    ) -> Admission {
        let mine = self.per_peer.get(&ip).copied().unwrap_or(0);
        let admission = if mine >= per_peer.max(1) {
            self.close_oldest_of(ip);
            Admission::OverPeerShare
        } else if self.by_id.len() >= max.max(1) {
            match self
                .per_peer
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(p, _)| *p)
            {
                Some(top) => {
                    self.close_oldest_of(top);
                    Admission::Displaced(top)
                }
                None => Admission::Admitted,
            }
        } else {
            Admission::Admitted
        };
        self.by_id.insert(id, (ip, close));
        *self.per_peer.entry(ip).or_insert(0) += 1;
        admission
    }

    fn close_oldest_of(&mut self, ip: IpAddr) {
        let oldest = self
            .by_id
            .iter()
            .find(|(_, (p, _))| *p == ip)
            .map(|(id, _)| *id);
        if let Some((_, close)) = oldest.and_then(|id| self.remove(id)) {
            close.notify_one();
        }
    }

    /// Forgets connection `id` (closed, or displaced).
    fn remove(&mut self, id: usize) -> Option<(IpAddr, Arc<Notify>)> {
        let (ip, close) = self.by_id.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&ip);
            }
        }
        Some((ip, close))
    }
}

impl HttpConnections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz`, `/debug/services` on `listener` until the process
/// ends. Bounded: headers must arrive within `--metrics-header-timeout`, an
/// address holds at most `--metrics-max-connections-per-peer` connections
/// (a new one over it is closed, the ones open, scrapes in flight, kept),
/// and past `--metrics-max-connections` a new connection closes the oldest
/// of the address that holds the most, so one client's half-sent requests
/// can neither keep the probes out nor cut another client's scrape.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, limits: HttpLimits) {
    metrics.set_limit(
        limit::METRICS_MAX_CONNECTIONS,
        limits.metrics_max_connections as i64,
    );
    metrics.set_limit(
        limit::METRICS_HEADER_TIMEOUT,
        limits.metrics_header_timeout.as_secs() as i64,
    );
    metrics.set_limit(
        limit::METRICS_MAX_CONNECTIONS_PER_PEER,
        limits.metrics_max_connections_per_peer as i64,
    );
    let admin = Arc::new(Admin {
        metrics: metrics.clone(),
        renders: Renders::default(),
    });
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
            let admission = open.admit(
                id,
                peer.ip(),
                close.clone(),
                limits.metrics_max_connections,
                limits.metrics_max_connections_per_peer,
            );
            metrics.set_http_connections(open.by_id.len());
            drop(open);
            match admission {
                Admission::Admitted => {}
                Admission::OverPeerShare => {
                    metrics.peer_limit_hit(limit::METRICS_MAX_CONNECTIONS_PER_PEER, "address");
                    if let Some(left_out) = HTTP_LOG.allow() {
                        tracing::warn!(peer = %peer, left_out, "metrics port over --metrics-max-connections-per-peer: this address's oldest connection is closed");
                    }
                }
                Admission::Displaced(top) => {
                    metrics.limit_hit(limit::METRICS_MAX_CONNECTIONS);
                    if let Some(left_out) = HTTP_LOG.allow() {
                        tracing::warn!(peer = %peer, displaced = %top, left_out, "metrics port over --metrics-max-connections: the oldest connection of the address holding the most is closed");
                    }
                }
            }
        }
        let metrics = metrics.clone();
        let admin = admin.clone();
        let conns = conns.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = route(&admin, req.uri().path());
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
            open.remove(id);
            metrics.set_http_connections(open.by_id.len());
        });
    }
}

/// Binds the admin listener (`--metrics-listen`).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    crate::net::listener::bind(addr)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn routes_and_readiness_follow_the_index() {
        let m = Admin {
            metrics: Arc::new(Metrics::with_registry(
                Metrics::new_registry(),
                Default::default(),
            )),
            renders: Renders::default(),
        };
        assert_eq!(
            route(&m, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(route(&m, "/healthz").status(), StatusCode::OK);
        m.metrics.set_ready(true);
        assert_eq!(route(&m, "/readyz").status(), StatusCode::OK);
        // /serving is the gRPC server's state, not the index's.
        assert_eq!(
            route(&m, "/serving").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.metrics.set_serving(true);
        assert_eq!(route(&m, "/serving").status(), StatusCode::OK);
        assert_eq!(route(&m, "/metrics").status(), StatusCode::OK);
        assert_eq!(
            route(&m, "/debug/services").headers()[hyper::header::CONTENT_TYPE],
            "application/json"
        );
        assert_eq!(route(&m, "/nope").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_status_page_is_rendered_at_most_once_a_second_however_often_asked() {
        let m = Admin {
            metrics: Arc::new(Metrics::with_registry(
                Metrics::new_registry(),
                Default::default(),
            )),
            renders: Renders::default(),
        };
        for _ in 0..200 {
            assert_eq!(route(&m, "/debug/services").status(), StatusCode::OK);
            assert_eq!(route(&m, "/debug/services.html").status(), StatusCode::OK);
        }
        assert_eq!(
            m.renders.made.load(Ordering::Relaxed),
            2,
            "one render of each page"
        );
        std::thread::sleep(DEBUG_RENDER_EVERY);
        route(&m, "/debug/services");
        assert_eq!(
            m.renders.made.load(Ordering::Relaxed),
            3,
            "a new render once the kept one is old"
        );
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_address_cannot_take_the_metrics_port_from_another() {
        let mut open = Open::default();
        let (max, per_peer) = (4, 2);
        let n = || Arc::new(Notify::new());
        // A scrape in flight from .1, then .2 keeps connecting.
        assert_eq!(
            open.admit(0, ip(1), n(), max, per_peer),
            Admission::Admitted
        );
        assert_eq!(
            open.admit(1, ip(2), n(), max, per_peer),
            Admission::Admitted
        );
        assert_eq!(
            open.admit(2, ip(2), n(), max, per_peer),
            Admission::Admitted
        );
        for id in 3..10 {
            // .2 holds its share: each new one closes .2's own oldest.
            assert_eq!(
                open.admit(id, ip(2), n(), max, per_peer),
                Admission::OverPeerShare
            );
            assert!(open.by_id.contains_key(&0), "the scrape is kept");
            assert!(!open.by_id.contains_key(&(id - 2)));
        }
        // .3 and .4 fill the port; then .5 displaces the oldest of an
        // address holding the most (.2, two), never .1's scrape.
        assert_eq!(
            open.admit(10, ip(3), n(), max, per_peer),
            Admission::Admitted
        );
        assert_eq!(
            open.admit(11, ip(5), n(), max, per_peer),
            Admission::Displaced(ip(2))
        );
        assert!(open.by_id.contains_key(&0));
        assert_eq!(open.by_id.len(), 4);
        assert_eq!(open.per_peer.values().sum::<usize>(), 4);
        for id in 0..12 {
            open.remove(id);
        }
        assert!(open.by_id.is_empty() && open.per_peer.is_empty());
    }
}
