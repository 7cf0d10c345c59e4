//! The summary: each phase's medians, the figures paired within a round,
//! the targets, the probes' blocks, the interleaved and shared-core phases,
//! and the checks under them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serving_picker_benches::{median, spread, Fmt};

use crate::configs::Modules;
use crate::measure::Run;
use crate::{Interleaved, Knobs, Shared, T1_MIN_RATIO, T2_MAX_US, T3_MIN_RATIO, T4_MAX_US};

/// Medians of a config's runs (quiet ones only when asked).
pub fn medians(runs: &[Run], c: &str, quiet_only: bool) -> [f64; 4] {
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

pub fn results_table(out: &mut String, k: &Knobs, runs: &[Run], quiet_only: bool, title: &str) {
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

pub fn phase_tables(out: &mut String, k: &Knobs, runs: &[Run], title: &str) {
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

pub struct Phases<'a> {
    pub thr: &'a [Run],
    pub lat: &'a [Run],
}

/// A paired figure, one per round, in round order, from the runs of the same
/// round: `metric` ("req/s", "cpu us/req", "cpu ratio", "p50 us", "p99 us")
/// of `pair` ("a / b": a ratio, "a - b": a difference) in the throughput
/// phase or the latency one; quiet rounds only (no run of the phase noisy)
/// when asked. Its print format with it.
pub fn values(
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
pub fn figure(load: &str, metric: &str, pair: &str) -> String {
    format!("{load:<4} {metric:<11} {pair}")
}

/// The paired figures' table: (throughput phase, metric, pair).
pub const PAIRED: [(bool, &str, &str); 13] = [
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

pub fn paired_table(out: &mut String, k: &Knobs, p: &Phases, quiet: bool, title: &str) {
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

pub fn quiet_rounds(runs: &[Run]) -> usize {
    let rounds: std::collections::BTreeSet<usize> = runs.iter().map(|r| r.round).collect();
    rounds
        .iter()
        .filter(|&&round| !runs.iter().any(|r| r.round == round && r.noisy))
        .count()
}

/// A figure's median and [min..max] on one line, with `unit`.
pub fn figure_line(
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
pub fn targets_block(out: &mut String, k: &Knobs, p: &Phases, quiet: bool, title: &str) {
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
pub fn probe_block(out: &mut String, k: &Knobs, p: &Phases) {
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
pub fn stack_block(out: &mut String, k: &Knobs, p: &Phases) {
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
pub fn decompose_block(out: &mut String, k: &Knobs, p: &Phases) {
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
pub fn interleaved_block(out: &mut String, k: &Knobs, il: &[Interleaved]) {
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
pub fn shared_block(out: &mut String, k: &Knobs, shared: &[Shared]) {
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

pub fn size_of(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// The checks under the tables: module sizes, the native module's counters,
/// serving-picker's errors, its counters over the last throughput window and
/// its requests per backend.
pub fn checks(s: &mut String, k: &Knobs, m: &Modules, thr: &[Run], lat: &[Run]) {
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

/// The whole summary, as printed and kept in summary.txt.
pub fn summary(
    k: &Knobs,
    pinning: &str,
    m: &Modules,
    thr: &[Run],
    lat: &[Run],
    il: &[Interleaved],
    shared: &[Shared],
) -> String {
    let p = Phases { thr, lat };
    let mut s = String::from("\n");
    phase_tables(
        &mut s,
        k,
        thr,
        &format!(
            "throughput phase: median of {} rounds, wrk -t{} -c{} -d{}, {pinning}",
            k.rounds, k.threads, k.connections, k.duration
        ),
    );
    let _ = writeln!(s, "(cpu us/req: the front Envoy's CPU time per request over the measured window; cpu-noop: the");
    let _ = writeln!(s, " filter's own cost above the no-op filter's, less sensitive to load on the machine than req/s.");
    let _ = writeln!(s, " p50 here is mostly queueing at {} connections; the latency phase below has the added latency)", k.connections);
    s.push('\n');
    phase_tables(&mut s, k, lat, &format!("latency phase: median of {} rounds, wrk -t1 -c1 -d{} (one request in flight), same Envoys", k.rounds, k.lat_duration));
    s.push('\n');
    paired_table(&mut s, k, &p, false, &format!("paired per round: figures from the runs of the same round, then their median and min..max over {} rounds", k.rounds));
    // A round counts as quiet only if none of its runs in that phase was noisy.
    let (qt, ql) = (quiet_rounds(thr), quiet_rounds(lat));
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
    // req/s measures the front only while the front is the bottleneck: say so when it was not.
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
        interleaved_block(&mut s, k, il);
    }
    if !shared.is_empty() {
        s.push('\n');
        shared_block(&mut s, k, shared);
    }
    s.push('\n');
    checks(&mut s, k, m, thr, lat);
    let _ = writeln!(
        s,
        "raw rounds: {} (throughput), {} (latency), {} (shared core); configs, logs and wrk output: {}",
        k.path("raw.tsv").display(),
        k.path("raw-latency.tsv").display(),
        k.path("raw-shared.tsv").display(),
        k.work.display()
    );
    s
}
