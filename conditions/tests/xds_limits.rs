//! The xDS server bounded, against the companion binary (`eds` mode over a
//! slice directory) and many clients at once (`serving-picker-xds-load`):
//! streams that never read cost at most one response each and are cut by
//! the send timeout; the stream, connection, name and size limits refuse
//! with RESOURCE_EXHAUSTED naming their flag; unknown names grow neither
//! memory nor the log; the metrics port drops half-sent requests and keeps
//! answering probes. Asserted from the companion's metrics, log and RSS,
//! never from how long something took.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use serving_picker_xds_load::probe::{self, free_port};
use serving_picker_xds_load::{
    grpc_frame, open_stuck, raise_fd_limit, subscribe, Connection, Received, Stuck, StuckStream,
    Subscription, CLA_TYPE_URL,
};

const SERVICE: &str = "big";
const CLUSTER: &str = "big";

/// A slice of `n` endpoints of Service `big`; `flip` turns one of them
/// terminating, so every value of it is a new assignment.
fn slice_json(index: usize, n: usize, flip: usize) -> String {
    let endpoints: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let terminating = i == flip % n && flip > 0;
            serde_json::json!({
                "addresses": [format!("10.{}.{}.{}", index / 250, index % 250, i % 250 + 1)],
                "conditions": {"ready": !terminating, "serving": true, "terminating": terminating},
                "zone": format!("zone-{}", i % 3),
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{SERVICE}-{index:03}"), "namespace": "ns",
                     "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
    .to_string()
}

struct Slices {
    dir: PathBuf,
    per_slice: usize,
}

impl Slices {
    /// `endpoints` endpoints of Service `big`, 100 per slice.
    fn create(tag: &str, endpoints: usize) -> Slices {
        let dir = std::env::temp_dir().join(format!("spc-limits-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = Slices {
            dir,
            per_slice: 100.min(endpoints),
        };
        for i in 0..endpoints.div_ceil(s.per_slice) {
            s.write(i, 0);
        }
        s
    }

    fn write(&self, index: usize, flip: usize) {
        let tmp = self.dir.join(format!(".{index}.tmp"));
        std::fs::write(&tmp, slice_json(index, self.per_slice, flip)).unwrap();
        std::fs::rename(&tmp, self.dir.join(format!("{SERVICE}-{index:03}.json"))).unwrap();
    }
}

impl Drop for Slices {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Companion {
    child: Child,
    grpc: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Companion {
    fn start(slices: &Path, extra: &[&str]) -> Companion {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = slices.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
            .args(["eds", "--listen", &grpc.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--cluster", &format!("{CLUSTER}=ns/{SERVICE}:http")])
            .arg("--slices-dir")
            .arg(slices)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        let c = Companion {
            child,
            grpc,
            metrics,
            log,
        };
        wait_until("the companion to be ready", || {
            c.get("/readyz").starts_with("HTTP/1.1 200")
        });
        c
    }

    fn get(&self, path: &str) -> String {
        probe::http_get(self.metrics, path)
    }

    /// A metric (summed over its label sets unless `name` has labels).
    fn metric(&self, name: &str) -> f64 {
        probe::metric(&self.get("/metrics"), name)
    }

    fn rss_mb(&self) -> f64 {
        probe::status_mb(self.child.id(), "VmRSS")
    }

    fn log_lines(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }
}

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "companion log (tail):\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Waits (up to 60 s) for `what`; a liveness bound, not a timing assert.
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sub(node: &str) -> Subscription {
    Subscription::ads(node, &[CLUSTER])
}

/// A subscriber running in the background.
fn spawn_subscriber(rt: &tokio::runtime::Runtime, addr: SocketAddr, node: &str) -> Arc<Received> {
    let received = Arc::new(Received::default());
    let r = received.clone();
    let s = sub(node);
    rt.spawn(async move {
        match Connection::open_like_envoy(addr).await {
            Ok(conn) => {
                subscribe(&conn, &s, &r, Instant::now()).await;
            }
            Err(e) => *r.ended.lock().unwrap() = Some(format!("connect: {e}")),
        }
    });
    received
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// 1,000 streams that never read (half with a window of 0, half that stop
/// reading) beside a subscriber, through 20 changes of a 2,000-endpoint
/// assignment: the subscriber gets every change; each stuck stream holds
/// at most one response (the rest coalesce), and memory stays flat.
#[test]
fn a_flood_of_stuck_streams_holds_at_most_one_response_each() {
    assert!(
        raise_fd_limit() >= 2500,
        "ulimit -n too low for 1,000 streams"
    );
    let rt = runtime();
    let slices = Slices::create("flood", 2000);
    let c = Companion::start(
        &slices.dir,
        &[
            "--send-timeout",
            "10m",
            "--max-streams",
            "4096",
            "--max-connections",
            "4096",
            "--max-connections-per-peer",
            "4096",
            "--max-streams-per-peer",
            "4096",
        ],
    );
    let healthy = spawn_subscriber(&rt, c.grpc, "healthy");
    wait_until("the first assignment", || healthy.version() > 0);
    let (stuck, error) = rt.block_on(open_stuck(c.grpc, 1000, &[CLUSTER]));
    assert!(error.is_none(), "opening stuck streams: {error:?}");
    wait_until("1,001 streams", || {
        c.metric("serving_picker_conditions_xds_streams") == 1001.0
    });
    // Every stopped reader has taken its first response (it fills the window).
    wait_until("the stopped readers' first responses", || {
        c.metric("serving_picker_conditions_xds_pushes_total") >= 1.0 + 500.0
    });
    let rss_before = c.rss_mb();
    let changes = 20;
    for n in 1..=changes {
        let before = healthy.version();
        slices.write(n % 20, n);
        wait_until("the subscriber to get the change", || {
            healthy.version() > before
        });
    }
    // The fan-out has seen the last snapshot (the healthy one has it).
    std::thread::sleep(Duration::from_millis(200));
    let healthy_responses = healthy.responses.load(std::sync::atomic::Ordering::SeqCst) as f64;
    assert_eq!(
        healthy_responses,
        1.0 + changes as f64,
        "one response per change"
    );
    let started = c.metric("serving_picker_conditions_xds_pushes_total");
    let sent = c.metric("serving_picker_conditions_xds_responses_sent_total");
    let coalesced = c.metric("serving_picker_conditions_xds_coalesced_total");
    // Responses started: the subscriber's, and at most one per stuck stream.
    assert!(
        started <= healthy_responses + 1000.0,
        "{started} responses started for 1 subscriber and 1,000 stuck streams"
    );
    assert!(
        started - sent <= 1000.0,
        "{} responses in flight",
        started - sent
    );
    // The other changes coalesced: each stuck stream is due, once.
    assert!(
        coalesced >= 1000.0 * (changes as f64 - 2.0),
        "coalesced {coalesced}"
    );
    // (The stream gauges are set once a second.)
    wait_until("the gauges", || {
        c.metric("serving_picker_conditions_xds_oldest_unsent_response_seconds") > 0.0
            && c.metric("serving_picker_conditions_xds_subscribers{cluster=\"big\"}") == 1001.0
    });
    let rss_after = c.rss_mb();
    eprintln!("companion RSS: {rss_before:.1} MB with 1,001 streams, {rss_after:.1} MB after {changes} changes");
    assert!(
        rss_after < rss_before + 30.0 && rss_after < 150.0,
        "RSS {rss_before:.1} -> {rss_after:.1} MB"
    );
    assert!(
        stuck.iter().all(|s| !s.is_closed()),
        "no stream cut before --send-timeout"
    );
}

/// `--send-timeout`: a stream that does not take a due response is cut
/// (its connection closed); back, it gets the current state.
#[test]
fn the_send_timeout_cuts_streams_that_do_not_read() {
    let rt = runtime();
    let slices = Slices::create("timeout", 1000);
    let c = Companion::start(&slices.dir, &["--send-timeout", "2s"]);
    let healthy = spawn_subscriber(&rt, c.grpc, "healthy");
    wait_until("the first assignment", || healthy.version() > 0);
    let stuck: Vec<StuckStream> = rt.block_on(async {
        vec![
            StuckStream::open(c.grpc, Stuck::ZeroWindow, &sub("zero"))
                .await
                .unwrap(),
            StuckStream::open(c.grpc, Stuck::StopsReading, &sub("stopped"))
                .await
                .unwrap(),
        ]
    });
    for n in 1..=3 {
        let before = healthy.version();
        slices.write(n, n);
        wait_until("the change", || healthy.version() > before);
    }
    wait_until("both stuck streams to be cut", || {
        stuck.iter().all(StuckStream::is_closed)
    });
    assert!(
        healthy.ended().is_none(),
        "the subscriber that reads is not cut"
    );
    assert_eq!(
        c.metric("serving_picker_conditions_xds_resets_total{reason=\"send-timeout\"}"),
        2.0
    );
    assert_eq!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"send-timeout\"}"),
        2.0
    );
    assert!(c.log_lines("--send-timeout") >= 1);
    wait_until("the cut streams to be counted out", || {
        c.metric("serving_picker_conditions_xds_streams") == 1.0
    });
    // Back, it gets the current state: the version the subscriber holds.
    let back = spawn_subscriber(&rt, c.grpc, "stopped");
    wait_until("the returning stream's first response", || {
        back.version() > 0
    });
    assert_eq!(back.version(), healthy.version());
}

/// A subscriber on a shared connection, in the background.
fn spawn_on(rt: &tokio::runtime::Runtime, conn: &Arc<Connection>, node: &str) -> Arc<Received> {
    let received = Arc::new(Received::default());
    let (r, conn, s) = (received.clone(), conn.clone(), sub(node));
    rt.spawn(async move {
        subscribe(&conn, &s, &r, Instant::now()).await;
    });
    received
}

/// A stream that is served (a response) or refused (its status).
fn served(r: &Received) -> Option<Result<(), String>> {
    if r.version() > 0 {
        return Some(Ok(()));
    }
    r.ended().map(Err)
}

fn open(rt: &tokio::runtime::Runtime, addr: SocketAddr) -> Arc<Connection> {
    Arc::new(rt.block_on(Connection::open(addr, None)).unwrap())
}

/// The stream and connection limits: the next one is refused with
/// RESOURCE_EXHAUSTED and a message naming the flag; the others go on.
#[test]
fn the_next_stream_or_connection_over_a_limit_is_refused_with_resource_exhausted() {
    let rt = runtime();
    let slices = Slices::create("refuse", 10);
    let c = Companion::start(
        &slices.dir,
        &[
            "--max-streams-per-connection",
            "3",
            "--max-streams",
            "5",
            "--max-connections",
            "3",
            // The third connection stays without a call to the end.
            "--preface-timeout",
            "10m",
        ],
    );
    let wait = |r: &Arc<Received>| {
        wait_until("an answer", || served(r).is_some());
        served(r).unwrap()
    };
    let a = open(&rt, c.grpc);
    for i in 0..3 {
        assert_eq!(wait(&spawn_on(&rt, &a, &format!("a{i}"))), Ok(()));
    }
    let refused = wait(&spawn_on(&rt, &a, "a3")).unwrap_err();
    assert!(
        refused.starts_with("grpc-status 8:") && refused.contains("--max-streams-per-connection"),
        "{refused}"
    );
    let b = open(&rt, c.grpc);
    for i in 0..2 {
        assert_eq!(wait(&spawn_on(&rt, &b, &format!("b{i}"))), Ok(()));
    }
    let refused = wait(&spawn_on(&rt, &b, "b2")).unwrap_err();
    assert!(
        refused.starts_with("grpc-status 8:") && refused.contains("(--max-streams)"),
        "{refused}"
    );
    // A third connection is within --max-connections 3; a fourth is not.
    let third = open(&rt, c.grpc);
    wait_until("3 connections", || {
        c.metric("serving_picker_conditions_grpc_connections") == 3.0
    });
    let fourth = open(&rt, c.grpc);
    let refused = wait(&spawn_on(&rt, &fourth, "d0")).unwrap_err();
    assert!(
        refused.starts_with("grpc-status 8:") && refused.contains("--max-connections"),
        "{refused}"
    );
    wait_until("the refused connection to be closed", || fourth.is_closed());
    assert!(!third.is_closed() && !a.is_closed() && !b.is_closed());
    for (flag, hits) in [
        ("max-streams-per-connection", 1.0),
        ("max-streams", 1.0),
        ("max-connections", 1.0),
    ] {
        assert_eq!(
            c.metric(&format!(
                "serving_picker_conditions_limit_hits_total{{limit=\"{flag}\"}}"
            )),
            hits,
            "{flag}"
        );
        assert_eq!(
            c.metric(&format!(
                "serving_picker_conditions_xds_refused_total{{limit=\"{flag}\"}}"
            )),
            hits,
            "{flag}"
        );
    }
    assert_eq!(c.metric("serving_picker_conditions_xds_streams"), 5.0);
    assert_eq!(
        c.metric("serving_picker_conditions_limit{limit=\"max-streams\"}"),
        5.0
    );
}

/// Sends `req` (already framed) on a new stream and returns how it ended.
async fn end_of(addr: SocketAddr, frame: bytes::Bytes) -> String {
    let conn = Connection::open(addr, None).await.unwrap();
    let (mut send, resp) = conn.stream(&sub("big-request")).await.unwrap();
    send.send_data(frame, false).unwrap();
    let resp = resp.await.unwrap();
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let n = chunk.map(|c| c.len()).unwrap_or(0);
        let _ = body.flow_control().release_capacity(n);
    }
    let t = body.trailers().await.unwrap().unwrap_or_default();
    format!(
        "{} {}",
        t.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-"),
        t.get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    )
}

fn request(names: Vec<String>) -> envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
    envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
        resource_names: names,
        type_url: CLA_TYPE_URL.into(),
        ..Default::default()
    }
}

/// A request over `--max-request-bytes` (refused from its header), with
/// more names than `--max-resource-names`, or with no room left in
/// `--request-buffer-bytes`, ends its stream, after the response in flight,
/// with RESOURCE_EXHAUSTED naming the flag.
#[test]
fn requests_over_the_size_or_name_limits_end_their_stream() {
    let rt = runtime();
    let slices = Slices::create("requests", 10);
    let c = Companion::start(
        &slices.dir,
        &[
            "--max-request-bytes",
            "150000",
            "--request-buffer-bytes",
            "100000",
            "--max-resource-names",
            "100",
        ],
    );
    // Announced as 10 MB: refused from its 5-byte header.
    let mut huge = vec![0u8];
    huge.extend_from_slice(&10_000_000u32.to_be_bytes());
    huge.extend_from_slice(&[0u8; 1000]);
    let end = rt.block_on(end_of(c.grpc, huge.into()));
    assert!(
        end.starts_with("8 ") && end.contains("--max-request-bytes"),
        "{end}"
    );
    let names = (0..101).map(|i| format!("n{i}")).collect();
    let end = rt.block_on(end_of(c.grpc, grpc_frame(&request(names))));
    assert!(
        end.starts_with("8 ") && end.contains("--max-resource-names"),
        "{end}"
    );
    // A 140,000-byte message half sent holds 140,000 - 64 KiB of the
    // 100,000-byte budget: a second one finds no room.
    let partial = |len: u32| {
        let mut f = vec![0u8];
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&[0u8; 70_000]);
        bytes::Bytes::from(f)
    };
    let holder = rt.block_on(async {
        let conn = Connection::open(c.grpc, None).await.unwrap();
        let (mut send, resp) = conn.stream(&sub("holder")).await.unwrap();
        send.send_data(partial(140_000), false).unwrap();
        (conn, send, resp)
    });
    wait_until("the budget to be held", || {
        c.metric("serving_picker_conditions_xds_request_buffer_bytes") > 0.0
    });
    let end = rt.block_on(end_of(c.grpc, partial(140_000)));
    assert!(
        end.starts_with("8 ") && end.contains("--request-buffer-bytes"),
        "{end}"
    );
    drop(holder);
    assert_eq!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"max-request-bytes\"}"),
        1.0
    );
    assert_eq!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"max-resource-names\"}"),
        1.0
    );
    assert_eq!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"request-buffer-bytes\"}"),
        1.0
    );
}

/// One stream asks for 1,200,000 names no cluster defines, 4,000 new ones
/// per request: nothing is kept (RSS flat), the log gets a handful of
/// lines, the metric counts them all, and the one real name is served.
#[test]
fn unknown_names_grow_neither_memory_nor_the_log() {
    let rt = runtime();
    let slices = Slices::create("unknown", 10);
    // The flood as fast as the companion reads it: the stream's share of
    // the work (--max-stream-request-rate) would spread its 1,200,000
    // names over minutes, and the log budget is for a burst.
    let c = Companion::start(&slices.dir, &["--max-stream-request-rate", "0"]);
    let rss_before = c.rss_mb();
    let rounds = 300;
    let per = 4000;
    let status = rt.block_on(async {
        let conn = Connection::open(c.grpc, None).await.unwrap();
        let (mut send, resp) = conn.stream(&sub("made-up-names")).await.unwrap();
        for round in 0..rounds {
            let mut names: Vec<String> = (0..per).map(|i| format!("made-up-{round}-{i}")).collect();
            names.push(CLUSTER.into());
            let frame = grpc_frame(&request(names));
            send.reserve_capacity(frame.len());
            send.send_data(frame, false).unwrap();
            // Let the window open again before the next one.
            while send.capacity() < 1 && round % 10 == 9 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                send.reserve_capacity(1);
            }
        }
        let mut body = resp.await.unwrap().into_body();
        let mut got = Vec::new();
        while got.len() < 5
            || got.len() < 5 + u32::from_be_bytes(got[1..5].try_into().unwrap()) as usize
        {
            let chunk = body.data().await.unwrap().unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        let served = serving_picker_xds_load::ResponseHead::decode(&got[5..])
            .unwrap()
            .resources
            .len();
        (served, conn, send, body)
    });
    // (The stream stays open, its requests still on their way.)
    let (served, _conn, _send, _body) = status;
    assert_eq!(served, 1, "the known name is served");
    wait_until("every request counted", || {
        c.metric("serving_picker_conditions_xds_unknown_resource_names_total")
            == (rounds * per) as f64
    });
    let rss_after = c.rss_mb();
    eprintln!(
        "companion RSS {rss_before:.1} -> {rss_after:.1} MB after {} unknown names",
        rounds * per
    );
    assert!(
        rss_after < rss_before + 20.0,
        "RSS {rss_before:.1} -> {rss_after:.1} MB"
    );
    let lines = c.log_lines("no --cluster defines");
    assert!(
        (1..=10).contains(&lines),
        "{lines} log lines about unknown names"
    );
}

/// 200 connections that send half a request's headers: past
/// --metrics-max-connections-per-peer (or --metrics-max-connections) the
/// oldest is closed, so /healthz, /readyz and
/// /metrics keep answering; after --metrics-header-timeout the rest go.
#[test]
fn the_metrics_port_drops_half_sent_requests_and_keeps_answering_probes() {
    let slices = Slices::create("metrics", 10);
    let c = Companion::start(
        &slices.dir,
        &[
            "--metrics-max-connections",
            "16",
            "--metrics-header-timeout",
            "1s",
        ],
    );
    let mut half_sent = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(c.metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        half_sent.push(s);
        if half_sent.len() % 50 == 0 {
            for path in ["/healthz", "/readyz", "/metrics"] {
                assert!(c.get(path).starts_with("HTTP/1.1 200"), "{path} answered");
            }
        }
    }
    for path in ["/healthz", "/readyz"] {
        assert!(c.get(path).starts_with("HTTP/1.1 200"), "{path} answered");
    }
    // Every half-sent connection is closed (evicted, or timed out).
    for s in &mut half_sent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 512];
        let closed = match s.read(&mut buf) {
            Ok(0) | Err(_) => true,
            // hyper answers a timed-out request 408 before closing.
            Ok(_) => s.read(&mut buf).map(|n| n == 0).unwrap_or(true),
        };
        assert!(closed, "a half-sent request is dropped");
    }
    // One address: past its share its own oldest goes (the port's cap
    // is not reached).
    assert!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"metrics-max-connections\"}")
            + c.metric(
                "serving_picker_conditions_limit_hits_total{limit=\"metrics-max-connections-per-peer\"}"
            )
            >= 150.0
    );
    assert!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"metrics-header-timeout\"}")
            >= 1.0
    );
    assert!(c.get("/healthz").starts_with("HTTP/1.1 200"));
}
