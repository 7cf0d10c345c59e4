//! `make bench-e2e`: the same front Envoy (`--concurrency 1`) in several
//! forms, driven by wrk against a backend Envoy with three direct_response
//! listeners, rounds interleaved, figures paired within a round. What it
//! measures, every knob and how to read the tables: benches/e2e/README.md.
//!
//!   plain           no filter: override_host without a header falls back to round robin
//!   native          the native form: the cluster's load balancer is libserving_picker.so
//!   noop            the no-op Rust wasm filter (benches/noop-filter): what any wasm filter pays
//!   serving-picker  the wasm form, polling its own admin through envoy_admin
//!
//! It answers four questions (figures, never asserts):
//!   T1  does serving-picker (wasm) keep at least 0.95 of the no-op filter's throughput?
//!   T2  does it add under 10 us at p50 over the no-op filter?
//!   T3  does the native form keep at least 0.97 of plain round robin's throughput?
//!   T4  does it add under 2 us at p50 over plain (interleaved c1 phase)?
//!
//! Exit status: non-zero if a config fails validation, an Envoy fails, or any
//! measured run (any config, any phase) saw a non-2xx response or a socket
//! error: a baseline answering errors would make the ratios meaningless.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serving_picker_benches::{
    copy_into, die, knob, knob_number, knob_path, median, port_in_use, spread, validate,
    write_json, Fmt, Pinning,
};
use support::bootstrap::{
    bootstrap, direct_response, http_connection_manager, listener, native_lb_policy,
    override_host_policy, override_host_statuses, route, socket, static_cluster, wasm_filter,
};
use support::cpu;
use support::eds::Endpoint;
use support::process::Process;

const BENCH: &str = "bench-e2e";
const FRONT_PORT: u16 = 21000;
const FRONT_ADMIN: u16 = 21901;
const BACKEND_ADMIN: u16 = 21900;
const BACKEND_PORTS: [u16; 3] = [21081, 21082, 21083];
/// The interleaved phase's fronts: listeners from here, admins from IL_ADMIN.
const IL_PORT: u16 = 21010;
const IL_ADMIN: u16 = 21910;
const OVERRIDE_HEADER: &str = "x-gateway-destination-endpoint";
/// The 3-address list serving-picker sends, rotated by one per request as
/// its picks rotate, so that every config spreads over the same backends.
const OVERRIDE_ROTATIONS: [&str; 3] = [
    "127.0.0.1:21081,127.0.0.1:21082,127.0.0.1:21083",
    "127.0.0.1:21082,127.0.0.1:21083,127.0.0.1:21081",
    "127.0.0.1:21083,127.0.0.1:21081,127.0.0.1:21082",
];
// The targets, printed against the paired figures; never asserted.
const T1_MIN_RATIO: f64 = 0.95;
const T2_MAX_US: f64 = 10.0;
const T3_MIN_RATIO: f64 = 0.97;
const T4_MAX_US: f64 = 2.0;
/// More than one serving-picker tick: its request counters reach /stats then.
const STATS_SETTLE: Duration = Duration::from_millis(500);

fn fail(message: impl std::fmt::Display) -> ! {
    die(BENCH, message)
}

/// The knobs (environment), checked.
struct Knobs {
    envoy: PathBuf,
    sp_wasm: PathBuf,
    sp_native: PathBuf,
    noop_wasm: PathBuf,
    latency_client: PathBuf,
    duration: String,
    warmup: String,
    connections: u64,
    threads: u64,
    lat_duration: String,
    sp_config: String,
    rounds: usize,
    work: PathBuf,
    configs: Vec<String>,
    noisy_pct: f64,
    probe: u64,
    probe_path: String,
    stack: u64,
    decompose: bool,
    il_laps: u64,
    il_warmup: u64,
    il_configs: Vec<String>,
    shared_reps: u64,
    shared_duration: String,
}

impl Knobs {
    fn read() -> Result<Knobs, String> {
        let number = |name: &str, default: u64| knob_number(name, default);
        let rounds = number("BENCH_ROUNDS", 3)?;
        if rounds == 0 {
            return Err("BENCH_ROUNDS must be a positive integer".into());
        }
        let probe = number("BENCH_PROBE", 0)?;
        let stack = number("BENCH_STACK", 1)?;
        if stack == 0 {
            return Err("BENCH_STACK must be a positive number".into());
        }
        let probe_path = knob("BENCH_PROBE_PATH", "xds.cluster_name");
        let dotted = probe_path
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        if !dotted {
            return Err("BENCH_PROBE_PATH must be a dotted property path".into());
        }
        let decompose = match knob("BENCH_DECOMPOSE", "0").as_str() {
            "0" => false,
            "1" => true,
            _ => return Err("BENCH_DECOMPOSE must be 0 or 1".into()),
        };
        let mut configs: Vec<String> = knob("BENCH_CONFIGS", "plain native noop serving-picker")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if probe > 0 {
            configs.extend(["probe-property".into(), "probe-replace".into()]);
        }
        if decompose {
            configs.extend(
                [
                    "override-client",
                    "override-header",
                    "override-read",
                    "override-state",
                ]
                .map(String::from),
            );
        }
        for c in &configs {
            if !KNOWN_CONFIGS.contains(&c.as_str()) {
                return Err(format!("unknown config {c}"));
            }
        }
        // The interleaved phase's fronts: noop first (the baseline), then the others.
        let mut il_configs = vec!["noop".to_string()];
        let il = std::env::var("BENCH_IL_CONFIGS").unwrap_or_else(|_| configs.join(" "));
        for c in il.split_whitespace() {
            if !configs.iter().any(|x| x == c) {
                return Err(format!(
                    "BENCH_IL_CONFIGS: unknown config {c} (have: {})",
                    configs.join(" ")
                ));
            }
            if c != "noop" {
                il_configs.push(c.to_string());
            }
        }
        Ok(Knobs {
            envoy: knob_path("ENVOY_BIN", ".venv/bin/envoy"),
            sp_wasm: knob_path("SERVING_PICKER_WASM", "target/serving_picker.wasm"),
            sp_native: knob_path(
                "SERVING_PICKER_NATIVE",
                "target/release/libserving_picker.so",
            ),
            noop_wasm: knob_path(
                "NOOP_WASM",
                "benches/noop-filter/target/wasm32-wasip1/release/noop_filter.wasm",
            ),
            latency_client: knob_path(
                "LATENCY_CLIENT",
                "benches/latency-client/target/release/latency_client",
            ),
            duration: knob("BENCH_DURATION", "10s"),
            warmup: knob("BENCH_WARMUP", "2s"),
            connections: number("BENCH_CONNECTIONS", 32)?,
            threads: number("BENCH_THREADS", 1)?,
            lat_duration: knob("BENCH_LAT_DURATION", "5s"),
            sp_config: knob("BENCH_SP_CONFIG", r#"{"refresh_interval_ms": 1000}"#),
            rounds: rounds as usize,
            work: knob_path("BENCH_WORKDIR", ".run/bench-e2e"),
            configs,
            noisy_pct: number("BENCH_NOISY_PCT", 15)? as f64,
            probe,
            probe_path,
            stack,
            decompose,
            il_laps: number("BENCH_IL_LAPS", 20000)?,
            il_warmup: number("BENCH_IL_WARMUP", 2000)?,
            il_configs,
            shared_reps: number("BENCH_SHARED_REPS", 8)?,
            shared_duration: knob("BENCH_SHARED_DURATION", "5s"),
        })
    }

    fn load(&self) -> String {
        format!("c{}", self.connections)
    }
}

const KNOWN_CONFIGS: [&str; 10] = [
    "plain",
    "native",
    "noop",
    "serving-picker",
    "probe-property",
    "probe-replace",
    "override-client",
    "override-header",
    "override-read",
    "override-state",
];

// ------------------------------------------------------------------ configs

/// The modules as copied into the work dir at the start: a rebuild while the
/// benchmark runs cannot put two different modules into one run's rounds.
struct Modules {
    sp_wasm: PathBuf,
    noop_wasm: PathBuf,
    native_dir: PathBuf,
}

/// The backend Envoy: three direct_response listeners.
fn backend_bootstrap() -> Value {
    let listeners = BACKEND_PORTS
        .iter()
        .map(|p| {
            listener(
                &format!("backend_{p}"),
                *p,
                http_connection_manager(
                    &format!("backend_{p}"),
                    vec![direct_response("/", &format!("ok {p}\n"))],
                    Vec::new(),
                    json!({}),
                ),
            )
        })
        .collect();
    bootstrap("bench-e2e-backend", BACKEND_ADMIN, listeners, Vec::new())
}

/// `BENCH_STACK` copies of a wasm filter, each its own plugin on the one VM.
fn wasm_stack(k: &Knobs, name: &str, module: &Path, config: Option<&str>) -> Vec<Value> {
    (1..=k.stack)
        .map(|i| wasm_filter(name, Some(&format!("copy{i}")), module, config))
        .collect()
}

/// A native filter setting the override header from the filter state the
/// no-op probe wrote (wasm.sp_override), after removing the client's.
fn header_from_state() -> Value {
    json!({
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": [
                {"remove": OVERRIDE_HEADER},
                {"append": {
                    "header": {"key": OVERRIDE_HEADER, "value": "%FILTER_STATE(wasm.sp_override:PLAIN)%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"
                }}
            ]}
        }
    })
}

/// The front Envoy of config `c` on `port`/`admin`: only its HTTP filters (and
/// for native, the cluster's policy) differ between the configs.
fn front_bootstrap(k: &Knobs, m: &Modules, c: &str, port: u16, admin: u16) -> Value {
    let noop = |config: String| wasm_stack(k, "noop_filter", &m.noop_wasm, Some(&config));
    let first = OVERRIDE_ROTATIONS[0];
    let filters = match c {
        "noop" => wasm_stack(k, "noop_filter", &m.noop_wasm, None),
        "serving-picker" => wasm_stack(k, "serving_picker", &m.sp_wasm, Some(&k.sp_config)),
        "probe-property" => noop(format!(
            r#"{{"probe_property": {}, "probe_path": "{}"}}"#,
            k.probe, k.probe_path
        )),
        "probe-replace" => noop(format!(r#"{{"probe_replace": {}}}"#, k.probe)),
        "override-header" => noop(format!(r#"{{"probe_override": "{first}"}}"#)),
        "override-read" => noop(format!(
            r#"{{"probe_property": 1, "probe_path": "{}", "probe_override": "{first}"}}"#,
            k.probe_path
        )),
        "override-state" => {
            let mut f = noop(format!(
                r#"{{"probe_state": 1, "probe_override": "{first}"}}"#
            ));
            f.push(header_from_state());
            f
        }
        _ => Vec::new(),
    };
    let endpoints = BACKEND_PORTS
        .iter()
        .map(|p| Endpoint::serving(SocketAddr::from(([127, 0, 0, 1], *p))).to_lb_endpoint())
        .collect();
    let mut backend = static_cluster("backend", endpoints);
    if c == "native" {
        backend["load_balancing_policy"] = native_lb_policy("{}");
    } else {
        backend["common_lb_config"] = override_host_statuses();
        backend["load_balancing_policy"] = override_host_policy(OVERRIDE_HEADER);
    }
    let admin_cluster = static_cluster(
        "envoy_admin",
        vec![json!({"endpoint": {"address": socket(admin)}})],
    );
    let hcm = http_connection_manager("ingress", vec![route("/", "backend")], filters, json!({}));
    bootstrap(
        "bench-e2e-front",
        admin,
        vec![listener("main", port, hcm)],
        vec![backend, admin_cluster],
    )
}

/// wrk's script for override-client: the client sends the override header,
/// a different rotation on each request (built in init(), once wrk knows the
/// Host header).
fn override_client_lua() -> String {
    let mut s = String::from("local requests = {}\nfunction init(args)\n");
    for v in OVERRIDE_ROTATIONS {
        let _ = writeln!(
            s,
            "  table.insert(requests, wrk.format(nil, nil, {{[\"{OVERRIDE_HEADER}\"] = \"{v}\"}}))"
        );
    }
    s.push_str(
        "end\nlocal n = 0\nrequest = function() n = n % #requests + 1; return requests[n] end\n",
    );
    s
}

// ------------------------------------------------------------------ wrk

/// What a wrk run printed.
struct Wrk {
    rps: String,
    p50_us: f64,
    p99_us: f64,
    requests: u64,
    non2xx: u64,
    socket_errors: u64,
}

/// A wrk time ("85.00us", "1.23ms") in microseconds; NaN when unreadable
/// rather than a wrong number.
fn to_us(v: &str) -> f64 {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let Ok(n) = digits.parse::<f64>() else {
        return f64::NAN;
    };
    let f = match &v[digits.len()..] {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 6e7,
        "h" => 3.6e9,
        _ => return f64::NAN,
    };
    // As printed with one decimal.
    (n * f * 10.0).round() / 10.0
}

fn parse_wrk(out: &str) -> Option<Wrk> {
    let mut w = Wrk {
        rps: String::new(),
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        requests: 0,
        non2xx: 0,
        socket_errors: 0,
    };
    let mut seen_requests = false;
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["Requests/sec:", v, ..] => w.rps = v.to_string(),
            ["50%", v, ..] => w.p50_us = to_us(v),
            ["99%", v, ..] => w.p99_us = to_us(v),
            [n, "requests", "in", ..] => {
                w.requests = n.parse().ok()?;
                seen_requests = true;
            }
            _ if line.contains("Non-2xx or 3xx responses:") => {
                w.non2xx = f.last().and_then(|v| v.parse().ok()).unwrap_or(0)
            }
            _ if line.contains("Socket errors:") => {
                w.socket_errors = f
                    .iter()
                    .skip(3)
                    .step_by(2)
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum()
            }
            _ => {}
        }
    }
    (seen_requests && !w.rps.is_empty()).then_some(w)
}

/// Runs wrk (pinned) with `args` against `url`, its output into `out`.
fn run_wrk(pin: &[String], args: &[String], url: &str, out: &Path) -> std::process::Child {
    let file = std::fs::File::create(out)
        .unwrap_or_else(|e| fail(format!("create {}: {e}", out.display())));
    let err = file.try_clone().unwrap_or_else(|e| fail(e));
    let mut cmd = match pin.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg("wrk");
            c
        }
        None => Command::new("wrk"),
    };
    cmd.args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| fail(format!("run wrk: {e}")))
}

fn read_wrk(out: &Path) -> Wrk {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    parse_wrk(&text).unwrap_or_else(|| {
        fail(format!(
            "could not parse wrk output {}\n{text}",
            out.display()
        ))
    })
}

// ------------------------------------------------------------------ admin

fn admin_get(port: u16, path: &str) -> String {
    let r = support::http::request(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "GET",
        path,
        &[],
        Duration::from_secs(2),
    );
    if r.status == 200 {
        r.body
    } else {
        String::new()
    }
}

/// One stat's value (None when absent).
fn stat_value(port: u16, name: &str) -> Option<i64> {
    let body = admin_get(port, &format!("/stats?filter=%5E{name}%24"));
    body.lines().find_map(|l| {
        l.split_once(": ")
            .filter(|(k, _)| *k == name)
            .and_then(|(_, v)| v.trim().parse().ok())
    })
}

// ------------------------------------------------------------------ runs

/// One measured run, as a line of raw.tsv / raw-latency.tsv.
#[derive(Clone, Debug)]
struct Run {
    config: String,
    round: usize,
    rps: String,
    p50: f64,
    p99: f64,
    cpu_us_req: f64,
    requests: u64,
    non2xx: u64,
    socket_errors: u64,
    envoy_rq: i64,
    envoy_ok: i64,
    front_pct: f64,
    backend_pct: f64,
    wrk_pct: f64,
    other_pct: f64,
    noisy: bool,
}

impl Run {
    fn rps(&self) -> f64 {
        self.rps.parse().unwrap_or(f64::NAN)
    }

    /// A column of the raw files, by its awk number (3 req/s, 4 p50, 5 p99, 6 cpu).
    fn column(&self, col: usize) -> f64 {
        match col {
            3 => self.rps(),
            4 => self.p50,
            5 => self.p99,
            _ => self.cpu_us_req,
        }
    }

    fn tsv(&self) -> String {
        format!(
            "{}\t{}\t{}\t{:.1}\t{:.1}\t{:.2}\t{}\t{}\t{}\t{}\t{}\t{:.0}%\t{:.0}%\t{:.0}%\t{:.0}%\t{}\n",
            self.config,
            self.round,
            self.rps,
            self.p50,
            self.p99,
            self.cpu_us_req,
            self.requests,
            self.non2xx,
            self.socket_errors,
            self.envoy_rq,
            self.envoy_ok,
            self.front_pct,
            self.backend_pct,
            self.wrk_pct,
            self.other_pct,
            u8::from(self.noisy)
        )
    }

    /// Errors that make a run's figures meaningless.
    fn errors(&self) -> i64 {
        (self.non2xx + self.socket_errors) as i64 + (self.envoy_rq - self.envoy_ok)
    }
}

const ROW_HEAD: [&str; 12] = [
    "config",
    "round",
    "load",
    "req/s",
    "p50 us",
    "p99 us",
    "cpu us/req",
    "front",
    "backend",
    "wrk",
    "other",
    "non2xx",
];

fn row(cells: &[String]) -> String {
    format!(
        "{:<16} {:>5} {:>4} {:>10} {:>9} {:>9} {:>11} {:>6} {:>8} {:>5} {:>6} {:>7}",
        cells[0],
        cells[1],
        cells[2],
        cells[3],
        cells[4],
        cells[5],
        cells[6],
        cells[7],
        cells[8],
        cells[9],
        cells[10],
        cells[11]
    )
}

/// The bench's state: knobs, pinning, clock, the backend.
struct Bench {
    k: Knobs,
    pin: Pinning,
    hz: f64,
    backend_pid: u32,
}

impl Bench {
    /// One measured wrk run against the running front Envoy `front`.
    #[allow(clippy::too_many_arguments)]
    fn measure(
        &self,
        c: &str,
        round: usize,
        load: &str,
        front: &mut Process,
        out: &Path,
        wrk_args: &[String],
    ) -> Run {
        let rq0 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_completed").unwrap_or(0);
        let ok0 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_2xx").unwrap_or(0);
        let t0 = cpu::process_ticks(front.pid());
        let b0 = cpu::process_ticks(self.backend_pid);
        let k0 = cpu::children_ticks();
        let m0 = cpu::machine_busy_ticks();
        let w0 = Instant::now();
        let url = format!("http://127.0.0.1:{FRONT_PORT}/");
        let _ = run_wrk(&self.pin.others, wrk_args, &url, out).wait();
        if !front.is_running() {
            fail(format!(
                "{c}: front Envoy died during the {load} run\n{}",
                front.tail(30)
            ));
        }
        let t1 = cpu::process_ticks(front.pid());
        let b1 = cpu::process_ticks(self.backend_pid);
        let k1 = cpu::children_ticks();
        let m1 = cpu::machine_busy_ticks();
        let secs = w0.elapsed().as_secs_f64();
        let rq1 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_completed").unwrap_or(0);
        let ok1 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_2xx").unwrap_or(0);
        let w = read_wrk(out);
        let pct = |ticks: u64| 100.0 * ticks as f64 / self.hz / secs;
        let front_t = t1.saturating_sub(t0);
        let backend_t = b1.saturating_sub(b0);
        let wrk_t = k1.saturating_sub(k0);
        let other_t = m1
            .saturating_sub(m0)
            .saturating_sub(front_t + backend_t + wrk_t);
        let other_pct = pct(other_t);
        let run = Run {
            config: c.to_string(),
            round,
            rps: w.rps.clone(),
            p50: w.p50_us,
            p99: w.p99_us,
            cpu_us_req: if w.requests > 0 {
                front_t as f64 * 1e6 / self.hz / w.requests as f64
            } else {
                0.0
            },
            requests: w.requests,
            non2xx: w.non2xx,
            socket_errors: w.socket_errors,
            envoy_rq: rq1 - rq0,
            envoy_ok: ok1 - ok0,
            front_pct: pct(front_t),
            backend_pct: pct(backend_t),
            wrk_pct: pct(wrk_t),
            other_pct,
            noisy: other_pct.round() > self.k.noisy_pct,
        };
        println!(
            "{}",
            row(&[
                c.to_string(),
                round.to_string(),
                load.to_string(),
                run.rps.clone(),
                format!("{:.1}", run.p50),
                format!("{:.1}", run.p99),
                format!("{:.2}", run.cpu_us_req),
                format!("{:.0}%", run.front_pct),
                format!("{:.0}%", run.backend_pct),
                format!("{:.0}%", run.wrk_pct),
                format!("{:.0}%{}", run.other_pct, if run.noisy { "*" } else { "" }),
                run.non2xx.to_string(),
            ])
        );
        run
    }

    fn start_envoy(&self, pin: &[String], name: &str, config: &Path) -> Process {
        let log = self.k.work.join(format!("{name}.log"));
        let args: Vec<String> = vec![
            "-c".into(),
            config.to_string_lossy().into(),
            "--concurrency".into(),
            "1".into(),
            "--disable-hot-restart".into(),
            "-l".into(),
            "warn".into(),
            "--log-path".into(),
            log.to_string_lossy().into(),
        ];
        let native_dir = self.k.work.join("native");
        Process::start(
            pin,
            &self.k.envoy,
            &args,
            &[("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", &native_dir)],
            &self.k.work,
            name,
            Some(log),
        )
        .unwrap_or_else(|e| fail(e))
    }

    fn wrk_args(&self, c: &str, connections: bool, duration: &str) -> Vec<String> {
        let mut a: Vec<String> = if connections {
            vec![
                format!("-t{}", self.k.threads),
                format!("-c{}", self.k.connections),
                "--latency".into(),
            ]
        } else {
            vec!["-t1".into(), "-c1".into(), "--latency".into()]
        };
        if c == "override-client" {
            a.push("-s".into());
            a.push(
                self.k
                    .work
                    .join("override-client.lua")
                    .to_string_lossy()
                    .into(),
            );
        }
        a.push(format!("-d{duration}"));
        a
    }
}

// ------------------------------------------------------------------ interleaved and shared

/// A line of the latency client: name n p50 p90 p99 mean diff lo hi errors, plus cpu/req.
#[derive(Clone, Debug)]
struct Interleaved {
    config: String,
    n: u64,
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    diff: f64,
    lo: f64,
    hi: f64,
    cpu_us_req: f64,
}

#[derive(Clone, Debug)]
struct Shared {
    config: String,
    rep: u64,
    rps: f64,
    cpu_us_req: f64,
    non2xx: u64,
    socket_errors: u64,
}

// ------------------------------------------------------------------ summary

/// Medians of a config's runs (quiet ones only when asked).
fn medians(runs: &[Run], c: &str, quiet_only: bool) -> [f64; 4] {
    let of = |col: usize| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.config == c && (!quiet_only || !r.noisy))
            .map(|r| r.column(col))
            .collect();
        median(&v)
    };
    [of(3), of(4), of(5), of(6)]
}

fn results_table(out: &mut String, k: &Knobs, runs: &[Run], quiet_only: bool, title: &str) {
    let m: BTreeMap<&str, [f64; 4]> = k
        .configs
        .iter()
        .map(|c| (c.as_str(), medians(runs, c, quiet_only)))
        .collect();
    let get = |c: &str, i: usize| {
        m.get(c)
            .map_or(0.0, |v| if v[i].is_nan() { 0.0 } else { v[i] })
    };
    let _ = writeln!(out, "== {title}");
    let _ = writeln!(
        out,
        "{:<16} {:>8} {:>9} {:>9} {:>9} {:>9} {:>12} {:>11} {:>12}",
        "config",
        "req/s",
        "p50 us",
        "p99 us",
        "vs plain",
        "vs noop",
        "p50-noop us",
        "cpu us/req",
        "cpu-noop us"
    );
    let ratio = |a: f64, b: f64| if b != 0.0 { a / b } else { 0.0 };
    for c in &k.configs {
        let [r, p50, p99, cpu] = m[c.as_str()];
        let _ = writeln!(
            out,
            "{:<16} {:>8.0} {:>9.1} {:>9.1} {:>9.3} {:>9.3} {:>+12.1} {:>11.2} {:>+12.2}",
            c,
            r,
            p50,
            p99,
            ratio(r, get("plain", 0)),
            ratio(r, get("noop", 0)),
            p50 - get("noop", 1),
            cpu,
            cpu - get("noop", 3)
        );
    }
}

fn phase_tables(out: &mut String, k: &Knobs, runs: &[Run], title: &str) {
    results_table(out, k, runs, false, title);
    let noisy = runs.iter().filter(|r| r.noisy).count();
    if noisy > 0 {
        let _ = writeln!(
            out,
            "NOTE: {noisy} of {} runs had other load above {}% of a core (marked '*' above):",
            k.rounds * k.configs.len(),
            k.noisy_pct
        );
        let _ = writeln!(out, "      the machine was busy; numbers are noisy. Rerun when it is quiet, or raise BENCH_ROUNDS.");
        let quiet_all = k
            .configs
            .iter()
            .all(|c| runs.iter().any(|r| &r.config == c && !r.noisy));
        if quiet_all {
            out.push('\n');
            results_table(
                out,
                k,
                runs,
                true,
                "the same, quiet runs only (median of the runs not marked '*')",
            );
        } else {
            let _ = writeln!(
                out,
                "      (some config has no quiet run, so there is no quiet-only table)"
            );
        }
    }
}

struct Phases<'a> {
    thr: &'a [Run],
    lat: &'a [Run],
}

/// A paired figure, one per round, in round order, from the runs of the same
/// round: `metric` ("req/s", "cpu us/req", "cpu ratio", "p50 us", "p99 us")
/// of `pair` ("a / b": a ratio, "a - b": a difference) in the throughput
/// phase or the latency one; quiet rounds only (no run of the phase noisy)
/// when asked. Its print format with it.
fn values(
    p: &Phases,
    throughput: bool,
    metric: &str,
    pair: &str,
    quiet: bool,
) -> (Fmt, Vec<Option<f64>>) {
    let runs = if throughput { p.thr } else { p.lat };
    let (col, fmt) = match metric {
        "req/s" => (3, Fmt::Ratio),
        "p50 us" => (4, Fmt::Signed1),
        "p99 us" => (5, Fmt::Signed1),
        "cpu ratio" => (6, Fmt::Ratio),
        _ => (6, Fmt::Signed2),
    };
    let (ratio, (a, b)) = match pair.split_once(" / ") {
        Some(ab) => (true, ab),
        None => (false, pair.split_once(" - ").unwrap_or((pair, pair))),
    };
    let rounds = runs.iter().map(|r| r.round).max().unwrap_or(0);
    let mut v = Vec::new();
    for round in 1..=rounds {
        let find = |c: &str| runs.iter().find(|r| r.round == round && r.config == c);
        let (Some(x), Some(y)) = (find(a), find(b)) else {
            continue;
        };
        if quiet && runs.iter().any(|r| r.round == round && r.noisy) {
            continue;
        }
        let (x, y) = (x.column(col), y.column(col));
        v.push(if x.is_nan() || y.is_nan() || (ratio && y == 0.0) {
            None
        } else if ratio {
            Some(x / y)
        } else {
            Some(x - y)
        });
    }
    (fmt, v)
}

/// A figure's label: load, metric, pair.
fn figure(load: &str, metric: &str, pair: &str) -> String {
    format!("{load:<4} {metric:<11} {pair}")
}

/// The paired figures' table: (throughput phase, metric, pair).
const PAIRED: [(bool, &str, &str); 13] = [
    (true, "req/s", "serving-picker / noop"),
    (true, "req/s", "noop / plain"),
    (true, "cpu us/req", "serving-picker - noop"),
    (true, "cpu us/req", "noop - plain"),
    (true, "cpu ratio", "noop / serving-picker"),
    (false, "p50 us", "serving-picker - noop"),
    (false, "p50 us", "noop - plain"),
    (false, "p99 us", "serving-picker - noop"),
    (false, "cpu us/req", "serving-picker - noop"),
    (true, "req/s", "native / plain"),
    (true, "cpu us/req", "native - plain"),
    (false, "p50 us", "native - plain"),
    (false, "cpu us/req", "native - plain"),
];

fn paired_table(out: &mut String, k: &Knobs, p: &Phases, quiet: bool, title: &str) {
    let _ = writeln!(out, "== {title}");
    let _ = writeln!(
        out,
        "{:<44} {:>9} {:>20}   each round, in order",
        "figure", "median", "min..max"
    );
    for (throughput, metric, pair) in PAIRED {
        let (fmt, v) = values(p, throughput, metric, pair, quiet);
        let (med, range, all) = spread(&v, fmt);
        let load = if throughput { k.load() } else { "c1".into() };
        let _ = writeln!(
            out,
            "{:<44} {med:>9} {range:>20}   {}",
            figure(&load, metric, pair),
            all.trim_start()
        );
    }
}

fn quiet_rounds(runs: &[Run]) -> usize {
    let rounds: std::collections::BTreeSet<usize> = runs.iter().map(|r| r.round).collect();
    rounds
        .iter()
        .filter(|&&round| !runs.iter().any(|r| r.round == round && r.noisy))
        .count()
}

/// A figure's median and [min..max] on one line, with `unit`.
fn figure_line(
    out: &mut String,
    label: &str,
    (fmt, v): (Fmt, Vec<Option<f64>>),
    per: u64,
    unit: &str,
) {
    let v: Vec<Option<f64>> = v.into_iter().map(|x| x.map(|x| x / per as f64)).collect();
    let (med, range, _) = spread(&v, fmt);
    let _ = writeln!(out, "{label:<45} {:>12} [{range}]", format!("{med}{unit}"));
}

/// The targets: the paired figures' medians against them, and in how many
/// rounds the figure alone was on the right side.
fn targets_block(out: &mut String, k: &Knobs, p: &Phases, quiet: bool, title: &str) {
    let load = k.load();
    let _ = writeln!(out, "== {title}");
    let targets = [
        (
            "T1",
            true,
            "req/s",
            "serving-picker / noop",
            true,
            T1_MIN_RATIO,
        ),
        (
            "T2",
            false,
            "p50 us",
            "serving-picker - noop",
            false,
            T2_MAX_US,
        ),
        ("T3", true, "req/s", "native / plain", true, T3_MIN_RATIO),
    ];
    for (name, throughput, metric, pair, at_least, limit) in targets {
        let (fmt, v) = values(p, throughput, metric, pair, quiet);
        let (med, range, _) = spread(&v, fmt);
        let known: Vec<f64> = v.iter().flatten().copied().collect();
        let ok = |x: f64| if at_least { x >= limit } else { x < limit };
        let verdict = match known.is_empty() {
            true => "n/a",
            false if ok(median(&known)) => "met",
            false => "MISSED",
        };
        let unit = if throughput { "" } else { " us" };
        let load = if throughput { load.as_str() } else { "c1" };
        let _ = writeln!(
            out,
            "{:<45} {:>12} [{range}]  target {} {limit}{unit}: {verdict} ({} of {} rounds)",
            format!("{name} {}", figure(load, metric, pair)),
            format!("{med}{unit}"),
            if at_least { ">=" } else { "<" },
            known.iter().filter(|x| ok(**x)).count(),
            known.len()
        );
    }
    // The req/s ratio a front saturated on its own core would give (requests
    // per CPU second): T1's cross-check when other load kept the front below
    // its core.
    for (metric, pair, unit) in [
        ("cpu ratio", "noop / serving-picker", ""),
        ("cpu us/req", "serving-picker - noop", " us"),
    ] {
        let label = format!("   {}", figure(&load, metric, pair));
        figure_line(out, &label, values(p, true, metric, pair, quiet), 1, unit);
    }
}

/// The host-call probe: the cost of one call, (cpu us/req - noop's) / N.
fn probe_block(out: &mut String, k: &Knobs, p: &Phases) {
    let _ = writeln!(
        out,
        "== host-call probe: the no-op filter making {} calls per request; cost of one call =",
        k.probe
    );
    let _ = writeln!(
        out,
        "   (its cpu us/req - the plain no-op's) / {}, paired per round [min..max]",
        k.probe
    );
    for (c, label) in [
        ("probe-property", format!("get_property {}", k.probe_path)),
        ("probe-replace", "replace_header_map_value".into()),
    ] {
        let (_, v) = values(p, true, "cpu us/req", &format!("{c} - noop"), false);
        figure_line(
            out,
            &format!("   {}", figure(&k.load(), "us/call", &label)),
            (Fmt::Ratio, v),
            k.probe,
            " us",
        );
    }
}

/// The filter-stack probe: the cost of one copy of a filter, the paired CPU difference / N.
fn stack_block(out: &mut String, k: &Knobs, p: &Phases) {
    let _ = writeln!(
        out,
        "== filter-stack probe: {} copies of each wasm filter in the chain; cost of one copy =",
        k.stack
    );
    let _ = writeln!(
        out,
        "   (cpu us/req difference) / {}, paired per round [min..max]",
        k.stack
    );
    for pair in ["serving-picker - noop", "noop - plain"] {
        figure_line(
            out,
            &format!("   {}", figure(&k.load(), "us/copy", pair)),
            values(p, true, "cpu us/req", pair, false),
            k.stack,
            " us",
        );
    }
}

/// serving-picker's cost over the no-op, split into Envoy's part of the
/// override, the header write (with the repeated route match), and the
/// filter's own decision.
fn decompose_block(out: &mut String, k: &Knobs, p: &Phases) {
    let _ = writeln!(
        out,
        "== override decomposition: cpu us/req differences, paired per round [min..max]"
    );
    let read = format!("one {} read, once per request", k.probe_path);
    let rows = [
        (
            "override-client - plain",
            "Envoy: override LB + longer request (client-sent header)",
        ),
        (
            "override-header - noop",
            "header set once by a wasm filter (write, route re-match, LB)",
        ),
        (
            "override-state - noop",
            "header from filter state by a native filter (no route re-match)",
        ),
        (
            "serving-picker - override-header",
            "the filter's own decision (cluster name read, lookup)",
        ),
        ("override-read - override-header", read.as_str()),
        (
            "serving-picker - override-read",
            "serving-picker's own logic (table lookup, its SDK dispatch)",
        ),
        (
            "serving-picker - noop",
            "all of serving-picker over the no-op",
        ),
    ];
    for (pair, label) in rows {
        let (fmt, v) = values(p, true, "cpu us/req", pair, false);
        let (med, range, _) = spread(&v, fmt);
        let _ = writeln!(
            out,
            "{:<34} {label:<62} {:>9} [{range}]",
            format!("   {pair}"),
            format!("{med} us")
        );
    }
    let (fmt, v) = values(p, true, "cpu ratio", "noop / override-header", false);
    let (med, range, _) = spread(&v, fmt);
    let _ = writeln!(
        out,
        "{:<97} {med:>9} [{range}]",
        "   cpu ratio noop / override-header: the best any filter setting this header could keep"
    );
}

/// The interleaved c1 phase's table, and T2 and T4 from it.
fn interleaved_block(out: &mut String, k: &Knobs, il: &[Interleaved]) {
    let _ = writeln!(out, "== interleaved c1: {} laps, one request at a time to each front in turn; diff = the median of", k.il_laps);
    let _ = writeln!(
        out,
        "   the per-lap differences to noop, with its 95% confidence interval (order statistics)"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>7} {:>8} {:>8} {:>8} {:>8} {:>10} {:>18} {:>11} {:>9}",
        "config",
        "n",
        "p50 us",
        "p90 us",
        "p99 us",
        "mean us",
        "diff us",
        "95% CI",
        "cpu us/req",
        "cpu-noop"
    );
    let base = il.first().map_or(0.0, |x| x.cpu_us_req);
    for x in il {
        let ci = format!("[{}..{}]", x.lo, x.hi);
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>10} {ci:>18} {:>11.2} {:>+9.2}",
            x.config,
            x.n,
            x.p50,
            x.p90,
            x.p99,
            x.mean,
            x.diff,
            x.cpu_us_req,
            x.cpu_us_req - base
        );
    }
    if let Some(sp) = il.iter().find(|x| x.config == "serving-picker") {
        let mut verdict = String::from(if sp.diff < T2_MAX_US { "met" } else { "MISSED" });
        if sp.hi < T2_MAX_US {
            verdict.push_str(", whole interval below");
        } else if sp.lo >= T2_MAX_US {
            verdict.push_str(", whole interval above");
        }
        let _ = writeln!(
            out,
            "T2 interleaved c1 p50  serving-picker - noop   {:+.1} us [{}..{}]  target < {T2_MAX_US} us: {verdict}",
            sp.diff, sp.lo, sp.hi
        );
    }
    // T4: native against plain, both as differences to noop in the same laps.
    let find = |c: &str| il.iter().find(|x| x.config == c);
    if let (Some(p), Some(n)) = (find("plain"), find("native")) {
        let d = n.diff - p.diff;
        let _ = writeln!(
            out,
            "T4 interleaved c1 p50  native - plain          {d:+.1} us (native {:+.1}, plain {:+.1} vs noop; p50 {:.1} vs {:.1} us)  target < {T4_MAX_US} us: {}",
            n.diff, p.diff, n.p50, p.p50,
            if d < T4_MAX_US { "met" } else { "MISSED" }
        );
    }
}

/// The shared-core phase's per-rep figures, with T3 and T1 from them.
fn shared_block(out: &mut String, k: &Knobs, shared: &[Shared]) {
    let _ = writeln!(
        out,
        "== shared core: {} reps of {}, all fronts saturated at once on one core; per-rep",
        k.shared_reps, k.shared_duration
    );
    let _ = writeln!(
        out,
        "   figures of fronts measured at the same instants, their median and min..max"
    );
    let _ = writeln!(
        out,
        "{:<45} {:>9} {:>20}   each rep",
        "figure", "median", "min..max"
    );
    let rows = [
        ("native", "plain", Some(("T3", T3_MIN_RATIO))),
        ("serving-picker", "noop", Some(("T1", T1_MIN_RATIO))),
    ];
    for (a, b, target) in rows {
        for rps in [true, false] {
            let value = |s: &Shared| if rps { s.rps } else { s.cpu_us_req };
            let mut v = Vec::new();
            for rep in 1..=k.shared_reps {
                let find = |c: &str| shared.iter().find(|s| s.rep == rep && s.config == c);
                if let (Some(x), Some(y)) = (find(a), find(b)) {
                    if value(y) != 0.0 {
                        v.push(Some(if rps {
                            value(x) / value(y)
                        } else {
                            value(x) - value(y)
                        }));
                    }
                }
            }
            if v.is_empty() {
                continue;
            }
            let fmt = if rps { Fmt::Ratio } else { Fmt::Signed2 };
            let (med, range, all) = spread(&v, fmt);
            let name = if rps {
                format!("{:<4} {:<11} {a} / {b}", k.load(), "req/s")
            } else {
                format!("{:<4} {:<11} {a} - {b}", k.load(), "cpu_us/req")
            };
            let _ = writeln!(out, "{name:<45} {med:>9} {range:>20}  {all}");
            if let (true, Some((tname, limit))) = (rps, target) {
                let known: Vec<f64> = v.iter().flatten().copied().collect();
                let verdict = if median(&known) >= limit {
                    "met"
                } else {
                    "MISSED"
                };
                let n_ok = known.iter().filter(|x| **x >= limit).count();
                let label = format!("{tname} shared {name}");
                let _ = writeln!(out, "{label:<45} {med:>9} [{range}]  target >= {limit}: {verdict} ({n_ok} of {} reps)", known.len());
            }
        }
    }
}

fn size_of(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

// ------------------------------------------------------------------ main

fn main() {
    let k = Knobs::read().unwrap_or_else(|e| fail(e));
    if Command::new("wrk").arg("--version").output().is_err() {
        fail("wrk not found (apt-get install wrk)");
    }
    if !k.envoy.is_file() {
        fail(format!(
            "envoy not found at {} (run 'make envoy' or set ENVOY_BIN)",
            k.envoy.display()
        ));
    }
    if !k.noop_wasm.is_file() {
        fail(format!("no-op module not found at {} (cargo build --release --target wasm32-wasip1 --manifest-path benches/noop-filter/Cargo.toml)", k.noop_wasm.display()));
    }
    if k.il_laps > 0 && !k.latency_client.is_file() {
        fail(format!("latency client not found at {} (cargo build --release --manifest-path benches/latency-client/Cargo.toml, or BENCH_IL_LAPS=0)", k.latency_client.display()));
    }
    if !k.sp_wasm.is_file() {
        fail(format!(
            "serving-picker module not found at {} (run 'make build' or set SERVING_PICKER_WASM)",
            k.sp_wasm.display()
        ));
    }
    if !k.sp_native.is_file() {
        fail(format!(
            "native module not found at {} (run 'make build' or set SERVING_PICKER_NATIVE)",
            k.sp_native.display()
        ));
    }
    for p in [FRONT_PORT, FRONT_ADMIN, BACKEND_ADMIN]
        .into_iter()
        .chain(BACKEND_PORTS)
    {
        if port_in_use(p) {
            fail(format!(
                "port {p} is already in use (a previous run still going?)"
            ));
        }
    }
    let pin = Pinning::detect("front Envoy on core 0; backend Envoy and wrk on core 1");
    let _ = std::fs::remove_dir_all(&k.work);
    std::fs::create_dir_all(&k.work)
        .unwrap_or_else(|e| fail(format!("create {}: {e}", k.work.display())));
    let m = Modules {
        sp_wasm: k.work.join("serving_picker.wasm"),
        noop_wasm: k.work.join("noop_filter.wasm"),
        native_dir: k.work.join("native"),
    };
    for (from, to) in [
        (&k.sp_wasm, m.sp_wasm.clone()),
        (&k.noop_wasm, m.noop_wasm.clone()),
        (&k.sp_native, m.native_dir.join("libserving_picker.so")),
    ] {
        copy_into(from, &to).unwrap_or_else(|e| fail(e));
    }

    // Configs, each validated.
    let work = k.work.clone();
    let path = |name: &str| work.join(name);
    write_json(&path("backend.json"), &backend_bootstrap()).unwrap_or_else(|e| fail(e));
    for c in &k.configs {
        write_json(
            &path(&format!("front-{c}.json")),
            &front_bootstrap(&k, &m, c, FRONT_PORT, FRONT_ADMIN),
        )
        .unwrap_or_else(|e| fail(e));
    }
    for (i, c) in k.il_configs.iter().enumerate() {
        let i = i as u16;
        write_json(
            &path(&format!("front-il-{c}.json")),
            &front_bootstrap(&k, &m, c, IL_PORT + i, IL_ADMIN + i),
        )
        .unwrap_or_else(|e| fail(e));
    }
    std::fs::write(path("override-client.lua"), override_client_lua()).unwrap_or_else(|e| fail(e));
    println!("== validating configs");
    std::env::set_var("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", &m.native_dir);
    for f in std::iter::once("backend.json".to_string())
        .chain(k.configs.iter().map(|c| format!("front-{c}.json")))
    {
        validate(&k.envoy, &path(&f)).unwrap_or_else(|e| fail(e));
        println!("   {f} OK");
    }

    println!("== starting backend Envoy ({})", pin.said);
    let hz = cpu::clock_ticks_per_second() as f64;
    let mut bench = Bench {
        k,
        pin,
        hz,
        backend_pid: 0,
    };
    let mut backend = bench.start_envoy(&bench.pin.others, "backend", &path("backend.json"));
    backend
        .wait_ready(
            SocketAddr::from(([127, 0, 0, 1], BACKEND_ADMIN)),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| fail(e));
    bench.backend_pid = backend.pid();
    for p in BACKEND_PORTS {
        let r = support::http::get(SocketAddr::from(([127, 0, 0, 1], p)), "/", &[]);
        if r.body != format!("ok {p}\n") {
            fail(format!("backend {p} does not answer"));
        }
    }
    let k = &bench.k;
    let load = k.load();
    println!(
        "== {} rounds, interleaved (order reversed in even rounds); per front Envoy:",
        k.rounds
    );
    println!(
        "   throughput: wrk -t{} -c{} -d{} after a warm-up of {}",
        k.threads, k.connections, k.duration, k.warmup
    );
    println!(
        "   latency:    wrk -t1 -c1 -d{}, right after, on the same Envoy",
        k.lat_duration
    );
    println!("{}", row(&ROW_HEAD.map(String::from)));

    let mut thr: Vec<Run> = Vec::new();
    let mut lat: Vec<Run> = Vec::new();
    let front_admin = SocketAddr::from(([127, 0, 0, 1], FRONT_ADMIN));
    let url = format!("http://127.0.0.1:{FRONT_PORT}/");
    for round in 1..=k.rounds {
        // Odd rounds in order, even rounds reversed: a drift within a round
        // hits each side of a pair alike over two rounds.
        let mut order = k.configs.clone();
        if round % 2 == 0 {
            order.reverse();
        }
        for c in &order {
            let name = format!("front-{c}-r{round}");
            let mut front = bench.start_envoy(
                &bench.pin.measured,
                &name,
                &path(&format!("front-{c}.json")),
            );
            front
                .wait_ready(front_admin, Duration::from_secs(10))
                .unwrap_or_else(|e| fail(e));
            let r = support::http::get(SocketAddr::from(([127, 0, 0, 1], FRONT_PORT)), "/", &[]);
            if r.status != 200 {
                fail(format!(
                    "{c}: front Envoy does not proxy to the backend (see {})",
                    path(&format!("{name}.log")).display()
                ));
            }
            let _ = run_wrk(
                &bench.pin.others,
                &bench.wrk_args(c, true, &k.warmup),
                &url,
                &path(&format!("{name}.warmup.txt")),
            )
            .wait();
            // serving-picker hands its request counters to Envoy once per
            // tick: wait one out, idle, before each /stats snapshot.
            std::thread::sleep(STATS_SETTLE);
            let _ = std::fs::write(
                path(&format!("{name}.stats0.txt")),
                admin_get(FRONT_ADMIN, "/stats"),
            );
            thr.push(bench.measure(
                c,
                round,
                &load,
                &mut front,
                &path(&format!("{name}.wrk.txt")),
                &bench.wrk_args(c, true, &k.duration),
            ));
            std::thread::sleep(STATS_SETTLE);
            let _ = std::fs::write(
                path(&format!("{name}.stats.txt")),
                admin_get(FRONT_ADMIN, "/stats"),
            );
            let _ = std::fs::write(
                path(&format!("{name}.clusters.txt")),
                admin_get(FRONT_ADMIN, "/clusters"),
            );
            // The latency phase on the same, already warm Envoy.
            lat.push(bench.measure(
                c,
                round,
                "c1",
                &mut front,
                &path(&format!("{name}.lat.txt")),
                &bench.wrk_args(c, false, &k.lat_duration),
            ));
            front.stop();
        }
    }
    write_raw(&path("raw.tsv"), &thr);
    write_raw(&path("raw-latency.tsv"), &lat);

    // The interleaved c1 phase, then the shared-core phase, on the same fronts.
    let mut il: Vec<Interleaved> = Vec::new();
    let mut shared: Vec<Shared> = Vec::new();
    if k.il_laps > 0 {
        println!(
            "== interleaved c1: {} side by side (front Envoys on core 0), {} laps after {}",
            k.il_configs.join(" "),
            k.il_laps,
            k.il_warmup
        );
        let mut fronts = Vec::new();
        let mut targets = Vec::new();
        for (i, c) in k.il_configs.iter().enumerate() {
            let i = i as u16;
            let mut f = bench.start_envoy(
                &bench.pin.measured,
                &format!("front-il-{c}"),
                &path(&format!("front-il-{c}.json")),
            );
            f.wait_ready(
                SocketAddr::from(([127, 0, 0, 1], IL_ADMIN + i)),
                Duration::from_secs(10),
            )
            .unwrap_or_else(|e| fail(e));
            let mut target = format!("{c}=127.0.0.1:{}", IL_PORT + i);
            if c == "override-client" {
                for v in OVERRIDE_ROTATIONS {
                    let _ = write!(target, "|{OVERRIDE_HEADER}: {v}");
                }
            }
            targets.push(target);
            fronts.push(f);
        }
        // serving-picker serves from its snapshot once the first refresh is published.
        std::thread::sleep(Duration::from_secs(2));
        let t0: Vec<u64> = fronts.iter().map(|f| cpu::process_ticks(f.pid())).collect();
        let out_path = path("interleaved.out");
        let mut args = vec![k.il_warmup.to_string(), k.il_laps.to_string()];
        args.extend(targets);
        let mut client = Process::start(
            &bench.pin.others,
            &k.latency_client,
            &args,
            &[],
            &k.work,
            "interleaved",
            None,
        )
        .unwrap_or_else(|e| fail(e));
        while client.is_running() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        let laps = k.il_laps + k.il_warmup;
        let mut raw = String::new();
        for (i, c) in k.il_configs.iter().enumerate() {
            let Some(line) = text
                .lines()
                .find(|l| l.split('\t').next() == Some(c.as_str()))
            else {
                fail(format!("interleaved c1: the latency client failed\n{text}"));
            };
            let f: Vec<&str> = line.split('\t').collect();
            let num = |j: usize| {
                f.get(j)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            let ticks = cpu::process_ticks(fronts[i].pid()).saturating_sub(t0[i]);
            let x = Interleaved {
                config: c.clone(),
                n: num(1) as u64,
                p50: num(2),
                p90: num(3),
                p99: num(4),
                mean: num(5),
                diff: num(6),
                lo: num(7),
                hi: num(8),
                cpu_us_req: ticks as f64 * 1e6 / hz / laps as f64,
            };
            let _ = writeln!(raw, "{line}\t{:.2}", x.cpu_us_req);
            il.push(x);
        }
        let _ = std::fs::write(path("raw-interleaved.tsv"), raw);

        if k.shared_reps > 0 {
            println!(
                "== shared core: {} on core 0 at once, each driven by its own wrk -c{}, {} x {}",
                k.il_configs.join(" "),
                k.connections,
                k.shared_reps,
                k.shared_duration
            );
            let mut raw = String::new();
            for rep in 1..=k.shared_reps {
                let t0: Vec<u64> = fronts.iter().map(|f| cpu::process_ticks(f.pid())).collect();
                let mut wrks = Vec::new();
                for (i, c) in k.il_configs.iter().enumerate() {
                    let url = format!("http://127.0.0.1:{}/", IL_PORT + i as u16);
                    let out = path(&format!("shared-{c}-{rep}.txt"));
                    wrks.push((
                        run_wrk(
                            &bench.pin.others,
                            &bench.wrk_args(c, true, &k.shared_duration),
                            &url,
                            &out,
                        ),
                        out,
                    ));
                }
                for (w, _) in &mut wrks {
                    let _ = w.wait();
                }
                for (i, c) in k.il_configs.iter().enumerate() {
                    let w = read_wrk(&wrks[i].1);
                    let ticks = cpu::process_ticks(fronts[i].pid()).saturating_sub(t0[i]);
                    let s = Shared {
                        config: c.clone(),
                        rep,
                        rps: w.rps.parse().unwrap_or(f64::NAN),
                        cpu_us_req: if w.requests > 0 {
                            ticks as f64 * 1e6 / hz / w.requests as f64
                        } else {
                            0.0
                        },
                        non2xx: w.non2xx,
                        socket_errors: w.socket_errors,
                    };
                    let _ = writeln!(
                        raw,
                        "{c}\t{rep}\t{}\t{:.2}\t{}\t{}",
                        w.rps, s.cpu_us_req, s.non2xx, s.socket_errors
                    );
                    shared.push(s);
                }
            }
            let _ = std::fs::write(path("raw-shared.tsv"), raw);
        }
        for mut f in fronts {
            f.stop();
        }
    }

    // The summary, printed and kept in summary.txt.
    let p = Phases {
        thr: &thr,
        lat: &lat,
    };
    let mut s = String::from("\n");
    phase_tables(
        &mut s,
        k,
        &thr,
        &format!(
            "throughput phase: median of {} rounds, wrk -t{} -c{} -d{}, {}",
            k.rounds, k.threads, k.connections, k.duration, bench.pin.said
        ),
    );
    let _ = writeln!(s, "(cpu us/req: the front Envoy's CPU time per request over the measured window; cpu-noop: the");
    let _ = writeln!(s, " filter's own cost above the no-op filter's, less sensitive to load on the machine than req/s.");
    let _ = writeln!(s, " p50 here is mostly queueing at {} connections; the latency phase below has the added latency)", k.connections);
    s.push('\n');
    phase_tables(&mut s, k, &lat, &format!("latency phase: median of {} rounds, wrk -t1 -c1 -d{} (one request in flight), same Envoys", k.rounds, k.lat_duration));
    s.push('\n');
    paired_table(&mut s, k, &p, false, &format!("paired per round: figures from the runs of the same round, then their median and min..max over {} rounds", k.rounds));
    let (qt, ql) = (quiet_rounds(&thr), quiet_rounds(&lat));
    let some_noisy = qt < k.rounds || ql < k.rounds;
    if some_noisy {
        let _ = writeln!(s, "NOTE: quiet rounds: {qt} of {} (throughput), {ql} of {} (latency); rounds with a run marked '*' are noisy.", k.rounds, k.rounds);
        if qt > 0 || ql > 0 {
            s.push('\n');
            paired_table(&mut s, k, &p, true, "the same, quiet rounds only");
        }
    }
    s.push('\n');
    targets_block(&mut s, k, &p, false, &format!("targets: medians of the paired figures over {} rounds [min..max]; figures, not asserts", k.rounds));
    // req/s measures the front only while the front is the bottleneck.
    let low = thr.iter().filter(|r| r.front_pct.round() < 90.0).count();
    if low > 0 {
        let _ = writeln!(s, "NOTE: in {low} of {} throughput runs the front Envoy used under 90% of its core: something else", k.rounds * k.configs.len());
        let _ = writeln!(s, "      (other load, the backend or wrk) limited req/s there, so the T1 ratio is diluted; the cpu ratio is the cross-check.");
    }
    if some_noisy && (qt > 0 || ql > 0) {
        targets_block(
            &mut s,
            k,
            &p,
            true,
            &format!("targets, quiet rounds only ({qt} throughput, {ql} latency)"),
        );
    }
    if k.probe > 0 {
        s.push('\n');
        probe_block(&mut s, k, &p);
    }
    if k.stack > 1 {
        s.push('\n');
        stack_block(&mut s, k, &p);
    }
    if k.decompose {
        s.push('\n');
        decompose_block(&mut s, k, &p);
    }
    if !il.is_empty() {
        s.push('\n');
        interleaved_block(&mut s, k, &il);
    }
    if !shared.is_empty() {
        s.push('\n');
        shared_block(&mut s, k, &shared);
    }
    s.push('\n');
    checks(&mut s, k, &m, &thr, &lat);
    let _ = writeln!(
        s,
        "raw rounds: {} (throughput), {} (latency), {} (shared core); configs, logs and wrk output: {}",
        path("raw.tsv").display(),
        path("raw-latency.tsv").display(),
        path("raw-shared.tsv").display(),
        k.work.display()
    );
    print!("{s}");
    let _ = std::fs::write(path("summary.txt"), &s);
    backend.stop();

    // Errors in any config's run make its figures, and the ratios against
    // it, meaningless: they fail the benchmark.
    for (file, runs) in [("raw.tsv", &thr), ("raw-latency.tsv", &lat)] {
        let bad: Vec<String> = runs
            .iter()
            .filter(|r| r.errors() > 0)
            .map(|r| format!("{} round {}: {}", r.config, r.round, r.errors()))
            .collect();
        if !bad.is_empty() {
            fail(format!(
                "non-2xx responses or socket errors in {}: {}",
                path(file).display(),
                bad.join(", ")
            ));
        }
    }
    let bad: Vec<String> = shared
        .iter()
        .filter(|s| s.non2xx + s.socket_errors > 0)
        .map(|s| format!("{} rep {}: {}", s.config, s.rep, s.non2xx + s.socket_errors))
        .collect();
    if !bad.is_empty() {
        fail(format!(
            "non-2xx responses or socket errors in {}: {}",
            path("raw-shared.tsv").display(),
            bad.join(", ")
        ));
    }
}

fn write_raw(path: &Path, runs: &[Run]) {
    let text: String = runs.iter().map(Run::tsv).collect();
    std::fs::write(path, text).unwrap_or_else(|e| fail(format!("write {}: {e}", path.display())));
}

/// The checks under the tables: module sizes, the native module's counters,
/// serving-picker's errors, its counters over the last throughput window and
/// its requests per backend.
fn checks(s: &mut String, k: &Knobs, m: &Modules, thr: &[Run], lat: &[Run]) {
    let path = |name: &str| k.work.join(name);
    let _ = writeln!(
        s,
        "wasm module sizes: noop {} bytes (copied at start from {})",
        size_of(&m.noop_wasm),
        k.noop_wasm.display()
    );
    let _ = writeln!(
        s,
        "                   serving-picker {} bytes (copied at start from {})",
        size_of(&m.sp_wasm),
        k.sp_wasm.display()
    );
    let _ = writeln!(
        s,
        "native module: {} bytes (copied at start from {})",
        size_of(&m.native_dir.join("libserving_picker.so")),
        k.sp_native.display()
    );
    if let Ok(stats) =
        std::fs::read_to_string(path(&format!("front-native-r{}.stats.txt", k.rounds)))
    {
        let _ = writeln!(
            s,
            "check native: module stats after the last round's throughput window:"
        );
        let lines: Vec<&str> = stats
            .lines()
            .filter(|l| l.starts_with("dynamicmodulescustom."))
            .collect();
        if lines.is_empty() {
            let _ = writeln!(s, "    (none)");
        }
        for l in lines {
            let _ = writeln!(s, "    {l}");
        }
    }
    if std::fs::read(&m.noop_wasm).ok() == std::fs::read(&m.sp_wasm).ok() {
        let _ = writeln!(
            s,
            "NOTE: the serving-picker slot holds the same module as noop (harness test run)"
        );
    }
    s.push('\n');
    for (phase, runs) in [(k.load(), thr), ("c1".to_string(), lat)] {
        let sp: Vec<&Run> = runs
            .iter()
            .filter(|r| r.config == "serving-picker")
            .collect();
        let reqs: u64 = sp.iter().map(|r| r.requests).sum();
        let bad: u64 = sp.iter().map(|r| r.non2xx).sum();
        let sock: u64 = sp.iter().map(|r| r.socket_errors).sum();
        let erq: i64 = sp.iter().map(|r| r.envoy_rq).sum();
        let eok: i64 = sp.iter().map(|r| r.envoy_ok).sum();
        let frac = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let _ = writeln!(
            s,
            "check serving-picker {phase}: wrk non-2xx/3xx {bad} of {reqs} (fraction {:.6}), socket errors {sock}; envoy non-2xx {} of {erq} (fraction {:.6})",
            frac(bad as f64, reqs as f64),
            erq - eok,
            frac((erq - eok) as f64, erq as f64)
        );
    }
    let last = |suffix: &str| {
        std::fs::read_to_string(path(&format!(
            "front-serving-picker-r{}.{suffix}",
            k.rounds
        )))
        .unwrap_or_default()
    };
    let (before, after) = (last("stats0.txt"), last("stats.txt"));
    let parse = |text: &str| -> BTreeMap<String, i64> {
        text.lines()
            .filter_map(|l| l.split_once(": "))
            .filter(|(n, _)| n.starts_with("wasmcustom."))
            .filter_map(|(n, v)| v.trim().parse().ok().map(|v| (n.to_string(), v)))
            .collect()
    };
    let (b, a) = (parse(&before), parse(&after));
    if a.is_empty() {
        let _ = writeln!(s, "check serving-picker: no wasmcustom.* stats (wasmcustom.serving_picker.pick.ready absent)");
    } else {
        let rq = thr
            .iter()
            .find(|r| r.config == "serving-picker" && r.round == k.rounds)
            .map_or(0, |r| r.envoy_rq);
        let _ = writeln!(s, "check serving-picker: filter stats in the last round, over the throughput window (and since start):");
        for (name, v) in &a {
            let gauge = [".snapshot.bytes", ".snapshot.clusters", ".snapshot.hosts"]
                .iter()
                .any(|g| name.ends_with(g));
            if gauge {
                let _ = writeln!(s, "    {name:<58} {v:>10} (gauge)");
            } else {
                let d = v - b.get(name).copied().unwrap_or(0);
                let share = if name.ends_with("pick.ready") && rq > 0 {
                    format!(", {:.4} of the {rq} requests", d as f64 / rq as f64)
                } else {
                    String::new()
                };
                let _ = writeln!(s, "    {name:<58} {d:>10} ({v} since start){share}");
            }
        }
    }
    let _ = writeln!(
        s,
        "check serving-picker: requests per backend host in the last round (throughput phase):"
    );
    let clusters = last("clusters.txt");
    let hosts: Vec<&str> = clusters
        .lines()
        .filter(|l| l.starts_with("backend::127.0.0.1:") && l.contains("::rq_total::"))
        .collect();
    if hosts.is_empty() {
        let _ = writeln!(s, "    (not available)");
    }
    for h in hosts {
        let _ = writeln!(s, "    {h}");
    }
    s.push('\n');
}
