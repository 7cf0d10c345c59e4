//! One companion at Kubernetes' scalability limits (`make bench-cluster`):
//! the API server double serving 10,000 Services, 150,000 endpoints (one to
//! three slices per Service; one Service of 10,000 endpoints, five of
//! 1,000), listed in pages of 500 and watched with bookmarks; the release
//! binary in mode `eds` with `--manage` (every Service port served by its
//! template name, no flag each); subscribers from `serving-picker-xds-load`
//! (ACKing as Envoy does, Envoy's node on every request) in two shapes,
//! 100 x 10,000 clusters and 1,000 x 100, over state of the world and
//! delta; churn at 50 pod transitions a second (one slice written per
//! transition, with its trigger time), a 1,000-pod Deployment rolled at
//! 25 % maxSurge, a 410; and a real Envoy 1.40 subscribed to all 10,000.
//!
//! Prints the table of docs/performance.md (markdown rows) and the figures
//! behind it; asserts nothing about time. Knobs: CLUSTER_SERVICES (10000),
//! CLUSTER_ENDPOINTS (150000), CLUSTER_SECONDS (churn per run, 30),
//! CLUSTER_RATE (transitions/s, 50), CLUSTER_RUNS (e.g.
//! `100x10000-sotw,100x10000-delta,1000x100-sotw,1000x100-delta`),
//! CLUSTER_ENVOY (`sotw,delta`; `none` to skip), SERVING_PICKER_CONDITIONS,
//! ENVOY_BIN.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serving_picker_xds_load::apiserver::Load;
use serving_picker_xds_load::cluster::{resource_name, Cluster, Shape};
use serving_picker_xds_load::probe::{self, free_port};
use serving_picker_xds_load::raise_fd_limit;
use serving_picker_xds_load::scale::{
    histogram, max_bucket, quantile, wait_until, Api, Companion, Fleet,
};

const LIMIT: Duration = Duration::from_secs(600);
const LATENCY: &str = "serving_picker_conditions_programming_duration_seconds";

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn companion_bin() -> PathBuf {
    std::env::var_os("SERVING_PICKER_CONDITIONS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/release/serving-picker-conditions")
        })
}

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

struct Run {
    subscribers: usize,
    names: usize,
    delta: bool,
}

fn runs(services: usize) -> Vec<Run> {
    let spec = std::env::var("CLUSTER_RUNS").unwrap_or_else(|_| {
        format!("100x{services}-sotw,100x{services}-delta,1000x100-sotw,1000x100-delta")
    });
    spec.split(',')
        .filter_map(|r| {
            let (shape, proto) = r.trim().split_once('-')?;
            let (s, n) = shape.split_once('x')?;
            Some(Run {
                subscribers: s.parse().ok()?,
                names: n.parse::<usize>().ok()?.min(services),
                delta: proto == "delta",
            })
        })
        .collect()
}

/// The run's knobs (environment).
struct Knobs {
    services: usize,
    endpoints: usize,
    /// Churn per run.
    seconds: u64,
    /// Pod transitions a second.
    rate: f64,
}

fn main() {
    raise_fd_limit();
    let knobs = Knobs {
        services: env("CLUSTER_SERVICES", 10_000),
        endpoints: env("CLUSTER_ENDPOINTS", 150_000),
        seconds: env("CLUSTER_SECONDS", 30),
        rate: env("CLUSTER_RATE", 50.0),
    };
    let services = knobs.services;
    let dir = std::env::temp_dir().join(format!("spc-bench-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "bench-cluster: {services} Services, {} endpoints; load average at start {}",
        knobs.endpoints,
        load_avg()
    );
    let rt = runtime(2);
    let cluster = Cluster::new(Shape {
        services,
        endpoints: knobs.endpoints,
        ..Shape::LIMITS
    });
    let slices: usize = (0..services).map(|i| cluster.slice_count(i)).sum();
    let api = rt.block_on(Api::start(cluster));
    let c = start_companion(&api, &dir);
    first_list_to_ready(&c, &api, slices);
    let floor_entry = wire_floor(&c);
    println!("a small Service's assignment on the wire: {floor_entry:.0} bytes");
    for run in runs(services) {
        fleet_under_churn(&run, &knobs, &c, &api, floor_entry);
    }
    api_server_load(&api);
    let envoy_modes = std::env::var("CLUSTER_ENVOY").unwrap_or_else(|_| "sotw,delta".into());
    if let Some(envoy) = std::env::var_os("ENVOY_BIN").filter(|_| envoy_modes != "none") {
        for mode in envoy_modes.split(',') {
            real_envoy(Path::new(&envoy), &c, &api, services, mode == "delta", &dir);
        }
    } else {
        println!("(no real Envoy: ENVOY_BIN unset or CLUSTER_ENVOY=none)");
    }
    println!("load average at end {}", load_avg());
    let _ = std::fs::remove_dir_all(&dir);
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// The release binary against the API server double, limits raised: 100
/// Envoys of 10,000 clusters are over the default --max-subscriptions.
fn start_companion(api: &Api, dir: &Path) -> Companion {
    let c = Companion::start(
        &companion_bin(),
        api,
        dir,
        &[
            "--max-subscriptions",
            "4000000",
            "--max-streams",
            "4096",
            "--max-connections",
            "4096",
            "--max-connections-per-peer",
            "4096",
            "--max-streams-per-peer",
            "4096",
        ],
        "warn",
    );
    wait_until("the companion to be ready", LIMIT, || c.ready());
    c
}

/// The first full list to ready, then RSS and CPU at rest.
fn first_list_to_ready(c: &Companion, api: &Api, slices: usize) {
    let ready = c.started.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let rss_ready = c.rss_mb();
    let cpu0 = c.cpu_seconds();
    std::thread::sleep(Duration::from_secs(5));
    let idle_cpu = (c.cpu_seconds() - cpu0) / 5.0;
    println!(
        "| first full list to ready ({slices} slices, {} list pages of 500) | {:.2} s, RSS {:.0} MB; idle {:.3} CPU s/s |",
        Load::get(&api.api.load.list_pages),
        ready.as_secs_f64(),
        rss_ready,
        idle_cpu
    );
}

/// The floor: what one small Service's assignment costs on the wire (a
/// response carrying it alone), read by one subscriber of 20 of them.
fn wire_floor(c: &Companion) -> f64 {
    let frt = runtime(1);
    let names: Vec<String> = (100..120).map(resource_name).collect();
    let f = Fleet::start(&frt, c.grpc, "floor", 1, &names, false);
    wait_until("the floor's subscriber", LIMIT, || f.resources() >= 20);
    let per = f.bytes() as f64 / f.resources() as f64;
    frt.shutdown_timeout(Duration::from_secs(2));
    per
}

/// The companion's xDS counters at one moment.
struct Pushed {
    sent: f64,
    resources: f64,
}

impl Pushed {
    fn read(text: &str) -> Pushed {
        Pushed {
            sent: probe::metric(text, "serving_picker_conditions_xds_sent_bytes_total"),
            resources: probe::metric(text, "serving_picker_conditions_xds_pushed_resources_total"),
        }
    }
}

/// One run's subscribers, each of `run.names` Services (spread over all of
/// them), started on `fleet_rt`.
fn start_fleets(
    fleet_rt: &tokio::runtime::Runtime,
    c: &Companion,
    run: &Run,
    services: usize,
) -> Vec<Fleet> {
    let proto = if run.delta { "delta" } else { "sotw" };
    let per = run.names;
    (0..run.subscribers)
        .map(|i| {
            let offset = if per >= services {
                0
            } else {
                (i * per) % services
            };
            let names: Vec<String> = (0..per)
                .map(|k| resource_name((offset + k) % services))
                .collect();
            Fleet::start(
                fleet_rt,
                c.grpc,
                &format!("{proto}-{i}"),
                1,
                &names,
                run.delta,
            )
        })
        .collect()
}

/// Pod transitions at `rate` a second for `seconds`: how many, and the
/// seconds they took.
fn churn(api: &Api, services: usize, seconds: u64, rate: f64) -> (u64, f64) {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(seconds) {
        let due = start + Duration::from_secs_f64(n as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        api.transition(6.min(services - 1)..services);
        n += 1;
    }
    (n, start.elapsed().as_secs_f64())
}

/// One run: its subscribers synced, then churn (the table's row), and for
/// 100 subscribers of every Service over state of the world, the burst and
/// the 410 beside them.
fn fleet_under_churn(run: &Run, knobs: &Knobs, c: &Companion, api: &Api, floor_entry: f64) {
    let services = knobs.services;
    let proto = if run.delta { "delta" } else { "sotw" };
    let label = format!("{} x {} {proto}", run.subscribers, run.names);
    let fleet_rt = runtime(2);
    let t = Instant::now();
    let fleets = start_fleets(&fleet_rt, c, run, services);
    let per = run.names;
    let want = (run.subscribers * per) as u64;
    let synced = || fleets.iter().map(Fleet::resources).sum::<u64>() >= want;
    wait_until("the fleet's first full state", LIMIT, synced);
    let sync = t.elapsed();
    let sync_bytes: u64 = fleets.iter().map(Fleet::bytes).sum();
    std::thread::sleep(Duration::from_secs(1));
    let text0 = c.metrics_text();
    let (h0, n0) = histogram(&text0, LATENCY);
    let before = Pushed::read(&text0);
    let cpu0 = c.cpu_seconds();
    let rss0 = c.rss_mb();
    let (n, churned) = churn(api, services, knobs.seconds, knobs.rate);
    std::thread::sleep(Duration::from_secs(3));
    let cpu = (c.cpu_seconds() - cpu0) / churned;
    let text1 = c.metrics_text();
    let (h1, n1) = histogram(&text1, LATENCY);
    let after = Pushed::read(&text1);
    let sent = after.sent - before.sent;
    let pushed = after.resources - before.resources;
    let subs_per_service = (run.subscribers * per) as f64 / services as f64;
    let floor = floor_entry * n as f64 * subs_per_service;
    println!(
        "| {label} | sync {:.1} s ({:.0} MB) | {:.0} transitions in {:.0} s: CPU {:.2} s/s, RSS {:.0} MB | programming p50 {:.3} s, p99 {:.3} s, max <= {:.3} s ({} ACKed changes) | {:.0} bytes per transition per subscriber of it, {:.2}x the assignment ({:.0} bytes); {:.2} assignments pushed per (transition x subscriber) |",
        sync.as_secs_f64(),
        sync_bytes as f64 / 1e6,
        n,
        churned,
        cpu,
        c.rss_mb().max(rss0),
        quantile(&h0, &h1, 0.5),
        quantile(&h0, &h1, 0.99),
        max_bucket(&h0, &h1),
        n1 - n0,
        sent / (n as f64 * subs_per_service),
        sent / floor.max(1.0),
        floor_entry,
        pushed / (n as f64 * subs_per_service),
    );
    let ended: usize = fleets.iter().map(|f| f.ended().len()).sum();
    if ended > 0 {
        println!("  ({ended} streams ended: {:?})", fleets[0].ended());
    }
    if run.subscribers * per == 100 * services && !run.delta {
        rolling_burst(c, api, &label);
        relist_after_410(c, api, services, subs_per_service, &label);
    }
    fleet_rt.shutdown_timeout(Duration::from_secs(5));
    wait_until("the fleet's streams to close", LIMIT, || {
        c.metric("serving_picker_conditions_xds_streams") == 0.0
    });
}

/// The burst: a 1,000-pod Deployment rolled at 25 % maxSurge.
fn rolling_burst(c: &Companion, api: &Api, label: &str) {
    let steps = api.cluster.lock().unwrap().roll(1);
    let (h0, _) = histogram(&c.metrics_text(), LATENCY);
    let cpu0 = c.cpu_seconds();
    let t = Instant::now();
    let total = steps.len();
    for (k, s) in steps.into_iter().enumerate() {
        let due = t + Duration::from_secs_f64(k as f64 / 200.0);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        api.write(s);
    }
    std::thread::sleep(Duration::from_secs(3));
    let (h1, _) = histogram(&c.metrics_text(), LATENCY);
    println!(
        "| burst: 1,000-pod roll at 25 % maxSurge ({total} transitions at 200/s), {label} | CPU {:.2} s/s | programming p50 {:.3} s, p99 {:.3} s, max <= {:.3} s |",
        (c.cpu_seconds() - cpu0) / t.elapsed().as_secs_f64(),
        quantile(&h0, &h1, 0.5),
        quantile(&h0, &h1, 0.99),
        max_bucket(&h0, &h1),
    );
}

/// A 410: the companion lists again; 100 Services changed meanwhile.
fn relist_after_410(c: &Companion, api: &Api, services: usize, subs_per_service: f64, label: &str) {
    let before = Pushed::read(&c.metrics_text());
    let lists = Load::get(&api.api.load.lists);
    let cpu0 = c.cpu_seconds();
    let t = Instant::now();
    api.api.expire();
    for _ in 0..100 {
        api.transition(6..services);
    }
    wait_until("the re-list", LIMIT, || {
        Load::get(&api.api.load.lists) > lists
    });
    let want = before.resources + 100.0 * subs_per_service * 0.9;
    wait_until("the changes pushed", LIMIT, || {
        c.metric("serving_picker_conditions_xds_pushed_resources_total") >= want
    });
    let resync = t.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let after = Pushed::read(&c.metrics_text());
    println!(
        "| 410 then re-list, 100 Services changed, {label} | resync {:.2} s, CPU {:.2} s | {:.0} assignments pushed ({:.1} MB) for 100 x {subs_per_service:.0} |",
        resync.as_secs_f64(),
        c.cpu_seconds() - cpu0,
        after.resources - before.resources,
        (after.sent - before.sent) / 1e6,
    );
}

/// What the API server double served.
fn api_server_load(api: &Api) {
    println!(
        "| API server load | {} lists, {} pages, {} watches opened, {} open, {} events, {:.1} MB |",
        Load::get(&api.api.load.lists),
        Load::get(&api.api.load.list_pages),
        Load::get(&api.api.load.watches),
        Load::get(&api.api.load.open_watches),
        Load::get(&api.api.load.events),
        Load::get(&api.api.load.bytes) as f64 / 1e6
    );
}

/// A real Envoy with one EDS cluster per Service over ADS: time and memory
/// to apply 10,000 clusters' EDS, then changes applied.
fn real_envoy(bin: &Path, c: &Companion, api: &Api, services: usize, delta: bool, dir: &Path) {
    let admin = free_port();
    let clusters: Vec<serde_json::Value> = (0..services)
        .map(|i| {
            serde_json::json!({
                "name": resource_name(i), "type": "EDS", "connect_timeout": "1s",
                "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "ads": {}}}
            })
        })
        .chain(std::iter::once(serde_json::json!({
            "name": "xds", "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
            "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": c.grpc.port()}}}}]}]}
        })))
        .collect();
    let bootstrap = serde_json::json!({
        "node": {"id": format!("envoy-{}", if delta { "delta" } else { "sotw" }), "cluster": "bench"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "dynamic_resources": {"ads_config": {
            "api_type": if delta { "DELTA_GRPC" } else { "GRPC" },
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}]}},
        "static_resources": {"clusters": clusters},
    });
    let path = dir.join(format!("envoy-{delta}.json"));
    std::fs::write(&path, bootstrap.to_string()).unwrap();
    let t = Instant::now();
    let mut child = Command::new(bin)
        .args([
            "-c",
            path.to_str().unwrap(),
            "--concurrency",
            "1",
            "--log-level",
            "warn",
        ])
        .args(["--base-id", &free_port().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("envoy.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let admin_addr = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
    let stat = |name: &str| -> f64 {
        let body = probe::http_get(admin_addr, &format!("/stats?filter=^{name}$"));
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    wait_until("Envoy to apply every cluster's EDS", LIMIT, || {
        probe::http_get(admin_addr, "/ready").contains("LIVE")
    });
    let live = t.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let rss = probe::status_mb(child.id(), "VmRSS");
    let (h0, n0) = histogram(&c.metrics_text(), LATENCY);
    let cpu0 = c.cpu_seconds();
    let changes = 20;
    for _ in 0..changes {
        api.transition(6..services);
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (h1, n1) = histogram(&c.metrics_text(), LATENCY);
    println!(
        "| real Envoy 1.40, {} clusters over ADS {} | LIVE {:.2} s after start, RSS {:.0} MB ({} clusters warming) | {changes} changes: programming p50 {:.3} s, max <= {:.3} s ({} ACKed); companion CPU {:.1} ms per change |",
        services,
        if delta { "DELTA_GRPC" } else { "GRPC" },
        live.as_secs_f64(),
        rss,
        stat("cluster_manager.warming_clusters").max(0.0) as u64,
        quantile(&h0, &h1, 0.5),
        max_bucket(&h0, &h1),
        n1 - n0,
        (c.cpu_seconds() - cpu0) / changes as f64 * 1000.0,
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::read_to_string(dir.join("envoy.log")).map(|l| {
        let errs: Vec<&str> = l.lines().filter(|x| x.contains("error")).take(3).collect();
        if !errs.is_empty() {
            println!("  envoy log: {errs:?}");
        }
    });
}
