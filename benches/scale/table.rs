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

pub fn table(rs: &[Scenario], hz: f64) -> String {
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
