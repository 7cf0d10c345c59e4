//! One peer's share of the gRPC listener, against the companion binary
//! (`eds` mode over a slice directory): a client on one address that floods
//! streams that never send a request, connections that never call, or
//! half-sent request messages holds only its peer's share, until a deadline
//! frees it, and a well-behaved client on another address is served
//! meanwhile; connections roll off at `--max-connection-age`; a client that
//! keeps connecting to the metrics port cuts only its own connections.
//! Loopback addresses other than 127.0.0.1 are the other peers. Asserted
//! from the companion's metrics and the clients' answers, never from how
//! long something took.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serving_picker_xds_load::probe::{self, free_port};
use serving_picker_xds_load::{
    connect_from, raise_fd_limit, subscribe, Connection, Held, Received, Subscription,
};

const SERVICE: &str = "big";
const CLUSTER: &str = "big";

fn attacker() -> IpAddr {
    IpAddr::from([127, 0, 0, 2])
}

struct Companion {
    child: Child,
    grpc: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
    dir: PathBuf,
}

impl Companion {
    /// The companion serving one Service of 10 endpoints, with `extra` flags.
    fn start(tag: &str, extra: &[&str]) -> Companion {
        let dir = std::env::temp_dir().join(format!("spc-peers-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let endpoints: Vec<serde_json::Value> = (1..=10)
            .map(|i| {
                serde_json::json!({
                    "addresses": [format!("10.0.0.{i}")],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                })
            })
            .collect();
        let slice = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{SERVICE}-0"), "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": SERVICE}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        });
        std::fs::write(dir.join("slice.json"), slice.to_string()).unwrap();
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = dir.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
            .args(["eds", "--listen", &grpc.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--cluster", &format!("{CLUSTER}=ns/{SERVICE}:http")])
            .arg("--slices-dir")
            .arg(&dir)
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
            dir,
        };
        wait_until("the companion to be ready", || {
            c.get("/readyz").starts_with("HTTP/1.1 200")
        });
        c
    }

    fn get(&self, path: &str) -> String {
        probe::http_get(self.metrics, path)
    }

    fn metric(&self, name: &str) -> f64 {
        probe::metric(&self.get("/metrics"), name)
    }

    /// The companion's peak RSS so far, printed, and bounded by the 200 MiB
    /// an attack must leave it under (the shipped pod limit is 256 MiB).
    fn peak_rss_within_bounds(&self, attack: &str) {
        let peak = probe::status_mb(self.child.id(), "VmHWM");
        eprintln!("{attack}: companion peak RSS {peak:.1} MB (debug build)");
        assert!(
            peak > 0.0 && peak < 200.0,
            "{attack}: peak RSS {peak:.1} MB"
        );
    }

    /// `peer_limit_hits_total` of `flag` for peers of class `address`.
    fn peer_hits(&self, flag: &str) -> f64 {
        self.metric(&format!(
            "serving_picker_conditions_peer_limit_hits_total{{limit=\"{flag}\",peer_class=\"address\"}}"
        ))
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
        let _ = std::fs::remove_dir_all(&self.dir);
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
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Where a background subscriber's connection is, once open.
type ConnSlot = Arc<std::sync::Mutex<Option<Arc<Connection>>>>;

/// A subscriber to `names` on its own connection from 127.0.0.1, in the background.
fn spawn_subscriber(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    names: &[&str],
) -> (Arc<Received>, ConnSlot) {
    let received = Arc::new(Received::default());
    let conn_slot = Arc::new(std::sync::Mutex::new(None));
    let (r, slot) = (received.clone(), conn_slot.clone());
    let s = Subscription::ads("good-envoy", names);
    rt.spawn(async move {
        match Connection::open_like_envoy(addr).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                *slot.lock().unwrap() = Some(conn.clone());
                subscribe(&conn, &s, &r, Instant::now()).await;
            }
            Err(e) => *r.ended.lock().unwrap() = Some(format!("connect: {e}")),
        }
    });
    (received, conn_slot)
}

/// The subscriber got its endpoints (or how its stream ended).
fn wait_served(r: &Received) {
    wait_until("the well-behaved client's endpoints", || {
        r.version() > 0 || r.ended().is_some()
    });
    assert!(r.version() > 0, "not served: {:?}", r.ended());
}

/// A gRPC stream of ADS on `conn` that sends HEADERS and nothing else: the
/// gRPC status of its refusal, or the stream, kept open.
async fn headers_only(conn: &Connection) -> Result<Held, String> {
    conn.unfinished_call(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        None,
    )
    .await
}

/// 16 connections x 128 ADS streams from one address that send HEADERS and
/// never a request, at the shipped limits (all 2,048 `--max-streams`): the
/// peer holds `--max-streams-per-peer` (512) of them, the rest refused
/// naming the flag; a client on another address is served; and
/// `--first-request-timeout` ends the held ones.
#[test]
fn a_flood_of_streams_without_a_request_holds_only_its_peers_share() {
    let rt = runtime();
    let c = Companion::start("streams", &["--first-request-timeout", "3s"]);
    let mut held: Vec<Held> = Vec::new();
    let mut refused = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..16 {
        let conn = rt
            .block_on(Connection::open_from(attacker(), c.grpc, None))
            .unwrap();
        for _ in 0..128 {
            match rt.block_on(headers_only(&conn)) {
                Ok(h) => held.push(h),
                Err(m) => refused.push(m),
            }
        }
        conns.push(conn);
    }
    assert_eq!(held.len(), 512, "{:?}", refused.first());
    assert_eq!(refused.len(), 1536);
    assert!(
        refused.iter().all(|m| m.contains("--max-streams-per-peer")),
        "{:?}",
        refused.first()
    );
    // Without the peer's share the attacker would hold all 2,048 streams.
    let (good, _) = spawn_subscriber(&rt, c.grpc, &[CLUSTER]);
    wait_served(&good);
    assert_eq!(c.peer_hits("max-streams-per-peer"), 1536.0);
    // The held streams never send a request: ended by the deadline.
    wait_until("the held streams to end", || {
        c.metric("serving_picker_conditions_xds_streams") == 1.0
    });
    assert_eq!(c.peer_hits("first-request-timeout"), 512.0);
    c.peak_rss_within_bounds("2,048 streams without a request");
    assert!(good.ended().is_none(), "{:?}", good.ended());
    assert_eq!(
        c.metric("serving_picker_conditions_limit{limit=\"max-streams-per-peer\"}"),
        512.0
    );
    drop(held);
}

/// 1,024 connections from one address that send nothing and 100 that send
/// the HTTP/2 preface and no stream, at the shipped limits (enough for all
/// of `--max-connections`): the peer holds `--max-connections-per-peer`
/// (64) of them, a client on another address is served, and
/// `--preface-timeout` closes the held ones.
#[test]
fn connections_that_never_call_hold_only_their_peers_share_until_the_preface_timeout() {
    let rt = runtime();
    assert!(
        raise_fd_limit() >= 2500,
        "ulimit -n too low for 1,124 sockets"
    );
    // Long enough for the sockets to open before the first are closed.
    let c = Companion::start("conns", &["--preface-timeout", "20s"]);
    let mut silent = Vec::new();
    let mut preface_only = Vec::new();
    for i in 0..1024 {
        silent.push(rt.block_on(connect_from(attacker(), c.grpc)).unwrap());
        if i % 10 == 0 {
            if let Ok(conn) = rt.block_on(Connection::open_from(attacker(), c.grpc, None)) {
                preface_only.push(conn);
            }
        }
    }
    let over = (silent.len() + preface_only.len() - 64) as f64;
    wait_until("every socket to be accepted", || {
        c.peer_hits("max-connections-per-peer") == over
    });
    assert_eq!(c.metric("serving_picker_conditions_grpc_connections"), 64.0);
    // Without the peer's share the attacker would hold all 1,024.
    let (good, _) = spawn_subscriber(&rt, c.grpc, &[CLUSTER]);
    wait_served(&good);
    wait_until("the silent connections to be closed", || {
        c.metric("serving_picker_conditions_grpc_connections") == 1.0
    });
    assert_eq!(c.peer_hits("preface-timeout"), 64.0);
    c.peak_rss_within_bounds("1,124 connections without a call");
    assert!(good.ended().is_none(), "{:?}", good.ended());
    wait_until("the preface-only clients to see their close", || {
        preface_only.iter().all(|p| p.is_closed())
    });
    drop(silent);
}

/// 20 streams from one address, each with a request message of 1 MB
/// announced and 100 KB of it sent: the peer's streams hold their share of
/// `--request-buffer-bytes` (the rest end naming
/// `--request-buffer-bytes-per-peer`), a client on another address with a
/// 900 KB request is served, and `--request-receive-timeout` ends the
/// held ones.
#[test]
fn half_sent_requests_hold_only_their_peers_share_until_the_receive_timeout() {
    let rt = runtime();
    let c = Companion::start("budget", &["--request-receive-timeout", "4s"]);
    let conn = rt
        .block_on(Connection::open_from(attacker(), c.grpc, None))
        .unwrap();
    let mut held = Vec::new();
    for i in 0..20 {
        let sub = Subscription::ads(format!("half-{i}"), &[CLUSTER]);
        let (mut send, resp) = rt.block_on(conn.stream(&sub)).unwrap();
        // A complete first request, then half of a large one.
        let mut head = vec![0u8];
        head.extend_from_slice(&1_000_000u32.to_be_bytes());
        send.send_data(Bytes::from(head), false).unwrap();
        send.send_data(Bytes::from(vec![0x0a; 100_000]), false)
            .unwrap();
        held.push((send, resp));
    }
    wait_until("the peer's share to be full", || {
        c.peer_hits("request-buffer-bytes-per-peer") >= 1.0
    });
    let names: Vec<String> = (0..9000).map(|i| format!("{i:0>96}")).collect();
    let mut all: Vec<&str> = names.iter().map(String::as_str).collect();
    all.push(CLUSTER);
    let request = Subscription::ads("good-envoy", &all).request_frame("", "");
    assert!(request.len() > 800_000, "{}", request.len());
    // Without the peer's share, 17 such messages would hold the whole
    // --request-buffer-bytes and this one would find no room.
    let (good, _) = spawn_subscriber(&rt, c.grpc, &all);
    wait_served(&good);
    wait_until("the held messages to time out", || {
        c.peer_hits("request-receive-timeout") >= 1.0
    });
    // Until every half-sent message has ended (timed out while held, or
    // found no room in the share), the buffer holds at most the share.
    let share_bytes = 4.0 * (1_000_000.0 - 65_536.0);
    let mut most_held: f64 = 0.0;
    wait_until("every half-sent message to end", || {
        most_held = most_held.max(c.metric("serving_picker_conditions_xds_request_buffer_bytes"));
        c.peer_hits("request-receive-timeout") + c.peer_hits("request-buffer-bytes-per-peer")
            == 20.0
    });
    assert!(
        most_held > 0.0 && most_held <= share_bytes,
        "{most_held} held"
    );
    // The 4 MiB share holds four messages of 1 MB (less the 64 KiB never
    // counted) at once: at least those four time out.
    assert!(c.peer_hits("request-receive-timeout") >= 4.0);
    assert!(c.peer_hits("request-buffer-bytes-per-peer") >= 1.0);
    c.peak_rss_within_bounds("20 half-sent 1 MB requests");
    assert!(good.ended().is_none(), "{:?}", good.ended());
    drop(held);
}

/// At `--max-connection-age` a connection is told to go (GOAWAY); one whose
/// stream never ends is closed `--max-connection-age-grace` later, and the
/// client is served again on a new connection.
#[test]
fn connections_roll_off_at_their_maximum_age() {
    let rt = runtime();
    let c = Companion::start(
        "age",
        &[
            "--max-connection-age",
            "2s",
            "--max-connection-age-grace",
            "1s",
        ],
    );
    let (first, conn) = spawn_subscriber(&rt, c.grpc, &[CLUSTER]);
    wait_served(&first);
    wait_until("the old connection to be closed", || {
        conn.lock().unwrap().as_ref().is_some_and(|c| c.is_closed())
    });
    assert!(c.peer_hits("max-connection-age") >= 1.0);
    assert!(c.peer_hits("max-connection-age-grace") >= 1.0);
    let (second, _) = spawn_subscriber(&rt, c.grpc, &[CLUSTER]);
    wait_served(&second);
    assert_eq!(
        c.metric("serving_picker_conditions_limit{limit=\"max-connection-age\"}"),
        2.0
    );
}

/// A socket to `addr` from `local`, blocking, with a read timeout.
fn socket_from(
    rt: &tokio::runtime::Runtime,
    local: IpAddr,
    addr: SocketAddr,
) -> std::net::TcpStream {
    let s = rt
        .block_on(connect_from(local, addr))
        .unwrap()
        .into_std()
        .unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A scrape in flight from one address survives another address that
/// keeps connecting to the metrics port: past
/// `--metrics-max-connections-per-peer` the newcomer's own oldest goes.
#[test]
fn a_client_that_keeps_connecting_to_the_metrics_port_cuts_only_itself() {
    let rt = runtime();
    let c = Companion::start(
        "admin",
        &[
            "--metrics-max-connections",
            "16",
            "--metrics-max-connections-per-peer",
            "4",
            "--metrics-header-timeout",
            "20s",
        ],
    );
    let mut scrape = socket_from(&rt, IpAddr::from([127, 0, 0, 1]), c.metrics);
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut flood = Vec::new();
    for _ in 0..100 {
        let mut s = socket_from(&rt, attacker(), c.metrics);
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        flood.push(s);
    }
    // Every flood connection is accepted and counted before the scrape ends.
    wait_until("the flood to be counted", || {
        c.peer_hits("metrics-max-connections-per-peer") >= 96.0
    });
    scrape.write_all(b"Connection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = scrape.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the scrape in flight: {answer:.80}"
    );
    assert!(c.get("/healthz").starts_with("HTTP/1.1 200"));
    assert_eq!(
        c.metric("serving_picker_conditions_limit_hits_total{limit=\"metrics-max-connections\"}"),
        0.0
    );
    drop(flood);
}

/// Under mutual TLS a peer is a client certificate on an address: its
/// connections beyond `--max-connections-per-peer` are refused and counted
/// with `peer_class="mtls"`, and another certificate on the same address
/// has a share of its own.
#[test]
fn a_client_certificate_on_an_address_is_a_peer_of_class_mtls() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let rt = runtime();
    let ca = pki::Ca::new("peers CA");
    let server = ca.server(&["localhost"]);
    let envoy = ca.client(&["spiffe://cluster.local/ns/default/sa/envoy"]);
    let other = ca.client(&["spiffe://cluster.local/ns/default/sa/other"]);
    let tls = std::env::temp_dir().join(format!("spc-peers-tls-{}", std::process::id()));
    std::fs::create_dir_all(&tls).unwrap();
    for (name, pem) in [
        ("tls.crt", &server.cert_pem),
        ("tls.key", &server.key_pem),
        ("ca.crt", &ca.pem),
    ] {
        std::fs::write(tls.join(name), pem).unwrap();
    }
    let path = |name: &str| tls.join(name).display().to_string();
    let c = Companion::start(
        "mtls",
        &[
            "--tls-cert",
            &path("tls.crt"),
            "--tls-key",
            &path("tls.key"),
            "--client-ca",
            &path("ca.crt"),
            "--max-connections-per-peer",
            "2",
            "--preface-timeout",
            "10m",
        ],
    );
    let endpoint = |leaf: &pki::Leaf| {
        Endpoint::from_shared(format!("https://{}", c.grpc))
            .unwrap()
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&ca.pem))
                    .domain_name("localhost")
                    .identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem)),
            )
            .unwrap()
    };
    let mut channels = Vec::new();
    for _ in 0..3 {
        channels.push(rt.block_on(endpoint(&envoy).connect()).unwrap());
    }
    let hits = "serving_picker_conditions_peer_limit_hits_total{limit=\"max-connections-per-peer\",peer_class=\"mtls\"}";
    wait_until(
        "the third connection of the certificate to be refused",
        || c.metric(hits) == 1.0,
    );
    // Another certificate on the same address: a share of its own.
    for _ in 0..2 {
        channels.push(rt.block_on(endpoint(&other).connect()).unwrap());
    }
    wait_until("4 connections", || {
        c.metric("serving_picker_conditions_grpc_connections") == 4.0
    });
    assert_eq!(c.metric(hits), 1.0);
    assert_eq!(c.peer_hits("max-connections-per-peer"), 0.0);
    drop(channels);
    let _ = std::fs::remove_dir_all(&tls);
}
