//! `make rollout-picture`: the one-replica rolling update under a steady
//! load through three real Envoys, drawn from the run's own figures:
//! requests per second to each pod and failed requests per second over
//! time, one panel per setup:
//! - plain Envoy given only ready endpoints (terminating ones dropped, as
//!   Istio publishes them without the persistent-session label; plain round
//!   robin). Not Envoy Gateway: EG >= 1.6 sends every not-ready pod as
//!   DRAINING and reaches a lone terminating pod through Envoy's panic mode
//!   (docs/envoy-gateway.md);
//! - serving-picker's wasm form (every endpoint with its conditions);
//! - serving-picker's native form.
//!
//! The walk is the soak's walk A (tests/e2e/both/soak.rs), with the e2e
//! harness (backends that serve through their preStop then close, EDS
//! files, envoy.yaml's retries and outlier detection, the paced load).
//! Writes an SVG (plotters; SVG text needs no fonts) to the path given
//! (default docs/img/rollout.svg) and prints the per-phase tables.
//! Knobs: ROLLOUT_PHASE_MS (default 1500), ROLLOUT_RATE (requests/s in
//! total, default 600).

use std::collections::BTreeMap;
use std::time::Duration;

use plotters::prelude::*;
use serde_json::{json, Value};
use serving_picker_benches::picture;
use support::load::{Load, LoadConfig, LoadReport};
use support::tweak::{envoy_yaml_outlier_detection, envoy_yaml_retry_policy, merge_cluster};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/rollout";
/// Width of one bar of the rate curves.
const BUCKET: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Plain,
    Module(Form),
}

impl Setup {
    fn title(self) -> &'static str {
        match self {
            Setup::Plain => "plain Envoy, given only ready endpoints",
            Setup::Module(Form::Wasm) => "serving-picker, wasm form",
            Setup::Module(Form::Native) => "serving-picker, native form",
        }
    }
}

#[derive(Clone, Copy)]
enum St {
    Serving,
    ServingTerminating,
    TerminatingNotServing,
    NotServing,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the control plane publishes for these pods.
fn eds(setup: Setup, pods: &[(&Backend, St)]) -> Vec<Endpoint> {
    pods.iter()
        .filter_map(|(b, st)| match (setup, st) {
            (Setup::Module(_), St::Serving) => Some(Endpoint::serving(b.addr())),
            (Setup::Module(_), St::ServingTerminating) => {
                Some(Endpoint::serving_terminating(b.addr()))
            }
            (Setup::Module(_), St::TerminatingNotServing) => {
                Some(Endpoint::terminating_not_serving(b.addr()))
            }
            (Setup::Module(_), St::NotServing) => Some(Endpoint::not_serving(b.addr())),
            (Setup::Plain, St::Serving) => Some(Endpoint::no_metadata(b.addr())),
            (Setup::Plain, _) => None,
        })
        .collect()
}

fn start_envoy(setup: Setup, initial: &[Endpoint]) -> Envoy {
    let (form, filter) = match setup {
        Setup::Plain => (Form::Wasm, None),
        Setup::Module(form) => (form, Some(plugin_config(Value::Null))),
    };
    EnvoyBuilder::new()
        .form(form)
        .tag(&format!("rollout-{setup:?}"))
        .with_filter(filter.as_deref())
        .eds_cluster(CLUSTER, initial)
        .retry_policy(envoy_yaml_retry_policy())
        .bootstrap_hook(merge_cluster(
            CLUSTER,
            json!({"outlier_detection": envoy_yaml_outlier_detection()}),
        ))
        .start()
}

/// The one-replica walk under load; its report.
fn walk(setup: Setup, p: Duration, rate: f64) -> LoadReport {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = start_envoy(setup, &eds(setup, &[(&a, St::Serving)]));
    settle(&envoy, PATH, &[], "A serves", served_by(&a));
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig::paced(8, rate / 8.0, PATH),
        "A serving",
    );
    let step = |name: &str, pods: &[(&Backend, St)]| {
        load.phase(name);
        envoy.set_endpoints(CLUSTER, &eds(setup, pods));
    };
    std::thread::sleep(p);
    step("A terminating (preStop)", &[(&a, St::ServingTerminating)]);
    a.begin_termination(p * 3 + p / 2);
    std::thread::sleep(p);
    step(
        "B not yet serving",
        &[(&a, St::ServingTerminating), (&b, St::NotServing)],
    );
    std::thread::sleep(p);
    step(
        "B serving",
        &[(&a, St::ServingTerminating), (&b, St::Serving)],
    );
    std::thread::sleep(p);
    step(
        "A not serving, exits",
        &[(&a, St::TerminatingNotServing), (&b, St::Serving)],
    );
    std::thread::sleep(p);
    wait_until("A's listener closed", Duration::from_secs(5), || {
        a.is_stopped()
    });
    step("A removed", &[(&b, St::Serving)]);
    std::thread::sleep(p);
    let report = load.finish();
    println!("{}", report.phase_table(setup.title()));
    report
}

/// A curve: (seconds, requests/s).
type Curve = Vec<(f64, f64)>;

/// Per bucket: requests per second to each pod, and failed ones.
fn series(report: &LoadReport) -> (BTreeMap<String, Curve>, Curve) {
    // Whole bins only: a last partial one would read as a drop.
    let n = (report.end.as_secs_f64() / BUCKET.as_secs_f64()).floor() as usize;
    let per_s = 1.0 / BUCKET.as_secs_f64();
    let mut pods: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut failed = vec![0.0; n];
    for r in &report.records {
        let i = (r.sent.as_secs_f64() / BUCKET.as_secs_f64()) as usize;
        if i >= n {
            continue;
        }
        match r.backend() {
            Some(pod) => pods.entry(pod.to_string()).or_insert_with(|| vec![0.0; n])[i] += per_s,
            None => failed[i] += per_s,
        }
    }
    let xy = |v: Vec<f64>| -> Curve {
        // Steps: each bin's rate over its whole width.
        let w = BUCKET.as_secs_f64();
        v.into_iter()
            .enumerate()
            .flat_map(|(i, y)| [(i as f64 * w, y), ((i + 1) as f64 * w, y)])
            .collect()
    };
    (
        pods.into_iter().map(|(k, v)| (k, xy(v))).collect(),
        xy(failed),
    )
}

fn draw(out: &str, runs: &[(Setup, LoadReport)], rate: f64) -> Result<(), String> {
    let title = format!(
        "One-replica rolling update under {rate:.0} req/s: requests/s per pod and failed requests/s ({} ms bins)",
        BUCKET.as_millis()
    );
    let (root, panels) = picture::panels(out, 1000, 300, &title, runs.len())?;
    let x_max = runs
        .iter()
        .map(|(_, r)| r.end.as_secs_f64())
        .fold(0.0, f64::max);
    for ((setup, report), area) in runs.iter().zip(panels.iter()) {
        let (pods, failed) = series(report);
        let caption = format!(
            "{}: {} of {} requests failed",
            setup.title(),
            report.failures(),
            report.requests()
        );
        let mut chart = picture::chart(
            area,
            &caption,
            0.0..x_max,
            0.0..rate * 1.25,
            ("seconds", "requests/s"),
            false,
        )?;
        let marks: Vec<(String, f64)> = report
            .marks
            .iter()
            .map(|(name, t)| (name.clone(), t.as_secs_f64()))
            .collect();
        picture::marks(&mut chart, &marks, BLACK.mix(0.25))?;
        let colours = [BLUE, GREEN, MAGENTA, CYAN];
        for (i, (pod, xy)) in pods.iter().enumerate() {
            let c = colours[i % colours.len()];
            chart
                .draw_series(LineSeries::new(xy.clone(), c.stroke_width(2)))
                .map_err(picture::failed)?
                .label(format!("pod {pod}"))
                .legend(picture::legend_line(c));
        }
        chart
            .draw_series(LineSeries::new(failed, RED.stroke_width(2)))
            .map_err(picture::failed)?
            .label("failed")
            .legend(picture::legend_line(RED));
        picture::legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    }
    root.present().map_err(picture::failed)
}

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/img/rollout.svg".into());
    let p = Duration::from_millis(env_u64("ROLLOUT_PHASE_MS", 1500).max(1000));
    let rate = env_u64("ROLLOUT_RATE", 600).max(80) as f64;
    let runs: Vec<(Setup, LoadReport)> = [
        Setup::Plain,
        Setup::Module(Form::Wasm),
        Setup::Module(Form::Native),
    ]
    .into_iter()
    .map(|s| (s, walk(s, p, rate)))
    .collect();
    for (s, r) in &runs {
        println!(
            "rollout | {} | {} requests | {} failed | {:.0} req/s",
            s.title(),
            r.requests(),
            r.failures(),
            r.rate()
        );
    }
    match draw(&out, &runs, rate) {
        Ok(()) => println!("wrote {out}"),
        Err(e) => {
            eprintln!("rollout-picture: drawing {out}: {e}");
            std::process::exit(1);
        }
    }
}
