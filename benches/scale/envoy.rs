//! The Envoy under test and what is read from it: its admin API (the
//! filter's gauges, the two answers the filter reads), its RSS, and request
//! latency through it.

use crate::{fail, Knobs, ADMIN, CLUSTERS_PATH, DUMP_PATH, LISTEN, LOG_FORMAT};
use serving_picker_benches::median;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use support::load::{Load, LoadConfig};
use support::process::Process;

pub fn admin_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], ADMIN))
}

pub fn admin(path: &str) -> support::http::Response {
    support::http::request(admin_addr(), "GET", path, &[], Duration::from_secs(10))
}

/// The filter's gauges and counters the tables report.
#[derive(Clone, Debug, Default)]
pub struct Gauges {
    pub hosts: i64,
    pub bytes: i64,
    pub refresh_busy_us: i64,
    pub admin_bytes: i64,
    pub refresh_ok: i64,
    pub skipped: i64,
    pub refresh_error: i64,
    pub published: i64,
}

impl Gauges {
    pub fn read() -> Gauges {
        let body = admin("/stats?filter=serving_picker").body;
        let mut m: BTreeMap<&str, i64> = BTreeMap::new();
        for l in body.lines() {
            if let Some((k, v)) = l.split_once(": ") {
                if let (Some(k), Ok(v)) = (
                    k.strip_prefix("wasmcustom.serving_picker."),
                    v.trim().parse(),
                ) {
                    m.insert(k, v);
                }
            }
        }
        let g = |k: &str| m.get(k).copied().unwrap_or(0);
        Gauges {
            hosts: g("snapshot.hosts"),
            bytes: g("snapshot.bytes"),
            refresh_busy_us: g("snapshot.refresh_busy_us"),
            admin_bytes: g("snapshot.admin_bytes"),
            refresh_ok: g("snapshot.refresh_ok"),
            skipped: g("snapshot.refresh_skipped_unchanged"),
            refresh_error: g("snapshot.refresh_error"),
            published: g("snapshot.published"),
        }
    }

    /// Full refreshes so far (polls that were not change-gate skips).
    pub fn fulls(&self) -> i64 {
        self.refresh_ok - self.skipped
    }
}

pub fn rss_kb(pid: u32) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

pub fn start_envoy(k: &Knobs, dir: &Path, name: &str) -> Process {
    let log = dir.join(format!("envoy-{name}.log"));
    let args: Vec<String> = [
        "-c",
        &dir.join(format!("bootstrap-{name}.json")).to_string_lossy(),
        "--concurrency",
        "2",
        "--disable-hot-restart",
        "-l",
        "info",
        "--component-log-level",
        "wasm:debug",
        "--log-format",
        LOG_FORMAT,
        "--log-path",
        &log.to_string_lossy(),
        "--file-flush-interval-msec",
        "100",
    ]
    .map(String::from)
    .to_vec();
    let mut p = Process::start(
        &[],
        &k.envoy,
        &args,
        &[],
        dir,
        &format!("envoy-{name}"),
        Some(log),
    )
    .unwrap_or_else(|e| fail(e));
    p.wait_ready(admin_addr(), Duration::from_secs(60))
        .unwrap_or_else(|e| fail(e));
    p
}

/// Polls snapshot.hosts until it is `n`.
pub fn wait_hosts(envoy: &mut Process, n: usize, timeout_s: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    while Instant::now() < deadline {
        if !envoy.is_running() {
            return false;
        }
        if Gauges::read().hosts == n as i64 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Waits for `n` more refresh_ok; the refresh_busy_us after each.
pub fn wait_refreshes(n: u64) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(n * 3 + 10);
    let mut prev = Gauges::read().refresh_ok;
    let (mut seen, mut busy) = (0, Vec::new());
    while seen < n as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let g = Gauges::read();
        if g.refresh_ok > prev {
            busy.push(g.refresh_busy_us);
            seen += g.refresh_ok - prev;
            prev = g.refresh_ok;
        }
    }
    busy
}

/// Sum of update_success over the svc-* clusters: one per EDS file Envoy took in.
pub fn update_success_sum() -> i64 {
    admin("/stats?filter=%5Ecluster%5C.svc-%5B%5E.%5D%2A%5C.update_success%24")
        .body
        .lines()
        .filter_map(|l| {
            l.split_once(": ")
                .and_then(|(_, v)| v.trim().parse::<i64>().ok())
        })
        .sum()
}

/// The two admin answers the filter reads, 3 times each: bytes and ms, medians.
#[derive(Clone, Debug, Default)]
pub struct Curls {
    pub dump_bytes: f64,
    pub dump_ms: f64,
    pub clusters_bytes: f64,
    pub clusters_ms: f64,
}

pub fn admin_curls() -> Curls {
    let timed = |path: &str| {
        let t = Instant::now();
        let r = support::http::request(admin_addr(), "GET", path, &[], Duration::from_secs(30));
        (
            r.body.len() as f64,
            (t.elapsed().as_secs_f64() * 10000.0).round() / 10.0,
        )
    };
    let (mut d, mut c) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        d.push(timed(DUMP_PATH));
        c.push(timed(CLUSTERS_PATH));
    }
    let med = |v: &[(f64, f64)], second: bool| {
        median(
            &v.iter()
                .map(|x| if second { x.1 } else { x.0 })
                .collect::<Vec<_>>(),
        )
    };
    Curls {
        dump_bytes: med(&d, false),
        dump_ms: med(&d, true),
        clusters_bytes: med(&c, false),
        clusters_ms: med(&c, true),
    }
}

#[derive(Clone, Debug, Default)]
pub struct Latency {
    pub n: usize,
    pub errors: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Paced GETs of `path` (`rate` per second in all, over 8 keep-alive
/// connections) for `seconds`: latency from send to full response, in ms.
pub fn paced_load(rate: u64, seconds: f64) -> Latency {
    let load = Load::start(
        SocketAddr::from(([127, 0, 0, 1], LISTEN)),
        LoadConfig {
            timeout: Duration::from_secs(10),
            ..LoadConfig::paced(8, rate as f64 / 8.0, "/lat")
        },
        "latency",
    );
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let report = load.finish();
    let mut ms: Vec<f64> = report
        .records
        .iter()
        .filter(|r| !r.failed())
        .map(|r| r.took.as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if ms.is_empty() {
            return f64::NAN;
        }
        let i = ((p / 100.0 * ms.len() as f64 + 0.5).round() as usize).clamp(1, ms.len()) - 1;
        ms[i]
    };
    Latency {
        n: ms.len(),
        errors: report.failures(),
        p50: pct(50.0),
        p99: pct(99.0),
        max: ms.last().copied().unwrap_or(f64::NAN),
    }
}
