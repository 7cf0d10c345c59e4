//! The native form's per-worker table without Envoy: rebuild of a cluster
//! (reading hosts, planning, mapping back to healthy indexes), the per-host
//! reads (ABI calls in Envoy), the table's heap, and the per-request pick.
//! Prints figures; asserts nothing.
//!
//! `cargo bench -p serving-picker-native --bench table --features testing`
//! (`make bench-native`).
//! The host source here is plain vectors; in Envoy each read is an ABI call
//! (the e2e figure `serving_picker.rebuild_us` includes those).
//! The second table: what the main thread's metadata copy costs (the main
//! thread reads it and plans from it, a worker plans from it) beside the
//! plan that reads metadata through the host source.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::time::Instant;

use serving_picker::metadata_board::{self, BoardSource};
use serving_picker::table::{build, metadata_keys, Choice};
use serving_picker::testing as fake;
use serving_picker_core::config::SelectionConfig;

/// Counts live heap bytes and the peak.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// A global allocator is an unsafe trait: it counts, then hands each call to the system's.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live =
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed) + layout.size() as isize;
        PEAK.fetch_max(live.max(0) as usize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    println!("native table (no Envoy): rebuild, heap, pick");
    println!(
        "{:>7} {:>11} {:>10} {:>11} {:>14} {:>14} {:>8}",
        "hosts",
        "rebuild ms",
        "(zone) ms",
        "reads/host",
        "table heap KB",
        "peak build KB",
        "pick ns"
    );
    for n in [3usize, 100, 1_000, 10_000] {
        let owned = fake::big_cluster(n, 10);
        let cluster = fake::Indexed::new(&owned);
        let plain = SelectionConfig::default();
        let zoned = SelectionConfig {
            local_zone: Some("zone-a".into()),
            local_zone_min_share: 0.2,
            ..SelectionConfig::default()
        };
        let rounds = if n >= 10_000 { 30 } else { 200 };
        let time = |cfg: &SelectionConfig| {
            median(
                (0..rounds)
                    .map(|_| {
                        let t = Instant::now();
                        black_box(build(black_box(&cluster), cfg));
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect(),
            )
        };
        let ms = time(&plain);
        let zms = time(&zoned);
        let reads_before = cluster.reads();
        // Heap: what the table keeps, and the peak while building.
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before.max(0) as usize, Ordering::Relaxed);
        let built = build(&cluster, &plain);
        let peak = PEAK.load(Ordering::Relaxed) as isize - before;
        let reads = (cluster.reads() - reads_before) as f64 / n as f64;
        let table = built.table;
        drop(built.not_offered);
        let kept = LIVE.load(Ordering::Relaxed) - before;
        // Pick: the per-request work (no retries).
        let picks = 10_000_000u64;
        let t = Instant::now();
        let mut acc = 0u64;
        for s in 0..picks {
            if let Choice::Host { slot, .. } = table.choose(black_box(s), 0, |_| false) {
                acc = acc.wrapping_add(u64::from(slot.healthy_index));
            }
        }
        black_box(acc);
        let pick_ns = t.elapsed().as_secs_f64() * 1e9 / picks as f64;
        println!(
            "{:>7} {:>11.3} {:>10.3} {:>11.2} {:>14.1} {:>14.1} {:>8.2}",
            n,
            ms,
            zms,
            reads,
            kept as f64 / 1024.0,
            peak as f64 / 1024.0,
            pick_ns
        );
    }
    println!();
    println!("metadata copy (main thread reads, every instance plans from it)");
    println!(
        "{:>7} {:>13} {:>16} {:>16} {:>10}",
        "hosts", "direct ms", "main: copy+plan", "worker: plan", "copy KB"
    );
    for n in [3usize, 100, 1_000, 10_000] {
        let owned = fake::big_cluster(n, 10);
        let cluster = fake::Indexed::new(&owned);
        let cfg = SelectionConfig {
            local_zone: Some("zone-a".into()),
            local_zone_min_share: 0.2,
            ..SelectionConfig::default()
        };
        let keys = metadata_keys(&cfg);
        let ns = cfg.metadata_namespace.clone();
        let rounds = if n >= 10_000 { 30 } else { 200 };
        let time = |f: &dyn Fn()| {
            median(
                (0..rounds)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .collect(),
            )
        };
        let direct = time(&|| {
            black_box(build(black_box(&cluster), &cfg));
        });
        let main = time(&|| {
            let copy = metadata_board::read(&cluster, "c", &ns, keys);
            black_box(build(&BoardSource::new(&cluster, &copy), &cfg));
        });
        let copy = metadata_board::read(&cluster, "c", &ns, keys);
        let worker = time(&|| {
            black_box(build(&BoardSource::new(&cluster, &copy), &cfg));
        });
        println!(
            "{:>7} {:>13.3} {:>16.3} {:>16.3} {:>10.1}",
            n,
            direct,
            main,
            worker,
            copy.bytes as f64 / 1024.0
        );
    }
    // Weighted (alias table) pick at 10,000 hosts.
    let mut cluster = fake::big_cluster(10_000, 0);
    for (i, h) in cluster.priorities[0].iter_mut().enumerate() {
        h.weight = 1 + (i % 7) as u32;
    }
    let table = build(&fake::Indexed::new(&cluster), &SelectionConfig::default()).table;
    let picks = 10_000_000u64;
    let t = Instant::now();
    let mut acc = 0u64;
    for s in 0..picks {
        if let Choice::Host { slot, .. } = table.choose(black_box(s), 0, |_| false) {
            acc = acc.wrapping_add(u64::from(slot.healthy_index));
        }
    }
    black_box(acc);
    println!(
        "weighted pick (alias table), 10,000 hosts: {:.2} ns; table heap {:.1} KB",
        t.elapsed().as_secs_f64() * 1e9 / picks as f64,
        table.heap_bytes() as f64 / 1024.0
    );
}
