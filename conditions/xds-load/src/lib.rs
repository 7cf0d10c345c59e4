//! Many xDS clients at once, over HTTP/2 (the `h2` crate), for the
//! companion's tests and benchmarks.
//!
//! - [`subscribe`]: a stream that subscribes and ACKs every response as
//!   Envoy does (the response's version_info and nonce, the same names, the
//!   node on every request), recording when each version arrived.
//! - [`stuck`]: a stream that never reads: a stream window of 0 (nothing
//!   can be sent to it), or a window that fills and is never released (a
//!   client that stops reading). Its connection still answers PINGs.
//! - [`probe`]: the companion read from outside (metrics port, /proc).
//! - [`apiserver`]: a Kubernetes API server double serving EndpointSlices
//!   (paged lists, watches with bookmarks, 410 Gone on demand).
//! - [`cluster`]: a cluster's slices at Kubernetes' limits, and their churn.
//!
//! Responses are read as Envoy's first look at them: version, nonce, type
//! and the resources' bytes, not decoded further (the client's CPU is the
//! server's competition on a small machine).
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
// Test machinery that ships nowhere: each file's `//!` says its job; its
// items are read beside the tests that call them (CONTRIBUTING.md, lints).
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The byte buffers the calls send (for callers without a `bytes` dependency).
pub use bytes::Bytes as Frame;
use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message;
use tokio::net::TcpStream;

pub mod apiserver;
pub mod cluster;
pub mod probe;
pub mod scale;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Type URL of the EDS resource.
pub const CLA_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Envoy's default HTTP/2 stream and connection windows (256 MiB).
pub const ENVOY_WINDOW: u32 = 256 << 20;

/// Which service a stream uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `StreamAggregatedResources`.
    Ads,
    /// `StreamEndpoints`.
    Eds,
    /// `DeltaAggregatedResources` (incremental).
    DeltaAds,
}

impl Api {
    fn path(self) -> &'static str {
        match self {
            Api::Ads => {
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
            }
            Api::Eds => "/envoy.service.endpoint.v3.EndpointDiscoveryService/StreamEndpoints",
            Api::DeltaAds => {
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
            }
        }
    }
}

/// What a stream asks for.
#[derive(Clone, Debug)]
pub struct Subscription {
    pub api: Api,
    pub node_id: String,
    pub names: Vec<String>,
    /// The node on the first request only (Envoy's
    /// `set_node_on_first_message_only`); else on every request, Envoy's default.
    pub node_on_first_only: bool,
    names_encoded: Arc<std::sync::OnceLock<Bytes>>,
}

impl Subscription {
    pub fn ads(node_id: impl Into<String>, names: &[&str]) -> Subscription {
        Subscription {
            api: Api::Ads,
            node_id: node_id.into(),
            names: names.iter().map(|n| n.to_string()).collect(),
            node_on_first_only: false,
            names_encoded: Arc::default(),
        }
    }

    /// The same over delta xDS.
    pub fn delta_ads(node_id: impl Into<String>, names: &[&str]) -> Subscription {
        Subscription {
            api: Api::DeltaAds,
            ..Subscription::ads(node_id, names)
        }
    }

    /// A request as Envoy sends it (its node every time), gRPC-framed.
    /// The node's bytes are encoded once per process ([`shared_node`]).
    /// Delta: the first subscribes every name, with the node; the others
    /// ACK `nonce`.
    pub fn request_frame(&self, version: &str, nonce: &str) -> Bytes {
        if self.api == Api::DeltaAds {
            let first = nonce.is_empty();
            return grpc_frame(
                &envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
                    node: first.then(|| envoy_like_node(&self.node_id)),
                    type_url: CLA_TYPE_URL.into(),
                    resource_names_subscribe: if first { self.names.clone() } else { vec![] },
                    response_nonce: nonce.into(),
                    ..Default::default()
                },
            );
        }
        let mut out = BytesMut::new();
        for part in self.request_parts(version, nonce) {
            out.extend_from_slice(&part);
        }
        out.freeze()
    }

    /// A state-of-the-world request in parts that share the node's and the
    /// names' bytes (encoded once), so that an ACK naming 10,000 clusters
    /// costs the client no encoding: gRPC header, fields.
    pub fn request_parts(&self, version: &str, nonce: &str) -> Vec<Bytes> {
        let names = self.names_field();
        let rest = DiscoveryRequest {
            version_info: version.into(),
            type_url: CLA_TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
        .encode_to_vec();
        let with_node = !self.node_on_first_only || nonce.is_empty();
        let mut node_part = BytesMut::new();
        if with_node {
            let id_field = Node {
                id: self.node_id.clone(),
                ..Default::default()
            }
            .encode_to_vec();
            let node = shared_node();
            let node_len = id_field.len() + node.len();
            prost::encoding::encode_key(
                2,
                prost::encoding::WireType::LengthDelimited,
                &mut node_part,
            );
            prost::encoding::encode_varint(node_len as u64, &mut node_part);
            node_part.extend_from_slice(&id_field);
            let len = rest.len() + node_part.len() + node.len() + names.len();
            let mut head = BytesMut::with_capacity(5);
            head.extend_from_slice(&[0]);
            head.extend_from_slice(&(len as u32).to_be_bytes());
            return vec![
                head.freeze(),
                node_part.freeze(),
                node.clone(),
                names,
                Bytes::from(rest),
            ];
        }
        let len = rest.len() + names.len();
        let mut head = BytesMut::with_capacity(5);
        head.extend_from_slice(&[0]);
        head.extend_from_slice(&(len as u32).to_be_bytes());
        vec![head.freeze(), names, Bytes::from(rest)]
    }

    /// The `resource_names` fields, encoded once.
    fn names_field(&self) -> Bytes {
        self.names_encoded
            .get_or_init(|| {
                let mut b = BytesMut::new();
                for n in &self.names {
                    prost::encoding::string::encode(3, n, &mut b);
                }
                b.freeze()
            })
            .clone()
    }
}

/// A node the shape and size of Envoy 1.40's (its `/server_info`): 516
/// extensions, each a name (~33 bytes), a category (~24) and most a type
/// URL (~64); about 60 KB encoded. Envoy sends it on every request.
pub fn envoy_like_node(id: &str) -> Node {
    let extensions = (0..516)
        .map(|i| Extension {
            name: format!("envoy.filters.synthetic.ext-{i:05}"),
            category: format!("envoy.filters.category-{:02}", i % 60),
            type_urls: if i % 6 == 5 {
                vec![]
            } else {
                vec![format!(
                    "envoy.extensions.filters.synthetic.v3.Extension{i:05}Config"
                )]
            },
            ..Default::default()
        })
        .collect();
    Node {
        id: id.into(),
        cluster: "xds-load".into(),
        user_agent_name: "envoy".into(),
        extensions,
        ..Default::default()
    }
}

/// [`envoy_like_node`] without its id, encoded once.
fn shared_node() -> &'static Bytes {
    static NODE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    NODE.get_or_init(|| Bytes::from(envoy_like_node("").encode_to_vec()))
}

/// A message as gRPC frames it (uncompressed).
pub fn grpc_frame(msg: &impl Message) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.extend_from_slice(&[0]);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(&mut buf).ok();
    buf.freeze()
}

/// Sends `data` as the stream's send window allows; false when the
/// stream is gone.
pub async fn send_flowed(send: &mut h2::SendStream<Bytes>, mut data: Bytes) -> bool {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let got = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) => n,
            _ => return false,
        };
        let n = got.min(data.len());
        if n > 0 && send.send_data(data.split_to(n), false).is_err() {
            return false;
        }
    }
    true
}

/// The fields of a DiscoveryResponse an ACK needs (the resources kept as bytes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHead {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// The fields of a DeltaDiscoveryResponse an ACK needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResponseHead {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

/// The number a companion version ends with (`<boot>-<n>`).
pub fn version_number(version: &str) -> u64 {
    version
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// What one subscriber received (read while it runs).
#[derive(Debug, Default)]
pub struct Received {
    pub responses: AtomicU64,
    pub bytes: AtomicU64,
    /// Resources received over all responses.
    pub resources: AtomicU64,
    /// [`version_number`] of the newest version received.
    pub version: AtomicU64,
    /// When it arrived, in nanoseconds since the fleet's epoch.
    pub at_nanos: AtomicU64,
    /// How the stream ended (gRPC status or error), once it has.
    pub ended: Mutex<Option<String>>,
}

impl Received {
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// An HTTP/2 connection, its driver task spawned (it answers PINGs), and
/// whether it has closed.
pub struct Connection {
    pub client: h2::client::SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

impl Connection {
    /// Connects; `stream_window`: the initial stream window (0: nothing can
    /// be sent to a stream until it is released; `None`: HTTP/2's 64 KiB).
    pub async fn open(addr: SocketAddr, stream_window: Option<u32>) -> Result<Connection, Error> {
        Connection::open_with(addr, stream_window, None, None).await
    }

    /// Connects from `local` (a loopback address other than 127.0.0.1 is
    /// another peer to the server), as [`Connection::open`].
    pub async fn open_from(
        local: std::net::IpAddr,
        addr: SocketAddr,
        stream_window: Option<u32>,
    ) -> Result<Connection, Error> {
        Connection::open_with(addr, stream_window, None, Some(local)).await
    }

    /// Connects with Envoy's HTTP/2 windows (its default
    /// `initial_stream_window_size` and `initial_connection_window_size`,
    /// 256 MiB): the server is never held up by a window it has to wait on.
    pub async fn open_like_envoy(addr: SocketAddr) -> Result<Connection, Error> {
        Connection::open_with(addr, Some(ENVOY_WINDOW), Some(ENVOY_WINDOW), None).await
    }

    async fn open_with(
        addr: SocketAddr,
        stream_window: Option<u32>,
        connection_window: Option<u32>,
        local: Option<std::net::IpAddr>,
    ) -> Result<Connection, Error> {
        let tcp = match local {
            Some(ip) => connect_from(ip, addr).await?,
            None => TcpStream::connect(addr).await?,
        };
        tcp.set_nodelay(true)?;
        let mut b = h2::client::Builder::new();
        if let Some(w) = stream_window {
            b.initial_window_size(w);
        }
        if let Some(w) = connection_window {
            b.initial_connection_window_size(w);
        }
        let (client, conn) = b.handshake::<_, Bytes>(tcp).await?;
        let closed = Arc::new(AtomicBool::new(false));
        let c = closed.clone();
        tokio::spawn(async move {
            let _ = conn.await;
            c.store(true, Ordering::SeqCst);
        });
        Ok(Connection { client, closed })
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Opens a stream of `sub.api` and sends its first request.
    pub async fn stream(
        &self,
        sub: &Subscription,
    ) -> Result<(h2::SendStream<Bytes>, h2::client::ResponseFuture), Error> {
        let mut client = self.client.clone().ready().await?;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://xds{}", sub.api.path()))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let (resp, mut send) = client.send_request(req, false)?;
        send.send_data(sub.request_frame("", ""), false)?;
        Ok((send, resp))
    }

    /// A gRPC call to `path` (`/package.Service/Method`): its HEADERS sent,
    /// its halves returned for the caller to send what it likes.
    pub async fn raw_call(
        &self,
        path: &str,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), Error> {
        let mut client = self.client.clone().ready().await?;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://xds{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        Ok(client.send_request(req, false)?)
    }

    /// A gRPC call to `path` (`/package.Service/Method`) that sends HEADERS
    /// and `body` (nothing, or a message cut short) and never ends: `Ok`
    /// with the stream's halves, held open until dropped, when the server
    /// answers with headers that are not a gRPC status; `Err` with the
    /// status (`grpc-status N: message`) when it refuses at once.
    pub async fn unfinished_call(&self, path: &str, body: Option<Bytes>) -> Result<Held, String> {
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://xds{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| e.to_string())?;
        let mut client = self
            .client
            .clone()
            .ready()
            .await
            .map_err(|e| e.to_string())?;
        let (resp, mut send) = client.send_request(req, false).map_err(|e| e.to_string())?;
        // The server may answer and close the stream before the body goes
        // out (a trailers-only refusal): h2 then refuses the send, and the
        // answer, already received, is still read below.
        let sent = match body {
            Some(b) => send.send_data(b, false).map_err(|e| e.to_string()),
            None => Ok(()),
        };
        let resp = resp.await.map_err(|e| match &sent {
            Ok(()) => e.to_string(),
            Err(s) => format!("{e} (sending the body: {s})"),
        })?;
        if let Some(status) = grpc_status(resp.headers()) {
            return Err(status);
        }
        Ok(Box::new((send, resp.into_body())))
    }

    /// A stream of `sub`'s API with its first request complete, then a
    /// message that announces `announced` bytes and sends `sent` of them:
    /// the stream, held open until dropped.
    pub async fn half_sent_request(
        &self,
        sub: &Subscription,
        announced: u32,
        sent: usize,
    ) -> Result<Held, Error> {
        let (mut send, resp) = self.stream(sub).await?;
        send.send_data(grpc_prefix(announced), false)?;
        send.send_data(Bytes::from(vec![0x0a; sent]), false)?;
        Ok(Box::new((send, resp)))
    }
}

/// Something kept open (a stream's halves) until dropped.
pub type Held = Box<dyn std::any::Any + Send>;

/// The 5-byte gRPC message prefix (not compressed) announcing `len` bytes.
pub fn grpc_prefix(len: u32) -> Bytes {
    let mut head = vec![0u8];
    head.extend_from_slice(&len.to_be_bytes());
    Bytes::from(head)
}

/// A TCP connection to `addr` from `local` (any port).
pub async fn connect_from(local: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if local.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(local, 0))?;
    socket.connect(addr).await
}

/// The gRPC status of a trailers-only answer, or of the trailers.
fn grpc_status(headers: &http::HeaderMap) -> Option<String> {
    let code = headers.get("grpc-status")?.to_str().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    Some(format!("grpc-status {code}: {message}"))
}

/// Runs one subscriber on `conn` until its stream ends: every response is
/// recorded in `received` and ACKed. Returns how it ended.
pub async fn subscribe(
    conn: &Connection,
    sub: &Subscription,
    received: &Received,
    epoch: Instant,
) -> String {
    let end = run_subscriber(conn, sub, received, epoch)
        .await
        .unwrap_or_else(|e| format!("error: {e}"));
    *received.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(end.clone());
    end
}

async fn run_subscriber(
    conn: &Connection,
    sub: &Subscription,
    received: &Received,
    epoch: Instant,
) -> Result<String, Error> {
    let (mut send, resp) = conn.stream(sub).await?;
    let resp = resp.await?;
    if let Some(status) = grpc_status(resp.headers()) {
        return Ok(status);
    }
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            buf.advance(5);
            let msg = buf.split_to(len).freeze();
            let (version, nonce, resources) = if sub.api == Api::DeltaAds {
                let head = DeltaResponseHead::decode(msg)?;
                (head.system_version_info, head.nonce, head.resources.len())
            } else {
                let head = ResponseHead::decode(msg)?;
                (head.version_info, head.nonce, head.resources.len())
            };
            let at = epoch.elapsed().as_nanos() as u64;
            received.responses.fetch_add(1, Ordering::SeqCst);
            received.bytes.fetch_add(5 + len as u64, Ordering::SeqCst);
            received
                .resources
                .fetch_add(resources as u64, Ordering::SeqCst);
            received.at_nanos.store(at, Ordering::SeqCst);
            received
                .version
                .fetch_max(version_number(&version), Ordering::SeqCst);
            if sub.api == Api::DeltaAds {
                send.send_data(sub.request_frame(&version, &nonce), false)?;
            } else {
                for part in sub.request_parts(&version, &nonce) {
                    send.send_data(part, false)?;
                }
            }
        }
    }
    Ok(match body.trailers().await? {
        Some(t) => grpc_status(&t).unwrap_or_else(|| "ended without grpc-status".into()),
        None => "ended without trailers".into(),
    })
}

/// How a stuck stream does not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stuck {
    /// A stream window of 0: the server cannot send it anything.
    ZeroWindow,
    /// A normal window that is never released: the client stops reading.
    StopsReading,
}

/// A stream that never reads, open until dropped (or closed by the server).
pub struct StuckStream {
    pub conn: Connection,
    _send: h2::SendStream<Bytes>,
    _body: Option<h2::RecvStream>,
}

impl StuckStream {
    /// Opens it and subscribes; it reads nothing after the response headers.
    pub async fn open(
        addr: SocketAddr,
        how: Stuck,
        sub: &Subscription,
    ) -> Result<StuckStream, Error> {
        let window = match how {
            Stuck::ZeroWindow => Some(0),
            Stuck::StopsReading => None,
        };
        let conn = Connection::open(addr, window).await?;
        let (send, resp) = conn.stream(sub).await?;
        let resp = resp.await?;
        if let Some(status) = grpc_status(resp.headers()) {
            return Err(status.into());
        }
        Ok(StuckStream {
            conn,
            _send: send,
            _body: Some(resp.into_body()),
        })
    }

    /// The server closed its connection (`--send-timeout`).
    pub fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }
}

/// `n` stuck streams subscribed to `names`, of each kind in turn (node ids
/// `stuck-<i>`), opened one after the other: the ones opened, and the error
/// that stopped the opening, if one did.
pub async fn open_stuck(
    addr: SocketAddr,
    n: usize,
    names: &[&str],
) -> (Vec<StuckStream>, Option<Error>) {
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let how = if i % 2 == 0 {
            Stuck::ZeroWindow
        } else {
            Stuck::StopsReading
        };
        match StuckStream::open(addr, how, &Subscription::ads(format!("stuck-{i}"), names)).await {
            Ok(s) => streams.push(s),
            Err(e) => return (streams, Some(e)),
        }
    }
    (streams, None)
}

/// Raises this process's open-file limit to its hard limit (thousands of
/// sockets); returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_about_the_size_of_envoys() {
        let n = envoy_like_node("node-1").encoded_len();
        assert!((55_000..70_000).contains(&n), "{n} bytes");
    }

    #[test]
    fn request_frames_decode_to_envoys_request() {
        let sub = Subscription::ads("node-1", &["a", "b"]);
        let frame = sub.request_frame("v1", "7");
        assert_eq!(frame[0], 0);
        assert_eq!(
            u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize,
            frame.len() - 5
        );
        let req = DiscoveryRequest::decode(&frame[5..]).unwrap();
        assert_eq!(req.node, Some(envoy_like_node("node-1")));
        assert_eq!(req.resource_names, vec!["a", "b"]);
        assert_eq!(
            (req.version_info.as_str(), req.response_nonce.as_str()),
            ("v1", "7")
        );
        assert_eq!(req.type_url, CLA_TYPE_URL);
    }
}
