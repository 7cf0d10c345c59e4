//! Hostile clients against the release companion (`eds` mode, its shipped
//! limits: no flag raised), beside a real Envoy that needs its endpoints.
//! One after the other, each from a loopback address of its own (another
//! peer to the companion; Envoy is on 127.0.0.1):
//!
//! - 16 connections x 128 ADS streams that send HEADERS and never a request;
//! - 1,024 connections that send nothing and 100 that send the HTTP/2
//!   preface and no stream;
//! - 20 streams each with a 1 MB request message announced and 100 KB sent;
//! - 800 unary `FetchEndpoints` calls announcing 16 MB each, never finished;
//! - a client that keeps connecting to the metrics port while
//!   Prometheus-like scrapes run (one of them in flight all along);
//! - 10 delta streams subscribing to 5,400 names of 1 KB each that no
//!   `--cluster` defines (each kept until answered removed), and one name of
//!   60 KB;
//! - 32 streams each sending 24 requests of a 300 KB type URL of its own.
//!
//! During each attack: Envoy gets a slice change within 5 s (polled on its
//! admin `/clusters`), a new xDS client is served, the companion's RSS
//! stays under 200 MiB and its PID is the one it started with. Figures
//! (each change's time to reach Envoy, RSS) are printed with `--nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use serving_picker_xds_load::probe::status_mb;
use serving_picker_xds_load::{
    connect_from, envoy_like_node, grpc_frame, grpc_prefix, raise_fd_limit, subscribe, Connection,
    Frame, Held, Received, Subscription, CLA_TYPE_URL,
};
use support::companion::{eds_from_companion, plain_round_robin, Companion, SliceDir, XdsApi};
use support::envoy::fresh_dir;
use support::{wait_until, Endpoint, Envoy, EnvoyBuilder};

const CLUSTER: &str = "backend";
const SERVICE: &str = "web";
const ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const FETCH: &str = "/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints";
/// A change reaches Envoy within this during every attack.
const CHANGE_WITHIN: Duration = Duration::from_secs(5);
/// The companion's RSS stays under this (the shipped pod limit is 256 MiB).
const RSS_LIMIT_MB: f64 = 200.0;

/// The attacker of attack `n` (1-based): 127.0.0.(n+1).
fn attacker(n: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, n + 1])
}

/// The companion, the Envoy it feeds, and what each check saw.
struct Bench {
    rt: tokio::runtime::Runtime,
    slices: SliceDir,
    companion: Companion,
    envoy: Envoy,
    pid: u32,
    current: SocketAddr,
    changes: u8,
    figures: Vec<String>,
}

impl Bench {
    fn start() -> Bench {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let slices = SliceDir::create(&fresh_dir("hostile-clients-slices"));
        let current = endpoint_addr(0);
        slices.set_endpoints(SERVICE, &[Endpoint::serving(current)]);
        let companion = Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &[]);
        let pid = companion.pid();
        let envoy = EnvoyBuilder::new()
            .tag("hostile-clients")
            .eds_cluster(CLUSTER, &[])
            .bootstrap_hook(eds_from_companion(companion.listen_addr(), XdsApi::Ads))
            .with_filter(None)
            .bootstrap_hook(plain_round_robin(CLUSTER))
            .start();
        let b = Bench {
            rt,
            slices,
            companion,
            envoy,
            pid,
            current,
            changes: 0,
            figures: Vec::new(),
        };
        wait_until(
            "Envoy's first endpoints from the companion",
            Duration::from_secs(20),
            || b.envoy_has(current),
        );
        b
    }

    fn envoy_has(&self, addr: SocketAddr) -> bool {
        self.envoy
            .admin_get("/clusters")
            .body
            .contains(&format!("{CLUSTER}::{addr}::"))
    }

    fn metric(&self, name: &str) -> f64 {
        self.companion.metric(name).unwrap_or(0.0)
    }

    /// `peer_limit_hits_total` of `flag` for peers of class `address`.
    fn peer_hits(&self, flag: &str) -> f64 {
        self.metric(&format!(
            "serving_picker_conditions_peer_limit_hits_total{{limit=\"{flag}\",peer_class=\"address\"}}"
        ))
    }

    /// With the attack on: a slice change reaches Envoy within 5 s (the
    /// new endpoint in, the old one out), a new xDS client is served, the
    /// companion's RSS is under 200 MiB and its PID unchanged.
    fn check(&mut self, attack: &str) {
        self.changes += 1;
        let old = self.current;
        let new = endpoint_addr(self.changes);
        let start = Instant::now();
        self.slices
            .set_endpoints(SERVICE, &[Endpoint::serving(new)]);
        wait_until(
            &format!("{attack}: Envoy to get the change to {new}"),
            CHANGE_WITHIN,
            || self.envoy_has(new) && !self.envoy_has(old),
        );
        let took = start.elapsed();
        self.current = new;
        self.newcomer_served(attack);
        let rss = status_mb(self.pid, "VmRSS");
        let state = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or("")
            .to_string();
        assert!(
            !state.is_empty() && !state.contains("zombie"),
            "{attack}: the companion {} is gone ({state:?})",
            self.pid
        );
        assert_eq!(self.companion.pid(), self.pid, "{attack}: another PID");
        assert_eq!(self.companion.starts(), 1, "{attack}: restarted");
        assert!(
            rss > 0.0 && rss < RSS_LIMIT_MB,
            "{attack}: companion RSS {rss:.1} MB"
        );
        self.figures.push(format!(
            "{attack}: change in Envoy after {:.0} ms, companion RSS {rss:.1} MB",
            took.as_secs_f64() * 1e3
        ));
    }

    /// A new xDS client (as a new Envoy would, from 127.0.0.1) gets its
    /// endpoints within 5 s.
    fn newcomer_served(&self, attack: &str) {
        let received = Arc::new(Received::default());
        let r = received.clone();
        let sub = Subscription::ads("newcomer", &[CLUSTER]);
        let addr = self.companion.listen_addr();
        let task = self.rt.spawn(async move {
            match Connection::open_like_envoy(addr).await {
                Ok(conn) => {
                    subscribe(&conn, &sub, &r, Instant::now()).await;
                }
                Err(e) => {
                    *r.ended.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("connect: {e}"))
                }
            }
        });
        wait_until(
            &format!("{attack}: a new client's endpoints"),
            CHANGE_WITHIN,
            || received.version() > 0 || received.ended().is_some(),
        );
        task.abort();
        assert!(
            received.version() > 0,
            "{attack}: a new client not served: {:?}",
            received.ended()
        );
    }
}

/// The endpoint of change `n` (nobody listens there: Envoy only lists it).
fn endpoint_addr(n: u8) -> SocketAddr {
    SocketAddr::from(([127, 3, 0, n + 1], 8080))
}

/// 16 connections x 128 ADS streams that send HEADERS and never a request:
/// the peer holds `--max-streams-per-peer` (512) of them.
fn streams_without_a_request(b: &mut Bench) {
    let addr = b.companion.listen_addr();
    let mut conns = Vec::new();
    let mut held: Vec<Held> = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..16 {
        let conn =
            b.rt.block_on(Connection::open_from(attacker(1), addr, None))
                .unwrap();
        for _ in 0..128 {
            match b.rt.block_on(conn.unfinished_call(ADS, None)) {
                Ok(h) => held.push(h),
                Err(m) => refused.push(m),
            }
        }
        conns.push(conn);
    }
    assert_eq!(held.len(), 512, "{:?}", refused.first());
    assert!(
        refused.iter().all(|m| m.contains("--max-streams-per-peer")),
        "{:?}",
        refused.first()
    );
    b.check("2,048 streams without a request");
    drop(held);
}

/// 1,024 connections that send nothing and 100 that send the HTTP/2
/// preface and no stream: the peer holds `--max-connections-per-peer` (64).
fn connections_that_never_call(b: &mut Bench) {
    assert!(
        raise_fd_limit() >= 2500,
        "ulimit -n too low for 1,124 sockets"
    );
    let addr = b.companion.listen_addr();
    let mut silent = Vec::new();
    let mut preface_only = Vec::new();
    for i in 0..1024 {
        silent.push(b.rt.block_on(connect_from(attacker(2), addr)).unwrap());
        if i % 10 == 0 {
            if let Ok(conn) =
                b.rt.block_on(Connection::open_from(attacker(2), addr, None))
            {
                preface_only.push(conn);
            }
        }
    }
    let opened = (silent.len() + preface_only.len()) as f64;
    // Every socket counted: held within the share, or refused beyond it
    // (the shipped --preface-timeout may free some of the share meanwhile).
    wait_until("the connections counted", Duration::from_secs(20), || {
        b.metric("serving_picker_conditions_grpc_connections") <= 65.0
            && b.peer_hits("max-connections-per-peer") >= opened - 128.0
    });
    b.check("1,124 connections that never call");
    assert!(b.metric("serving_picker_conditions_grpc_connections") <= 66.0);
    drop(silent);
    drop(preface_only);
}

/// 20 streams, each with a request message of 1 MB announced and 100 KB of
/// it sent: the peer holds `--request-buffer-bytes-per-peer` (4 MiB).
fn half_sent_requests(b: &mut Bench) {
    let addr = b.companion.listen_addr();
    let conn =
        b.rt.block_on(Connection::open_from(attacker(3), addr, None))
            .unwrap();
    let mut held = Vec::new();
    for i in 0..20 {
        let sub = Subscription::ads(format!("half-{i}"), &[CLUSTER]);
        held.push(
            b.rt.block_on(conn.half_sent_request(&sub, 1_000_000, 100_000))
                .unwrap(),
        );
    }
    wait_until(
        "the peer's share of the request buffer full",
        Duration::from_secs(10),
        || b.peer_hits("request-buffer-bytes-per-peer") >= 1.0,
    );
    b.check("20 half-sent 1 MB requests");
    assert!(
        b.metric("serving_picker_conditions_xds_request_buffer_bytes") <= 4.0 * 1_048_576.0,
        "the peer holds more than its share"
    );
    drop(held);
}

/// 8 connections x 100 unary `FetchEndpoints` calls, each announcing a
/// 16 MB request and never sending it: every one answered UNIMPLEMENTED.
fn fetch_endpoints_flood(b: &mut Bench) {
    let addr = b.companion.listen_addr();
    let mut conns = Vec::new();
    let mut unimplemented = 0;
    for _ in 0..8 {
        let conn =
            b.rt.block_on(Connection::open_from(attacker(4), addr, None))
                .unwrap();
        for _ in 0..100 {
            match b
                .rt
                .block_on(conn.unfinished_call(FETCH, Some(grpc_prefix(16_000_000))))
            {
                Err(m) if m.starts_with("grpc-status 12:") => unimplemented += 1,
                other => panic!("FetchEndpoints answered {:?}", other.map(|_| "held")),
            }
        }
        conns.push(conn);
    }
    assert_eq!(unimplemented, 800);
    b.check("800 FetchEndpoints calls announcing 16 MB");
}

/// A socket to the metrics port from `local`, blocking.
fn metrics_socket(b: &Bench, local: IpAddr) -> TcpStream {
    let s =
        b.rt.block_on(connect_from(local, b.companion.metrics_addr()))
            .unwrap()
            .into_std()
            .unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// `n` connections to the metrics port from the reconnecting client, each
/// a request never finished, with a scrape after every 30th: each scrape
/// answered.
fn reconnect(b: &Bench, n: usize, flood: &mut Vec<TcpStream>) -> usize {
    let mut scrapes = 0;
    for i in 0..n {
        let mut s = metrics_socket(b, attacker(5));
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        flood.push(s);
        if i % 30 == 29 {
            let r = b.companion.get("/metrics");
            assert_eq!(r.status, 200, "a scrape during the flood");
            scrapes += 1;
        }
    }
    scrapes
}

/// A client that keeps connecting to the metrics port (300 connections,
/// each a request never finished) while scrapes run: a scrape in flight
/// when it starts is answered, and so is every scrape in between.
fn metrics_port_reconnects(b: &mut Bench) {
    let mut in_flight = metrics_socket(b, IpAddr::from([127, 0, 0, 1]));
    in_flight
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut flood = Vec::new();
    let mut scrapes = reconnect(b, 100, &mut flood);
    wait_until(
        "the reconnecting client counted",
        Duration::from_secs(3),
        || b.peer_hits("metrics-max-connections-per-peer") >= 92.0,
    );
    // Within --metrics-header-timeout (5s) of its first bytes.
    in_flight.write_all(b"Connection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = in_flight.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the scrape in flight: {answer:.80}"
    );
    scrapes += reconnect(b, 200, &mut flood);
    wait_until(
        "the reconnecting client counted",
        Duration::from_secs(10),
        || b.peer_hits("metrics-max-connections-per-peer") >= 292.0,
    );
    b.check("300 connections to the metrics port");
    assert_eq!(
        b.metric("serving_picker_conditions_limit_hits_total{limit=\"metrics-max-connections\"}"),
        0.0
    );
    b.figures.push(format!(
        "metrics port: {scrapes} scrapes and one in flight during the flood, all answered"
    ));
    drop(flood);
}

const DELTA_ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// A delta request frame subscribing to `names` of `type_url`.
fn delta_frame(type_url: &str, names: Vec<String>) -> Frame {
    grpc_frame(&DeltaDiscoveryRequest {
        node: Some(envoy_like_node("hostile")),
        type_url: type_url.to_string(),
        resource_names_subscribe: names,
        ..Default::default()
    })
}

/// Opens a bidirectional call of `path` on `conn` and sends `frames`; the
/// server may end the stream on the way (a limit), so a refused send ends
/// the frames. The stream is held until dropped.
fn stream_of_frames(b: &Bench, conn: &Connection, path: &str, frames: Vec<Frame>) -> Held {
    b.rt.block_on(async {
        let (resp, mut send) = conn.raw_call(path).await.unwrap();
        for f in frames {
            if send.send_data(f, false).is_err() {
                break;
            }
        }
        Box::new((send, resp)) as Held
    })
}

/// 2 connections x 5 delta streams, each subscribing in 6 requests to 900
/// names of 1 KB that no `--cluster` defines, never acknowledging the first
/// answer (a delta stream keeps each name until a response answers it
/// removed, and sends the next response after the ACK): a stream past
/// `--max-stream-retained-bytes` (4 MiB) ends. From another address, one
/// name of 60 KB: `--max-name-bytes` (1 KiB) ends its stream.
fn delta_streams_of_unknown_names(b: &mut Bench) {
    let addr = b.companion.listen_addr();
    let mut held = Vec::new();
    let mut conns = Vec::new();
    for c in 0..2 {
        let conn =
            b.rt.block_on(Connection::open_from(attacker(6), addr, None))
                .unwrap();
        for s in 0..5 {
            let frames = (0..6)
                .map(|r| {
                    let names = (0..900)
                        .map(|i| format!("{c}-{s}-{r}-{i}-{}", "n".repeat(990)))
                        .collect();
                    delta_frame(CLA_TYPE_URL, names)
                })
                .collect();
            held.push(stream_of_frames(b, &conn, DELTA_ADS, frames));
        }
        conns.push(conn);
    }
    let conn =
        b.rt.block_on(Connection::open_from(attacker(7), addr, None))
            .unwrap();
    held.push(stream_of_frames(
        b,
        &conn,
        DELTA_ADS,
        vec![delta_frame(CLA_TYPE_URL, vec!["x".repeat(60_000)])],
    ));
    conns.push(conn);
    let hits = |b: &Bench, limit: &str| {
        b.metric(&format!(
            "serving_picker_conditions_limit_hits_total{{limit=\"{limit}\"}}"
        ))
    };
    wait_until(
        "the long name and a stream over its share refused",
        Duration::from_secs(20),
        || {
            hits(b, "max-name-bytes") >= 1.0
                && hits(b, "max-stream-retained-bytes") + hits(b, "max-retained-bytes") >= 1.0
        },
    );
    b.check("10 delta streams of 5,400 unknown 1 KB names, one 60 KB name");
    let kept = b.metric("serving_picker_conditions_xds_retained_bytes");
    assert!(
        kept <= 32.0 * 1_048_576.0,
        "the streams keep {kept} bytes, over --max-retained-bytes"
    );
    drop(held);
}

/// 32 streams on 4 connections, each sending 24 requests whose type URL
/// is 300 KB of its own: each kept cut to 256 bytes, 8 per stream.
fn long_type_urls(b: &mut Bench) {
    let addr = b.companion.listen_addr();
    let mut held = Vec::new();
    let mut conns = Vec::new();
    for c in 0..4 {
        let conn =
            b.rt.block_on(Connection::open_from(attacker(8), addr, None))
                .unwrap();
        for s in 0..8 {
            let frames = (0..24)
                .map(|r| {
                    let url = format!("type.example/{c}-{s}-{r}-{}", "t".repeat(300_000));
                    delta_frame(&url, Vec::new())
                })
                .collect();
            held.push(stream_of_frames(b, &conn, DELTA_ADS, frames));
        }
        conns.push(conn);
    }
    b.check("32 streams of 24 long type URLs");
    drop(held);
}

#[test]
fn hostile_clients_leave_envoy_served_by_the_release_companion() {
    let mut b = Bench::start();
    streams_without_a_request(&mut b);
    connections_that_never_call(&mut b);
    half_sent_requests(&mut b);
    fetch_endpoints_flood(&mut b);
    metrics_port_reconnects(&mut b);
    delta_streams_of_unknown_names(&mut b);
    long_type_urls(&mut b);
    assert_eq!(
        b.metric("serving_picker_conditions_xds_nacks_total"),
        0.0,
        "Envoy refused an assignment"
    );
    let peak = status_mb(b.pid, "VmHWM");
    assert!(peak < RSS_LIMIT_MB, "companion peak RSS {peak:.1} MB");
    for f in &b.figures {
        println!("{f}");
    }
    println!("companion peak RSS over every attack: {peak:.1} MB");
}
