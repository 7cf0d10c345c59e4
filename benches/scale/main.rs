//! `make bench-scale`: the wasm filter's snapshot refresh in real Envoy (1.40,
//! V8, `--concurrency 2`) with many endpoints. Scenarios (clusters x hosts):
//! 1x3 (baseline), 1x10000, 100x100.
//!
//! Per scenario: EDS files (one watched directory per cluster, endpoints
//! 127.1.x.y:8080 that nothing listens on, EndpointSlice metadata ~90% ready,
//! ~5% serving+terminating, ~5% not serving, zones a/b/c as localities,
//! weights 1/2/5) and two bootstraps that differ only in the wasm filter
//! (`{"refresh_interval_ms": 1000}`):
//!   clusters  envoy_admin (this Envoy's admin), real_backend (override_host,
//!             -> a direct_response listener of the same Envoy), svc-N (EDS
//!             from a watched file, override_host with round-robin fallback,
//!             outlier detection as in envoy.yaml)
//!   routes    /c/<cluster>/ -> that cluster (routing check), / -> real_backend
//! Both validated first. Then:
//!   1. without the filter: RSS and request latency at steady state, and the
//!      repeated changes' reference (below);
//!   2. with the filter: start -> /ready -> the first snapshot with every
//!      expected host, the debug log's figures of that refresh, the gauges; a
//!      routing check; ~10 unchanged polls (refresh_busy_us, CPU of Envoy's
//!      threads); the two admin answers the filter reads (bytes, time: Envoy's
//!      rendering on its main thread); request latency during unchanged
//!      refreshes; a 1% rolling-update step with requests running (rename ->
//!      snapshot with the new host count); RSS over more refreshes; and the
//!      repeated changes: the main thread's CPU per change-driven refresh, per
//!      kind of change, "all clusters" (1% of every cluster's pods) and, with
//!      more than one cluster, "one cluster" (10% of one cluster, one EDS
//!      file), each net of the steady rate measured in change-free windows and
//!      set against an Envoy without the filter taking the same changes.
//!      The windows hold no admin call: the filter's refresh lines are read
//!      from Envoy's log, and the main thread's CPU (utime+stime ticks and
//!      schedstat ns of the thread named "envoy") is sampled at their edges.
//!
//! One table of figures, a column per scenario. Exit status non-zero when the
//! filter never reaches the expected host count, or validation fails.
//!
//! Knobs (environment): ENVOY_BIN, SERVING_PICKER_WASM, SCALE_SCENARIOS
//! ("1x3 1x10000 100x100"), SCALE_WORKDIR (.run/bench-scale),
//! SCALE_FULL_TIMEOUT_S (120), SCALE_LOAD_RATE (100 req/s), SCALE_LOAD_SECONDS
//! (5), SCALE_REFRESHES (10), SCALE_CHANGES (5 repeated changes per kind; 0
//! skips them), SCALE_CHANGE_GAP_S (2 s at least between them),
//! SCALE_PERIODIC_S (10: the filter's full_refresh_interval_ms in s).
//! Ports: 127.0.0.1:22000 listener, 22001 admin, 22081 the backend listener.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;
use serde_json::{json, Value};
use serving_picker_benches::{
    die, knob, knob_number, knob_path, median, port_in_use, validate, write_json,
};
use support::bootstrap::{
    bootstrap, direct_response, eds_cluster, file_access_log, http_connection_manager, lb_endpoint,
    listener, override_host_policy, route, static_cluster, wasm_filter,
};
use support::cpu::{self, Sample, Window};
use support::eds::{EdsFile, Endpoint};
use support::load::{Load, LoadConfig};
use support::process::Process;

const BENCH: &str = "bench-scale";
const LISTEN: u16 = 22000;
const ADMIN: u16 = 22001;
const BACKEND: u16 = 22081;
const PORT: u16 = 8080;
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
const PLUGIN_CONFIG: &str = r#"{"refresh_interval_ms": 1000}"#;
const DUMP_PATH: &str =
    "/config_dump?include_eds&mask=static_endpoint_configs,dynamic_endpoint_configs";
const CLUSTERS_PATH: &str = "/clusters?format=json";
/// After the refresh line of a change, before the next change / the end sample.
const SETTLE_MS: i64 = 300;
/// Envoy's log lines with the epoch in milliseconds, so that they compare
/// with this process's clock.
const LOG_FORMAT: &str = "[%E%e][%t][%l][%n] [%g:%#] %v";

fn fail(message: impl std::fmt::Display) -> ! {
    die(BENCH, message)
}

fn say(message: impl std::fmt::Display) {
    eprintln!("{BENCH}: {message}");
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn sleep_until(ms: i64) {
    let d = ms - now_ms();
    if d > 0 {
        std::thread::sleep(Duration::from_millis(d as u64));
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Knobs {
    envoy: PathBuf,
    sp_wasm: PathBuf,
    scenarios: Vec<(usize, usize)>,
    work: PathBuf,
    full_timeout_s: u64,
    load_rate: u64,
    load_seconds: u64,
    refreshes: u64,
    changes: u64,
    gap_s: u64,
    periodic_s: u64,
}

impl Knobs {
    fn read() -> Result<Knobs, String> {
        let mut scenarios = Vec::new();
        for sc in knob("SCALE_SCENARIOS", "1x3 1x10000 100x100").split_whitespace() {
            let parsed = sc
                .split_once('x')
                .and_then(|(c, h)| Some((c.parse().ok()?, h.parse().ok()?)))
                .filter(|&(c, h): &(usize, usize)| c > 0 && h > 0);
            scenarios.push(parsed.ok_or(format!("bad scenario '{sc}' (want CLUSTERSxHOSTS)"))?);
        }
        Ok(Knobs {
            envoy: knob_path("ENVOY_BIN", ".venv/bin/envoy"),
            sp_wasm: knob_path("SERVING_PICKER_WASM", "target/serving_picker.wasm"),
            scenarios,
            work: knob_path("SCALE_WORKDIR", ".run/bench-scale"),
            full_timeout_s: knob_number("SCALE_FULL_TIMEOUT_S", 120)?,
            load_rate: knob_number("SCALE_LOAD_RATE", 100)?,
            load_seconds: knob_number("SCALE_LOAD_SECONDS", 5)?,
            refreshes: knob_number("SCALE_REFRESHES", 10)?,
            changes: knob_number("SCALE_CHANGES", 5)?,
            gap_s: knob_number("SCALE_CHANGE_GAP_S", 2)?,
            periodic_s: knob_number("SCALE_PERIODIC_S", 10)?,
        })
    }

    /// The change-free windows: as long as the phase's planned K x GAP, but
    /// ending before the next periodic full refresh (it starts after one).
    fn base_s(&self) -> u64 {
        (self.changes * self.gap_s)
            .min(self.periodic_s.saturating_sub(3))
            .max(2)
    }
}

// ------------------------------------------------------------------ endpoints

/// A small deterministic generator (xorshift64*): the same endpoints in every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pod {
    Ready,
    ServingTerminating,
    TerminatingNotServing,
    NotReady,
}

impl Pod {
    /// ~90% ready, ~5% serving+terminating, ~5% not serving.
    fn pick(rng: &mut Rng) -> Pod {
        let r = rng.unit();
        if r < 0.90 {
            Pod::Ready
        } else if r < 0.95 {
            Pod::ServingTerminating
        } else if rng.unit() < 0.5 {
            Pod::TerminatingNotServing
        } else {
            Pod::NotReady
        }
    }
}

#[derive(Clone, Debug)]
struct Host {
    g: usize,
    pod: Pod,
    zone: usize,
    weight: u32,
}

impl Host {
    /// Global host index -> 127.1.x.y (nothing listens there).
    fn ip(&self) -> Ipv4Addr {
        let g = self.g;
        Ipv4Addr::new(
            127,
            (1 + g / 62500) as u8,
            ((g / 250) % 250) as u8,
            (g % 250 + 1) as u8,
        )
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip(), PORT))
    }

    fn endpoint(&self) -> Endpoint {
        let a = self.addr();
        let e = match self.pod {
            Pod::Ready => Endpoint::serving(a),
            Pod::ServingTerminating => Endpoint::serving_terminating(a),
            Pod::TerminatingNotServing => Endpoint::terminating_not_serving(a),
            Pod::NotReady => Endpoint::not_serving(a),
        };
        e.zone(ZONES[self.zone]).weight(self.weight)
    }
}

struct Cluster {
    name: String,
    hosts: Vec<Host>,
    eds: EdsFile,
}

impl Cluster {
    /// What the filter's plan keeps (all priority 0, no local_zone): ready
    /// hosts if any, else serving ones (serving+terminating), else none.
    fn tier(&self) -> Vec<&Host> {
        let ready: Vec<&Host> = self.hosts.iter().filter(|h| h.pod == Pod::Ready).collect();
        if !ready.is_empty() {
            return ready;
        }
        self.hosts
            .iter()
            .filter(|h| h.pod == Pod::ServingTerminating)
            .collect()
    }

    /// The ClusterLoadAssignment: one locality per zone.
    fn assignment(&self) -> Value {
        let mut by_zone: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
        for h in &self.hosts {
            by_zone
                .entry(h.zone)
                .or_default()
                .push(h.endpoint().to_lb_endpoint());
        }
        let localities: Vec<Value> = by_zone
            .into_iter()
            .map(|(z, eps)| json!({"locality": {"region": "region-1", "zone": ZONES[z]}, "priority": 0, "lb_endpoints": eps}))
            .collect();
        json!({"cluster_name": self.name, "endpoints": localities})
    }
}

struct State {
    clusters: Vec<Cluster>,
    next_g: usize,
}

/// What a change did, and what the snapshot must then hold.
struct Change {
    expect_hosts: usize,
    flipped: usize,
    added: usize,
    files: usize,
    renamed_ms: i64,
}

impl State {
    fn generate(dir: &Path, nclusters: usize, nhosts: usize) -> State {
        let mut rng = Rng::new((1000 * nclusters + nhosts) as u64);
        let width = 3.max((nclusters.saturating_sub(1)).to_string().len());
        let mut g = 0;
        let mut clusters = Vec::new();
        for c in 0..nclusters {
            let mut hosts = Vec::new();
            for j in 0..nhosts {
                let pod = if nhosts == 3 {
                    // The baseline: like the demo, one of each.
                    [Pod::Ready, Pod::ServingTerminating, Pod::NotReady][j]
                } else if j == 0 {
                    Pod::Ready
                } else {
                    Pod::pick(&mut rng)
                };
                let zone = rng.below(3);
                let r = rng.unit();
                let weight = if r < 0.80 {
                    1
                } else if r < 0.95 {
                    2
                } else {
                    5
                };
                hosts.push(Host {
                    g,
                    pod,
                    zone,
                    weight,
                });
                g += 1;
            }
            let name = format!("svc-{c:0width$}");
            let eds = EdsFile::create_empty(&name, &dir.join("eds").join(&name));
            let cluster = Cluster { name, hosts, eds };
            cluster.eds.write_assignment(cluster.assignment());
            clusters.push(cluster);
        }
        State {
            clusters,
            next_g: g,
        }
    }

    /// The tiers' hosts, plus real_backend's (STATIC, one host without
    /// metadata: serving); envoy_admin is not managed.
    fn expected_hosts(&self) -> usize {
        self.clusters.iter().map(|c| c.tier().len()).sum::<usize>() + 1
    }

    fn endpoints(&self) -> usize {
        self.clusters.iter().map(|c| c.hosts.len()).sum()
    }

    /// A rolling-update step on `fraction` of every cluster's endpoints (at
    /// least one each), or of cluster `only` alone: that many ready pods
    /// become serving+terminating and as many new, not yet ready pods
    /// appear. Every file is written first, then all renamed back to back.
    fn change(&mut self, fraction: f64, only: Option<usize>) -> Change {
        let mut rng = Rng::new(7);
        let (mut flipped, mut added) = (0, 0);
        let n = self.clusters.len();
        let picked: Vec<usize> = match only {
            Some(i) => vec![i % n],
            None => (0..n).collect(),
        };
        let mut staged = Vec::new();
        for i in picked {
            let c = &mut self.clusters[i];
            let k = 1.max((c.hosts.len() as f64 * fraction).round() as usize);
            let mut ready: Vec<usize> = (0..c.hosts.len())
                .filter(|&j| c.hosts[j].pod == Pod::Ready)
                .collect();
            for _ in 0..k.min(ready.len()) {
                let j = ready.swap_remove(rng.below(ready.len()));
                c.hosts[j].pod = Pod::ServingTerminating;
                flipped += 1;
            }
            for _ in 0..k {
                c.hosts.push(Host {
                    g: self.next_g,
                    pod: Pod::NotReady,
                    zone: rng.below(3),
                    weight: 1,
                });
                self.next_g += 1;
                added += 1;
            }
            staged.push(c.eds.stage_assignment(c.assignment()));
        }
        let files = staged.len();
        for s in staged {
            s.commit();
        }
        Change {
            expect_hosts: self.expected_hosts(),
            flipped,
            added,
            files,
            renamed_ms: now_ms(),
        }
    }

    /// A copy of the pods' states, to put back after the reference run.
    fn snapshot(&self) -> (Vec<Vec<Host>>, usize) {
        (
            self.clusters.iter().map(|c| c.hosts.clone()).collect(),
            self.next_g,
        )
    }

    fn restore(&mut self, (hosts, next_g): (Vec<Vec<Host>>, usize)) {
        for (c, h) in self.clusters.iter_mut().zip(hosts) {
            c.hosts = h;
            c.eds.write_assignment(c.assignment());
        }
        self.next_g = next_g;
    }
}

fn scale_bootstrap(dir: &Path, names: &[String], wasm: Option<&Path>) -> Value {
    let outlier = json!({
        "consecutive_5xx": 5, "consecutive_local_origin_failure": 2,
        "split_external_local_origin_errors": true, "interval": "1s", "base_ejection_time": "10s"
    });
    let mut clusters = vec![static_cluster("envoy_admin", vec![lb_endpoint(ADMIN)])];
    let mut real = static_cluster("real_backend", vec![lb_endpoint(BACKEND)]);
    real["load_balancing_policy"] = override_host_policy(support::OVERRIDE_HEADER);
    clusters.push(real);
    let mut routes = Vec::new();
    for n in names {
        let mut c = eds_cluster(n, &dir.join("eds").join(n));
        // As in envoy.yaml: an ejected host is read as not serving.
        c["outlier_detection"] = outlier.clone();
        c["load_balancing_policy"] = override_host_policy(support::OVERRIDE_HEADER);
        clusters.push(c);
        routes.push(route(&format!("/c/{n}/"), n));
    }
    routes.push(route("/", "real_backend"));
    let filters = wasm
        .map(|w| vec![wasm_filter("serving_picker", None, w, Some(PLUGIN_CONFIG))])
        .unwrap_or_default();
    let access = file_access_log(
        &dir.join("access.log"),
        "ACCESS %REQ(:PATH)% code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% cluster=%UPSTREAM_CLUSTER% override=%REQ(X-GATEWAY-DESTINATION-ENDPOINT)% upstream=%UPSTREAM_HOST%\n",
    );
    let main = http_connection_manager("ingress", routes, filters, json!({"access_log": access}));
    // The one real upstream: a direct_response listener of the same Envoy.
    let backend = http_connection_manager(
        "backend",
        vec![direct_response("/", "ok\n")],
        Vec::new(),
        json!({}),
    );
    bootstrap(
        "bench-scale",
        ADMIN,
        vec![
            listener("main", LISTEN, main),
            listener("backend", BACKEND, backend),
        ],
        clusters,
    )
}

// ------------------------------------------------------------------ Envoy and its admin

fn admin_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], ADMIN))
}

fn admin(path: &str) -> support::http::Response {
    support::http::request(admin_addr(), "GET", path, &[], Duration::from_secs(10))
}

/// The filter's gauges and counters the tables report.
#[derive(Clone, Debug, Default)]
struct Gauges {
    hosts: i64,
    bytes: i64,
    refresh_busy_us: i64,
    admin_bytes: i64,
    refresh_ok: i64,
    skipped: i64,
    refresh_error: i64,
    published: i64,
}

impl Gauges {
    fn read() -> Gauges {
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
    fn fulls(&self) -> i64 {
        self.refresh_ok - self.skipped
    }
}

fn rss_kb(pid: u32) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn start_envoy(k: &Knobs, dir: &Path, name: &str) -> Process {
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
fn wait_hosts(envoy: &mut Process, n: usize, timeout_s: u64) -> bool {
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
fn wait_refreshes(n: u64) -> Vec<i64> {
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
fn update_success_sum() -> i64 {
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
struct Curls {
    dump_bytes: f64,
    dump_ms: f64,
    clusters_bytes: f64,
    clusters_ms: f64,
}

fn admin_curls() -> Curls {
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

// ------------------------------------------------------------------ latency

#[derive(Clone, Debug, Default)]
struct Latency {
    n: usize,
    errors: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

/// Paced GETs of `path` (`rate` per second in all, over 8 keep-alive
/// connections) for `seconds`: latency from send to full response, in ms.
fn paced_load(rate: u64, seconds: f64) -> Latency {
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

// ------------------------------------------------------------------ the log

#[derive(Clone, Debug)]
struct Refresh {
    ms: i64,
    vm_us: i64,
    e2e_ms: i64,
    admin_bytes: i64,
    narrowed: bool,
    published: bool,
}

#[derive(Clone, Debug, Default)]
struct LogScan {
    refreshes: Vec<Refresh>,
    leaders: Vec<String>,
    warnings: Vec<String>,
    /// The start of each full refresh and the change gate's reason.
    fulls: Vec<(i64, String)>,
}

impl LogScan {
    fn published(&self) -> Vec<&Refresh> {
        self.refreshes.iter().filter(|r| r.published).collect()
    }
}

struct Patterns {
    refresh: Regex,
    leader: Regex,
    full: Regex,
}

impl Patterns {
    fn new() -> Patterns {
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| fail(e));
        Patterns {
            refresh: re(
                r"^\[(\d+)\]\[(\d+)\].*serving_picker: refresh: (\d+) clusters, (\d+) admin bytes, (\d+) us in the VM, (\d+) ms end to end(?:, narrowed to (\d+) changed clusters)?",
            ),
            leader: re(r"^\[\d+\]\[(\d+)\].*serving_picker: context (\w+) is now the admin poller"),
            full: re(r"^\[(\d+)\].*serving_picker: (?:full )?refresh \((\w+)\)"),
        }
    }

    /// Refresh lines, leader changes and warnings from byte `offset` on.
    fn scan(&self, log: &Path, offset: u64) -> LogScan {
        let mut s = LogScan::default();
        let mut pub_ms: Option<i64> = None;
        for line in read_from(log, offset).lines() {
            let num = |c: Option<regex::Match>| c.and_then(|m| m.as_str().parse::<i64>().ok());
            if let Some(m) = self.refresh.captures(line) {
                let ms = num(m.get(1)).unwrap_or(0);
                // The publish line comes just before the refresh line: the same callback.
                let published = pub_ms.is_some_and(|p| (0..=100).contains(&(ms - p)));
                s.refreshes.push(Refresh {
                    ms,
                    admin_bytes: num(m.get(4)).unwrap_or(0),
                    vm_us: num(m.get(5)).unwrap_or(0),
                    e2e_ms: num(m.get(6)).unwrap_or(0),
                    narrowed: m.get(7).is_some(),
                    published,
                });
                pub_ms = None;
                continue;
            }
            if line.starts_with('[') && line.contains("serving_picker: published snapshot") {
                let ms = line[1..]
                    .split(']')
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                match s.refreshes.last_mut() {
                    Some(last) if !last.published && (0..=100).contains(&(ms - last.ms)) => {
                        last.published = true
                    }
                    _ => pub_ms = Some(ms),
                }
                continue;
            }
            if let Some(m) = self.full.captures(line) {
                s.fulls.push((num(m.get(1)).unwrap_or(0), m[2].to_string()));
                continue;
            }
            if let Some(m) = self.leader.captures(line) {
                s.leaders.push(m[1].to_string());
            }
            let bad = ["][warning]", "][error]", "][critical]"]
                .iter()
                .any(|l| line.contains(l));
            if bad && line.contains("serving_picker") {
                s.warnings.push(line.chars().take(400).collect());
            }
        }
        s
    }

    /// Waits for a refresh line (or, `periodic`, the start of a periodic full
    /// refresh) logged at or after `since` ms, from byte `offset` on: no admin
    /// call, so no work for Envoy's main thread.
    fn wait(
        &self,
        log: &Path,
        offset: u64,
        since: i64,
        timeout_s: u64,
        periodic: bool,
    ) -> Option<i64> {
        let deadline = Instant::now() + Duration::from_secs(timeout_s);
        let mut pos = offset;
        let mut partial = String::new();
        loop {
            let chunk = read_from(log, pos);
            pos += chunk.len() as u64;
            partial.push_str(&chunk);
            while let Some(nl) = partial.find('\n') {
                let line: String = partial.drain(..=nl).collect();
                let found = if periodic {
                    self.full
                        .captures(&line)
                        .filter(|m| &m[2] == "Periodic")
                        .and_then(|m| m[1].parse::<i64>().ok())
                } else {
                    self.refresh
                        .captures(&line)
                        .and_then(|m| m[1].parse::<i64>().ok())
                };
                if let Some(ms) = found.filter(|ms| *ms >= since) {
                    return Some(ms);
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

// ------------------------------------------------------------------ repeated changes

/// The kinds of repeated change: every cluster 1% (every EDS file changes),
/// and with more than one cluster one cluster 10% (one EDS file: one
/// Deployment's rolling update; the i-th change takes cluster i).
const KINDS: [(&str, &str); 2] = [
    ("all", "all clusters, 1% each"),
    ("one", "one cluster, 10%"),
];

fn kinds(nclusters: usize) -> &'static [(&'static str, &'static str)] {
    if nclusters > 1 {
        &KINDS
    } else {
        &KINDS[..1]
    }
}

fn change_of(state: &mut State, kind: &str, i: usize) -> Change {
    match kind {
        "all" => state.change(0.01, None),
        _ => state.change(0.1, Some(i)),
    }
}

/// The no-filter reference of one kind: Envoy's own main-thread cost of
/// taking the same EDS changes in.
struct Reference {
    idle: Window,
    phase: Window,
    files: usize,
    updates: i64,
}

/// One kind's repeated-change phase with the filter.
struct Repeated {
    k: usize,
    files: usize,
    flipped: usize,
    added: usize,
    hosts_late: bool,
    fallback_waits: usize,
    renames: Vec<i64>,
    base: Window,
    periodic: Window,
    phase: Window,
    /// The gauges at the window edges: a, m, b, p0, p1.
    stats: [Gauges; 5],
    log: LogScan,
}

/// The figures of one kind (see the header).
struct RepFigures {
    ms: f64,
    ms_ns: Option<f64>,
    periodic_ms: f64,
    periodic_ms_ns: Option<f64>,
    base_rate_ms_s: f64,
    base_ok: bool,
    periodic_ok: bool,
    lines: usize,
    published: usize,
    narrowed: usize,
    others: BTreeMap<String, f64>,
    fulls: i64,
    reasons: BTreeMap<String, usize>,
    unchanged: i64,
    ms_wo_unchanged: f64,
    ms_ns_wo_unchanged: Option<f64>,
    flags: Vec<String>,
    skips_phase: i64,
    skips_base: i64,
    latency: Vec<f64>,
    vm_us: Vec<f64>,
    admin_bytes: Vec<f64>,
    e2e_ms: Vec<f64>,
    reference: Option<(f64, Option<f64>, bool)>,
}

/// The main thread's CPU in window `w` in ms, from ticks and from schedstat
/// ns; minus the rate of `rate` over `w`'s length when given.
fn win_ms(w: &Window, rate: Option<&Window>, hz: f64) -> (f64, Option<f64>) {
    let t = w.main_ticks - rate.map_or(0.0, |r| r.main_ticks / r.secs * w.secs);
    let n = match (w.main_ns, rate.map(|r| r.main_ns)) {
        (Some(n), None) => Some(n),
        (Some(n), Some(Some(rn))) => Some(n - rn / rate.map_or(1.0, |r| r.secs) * w.secs),
        _ => None,
    };
    (t * 1000.0 / hz, n.map(|x| x / 1e6))
}

fn rep_figures(rep: &Repeated, reference: Option<&Reference>, hz: f64) -> RepFigures {
    let k = rep.k.max(1) as f64;
    let [a, m, b, p0, p1] = &rep.stats;
    let (t, n) = win_ms(&rep.phase, Some(&rep.base), hz);
    let (periodic_ms, periodic_ms_ns) = win_ms(&rep.periodic, Some(&rep.base), hz);
    let (lo, hi) = (
        (rep.phase.from * 1000.0) as i64,
        (rep.phase.to * 1000.0) as i64,
    );
    let lines: Vec<&Refresh> = rep
        .log
        .refreshes
        .iter()
        .filter(|x| (lo..=hi).contains(&x.ms))
        .collect();
    let mut others = BTreeMap::new();
    for (name, (_, pn)) in &rep.phase.by_name {
        if name == "envoy" {
            continue;
        }
        let bn = rep.base.by_name.get(name).map_or(0.0, |x| x.1);
        others.insert(
            name.clone(),
            (pn - bn / rep.base.secs * rep.phase.secs) / 1e6 / k,
        );
    }
    let mut reasons = BTreeMap::new();
    for (ms, reason) in &rep.log.fulls {
        if (lo..=hi).contains(ms) {
            *reasons.entry(reason.clone()).or_insert(0) += 1;
        }
    }
    let fulls = p1.fulls() - p0.fulls();
    // Full refreshes that found no change (periodic ones): their share, taken out.
    let replanned = lines.iter().filter(|x| !x.published && !x.narrowed).count() as i64;
    let unchanged = (fulls - lines.len() as i64).max(0) + replanned;
    let ms = t / k;
    let ms_ns = n.map(|x| x / k);
    let mut flags = Vec::new();
    if rep.fallback_waits > 0 {
        flags.push(format!(
            "{} change(s) waited by polling /stats (admin calls in the phase)",
            rep.fallback_waits
        ));
    }
    if rep.hosts_late {
        flags.push("snapshot.hosts reached the expected count only after the phase".into());
    }
    // rename -> the last refresh line before the next rename
    let mut latency = Vec::new();
    for (i, t0) in rep.renames.iter().enumerate() {
        let next = rep.renames.get(i + 1).copied().unwrap_or(hi);
        if let Some(last) = lines
            .iter()
            .filter(|x| *t0 <= x.ms && x.ms < next)
            .map(|x| x.ms)
            .max()
        {
            latency.push((last - t0) as f64);
        }
    }
    RepFigures {
        ms,
        ms_ns,
        periodic_ms,
        periodic_ms_ns,
        base_rate_ms_s: win_ms(&rep.base, None, hz).0 / rep.base.secs,
        base_ok: m.fulls() == a.fulls(),
        periodic_ok: b.fulls() - m.fulls() == 1,
        lines: lines.len(),
        published: lines.iter().filter(|x| x.published).count(),
        narrowed: lines.iter().filter(|x| x.narrowed).count(),
        others,
        fulls,
        reasons,
        unchanged,
        ms_wo_unchanged: ms - unchanged as f64 * periodic_ms / k,
        ms_ns_wo_unchanged: match (ms_ns, periodic_ms_ns) {
            (Some(a), Some(p)) => Some(a - unchanged as f64 * p / k),
            _ => None,
        },
        flags,
        skips_phase: p1.skipped - p0.skipped,
        skips_base: m.skipped - a.skipped,
        latency,
        vm_us: lines.iter().map(|x| x.vm_us as f64).collect(),
        admin_bytes: lines.iter().map(|x| x.admin_bytes as f64).collect(),
        e2e_ms: lines.iter().map(|x| x.e2e_ms as f64).collect(),
        reference: reference.map(|r| {
            let (rt, rn) = win_ms(&r.phase, Some(&r.idle), hz);
            (rt / k, rn.map(|x| x / k), r.updates == r.files as i64)
        }),
    }
}

// ------------------------------------------------------------------ a scenario

/// Everything a scenario measured; None where it did not get that far.
#[derive(Default)]
struct Scenario {
    name: String,
    nclusters: usize,
    nhosts: usize,
    loadavg: String,
    expect_clusters: usize,
    expect_hosts: usize,
    endpoints: usize,
    eds_bytes: u64,
    start_to_ready_ms: Option<i64>,
    hosts_at_ready: Option<i64>,
    ready_to_full_ms: Option<i64>,
    rss: BTreeMap<&'static str, i64>,
    rss_series: Vec<i64>,
    g_first: Option<Gauges>,
    first: LogScan,
    steady_busy: Vec<i64>,
    steady_log: LogScan,
    cpu_steady: Option<(f64, f64, f64, f64, f64)>,
    curl: Option<Curls>,
    curl_nofilter: Option<Curls>,
    lat: BTreeMap<&'static str, Latency>,
    change: Option<(Change, Option<i64>, LogScan)>,
    after_busy: Vec<i64>,
    errors: BTreeMap<&'static str, i64>,
    rep: BTreeMap<&'static str, Repeated>,
    reference: BTreeMap<&'static str, Reference>,
    routing: Option<String>,
    g_end: Option<Gauges>,
    leader: Option<String>,
    warnings: Vec<String>,
    failed: bool,
}

struct Run<'a> {
    k: &'a Knobs,
    hz: f64,
    re: Patterns,
    dir: PathBuf,
    state: State,
}

impl Run<'_> {
    /// The reference (no filter): a change-free window, then CHANGES changes
    /// of `kind` GAP apart, the same as the filter run makes later.
    fn reference_changes(&mut self, envoy: &Process, kind: &str) -> Reference {
        let gap_ms = (self.k.gap_s * 1000) as i64;
        let u0 = update_success_sum();
        let a = Sample::take(envoy.pid());
        std::thread::sleep(Duration::from_secs(self.k.base_s()));
        let m = Sample::take(envoy.pid());
        let (mut files, mut t_ren) = (0, None);
        for i in 1..=self.k.changes as usize {
            if let Some(t) = t_ren {
                sleep_until(t + gap_ms);
            }
            let c = change_of(&mut self.state, kind, i);
            files += c.files;
            t_ren = Some(c.renamed_ms);
        }
        sleep_until(t_ren.unwrap_or_else(now_ms) + gap_ms);
        let b = Sample::take(envoy.pid());
        let updates = update_success_sum() - u0;
        say(format!(
            "no filter, {} x '{kind}': {files} EDS files, update_success +{updates}",
            self.k.changes
        ));
        Reference {
            idle: Window::between(&a, &m, "envoy"),
            phase: Window::between(&m, &b, "envoy"),
            files,
            updates,
        }
    }

    /// One kind with the filter: the steady windows, then the phase of changes.
    fn repeated(
        &mut self,
        envoy: &mut Process,
        log: &Path,
        kind: &str,
        failed: &mut bool,
    ) -> Repeated {
        let k = self.k;
        let (gap_ms, timeout_s) = ((k.gap_s * 1000) as i64, 3 * k.periodic_s + 60);
        let off_rep = file_len(log);
        // Wait for a full refresh (a periodic one) to end.
        let f0 = Gauges::read().fulls();
        let deadline = Instant::now() + Duration::from_secs(timeout_s);
        let mut seen = false;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            if Gauges::read().fulls() > f0 {
                seen = true;
                break;
            }
        }
        if !seen {
            say(format!("'{kind}': no full refresh within {timeout_s} s (SCALE_PERIODIC_S?); steady windows unchecked"));
        }
        std::thread::sleep(Duration::from_millis(200));
        let pid = envoy.pid();
        let s_a = Gauges::read();
        let a = Sample::take(pid);
        std::thread::sleep(Duration::from_secs(k.base_s()));
        let m = Sample::take(pid);
        let s_m = Gauges::read();
        let m2 = Sample::take(pid);
        // The next periodic full refresh, then time for it to end.
        if self
            .re
            .wait(log, file_len(log), now_ms(), timeout_s, true)
            .is_none()
        {
            say(format!(
                "'{kind}': no periodic full refresh seen; its window is a steady one"
            ));
        }
        std::thread::sleep(Duration::from_millis(2500));
        let b = Sample::take(pid);
        let s_b = Gauges::read();

        let off_phase = file_len(log);
        let s_p0 = Gauges::read();
        let p0 = Sample::take(pid);
        let (mut renames, mut t_seen, mut fallback) = (Vec::new(), 0, 0);
        let (mut files, mut flipped, mut added, mut expect) = (0, 0, 0, 0);
        for i in 1..=k.changes as usize {
            if let Some(t) = renames.last() {
                sleep_until((t + gap_ms).max(t_seen + SETTLE_MS));
            }
            let c = change_of(&mut self.state, kind, i);
            renames.push(c.renamed_ms);
            files += c.files;
            flipped += c.flipped;
            added += c.added;
            expect = c.expect_hosts;
            if self
                .re
                .wait(log, off_phase, c.renamed_ms, k.full_timeout_s, false)
                .is_none()
            {
                // No refresh line: wait on the gauge instead (admin calls in the phase: flagged).
                fallback += 1;
                wait_hosts(envoy, expect, k.full_timeout_s);
            }
            t_seen = now_ms();
        }
        if let Some(t) = renames.last() {
            sleep_until((t + gap_ms).max(t_seen + SETTLE_MS));
        }
        let p1 = Sample::take(pid);
        let s_p1 = Gauges::read();
        let hosts_late = s_p1.hosts != expect as i64;
        if hosts_late && !wait_hosts(envoy, expect, k.full_timeout_s) {
            *failed = true;
            say(format!(
                "FAILED: after {} x '{kind}' snapshot.hosts never reached {expect} (now {})",
                k.changes,
                Gauges::read().hosts
            ));
        }
        std::thread::sleep(Duration::from_millis(300)); // the log flush
        let rep = Repeated {
            k: k.changes as usize,
            files,
            flipped,
            added,
            hosts_late,
            fallback_waits: fallback,
            renames,
            base: Window::between(&a, &m, "envoy"),
            periodic: Window::between(&m2, &b, "envoy"),
            phase: Window::between(&p0, &p1, "envoy"),
            stats: [s_a, s_m, s_b, s_p0, s_p1],
            log: self.re.scan(log, off_rep),
        };
        let f = rep_figures(&rep, None, self.hz);
        say(format!(
            "{} x '{kind}' ({files} EDS files): main thread {:.0} ms per change (schedstat {}){}; rename -> refreshed median {} ms; {} full refreshes, {} refresh lines",
            k.changes,
            f.ms,
            f.ms_ns.map_or("-".into(), |v| format!("{v:.0}")),
            if f.base_ok { "" } else { " (steady window held a full refresh!)" },
            if f.latency.is_empty() { "-".into() } else { format!("{:.0}", median(&f.latency)) },
            f.fulls,
            f.lines
        ));
        rep
    }
}

fn run_scenario(k: &Knobs, hz: f64, nclusters: usize, nhosts: usize) -> Scenario {
    let name = format!("{nclusters}x{nhosts}");
    let dir = k.work.join(&name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(e));
    let mut r = Scenario {
        name: name.clone(),
        nclusters,
        nhosts,
        loadavg: loadavg(),
        ..Scenario::default()
    };
    say(format!(
        "[{name}] generating {nclusters} x {nhosts} endpoints"
    ));
    let state = State::generate(&dir, nclusters, nhosts);
    r.expect_clusters = nclusters + 1;
    r.expect_hosts = state.expected_hosts();
    r.endpoints = state.endpoints();
    r.eds_bytes = state.clusters.iter().map(|c| file_len(c.eds.path())).sum();
    let names: Vec<String> = state.clusters.iter().map(|c| c.name.clone()).collect();
    for (which, wasm) in [("filter", Some(k.sp_wasm.as_path())), ("nofilter", None)] {
        let p = dir.join(format!("bootstrap-{which}.json"));
        write_json(&p, &scale_bootstrap(&dir, &names, wasm)).unwrap_or_else(|e| fail(e));
        validate(&k.envoy, &p).unwrap_or_else(|e| fail(format!("[{name}] {e}")));
    }
    say(format!(
        "[{name}] bootstraps validate; {} endpoints, expecting {} hosts in {} clusters",
        r.endpoints, r.expect_hosts, r.expect_clusters
    ));
    let mut run = Run {
        k,
        hz,
        re: Patterns::new(),
        dir: dir.clone(),
        state,
    };

    // ---- the reference: no filter
    let mut envoy = start_envoy(k, &dir, "nofilter");
    std::thread::sleep(Duration::from_secs(2));
    r.rss.insert("nofilter", rss_kb(envoy.pid()));
    r.curl_nofilter = Some(admin_curls());
    r.lat
        .insert("nofilter", paced_load(k.load_rate, k.load_seconds as f64));
    if k.changes > 0 {
        // The same changes as the filter run below (the 1% step first), then the files put back.
        let saved = run.state.snapshot();
        run.state.change(0.01, None);
        std::thread::sleep(Duration::from_secs(k.gap_s));
        for (kind, _) in kinds(nclusters) {
            let reference = run.reference_changes(&envoy, kind);
            r.reference.insert(kind, reference);
        }
        envoy.stop();
        run.state.restore(saved);
    }
    envoy.stop();

    // ---- with the filter
    let log = dir.join("envoy-filter.log");
    let t0 = now_ms();
    let mut envoy = start_envoy(k, &dir, "filter");
    let t_ready = now_ms();
    r.rss.insert("ready", rss_kb(envoy.pid()));
    r.hosts_at_ready = Some(Gauges::read().hosts);
    r.start_to_ready_ms = Some(t_ready - t0);
    say(format!(
        "[{name}] ready after {} ms; waiting for {} hosts in the snapshot",
        t_ready - t0,
        r.expect_hosts
    ));
    if !wait_hosts(&mut envoy, r.expect_hosts, k.full_timeout_s) {
        r.failed = true;
        say(format!(
            "[{name}] FAILED: snapshot.hosts never reached {} (now {})",
            r.expect_hosts,
            Gauges::read().hosts
        ));
        r.g_end = Some(Gauges::read());
        r.first = run.re.scan(&log, 0);
        return r;
    }
    let t_full = now_ms();
    r.ready_to_full_ms = Some(t_full - t_ready);
    r.rss.insert("full", rss_kb(envoy.pid()));
    r.g_first = Some(Gauges::read());
    std::thread::sleep(Duration::from_millis(300)); // the log flush
    r.first = run.re.scan(&log, 0);
    say(format!(
        "[{name}] full snapshot {} ms after ready",
        t_full - t_ready
    ));

    // ---- unchanged refreshes
    let a = Sample::take(envoy.pid());
    let off_steady = file_len(&log);
    r.steady_busy = wait_refreshes(k.refreshes);
    let b = Sample::take(envoy.pid());
    let w = Window::between(&a, &b, "envoy");
    let pct = |ticks: f64| 100.0 * ticks / hz / w.secs;
    let envoy_ticks: f64 = w.by_name.values().map(|x| x.0).sum();
    r.cpu_steady = Some((
        pct(w.main_ticks),
        pct(w.ticks_named("wrk:")),
        pct(envoy_ticks),
        pct(w.machine_ticks),
        pct(w.machine_ticks - envoy_ticks),
    ));
    r.rss.insert("steady", rss_kb(envoy.pid()));
    r.steady_log = run.re.scan(&log, off_steady);
    r.errors.insert("steady", Gauges::read().refresh_error);
    say(format!(
        "[{name}] steady refreshes busy_us: {:?}",
        r.steady_busy
    ));

    // ---- admin output, rendered by Envoy's main thread
    r.curl = Some(admin_curls());
    let _ = std::fs::write(dir.join("config_dump.json"), admin(DUMP_PATH).body);
    let _ = std::fs::write(dir.join("clusters.json"), admin(CLUSTERS_PATH).body);
    r.errors.insert("curls", Gauges::read().refresh_error);

    // ---- request latency during unchanged refreshes
    r.lat
        .insert("steady", paced_load(k.load_rate, k.load_seconds as f64));

    // ---- a 1% rolling-update step, requests running
    let off_change = file_len(&log);
    let rate = k.load_rate;
    let seconds = (k.load_seconds + 4) as f64;
    let during = std::thread::spawn(move || paced_load(rate, seconds));
    std::thread::sleep(Duration::from_millis(1500));
    let c = run.state.change(0.01, None);
    say(format!(
        "[{name}] 1% change renamed ({} flipped, {} added in {} files); waiting for {} hosts",
        c.flipped, c.added, c.files, c.expect_hosts
    ));
    let to_snapshot = if wait_hosts(&mut envoy, c.expect_hosts, k.full_timeout_s) {
        Some(now_ms() - c.renamed_ms)
    } else {
        r.failed = true;
        say(format!(
            "[{name}] FAILED: after the change snapshot.hosts never reached {} (now {})",
            c.expect_hosts,
            Gauges::read().hosts
        ));
        None
    };
    r.lat.insert("change", during.join().unwrap_or_default());
    std::thread::sleep(Duration::from_millis(300));
    r.change = Some((c, to_snapshot, run.re.scan(&log, off_change)));
    r.errors.insert("change", Gauges::read().refresh_error);

    // ---- more refreshes: memory growth (RSS after each block)
    for _ in 0..3 {
        r.after_busy.extend(wait_refreshes(k.refreshes));
        r.rss_series.push(rss_kb(envoy.pid()));
    }
    r.rss
        .insert("end", r.rss_series.first().copied().unwrap_or(0));
    r.errors.insert("after", Gauges::read().refresh_error);

    // ---- repeated changes, one phase per kind
    if k.changes > 0 {
        for (kind, _) in kinds(nclusters) {
            let rep = run.repeated(&mut envoy, &log, kind, &mut r.failed);
            r.rep.insert(kind, rep);
        }
    }
    r.errors.insert("rep", Gauges::read().refresh_error);

    // ---- routing check, last: nothing listens on 127.1.x.y, so these end in
    // 503 after the pick (the access log shows the override and the host
    // tried); the connect failures make outlier detection eject a host.
    let first = &run.state.clusters[0];
    for i in 1..=6 {
        let _ = support::http::request(
            SocketAddr::from(([127, 0, 0, 1], LISTEN)),
            "GET",
            &format!("/c/{}/check-{i}", first.name),
            &[],
            Duration::from_secs(5),
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    r.routing = Some(route_check(
        &run.dir,
        first,
        &format!("/c/{}/check-", first.name),
    ));
    r.g_end = Some(Gauges::read());
    let scan = run.re.scan(&log, 0);
    let leader = scan.leaders.last().map_or("?".to_string(), |tid| {
        let comm = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", envoy.pid()))
            .unwrap_or_else(|_| "?".into());
        match comm.trim() {
            "envoy" => "envoy (main thread)".to_string(),
            other => other.to_string(),
        }
    });
    r.leader = Some(format!("{leader}, {} election(s)", scan.leaders.len()));
    r.warnings = scan.warnings;
    envoy.stop();
    say(format!("[{name}] done"));
    r
}

/// The access log lines of the check requests: the first override address
/// must be in the tier the cluster has now and be the upstream Envoy tried.
fn route_check(dir: &Path, cluster: &Cluster, prefix: &str) -> String {
    let tier: Vec<String> = cluster
        .tier()
        .iter()
        .map(|h| h.addr().to_string())
        .collect();
    let log = std::fs::read_to_string(dir.join("access.log")).unwrap_or_default();
    let (mut good, mut total, mut bad) = (0, 0, Vec::new());
    for line in log
        .lines()
        .filter(|l| l.starts_with(&format!("ACCESS {prefix}")))
    {
        total += 1;
        let kv: BTreeMap<&str, &str> = line
            .split_whitespace()
            .skip(2)
            .filter_map(|p| p.split_once('='))
            .collect();
        let first = kv
            .get("override")
            .copied()
            .unwrap_or("-")
            .split(',')
            .next()
            .unwrap_or("-");
        if tier.iter().any(|t| t == first) && kv.get("upstream") == Some(&first) {
            good += 1;
        } else {
            bad.push(line.to_string());
        }
    }
    format!(
        "{good}/{total}{}",
        bad.first().map_or(String::new(), |b| format!(" BAD: {b}"))
    )
}

// ------------------------------------------------------------------ the table

fn fmt_int(v: f64) -> String {
    if v.is_nan() {
        return "-".into();
    }
    let n = v as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

fn both(t: f64, n: Option<f64>) -> String {
    format!(
        "{t:.0} (schedstat {})",
        n.map_or("-".into(), |v| format!("{v:.0}"))
    )
}

fn lat_cell(d: Option<&Latency>) -> Option<String> {
    let d = d.filter(|d| d.n > 0)?;
    let errs = if d.errors > 0 {
        format!(", err {}", d.errors)
    } else {
        String::new()
    };
    Some(format!(
        "{:.1} / {:.1} / {:.1} (n={}{errs})",
        d.p50, d.p99, d.max, d.n
    ))
}

fn refresh_cell(x: Option<&&Refresh>) -> Option<String> {
    x.map(|x| {
        format!(
            "{} us VM, {} ms e2e, {} B",
            fmt_int(x.vm_us as f64),
            fmt_int(x.e2e_ms as f64),
            fmt_int(x.admin_bytes as f64)
        )
    })
}

fn mb(kb: Option<&i64>) -> Option<String> {
    kb.map(|kb| format!("{:.1}", *kb as f64 / 1024.0))
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// A scenario's repeated-change phase of `kind` and its figures.
fn figures_of<'a>(r: &'a Scenario, kind: &str, hz: f64) -> Option<(&'a Repeated, RepFigures)> {
    let rep = r.rep.get(kind)?;
    Some((rep, rep_figures(rep, r.reference.get(kind), hz)))
}

fn table(rs: &[Scenario], hz: f64) -> String {
    type Cell<'a> = Box<dyn Fn(&Scenario) -> Option<String> + 'a>;
    let mut rows: Vec<(String, Cell)> = Vec::new();
    let mut row = |label: &str, f: Cell<'static>| rows.push((label.to_string(), f));
    let pubs = |s: &LogScan| s.published().len();
    row(
        "EDS endpoints (clusters x hosts)",
        Box::new(|r| {
            Some(format!(
                "{} ({} x {})",
                fmt_int(r.endpoints as f64),
                r.nclusters,
                r.nhosts
            ))
        }),
    );
    row(
        "EDS files, bytes",
        Box::new(|r| Some(fmt_int(r.eds_bytes as f64))),
    );
    row(
        "expected snapshot hosts / clusters",
        Box::new(|r| {
            Some(format!(
                "{} / {}",
                fmt_int(r.expect_hosts as f64),
                fmt_int(r.expect_clusters as f64)
            ))
        }),
    );
    row(
        "Envoy start -> /ready, ms",
        Box::new(|r| r.start_to_ready_ms.map(|v| v.to_string())),
    );
    row(
        "snapshot.hosts at /ready",
        Box::new(|r| r.hosts_at_ready.map(|v| fmt_int(v as f64))),
    );
    row(
        "/ready -> full snapshot published, ms",
        Box::new(|r| r.ready_to_full_ms.map(|v| v.to_string())),
    );
    row(
        "refreshes logged / published until full",
        Box::new(move |r| Some(format!("{} / {}", r.first.refreshes.len(), pubs(&r.first)))),
    );
    row(
        "first load: the refresh that published it",
        Box::new(|r| refresh_cell(r.first.published().last())),
    );
    row(
        "first load: gauges busy_us / admin_bytes",
        Box::new(|r| {
            r.g_first.as_ref().map(|g| {
                format!(
                    "{} / {}",
                    fmt_int(g.refresh_busy_us as f64),
                    fmt_int(g.admin_bytes as f64)
                )
            })
        }),
    );
    row(
        "snapshot.bytes (encoded)",
        Box::new(|r| r.g_first.as_ref().map(|g| fmt_int(g.bytes as f64))),
    );
    row(
        "steady polls: busy_us gauge (last full refresh) median / max (n)",
        Box::new(|r| {
            let v: Vec<f64> = r.steady_busy.iter().map(|x| *x as f64).collect();
            (!v.is_empty()).then(|| {
                format!(
                    "{} / {} ({})",
                    fmt_int(median(&v)),
                    fmt_int(max_of(&v)),
                    v.len()
                )
            })
        }),
    );
    row(
        "steady refreshes: e2e ms median (debug log)",
        Box::new(|r| {
            let v: Vec<f64> = r
                .steady_log
                .refreshes
                .iter()
                .map(|x| x.e2e_ms as f64)
                .collect();
            (!v.is_empty()).then(|| fmt_int(median(&v)))
        }),
    );
    row(
        "  of them logged as changed (dump re-parsed)",
        Box::new(move |r| {
            Some(format!(
                "{} (published {})",
                r.steady_log.refreshes.len(),
                pubs(&r.steady_log)
            ))
        }),
    );
    row(
        "steady CPU % of a core: main / workers / Envoy",
        Box::new(|r| {
            r.cpu_steady
                .map(|c| format!("{:.1} / {:.1} / {:.1}", c.0, c.1, c.2))
        }),
    );
    row(
        "config_dump(EDS) bytes",
        Box::new(|r| r.curl.as_ref().map(|c| fmt_int(c.dump_bytes))),
    );
    row(
        "  curl ms: no filter / filter polling",
        Box::new(|r| {
            Some(format!(
                "{:.1} / {:.1}",
                r.curl_nofilter.as_ref()?.dump_ms,
                r.curl.as_ref()?.dump_ms
            ))
        }),
    );
    row(
        "/clusters?format=json bytes",
        Box::new(|r| r.curl.as_ref().map(|c| fmt_int(c.clusters_bytes))),
    );
    row(
        "  curl ms: no filter / filter polling",
        Box::new(|r| {
            Some(format!(
                "{:.1} / {:.1}",
                r.curl_nofilter.as_ref()?.clusters_ms,
                r.curl.as_ref()?.clusters_ms
            ))
        }),
    );
    row(
        "1% change: endpoints flipped + added, files",
        Box::new(|r| {
            r.change
                .as_ref()
                .map(|(c, _, _)| format!("{} + {}, {}", c.flipped, c.added, c.files))
        }),
    );
    row(
        "1% change: rename -> snapshot, ms",
        Box::new(|r| {
            r.change
                .as_ref()
                .and_then(|(_, t, _)| t.map(|v| v.to_string()))
        }),
    );
    row(
        "1% change: snapshots published",
        Box::new(|r| {
            r.change
                .as_ref()
                .map(|(_, _, s)| s.published().len().to_string())
        }),
    );
    row(
        "1% change: last published refresh",
        Box::new(|r| {
            r.change
                .as_ref()
                .and_then(|(_, _, s)| refresh_cell(s.published().last()))
        }),
    );
    row(
        "1% change: max VM us of published refreshes",
        Box::new(|r| {
            let (_, _, s) = r.change.as_ref()?;
            let v: Vec<f64> = s.published().iter().map(|x| x.vm_us as f64).collect();
            (!v.is_empty()).then(|| fmt_int(max_of(&v)))
        }),
    );
    row(
        "after the change: busy_us median (n)",
        Box::new(|r| {
            let v: Vec<f64> = r.after_busy.iter().map(|x| *x as f64).collect();
            (!v.is_empty()).then(|| format!("{} ({})", fmt_int(median(&v)), v.len()))
        }),
    );
    row("RSS MB: at /ready", Box::new(|r| mb(r.rss.get("ready"))));
    row("RSS MB: full snapshot", Box::new(|r| mb(r.rss.get("full"))));
    row(
        "RSS MB: steady (~10 refreshes later)",
        Box::new(|r| mb(r.rss.get("steady"))),
    );
    row(
        "RSS MB: after change +10 / +20 / +30 refreshes",
        Box::new(|r| {
            (!r.rss_series.is_empty()).then(|| {
                r.rss_series
                    .iter()
                    .filter_map(|x| mb(Some(x)))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
        }),
    );
    row(
        "RSS MB: same Envoy without the filter",
        Box::new(|r| mb(r.rss.get("nofilter"))),
    );
    row(
        "latency ms p50/p99/max: no filter",
        Box::new(|r| lat_cell(r.lat.get("nofilter"))),
    );
    row(
        "latency ms: filter, steady refreshes",
        Box::new(|r| lat_cell(r.lat.get("steady"))),
    );
    row(
        "latency ms: filter, during the 1% change",
        Box::new(|r| lat_cell(r.lat.get("change"))),
    );
    for (kind, label) in KINDS {
        row(
            &format!("repeated change, {label}: n, flipped + added, EDS files"),
            Box::new(move |r| {
                figures_of(r, kind, hz).map(|(rep, _)| {
                    format!("{}, {} + {}, {}", rep.k, rep.flipped, rep.added, rep.files)
                })
            }),
        );
        row(
            "  rename -> published (refresh line), ms median / max",
            Box::new(move |r| {
                let (_, f) = figures_of(r, kind, hz)?;
                (!f.latency.is_empty()).then(|| {
                    format!(
                        "{:.0} / {:.0} (n={})",
                        median(&f.latency),
                        max_of(&f.latency),
                        f.latency.len()
                    )
                })
            }),
        );
        row(
            "  MAIN THREAD ms per change (minus steady rate)",
            Box::new(move |r| {
                let (_, f) = figures_of(r, kind, hz)?;
                let mut s = both(f.ms, f.ms_ns);
                if !f.base_ok {
                    s.push_str(" STEADY WINDOW HELD A FULL REFRESH");
                }
                if f.unchanged > 0 {
                    let _ = write!(
                        s,
                        "; w/o {} unchanged full: {:.0} ({})",
                        f.unchanged,
                        f.ms_wo_unchanged,
                        f.ms_ns_wo_unchanged
                            .map_or("-".into(), |v| format!("{v:.0}"))
                    );
                }
                for flag in &f.flags {
                    let _ = write!(s, "; {flag}");
                }
                Some(s)
            }),
        );
        row(
            "    Envoy alone, no filter (taking the EDS in)",
            Box::new(move |r| {
                let (rt, rn, ok) = figures_of(r, kind, hz)?.1.reference?;
                let reference = r.reference.get(kind)?;
                Some(
                    both(rt, rn)
                        + &if ok {
                            String::new()
                        } else {
                            format!(
                                " (update_success {} of {})",
                                reference.updates, reference.files
                            )
                        },
                )
            }),
        );
        row(
            "    difference: the filter's (w/o unchanged full refr.)",
            Box::new(move |r| {
                let (_, f) = figures_of(r, kind, hz)?;
                let (rt, rn, _) = f.reference?;
                Some(both(
                    f.ms_wo_unchanged - rt,
                    f.ms_ns_wo_unchanged.zip(rn).map(|(a, b)| a - b),
                ))
            }),
        );
        row(
            "  VM us median / max; admin bytes median; e2e ms median",
            Box::new(move |r| {
                let (_, f) = figures_of(r, kind, hz)?;
                (!f.vm_us.is_empty()).then(|| {
                    format!(
                        "{} / {}; {}; {}",
                        fmt_int(median(&f.vm_us)),
                        fmt_int(max_of(&f.vm_us)),
                        fmt_int(median(&f.admin_bytes)),
                        fmt_int(median(&f.e2e_ms))
                    )
                })
            }),
        );
        row(
            "    other threads, ms per change (net, >= 2 ms)",
            Box::new(move |r| {
                let (_, f) = figures_of(r, kind, hz)?;
                let s: Vec<String> = f
                    .others
                    .iter()
                    .filter(|(_, v)| v.abs() >= 2.0)
                    .map(|(n, v)| format!("{n} {v:.0}"))
                    .collect();
                Some(if s.is_empty() {
                    "none".into()
                } else {
                    s.join(", ")
                })
            }),
        );
        row(
            "  refreshes (stats) / refresh lines (narrowed) / published",
            Box::new(move |r| {
                let (_, f) = figures_of(r, kind, hz)?;
                let reasons: Vec<String> =
                    f.reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
                Some(format!(
                    "{} / {} ({}) / {}; {}",
                    f.fulls,
                    f.lines,
                    f.narrowed,
                    f.published,
                    if reasons.is_empty() {
                        "no reason lines".into()
                    } else {
                        reasons.join(", ")
                    }
                ))
            }),
        );
        row(
            "  raw: phase s, main ticks | steady s, ticks | polls skipped",
            Box::new(move |r| {
                let (rep, f) = figures_of(r, kind, hz)?;
                Some(format!(
                    "{:.1}, {} | {:.1}, {} | {} / {}",
                    rep.phase.secs,
                    rep.phase.main_ticks,
                    rep.base.secs,
                    rep.base.main_ticks,
                    f.skips_phase,
                    f.skips_base
                ))
            }),
        );
        row(
            "  raw, no filter: phase s, ticks | idle s, ticks",
            Box::new(move |r| {
                let x = r.reference.get(kind)?;
                Some(format!(
                    "{:.1}, {} | {:.1}, {}",
                    x.phase.secs, x.phase.main_ticks, x.idle.secs, x.idle.main_ticks
                ))
            }),
        );
    }
    row(
        "steady: main thread ms/s between full refreshes",
        Box::new(move |r| {
            let v: Vec<String> = KINDS
                .iter()
                .filter_map(|(k, _)| r.rep.get(k))
                .map(|rep| format!("{:.1}", rep_figures(rep, None, hz).base_rate_ms_s))
                .collect();
            (!v.is_empty()).then(|| v.join(" / "))
        }),
    );
    row(
        "steady: periodic full refresh (no change), main ms",
        Box::new(move |r| {
            let v: Vec<String> = KINDS
                .iter()
                .filter_map(|(k, _)| r.rep.get(k))
                .map(|rep| {
                    let f = rep_figures(rep, None, hz);
                    both(f.periodic_ms, f.periodic_ms_ns)
                        + if f.periodic_ok {
                            ""
                        } else {
                            " (not 1 full refresh in it)"
                        }
                })
                .collect();
            (!v.is_empty()).then(|| v.join(" / "))
        }),
    );
    row(
        "routing check: picks in the right tier",
        Box::new(|r| r.routing.clone()),
    );
    row(
        "refresh_error at: steady / +admin curls / +change / +30 / +repeat",
        Box::new(|r| {
            Some(
                ["steady", "curls", "change", "after", "rep"]
                    .iter()
                    .map(|k| r.errors.get(k).map_or("-".into(), |v| fmt_int(*v as f64)))
                    .collect::<Vec<_>>()
                    .join(" / "),
            )
        }),
    );
    row(
        "polls ok (full refreshes + gate skips) / errors / published",
        Box::new(|r| {
            r.g_end.as_ref().map(|g| {
                format!(
                    "{} ({} + {}) / {} / {}",
                    fmt_int(g.refresh_ok as f64),
                    fmt_int(g.fulls() as f64),
                    fmt_int(g.skipped as f64),
                    fmt_int(g.refresh_error as f64),
                    fmt_int(g.published as f64)
                )
            })
        }),
    );
    row(
        "filter warnings in the log",
        Box::new(|r| Some(r.warnings.len().to_string())),
    );
    row("leader thread", Box::new(|r| r.leader.clone()));
    row(
        "machine CPU % (all cores) / others, steady",
        Box::new(|r| r.cpu_steady.map(|c| format!("{:.0} / {:.0}", c.3, c.4))),
    );
    row("loadavg at start", Box::new(|r| Some(r.loadavg.clone())));

    let cells: Vec<(String, Vec<String>)> = rows
        .iter()
        .map(|(label, f)| {
            (
                label.clone(),
                rs.iter()
                    .map(|r| f(r).unwrap_or_else(|| "-".into()))
                    .collect(),
            )
        })
        .collect();
    let head: Vec<String> = std::iter::once("figure".to_string())
        .chain(rs.iter().map(|r| r.name.clone()))
        .collect();
    let w0 = cells
        .iter()
        .map(|(l, _)| l.len())
        .chain(std::iter::once(head[0].len()))
        .max()
        .unwrap_or(0);
    let ws: Vec<usize> = (0..rs.len())
        .map(|i| {
            cells
                .iter()
                .map(|(_, v)| v[i].chars().count())
                .chain(std::iter::once(head[i + 1].len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |first: &str, rest: &[String]| {
        let mut s = format!("| {first:<w0$} |");
        for (i, c) in rest.iter().enumerate() {
            let _ = write!(s, " {c:<w$} |", w = ws[i]);
        }
        s
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}", line(&head[0], &head[1..]));
    let _ = writeln!(
        out,
        "|{}|{}|",
        "-".repeat(w0 + 2),
        ws.iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for (label, vals) in &cells {
        let _ = writeln!(out, "{}", line(label, vals));
    }
    out
}

fn main() {
    let k = Knobs::read().unwrap_or_else(|e| fail(e));
    if !k.envoy.is_file() {
        fail(format!(
            "envoy not found at {} (run 'make envoy' or set ENVOY_BIN)",
            k.envoy.display()
        ));
    }
    if !k.sp_wasm.is_file() {
        fail(format!(
            "serving-picker module not found at {} (run 'make build')",
            k.sp_wasm.display()
        ));
    }
    for p in [LISTEN, ADMIN, BACKEND] {
        if port_in_use(p) {
            fail(format!(
                "port {p} is already in use (a previous run still going?)"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&k.work);
    std::fs::create_dir_all(&k.work).unwrap_or_else(|e| fail(e));
    let hz = cpu::clock_ticks_per_second() as f64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    say(format!("machine: {cores} cores, loadavg {}", loadavg()));
    let results: Vec<Scenario> = k
        .scenarios
        .iter()
        .map(|&(c, h)| run_scenario(&k, hz, c, h))
        .collect();
    println!();
    println!("serving-picker snapshot refresh at scale (Envoy --concurrency 2, refresh_interval_ms 1000, admin_timeout_ms 1000 default)");
    println!(
        "latency: GET / -> real_backend through the filter, {} req/s over 8 keep-alive connections",
        k.load_rate
    );
    print!("{}", table(&results, hz));
    println!();
    for r in &results {
        println!(
            "{}: {} filter warning/error line(s){}",
            r.name,
            r.warnings.len(),
            if r.warnings.is_empty() { "" } else { ":" }
        );
        for w in r.warnings.iter().take(8) {
            println!("    {w}");
        }
    }
    say(format!(
        "loadavg at the end: {}; raw files in {}",
        loadavg(),
        k.work.display()
    ));
    if results.iter().any(|r| r.failed) {
        fail("the filter did not reach the expected host count in at least one scenario");
    }
}
