//! The table of figures, a column per scenario.

use crate::envoy::Latency;
use crate::figures::{figures_of, rep_figures, KINDS};
use crate::log::{LogScan, Refresh};
use crate::Scenario;
use serving_picker_benches::median;
use std::fmt::Write as _;

pub fn fmt_int(v: f64) -> String {
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

pub fn both(t: f64, n: Option<f64>) -> String {
    format!(
        "{t:.0} (schedstat {})",
        n.map_or("-".into(), |v| format!("{v:.0}"))
    )
}

pub fn lat_cell(d: Option<&Latency>) -> Option<String> {
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

pub fn refresh_cell(x: Option<&&Refresh>) -> Option<String> {
    x.map(|x| {
        format!(
            "{} us VM, {} ms e2e, {} B",
            fmt_int(x.vm_us as f64),
            fmt_int(x.e2e_ms as f64),
            fmt_int(x.admin_bytes as f64)
        )
    })
}

pub fn mb(kb: Option<&i64>) -> Option<String> {
    kb.map(|kb| format!("{:.1}", *kb as f64 / 1024.0))
}

pub fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// The table's rows: a label and how a scenario's cell is made.
#[derive(Default)]
struct Rows(Vec<(String, Cell)>);

type Cell = Box<dyn Fn(&Scenario) -> Option<String>>;

impl Rows {
    fn row(&mut self, label: &str, cell: impl Fn(&Scenario) -> Option<String> + 'static) {
        self.0.push((label.to_string(), Box::new(cell)));
    }

    /// The table in Markdown, a column per scenario (`-`: no figure).
    fn markdown(&self, rs: &[Scenario]) -> String {
        let cells: Vec<(String, Vec<String>)> = self
            .0
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
}

fn published(s: &LogScan) -> usize {
    s.published().len()
}

pub fn table(rs: &[Scenario], hz: f64) -> String {
    let mut rows = Rows::default();
    scenario_rows(&mut rows);
    first_load_rows(&mut rows);
    steady_rows(&mut rows);
    admin_output_rows(&mut rows);
    one_change_rows(&mut rows);
    memory_rows(&mut rows);
    latency_rows(&mut rows);
    for (kind, label) in KINDS {
        repeated_change_rows(&mut rows, kind, label, hz);
        repeated_change_detail_rows(&mut rows, kind, hz);
    }
    periodic_rows(&mut rows, hz);
    health_rows(&mut rows);
    rows.markdown(rs)
}

/// The scenario: its endpoints, files and the snapshot it must publish.
fn scenario_rows(rows: &mut Rows) {
    rows.row("EDS endpoints (clusters x hosts)", |r| {
        Some(format!(
            "{} ({} x {})",
            fmt_int(r.endpoints as f64),
            r.nclusters,
            r.nhosts
        ))
    });
    rows.row("EDS files, bytes", |r| Some(fmt_int(r.eds_bytes as f64)));
    rows.row("expected snapshot hosts / clusters", |r| {
        Some(format!(
            "{} / {}",
            fmt_int(r.expect_hosts as f64),
            fmt_int(r.expect_clusters as f64)
        ))
    });
}

/// Envoy's start and the first full snapshot.
fn first_load_rows(rows: &mut Rows) {
    rows.row("Envoy start -> /ready, ms", |r| {
        r.start_to_ready_ms.map(|v| v.to_string())
    });
    rows.row("snapshot.hosts at /ready", |r| {
        r.hosts_at_ready.map(|v| fmt_int(v as f64))
    });
    rows.row("/ready -> full snapshot published, ms", |r| {
        r.ready_to_full_ms.map(|v| v.to_string())
    });
    rows.row("refreshes logged / published until full", move |r| {
        Some(format!(
            "{} / {}",
            r.first.refreshes.len(),
            published(&r.first)
        ))
    });
    rows.row("first load: the refresh that published it", |r| {
        refresh_cell(r.first.published().last())
    });
    rows.row("first load: gauges busy_us / admin_bytes", |r| {
        r.g_first.as_ref().map(|g| {
            format!(
                "{} / {}",
                fmt_int(g.refresh_busy_us as f64),
                fmt_int(g.admin_bytes as f64)
            )
        })
    });
    rows.row("snapshot.bytes (encoded)", |r| {
        r.g_first.as_ref().map(|g| fmt_int(g.bytes as f64))
    });
}

/// Steady polling with no change: the refresh cost and CPU.
fn steady_rows(rows: &mut Rows) {
    rows.row(
        "steady polls: busy_us gauge (last full refresh) median / max (n)",
        |r| {
            let v: Vec<f64> = r.steady_busy.iter().map(|x| *x as f64).collect();
            (!v.is_empty()).then(|| {
                format!(
                    "{} / {} ({})",
                    fmt_int(median(&v)),
                    fmt_int(max_of(&v)),
                    v.len()
                )
            })
        },
    );
    rows.row("steady refreshes: e2e ms median (debug log)", |r| {
        let v: Vec<f64> = r
            .steady_log
            .refreshes
            .iter()
            .map(|x| x.e2e_ms as f64)
            .collect();
        (!v.is_empty()).then(|| fmt_int(median(&v)))
    });
    rows.row("  of them logged as changed (dump re-parsed)", move |r| {
        Some(format!(
            "{} (published {})",
            r.steady_log.refreshes.len(),
            published(&r.steady_log)
        ))
    });
    rows.row("steady CPU % of a core: main / workers / Envoy", |r| {
        r.cpu_steady
            .map(|c| format!("{:.1} / {:.1} / {:.1}", c.0, c.1, c.2))
    });
}

/// The admin output the filter reads, and what fetching it costs Envoy.
fn admin_output_rows(rows: &mut Rows) {
    rows.row("config_dump(EDS) bytes", |r| {
        r.curl.as_ref().map(|c| fmt_int(c.dump_bytes))
    });
    rows.row("  curl ms: no filter / filter polling", |r| {
        Some(format!(
            "{:.1} / {:.1}",
            r.curl_nofilter.as_ref()?.dump_ms,
            r.curl.as_ref()?.dump_ms
        ))
    });
    rows.row("/clusters?format=json bytes", |r| {
        r.curl.as_ref().map(|c| fmt_int(c.clusters_bytes))
    });
    rows.row("  curl ms: no filter / filter polling", |r| {
        Some(format!(
            "{:.1} / {:.1}",
            r.curl_nofilter.as_ref()?.clusters_ms,
            r.curl.as_ref()?.clusters_ms
        ))
    });
}

/// One change of 1% of the endpoints: to the snapshot, and after.
fn one_change_rows(rows: &mut Rows) {
    rows.row("1% change: endpoints flipped + added, files", |r| {
        r.change
            .as_ref()
            .map(|(c, _, _)| format!("{} + {}, {}", c.flipped, c.added, c.files))
    });
    rows.row("1% change: rename -> snapshot, ms", |r| {
        r.change
            .as_ref()
            .and_then(|(_, t, _)| t.map(|v| v.to_string()))
    });
    rows.row("1% change: snapshots published", |r| {
        r.change
            .as_ref()
            .map(|(_, _, s)| s.published().len().to_string())
    });
    rows.row("1% change: last published refresh", |r| {
        r.change
            .as_ref()
            .and_then(|(_, _, s)| refresh_cell(s.published().last()))
    });
    rows.row("1% change: max VM us of published refreshes", |r| {
        let (_, _, s) = r.change.as_ref()?;
        let v: Vec<f64> = s.published().iter().map(|x| x.vm_us as f64).collect();
        (!v.is_empty()).then(|| fmt_int(max_of(&v)))
    });
    rows.row("after the change: busy_us median (n)", |r| {
        let v: Vec<f64> = r.after_busy.iter().map(|x| *x as f64).collect();
        (!v.is_empty()).then(|| format!("{} ({})", fmt_int(median(&v)), v.len()))
    });
}

/// Envoy's RSS along the run, and without the filter.
fn memory_rows(rows: &mut Rows) {
    rows.row("RSS MB: at /ready", |r| mb(r.rss.get("ready")));
    rows.row("RSS MB: full snapshot", |r| mb(r.rss.get("full")));
    rows.row("RSS MB: steady (~10 refreshes later)", |r| {
        mb(r.rss.get("steady"))
    });
    rows.row("RSS MB: after change +10 / +20 / +30 refreshes", |r| {
        (!r.rss_series.is_empty()).then(|| {
            r.rss_series
                .iter()
                .filter_map(|x| mb(Some(x)))
                .collect::<Vec<_>>()
                .join(" / ")
        })
    });
    rows.row("RSS MB: same Envoy without the filter", |r| {
        mb(r.rss.get("nofilter"))
    });
}

/// Request latency through Envoy without and with the filter.
fn latency_rows(rows: &mut Rows) {
    rows.row("latency ms p50/p99/max: no filter", |r| {
        lat_cell(r.lat.get("nofilter"))
    });
    rows.row("latency ms: filter, steady refreshes", |r| {
        lat_cell(r.lat.get("steady"))
    });
    rows.row("latency ms: filter, during the 1% change", |r| {
        lat_cell(r.lat.get("change"))
    });
}

/// One kind of repeated change (`KINDS`): its latency and main-thread time
/// per change, against Envoy alone.
fn repeated_change_rows(rows: &mut Rows, kind: &'static str, label: &str, hz: f64) {
    rows.row(
        &format!("repeated change, {label}: n, flipped + added, EDS files"),
        move |r| {
            figures_of(r, kind, hz).map(|(rep, _)| {
                format!("{}, {} + {}, {}", rep.k, rep.flipped, rep.added, rep.files)
            })
        },
    );
    rows.row(
        "  rename -> published (refresh line), ms median / max",
        move |r| {
            let (_, f) = figures_of(r, kind, hz)?;
            (!f.latency.is_empty()).then(|| {
                format!(
                    "{:.0} / {:.0} (n={})",
                    median(&f.latency),
                    max_of(&f.latency),
                    f.latency.len()
                )
            })
        },
    );
    rows.row(
        "  MAIN THREAD ms per change (minus steady rate)",
        move |r| {
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
        },
    );
    rows.row("    Envoy alone, no filter (taking the EDS in)", move |r| {
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
    });
    rows.row(
        "    difference: the filter's (w/o unchanged full refr.)",
        move |r| {
            let (_, f) = figures_of(r, kind, hz)?;
            let (rt, rn, _) = f.reference?;
            Some(both(
                f.ms_wo_unchanged - rt,
                f.ms_ns_wo_unchanged.zip(rn).map(|(a, b)| a - b),
            ))
        },
    );
}

/// One kind of repeated change, the detail: the filter's VM time, other
/// threads, the refreshes, and the raw figures behind the rows above.
fn repeated_change_detail_rows(rows: &mut Rows, kind: &'static str, hz: f64) {
    rows.row(
        "  VM us median / max; admin bytes median; e2e ms median",
        move |r| {
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
        },
    );
    rows.row(
        "    other threads, ms per change (net, >= 2 ms)",
        move |r| {
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
        },
    );
    rows.row(
        "  refreshes (stats) / refresh lines (narrowed) / published",
        move |r| {
            let (_, f) = figures_of(r, kind, hz)?;
            let reasons: Vec<String> = f.reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
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
        },
    );
    rows.row(
        "  raw: phase s, main ticks | steady s, ticks | polls skipped",
        move |r| {
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
        },
    );
    rows.row(
        "  raw, no filter: phase s, ticks | idle s, ticks",
        move |r| {
            let x = r.reference.get(kind)?;
            Some(format!(
                "{:.1}, {} | {:.1}, {}",
                x.phase.secs, x.phase.main_ticks, x.idle.secs, x.idle.main_ticks
            ))
        },
    );
}

/// The steady rate and the periodic full refresh, per kind of change.
fn periodic_rows(rows: &mut Rows, hz: f64) {
    rows.row(
        "steady: main thread ms/s between full refreshes",
        move |r| {
            let v: Vec<String> = KINDS
                .iter()
                .filter_map(|(k, _)| r.rep.get(k))
                .map(|rep| format!("{:.1}", rep_figures(rep, None, hz).base_rate_ms_s))
                .collect();
            (!v.is_empty()).then(|| v.join(" / "))
        },
    );
    rows.row(
        "steady: periodic full refresh (no change), main ms",
        move |r| {
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
        },
    );
}

/// Correctness and the run's conditions: routing, errors, warnings, the machine.
fn health_rows(rows: &mut Rows) {
    rows.row("routing check: picks in the right tier", |r| {
        r.routing.clone()
    });
    rows.row(
        "refresh_error at: steady / +admin curls / +change / +30 / +repeat",
        |r| {
            Some(
                ["steady", "curls", "change", "after", "rep"]
                    .iter()
                    .map(|k| r.errors.get(k).map_or("-".into(), |v| fmt_int(*v as f64)))
                    .collect::<Vec<_>>()
                    .join(" / "),
            )
        },
    );
    rows.row(
        "polls ok (full refreshes + gate skips) / errors / published",
        |r| {
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
        },
    );
    rows.row("filter warnings in the log", |r| {
        Some(r.warnings.len().to_string())
    });
    rows.row("leader thread", |r| r.leader.clone());
    rows.row("machine CPU % (all cores) / others, steady", |r| {
        r.cpu_steady.map(|c| format!("{:.0} / {:.0}", c.3, c.4))
    });
    rows.row("loadavg at start", |r| Some(r.loadavg.clone()));
}
