//! The per-request hot path: `RoutingTable::decide(cluster)` (one hash lookup
//! by the cluster's name, one O(1) pick), for a cluster of 3 to 10,000 hosts
//! in a table of 100 clusters, with equal weights (round robin) and mixed
//! weights (alias table).
//!
//! `cargo bench --bench pick` runs criterion, then prints a summary table
//! measured with a plain loop (median of rounds), so that both weightings
//! are side by side. Without `--bench` (`cargo test --benches`) it only
//! checks that every configuration picks. `PICK_SUMMARY_ONLY=1` skips
//! criterion and prints only the table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod common;

use criterion::{BenchmarkId, Criterion, Throughput};
use serving_picker_wasm::table::{Decision, RoutingTable};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

const CLUSTERS: usize = 100;
const SIZES: [usize; 4] = [3, 100, 1_000, 10_000];
/// The target, natively, at every size.
const TARGET_NS: f64 = 200.0;

fn pick(table: &RoutingTable, cluster: &str) -> usize {
    match table.decide(black_box(cluster)) {
        Decision::Pick { host, .. } => host.len(),
        other => panic!("{other:?}"),
    }
}

fn bench_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    group.throughput(Throughput::Elements(1));
    for hosts in SIZES {
        for (label, weighted) in [("equal", false), ("weighted", true)] {
            let (table, name) = common::table_with(CLUSTERS, hosts, weighted);
            group.bench_with_input(BenchmarkId::new(label, hosts), &name, |b, name| {
                b.iter(|| pick(&table, name.as_str()))
            });
        }
    }
    group.finish();
}

/// ns per `decide`: the median of `rounds` rounds of `per_round` calls.
fn ns_per_pick(hosts: usize, weighted: bool, rounds: usize, per_round: u32) -> f64 {
    let (table, name) = common::table_with(CLUSTERS, hosts, weighted);
    let name = name.as_str();
    for _ in 0..per_round {
        black_box(pick(&table, name));
    }
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_round {
                black_box(pick(&table, name));
            }
            start.elapsed().as_nanos() as f64 / f64::from(per_round)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// For comparison: only the hash lookup by name (std `HashMap<String, _>`,
/// SipHash, the same 100 names), median ns like `ns_per_pick`.
fn ns_per_lookup(rounds: usize, per_round: u32) -> f64 {
    let map: HashMap<String, usize> = (0..CLUSTERS)
        .map(|c| (common::cluster_name(c), c))
        .collect();
    let name = common::cluster_name(CLUSTERS / 2);
    let name = name.as_str();
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_round {
                black_box(map.get(black_box(name)));
            }
            start.elapsed().as_nanos() as f64 / f64::from(per_round)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn summary(rounds: usize, per_round: u32) {
    let arch = if cfg!(target_arch = "wasm32") {
        "wasm32"
    } else {
        "native"
    };
    println!();
    println!("RoutingTable::decide, {CLUSTERS} clusters, lookup by &str name, 2 retry alternates");
    println!("({arch}; median of {rounds} rounds x {per_round} picks, plain loop)");
    println!("| hosts  | equal ns | weighted ns |");
    println!("|-------:|---------:|------------:|");
    let mut worst: f64 = 0.0;
    let mut rows = Vec::new();
    for hosts in SIZES {
        let equal = ns_per_pick(hosts, false, rounds, per_round);
        let weighted = ns_per_pick(hosts, true, rounds, per_round);
        worst = worst.max(equal).max(weighted);
        println!("| {hosts:>6} | {equal:>8.1} | {weighted:>11.1} |");
        rows.push((equal, weighted));
    }
    let lookup = ns_per_lookup(rounds, per_round);
    println!("(of which the HashMap<String, _> lookup by name alone: {lookup:.1} ns)");
    let (first, last) = (rows[0], rows[rows.len() - 1]);
    println!(
        "10,000 vs 3 hosts: equal x{:.2}, weighted x{:.2}; worst {worst:.1} ns; target < {TARGET_NS} ns: {}",
        last.0 / first.0,
        last.1 / first.1,
        if worst < TARGET_NS { "met" } else { "NOT met" }
    );
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    if !benchmarking {
        // `cargo test --benches`: a smoke run.
        for hosts in SIZES {
            for weighted in [false, true] {
                let (table, name) = common::table_with(CLUSTERS, hosts, weighted);
                let mut seen = std::collections::HashSet::new();
                for _ in 0..hosts.min(1000) * 4 {
                    match table.decide(&name) {
                        Decision::Pick { host, .. } => {
                            seen.insert(host.to_string());
                        }
                        other => panic!("{other:?}"),
                    }
                }
                assert!(seen.len() > hosts.min(1000) / 2, "{hosts} {weighted}");
            }
        }
        println!("pick: smoke run ok (use `cargo bench --bench pick` to measure)");
        return;
    }
    if std::env::var_os("PICK_SUMMARY_ONLY").is_some() {
        // Only the plain-loop table (e.g. for a wasm32-wasip1 build run in V8).
        summary(9, 2_000_000);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
        .nresamples(20_000)
        .configure_from_args();
    bench_decide(&mut c);
    c.final_summary();
    summary(9, 2_000_000);
}
