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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serving_picker_benches::{
    die, knob, knob_number, knob_path, median, port_in_use, validate, write_json,
};
use support::cpu::{self, Sample, Window};
use support::process::Process;

mod endpoints;
mod envoy;
mod figures;
mod log;
mod table;

use endpoints::{scale_bootstrap, Change, Cluster, State};
use envoy::{
    admin, admin_curls, paced_load, rss_kb, start_envoy, update_success_sum, wait_hosts,
    wait_refreshes, Curls, Gauges, Latency,
};
use figures::{change_of, kinds, rep_figures, Reference, Repeated};
use log::{file_len, LogScan, Patterns};
use table::table;

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
    let (mut r, mut run) = prepare(k, hz, nclusters, nhosts);
    let name = r.name.clone();
    run.without_the_filter(&mut r);
    let log = run.dir.join("envoy-filter.log");
    let Some(mut envoy) = run.first_load(&mut r, &log) else {
        return r;
    };
    run.steady(&mut r, &envoy, &log);
    // Admin output, rendered by Envoy's main thread.
    r.curl = Some(admin_curls());
    let _ = std::fs::write(run.dir.join("config_dump.json"), admin(DUMP_PATH).body);
    let _ = std::fs::write(run.dir.join("clusters.json"), admin(CLUSTERS_PATH).body);
    r.errors.insert("curls", Gauges::read().refresh_error);
    // Request latency during unchanged refreshes.
    r.lat
        .insert("steady", paced_load(k.load_rate, k.load_seconds as f64));
    run.one_change(&mut r, &mut envoy, &log);
    // More refreshes: memory growth (RSS after each block).
    for _ in 0..3 {
        r.after_busy.extend(wait_refreshes(k.refreshes));
        r.rss_series.push(rss_kb(envoy.pid()));
    }
    r.rss
        .insert("end", r.rss_series.first().copied().unwrap_or(0));
    r.errors.insert("after", Gauges::read().refresh_error);
    // Repeated changes, one phase per kind.
    if k.changes > 0 {
        for (kind, _) in kinds(nclusters) {
            let rep = run.repeated(&mut envoy, &log, kind, &mut r.failed);
            r.rep.insert(kind, rep);
        }
    }
    r.errors.insert("rep", Gauges::read().refresh_error);
    run.routing_check(&mut r, &envoy, &log);
    envoy.stop();
    say(format!("[{name}] done"));
    r
}

/// The scenario's EDS files and bootstraps (both validated), and its run.
fn prepare(k: &Knobs, hz: f64, nclusters: usize, nhosts: usize) -> (Scenario, Run<'_>) {
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
    let run = Run {
        k,
        hz,
        re: Patterns::new(),
        dir,
        state,
    };
    (r, run)
}

impl Run<'_> {
    /// The reference: the same Envoy without the filter, its RSS, admin
    /// output and latency, and the changes the filter run makes later (the
    /// files put back after).
    fn without_the_filter(&mut self, r: &mut Scenario) {
        let k = self.k;
        let mut envoy = start_envoy(k, &self.dir, "nofilter");
        std::thread::sleep(Duration::from_secs(2));
        r.rss.insert("nofilter", rss_kb(envoy.pid()));
        r.curl_nofilter = Some(admin_curls());
        r.lat
            .insert("nofilter", paced_load(k.load_rate, k.load_seconds as f64));
        if k.changes > 0 {
            // The same changes as the filter run below (the 1% step first), then the files put back.
            let saved = self.state.snapshot();
            self.state.change(0.01, None);
            std::thread::sleep(Duration::from_secs(k.gap_s));
            for (kind, _) in kinds(r.nclusters) {
                let reference = self.reference_changes(&envoy, kind);
                r.reference.insert(kind, reference);
            }
            envoy.stop();
            self.state.restore(saved);
        }
        envoy.stop();
    }

    /// Envoy with the filter started, to /ready, then to the first full
    /// snapshot; None (the scenario failed) when that never comes.
    fn first_load(&mut self, r: &mut Scenario, log: &Path) -> Option<Process> {
        let name = r.name.clone();
        let t0 = now_ms();
        let mut envoy = start_envoy(self.k, &self.dir, "filter");
        let t_ready = now_ms();
        r.rss.insert("ready", rss_kb(envoy.pid()));
        r.hosts_at_ready = Some(Gauges::read().hosts);
        r.start_to_ready_ms = Some(t_ready - t0);
        say(format!(
            "[{name}] ready after {} ms; waiting for {} hosts in the snapshot",
            t_ready - t0,
            r.expect_hosts
        ));
        if !wait_hosts(&mut envoy, r.expect_hosts, self.k.full_timeout_s) {
            r.failed = true;
            say(format!(
                "[{name}] FAILED: snapshot.hosts never reached {} (now {})",
                r.expect_hosts,
                Gauges::read().hosts
            ));
            r.g_end = Some(Gauges::read());
            r.first = self.re.scan(log, 0);
            return None;
        }
        let t_full = now_ms();
        r.ready_to_full_ms = Some(t_full - t_ready);
        r.rss.insert("full", rss_kb(envoy.pid()));
        r.g_first = Some(Gauges::read());
        std::thread::sleep(Duration::from_millis(300)); // the log flush
        r.first = self.re.scan(log, 0);
        say(format!(
            "[{name}] full snapshot {} ms after ready",
            t_full - t_ready
        ));
        Some(envoy)
    }

    /// Unchanged refreshes: their cost, the CPU of Envoy's threads and the
    /// machine, RSS.
    fn steady(&mut self, r: &mut Scenario, envoy: &Process, log: &Path) {
        let hz = self.hz;
        let a = Sample::take(envoy.pid());
        let off_steady = file_len(log);
        r.steady_busy = wait_refreshes(self.k.refreshes);
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
        r.steady_log = self.re.scan(log, off_steady);
        r.errors.insert("steady", Gauges::read().refresh_error);
        say(format!(
            "[{}] steady refreshes busy_us: {:?}",
            r.name, r.steady_busy
        ));
    }

    /// A 1% rolling-update step, requests running: rename -> snapshot, and
    /// the latency meanwhile.
    fn one_change(&mut self, r: &mut Scenario, envoy: &mut Process, log: &Path) {
        let name = r.name.clone();
        let k = self.k;
        let off_change = file_len(log);
        let rate = k.load_rate;
        let seconds = (k.load_seconds + 4) as f64;
        let during = std::thread::spawn(move || paced_load(rate, seconds));
        std::thread::sleep(Duration::from_millis(1500));
        let c = self.state.change(0.01, None);
        say(format!(
            "[{name}] 1% change renamed ({} flipped, {} added in {} files); waiting for {} hosts",
            c.flipped, c.added, c.files, c.expect_hosts
        ));
        let to_snapshot = if wait_hosts(envoy, c.expect_hosts, k.full_timeout_s) {
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
        r.change = Some((c, to_snapshot, self.re.scan(log, off_change)));
        r.errors.insert("change", Gauges::read().refresh_error);
    }

    /// The routing check, last: nothing listens on 127.1.x.y, so these end
    /// in 503 after the pick (the access log shows the override and the host
    /// tried); the connect failures make outlier detection eject a host.
    /// Then the run's end: gauges, the leader thread, warnings.
    fn routing_check(&mut self, r: &mut Scenario, envoy: &Process, log: &Path) {
        let first = &self.state.clusters[0];
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
            &self.dir,
            first,
            &format!("/c/{}/check-", first.name),
        ));
        r.g_end = Some(Gauges::read());
        let scan = self.re.scan(log, 0);
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
    }
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
