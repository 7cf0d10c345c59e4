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

mod configs;
mod measure;
mod summary;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serving_picker_benches::{
    copy_into, die, knob, knob_number, knob_path, port_in_use, validate, write_json, Pinning,
};
use support::cpu;
use support::process::Process;

use configs::{
    backend_bootstrap, front_bootstrap, override_client_lua, Modules, OVERRIDE_ROTATIONS,
};
use measure::{admin_get, read_wrk, row, run_wrk, Bench, Run, ROW_HEAD};

const BENCH: &str = "bench-e2e";

const FRONT_PORT: u16 = 21000;

const FRONT_ADMIN: u16 = 21901;

const BACKEND_ADMIN: u16 = 21900;

const BACKEND_PORTS: [u16; 3] = [21081, 21082, 21083];

/// The interleaved phase's fronts: listeners from here, admins from IL_ADMIN.
const IL_PORT: u16 = 21010;

const IL_ADMIN: u16 = 21910;

const OVERRIDE_HEADER: &str = "x-gateway-destination-endpoint";

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

fn write_raw(path: &Path, runs: &[Run]) {
    let text: String = runs.iter().map(Run::tsv).collect();
    std::fs::write(path, text).unwrap_or_else(|e| fail(format!("write {}: {e}", path.display())));
}

impl Knobs {
    /// What the benchmark needs on the machine, or a message saying how to get it.
    fn check(&self) {
        if Command::new("wrk").arg("--version").output().is_err() {
            fail("wrk not found (apt-get install wrk)");
        }
        let needed = [
            (&self.envoy, true, "envoy", "run 'make envoy' or set ENVOY_BIN"),
            (&self.noop_wasm, true, "no-op module", "cargo build --release --target wasm32-wasip1 --manifest-path benches/noop-filter/Cargo.toml"),
            (&self.latency_client, self.il_laps > 0, "latency client", "cargo build --release --manifest-path benches/latency-client/Cargo.toml, or BENCH_IL_LAPS=0"),
            (&self.sp_wasm, true, "serving-picker module", "run 'make build' or set SERVING_PICKER_WASM"),
            (&self.sp_native, true, "native module", "run 'make build' or set SERVING_PICKER_NATIVE"),
        ];
        for (path, wanted, what, how) in needed {
            if wanted && !path.is_file() {
                fail(format!("{what} not found at {} ({how})", path.display()));
            }
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
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }
}

/// A fresh work dir: the modules copied in (a rebuild during the run cannot
/// put two different modules into one run's rounds), every config written
/// and validated.
fn prepare(k: &Knobs) -> Modules {
    let _ = std::fs::remove_dir_all(&k.work);
    std::fs::create_dir_all(&k.work)
        .unwrap_or_else(|e| fail(format!("create {}: {e}", k.work.display())));
    let m = Modules {
        sp_wasm: k.path("serving_picker.wasm"),
        noop_wasm: k.path("noop_filter.wasm"),
        native_dir: k.path("native"),
    };
    for (from, to) in [
        (&k.sp_wasm, m.sp_wasm.clone()),
        (&k.noop_wasm, m.noop_wasm.clone()),
        (&k.sp_native, m.native_dir.join("libserving_picker.so")),
    ] {
        copy_into(from, &to).unwrap_or_else(|e| fail(e));
    }
    let write = |name: &str, v: &serde_json::Value| {
        write_json(&k.path(name), v).unwrap_or_else(|e| fail(e))
    };
    write("backend.json", &backend_bootstrap());
    for c in &k.configs {
        write(
            &format!("front-{c}.json"),
            &front_bootstrap(k, &m, c, FRONT_PORT, FRONT_ADMIN),
        );
    }
    for (i, c) in k.il_configs.iter().enumerate() {
        let i = i as u16;
        write(
            &format!("front-il-{c}.json"),
            &front_bootstrap(k, &m, c, IL_PORT + i, IL_ADMIN + i),
        );
    }
    std::fs::write(k.path("override-client.lua"), override_client_lua())
        .unwrap_or_else(|e| fail(e));
    println!("== validating configs");
    // Every Envoy (validate too) finds lib<name>.so in the copy's folder.
    std::env::set_var("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", &m.native_dir);
    for f in std::iter::once("backend.json".to_string())
        .chain(k.configs.iter().map(|c| format!("front-{c}.json")))
    {
        validate(&k.envoy, &k.path(&f)).unwrap_or_else(|e| fail(e));
        println!("   {f} OK");
    }
    m
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The backend Envoy, answering on every backend port.
fn start_backend(bench: &mut Bench) -> Process {
    println!("== starting backend Envoy ({})", bench.pin.said);
    let mut backend =
        bench.start_envoy(&bench.pin.others, "backend", &bench.k.path("backend.json"));
    backend
        .wait_ready(loopback(BACKEND_ADMIN), Duration::from_secs(10))
        .unwrap_or_else(|e| fail(e));
    bench.backend_pid = backend.pid();
    for p in BACKEND_PORTS {
        if support::http::get(loopback(p), "/", &[]).body != format!("ok {p}\n") {
            fail(format!("backend {p} does not answer"));
        }
    }
    backend
}

/// The rounds: each config on a fresh front Envoy, a throughput run then a
/// latency run; odd rounds in order, even rounds reversed, so that a drift
/// within a round hits each side of a pair alike over two rounds.
fn rounds(bench: &Bench) -> (Vec<Run>, Vec<Run>) {
    let k = &bench.k;
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
    let (mut thr, mut lat) = (Vec::new(), Vec::new());
    let url = format!("http://127.0.0.1:{FRONT_PORT}/");
    for round in 1..=k.rounds {
        let mut order = k.configs.clone();
        if round % 2 == 0 {
            order.reverse();
        }
        for c in &order {
            let name = format!("front-{c}-r{round}");
            let file = |suffix: &str| k.path(&format!("{name}.{suffix}"));
            let mut front = bench.start_envoy(
                &bench.pin.measured,
                &name,
                &k.path(&format!("front-{c}.json")),
            );
            front
                .wait_ready(loopback(FRONT_ADMIN), Duration::from_secs(10))
                .unwrap_or_else(|e| fail(e));
            if support::http::get(loopback(FRONT_PORT), "/", &[]).status != 200 {
                fail(format!(
                    "{c}: front Envoy does not proxy to the backend (see {})",
                    file("log").display()
                ));
            }
            let _ = run_wrk(
                &bench.pin.others,
                &bench.wrk_args(c, true, &k.warmup),
                &url,
                &file("warmup.txt"),
            )
            .wait();
            // serving-picker hands its request counters to Envoy once per
            // tick: wait one out, idle, before each /stats snapshot.
            std::thread::sleep(STATS_SETTLE);
            let _ = std::fs::write(file("stats0.txt"), admin_get(FRONT_ADMIN, "/stats"));
            thr.push(bench.measure(
                c,
                round,
                &k.load(),
                &mut front,
                &file("wrk.txt"),
                &bench.wrk_args(c, true, &k.duration),
            ));
            std::thread::sleep(STATS_SETTLE);
            let _ = std::fs::write(file("stats.txt"), admin_get(FRONT_ADMIN, "/stats"));
            let _ = std::fs::write(file("clusters.txt"), admin_get(FRONT_ADMIN, "/clusters"));
            // The latency phase on the same, already warm Envoy.
            lat.push(bench.measure(
                c,
                round,
                "c1",
                &mut front,
                &file("lat.txt"),
                &bench.wrk_args(c, false, &k.lat_duration),
            ));
            front.stop();
        }
    }
    write_raw(&k.path("raw.tsv"), &thr);
    write_raw(&k.path("raw-latency.tsv"), &lat);
    (thr, lat)
}

/// The interleaved c1 phase, then the shared-core phase, on one front Envoy
/// per config, all side by side on the measured core.
fn side_by_side(bench: &Bench) -> (Vec<Interleaved>, Vec<Shared>) {
    let k = &bench.k;
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
            &k.path(&format!("front-il-{c}.json")),
        );
        f.wait_ready(loopback(IL_ADMIN + i), Duration::from_secs(10))
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
    let il = interleaved(bench, &fronts, targets);
    let shared = if k.shared_reps > 0 {
        shared_core(bench, &fronts)
    } else {
        Vec::new()
    };
    for mut f in fronts {
        f.stop();
    }
    (il, shared)
}

/// The latency client's laps over the fronts: its figures, and each front's CPU per request.
fn interleaved(bench: &Bench, fronts: &[Process], targets: Vec<String>) -> Vec<Interleaved> {
    let k = &bench.k;
    let t0: Vec<u64> = fronts.iter().map(|f| cpu::process_ticks(f.pid())).collect();
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
    let text = std::fs::read_to_string(k.path("interleaved.out")).unwrap_or_default();
    let laps = (k.il_laps + k.il_warmup) as f64;
    let (mut il, mut raw) = (Vec::new(), String::new());
    for (i, c) in k.il_configs.iter().enumerate() {
        let Some(line) = text
            .lines()
            .find(|l| l.split('\t').next() == Some(c.as_str()))
        else {
            fail(format!("interleaved c1: the latency client failed\n{text}"));
        };
        let f: Vec<f64> = line
            .split('\t')
            .map(|v| v.parse().unwrap_or(f64::NAN))
            .collect();
        let num = |j: usize| f.get(j).copied().unwrap_or(f64::NAN);
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
            cpu_us_req: ticks as f64 * 1e6 / bench.hz / laps,
        };
        let _ = writeln!(raw, "{line}\t{:.2}", x.cpu_us_req);
        il.push(x);
    }
    let _ = std::fs::write(k.path("raw-interleaved.tsv"), raw);
    il
}

/// Every front saturated at once by its own wrk, `BENCH_SHARED_REPS` times.
fn shared_core(bench: &Bench, fronts: &[Process]) -> Vec<Shared> {
    let k = &bench.k;
    println!(
        "== shared core: {} on core 0 at once, each driven by its own wrk -c{}, {} x {}",
        k.il_configs.join(" "),
        k.connections,
        k.shared_reps,
        k.shared_duration
    );
    let (mut shared, mut raw) = (Vec::new(), String::new());
    for rep in 1..=k.shared_reps {
        let t0: Vec<u64> = fronts.iter().map(|f| cpu::process_ticks(f.pid())).collect();
        let mut wrks: Vec<_> = k
            .il_configs
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let url = format!("http://127.0.0.1:{}/", IL_PORT + i as u16);
                let out = k.path(&format!("shared-{c}-{rep}.txt"));
                (
                    run_wrk(
                        &bench.pin.others,
                        &bench.wrk_args(c, true, &k.shared_duration),
                        &url,
                        &out,
                    ),
                    out,
                )
            })
            .collect();
        for (w, _) in &mut wrks {
            let _ = w.wait();
        }
        for (i, c) in k.il_configs.iter().enumerate() {
            let w = read_wrk(&wrks[i].1);
            let ticks = cpu::process_ticks(fronts[i].pid()).saturating_sub(t0[i]);
            let cpu_us_req = if w.requests > 0 {
                ticks as f64 * 1e6 / bench.hz / w.requests as f64
            } else {
                0.0
            };
            let _ = writeln!(
                raw,
                "{c}\t{rep}\t{}\t{cpu_us_req:.2}\t{}\t{}",
                w.rps, w.non2xx, w.socket_errors
            );
            shared.push(Shared {
                config: c.clone(),
                rep,
                rps: w.rps.parse().unwrap_or(f64::NAN),
                cpu_us_req,
                non2xx: w.non2xx,
                socket_errors: w.socket_errors,
            });
        }
    }
    let _ = std::fs::write(k.path("raw-shared.tsv"), raw);
    shared
}

/// Errors in any config's run make its figures, and the ratios against it,
/// meaningless: they fail the benchmark.
fn fail_on_errors(k: &Knobs, thr: &[Run], lat: &[Run], shared: &[Shared]) {
    let mut bad = Vec::new();
    for (file, runs) in [("raw.tsv", thr), ("raw-latency.tsv", lat)] {
        let b: Vec<String> = runs
            .iter()
            .filter(|r| r.errors() > 0)
            .map(|r| format!("{} round {}: {}", r.config, r.round, r.errors()))
            .collect();
        if !b.is_empty() {
            bad.push(format!("{}: {}", k.path(file).display(), b.join(", ")));
        }
    }
    let b: Vec<String> = shared
        .iter()
        .filter(|s| s.non2xx + s.socket_errors > 0)
        .map(|s| format!("{} rep {}: {}", s.config, s.rep, s.non2xx + s.socket_errors))
        .collect();
    if !b.is_empty() {
        bad.push(format!(
            "{}: {}",
            k.path("raw-shared.tsv").display(),
            b.join(", ")
        ));
    }
    if !bad.is_empty() {
        fail(format!(
            "non-2xx responses or socket errors in {}",
            bad.join("; ")
        ));
    }
}

fn main() {
    let k = Knobs::read().unwrap_or_else(|e| fail(e));
    k.check();
    let pin = Pinning::detect("front Envoy on core 0; backend Envoy and wrk on core 1");
    let modules = prepare(&k);
    let hz = cpu::clock_ticks_per_second() as f64;
    let mut bench = Bench {
        k,
        pin,
        hz,
        backend_pid: 0,
    };
    let mut backend = start_backend(&mut bench);
    let (thr, lat) = rounds(&bench);
    let (il, shared) = if bench.k.il_laps > 0 {
        side_by_side(&bench)
    } else {
        (Vec::new(), Vec::new())
    };
    let text = summary::summary(&bench.k, bench.pin.said, &modules, &thr, &lat, &il, &shared);
    print!("{text}");
    let _ = std::fs::write(bench.k.path("summary.txt"), &text);
    backend.stop();
    fail_on_errors(&bench.k, &thr, &lat, &shared);
}
