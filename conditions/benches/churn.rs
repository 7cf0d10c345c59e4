//! Subscription churn beside subscribers, in process over loopback gRPC:
//! the xDS server (`XdsServer`, its fan-out and limits as shipped) fed
//! snapshots by the publisher; 50 state-of-the-world subscribers (ADS,
//! ACKing every response as Envoy does) of one cluster; then 4 delta
//! clients that each subscribe and unsubscribe 16,000 clusters, in turn,
//! at 20 requests a second (ACKing what they get in their next request;
//! sending as HTTP/2 flow control lets them, as gRPC clients do).
//!
//! Per phase (quiet: the subscribers alone; churn: with the 4 churning
//! clients), a change to the subscribers' cluster every 100 ms: the
//! change-to-ACK time of every subscriber (the server's programming
//! latency: from the change to each stream's ACK of the response carrying
//! it), p50, p99 and max, quiet and churn side by side, and their ratio;
//! and what the churning clients sent and got (requests and responses,
//! response bytes a second).
//!
//! Run three times in one process, each on a fresh server: without the
//! streams' byte budgets (`--max-stream-send-rate 0`,
//! `--max-stream-request-rate 0`), with the shipped send budget alone,
//! then with both at their shipped values.
//!
//! Between the phases, a well-behaved delta client subscribes to every
//! name once: the time to its whole first response (a first full load,
//! which the budgets' bursts must let through at once).
//!
//! Prints figures; asserts nothing about time. `make bench-churn`.
//! Knobs: CHURN_CHANGES (per phase, default 50), CHURN_NAMES (per churning
//! client, default 16000), CHURN_CLIENTS (default 4), CHURN_RATE
//! (requests a second per churning client, default 20), CHURN_SUBSCRIBERS
//! (default 50), CHURN_WARMUP (seconds the churning clients run before
//! the churn phase, default 1: a stream's bursts may still be spent in
//! the phase), CHURN_SEND_RATE, CHURN_SEND_BURST, CHURN_REQUEST_RATE and
//! CHURN_REQUEST_BURST (the budgets' bytes a second and bursts; default
//! the shipped flags').
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message;
use tokio::sync::watch;

use serving_picker_conditions::eds::publish::{Publisher, Snapshot};
use serving_picker_conditions::limits::XdsLimits;
use serving_picker_conditions::model::slice::Slice;
use serving_picker_conditions::source::{Change, Update};
use serving_picker_conditions::xds::{Callbacks, Names, XdsServer};
use serving_picker_xds_load::{
    grpc_frame, send_flowed, subscribe, Connection, DeltaResponseHead, Received, Subscription,
    CLA_TYPE_URL,
};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The subscribers' Service: 10 endpoints; `flip` turns one terminating.
fn slice(flip: usize) -> Slice {
    let endpoints: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            let terminating = i == flip % 10 && flip > 0;
            serde_json::json!({
                "addresses": [format!("10.0.0.{}", i + 1)],
                "conditions": {"ready": !terminating, "serving": true, "terminating": terminating},
            })
        })
        .collect();
    let k8s = serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "a-0", "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": "a"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap();
    Slice::from_k8s(&k8s).unwrap().0
}

/// Records the subscribers' change-to-ACK times.
#[derive(Default)]
struct Latencies {
    subscribers: Mutex<Vec<Duration>>,
}

impl Callbacks for Latencies {
    fn limit_set(&self, _: &'static str, _: i64) {}
    fn limit_hit(&self, limit: &'static str) {
        eprintln!("limit hit: {limit}");
    }
    fn stream_refused(&self, _: &'static str) {}
    fn stream_opened(&self) {}
    fn stream_identified(&self, _: &str, _: &str) {}
    fn stream_closed(&self, _: &str) {}
    fn request_received(&self, _: usize) {}
    fn request_buffer_bytes(&self, _: usize) {}
    fn unknown_names(&self, _: usize) {}
    fn response_started(&self, _: usize, _: &[Duration]) {}
    fn response_sent(&self, _: usize) {}
    fn acked(&self, _: &str, _: &str, _: &str, _: Option<Duration>) {}
    fn nacked(&self, _: &str, _: &str, _: &str, _: &str) {}
    fn programmed(&self, node: &str, triggers: &[SystemTime]) {
        if node.starts_with("sub-") {
            let now = SystemTime::now();
            let mut v = self.subscribers.lock().unwrap();
            v.extend(
                triggers
                    .iter()
                    .map(|t| now.duration_since(*t).unwrap_or_default()),
            );
        }
    }
    fn subscriptions(&self, _: usize) {}
    fn coalesced(&self) {}
    fn oldest_unsent(&self, _: Duration) {}
    fn subscribers(&self, _: &str, _: i64) {}
    fn stream_reset(&self, _: &'static str) {}
}

/// One churning delta client: what it sent and got.
#[derive(Default)]
struct Churn {
    requests: AtomicU64,
    responses: AtomicU64,
    /// Response bytes read.
    bytes: AtomicU64,
    nonce: Mutex<String>,
    ended: Mutex<Option<String>>,
}

async fn churn(
    addr: SocketAddr,
    id: usize,
    names: Arc<Vec<String>>,
    rate: usize,
    stop: Arc<AtomicBool>,
    c: Arc<Churn>,
) {
    let conn = Connection::open_like_envoy(addr).await.unwrap();
    let sub = Subscription::delta_ads(format!("churn-{id}"), &[]);
    let (mut send, resp) = conn.stream(&sub).await.unwrap();
    let resp = resp.await.unwrap();
    let mut body = resp.into_body();
    let reader = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut buf = BytesMut::new();
            while let Some(chunk) = body.data().await {
                let Ok(chunk) = chunk else { break };
                let _ = body.flow_control().release_capacity(chunk.len());
                c.bytes.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                buf.extend_from_slice(&chunk);
                while buf.len() >= 5 {
                    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                    if buf.len() < 5 + len {
                        break;
                    }
                    buf.advance(5);
                    let head = DeltaResponseHead::decode(buf.split_to(len).freeze()).unwrap();
                    *c.nonce.lock().unwrap() = head.nonce;
                    c.responses.fetch_add(1, Ordering::SeqCst);
                }
            }
            let t = body.trailers().await.ok().flatten();
            *c.ended.lock().unwrap() = Some(format!(
                "{:?}",
                t.and_then(|t| t.get("grpc-message").cloned())
            ));
        })
    };
    // Both requests' names encoded once (a client on its own machine
    // spends its own CPU; here it would take the server's): each request
    // is its nonce's fields, then the names' (protobuf fields concatenate).
    let encoded = |sub: bool| -> bytes::Bytes {
        let names = names.to_vec();
        let (resource_names_subscribe, resource_names_unsubscribe) = if sub {
            (names, vec![])
        } else {
            (vec![], names)
        };
        DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe,
            resource_names_unsubscribe,
            ..Default::default()
        }
        .encode_to_vec()
        .into()
    };
    let (subscribe_all, unsubscribe_all) = (encoded(true), encoded(false));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut subscribed = false;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let nonce = c.nonce.lock().unwrap().clone();
        let names = if subscribed {
            unsubscribe_all.clone()
        } else {
            subscribe_all.clone()
        };
        subscribed = !subscribed;
        let head = DeltaDiscoveryRequest {
            response_nonce: nonce,
            ..Default::default()
        }
        .encode_to_vec();
        let mut frame = BytesMut::with_capacity(5 + head.len());
        frame.extend_from_slice(&[0]);
        frame.extend_from_slice(&((head.len() + names.len()) as u32).to_be_bytes());
        frame.extend_from_slice(&head);
        // As a gRPC client does: no more than the server's window lets in
        // (a server that does not read holds the client back).
        if !send_flowed(&mut send, frame.freeze()).await || !send_flowed(&mut send, names).await {
            break;
        }
        c.requests.fetch_add(1, Ordering::SeqCst);
    }
    let _ = send.send_data(bytes::Bytes::new(), true);
    reader.abort();
}

fn quantiles(mut v: Vec<Duration>) -> (usize, f64, f64, f64) {
    v.sort_unstable();
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    (v.len(), at(0.5), at(0.99), at(1.0))
}

struct World {
    publisher: Publisher,
    tx: watch::Sender<Arc<Snapshot>>,
    flip: usize,
}

impl World {
    fn change(&mut self) {
        self.flip += 1;
        let snap = self
            .publisher
            .apply(vec![Update::now(Change::Apply(slice(self.flip)))])
            .unwrap();
        self.tx.send_replace(Arc::new(snap));
    }
}

/// A well-behaved delta client's first full load: it subscribes to every
/// name once; the time from its request to the last byte of the response.
async fn first_load(addr: SocketAddr, names: &[String]) -> (Duration, usize) {
    let conn = Connection::open_like_envoy(addr).await.unwrap();
    let sub = Subscription::delta_ads("first-load".to_string(), &[]);
    let (mut send, resp) = conn.stream(&sub).await.unwrap();
    let t = Instant::now();
    let request = grpc_frame(&DeltaDiscoveryRequest {
        type_url: CLA_TYPE_URL.into(),
        resource_names_subscribe: names.to_vec(),
        ..Default::default()
    });
    assert!(send_flowed(&mut send, request).await);
    let mut body = resp.await.unwrap().into_body();
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        if buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() >= 5 + len {
                return (t.elapsed(), 5 + len);
            }
        }
    }
    panic!("the first load's stream ended");
}

/// The process's CPU time (user and system) so far, from /proc (zero
/// where there is none).
fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

async fn phase(world: &mut World, lat: &Latencies, changes: usize) -> Vec<Duration> {
    lat.subscribers.lock().unwrap().clear();
    for _ in 0..changes {
        world.change();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::mem::take(&mut *lat.subscribers.lock().unwrap())
}

/// One run's figures.
struct Run {
    quiet: (usize, f64, f64, f64),
    churn: (usize, f64, f64, f64),
    /// The process's CPU a second, quiet and churn.
    quiet_cpu: f64,
    churn_cpu: f64,
    /// A well-behaved client's first load of every name: time, bytes.
    first_load: (Duration, usize),
    requests_per_s: f64,
    responses: u64,
    mib_per_s: f64,
    ended: Vec<String>,
}

struct Knobs {
    changes: usize,
    n_names: usize,
    clients: usize,
    rate: usize,
    n_subs: usize,
    /// Seconds the churning clients run before the churn phase.
    warmup: usize,
}

/// A fresh server with `limits`, its subscribers, a quiet phase, then the
/// churning clients beside them.
async fn run(k: &Knobs, limits: XdsLimits) -> Run {
    let names: Arc<Vec<String>> = Arc::new((0..k.n_names).map(|i| format!("c{i:05}")).collect());
    let mut clusters = vec!["a=bench/a:http".parse().unwrap()];
    clusters.extend(
        names
            .iter()
            .map(|n| format!("{n}=bench/{n}:http").parse().unwrap()),
    );
    let mut publisher = Publisher::new(
        clusters,
        serving_picker_conditions::model::index::IpFamily::Auto,
        Default::default(),
    );
    let first = publisher
        .apply(vec![Update::now(Change::Replace(vec![slice(0)]))])
        .unwrap();
    let (tx, rx) = watch::channel(Arc::new(first));
    let lat = Arc::new(Latencies::default());
    let all_names = std::iter::once("a".to_string()).chain(names.iter().cloned());
    let server = XdsServer::new(rx, Names::new(all_names), limits, lat.clone(), None);
    let fanout = tokio::spawn(server.clone().run_fanout());
    let (ads, eds) = server.services();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grpc = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ads)
            .add_service(eds)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let epoch = Instant::now();
    let mut subs = Vec::new();
    let mut sub_tasks = Vec::new();
    for i in 0..k.n_subs {
        let conn = Connection::open_like_envoy(addr).await.unwrap();
        let r = Arc::new(Received::default());
        subs.push(r.clone());
        sub_tasks.push(tokio::spawn(async move {
            subscribe(
                &conn,
                &Subscription::ads(format!("sub-{i}"), &["a"]),
                &r,
                epoch,
            )
            .await;
        }));
    }
    let t = Instant::now();
    while subs.iter().any(|r| r.responses.load(Ordering::SeqCst) == 0) {
        assert!(t.elapsed() < Duration::from_secs(30), "subscribers served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut world = World {
        publisher,
        tx,
        flip: 0,
    };
    let (t, cpu) = (Instant::now(), cpu_time());
    let quiet = phase(&mut world, &lat, k.changes).await;
    let quiet_cpu = (cpu_time() - cpu).as_secs_f64() / t.elapsed().as_secs_f64();
    let first_load = first_load(addr, &names).await;
    let stop = Arc::new(AtomicBool::new(false));
    let churns: Vec<Arc<Churn>> = (0..k.clients).map(|_| Arc::new(Churn::default())).collect();
    let mut churn_tasks = Vec::new();
    for (i, c) in churns.iter().enumerate() {
        churn_tasks.push(tokio::spawn(churn(
            addr,
            i,
            names.clone(),
            k.rate,
            stop.clone(),
            c.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(k.warmup as u64)).await;
    let t = Instant::now();
    let sum = |f: fn(&Churn) -> u64| churns.iter().map(|c| f(c)).sum::<u64>();
    let (req0, resp0, bytes0) = (
        sum(|c| c.requests.load(Ordering::SeqCst)),
        sum(|c| c.responses.load(Ordering::SeqCst)),
        sum(|c| c.bytes.load(Ordering::SeqCst)),
    );
    let cpu = cpu_time();
    let churned = phase(&mut world, &lat, k.changes).await;
    let secs = t.elapsed().as_secs_f64();
    let churn_cpu = (cpu_time() - cpu).as_secs_f64() / secs;
    let run = Run {
        quiet: quantiles(quiet),
        churn: quantiles(churned),
        quiet_cpu,
        churn_cpu,
        first_load,
        requests_per_s: (sum(|c| c.requests.load(Ordering::SeqCst)) - req0) as f64 / secs,
        responses: sum(|c| c.responses.load(Ordering::SeqCst)) - resp0,
        mib_per_s: (sum(|c| c.bytes.load(Ordering::SeqCst)) - bytes0) as f64
            / secs
            / f64::from(1 << 20),
        ended: churns
            .iter()
            .filter_map(|c| c.ended.lock().unwrap().clone())
            .collect(),
    };
    stop.store(true, Ordering::SeqCst);
    for t in churn_tasks {
        let _ = t.await;
    }
    for t in sub_tasks {
        t.abort();
    }
    grpc.abort();
    fanout.abort();
    run
}

fn main() {
    let k = Knobs {
        changes: knob("CHURN_CHANGES", 50),
        n_names: knob("CHURN_NAMES", 16000),
        clients: knob("CHURN_CLIENTS", 4),
        rate: knob("CHURN_RATE", 20).max(1),
        n_subs: knob("CHURN_SUBSCRIBERS", 50),
        warmup: knob("CHURN_WARMUP", 1),
    };
    let shipped = XdsLimits::default();
    let send_rate = knob("CHURN_SEND_RATE", shipped.max_stream_send_rate as usize) as u64;
    let send_burst = knob("CHURN_SEND_BURST", shipped.max_stream_send_burst as usize) as u64;
    let request_rate = knob(
        "CHURN_REQUEST_RATE",
        shipped.max_stream_request_rate as usize,
    ) as u64;
    let request_burst = knob(
        "CHURN_REQUEST_BURST",
        shipped.max_stream_request_burst as usize,
    ) as u64;
    serving_picker_xds_load::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        println!(
            "churn: {} subscribers of one cluster; {} delta clients x {} names at {} requests/s, {} s before the churn phase; {} changes 100 ms apart per phase; {} assignments served",
            k.n_subs, k.clients, k.n_names, k.rate, k.warmup, k.changes, k.n_names + 1
        );
        // (label, send rate and burst, request rate and burst); rate 0: none.
        let budgets = [
            ("none", (0, 0), (0, 0)),
            ("send only", (send_rate, send_burst), (0, 0)),
            ("send and request", (send_rate, send_burst), (request_rate, request_burst)),
        ];
        let mut runs = Vec::new();
        for (label, send, request) in budgets {
            let limits = XdsLimits {
                max_stream_send_rate: send.0,
                max_stream_send_burst: send.1,
                max_stream_request_rate: request.0,
                max_stream_request_burst: request.1,
                ..XdsLimits::default()
            };
            runs.push((label, run(&k, limits).await));
        }
        println!(
            "budgets: send {} KiB/s, burst {} KiB; request names {} KiB/s, burst {} KiB",
            send_rate >> 10,
            send_burst >> 10,
            request_rate >> 10,
            request_burst >> 10
        );
        println!(
            "{:<24} {:>26} {:>26} {:>7} {:>11} {:>22} {:>14}",
            "", "quiet", "churn", "", "CPU cores", "churning clients", "first load"
        );
        println!(
            "{:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>5} {:>7} {:>6} {:>7} {:>6} {:>7}",
            "budgets", "p50 ms", "p99 ms", "max ms", "p50 ms", "p99 ms", "max ms", "p99 x", "quiet", "churn", "req/s", "resp", "MiB/s", "ms", "MiB"
        );
        for (b, r) in &runs {
            let (_, q50, q99, qmax) = r.quiet;
            let (_, c50, c99, cmax) = r.churn;
            println!(
                "{b:<24} {q50:>8.1} {q99:>8.1} {qmax:>8.1} {c50:>8.1} {c99:>8.1} {cmax:>8.1} {:>6.2}x {:>5.2} {:>5.2} {:>7.1} {:>6} {:>7.1} {:>6.0} {:>7.2}",
                c99 / q99,
                r.quiet_cpu,
                r.churn_cpu,
                r.requests_per_s,
                r.responses,
                r.mib_per_s,
                r.first_load.0.as_secs_f64() * 1000.0,
                r.first_load.1 as f64 / f64::from(1 << 20),
            );
        }
        for (label, r) in &runs {
            if !r.ended.is_empty() {
                println!("{label}: churning streams ended: {:?}", r.ended);
            }
        }
    });
}
