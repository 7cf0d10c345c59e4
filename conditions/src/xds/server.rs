//! The gRPC services (ADS, EDS; state of the world and delta) and one
//! stream's two halves: a task that reads requests ([`read_requests`]),
//! and the response body that HTTP/2 polls when it has room
//! ([`ResponseBody`]), which then takes a response from the stream's
//! protocol state (`sotw`, `delta`). Served by hand rather than through
//! tonic's generated servers, whose codec copies every response into a
//! buffer of the stream's own: here the resource bytes go to HTTP/2 shared.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::Node;
use futures::task::AtomicWaker;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;

use crate::eds::publish::Snapshot;
use crate::eds::response_bytes as wire;
use crate::limits::{names as limit, XdsLimits, FREE_REQUEST_BYTES};
use crate::net::listener::{Conn, Connections};
use crate::telemetry::ratelog::LogBudget;
use crate::xds::byte_budget::ByteBudget;
use crate::xds::callbacks::Callbacks;
use crate::xds::delta::DeltaStream;
use crate::xds::protocol::{Handled, Names, RequestKind, StreamState, Taken};
use crate::xds::requests::{self, DeltaRequestView, MessageError, RequestView};
use crate::xds::retained::{Refusal, RetainedBudget};
use crate::xds::sotw::SotwStream;

/// Largest piece of a response handed to HTTP/2 at once: a stream's
/// response goes out as the peer's window allows, not all queued at once.
const CHUNK: usize = 64 * 1024;
/// A node id is kept for the logs up to this length (the status page's
/// key: the same length).
const NODE_ID_MAX: usize = crate::telemetry::status::MAX_NODE_ID;
/// How long a request message waits for room in `--request-buffer-bytes`
/// before its stream ends.
const REQUEST_BUFFER_WAIT: Duration = Duration::from_secs(2);
/// Other type URLs remembered per stream (to log each once).
const OTHER_TYPES_MAX: usize = 8;

static OPEN_LOG: LogBudget = LogBudget::new(20, Duration::from_secs(1));
static REFUSED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static UNKNOWN_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static NACK_LOG: LogBudget = LogBudget::new(10, Duration::from_secs(10));
static OTHER_TYPE_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static ENDED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static OVERSIZED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static HELD_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

const ADS: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const EDS: &str = "envoy.service.endpoint.v3.EndpointDiscoveryService";

/// What every stream shares: snapshots, names, limits, callbacks.
pub(crate) struct Core {
    pub(crate) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(crate) names: Arc<Names>,
    pub(crate) limits: XdsLimits,
    pub(crate) callbacks: Arc<dyn Callbacks>,
    connections: Option<Arc<Connections>>,
    pub(crate) streams: Streams,
    /// `--request-buffer-bytes`, as permits of one byte.
    pub(crate) request_budget: Arc<Semaphore>,
    /// Names subscribed over all streams (`--max-subscriptions`).
    pub(crate) subscriptions: AtomicUsize,
    /// Bytes the streams keep between requests (`--max-retained-bytes`).
    pub(crate) retained: Arc<RetainedBudget>,
}

/// The open streams.
#[derive(Default)]
pub(crate) struct Streams {
    next_id: AtomicU64,
    open: AtomicUsize,
    map: Mutex<HashMap<u64, Arc<StreamShared>>>,
}

impl Streams {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, Arc<StreamShared>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every open stream, at this moment.
    pub(crate) fn list(&self) -> Vec<Arc<StreamShared>> {
        self.map().values().cloned().collect()
    }

    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// One stream, as its request task, its body and the fan-out see it.
pub(crate) struct StreamShared {
    id: u64,
    pub(crate) api: &'static str,
    pub(crate) peer: String,
    pub(crate) node: Mutex<String>,
    pub(crate) state: Mutex<StreamState>,
    /// Its names counted in `Core::subscriptions`.
    counted: AtomicUsize,
    /// The body's waker: a response may be due.
    pub(crate) wake: AtomicWaker,
    /// How the stream ends, once its request side has ended.
    end: Mutex<Option<Status>>,
    /// Since when a taken response has been partly handed to HTTP/2.
    pub(crate) sending_since: Mutex<Option<Instant>>,
    /// Until when the stream's last wait for its share of the response
    /// work lasted (`--max-stream-send-rate`): a response due is not late
    /// (`--send-timeout`) before then.
    pub(crate) held_until: Mutex<Option<Instant>>,
    /// The body is gone: the request task stops.
    closed: Notify,
    /// Cut by the send timeout (counted once).
    pub(crate) cut: AtomicBool,
    pub(crate) conn: Option<Arc<Conn>>,
}

impl StreamShared {
    pub(crate) fn state(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn node(&self) -> String {
        self.node.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn sending_since(&self) -> Option<Instant> {
        *self.sending_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_sending_since(&self, t: Option<Instant>) {
        *self.sending_since.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    pub(crate) fn held_until(&self) -> Option<Instant> {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_held_until(&self, t: Instant) {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
    }

    /// Ends the stream with `status` once the response in flight is out.
    pub(crate) fn end_with(&self, status: Status) {
        *self.end.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
        self.wake.wake();
    }
}

/// The xDS services over the published snapshots.
#[derive(Clone)]
pub struct XdsServer {
    pub(crate) core: Arc<Core>,
}

impl XdsServer {
    /// `names`: the resources served (the `--cluster` names);
    /// `connections`: the listener's, for the per-connection stream limit
    /// and the send timeout's cut (`None`: neither).
    pub fn new(
        snapshots: watch::Receiver<Arc<Snapshot>>,
        names: Names,
        limits: XdsLimits,
        callbacks: Arc<dyn Callbacks>,
        connections: Option<Arc<Connections>>,
    ) -> XdsServer {
        callbacks.limit_set(limit::MAX_STREAMS, limits.max_streams as i64);
        callbacks.limit_set(limit::MAX_RESOURCE_NAMES, limits.max_resource_names as i64);
        callbacks.limit_set(limit::MAX_REQUEST_BYTES, limits.max_request_bytes as i64);
        callbacks.limit_set(limit::MAX_RESPONSE_BYTES, limits.max_response_bytes as i64);
        callbacks.limit_set(
            limit::REQUEST_BUFFER_BYTES,
            limits.request_buffer_bytes as i64,
        );
        let request_budget = Arc::new(Semaphore::new(
            limits.request_buffer_bytes.min(Semaphore::MAX_PERMITS),
        ));
        callbacks.limit_set(limit::SEND_TIMEOUT, limits.send_timeout.as_secs() as i64);
        callbacks.limit_set(limit::MAX_SUBSCRIPTIONS, limits.max_subscriptions as i64);
        callbacks.limit_set(
            limit::MAX_STREAMS_PER_PEER,
            limits.max_streams_per_peer as i64,
        );
        callbacks.limit_set(
            limit::FIRST_REQUEST_TIMEOUT,
            limits.first_request_timeout.as_secs() as i64,
        );
        callbacks.limit_set(
            limit::REQUEST_RECEIVE_TIMEOUT,
            limits.request_receive_timeout.as_secs() as i64,
        );
        callbacks.limit_set(
            limit::REQUEST_BUFFER_BYTES_PER_PEER,
            limits.request_buffer_bytes_per_peer as i64,
        );
        callbacks.limit_set(limit::MAX_NAME_BYTES, limits.max_name_bytes as i64);
        callbacks.limit_set(
            limit::MAX_STREAM_RETAINED_BYTES,
            limits.max_stream_retained_bytes as i64,
        );
        callbacks.limit_set(limit::MAX_RETAINED_BYTES, limits.max_retained_bytes as i64);
        callbacks.limit_set(
            limit::MAX_STREAM_SEND_RATE,
            i64::try_from(limits.max_stream_send_rate).unwrap_or(i64::MAX),
        );
        callbacks.limit_set(
            limit::MAX_STREAM_SEND_BURST,
            i64::try_from(limits.max_stream_send_burst).unwrap_or(i64::MAX),
        );
        callbacks.limit_set(
            limit::MAX_STREAM_REQUEST_RATE,
            i64::try_from(limits.max_stream_request_rate).unwrap_or(i64::MAX),
        );
        callbacks.limit_set(
            limit::MAX_STREAM_REQUEST_BURST,
            i64::try_from(limits.max_stream_request_burst).unwrap_or(i64::MAX),
        );
        let retained = Arc::new(RetainedBudget::new(
            limits.max_name_bytes,
            limits.max_stream_retained_bytes,
            limits.max_retained_bytes,
        ));
        XdsServer {
            core: Arc::new(Core {
                snapshots,
                names: Arc::new(names),
                limits,
                callbacks,
                connections,
                streams: Streams::default(),
                request_budget,
                subscriptions: AtomicUsize::new(0),
                retained,
            }),
        }
    }

    /// Both services, for a tonic server.
    pub fn services(&self) -> (AdsService, EdsService) {
        (AdsService(self.core.clone()), EdsService(self.core.clone()))
    }

    /// xDS streams open.
    pub fn streams(&self) -> usize {
        self.core.streams.open()
    }

    /// Names subscribed over all streams.
    pub fn subscriptions(&self) -> usize {
        self.core.subscriptions.load(Ordering::SeqCst)
    }
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`.
#[derive(Clone)]
pub struct AdsService(Arc<Core>);

/// `envoy.service.endpoint.v3.EndpointDiscoveryService`.
#[derive(Clone)]
pub struct EdsService(Arc<Core>);

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
fn ads(core: &Arc<Core>, req: http::Request<Body>) -> ResponseFuture {
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
fn eds(core: &Arc<Core>, req: http::Request<Body>) -> ResponseFuture {
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

fn trailers(status: &Status) -> HeaderMap {
    let mut h = HeaderMap::new();
    if status.add_header(&mut h).is_err() {
        h.insert("grpc-status", HeaderValue::from_static("13"));
    }
    h
}

fn refuse(core: &Core, which: &'static str, peer: &str, status: Status) -> http::Response<Body> {
    core.callbacks.limit_hit(which);
    core.callbacks.stream_refused(which);
    if let Some(left_out) = REFUSED_LOG.allow() {
        tracing::warn!(peer = %peer, limit = which, left_out, message = status.message(), "xDS stream refused");
    }
    status.into_http()
}

/// A per-peer share or deadline hit on `conn` (counted with the peer's
/// class; plainly when the stream has no connection, in tests).
fn peer_hit(core: &Core, conn: Option<&Arc<Conn>>, which: &'static str) {
    match (&core.connections, conn.and_then(|c| c.share())) {
        (Some(connections), Some(share)) => connections.peer_limit_hit(which, share.key.class()),
        _ => core.callbacks.limit_hit(which),
    }
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
    grpc_response(Body::new(ResponseBody {
        core: core.clone(),
        shared,
        chunks: VecDeque::new(),
        in_flight: None,
        finished: false,
        budget: ByteBudget::new(
            core.limits.max_stream_send_rate,
            core.limits.max_stream_send_burst,
            tokio::time::Instant::now().into_std(),
        ),
        held: None,
    }))
}

/// Why a request stream cannot go on.
enum ReadError {
    Message(MessageError),
    Decode(prost::DecodeError),
    /// Ended inside a message.
    Truncated,
    /// A message (of this length) that `--request-buffer-bytes` has no room for.
    NoRoom(usize),
    /// A message (of this length) that the peer's share of the request
    /// buffer (`--request-buffer-bytes-per-peer`) has no room for.
    NoPeerRoom(usize),
    /// A deadline passed (`--first-request-timeout`, `--request-receive-timeout`).
    Deadline(&'static str),
    /// The stream or connection failed (reset, closed).
    Transport(String),
}

/// Requests cut from a stream's request body, one at a time; the buffer
/// goes back to small after a large one.
struct RequestReader {
    body: Body,
    buf: BytesMut,
    max: usize,
    ended: bool,
    budget: Arc<Semaphore>,
    /// The budget the message being received holds.
    held: Option<OwnedSemaphorePermit>,
    /// The peer's share of the budget (`None`: no connection, in tests).
    peer_budget: Option<Arc<Semaphore>>,
    /// What the message being received holds of the peer's share.
    peer_held: Option<OwnedSemaphorePermit>,
    /// When the message expected or begun must be complete, and the flag
    /// that says so.
    due: Option<(tokio::time::Instant, &'static str)>,
    receive_timeout: Duration,
}

impl RequestReader {
    /// The reader of a stream's requests, on `conn` (`None`: no
    /// connection, in tests): its first request is due within
    /// `--first-request-timeout`.
    fn new(body: Body, core: &Core, conn: Option<&Arc<Conn>>) -> RequestReader {
        RequestReader {
            body,
            buf: BytesMut::new(),
            max: core.limits.max_request_bytes,
            ended: false,
            budget: core.request_budget.clone(),
            held: None,
            peer_budget: conn
                .and_then(|c| c.share())
                .map(|s| s.request_budget(core.limits.request_buffer_bytes_per_peer)),
            peer_held: None,
            due: tokio::time::Instant::now()
                .checked_add(core.limits.first_request_timeout)
                .map(|at| (at, limit::FIRST_REQUEST_TIMEOUT)),
            receive_timeout: core.limits.request_receive_timeout,
        }
    }

    /// The next request message (its bytes, without the gRPC header).
    async fn next(&mut self) -> Result<Option<Bytes>, ReadError> {
        loop {
            if let Some(m) =
                requests::next_message(&mut self.buf, self.max).map_err(ReadError::Message)?
            {
                self.held = None;
                self.peer_held = None;
                self.due = None;
                if self.buf.is_empty() {
                    // The message's allocation goes with it (the buffer
                    // would keep it alive): a stream holds no request
                    // bytes between requests.
                    self.buf = BytesMut::new();
                }
                return Ok(Some(m));
            }
            if let Some(len) = requests::announced_len(&self.buf) {
                if len > FREE_REQUEST_BYTES && self.held.is_none() && len <= self.max {
                    let n = u32::try_from(len - FREE_REQUEST_BYTES).unwrap_or(u32::MAX);
                    // Waits a moment for room (many Envoys ACKing 10,000
                    // names at once), reading nothing meanwhile: the
                    // stream's 64 KiB window holds the client back. The
                    // peer's share first, so that one peer waits on itself.
                    let until = tokio::time::Instant::now()
                        .checked_add(REQUEST_BUFFER_WAIT)
                        .unwrap_or_else(tokio::time::Instant::now);
                    if let Some(share) = &self.peer_budget {
                        let wait = share.clone().acquire_many_owned(n);
                        match tokio::time::timeout_at(until, wait).await {
                            Ok(Ok(p)) => self.peer_held = Some(p),
                            _ => return Err(ReadError::NoPeerRoom(len)),
                        }
                    }
                    let wait = self.budget.clone().acquire_many_owned(n);
                    match tokio::time::timeout_at(until, wait).await {
                        Ok(Ok(p)) => self.held = Some(p),
                        _ => return Err(ReadError::NoRoom(len)),
                    }
                }
                // One allocation for the whole message (its length is
                // within --max-request-bytes, and budgeted beyond 64 KiB).
                self.buf
                    .reserve((wire::GRPC_HEADER + len).saturating_sub(self.buf.len()));
            }
            if self.ended {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Truncated)
                };
            }
            if self.due.is_none() && !self.buf.is_empty() {
                // A message begun: it is due whole within --request-receive-timeout
                // (a duration too long to add is no deadline).
                self.due = tokio::time::Instant::now()
                    .checked_add(self.receive_timeout)
                    .map(|at| (at, limit::REQUEST_RECEIVE_TIMEOUT));
            }
            let frame = match self.due {
                Some((at, which)) => tokio::time::timeout_at(at, self.body.frame())
                    .await
                    .map_err(|_| ReadError::Deadline(which))?,
                None => self.body.frame().await,
            };
            match frame {
                None => self.ended = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(ReadError::Transport(e.to_string())),
            }
        }
    }
}

/// A stream's request side: each request through the protocol state; the
/// stream ends (trailers after the response in flight) when requests end
/// or break a limit.
async fn read_requests(core: Arc<Core>, shared: Arc<StreamShared>, body: Body, delta: bool) {
    let mut reader = RequestReader::new(body, &core, shared.conn.as_ref());
    let mut other_types = BTreeSet::new();
    let mut budget = ByteBudget::new(
        core.limits.max_stream_request_rate,
        core.limits.max_stream_request_burst,
        tokio::time::Instant::now().into_std(),
    );
    let end = loop {
        if let Some(wait) = budget.wait(tokio::time::Instant::now().into_std()) {
            let node = shared.node();
            core.callbacks.request_held(&node, wait);
            if let Some(left_out) = HELD_LOG.allow() {
                tracing::info!(node = %node, peer = %shared.peer, wait_ms = wait.as_millis() as u64, rate = core.limits.max_stream_request_rate, left_out, "xDS stream's requests change names faster than its --max-stream-request-rate: not read meanwhile");
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shared.closed.notified() => break None,
            }
        }
        let next = tokio::select! {
            r = reader.next() => r,
            _ = shared.closed.notified() => break None,
        };
        match next {
            Ok(Some(message)) => {
                core.callbacks.request_received(message.len());
                let handled = if delta {
                    DeltaRequestView::decode(message)
                        .map_err(ReadError::Decode)
                        .map(|req| {
                            let cost = names_cost(&req.resource_names_subscribe)
                                + names_cost(&req.resource_names_unsubscribe);
                            handle_delta(&core, &shared, &req).map(|h| (h, cost))
                        })
                } else {
                    RequestView::decode(message)
                        .map_err(ReadError::Decode)
                        .map(|req| {
                            handle_sotw(&core, &shared, &req).map(|h| {
                                // A repeat of the names is recognised by
                                // their fingerprint: no work per name.
                                let cost = if h.names_changed {
                                    names_cost(&req.resource_names)
                                } else {
                                    0
                                };
                                (h, cost)
                            })
                        })
                };
                match handled {
                    Ok(Err(status)) => break Some(status),
                    Ok(Ok((h, cost))) => {
                        budget.spend(cost, tokio::time::Instant::now().into_std());
                        report(&core, &shared, &h, &mut other_types)
                    }
                    Err(ReadError::Decode(e)) => {
                        break Some(Status::invalid_argument(format!(
                            "not a {}DiscoveryRequest: {e}",
                            if delta { "Delta" } else { "" }
                        )))
                    }
                    Err(_) => break Some(Status::invalid_argument("bad request")),
                }
            }
            Ok(None) => break Some(Status::ok("")),
            Err(ReadError::Message(MessageError::TooLarge(len))) => {
                core.callbacks.limit_hit(limit::MAX_REQUEST_BYTES);
                break Some(Status::resource_exhausted(format!(
                    "request message of {len} bytes is over --max-request-bytes {}",
                    core.limits.max_request_bytes
                )));
            }
            Err(ReadError::NoRoom(len)) => {
                core.callbacks.limit_hit(limit::REQUEST_BUFFER_BYTES);
                break Some(Status::resource_exhausted(format!(
                    "no room for a request message of {len} bytes: the streams' request buffers are full (--request-buffer-bytes {}); retry later",
                    core.limits.request_buffer_bytes
                )));
            }
            Err(ReadError::NoPeerRoom(len)) => {
                peer_hit(
                    &core,
                    shared.conn.as_ref(),
                    limit::REQUEST_BUFFER_BYTES_PER_PEER,
                );
                break Some(Status::resource_exhausted(format!(
                    "no room for a request message of {len} bytes: this peer's streams hold their share of the request buffers (--request-buffer-bytes-per-peer {}); retry later",
                    core.limits.request_buffer_bytes_per_peer
                )));
            }
            Err(ReadError::Deadline(which)) => {
                peer_hit(&core, shared.conn.as_ref(), which);
                break Some(Status::deadline_exceeded(
                    if which == limit::FIRST_REQUEST_TIMEOUT {
                        format!(
                        "no request within --first-request-timeout ({:?}) of the stream's opening",
                        core.limits.first_request_timeout
                    )
                    } else {
                        format!(
                        "a request message begun was not complete within --request-receive-timeout ({:?})",
                        core.limits.request_receive_timeout
                    )
                    },
                ));
            }
            Err(ReadError::Message(MessageError::Compressed)) => {
                break Some(Status::unimplemented(
                    "compressed requests are not accepted (no grpc-encoding is announced)",
                ))
            }
            Err(ReadError::Decode(e)) => {
                break Some(Status::invalid_argument(format!(
                    "not a DiscoveryRequest: {e}"
                )))
            }
            Err(ReadError::Truncated) => {
                break Some(Status::invalid_argument(
                    "request stream ended inside a message",
                ))
            }
            Err(ReadError::Transport(e)) => {
                tracing::debug!(node = %shared.node(), peer = %shared.peer, error = %e, "xDS stream ended by an error");
                break None;
            }
        }
    };
    if let Some(status) = end {
        if status.code() != tonic::Code::Ok {
            if let Some(left_out) = ENDED_LOG.allow() {
                tracing::warn!(node = %shared.node(), peer = %shared.peer, code = ?status.code(), message = status.message(), left_out, "xDS stream ended by the companion");
            }
        }
        shared.end_with(status);
    }
}

/// What a request's names cost its stream's `--max-stream-request-rate`:
/// their bytes, and [`NAME_WORK`] each.
fn names_cost(names: &[Bytes]) -> usize {
    names.iter().map(|n| n.len() + NAME_WORK).sum()
}

/// The work a name costs beside its bytes (a hash, a lookup, a place in
/// the sort), in bytes.
const NAME_WORK: usize = 8;

/// Reads the node's id once per stream, for the logs.
fn identify(core: &Core, shared: &StreamShared, node_bytes: &Bytes) {
    if node_bytes.is_empty() {
        return;
    }
    let mut node = shared.node.lock().unwrap_or_else(|p| p.into_inner());
    if node.is_empty() {
        *node = match Node::decode(node_bytes.clone()) {
            Ok(n) if !n.id.is_empty() => n.id.chars().take(NODE_ID_MAX).collect(),
            _ => "-".to_string(),
        };
        core.callbacks.stream_identified(&node, &shared.peer);
    }
}

/// Counts the stream's names in the total; over `--max-subscriptions` the
/// stream ends.
fn count_subscriptions(core: &Core, shared: &StreamShared, now: usize) -> Result<(), Status> {
    let before = shared.counted.swap(now, Ordering::SeqCst);
    let total = if now >= before {
        core.subscriptions.fetch_add(now - before, Ordering::SeqCst) + (now - before)
    } else {
        core.subscriptions.fetch_sub(before - now, Ordering::SeqCst) - (before - now)
    };
    let max = core.limits.max_subscriptions;
    if total > max {
        core.callbacks.limit_hit(limit::MAX_SUBSCRIPTIONS);
        return Err(Status::resource_exhausted(format!(
            "{total} resource names subscribed over all xDS streams, over --max-subscriptions {max}; retry later"
        )));
    }
    Ok(())
}

/// A request over a byte limit ends its stream.
fn refused(core: &Core, refusal: &Option<Refusal>) -> Result<(), Status> {
    match refusal {
        Some(r) => {
            core.callbacks.limit_hit(r.limit);
            Err(Status::resource_exhausted(r.message.clone()))
        }
        None => Ok(()),
    }
}

/// One state-of-the-world request; `Err(status)` ends the stream.
fn handle_sotw(core: &Core, shared: &StreamShared, req: &RequestView) -> Result<Handled, Status> {
    let max = core.limits.max_resource_names;
    if req.resource_names.len() > max {
        core.callbacks.limit_hit(limit::MAX_RESOURCE_NAMES);
        return Err(Status::resource_exhausted(format!(
            "{} resource names in one request, over --max-resource-names {max}",
            req.resource_names.len()
        )));
    }
    identify(core, shared, &req.node);
    let snap = core.snapshots.borrow().clone();
    let (h, subscribed) = {
        let mut state = shared.state();
        let h = match &mut *state {
            StreamState::Sotw(s) => s.on_request(req, &snap, Instant::now()),
            StreamState::Delta(_) => return Err(Status::internal("not a delta stream")),
        };
        (h, state.subscribed())
    };
    refused(core, &h.refused)?;
    count_subscriptions(core, shared, subscribed)?;
    Ok(h)
}

/// One delta request; `Err(status)` ends the stream.
fn handle_delta(
    core: &Core,
    shared: &StreamShared,
    req: &DeltaRequestView,
) -> Result<Handled, Status> {
    let max = core.limits.max_resource_names;
    let asked = req.resource_names_subscribe.len() + req.resource_names_unsubscribe.len();
    if asked > max {
        core.callbacks.limit_hit(limit::MAX_RESOURCE_NAMES);
        return Err(Status::resource_exhausted(format!(
            "{asked} resource names in one request, over --max-resource-names {max}"
        )));
    }
    identify(core, shared, &req.node);
    let snap = core.snapshots.borrow().clone();
    // Read and sorted before the lock that the fan-out takes.
    let read = DeltaStream::read_names(&core.names, &core.retained, req, &snap);
    let (h, subscribed) = {
        let mut state = shared.state();
        let h = match &mut *state {
            StreamState::Delta(s) => s.on_read(req, read, &snap, Instant::now()),
            StreamState::Sotw(_) => {
                return Err(Status::internal("not a state-of-the-world stream"))
            }
        };
        (h, state.subscribed())
    };
    refused(core, &h.refused)?;
    if subscribed > max {
        core.callbacks.limit_hit(limit::MAX_RESOURCE_NAMES);
        return Err(Status::resource_exhausted(format!(
            "{subscribed} resource names subscribed on one stream, over --max-resource-names {max}"
        )));
    }
    count_subscriptions(core, shared, subscribed)?;
    Ok(h)
}

/// Reports a handled request (metrics, status page, logs) and wakes the
/// body when a response is due.
fn report(core: &Core, shared: &StreamShared, h: &Handled, other_types: &mut BTreeSet<String>) {
    let node = shared.node();
    match &h.kind {
        RequestKind::Initial => {
            if let Some(left_out) = OPEN_LOG.allow() {
                tracing::info!(node = %node, api = shared.api, left_out, "xDS subscription");
            }
        }
        RequestKind::Ack { version } => {
            core.callbacks
                .acked(&node, &shared.peer, version, h.ack_after);
            if !h.applied.is_empty() {
                core.callbacks.programmed(&node, &h.applied);
            }
            tracing::debug!(node = %node, version = %version, "xDS ACK");
        }
        RequestKind::Nack { version, message } => {
            core.callbacks.nacked(&node, &shared.peer, version, message);
            if let Some(left_out) = NACK_LOG.allow() {
                let message: String = message.chars().take(1024).collect();
                tracing::warn!(node = %node, peer = %shared.peer, version = %version, error = %message, left_out, "xDS NACK: Envoy rejected an assignment");
            }
        }
        RequestKind::Repeated { version } => {
            tracing::debug!(node = %node, version = %version, "xDS request repeats its last ACK: Envoy re-added a watch (a cluster CDS updated)");
        }
        RequestKind::Stale => {
            tracing::debug!(node = %node, "xDS request with a stale nonce")
        }
        RequestKind::OtherType(t) => {
            if other_types.len() < OTHER_TYPES_MAX && other_types.insert(t.clone()) {
                if let Some(left_out) = OTHER_TYPE_LOG.allow() {
                    let t: String = t.chars().take(256).collect();
                    tracing::warn!(node = %node, type_url = %t, left_out, "xDS type not served by this companion (only ClusterLoadAssignment): ignored");
                }
            }
        }
    }
    if h.resent > 0 {
        tracing::debug!(node = %node, resources = h.resent, "every subscribed assignment sent again (a watch re-added)");
    }
    if h.unknown > 0 {
        core.callbacks.unknown_names(h.unknown);
        if h.names_changed && !h.unknown_sample.is_empty() {
            if let Some(left_out) = UNKNOWN_LOG.allow() {
                let sample: Vec<String> = h
                    .unknown_sample
                    .iter()
                    .map(|n| n.chars().take(128).collect())
                    .collect();
                tracing::warn!(node = %node, unknown = h.unknown, sample = ?sample, left_out, "Envoy asks for EDS resources that are not served (no --cluster defines them, or their Service has no slices): not answered until they are");
            }
        }
    }
    if h.due {
        shared.wake.wake();
    }
}

/// The response taken and not fully handed to HTTP/2 yet.
struct InFlight {
    bytes: usize,
}

/// A stream's responses. HTTP/2 polls it only when the stream and the
/// connection have window: only then is a response taken from the state,
/// from the newest snapshot.
struct ResponseBody {
    core: Arc<Core>,
    shared: Arc<StreamShared>,
    chunks: VecDeque<Bytes>,
    in_flight: Option<InFlight>,
    finished: bool,
    /// The stream's share of the response work.
    budget: ByteBudget,
    /// The wait for it, while the stream is in debt.
    held: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ResponseBody {
    /// Whether the stream's next response waits for its share of the
    /// response work; the body is woken when the wait is over.
    fn is_held(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if let Some(sleep) = &mut self.held {
                if sleep.as_mut().poll(cx).is_pending() {
                    return true;
                }
                self.held = None;
            }
            let now = tokio::time::Instant::now();
            let Some(wait) = self.budget.wait(now.into_std()) else {
                return false;
            };
            // Held only when a response is due: a stream with nothing to
            // send costs nothing, and its next change is timed from then.
            if self.shared.state().due_since().is_none() {
                return false;
            }
            let node = self.shared.node();
            self.core.callbacks.send_held(&node, wait);
            if let Some(left_out) = HELD_LOG.allow() {
                tracing::info!(node = %node, peer = %self.shared.peer, wait_ms = wait.as_millis() as u64, rate = self.core.limits.max_stream_send_rate, left_out, "xDS stream over its --max-stream-send-rate: its next response waits (changes coalesce meanwhile)");
            }
            self.shared.set_held_until(now.into_std() + wait);
            self.held = Some(Box::pin(tokio::time::sleep_until(now + wait)));
        }
    }

    fn take(&mut self) -> Option<()> {
        let snap = self.core.snapshots.borrow().clone();
        let now = Instant::now();
        let Taken {
            response,
            oversized,
        } = self
            .shared
            .state()
            .take(&snap, self.core.limits.max_response_bytes, now);
        for (name, bytes) in oversized {
            self.core.callbacks.limit_hit(limit::MAX_RESPONSE_BYTES);
            if let Some(left_out) = OVERSIZED_LOG.allow() {
                tracing::error!(cluster = %name, bytes, max = self.core.limits.max_response_bytes, left_out, "assignment over --max-response-bytes: not sent");
            }
        }
        let p = response?;
        self.core.callbacks.response_started(p.resources, &p.lags);
        tracing::debug!(node = %self.shared.node(), version = %p.version, nonce = p.nonce, resources = p.resources, bytes = p.wire_len, "xDS response taken");
        self.budget
            .spend(p.wire_len, tokio::time::Instant::now().into_std());
        self.in_flight = Some(InFlight { bytes: p.wire_len });
        self.shared.set_sending_since(Some(now));
        self.chunks.push_back(p.head);
        for mut e in p.entries {
            while e.len() > CHUNK {
                self.chunks.push_back(e.split_to(CHUNK));
            }
            self.chunks.push_back(e);
        }
        self.chunks.push_back(p.tail);
        Some(())
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.chunks.pop_front() {
                if this.chunks.is_empty() {
                    if let Some(f) = this.in_flight.take() {
                        this.core.callbacks.response_sent(f.bytes);
                        this.shared.set_sending_since(None);
                    }
                }
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            this.shared.wake.register(cx.waker());
            let end = this
                .shared
                .end
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(status) = end {
                this.finished = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
            }
            if this.is_held(cx) || this.take().is_none() {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        let core = &self.core;
        core.streams.map().remove(&self.shared.id);
        core.streams.open.fetch_sub(1, Ordering::SeqCst);
        let counted = self.shared.counted.swap(0, Ordering::SeqCst);
        core.subscriptions.fetch_sub(counted, Ordering::SeqCst);
        if let Some(c) = &self.shared.conn {
            c.streams.fetch_sub(1, Ordering::SeqCst);
            if let Some(share) = c.share() {
                share.streams.fetch_sub(1, Ordering::SeqCst);
            }
        }
        core.callbacks.stream_closed(&self.shared.node());
        self.shared.closed.notify_one();
        if let Some(left_out) = OPEN_LOG.allow() {
            tracing::info!(api = self.shared.api, node = %self.shared.node(), peer = %self.shared.peer, left_out, "xDS stream closed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::eds::assignment::CLA_TYPE_URL;
    use crate::eds::publish::{Resource, Table};
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    };
    use std::time::SystemTime;
    use tokio::sync::mpsc;

    /// What the server reported, for the tests.
    #[derive(Default)]
    struct Recorder {
        events: Mutex<Vec<String>>,
    }

    impl Recorder {
        fn push(&self, e: String) {
            self.events.lock().unwrap().push(e);
        }
        fn has(&self, prefix: &str) -> bool {
            self.events
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.starts_with(prefix))
        }
    }

    impl Callbacks for Recorder {
        fn limit_set(&self, _: &'static str, _: i64) {}
        fn limit_hit(&self, limit: &'static str) {
            self.push(format!("limit_hit {limit}"));
        }
        fn stream_refused(&self, limit: &'static str) {
            self.push(format!("refused {limit}"));
        }
        fn stream_opened(&self) {
            self.push("opened".into());
        }
        fn stream_identified(&self, node: &str, _: &str) {
            self.push(format!("identified {node}"));
        }
        fn stream_closed(&self, _: &str) {
            self.push("closed".into());
        }
        fn request_received(&self, _: usize) {}
        fn request_buffer_bytes(&self, _: usize) {}
        fn unknown_names(&self, n: usize) {
            self.push(format!("unknown {n}"));
        }
        fn response_started(&self, resources: usize, _: &[Duration]) {
            self.push(format!("started {resources}"));
        }
        fn response_sent(&self, _: usize) {}
        fn acked(&self, node: &str, _: &str, _: &str, _: Option<Duration>) {
            self.push(format!("acked {node}"));
        }
        fn nacked(&self, _: &str, _: &str, _: &str, _: &str) {}
        fn programmed(&self, _: &str, triggers: &[SystemTime]) {
            self.push(format!("programmed {}", triggers.len()));
        }
        fn subscriptions(&self, _: usize) {}
        fn coalesced(&self) {}
        fn oldest_unsent(&self, _: Duration) {}
        fn subscribers(&self, _: &str, _: i64) {}
        fn stream_reset(&self, _: &'static str) {}
        fn send_held(&self, node: &str, _: Duration) {
            self.push(format!("held {node}"));
        }
        fn request_held(&self, node: &str, _: Duration) {
            self.push(format!("request_held {node}"));
        }
    }

    fn snapshot(table: &Arc<Table>, seq: u64, names: &[(&str, u64)]) -> Arc<Snapshot> {
        let rs: Vec<Arc<Resource>> = names
            .iter()
            .map(|(n, v)| {
                Arc::new(Resource::new(
                    n,
                    *v,
                    format!("{n}@{v}").as_bytes(),
                    1,
                    Instant::now(),
                ))
            })
            .collect();
        table.put(&rs, &[]);
        Arc::new(Snapshot {
            version: format!("v{seq}"),
            ready: true,
            table: table.clone(),
            seq,
            after: seq - 1,
            changed: Arc::from(rs.iter().map(|r| r.hash).collect::<Vec<_>>()),
        })
    }

    struct Client {
        tx: mpsc::Sender<Result<Frame<Bytes>, Status>>,
        body: Body,
        buf: BytesMut,
        /// A trailers-only answer's status.
        status: Option<String>,
    }

    impl Client {
        async fn send(&self, msg: &impl Message) {
            let mut b = BytesMut::new();
            b.extend_from_slice(&[0]);
            b.extend_from_slice(&(msg.encoded_len() as u32).to_be_bytes());
            msg.encode(&mut b).unwrap();
            self.tx.send(Ok(Frame::data(b.freeze()))).await.unwrap();
        }

        /// The next message, or the trailers' grpc-status when the stream ends.
        async fn next(&mut self) -> Result<Bytes, String> {
            if let Some(s) = self.status.take() {
                return Err(s);
            }
            loop {
                if let Some(m) = requests::next_message(&mut self.buf, usize::MAX).unwrap() {
                    return Ok(m);
                }
                let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                    .await
                    .expect("a frame within 5 s")
                    .expect("the stream goes on")
                    .unwrap();
                match frame.into_data() {
                    Ok(d) => self.buf.extend_from_slice(&d),
                    Err(f) => {
                        let t = f.into_trailers().unwrap();
                        return Err(format!(
                            "{} {}",
                            t.get("grpc-status").unwrap().to_str().unwrap(),
                            t.get("grpc-message")
                                .map(|m| m.to_str().unwrap().to_string())
                                .unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }

    async fn open(server: &XdsServer, path: &str) -> Client {
        let (tx, rx) = mpsc::channel(8);
        let body = Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let req = http::Request::builder()
            .uri(format!("http://xds{path}"))
            .body(body)
            .unwrap();
        let (svc, m) = path.trim_start_matches('/').split_once('/').unwrap();
        let resp = if svc == ADS {
            ads(&server.core, req)
        } else {
            eds(&server.core, req)
        };
        let _ = m;
        let resp = resp.await.unwrap();
        let status = resp.headers().get("grpc-status").map(|code| {
            format!(
                "{} {}",
                code.to_str().unwrap(),
                resp.headers()
                    .get("grpc-message")
                    .map(|m| m.to_str().unwrap().to_string())
                    .unwrap_or_default()
            )
        });
        Client {
            tx,
            body: resp.into_body(),
            buf: BytesMut::new(),
            status,
        }
    }

    fn server(
        limits: XdsLimits,
    ) -> (
        XdsServer,
        watch::Sender<Arc<Snapshot>>,
        Arc<Recorder>,
        Arc<Table>,
    ) {
        let table = Arc::new(Table::default());
        let (tx, rx) = watch::channel(snapshot(&table, 1, &[("a", 1), ("b", 2)]));
        let rec = Arc::new(Recorder::default());
        let s = XdsServer::new(rx, Names::new(["a", "b"]), limits, rec.clone(), None);
        (s, tx, rec, table)
    }

    fn sotw(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(Node {
                id: "envoy-1".into(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: CLA_TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_state_of_the_world_stream_subscribes_is_answered_and_acks_a_change() {
        let (s, tx, rec, table) = server(XdsLimits::default());
        tokio::spawn(s.clone().run_fanout());
        let mut c = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        c.send(&sotw(&["a", "b"], "")).await;
        let r = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r.resources.len(), 2);
        assert!(rec.has("identified envoy-1"));
        c.send(&sotw(&["a", "b"], &r.nonce)).await;
        // A change to b: b alone, and its ACK times it.
        tx.send_replace(snapshot(&table, 2, &[("b", 7)]));
        let r2 = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r2.resources.len(), 1);
        assert_eq!(r2.resources[0].value, b"b@7");
        c.send(&sotw(&["a", "b"], &r2.nonce)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rec.has("programmed 1"));
        assert_eq!(s.subscriptions(), 2);
    }

    #[tokio::test]
    async fn a_repeated_ack_gets_every_assignment_under_a_new_nonce() {
        let (s, _tx, rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        c.send(&sotw(&["a", "b"], "")).await;
        let r = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        let mut ack = sotw(&["a", "b"], &r.nonce);
        ack.version_info = r.version_info.clone();
        c.send(&ack).await;
        // Envoy re-created a cluster: its last ACK again.
        c.send(&ack).await;
        let r2 = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r2.resources.len(), 2);
        assert_ne!(r2.nonce, r.nonce);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let acks = rec
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.starts_with("acked"))
            .count();
        assert_eq!(acks, 1, "the repeat is not counted as an ACK");
    }

    #[tokio::test]
    async fn a_delta_stream_gets_removed_for_names_not_served() {
        let (s, _tx, rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        c.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "nope".into()],
            ..Default::default()
        })
        .await;
        let r = DeltaDiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].name, "a");
        assert_eq!(r.removed_resources, ["nope"]);
        assert!(rec.has("unknown 1"));
        // A plain EDS delta stream too.
        let mut e = open(&s, &format!("/{EDS}/DeltaEndpoints")).await;
        e.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["b".into()],
            ..Default::default()
        })
        .await;
        let r = DeltaDiscoveryResponse::decode(e.next().await.unwrap()).unwrap();
        assert_eq!(r.resources[0].name, "b");
    }

    #[tokio::test]
    async fn limits_end_streams_with_resource_exhausted_naming_the_flag() {
        let limits = XdsLimits {
            max_resource_names: 1,
            max_streams: 1,
            ..XdsLimits::default()
        };
        let (s, _tx, rec, _table) = server(limits);
        let mut c = open(&s, &format!("/{EDS}/StreamEndpoints")).await;
        // A second stream is over --max-streams.
        let mut refused = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        let status = refused.next().await.unwrap_err();
        assert!(
            status.starts_with("8 ") && status.contains("max-streams"),
            "{status}"
        );
        c.send(&sotw(&["a", "b"], "")).await;
        let status = c.next().await.unwrap_err();
        assert!(
            status.starts_with("8 ") && status.contains("--max-resource-names"),
            "{status}"
        );
        assert!(rec.has("limit_hit max-resource-names"));
        assert!(rec.has("refused max-streams"));
    }

    /// The unary FetchEndpoints holds nothing: it is answered UNIMPLEMENTED
    /// before its request is read, however large it announces itself.
    #[tokio::test]
    async fn fetch_endpoints_is_unimplemented_and_reads_nothing() {
        let (s, _tx, rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{EDS}/FetchEndpoints")).await;
        let status = c.next().await.unwrap_err();
        assert!(
            status.starts_with("12 ") && status.contains("StreamEndpoints"),
            "{status}"
        );
        assert_eq!(
            s.core.request_budget.available_permits(),
            XdsLimits::default().request_buffer_bytes
        );
        assert_eq!(s.streams(), 0);
        assert!(!rec.has("opened"));
    }

    /// A stream whose first request does not come in time ends with
    /// DEADLINE_EXCEEDED naming the flag; so does one whose message, begun,
    /// is not complete in time.
    #[tokio::test]
    async fn deadlines_end_streams_that_do_not_send_their_requests() {
        let limits = XdsLimits {
            first_request_timeout: Duration::from_millis(200),
            request_receive_timeout: Duration::from_millis(200),
            ..XdsLimits::default()
        };
        let (s, _tx, rec, _table) = server(limits);
        let mut idle = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        let status = idle.next().await.unwrap_err();
        assert!(
            status.starts_with("4 ") && status.contains("--first-request-timeout"),
            "{status}"
        );
        let mut half = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        half.send(&sotw(&["a"], "")).await;
        DiscoveryResponse::decode(half.next().await.unwrap()).unwrap();
        let mut head = BytesMut::new();
        head.extend_from_slice(&[0, 0, 0, 1, 0]);
        head.extend_from_slice(&[0x0a; 100]);
        half.tx.send(Ok(Frame::data(head.freeze()))).await.unwrap();
        let status = half.next().await.unwrap_err();
        assert!(
            status.starts_with("4 ") && status.contains("--request-receive-timeout"),
            "{status}"
        );
        assert!(rec.has("limit_hit first-request-timeout"));
        assert!(rec.has("limit_hit request-receive-timeout"));
    }

    /// A client that keeps asking for responses spends its stream's send
    /// budget and waits on itself: another stream's push goes at once,
    /// and the held stream then gets the newest state in one response.
    #[tokio::test]
    async fn a_churning_stream_waits_for_its_send_budget_and_another_stream_does_not() {
        let limits = XdsLimits {
            max_stream_send_rate: 200,
            max_stream_send_burst: 1000,
            ..XdsLimits::default()
        };
        let (s, tx, rec, table) = server(limits);
        tokio::spawn(s.clone().run_fanout());
        let mut quiet = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        quiet.send(&sotw(&["a"], "")).await;
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        quiet.send(&sotw(&["a"], &r.nonce)).await;
        let mut churner = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        let churn = |nonce: String| DeltaDiscoveryRequest {
            node: Some(Node {
                id: "churner".into(),
                ..Default::default()
            }),
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "b".into()],
            response_nonce: nonce,
            ..Default::default()
        };
        // Subscribing again and again: every request is answered in full,
        // until the burst is spent and a response waits.
        let mut nonce = String::new();
        let mut answered = 0;
        while !rec.has("held churner") {
            assert!(
                answered < 20,
                "1,000 bytes of burst spent within 20 responses"
            );
            churner.send(&churn(nonce)).await;
            let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
            assert_eq!(r.resources.len(), 2, "a response waits, it is never cut");
            nonce = r.nonce;
            answered += 1;
        }
        assert!(answered > 1, "the burst goes at once");
        // In debt again after the response it waited for: its ACK, then a
        // change to a.
        churner
            .send(&DeltaDiscoveryRequest {
                type_url: CLA_TYPE_URL.into(),
                response_nonce: nonce,
                ..Default::default()
            })
            .await;
        tx.send_replace(snapshot(&table, 2, &[("a", 2)]));
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        assert_eq!(r.resources[0].value, b"a@2", "the quiet stream's push");
        assert!(!rec.has("held envoy-1"), "the quiet stream never waits");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), churner.next())
                .await
                .is_err(),
            "the churner waits for its budget"
        );
        // Changes coalesce while it waits: it gets the newest, once.
        tx.send_replace(snapshot(&table, 3, &[("a", 3)]));
        let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].name, "a");
        assert_eq!(
            r.resources[0].resource.as_ref().unwrap().value,
            b"a@3".to_vec()
        );
        // Its wait is not a stream that does not read.
        assert!(!rec.has("limit_hit send-timeout"));
        assert!(s.streams() == 2);
    }

    /// A client whose requests change more names than its share is not
    /// read for a while (only its own requests and ACKs wait); another
    /// stream's push and ACK go on meanwhile.
    #[tokio::test]
    async fn a_stream_whose_requests_change_too_many_names_waits_and_another_does_not() {
        let limits = XdsLimits {
            max_stream_request_rate: 1000,
            max_stream_request_burst: 100,
            ..XdsLimits::default()
        };
        let (s, tx, rec, table) = server(limits);
        tokio::spawn(s.clone().run_fanout());
        let mut quiet = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        quiet.send(&sotw(&["a"], "")).await;
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        quiet.send(&sotw(&["a"], &r.nonce)).await;
        let mut churner = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        // 10 names of 50 bytes and "a": 529 bytes of names (8 more each),
        // over the burst of 100: the next request waits ~0.4 s.
        let mut names: Vec<String> = (0..10).map(|i| format!("{i:050}")).collect();
        names.push("a".into());
        churner
            .send(&DeltaDiscoveryRequest {
                node: Some(Node {
                    id: "churner".into(),
                    ..Default::default()
                }),
                type_url: CLA_TYPE_URL.into(),
                resource_names_subscribe: names,
                ..Default::default()
            })
            .await;
        let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
        assert_eq!(r.removed_resources.len(), 10, "answered at once");
        // Its ACK, subscribing b too: not read until the debt is paid.
        churner
            .send(&DeltaDiscoveryRequest {
                type_url: CLA_TYPE_URL.into(),
                resource_names_subscribe: vec!["b".into()],
                response_nonce: r.nonce,
                ..Default::default()
            })
            .await;
        tx.send_replace(snapshot(&table, 2, &[("a", 2)]));
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        assert_eq!(r.resources[0].value, b"a@2", "the quiet stream's push");
        quiet.send(&sotw(&["a"], &r.nonce)).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(150), churner.next())
                .await
                .is_err(),
            "the churner's ACK is not read yet: nothing more is sent to it"
        );
        assert!(rec.has("request_held churner"));
        assert!(rec.has("programmed 1"), "the quiet stream's ACK was read");
        assert!(!rec.has("request_held envoy-1"));
        // Then its request is read: a's change and b, in one response.
        let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
        let mut got: Vec<_> = r.resources.iter().map(|x| x.name.as_str()).collect();
        got.sort_unstable();
        assert_eq!(got, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_delta_stream_over_a_byte_limit_ends_and_gives_its_bytes_back() {
        let limits = XdsLimits {
            max_name_bytes: 16,
            ..XdsLimits::default()
        };
        let (s, _tx, rec, _table) = server(limits);
        let mut c = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        c.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "nope".into()],
            ..Default::default()
        })
        .await;
        let r = DeltaDiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r.removed_resources, ["nope"]);
        assert!(s.core.retained.total() > 0);
        c.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["n".repeat(17)],
            response_nonce: r.nonce,
            ..Default::default()
        })
        .await;
        let status = c.next().await.unwrap_err();
        assert!(
            status.starts_with("8 ") && status.contains("--max-name-bytes"),
            "{status}"
        );
        assert!(rec.has("limit_hit max-name-bytes"));
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.core.retained.total(),
            0,
            "the ended stream's bytes are back"
        );
    }

    #[tokio::test]
    async fn unknown_methods_are_unimplemented() {
        let (s, _tx, _rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{ADS}/NoSuchMethod")).await;
        let status = c.next().await.unwrap_err();
        assert!(status.starts_with("12 "), "{status}");
    }
}
