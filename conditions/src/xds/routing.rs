//! The ADS and EDS gRPC services: a call routed by its method to a new
//! stream (refused over a stream limit), or answered UNIMPLEMENTED
//! (`FetchEndpoints`, unknown methods).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use http::HeaderValue;
use tokio::sync::Notify;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;

use crate::limits::names as limit;
use crate::telemetry::ratelog::LogBudget;
use crate::xds::delta::DeltaStream;
use crate::xds::request_task::read_requests;
use crate::xds::response_body::ResponseBody;
use crate::xds::server::{Core, StreamShared, XdsServer, OPEN_LOG};
use crate::xds::sotw::SotwStream;
use crate::xds::stream_state::StreamState;

static REFUSED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

pub(super) const ADS: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
pub(super) const EDS: &str = "envoy.service.endpoint.v3.EndpointDiscoveryService";

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`.
#[derive(Clone)]
pub struct AdsService(Arc<Core>);

/// `envoy.service.endpoint.v3.EndpointDiscoveryService`.
#[derive(Clone)]
pub struct EdsService(Arc<Core>);

impl XdsServer {
    /// Both services, for a tonic server.
    pub fn services(&self) -> (AdsService, EdsService) {
        (AdsService(self.core.clone()), EdsService(self.core.clone()))
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = ADS;
}

impl NamedService for EdsService {
    const NAME: &'static str = EDS;
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send + 'static>>;

fn method<B>(req: &http::Request<B>) -> &str {
    req.uri().path().rsplit('/').next().unwrap_or("")
}

fn answer(r: http::Response<Body>) -> ResponseFuture {
    Box::pin(std::future::ready(Ok(r)))
}

/// Routes a call of the ADS service by its method.
pub(super) fn ads(core: &Arc<Core>, req: http::Request<Body>) -> ResponseFuture {
    answer(match method(&req) {
        "StreamAggregatedResources" => open_stream(core, req, "ads", false),
        "DeltaAggregatedResources" => open_stream(core, req, "ads-delta", true),
        m => Status::unimplemented(format!("{ADS}/{m}: no such method")).into_http(),
    })
}

/// Routes a call of the EDS service by its method.
///
/// The unary `FetchEndpoints` is answered UNIMPLEMENTED: Envoy's gRPC
/// subscriptions always stream (its REST-JSON fetch is plain HTTP, not this
/// method), and a unary call would sit outside the streams' limits.
pub(super) fn eds(core: &Arc<Core>, req: http::Request<Body>) -> ResponseFuture {
    answer(match method(&req) {
        "StreamEndpoints" => open_stream(core, req, "eds", false),
        "FetchEndpoints" => Status::unimplemented(format!(
            "{EDS}/FetchEndpoints is not served: subscribe with StreamEndpoints, DeltaEndpoints or ADS"
        ))
        .into_http(),
        "DeltaEndpoints" => open_stream(core, req, "eds-delta", true),
        m => Status::unimplemented(format!("{EDS}/{m}: no such method")).into_http(),
    })
}

/// A tower service for tonic's router, calling `route`.
macro_rules! grpc_service {
    ($service:ty, $route:ident) => {
        impl tonic::codegen::Service<http::Request<Body>> for $service {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = ResponseFuture;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: http::Request<Body>) -> ResponseFuture {
                $route(&self.0, req)
            }
        }
    };
}

grpc_service!(AdsService, ads);
grpc_service!(EdsService, eds);

fn grpc_response(body: Body) -> http::Response<Body> {
    let mut r = http::Response::new(body);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

fn refuse(core: &Core, which: &'static str, peer: &str, status: Status) -> http::Response<Body> {
    core.callbacks.limit_hit(which);
    core.callbacks.stream_refused(which);
    if let Some(left_out) = REFUSED_LOG.allow() {
        tracing::warn!(peer = %peer, limit = which, left_out, message = status.message(), "xDS stream refused");
    }
    status.into_http()
}

/// A new stream (state of the world, or `delta`): refused over a limit,
/// else its request task and body.
fn open_stream(
    core: &Arc<Core>,
    req: http::Request<Body>,
    api: &'static str,
    delta: bool,
) -> http::Response<Body> {
    let conn = core.connections.as_ref().and_then(|c| c.of_http(&req));
    let peer = conn
        .as_ref()
        .map(|c| c.peer.to_string())
        .unwrap_or_else(|| "-".to_string());
    if let (Some(c), Some(connections)) = (&conn, &core.connections) {
        if c.over_cap() {
            return connections.over_cap_status(c).into_http();
        }
        c.called();
    }
    let max = core.limits.max_streams;
    if core.streams.open.fetch_add(1, Ordering::SeqCst) >= max {
        core.streams.open.fetch_sub(1, Ordering::SeqCst);
        let status = Status::resource_exhausted(format!(
            "stream limit reached: {max} xDS streams are open (--max-streams); retry later"
        ));
        return refuse(core, limit::MAX_STREAMS, &peer, status);
    }
    if let (Some(c), Some(connections)) = (&conn, &core.connections) {
        let per = connections.max_streams_per_connection();
        if c.streams.fetch_add(1, Ordering::SeqCst) >= per {
            c.streams.fetch_sub(1, Ordering::SeqCst);
            core.streams.open.fetch_sub(1, Ordering::SeqCst);
            let status = Status::resource_exhausted(format!(
                "stream limit reached: {per} xDS streams are open on this connection (--max-streams-per-connection)"
            ));
            return refuse(core, limit::MAX_STREAMS_PER_CONNECTION, &peer, status);
        }
        if let Some(share) = c.share() {
            let per = core.limits.max_streams_per_peer;
            if share.streams.fetch_add(1, Ordering::SeqCst) >= per {
                share.streams.fetch_sub(1, Ordering::SeqCst);
                c.streams.fetch_sub(1, Ordering::SeqCst);
                core.streams.open.fetch_sub(1, Ordering::SeqCst);
                connections.peer_limit_hit(limit::MAX_STREAMS_PER_PEER, share.key.class());
                core.callbacks.stream_refused(limit::MAX_STREAMS_PER_PEER);
                if let Some(left_out) = REFUSED_LOG.allow() {
                    tracing::warn!(peer = %peer, peer_class = share.key.class(), max = per, left_out, "xDS stream over --max-streams-per-peer: refused");
                }
                return Status::resource_exhausted(format!(
                    "stream limit reached: {per} xDS streams are open from this peer (--max-streams-per-peer); retry later"
                ))
                .into_http();
            }
        }
    }
    let shared = Arc::new(StreamShared {
        id: core.streams.next_id.fetch_add(1, Ordering::SeqCst),
        api,
        peer,
        node: Mutex::new(String::new()),
        state: Mutex::new({
            let snap = core.snapshots.borrow().clone();
            if delta {
                StreamState::Delta(
                    DeltaStream::new(core.names.clone(), &snap).retaining(core.retained.clone()),
                )
            } else {
                StreamState::Sotw(
                    SotwStream::new(core.names.clone(), &snap).retaining(core.retained.clone()),
                )
            }
        }),
        counted: AtomicUsize::new(0),
        wake: AtomicWaker::new(),
        end: Mutex::new(None),
        sending_since: Mutex::new(None),
        held_until: Mutex::new(None),
        closed: Notify::new(),
        cut: AtomicBool::new(false),
        conn,
    });
    core.streams.map().insert(shared.id, shared.clone());
    core.callbacks.stream_opened();
    if let Some(left_out) = OPEN_LOG.allow() {
        tracing::info!(api, peer = %shared.peer, left_out, "xDS stream opened");
    }
    tokio::spawn(read_requests(
        core.clone(),
        shared.clone(),
        req.into_body(),
        delta,
    ));
    grpc_response(Body::new(ResponseBody::new(core.clone(), shared)))
}
