//! The repeated changes' figures: the main thread's CPU per change-driven
//! refresh, net of the steady rate, set against Envoy alone.

use crate::endpoints::{Change, State};
use crate::envoy::Gauges;
use crate::log::{LogScan, Refresh};
use crate::Scenario;
use std::collections::BTreeMap;
use support::cpu::Window;

/// The kinds of repeated change: every cluster 1% (every EDS file changes),
/// and with more than one cluster one cluster 10% (one EDS file: one
/// Deployment's rolling update; the i-th change takes cluster i).
pub const KINDS: [(&str, &str); 2] = [
    ("all", "all clusters, 1% each"),
    ("one", "one cluster, 10%"),
];

pub fn kinds(nclusters: usize) -> &'static [(&'static str, &'static str)] {
    if nclusters > 1 {
        &KINDS
    } else {
        &KINDS[..1]
    }
}

pub fn change_of(state: &mut State, kind: &str, i: usize) -> Change {
    match kind {
        "all" => state.change(0.01, None),
        _ => state.change(0.1, Some(i)),
    }
}

/// The no-filter reference of one kind: Envoy's own main-thread cost of
/// taking the same EDS changes in.
pub struct Reference {
    pub idle: Window,
    pub phase: Window,
    pub files: usize,
    pub updates: i64,
}

/// One kind's repeated-change phase with the filter.
pub struct Repeated {
    pub k: usize,
    pub files: usize,
    pub flipped: usize,
    pub added: usize,
    pub hosts_late: bool,
    pub fallback_waits: usize,
    pub renames: Vec<i64>,
    pub base: Window,
    pub periodic: Window,
    pub phase: Window,
    /// The gauges at the window edges: a, m, b, p0, p1.
    pub stats: [Gauges; 5],
    pub log: LogScan,
}

/// The figures of one kind (see the header).
pub struct RepFigures {
    pub ms: f64,
    pub ms_ns: Option<f64>,
    pub periodic_ms: f64,
    pub periodic_ms_ns: Option<f64>,
    pub base_rate_ms_s: f64,
    pub base_ok: bool,
    pub periodic_ok: bool,
    pub lines: usize,
    pub published: usize,
    pub narrowed: usize,
    pub others: BTreeMap<String, f64>,
    pub fulls: i64,
    pub reasons: BTreeMap<String, usize>,
    pub unchanged: i64,
    pub ms_wo_unchanged: f64,
    pub ms_ns_wo_unchanged: Option<f64>,
    pub flags: Vec<String>,
    pub skips_phase: i64,
    pub skips_base: i64,
    pub latency: Vec<f64>,
    pub vm_us: Vec<f64>,
    pub admin_bytes: Vec<f64>,
    pub e2e_ms: Vec<f64>,
    pub reference: Option<(f64, Option<f64>, bool)>,
}

/// The main thread's CPU in window `w` in ms, from ticks and from schedstat
/// ns; minus the rate of `rate` over `w`'s length when given.
pub fn win_ms(w: &Window, rate: Option<&Window>, hz: f64) -> (f64, Option<f64>) {
    let t = w.main_ticks - rate.map_or(0.0, |r| r.main_ticks / r.secs * w.secs);
    let n = match (w.main_ns, rate.map(|r| r.main_ns)) {
        (Some(n), None) => Some(n),
        (Some(n), Some(Some(rn))) => Some(n - rn / rate.map_or(1.0, |r| r.secs) * w.secs),
        _ => None,
    };
    (t * 1000.0 / hz, n.map(|x| x / 1e6))
}

pub fn rep_figures(rep: &Repeated, reference: Option<&Reference>, hz: f64) -> RepFigures {
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

/// A scenario's repeated-change phase of `kind` and its figures.
pub fn figures_of<'a>(r: &'a Scenario, kind: &str, hz: f64) -> Option<(&'a Repeated, RepFigures)> {
    let rep = r.rep.get(kind)?;
    Some((rep, rep_figures(rep, r.reference.get(kind), hz)))
}
