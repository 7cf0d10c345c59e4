//! The slice-file source at rest and on a change: the companion binary
//! (`SERVING_PICKER_CONDITIONS`) with `--slices-dir` holding 10 and then
//! 10,000 slice files (one Service each, three endpoints, `--manage ''`),
//! beside a real Envoy (`ENVOY_BIN`) subscribed to one of the Services.
//!
//! For each directory size it prints:
//! - the companion's CPU at rest: user + system time from
//!   `/proc/<pid>/stat` over `SLICES_DIR_REST_SECONDS` (default 20) with
//!   nothing changing, as a share of one core;
//! - change -> Envoy: a slice file written beside and renamed into place
//!   until Envoy's `update_success` for that cluster moves (2 ms polling of
//!   /stats), p50 and max over `SLICES_DIR_CHANGES` changes (default 10),
//!   and the companion's CPU per change;
//! - the full rescans the companion counted
//!   (`serving_picker_conditions_source_file_rescans_total`).
//!
//! Prints figures; asserts nothing about time. `make bench-slices-dir`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serving_picker_xds_load::probe::{self, free_port, metric};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn env_path(var: &str, fallback: &str) -> Option<PathBuf> {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(fallback)
    });
    p.is_file().then_some(p)
}

fn env_num(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn http_get(port: u16, path: &str) -> String {
    probe::http_get(SocketAddr::from(([127, 0, 0, 1], port)), path)
}

fn stat(envoy_admin: u16, name: &str) -> Option<f64> {
    let body = http_get(envoy_admin, &format!("/stats?filter=^{name}$"));
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

/// One slice file: Service `svc-<i>`, three endpoints; `round` moves the
/// third endpoint's address so that each write is a change.
fn slice_json(i: usize, round: usize) -> String {
    let ip = |n: usize| format!("10.{}.{}.{}", (i / 250) % 250, i % 250, n);
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-abcde"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip(1)], "conditions": {"ready": true, "serving": true, "terminating": false}},
            {"addresses": [ip(2)], "conditions": {"ready": true, "serving": true, "terminating": false}},
            {"addresses": [ip(10 + round % 200)], "conditions": {"ready": true, "serving": true, "terminating": false}},
        ]
    })
    .to_string()
}

fn write_slice(dir: &Path, i: usize, round: usize) {
    let tmp = dir.join(format!(".svc-{i}.json.tmp"));
    std::fs::write(&tmp, slice_json(i, round)).unwrap();
    std::fs::rename(&tmp, dir.join(format!("svc-{i}.json"))).unwrap();
}

fn cpu_seconds(pid: u32) -> f64 {
    let (user, system) = probe::cpu_split(&pid.to_string());
    user + system
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn one(files: usize, envoy: &Path, companion: &Path) {
    let dir = std::env::temp_dir().join(format!("spc-slices-dir-{}-{files}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let slices_dir = dir.join("slices");
    std::fs::create_dir_all(&slices_dir).unwrap();
    for i in 0..files {
        write_slice(&slices_dir, i, 0);
    }
    let (xds, metrics, admin) = (free_port(), free_port(), free_port());
    let c = Kill(
        Command::new(companion)
            .args(["eds", "--listen", &format!("127.0.0.1:{xds}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .args(["--manage", "", "--slices-dir"])
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
            {"name": "watched", "type": "EDS", "connect_timeout": "1s",
             "eds_cluster_config": {"service_name": "bench/svc-0:http",
                                    "eds_config": {"resource_api_version": "V3", "ads": {}}}}
        ]}
    });
    let bpath = dir.join("bootstrap.json");
    std::fs::write(&bpath, bootstrap.to_string()).unwrap();
    let _e = Kill(
        Command::new(envoy)
            .arg("-c")
            .arg(&bpath)
            .args([
                "--concurrency",
                "1",
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
    while stat(admin, "cluster.watched.membership_total") != Some(3.0) {
        if start.elapsed() > Duration::from_secs(120) {
            println!(
                "bench-slices-dir | {files} files | Envoy never got the cluster's 3 hosts (see {})",
                dir.display()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = start.elapsed();
    let pid = c.0.id();
    // At rest: nothing changes.
    std::thread::sleep(Duration::from_secs(2));
    let rest = Duration::from_secs(env_num("SLICES_DIR_REST_SECONDS", 20));
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    std::thread::sleep(rest);
    let at_rest = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    // Changes, one at a time.
    let changes = env_num("SLICES_DIR_CHANGES", 10) as usize;
    let cpu1 = cpu_seconds(pid);
    let mut lat = Vec::new();
    let mut lost = 0;
    for round in 1..=changes {
        let before = stat(admin, "cluster.watched.update_success").unwrap_or(0.0);
        let t = Instant::now();
        write_slice(&slices_dir, 0, round);
        loop {
            if stat(admin, "cluster.watched.update_success").unwrap_or(0.0) > before {
                lat.push(t.elapsed());
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                lost += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let cpu_per_change = (cpu_seconds(pid) - cpu1) / changes.max(1) as f64;
    lat.sort();
    let p50 = lat.get(lat.len() / 2).copied().unwrap_or_default();
    let max = lat.last().copied().unwrap_or_default();
    let m = http_get(metrics, "/metrics");
    // Absent (a companion without the counter): 0.
    let rescans = metric(&m, "serving_picker_conditions_source_file_rescans_total").max(0.0) as u64;
    let rss = probe::status_mb(pid, "VmRSS");
    println!(
        "bench-slices-dir | {files:>6} files | CPU at rest {:.2}% of a core over {} s | \
         change -> Envoy p50 {} max {} ({} changes{}) | CPU per change {:.1} ms (incl. 200 ms idle after each) | \
         first load to Envoy {} ms | full rescans {rescans} | RSS {rss:.1} MB",
        at_rest * 100.0,
        rest.as_secs(),
        ms(p50),
        ms(max),
        lat.len(),
        if lost > 0 {
            format!(", {lost} not seen within 30 s")
        } else {
            String::new()
        },
        cpu_per_change * 1e3,
        first.as_millis(),
    );
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let (Some(envoy), Some(companion)) = (
        env_path("ENVOY_BIN", ".venv/bin/envoy"),
        env_path(
            "SERVING_PICKER_CONDITIONS",
            "target/release/serving-picker-conditions",
        ),
    ) else {
        println!("bench-slices-dir | skipped: ENVOY_BIN or SERVING_PICKER_CONDITIONS not found");
        return;
    };
    let sizes: Vec<usize> = std::env::var("SLICES_DIR_FILES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 10_000]);
    for files in sizes {
        one(files, &envoy, &companion);
    }
}
