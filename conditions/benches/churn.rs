//! Subscription churn beside subscribers, in process over loopback gRPC:
//! the xDS server (`XdsServer`, its fan-out and limits as shipped) fed
//! snapshots by the publisher; 50 state-of-the-world subscribers (ADS,
//! ACKing every response as Envoy does) of one cluster; then 4 delta
//! clients that each subscribe and unsubscribe 16,000 clusters, in turn,
//! at 20 requests a second (ACKing what they get in their next request).
//!
//! Per phase (quiet: the subscribers alone; churn: with the 4 churning
//! clients), a change to the subscribers' cluster every 100 ms: the
//! change-to-ACK time of every subscriber (the server's programming
//! latency: from the change to each stream's ACK of the response carrying
//! it), p50, p99 and max, quiet and churn side by side, and their ratio;
//! and what the churning clients sent and got (requests and responses,
//! response bytes a second).
//!
//! Run twice in one process, each on a fresh server: without a send
//! budget (`--max-stream-send-rate 0`), then with the shipped one
//! (`--max-stream-send-rate`, `--max-stream-send-burst`).
//!
//! Prints figures; asserts nothing about time. `make bench-churn`.
//! Knobs: CHURN_CHANGES (per phase, default 50), CHURN_NAMES (per churning
//! client, default 16000), CHURN_CLIENTS (default 4), CHURN_RATE
//! (requests a second per churning client, default 20), CHURN_SUBSCRIBERS
//! (default 50), CHURN_SEND_RATE and CHURN_SEND_BURST (the budgeted run's
//! bytes a second and burst; default the shipped flags').
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
    grpc_frame, subscribe, Connection, DeltaResponseHead, Received, Subscription, CLA_TYPE_URL,
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
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
    let mut subscribed = false;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let nonce = c.nonce.lock().unwrap().clone();
        let (sub, unsub) = if subscribed {
            (vec![], names.to_vec())
        } else {
            (names.to_vec(), vec![])
        };
        subscribed = !subscribed;
        let frame = grpc_frame(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: sub,
            resource_names_unsubscribe: unsub,
            response_nonce: nonce,
            ..Default::default()
        });
        if send.send_data(frame, false).is_err() {
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
            subscribe(&conn, &Subscription::ads(format!("sub-{i}"), &["a"]), &r, epoch).await;
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
    let quiet = phase(&mut world, &lat, k.changes).await;
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
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    let sum = |f: fn(&Churn) -> u64| churns.iter().map(|c| f(c)).sum::<u64>();
    let (req0, resp0, bytes0) = (
        sum(|c| c.requests.load(Ordering::SeqCst)),
        sum(|c| c.responses.load(Ordering::SeqCst)),
        sum(|c| c.bytes.load(Ordering::SeqCst)),
    );
    let churned = phase(&mut world, &lat, k.changes).await;
    let secs = t.elapsed().as_secs_f64();
    let run = Run {
        quiet: quantiles(quiet),
        churn: quantiles(churned),
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
    };
    let shipped = XdsLimits::default();
    let send_rate = knob("CHURN_SEND_RATE", shipped.max_stream_send_rate as usize) as u64;
    let send_burst = knob("CHURN_SEND_BURST", shipped.max_stream_send_burst as usize) as u64;
    serving_picker_xds_load::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        println!(
            "churn: {} subscribers of one cluster; {} delta clients x {} names at {} requests/s; {} changes 100 ms apart per phase; {} assignments served",
            k.n_subs, k.clients, k.n_names, k.rate, k.changes, k.n_names + 1
        );
        let budgets = [
            ("none", 0, 0),
            ("budget", send_rate, send_burst),
        ];
        let mut runs = Vec::new();
        for (label, rate, burst) in budgets {
            let limits = XdsLimits {
                max_stream_send_rate: rate,
                max_stream_send_burst: burst,
                ..XdsLimits::default()
            };
            runs.push((label, rate, burst, run(&k, limits).await));
        }
        println!(
            "{:<22} {:<6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>6} {:>8}",
            "send budget (rate/burst)", "", "", "quiet", "", "", "churn", "", "", "", "churners", "", ""
        );
        println!(
            "{:<22} {:>6} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>7} {:>8} {:>6} {:>8}",
            "", "ACKs", "p50 ms", "p99 ms", "max ms", "ACKs", "p50 ms", "p99 ms", "max ms", "p99 x", "req/s", "resp", "MiB/s"
        );
        for (label, rate, burst, r) in &runs {
            let b = if *rate == 0 {
                (*label).to_string()
            } else {
                format!("{} MiB/s, {} MiB", rate >> 20, burst >> 20)
            };
            let (qn, q50, q99, qmax) = r.quiet;
            let (cn, c50, c99, cmax) = r.churn;
            println!(
                "{b:<22} {qn:>6} {q50:>8.2} {q99:>8.2} {qmax:>8.2} {cn:>6} {c50:>8.2} {c99:>8.2} {cmax:>8.2} {:>6.2}x {:>8.1} {:>6} {:>8.1}",
                c99 / q99,
                r.requests_per_s,
                r.responses,
                r.mib_per_s,
            );
        }
        for (label, _, _, r) in &runs {
            if !r.ended.is_empty() {
                println!("{label}: churning streams ended: {:?}", r.ended);
            }
        }
    });
}
