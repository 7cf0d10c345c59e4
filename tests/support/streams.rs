//! Long-lived streams through Envoy: a "pod" backend that feeds numbered messages on every
//! stream it holds, and clients that hold N streams, reconnect, and record how each stream ended.
//!
//! A [`StreamBackend`] is one pod on a loopback port. Over HTTP/2 (prior knowledge, as Envoy's
//! upstream `http2_protocol_options` speak it) it serves a gRPC server-streaming call
//! ([`GRPC_PATH`]: one gRPC message per tick) and a long download ([`DOWNLOAD_PATH`]: one line
//! per tick); over HTTP/1.1 the same download (chunked) and a websocket feed ([`WEBSOCKET_PATH`]:
//! one text frame per tick). Every message is `"<pod> <seq>"` with `seq` the tick of the wall
//! clock ([`tick_now`], one per [`TICK`]) shared by every pod, so a client that moves from A to B
//! knows how many messages it missed. [`StreamBackend::exit`] is the pod exiting: its runtime
//! stops and every socket it holds closes, as the kernel closes a killed process's.
//!
//! A [`StreamClient`] holds N streams of one [`Kind`] through Envoy, each on its own connection,
//! and reopens a stream when it ends as its [`Reconnect`] says (a gRPC client: on UNAVAILABLE).
//! Each stream's [`Attempt`]s record the pod that fed it, its first and last sequence number,
//! and how it ended ([`End`]: gRPC status, RST_STREAM code, websocket close code, the
//! connection closing). [`Moved`] sums a move from one pod to another: how each stream on the
//! pod ended, how many were still open on it when it exited, when the last stream reached
//! another pod, and the messages missed in between.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One message per stream per tick.
pub const TICK: Duration = Duration::from_millis(50);
/// The gRPC server-streaming method every pod serves.
pub const GRPC_PATH: &str = "/serving_picker.test.Ticker/Ticks";
/// The long download (HTTP/2 and HTTP/1.1).
pub const DOWNLOAD_PATH: &str = "/download";
/// The websocket feed (HTTP/1.1 upgrade).
pub const WEBSOCKET_PATH: &str = "/feed";

/// gRPC's UNAVAILABLE, the status its clients retry.
pub const GRPC_UNAVAILABLE: u32 = 14;
/// HTTP/2's REFUSED_STREAM, which gRPC clients map to UNAVAILABLE (grpc/grpc
/// doc/PROTOCOL-HTTP2.md, "Errors").
pub const H2_REFUSED_STREAM: u32 = 7;
/// HTTP/2's CANCEL, which gRPC clients map to CANCELLED.
pub const H2_CANCEL: u32 = 8;

/// A bootstrap hook (`EnvoyBuilder::bootstrap_hook`) for streams through an `EnvoyBuilder`
/// Envoy: cluster `h2_cluster` speaks HTTP/2 to its hosts (gRPC and the HTTP/2 download; make
/// it the first cluster, which the builder routes `/` to), [`WEBSOCKET_PATH`] and
/// `/http1`[`DOWNLOAD_PATH`] go to `h1_cluster` (HTTP/1.1 to the same pods), and the listener
/// takes websocket upgrades. Streams have no route or idle timeout.
pub fn envoy_hook(
    h2_cluster: &str,
    h1_cluster: &str,
) -> impl Fn(&mut serde_json::Value, &std::path::Path) + 'static {
    use serde_json::json;
    let (h2, h1) = (h2_cluster.to_string(), h1_cluster.to_string());
    move |bootstrap: &mut serde_json::Value, _dir: &std::path::Path| {
        let clusters = bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .expect("clusters");
        for c in clusters.iter_mut().filter(|c| c["name"] == json!(h2)) {
            c["typed_extension_protocol_options"] = json!({
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            });
        }
        let hcm = &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"];
        hcm["upgrade_configs"] = json!([{"upgrade_type": "websocket"}]);
        hcm["stream_idle_timeout"] = json!("0s");
        let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
            .as_array_mut()
            .expect("routes");
        for r in routes.iter_mut() {
            r["route"]["timeout"] = json!("0s");
        }
        routes.insert(
            0,
            json!({"match": {"prefix": WEBSOCKET_PATH}, "route": {"cluster": h1, "timeout": "0s"}}),
        );
        routes.insert(
            0,
            json!({"match": {"prefix": format!("/http1{DOWNLOAD_PATH}")},
                   "route": {"cluster": h1, "timeout": "0s", "prefix_rewrite": DOWNLOAD_PATH}}),
        );
    }
}

/// The tick of the wall clock: the sequence number every pod sends now.
pub fn tick_now() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    (ms / TICK.as_millis()) as u64
}

fn message(name: &str) -> String {
    format!("{name} {}", tick_now())
}

/// A pod: gRPC server-streaming, long downloads and a websocket feed on one loopback port.
pub struct StreamBackend {
    name: String,
    addr: SocketAddr,
    open: Arc<AtomicU64>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl StreamBackend {
    /// Starts a pod named `name` on a fresh loopback port.
    pub fn start(name: &str) -> StreamBackend {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("pod-{name}"))
            .enable_all()
            .build()
            .expect("a pod's runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind a pod's port");
        let addr = listener.local_addr().expect("a pod's address");
        let open = Arc::new(AtomicU64::new(0));
        let (n, o) = (Arc::<str>::from(name), open.clone());
        runtime.spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve_connection(sock, n.clone(), o.clone()));
            }
        });
        StreamBackend {
            name: name.to_string(),
            addr,
            open,
            runtime: Some(runtime),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The streams it feeds now.
    pub fn open_streams(&self) -> u64 {
        self.open.load(Ordering::SeqCst)
    }

    /// The pod exits: every connection it holds closes, its port refuses.
    pub fn exit(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }

    pub fn has_exited(&self) -> bool {
        self.runtime.is_none()
    }
}

impl Drop for StreamBackend {
    fn drop(&mut self) {
        self.exit();
    }
}

/// Counts a stream open while it lives.
struct OpenGuard(Arc<AtomicU64>);

impl OpenGuard {
    fn new(open: &Arc<AtomicU64>) -> OpenGuard {
        open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(open.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

async fn serve_connection(sock: TcpStream, name: Arc<str>, open: Arc<AtomicU64>) {
    let mut peek = [0u8; 14];
    let mut seen = 0;
    // The first bytes tell HTTP/2 (its preface) from HTTP/1.1.
    while seen < peek.len() {
        match sock.peek(&mut peek).await {
            Ok(0) | Err(_) => return,
            Ok(n) if n == seen => tokio::time::sleep(Duration::from_millis(5)).await,
            Ok(n) => seen = n,
        }
        if !H2_PREFACE.starts_with(&peek[..seen]) {
            break;
        }
    }
    if peek[..seen] == *H2_PREFACE {
        serve_h2(sock, name, open).await;
    } else {
        serve_h1(sock, name, open).await;
    }
}

async fn serve_h2(sock: TcpStream, name: Arc<str>, open: Arc<AtomicU64>) {
    let Ok(mut conn) = h2::server::handshake(sock).await else {
        return;
    };
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        let (name, open) = (name.clone(), open.clone());
        tokio::spawn(async move {
            let path = req.uri().path().to_string();
            let grpc = path == GRPC_PATH;
            if !grpc && path != DOWNLOAD_PATH {
                let resp = http::Response::builder().status(404).body(()).expect("404");
                let _ = respond.send_response(resp, true);
                return;
            }
            let content_type = if grpc {
                "application/grpc"
            } else {
                "text/plain"
            };
            let resp = http::Response::builder()
                .status(200)
                .header("content-type", content_type)
                .body(())
                .expect("200");
            let Ok(mut send) = respond.send_response(resp, false) else {
                return;
            };
            let _guard = OpenGuard::new(&open);
            let mut ticks = tokio::time::interval(TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let text = message(&name);
                let data = if grpc {
                    let mut frame = Vec::with_capacity(5 + text.len());
                    frame.push(0);
                    frame.extend_from_slice(&(text.len() as u32).to_be_bytes());
                    frame.extend_from_slice(text.as_bytes());
                    Bytes::from(frame)
                } else {
                    Bytes::from(format!("{text}\n"))
                };
                if send.send_data(data, false).is_err() {
                    return;
                }
            }
        });
    }
}

/// Reads an HTTP/1.1 head; the bytes after it stay in `buf`.
async fn read_head(sock: &mut TcpStream, buf: &mut BytesMut) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.advance(end + 4);
            return Some(head);
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        match sock.read_buf(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// The Sec-WebSocket-Accept for a key (RFC 6455 section 4.2.2).
fn websocket_accept(key: &str) -> String {
    use base64::Engine as _;
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

async fn serve_h1(mut sock: TcpStream, name: Arc<str>, open: Arc<AtomicU64>) {
    let mut buf = BytesMut::new();
    let Some(head) = read_head(&mut sock, &mut buf).await else {
        return;
    };
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let websocket = header(&head, "upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    if path == WEBSOCKET_PATH && websocket {
        let accept = websocket_accept(header(&head, "sec-websocket-key").unwrap_or(""));
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
        );
        if sock.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        let _guard = OpenGuard::new(&open);
        let (mut rd, mut wr) = sock.into_split();
        // The client sends nothing but a close; the feed stops when the connection does.
        let reader = tokio::spawn(async move {
            let mut sink = [0u8; 1024];
            while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
        });
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            ticks.tick().await;
            let text = message(&name);
            let mut frame = vec![0x81, text.len() as u8];
            frame.extend_from_slice(text.as_bytes());
            if reader.is_finished() || wr.write_all(&frame).await.is_err() {
                return;
            }
        }
    } else if path == DOWNLOAD_PATH || path == h1_download_path() {
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
        if sock.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        let _guard = OpenGuard::new(&open);
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            ticks.tick().await;
            let line = format!("{}\n", message(&name));
            let chunk = format!("{:x}\r\n{line}\r\n", line.len());
            if sock.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
    } else {
        let _ = sock
            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
    }
}

/// What a client holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A gRPC server-streaming call over HTTP/2.
    Grpc,
    /// A long download over HTTP/2.
    Http2Download,
    /// A long download over HTTP/1.1 (chunked).
    Http1Download,
    /// A websocket (HTTP/1.1 upgrade).
    Websocket,
}

impl Kind {
    /// The protocol's name in the forms' metrics (`grpc`, `http2`, `http1`, `websocket`).
    pub fn protocol(self) -> &'static str {
        match self {
            Kind::Grpc => "grpc",
            Kind::Http2Download => "http2",
            Kind::Http1Download => "http1",
            Kind::Websocket => "websocket",
        }
    }
}

/// How a stream ended, as its client saw it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum End {
    /// gRPC trailers (or a trailers-only answer) with this `grpc-status` and `grpc-message`.
    GrpcStatus(u32, String),
    /// An HTTP/2 RST_STREAM with this error code.
    Reset(u32),
    /// An HTTP/2 GOAWAY with this error code ended it.
    GoAway(u32),
    /// The response completed (END_STREAM without a gRPC status, the last chunk).
    Completed,
    /// A websocket close frame with this code.
    WebsocketClose(u16),
    /// The answer was not the stream: this HTTP status.
    Status(u16),
    /// The connection closed (FIN) with the stream open.
    ConnectionClosed,
    /// The connection failed (a TCP reset, a refused connect, an HTTP/2 protocol error).
    ConnectionError(String),
}

impl End {
    /// The gRPC status a gRPC client reports for this end: the status it carried, or the
    /// mapping of grpc/grpc doc/PROTOCOL-HTTP2.md ("Errors") for an HTTP/2 reset; a closed
    /// transport is UNAVAILABLE; an HTTP status by doc/http-grpc-status-mapping.md.
    pub fn grpc_code(&self) -> u32 {
        match self {
            End::GrpcStatus(code, _) => *code,
            End::Reset(H2_REFUSED_STREAM) => GRPC_UNAVAILABLE,
            End::Reset(H2_CANCEL) => 1,
            // ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED; INADEQUATE_SECURITY: PERMISSION_DENIED.
            End::Reset(11) => 8,
            End::Reset(12) => 7,
            End::Reset(_) => 13,
            End::GoAway(_) | End::ConnectionClosed | End::ConnectionError(_) => GRPC_UNAVAILABLE,
            End::Completed => 13,
            End::WebsocketClose(_) => 2,
            End::Status(400) => 13,
            End::Status(401) => 16,
            End::Status(403) => 7,
            End::Status(404) => 12,
            End::Status(429 | 502 | 503 | 504) => GRPC_UNAVAILABLE,
            End::Status(_) => 2,
        }
    }

    /// A short label for tables: `grpc 14 UNAVAILABLE`, `reset REFUSED_STREAM`, `ws close 1001`.
    pub fn label(&self) -> String {
        match self {
            End::GrpcStatus(code, _) => format!("grpc {code} {}", grpc_code_name(*code)),
            End::Reset(code) => format!("reset {}", h2_code_name(*code)),
            End::GoAway(code) => format!("goaway {}", h2_code_name(*code)),
            End::Completed => "completed".into(),
            End::WebsocketClose(code) => format!("ws close {code}"),
            End::Status(status) => format!("http {status}"),
            End::ConnectionClosed => "connection closed".into(),
            End::ConnectionError(_) => "connection error".into(),
        }
    }
}

pub fn grpc_code_name(code: u32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        4 => "DEADLINE_EXCEEDED",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        16 => "UNAUTHENTICATED",
        _ => "other",
    }
}

pub fn h2_code_name(code: u32) -> String {
    let name = match code {
        0 => "NO_ERROR",
        1 => "PROTOCOL_ERROR",
        2 => "INTERNAL_ERROR",
        3 => "FLOW_CONTROL_ERROR",
        5 => "STREAM_CLOSED",
        7 => "REFUSED_STREAM",
        8 => "CANCEL",
        10 => "CONNECT_ERROR",
        11 => "ENHANCE_YOUR_CALM",
        _ => return format!("code {code}"),
    };
    name.into()
}

/// When a client opens a stream again after one ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reconnect {
    /// When gRPC would retry: the end's [`End::grpc_code`] is UNAVAILABLE.
    OnUnavailable,
    /// After any end (a websocket or download client that resumes).
    Always,
}

/// One stream's life on one connection.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub opened: Instant,
    /// The pod that fed it (from its first message).
    pub pod: Option<String>,
    pub first_seq: Option<u64>,
    pub first_at: Option<Instant>,
    pub last_seq: Option<u64>,
    pub messages: u64,
    pub end: Option<End>,
    pub ended_at: Option<Instant>,
}

impl Attempt {
    fn new() -> Attempt {
        Attempt {
            opened: Instant::now(),
            pod: None,
            first_seq: None,
            first_at: None,
            last_seq: None,
            messages: 0,
            end: None,
            ended_at: None,
        }
    }

    /// Open (not ended) and fed by `pod`.
    pub fn open_on(&self, pod: &str) -> bool {
        self.end.is_none() && self.pod.as_deref() == Some(pod)
    }
}

/// One of a client's streams: its attempts in order.
#[derive(Clone, Debug, Default)]
pub struct StreamRecord {
    pub attempts: Vec<Attempt>,
}

impl StreamRecord {
    /// The attempt open now, if any.
    pub fn current(&self) -> Option<&Attempt> {
        self.attempts.last().filter(|a| a.end.is_none())
    }
}

type Records = Arc<Mutex<Vec<StreamRecord>>>;

fn with_attempt(records: &Records, i: usize, f: impl FnOnce(&mut Attempt)) {
    let mut r = records.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = r[i].attempts.last_mut() {
        f(a);
    }
}

fn saw_message(records: &Records, i: usize, text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    let mut parts = text.split_whitespace();
    let (Some(pod), Some(seq)) = (parts.next(), parts.next().and_then(|s| s.parse().ok())) else {
        return;
    };
    with_attempt(records, i, |a| {
        if a.pod.is_none() {
            a.pod = Some(pod.to_string());
            a.first_seq = Some(seq);
            a.first_at = Some(Instant::now());
        }
        a.last_seq = Some(seq);
        a.messages += 1;
    });
}

/// N streams of one kind held through Envoy.
pub struct StreamClient {
    kind: Kind,
    records: Records,
    stop: Arc<AtomicBool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl StreamClient {
    /// Opens `n` streams of `kind` to Envoy's listener at `envoy`, each reopened as `reconnect`
    /// says; `authority` is the Host / :authority sent.
    pub fn start(
        kind: Kind,
        envoy: SocketAddr,
        n: usize,
        reconnect: Reconnect,
        authority: &str,
    ) -> StreamClient {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stream-client")
            .enable_all()
            .build()
            .expect("the client's runtime");
        let records: Records = Arc::new(Mutex::new(vec![StreamRecord::default(); n]));
        let stop = Arc::new(AtomicBool::new(false));
        for i in 0..n {
            let (records, stop) = (records.clone(), stop.clone());
            let authority = authority.to_string();
            runtime.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    records.lock().unwrap_or_else(|e| e.into_inner())[i]
                        .attempts
                        .push(Attempt::new());
                    let end = match kind {
                        Kind::Grpc | Kind::Http2Download => {
                            h2_stream(kind, envoy, &authority, &records, i).await
                        }
                        Kind::Http1Download | Kind::Websocket => {
                            h1_stream(kind, envoy, &authority, &records, i).await
                        }
                    };
                    let again = match reconnect {
                        Reconnect::Always => true,
                        Reconnect::OnUnavailable => end.grpc_code() == GRPC_UNAVAILABLE,
                    };
                    with_attempt(&records, i, |a| {
                        a.end = Some(end);
                        a.ended_at = Some(Instant::now());
                    });
                    if !again {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
        }
        StreamClient {
            kind,
            records,
            stop,
            runtime: Some(runtime),
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Every stream's attempts so far.
    pub fn records(&self) -> Vec<StreamRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many streams are open and fed by `pod` now.
    pub fn open_on(&self, pod: &str) -> usize {
        self.records()
            .iter()
            .filter(|r| r.current().is_some_and(|a| a.open_on(pod)))
            .count()
    }

    /// Waits until `n` streams are open and fed by `pod`; false at `timeout`.
    pub fn wait_open_on(&self, pod: &str, n: usize, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.open_on(pod) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Stops every stream (their connections close) and returns the records.
    pub fn stop(mut self) -> Vec<StreamRecord> {
        self.stop.store(true, Ordering::SeqCst);
        let records = self.records();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        records
    }
}

impl Drop for StreamClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn h2_end(e: &h2::Error) -> End {
    match e.reason() {
        Some(reason) if e.is_reset() => End::Reset(u32::from(reason)),
        Some(reason) if e.is_go_away() => End::GoAway(u32::from(reason)),
        _ => End::ConnectionError(e.to_string()),
    }
}

async fn h2_stream(
    kind: Kind,
    envoy: SocketAddr,
    authority: &str,
    records: &Records,
    i: usize,
) -> End {
    let tcp = match TcpStream::connect(envoy).await {
        Ok(t) => t,
        Err(e) => return End::ConnectionError(e.to_string()),
    };
    let _ = tcp.set_nodelay(true);
    let (client, conn) = match h2::client::handshake(tcp).await {
        Ok(c) => c,
        Err(e) => return h2_end(&e),
    };
    let conn = tokio::spawn(conn);
    let end = h2_exchange(kind, client, authority, records, i).await;
    conn.abort();
    end
}

async fn h2_exchange(
    kind: Kind,
    client: h2::client::SendRequest<Bytes>,
    authority: &str,
    records: &Records,
    i: usize,
) -> End {
    let mut client = match client.ready().await {
        Ok(c) => c,
        Err(e) => return h2_end(&e),
    };
    let grpc = kind == Kind::Grpc;
    let req = if grpc {
        http::Request::post(format!("http://{authority}{GRPC_PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
    } else {
        http::Request::get(format!("http://{authority}{DOWNLOAD_PATH}"))
    }
    .body(())
    .expect("a request");
    let (resp, mut send) = match client.send_request(req, !grpc) {
        Ok(r) => r,
        Err(e) => return h2_end(&e),
    };
    if grpc {
        // One empty request message, then the half-close.
        if let Err(e) = send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true) {
            return h2_end(&e);
        }
    }
    let resp = match resp.await {
        Ok(r) => r,
        Err(e) => return h2_end(&e),
    };
    if let Some(end) = grpc_status(resp.headers()) {
        return end; // trailers-only
    }
    if resp.status() != 200 {
        return End::Status(resp.status().as_u16());
    }
    let mut body = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return h2_end(&e),
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        if grpc {
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if buf.len() < 5 + len {
                    break;
                }
                buf.advance(5);
                let msg = buf.split_to(len);
                saw_message(records, i, &msg);
            }
        } else {
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line = buf.split_to(nl + 1);
                saw_message(records, i, &line);
            }
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => grpc_status(&trailers).unwrap_or(End::Completed),
        Ok(None) => End::Completed,
        Err(e) => h2_end(&e),
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<End> {
    let status = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("")
        .to_string();
    Some(End::GrpcStatus(status, message))
}

fn io_end(e: &std::io::Error) -> End {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        End::ConnectionClosed
    } else {
        End::ConnectionError(e.to_string())
    }
}

/// The HTTP/1.1 download's path: through Envoy ([`envoy_hook`]) `/http1/download`, which the
/// pod serves as [`DOWNLOAD_PATH`] too.
fn h1_download_path() -> String {
    format!("/http1{DOWNLOAD_PATH}")
}

async fn h1_stream(
    kind: Kind,
    envoy: SocketAddr,
    authority: &str,
    records: &Records,
    i: usize,
) -> End {
    let mut sock = match TcpStream::connect(envoy).await {
        Ok(t) => t,
        Err(e) => return End::ConnectionError(e.to_string()),
    };
    let _ = sock.set_nodelay(true);
    let req = if kind == Kind::Websocket {
        format!(
            "GET {WEBSOCKET_PATH} HTTP/1.1\r\nhost: {authority}\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    } else {
        format!(
            "GET {} HTTP/1.1\r\nhost: {authority}\r\n\r\n",
            h1_download_path()
        )
    };
    if let Err(e) = sock.write_all(req.as_bytes()).await {
        return io_end(&e);
    }
    let mut buf = BytesMut::new();
    let Some(head) = read_head(&mut sock, &mut buf).await else {
        return End::ConnectionClosed;
    };
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let expected = if kind == Kind::Websocket { 101 } else { 200 };
    if status != expected {
        return End::Status(status);
    }
    loop {
        if kind == Kind::Websocket {
            // Server frames: unmasked, payloads under 126 bytes but for close frames.
            while buf.len() >= 2 {
                let (opcode, len) = (buf[0] & 0x0f, (buf[1] & 0x7f) as usize);
                if len >= 126 || buf.len() < 2 + len {
                    break;
                }
                buf.advance(2);
                let payload = buf.split_to(len);
                match opcode {
                    0x1 => saw_message(records, i, &payload),
                    0x8 => {
                        let code = if payload.len() >= 2 {
                            u16::from_be_bytes([payload[0], payload[1]])
                        } else {
                            1005
                        };
                        return End::WebsocketClose(code);
                    }
                    _ => {}
                }
            }
        } else {
            // Chunk-size lines are hex alone; message lines are "<pod> <seq>".
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line = buf.split_to(nl + 1);
                let text = String::from_utf8_lossy(&line);
                let text = text.trim();
                if text == "0" {
                    return End::Completed;
                }
                if text.contains(' ') {
                    saw_message(records, i, text.as_bytes());
                }
            }
        }
        match sock.read_buf(&mut buf).await {
            Ok(0) => return End::ConnectionClosed,
            Ok(_) => {}
            Err(e) => return io_end(&e),
        }
    }
}

/// How the streams moved off one pod: counted from a client's records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Streams that were on the pod when it started to drain.
    pub on_pod: usize,
    /// How the streams on the pod ended before it exited, by [`End::label`].
    pub ended: BTreeMap<String, usize>,
    /// Of those, how many ended with a status a gRPC client does not retry.
    pub not_retryable: usize,
    /// Streams still open on the pod when it exited.
    pub open_at_exit: usize,
    /// Streams that reached another pod (a later attempt fed by another pod).
    pub moved: usize,
    /// From `since` until the last moved stream's first message from another pod.
    pub all_moved_after: Option<Duration>,
    /// From `since`, the first and the last end of a stream on the pod.
    pub ends_spread: Option<(Duration, Duration)>,
    /// Messages missed between a stream's last message from the pod and its first from
    /// another: the sum, and the most one stream missed.
    pub missed_total: u64,
    pub missed_max: u64,
}

impl Moved {
    /// Counts the streams fed by `pod` at `since` (when it started to drain), with `exited` the
    /// moment it exited (None: it has not).
    pub fn count(
        records: &[StreamRecord],
        pod: &str,
        since: Instant,
        exited: Option<Instant>,
    ) -> Moved {
        let mut m = Moved::default();
        for r in records {
            // The attempt on the pod that was open at `since`.
            let Some(at) = r.attempts.iter().position(|a| {
                a.pod.as_deref() == Some(pod)
                    && a.first_at.is_some_and(|t| t <= since)
                    && a.ended_at.is_none_or(|t| t > since)
            }) else {
                continue;
            };
            m.on_pod += 1;
            let a = &r.attempts[at];
            let ended_before_exit = match (a.ended_at, exited) {
                (Some(t), Some(x)) => t < x,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if ended_before_exit {
                if let (Some(end), Some(t)) = (&a.end, a.ended_at) {
                    *m.ended.entry(end.label()).or_default() += 1;
                    if end.grpc_code() != GRPC_UNAVAILABLE {
                        m.not_retryable += 1;
                    }
                    let d = t.saturating_duration_since(since);
                    m.ends_spread = Some(match m.ends_spread {
                        None => (d, d),
                        Some((lo, hi)) => (lo.min(d), hi.max(d)),
                    });
                }
            } else {
                m.open_at_exit += 1;
            }
            let next = r.attempts[at + 1..]
                .iter()
                .find(|b| b.pod.as_deref().is_some_and(|p| p != pod));
            if let Some(b) = next {
                m.moved += 1;
                if let Some(t) = b.first_at {
                    let d = t.saturating_duration_since(since);
                    m.all_moved_after = Some(m.all_moved_after.map_or(d, |x| x.max(d)));
                }
                if let (Some(last), Some(first)) = (a.last_seq, b.first_seq) {
                    let missed = first.saturating_sub(last).saturating_sub(1);
                    m.missed_total += missed;
                    m.missed_max = m.missed_max.max(missed);
                }
            }
        }
        m
    }

    /// One line for logs and tables.
    pub fn summary(&self) -> String {
        let ended: Vec<String> = self.ended.iter().map(|(k, v)| format!("{v} {k}")).collect();
        format!(
            "on pod {}, ended [{}], not retryable {}, open at exit {}, moved {}, all moved after {}, ends spread {}, missed {} (max {})",
            self.on_pod,
            ended.join(", "),
            self.not_retryable,
            self.open_at_exit,
            self.moved,
            self.all_moved_after
                .map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64())),
            self.ends_spread.map_or("-".into(), |(lo, hi)| format!(
                "{:.1}s..{:.1}s",
                lo.as_secs_f64(),
                hi.as_secs_f64()
            )),
            self.missed_total,
            self.missed_max,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_websocket_accept_of_rfc_6455() {
        assert_eq!(
            websocket_accept("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn grpc_maps_resets_as_its_protocol_doc_says() {
        assert_eq!(End::Reset(H2_REFUSED_STREAM).grpc_code(), GRPC_UNAVAILABLE);
        assert_eq!(End::Reset(H2_CANCEL).grpc_code(), 1);
        assert_eq!(End::Reset(2).grpc_code(), 13);
        assert_eq!(End::Reset(0).grpc_code(), 13);
    }

    /// Each kind's stream straight to a pod: messages flow, and the pod's exit ends them.
    #[test]
    fn every_kind_is_fed_and_ends_when_its_pod_exits() {
        for kind in [
            Kind::Grpc,
            Kind::Http2Download,
            Kind::Http1Download,
            Kind::Websocket,
        ] {
            let mut pod = StreamBackend::start("A");
            let client = StreamClient::start(kind, pod.addr(), 3, Reconnect::Always, "pod");
            assert!(
                client.wait_open_on("A", 3, Duration::from_secs(5)),
                "{kind:?}: {:?}",
                client.records()
            );
            assert_eq!(pod.open_streams(), 3, "{kind:?}");
            std::thread::sleep(TICK * 4);
            let since = Instant::now();
            pod.exit();
            let exited = Instant::now();
            std::thread::sleep(Duration::from_millis(200));
            let records = client.stop();
            let first = &records[0].attempts[0];
            assert!(first.messages >= 3, "{kind:?}: {first:?}");
            assert!(first.end.is_some(), "{kind:?}: {first:?}");
            let m = Moved::count(&records, "A", since, Some(exited + TICK));
            assert_eq!(m.on_pod, 3, "{kind:?}: {m:?}");
            assert_eq!(m.moved, 0, "{kind:?}: {m:?}");
        }
    }
}
