//! Scale benchmark of the companion: 10,000 endpoints in 100 EndpointSlices.
//!
//! 1. In process (no network): one slice changes -> the pushed assignment
//!    (index update, the changed ClusterLoadAssignment rebuilt and encoded,
//!    a stream's DiscoveryResponse built), p50/p99 over many changes; for one
//!    Service of 100 slices, and for 100 Services of one slice each.
//! 2. Memory: bytes held by the index, and by the whole publisher (index,
//!    views, encoded assignments), counted by a global allocator.
//! 3. With a real Envoy 1.40 (`ENVOY_BIN`) and the companion binary
//!    (`SERVING_PICKER_CONDITIONS`): a slice file renamed into place ->
//!    Envoy's ACK; the companion's push->ACK time (Envoy applying 10,000
//!    endpoints, plus the loopback round trip) from its own metrics.
//!
//! Prints figures; asserts nothing about time. `make bench-conditions`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use serving_picker_conditions::eds::publish::Publisher;
use serving_picker_conditions::model::index::{Index, IpFamily};
use serving_picker_conditions::model::slice::{
    AddressType, ServiceKey, Slice, SliceEndpoint, SliceKey, SlicePort,
};
use serving_picker_conditions::source::{Change, Update};
use serving_picker_conditions::xds::requests::RequestView;
use serving_picker_conditions::xds::sotw::SotwStream;
use serving_picker_conditions::xds::Names;
use serving_picker_xds_load::probe::{self, free_port, metric};

struct Counting;
static HELD: AtomicIsize = AtomicIsize::new(0);

// A global allocator is an unsafe trait: it counts, then hands each call to the system's.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        HELD.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        HELD.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        HELD.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const SLICES: usize = 100;
const PER_SLICE: usize = 100;
const CHANGES: usize = 500;

fn ip(slice: usize, i: usize) -> IpAddr {
    IpAddr::from([10, (slice / 256) as u8, (slice % 256) as u8, i as u8 + 1])
}

fn make_slice(service: &str, s: usize, flip: Option<usize>) -> Slice {
    Slice {
        key: SliceKey {
            namespace: "bench".into(),
            name: format!("{service}-{s:03}"),
        },
        service: ServiceKey {
            namespace: "bench".into(),
            name: service.into(),
        },
        address_type: AddressType::IPv4,
        ports: vec![SlicePort {
            name: "http".into(),
            port: 8080,
        }],
        endpoints: (0..PER_SLICE)
            .map(|i| {
                // `flip` moves one endpoint through the rolling-update states.
                let (ready, terminating) = match flip {
                    Some(f) if i == f % PER_SLICE && (f / PER_SLICE).is_multiple_of(2) => {
                        (false, true)
                    }
                    _ => (true, false),
                };
                SliceEndpoint {
                    address: ip(s, i),
                    ready: Some(ready),
                    serving: Some(true),
                    terminating: Some(terminating),
                    zone: Some(format!("zone-{}", i % 3).into()),
                    node_name: Some(format!("node-{}", (s * PER_SLICE + i) % 50).into()),
                    hints_zones: Some(format!("zone-{}", i % 3).into()),
                    hints_nodes: None,
                }
            })
            .collect(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

/// (name, clusters, slices): one Service of 100 slices, or 100 Services.
fn shape(one_service: bool) -> (Vec<String>, Vec<Slice>) {
    let mut clusters = Vec::new();
    let mut slices = Vec::new();
    for s in 0..SLICES {
        let svc = if one_service {
            "big".to_string()
        } else {
            format!("svc{s:03}")
        };
        if !one_service || s == 0 {
            clusters.push(format!("{svc}=bench/{svc}:http"));
        }
        slices.push(make_slice(&svc, s, None));
    }
    (clusters, slices)
}

fn in_process(one_service: bool) {
    let (clusters, slices) = shape(one_service);
    let label = if one_service {
        "1 Service x 100 slices"
    } else {
        "100 Services x 1 slice"
    };

    let before = HELD.load(Ordering::Relaxed);
    let mut index = Index::new();
    index.replace(slices.clone());
    let index_bytes = HELD.load(Ordering::Relaxed) - before;
    drop(index);

    let before = HELD.load(Ordering::Relaxed);
    let mut p = Publisher::new(
        clusters.iter().map(|c| c.parse().unwrap()).collect(),
        IpFamily::Auto,
        Default::default(),
    );
    let t = Instant::now();
    let snap = p
        .apply(vec![Update::now(Change::Replace(slices.clone()))])
        .unwrap();
    let first_build = t.elapsed();
    let bytes: usize = snap.table.all().iter().map(|r| r.value().len()).sum();
    let names: Vec<String> = snap.table.names();
    let mut stream = SotwStream::new(std::sync::Arc::new(Names::new(names.clone())), &snap);
    let req = RequestView {
        resource_names: names.into_iter().map(Into::into).collect(),
        type_url: serving_picker_conditions::eds::assignment::CLA_TYPE_URL.into(),
        ..Default::default()
    };
    stream.on_request(&req, &snap, Instant::now());
    stream
        .take(&snap, usize::MAX, Instant::now())
        .response
        .unwrap();
    drop(snap);
    let publisher_bytes = HELD.load(Ordering::Relaxed) - before;

    let mut lat = Vec::with_capacity(CHANGES);
    for n in 0..CHANGES {
        let s = n % SLICES;
        let svc = if one_service {
            "big".to_string()
        } else {
            format!("svc{s:03}")
        };
        let change = make_slice(&svc, s, Some(n));
        let u = Update::now(Change::Apply(change));
        let start = u.received;
        let snap = p.apply(vec![u]).expect("a change");
        stream.on_snapshot(&snap, Instant::now());
        let resp = stream
            .take(&snap, usize::MAX, Instant::now())
            .response
            .expect("a push");
        lat.push(start.elapsed());
        assert_eq!(resp.entries.len(), 1);
    }
    lat.sort();
    println!(
        "bench-conditions | in-process | {label:<24} | change->push p50 {} p99 {} max {} | first build {} | assignment bytes {} | index {:.1} MB | publisher {:.1} MB",
        us(percentile(&lat, 0.5)),
        us(percentile(&lat, 0.99)),
        us(*lat.last().unwrap()),
        us(first_build),
        bytes,
        index_bytes as f64 / 1e6,
        publisher_bytes as f64 / 1e6
    );
}

fn env_path(var: &str, fallback: &str) -> Option<PathBuf> {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(fallback)
    });
    p.is_file().then_some(p)
}

/// `GET path` on a loopback port.
fn http_get(port: u16, path: &str) -> String {
    probe::http_get(SocketAddr::from(([127, 0, 0, 1], port)), path)
}

fn stat(envoy_admin: u16, name: &str) -> Option<f64> {
    let body = http_get(envoy_admin, &format!("/stats?filter=^{name}$"));
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

fn slice_json(s: &Slice) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": s.key.name, "namespace": s.key.namespace,
                     "labels": {"kubernetes.io/service-name": s.service.name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": s.endpoints.iter().map(|e| serde_json::json!({
            "addresses": [e.address.to_string()],
            "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
            "zone": e.zone.as_deref(), "nodeName": e.node_name.as_deref(),
            "hints": {"forZones": e.hints_zones.iter().map(|z| serde_json::json!({"name": z.to_string()})).collect::<Vec<_>>()}
        })).collect::<Vec<_>>()
    })
}

fn write_slice(dir: &Path, s: &Slice) {
    let tmp = dir.join(format!(".{}.json.tmp", s.key.name));
    std::fs::write(&tmp, slice_json(s).to_string()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{}.json", s.key.name))).unwrap();
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn with_envoy() {
    let (Some(envoy), Some(companion)) = (
        env_path("ENVOY_BIN", ".venv/bin/envoy"),
        env_path(
            "SERVING_PICKER_CONDITIONS",
            "target/release/serving-picker-conditions",
        ),
    ) else {
        println!(
            "bench-conditions | envoy | skipped: ENVOY_BIN or SERVING_PICKER_CONDITIONS not found"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("spc-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let slices_dir = dir.join("slices");
    std::fs::create_dir_all(&slices_dir).unwrap();
    let (_, slices) = shape(true);
    for s in &slices {
        write_slice(&slices_dir, s);
    }
    let (xds, metrics, admin) = (free_port(), free_port(), free_port());
    let _c = Kill(
        Command::new(&companion)
            .args(["eds", "--listen", &format!("127.0.0.1:{xds}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .args(["--cluster", "big=bench/big:http", "--slices-dir"])
            .arg(&slices_dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("companion.log")).unwrap(),
            ))
            .spawn()
            .unwrap(),
    );
    let bootstrap = serde_json::json!({
        "node": {"id": "bench", "cluster": "bench"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "dynamic_resources": {"ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}]}},
        "static_resources": {"clusters": [
            {"name": "xds", "type": "STATIC", "connect_timeout": "1s",
             "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                 "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                 "explicit_http_config": {"http2_protocol_options": {}}}},
             "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [
                 {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": xds}}}}]}]}},
            {"name": "big", "type": "EDS", "connect_timeout": "1s",
             "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "ads": {}}}}
        ]}
    });
    let bpath = dir.join("bootstrap.json");
    std::fs::write(&bpath, bootstrap.to_string()).unwrap();
    let _e = Kill(
        Command::new(&envoy)
            .arg("-c")
            .arg(&bpath)
            .args([
                "--concurrency",
                "2",
                "--disable-hot-restart",
                "-l",
                "warning",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("envoy.log")).unwrap(),
            ))
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while stat(admin, "cluster.big.membership_total") != Some(10_000.0) {
        if start.elapsed() > Duration::from_secs(60) {
            println!(
                "bench-conditions | envoy | Envoy never got 10,000 hosts (see {})",
                dir.display()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = start.elapsed();
    let rounds = 20;
    let mut e2e = Vec::new();
    let m0 = http_get(metrics, "/metrics");
    let (sum0, n0) = (
        metric(&m0, "serving_picker_conditions_xds_ack_seconds_sum"),
        metric(&m0, "serving_picker_conditions_xds_ack_seconds_count"),
    );
    for r in 0..rounds {
        let before = stat(admin, "cluster.big.update_success").unwrap_or(0.0);
        let s = make_slice("big", r % SLICES, Some(r % SLICES));
        let t = Instant::now();
        write_slice(&slices_dir, &s);
        while stat(admin, "cluster.big.update_success").unwrap_or(0.0) <= before {
            if t.elapsed() > Duration::from_secs(10) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        e2e.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let m1 = http_get(metrics, "/metrics");
    let (sum1, n1) = (
        metric(&m1, "serving_picker_conditions_xds_ack_seconds_sum"),
        metric(&m1, "serving_picker_conditions_xds_ack_seconds_count"),
    );
    let lag_sum = metric(&m1, "serving_picker_conditions_xds_push_lag_seconds_sum");
    let lag_n = metric(&m1, "serving_picker_conditions_xds_push_lag_seconds_count");
    e2e.sort();
    let acks = n1 - n0;
    println!(
        "bench-conditions | envoy 1.40 | 1 Service x 10,000 endpoints | first full load to Envoy {} ms | \
         file rename -> Envoy updated p50 {} p99 {} ({rounds} changes, 2 ms polling of /stats, 20 ms file debounce) | \
         push -> ACK (Envoy applying) mean {} over {acks} ACKs | change -> push mean {} (companion, incl. file parse)",
        first.as_millis(),
        us(percentile(&e2e, 0.5)),
        us(percentile(&e2e, 0.99)),
        us(Duration::from_secs_f64(if acks > 0.0 { (sum1 - sum0) / acks } else { 0.0 })),
        us(Duration::from_secs_f64(if lag_n > 0.0 { lag_sum / lag_n } else { 0.0 })),
    );
    let rss = probe::status_mb(_c.0.id(), "VmRSS");
    println!("bench-conditions | envoy 1.40 | companion RSS with 10,000 endpoints: {rss:.1} MB");
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    in_process(true);
    in_process(false);
    with_envoy();
}
