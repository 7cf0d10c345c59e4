//! Fan-out benchmark: one companion (the release binary, `eds` mode over a
//! slice directory) and many xDS clients at once (`serving-picker-xds-load`:
//! ADS streams that ACK every response as Envoy does, with Envoy's HTTP/2
//! windows and a node the size of Envoy's), on this machine.
//!
//! Per scenario (subscribers x endpoints of one Service, with or without
//! 1,000 stuck streams beside them: half with a window of 0, half that stop
//! reading, subscribed to the same cluster):
//! - slice change -> every subscriber holding the new version: p50, p99 and
//!   max over the changes of the time until the last subscriber has it (a
//!   slice file renamed into place, so the files source's 20 ms debounce is
//!   in it), and p99 over every (change, subscriber) delivery;
//! - companion CPU per change (utime + stime over the changes);
//! - companion RSS (before clients, with them idle, at the end, peak) and
//!   memory per idle subscriber;
//! - the floor: bytes written per change (every subscriber's response)
//!   divided by what this machine's loopback sustains, measured first in
//!   the same run.
//!
//! First, in process: what one stream's response costs to produce for a
//! 1,000-endpoint assignment, built through a codec (the assignment copied
//! into a DiscoveryResponse and encoded into the stream's own buffer, as
//! tonic's generated servers do) or taken from the shared encoding (the
//! companion's way): time, and bytes the stream then holds.
//!
//! Prints figures; asserts nothing about time. `make bench-conditions`.
//! Knobs: FANOUT_SCENARIOS (names, comma-separated), FANOUT_CHANGES (per
//! scenario, default 100),
//! SERVING_PICKER_CONDITIONS (the binary), FANOUT_EXTRA_ARGS (replaces the
//! companion's extra flags; "" for a binary without them), FANOUT_NODE
//! (`every`: Envoy's node, ~60 KB, on every request, Envoy's default;
//! `first`: on the first only, `set_node_on_first_message_only`), FANOUT_LOG
//! (the companion's RUST_LOG, default `warn`; its log is kept when a
//! scenario gives up).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serving_picker_xds_load::probe::{self, free_port};
use serving_picker_xds_load::{
    open_stuck, raise_fd_limit, subscribe, Connection, Received, Subscription,
};

const PER_SLICE: usize = 100;

struct Scenario {
    name: &'static str,
    subscribers: usize,
    endpoints: usize,
    stuck: usize,
    changes: usize,
}

fn scenarios() -> Vec<Scenario> {
    let changes: Option<usize> = std::env::var("FANOUT_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok());
    let all = [
        ("1000x1000", 1000, 1000, 0, 100),
        ("1000x1000+stuck", 1000, 1000, 1000, 100),
        ("100x10000", 100, 10_000, 0, 100),
        ("100x10000+stuck", 100, 10_000, 1000, 100),
        ("1000x2000", 1000, 2000, 0, 100),
        ("1000x2000+stuck", 1000, 2000, 1000, 100),
    ];
    let wanted: Option<Vec<String>> = std::env::var("FANOUT_SCENARIOS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    all.into_iter()
        .filter(|(n, ..)| wanted.as_ref().is_none_or(|w| w.iter().any(|x| x == n)))
        .map(|(name, subscribers, endpoints, stuck, c)| Scenario {
            name,
            subscribers,
            endpoints,
            stuck,
            changes: changes.unwrap_or(c),
        })
        .collect()
}

/// Loopback throughput (bytes/s): `conns` TCP connections in parallel, each
/// a writer and a reader thread, for about a second.
fn loopback(conns: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let run = Duration::from_millis(1000);
    let readers: Vec<_> = (0..conns)
        .map(|_| {
            let w = TcpStream::connect(addr).unwrap();
            let (mut r, _) = listener.accept().unwrap();
            std::thread::spawn(move || {
                let mut w = w;
                let chunk = vec![7u8; 256 * 1024];
                let start = Instant::now();
                while start.elapsed() < run {
                    if w.write_all(&chunk).is_err() {
                        break;
                    }
                }
            });
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                let mut n = 0u64;
                let start = Instant::now();
                loop {
                    match r.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k as u64,
                    }
                }
                (n, start.elapsed())
            })
        })
        .collect();
    let mut total = 0u64;
    let mut longest = Duration::ZERO;
    for r in readers {
        let (n, t) = r.join().unwrap();
        total += n;
        longest = longest.max(t);
    }
    total as f64 / longest.as_secs_f64()
}

fn companion_bin() -> PathBuf {
    std::env::var_os("SERVING_PICKER_CONDITIONS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/release/serving-picker-conditions")
        })
}

fn slice_json(index: usize, flip: Option<usize>) -> String {
    let endpoints: Vec<serde_json::Value> = (0..PER_SLICE)
        .map(|i| {
            let terminating = flip == Some(i);
            serde_json::json!({
                "addresses": [format!("10.{}.{}.{}", index / 250, index % 250, i + 1)],
                "conditions": {"ready": !terminating, "serving": true, "terminating": terminating},
                "zone": format!("zone-{}", i % 3),
                "nodeName": format!("node-{}", (index * PER_SLICE + i) % 50),
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{index:03}"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": "svc"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
    .to_string()
}

fn write_slice(dir: &Path, index: usize, flip: Option<usize>) {
    let tmp = dir.join(format!(".{index}.tmp"));
    std::fs::write(&tmp, slice_json(index, flip)).unwrap();
    std::fs::rename(&tmp, dir.join(format!("svc-{index:03}.json"))).unwrap();
}

struct Companion {
    child: Child,
    metrics: SocketAddr,
}

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Companion {
    fn status(&self, key: &str) -> f64 {
        probe::status_mb(self.child.id(), key)
    }

    fn rss_mb(&self) -> f64 {
        self.status("VmRSS")
    }

    /// (utime, stime), in seconds.
    fn cpu_split(&self) -> (f64, f64) {
        probe::cpu_split(&self.child.id().to_string())
    }

    fn get(&self, path: &str) -> String {
        probe::http_get(self.metrics, path)
    }

    fn metric(&self, name: &str) -> f64 {
        probe::metric(&self.get("/metrics"), name)
    }
}

fn node_on_first_only() -> bool {
    std::env::var("FANOUT_NODE").is_ok_and(|v| v == "first")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn wait(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > limit {
            println!("bench-conditions | fanout | gave up waiting for {what}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// The companion's flags (FANOUT_EXTRA_ARGS, else limits raised for the run).
fn extra_args() -> Vec<String> {
    match std::env::var("FANOUT_EXTRA_ARGS") {
        Ok(v) => v.split_whitespace().map(str::to_string).collect(),
        Err(_) => [
            "--max-connections",
            "4096",
            "--max-connections-per-peer",
            "4096",
            "--max-streams-per-peer",
            "4096",
            "--max-streams",
            "4096",
            "--send-timeout",
            "10m",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    }
}

/// The companion serving `dir`'s slices on `grpc`; None when it is not ready in time.
fn start_companion(s: &Scenario, dir: &Path, slices: usize, grpc: SocketAddr) -> Option<Companion> {
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let extra = extra_args();
    let child = Command::new(companion_bin())
        .args(["eds", "--listen", &grpc.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .args(["--cluster", "svc=bench/svc:http", "--slices-dir"])
        .arg(dir)
        .args(&extra)
        .env(
            "RUST_LOG",
            std::env::var("FANOUT_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.with_extension("log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let c = Companion { child, metrics };
    println!(
        "bench-conditions | fanout | {:<16} | companion: {} eds --cluster svc=bench/svc:http --slices-dir <{} slices of {PER_SLICE}> {}",
        s.name,
        companion_bin().display(),
        slices,
        extra.join(" ")
    );
    wait("the companion", Duration::from_secs(30), || {
        c.get("/readyz").starts_with("HTTP/1.1 200")
    })
    .then_some(c)
}

/// `n` ADS subscribers of `svc`, each retrying its connect as Envoy would.
fn subscribe_all(
    rt: &tokio::runtime::Runtime,
    grpc: SocketAddr,
    n: usize,
    epoch: Instant,
) -> Vec<Arc<Received>> {
    let received: Vec<Arc<Received>> = (0..n).map(|_| Arc::new(Received::default())).collect();
    for (i, r) in received.iter().enumerate() {
        let r = r.clone();
        let mut sub = Subscription::ads(format!("sub-{i}"), &["svc"]);
        sub.node_on_first_only = node_on_first_only();
        rt.spawn(async move {
            // A thousand connects at once may overflow the accept queue:
            // retry as Envoy would.
            let mut last = String::new();
            for _ in 0..20 {
                match Connection::open_like_envoy(grpc).await {
                    Ok(conn) => {
                        subscribe(&conn, &sub, &r, epoch).await;
                        return;
                    }
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            *r.ended.lock().unwrap() = Some(format!("connect: {last}"));
        });
    }
    received
}

/// What the changes took: change -> every subscriber (ms, sorted), each
/// delivery (ms, sorted), and the mean bytes of one change on the wire.
struct Deliveries {
    all_by_change: Vec<f64>,
    each: Vec<f64>,
    bytes: f64,
}

/// `s.changes` changes, one slice file rewritten at a time, each waited for
/// at every subscriber; None when one never arrives.
fn changes(
    s: &Scenario,
    dir: &Path,
    slices: usize,
    received: &[Arc<Received>],
    epoch: Instant,
) -> Option<Deliveries> {
    let mut all_by_change = Vec::new();
    let mut each = Vec::new();
    let mut bytes_per_change = Vec::new();
    let bytes_now = || -> u64 {
        received
            .iter()
            .map(|r| r.bytes.load(Ordering::SeqCst))
            .sum()
    };
    for n in 0..s.changes {
        let before: Vec<u64> = received.iter().map(|r| r.version()).collect();
        let bytes0 = bytes_now();
        let t0 = epoch.elapsed().as_nanos() as u64;
        write_slice(dir, n % slices, Some(n % PER_SLICE));
        if !wait(
            "every subscriber to get the change",
            Duration::from_secs(60),
            || received.iter().zip(&before).all(|(r, b)| r.version() > *b),
        ) {
            return None;
        }
        let times: Vec<f64> = received
            .iter()
            .map(|r| (r.at_nanos.load(Ordering::SeqCst).saturating_sub(t0)) as f64 / 1e6)
            .collect();
        all_by_change.push(times.iter().copied().fold(0.0, f64::max));
        each.extend(times);
        bytes_per_change.push((bytes_now() - bytes0) as f64);
        // Envoy-like pacing: the ACKs are in before the next change.
        std::thread::sleep(Duration::from_millis(100));
    }
    all_by_change.sort_by(f64::total_cmp);
    each.sort_by(f64::total_cmp);
    let bytes = bytes_per_change.iter().sum::<f64>() / bytes_per_change.len().max(1) as f64;
    Some(Deliveries {
        all_by_change,
        each,
        bytes,
    })
}

/// The companion's RSS (MB) along the run.
struct Rss {
    start: f64,
    idle: f64,
    with_stuck: f64,
}

fn run(s: &Scenario, rt: &tokio::runtime::Runtime, loopback_bps: f64) {
    let dir = std::env::temp_dir().join(format!("spc-fanout-{}-{}", s.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let slices = s.endpoints / PER_SLICE;
    for i in 0..slices {
        write_slice(&dir, i, None);
    }
    let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let Some(c) = start_companion(s, &dir, slices, grpc) else {
        return;
    };
    std::thread::sleep(Duration::from_millis(300));
    let rss_start = c.rss_mb();
    let epoch = Instant::now();
    let received = subscribe_all(rt, grpc, s.subscribers, epoch);
    if !wait(
        "every subscriber's first response",
        Duration::from_secs(60),
        || received.iter().all(|r| r.version() > 0),
    ) {
        let got = received.iter().filter(|r| r.version() > 0).count();
        let ended: Vec<String> = received.iter().filter_map(|r| r.ended()).take(3).collect();
        println!(
            "bench-conditions | fanout | {}: {got} of {} subscribers served; ended: {ended:?}; streams {}",
            s.name,
            s.subscribers,
            c.metric("serving_picker_conditions_xds_streams"),
        );
        return;
    }
    std::thread::sleep(Duration::from_millis(500));
    let rss_idle = c.rss_mb();
    let (stuck, error) = rt.block_on(open_stuck(grpc, s.stuck, &["svc"]));
    if let Some(e) = error {
        println!(
            "bench-conditions | fanout | stuck stream {}: {e}",
            stuck.len()
        );
    }
    let streams = (s.subscribers + stuck.len()) as f64;
    wait("every stream counted", Duration::from_secs(30), || {
        c.metric("serving_picker_conditions_xds_streams") >= streams
    });
    std::thread::sleep(Duration::from_millis(300));
    let rss = Rss {
        start: rss_start,
        idle: rss_idle,
        with_stuck: c.rss_mb(),
    };
    let split0 = c.cpu_split();
    let self0 = probe::cpu_split("self");
    let Some(d) = changes(s, &dir, slices, &received, epoch) else {
        return;
    };
    let split1 = c.cpu_split();
    let self1 = probe::cpu_split("self");
    report(s, &c, &d, &rss, stuck.len(), loopback_bps, (split0, split1));
    println!(
        "bench-conditions | fanout | {:<16} | CPU per change: companion user {:.1} ms + system {:.1} ms; the clients (this process) user {:.1} ms + system {:.1} ms",
        s.name,
        (split1.0 - split0.0) / s.changes as f64 * 1e3,
        (split1.1 - split0.1) / s.changes as f64 * 1e3,
        (self1.0 - self0.0) / s.changes as f64 * 1e3,
        (self1.1 - self0.1) / s.changes as f64 * 1e3,
    );
    let closed = stuck.iter().filter(|s| s.is_closed()).count();
    if closed > 0 {
        println!(
            "bench-conditions | fanout | {}: {closed} stuck streams were cut",
            s.name
        );
    }
    drop(stuck);
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(dir.with_extension("log"));
}

/// The scenario's line of figures.
fn report(
    s: &Scenario,
    c: &Companion,
    d: &Deliveries,
    rss: &Rss,
    stuck: usize,
    loopback_bps: f64,
    (split0, split1): ((f64, f64), (f64, f64)),
) {
    let cpu = split1.0 + split1.1 - split0.0 - split0.1;
    let rss_end = c.rss_mb();
    let rss_peak = c.status("VmHWM");
    let floor_ms = d.bytes / loopback_bps * 1e3;
    let coalesced = c.metric("serving_picker_conditions_xds_coalesced_total");
    let started = c.metric("serving_picker_conditions_xds_pushes_total");
    let sent = c.metric("serving_picker_conditions_xds_responses_sent_total");
    println!(
        "bench-conditions | fanout | {:<16} | {:>4} subscribers x {:>5} endpoints, {:>4} stuck | change -> all subscribers p50 {:>6.1} ms p99 {:>6.1} ms max {:>6.1} ms ({} changes) | per delivery p50 {:>6.1} p99 {:>6.1} ms | floor {:>5.1} ms ({:.1} MB/change) | CPU/change {:>5.1} ms | RSS start {:.1} idle {:.1} +stuck {:.1} end {:.1} peak {:.1} MB | per idle subscriber {:.1} KB | responses started {} sent {} coalesced {}",
        s.name,
        s.subscribers,
        s.endpoints,
        stuck,
        percentile(&d.all_by_change, 0.5),
        percentile(&d.all_by_change, 0.99),
        d.all_by_change.last().copied().unwrap_or(0.0),
        s.changes,
        percentile(&d.each, 0.5),
        percentile(&d.each, 0.99),
        floor_ms,
        d.bytes / 1e6,
        cpu / s.changes as f64 * 1e3,
        rss.start,
        rss.idle,
        rss.with_stuck,
        rss_end,
        rss_peak,
        (rss.idle - rss.start) * 1024.0 / s.subscribers as f64,
        started,
        sent,
        coalesced,
    );
}

/// A codec's response (copy + encode) against the shared one (head, tail
/// and references), for one 1,000-endpoint assignment.
fn encoding_cost() {
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use prost::Message;
    use serving_picker_conditions::eds::publish::Publisher;
    use serving_picker_conditions::model::slice::Slice;
    use serving_picker_conditions::source::{Change, Update};
    use serving_picker_conditions::xds::requests::RequestView;
    use serving_picker_conditions::xds::sotw::SotwStream;
    use serving_picker_conditions::xds::Names;

    let slices: Vec<Slice> = (0..10)
        .map(|i| {
            let k8s = serde_json::from_str(&slice_json(i, None)).unwrap();
            Slice::from_k8s(&k8s).unwrap().0
        })
        .collect();
    let mut p = Publisher::new(
        vec!["svc=bench/svc:http".parse().unwrap()],
        serving_picker_conditions::model::index::IpFamily::Auto,
        Default::default(),
    );
    let snap = p.apply(vec![Update::now(Change::Replace(slices))]).unwrap();
    let resource = snap.resource("svc").unwrap();
    let names = Arc::new(Names::new(["svc"]));
    let req = RequestView {
        resource_names: vec!["svc".into()],
        type_url: serving_picker_conditions::eds::assignment::CLA_TYPE_URL.into(),
        ..Default::default()
    };
    let n = 2000;
    let t = Instant::now();
    let mut held = 0;
    for i in 0..n {
        let encoded = DiscoveryResponse {
            version_info: snap.version.clone(),
            resources: vec![resource.to_any()],
            type_url: req.type_url.clone(),
            nonce: i.to_string(),
            ..Default::default()
        }
        .encode_to_vec();
        held = encoded.len();
        std::hint::black_box(encoded);
    }
    let codec = t.elapsed() / n;
    let t = Instant::now();
    let mut own = 0;
    for _ in 0..n {
        let mut stream = SotwStream::new(names.clone(), &snap);
        stream.on_request(&req, &snap, Instant::now());
        let taken = stream
            .take(&snap, usize::MAX, Instant::now())
            .response
            .unwrap();
        own = taken.head.len() + taken.tail.len();
        std::hint::black_box(taken);
    }
    let shared = t.elapsed() / n;
    println!(
        "bench-conditions | fanout | one stream's response, 1,000 endpoints ({} bytes): through a codec {:.1} us and {} bytes of its own; from the shared encoding {:.1} us and {} bytes of its own",
        resource.entry.len(),
        codec.as_secs_f64() * 1e6,
        held,
        shared.as_secs_f64() * 1e6,
        own,
    );
}

fn main() {
    encoding_cost();
    let bin = companion_bin();
    if !bin.is_file() {
        println!(
            "bench-conditions | fanout | skipped: no companion binary at {} (make build)",
            bin.display()
        );
        return;
    }
    println!(
        "bench-conditions | fanout | command: {}cargo bench -p serving-picker-conditions --bench fanout",
        ["FANOUT_SCENARIOS", "FANOUT_CHANGES", "FANOUT_NODE", "FANOUT_EXTRA_ARGS"]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}='{v}' ")))
            .collect::<String>()
    );
    let nofile = raise_fd_limit();
    let one = loopback(1);
    let four = loopback(4);
    let best = one.max(four);
    println!(
        "bench-conditions | fanout | {} cores, load average {}, open files {nofile}, node on {} request | loopback {:.2} GB/s (1 connection), {:.2} GB/s (4 in parallel); floors use {:.2} GB/s",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        loadavg(),
        if node_on_first_only() { "the first" } else { "every" },
        one / 1e9,
        four / 1e9,
        best / 1e9
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for s in scenarios() {
        run(&s, &rt, best);
    }
    println!(
        "bench-conditions | fanout | load average at the end {}",
        loadavg()
    );
}
