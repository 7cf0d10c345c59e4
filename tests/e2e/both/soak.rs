//! Rolling-update soak: a steady load (8 keep-alive client threads, paced to
//! SOAK_RATE requests/s in total, default 800) through a real Envoy while the
//! endpoints of the `backend` cluster (EDS from a watched file) walk through a
//! Kubernetes rolling update, with real backends that keep serving during
//! their preStop and then close their listener.
//!
//! Each walk runs twice:
//! - with the module: every endpoint is published with its EndpointSlice
//!   conditions, the serving_picker filter (`{"refresh_interval_ms": 100}`)
//!   picks the host;
//! - control, without the module: a control plane without this feature only
//!   publishes ready endpoints (serving and not terminating), plain round
//!   robin.
//!
//! Both Envoys have envoy.yaml's retry policy (connect-failure, reset,
//! refused-stream; 2 retries; previous_hosts) and outlier detection.
//!
//! Asserted with the module: zero failed requests over each whole walk; no
//! request reaches a pod while it is not serving; once a replacement is
//! serving (or an old pod is terminating while others are ready), requests
//! sent after a propagation grace of 0.5 s (five refresh intervals) no
//! longer reach the old pod. The control's failures are a measured figure,
//! except that the one-replica walk must fail there (the outage the feature
//! exists for), so that the scenario is known to bite.
//!
//! Knobs: SOAK_PHASE_MS (>= 1000, default 1000), SOAK_RATE (default 800).
//! `scripts/soak.sh` runs just this file and prints the figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{json, Value};
use support::load::{Load, LoadConfig, LoadReport};
use support::tweak::{envoy_yaml_outlier_detection, envoy_yaml_retry_policy, merge_cluster};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/soak";
/// Time allowed for an EDS change to reach the filter's routing (refresh
/// every 100 ms, plus the EDS file watch and the admin round trip).
const GRACE: Duration = Duration::from_millis(500);
/// The load must sustain at least this over each walk.
const MIN_RATE: f64 = 300.0;

fn phase_len() -> Duration {
    let ms = std::env::var("SOAK_PHASE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1000)
        .max(1000);
    Duration::from_millis(ms)
}

fn load_config() -> LoadConfig {
    let total = std::env::var("SOAK_RATE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(800.0)
        .max(MIN_RATE + 100.0);
    LoadConfig::paced(8, total / 8.0, PATH)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Run {
    /// serving-picker in this form.
    Module(Form),
    Control,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Serving,
    ServingTerminating,
    TerminatingNotServing,
    NotServing,
}

/// The EDS a control plane publishes for these pods.
fn eds(run: Run, pods: &[(&Backend, St)]) -> Vec<Endpoint> {
    pods.iter()
        .filter_map(|(b, st)| match (run, st) {
            (Run::Module(_), St::Serving) => Some(Endpoint::serving(b.addr())),
            (Run::Module(_), St::ServingTerminating) => {
                Some(Endpoint::serving_terminating(b.addr()))
            }
            (Run::Module(_), St::TerminatingNotServing) => {
                Some(Endpoint::terminating_not_serving(b.addr()))
            }
            (Run::Module(_), St::NotServing) => Some(Endpoint::not_serving(b.addr())),
            // Without the feature: only ready endpoints, no conditions.
            (Run::Control, St::Serving) => Some(Endpoint::no_metadata(b.addr())),
            (Run::Control, _) => None,
        })
        .collect()
}

fn start_envoy(tag: &str, run: Run, initial: &[Endpoint]) -> Envoy {
    let filter = match run {
        Run::Module(_) => Some(plugin_config(Value::Null)),
        Run::Control => None,
    };
    let form = match run {
        Run::Module(form) => form,
        Run::Control => Form::Wasm,
    };
    EnvoyBuilder::new()
        .form(form)
        .tag(tag)
        .with_filter(filter.as_deref())
        .eds_cluster(CLUSTER, initial)
        .retry_policy(envoy_yaml_retry_policy())
        .bootstrap_hook(merge_cluster(
            CLUSTER,
            json!({"outlier_detection": envoy_yaml_outlier_detection()}),
        ))
        .start()
}

/// Waits for the routing the walk starts from, before the load begins.
fn settle_start(envoy: &Envoy, run: Run, first: &[&Backend]) {
    match run {
        Run::Module(_) => settle(envoy, PATH, &[], "filter routes to the first pods", |r| {
            first.iter().any(|b| filter_routed_to(b)(r))
        }),
        Run::Control => settle(envoy, PATH, &[], "first pods serve", |r| {
            first.iter().any(|b| served_by(b)(r))
        }),
    }
}

/// Starts the phase, then writes its endpoints (a request belongs to the
/// phase it was sent in; the effect of a change lands in its own phase).
fn step(envoy: &Envoy, load: &Load, run: Run, name: &str, pods: &[(&Backend, St)]) -> Duration {
    let t = load.phase(name);
    envoy.set_endpoints(CLUSTER, &eds(run, pods));
    t
}

fn wait_stopped(b: &Backend, within: Duration) {
    wait_until(
        &format!("{}'s preStop to end (listener closed)", b.name()),
        within,
        || b.is_stopped(),
    );
}

struct WalkResult {
    report: LoadReport,
}

/// Walk A: one-replica StatefulSet update. A's preStop (3.5 phases + grace)
/// outlasts B's start, so A is still serving until endpoints say B serves and
/// A does not; its listener closes half-way through "A terminating, not
/// serving", and A is removed after that.
fn walk_one_replica(run: Run) -> WalkResult {
    let p = phase_len();
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = start_envoy(
        &format!("soak-1replica-{run:?}"),
        run,
        &eds(run, &[(&a, St::Serving)]),
    );
    settle_start(&envoy, run, &[&a]);
    let load = Load::start(envoy.listen_addr(), load_config(), "A serving");
    std::thread::sleep(p);

    let prestop = p + p + GRACE + p + p / 2;
    step(
        &envoy,
        &load,
        run,
        "A serving+terminating (preStop starts)",
        &[(&a, St::ServingTerminating)],
    );
    a.begin_termination(prestop);
    std::thread::sleep(p);
    step(
        &envoy,
        &load,
        run,
        "B appears, not serving",
        &[(&a, St::ServingTerminating), (&b, St::NotServing)],
    );
    std::thread::sleep(p);
    step(
        &envoy,
        &load,
        run,
        "B serving (first 0.5 s: propagation)",
        &[(&a, St::ServingTerminating), (&b, St::Serving)],
    );
    std::thread::sleep(GRACE);
    load.phase("B serving");
    std::thread::sleep(p);
    step(
        &envoy,
        &load,
        run,
        "A terminating not serving (A's listener closes)",
        &[(&a, St::TerminatingNotServing), (&b, St::Serving)],
    );
    std::thread::sleep(p);
    wait_stopped(&a, Duration::from_secs(3));
    step(&envoy, &load, run, "A removed", &[(&b, St::Serving)]);
    std::thread::sleep(p);
    let report = load.finish();
    println!(
        "{}",
        report.phase_table(&format!("walk A (one replica), {run:?}"))
    );

    if matches!(run, Run::Module(_)) {
        let in_phase = |name: &str| {
            report
                .phases()
                .into_iter()
                .find(|s| s.name == name)
                .unwrap_or_default()
        };
        assert_eq!(
            report.failures(),
            0,
            "with the module, no request may fail during the walk\n{}",
            report.phase_table("walk A, module")
        );
        assert_eq!(
            report.served_by_within(
                "B",
                report.phase_start("B appears, not serving"),
                report.phase_start("B serving (first 0.5 s: propagation)")
            ),
            0,
            "B was reached while not serving\n{}",
            report.phase_table("walk A, module")
        );
        let after = report.phase_start("B serving");
        assert_eq!(
            report.served_by_in("A", after, report.end),
            0,
            "new requests reached A more than {GRACE:?} after B was serving\n{}",
            report.phase_table("walk A, module")
        );
        assert!(
            in_phase("B serving").requests > 0 && report.served_by_in("B", after, report.end) > 0,
            "B took no traffic after it was serving"
        );
    }
    assert!(
        report.rate() >= MIN_RATE,
        "the load fell below {MIN_RATE} req/s ({:.0})",
        report.rate()
    );
    WalkResult { report }
}

/// Walk B: a 3-replica Deployment, maxSurge 1, maxUnavailable 0. For each
/// i: n_i added not serving -> n_i serving -> o_i serving+terminating
/// (preStop starts) -> o_i terminating not serving (its listener closes
/// half-way) -> o_i removed.
fn walk_three_replicas(run: Run) -> WalkResult {
    let p = phase_len();
    let olds: Vec<Backend> = (1..=3).map(|i| Backend::start(&format!("o{i}"))).collect();
    let news: Vec<Backend> = (1..=3).map(|i| Backend::start(&format!("n{i}"))).collect();
    let mut pods: Vec<(&Backend, St)> = olds.iter().map(|b| (b, St::Serving)).collect();
    let envoy = start_envoy(&format!("soak-3replicas-{run:?}"), run, &eds(run, &pods));
    settle_start(&envoy, run, &olds.iter().collect::<Vec<_>>());
    let load = Load::start(envoy.listen_addr(), load_config(), "o1 o2 o3 serving");
    std::thread::sleep(p);

    fn set<'a>(pods: &mut Vec<(&'a Backend, St)>, who: &'a Backend, st: Option<St>) {
        pods.retain(|(b, _)| b.name() != who.name());
        if let Some(st) = st {
            pods.push((who, st));
        }
    }
    // One pod's change (None: removed), published as the next phase.
    let publish = |pods: &[(&Backend, St)], phase: String| step(&envoy, &load, run, &phase, pods);
    for (o, n) in olds.iter().zip(&news) {
        set(&mut pods, n, Some(St::NotServing));
        publish(&pods, format!("{} added, not serving", n.name()));
        std::thread::sleep(p);
        set(&mut pods, n, Some(St::Serving));
        publish(&pods, format!("{} serving", n.name()));
        std::thread::sleep(p);
        set(&mut pods, o, Some(St::ServingTerminating));
        publish(
            &pods,
            format!("{} serving+terminating, preStop (first 0.5 s)", o.name()),
        );
        o.begin_termination(GRACE + p + p / 2);
        std::thread::sleep(GRACE);
        load.phase(&format!("{} serving+terminating, preStop", o.name()));
        std::thread::sleep(p);
        set(&mut pods, o, Some(St::TerminatingNotServing));
        publish(
            &pods,
            format!("{} terminating not serving (listener closes)", o.name()),
        );
        std::thread::sleep(p);
        wait_stopped(o, Duration::from_secs(3));
        set(&mut pods, o, None);
        publish(&pods, format!("{} removed", o.name()));
        std::thread::sleep(p);
    }
    let report = load.finish();
    println!(
        "{}",
        report.phase_table(&format!("walk B (3 replicas, maxSurge 1), {run:?}"))
    );

    if matches!(run, Run::Module(_)) {
        let table = report.phase_table("walk B, module");
        assert_eq!(
            report.failures(),
            0,
            "with the module, no request may fail during the walk\n{table}"
        );
        for i in 0..3 {
            let (o, n) = (&olds[i], &news[i]);
            let added = report.phase_start(&format!("{} added, not serving", n.name()));
            let ready = report.phase_start(&format!("{} serving", n.name()));
            assert_eq!(
                report.served_by_within(n.name(), added, ready),
                0,
                "{} was reached while not serving\n{table}",
                n.name()
            );
            let after = report.phase_start(&format!("{} serving+terminating, preStop", o.name()));
            assert_eq!(
                report.served_by_in(o.name(), after, report.end),
                0,
                "new requests reached {} more than {GRACE:?} after it began terminating \
                 (other pods ready)\n{table}",
                o.name()
            );
        }
        for n in &news {
            assert!(
                report.served_by_in(n.name(), Duration::ZERO, report.end) > 0,
                "{} never took traffic\n{table}",
                n.name()
            );
        }
    }
    assert!(
        report.rate() >= MIN_RATE,
        "the load fell below {MIN_RATE} req/s ({:.0})",
        report.rate()
    );
    WalkResult { report }
}

const SUMMARY_HEADER: &str = "soak-summary | walk                                | requests | failures with module | requests | failures without module | req/s with / without";

fn summary_row(walk: &str, module: &WalkResult, control: &WalkResult) {
    println!("\n{SUMMARY_HEADER}");
    println!(
        "soak-summary | {:<35} | {:>8} | {:>20} | {:>8} | {:>23} | {:>6.0} / {:.0}",
        walk,
        module.report.requests(),
        module.report.failures(),
        control.report.requests(),
        control.report.failures(),
        module.report.rate(),
        control.report.rate()
    );
}

#[test]
fn soak_one_replica_statefulset_update() {
    let module = walk_one_replica(Run::Module(Form::Wasm));
    let control = walk_one_replica(Run::Control);
    summary_row("A: 1-replica StatefulSet", &module, &control);
    assert!(
        control.report.failures() > 0,
        "the control (only ready endpoints in EDS) should see the outage of a one-replica \
         update; it saw none, so the scenario does not bite\n{}",
        control.report.phase_table("walk A, control")
    );
}

#[test]
fn soak_three_replica_deployment_rolling_update() {
    let module = walk_three_replicas(Run::Module(Form::Wasm));
    let control = walk_three_replicas(Run::Control);
    summary_row("B: 3-replica Deployment maxSurge 1", &module, &control);
}

/// The same walks with the native form (the dynamic-module load balancer);
/// the control run is the wasm tests' (it does not depend on the form).
#[test]
fn soak_one_replica_statefulset_update_native() {
    let module = walk_one_replica(Run::Module(Form::Native));
    println!(
        "\nsoak-summary | {:<35} | {:>8} | {:>20} | (control: see the wasm row)",
        "A: 1-replica StatefulSet, native",
        module.report.requests(),
        module.report.failures()
    );
}

#[test]
fn soak_three_replica_deployment_rolling_update_native() {
    let module = walk_three_replicas(Run::Module(Form::Native));
    println!(
        "\nsoak-summary | {:<35} | {:>8} | {:>20} | (control: see the wasm row)",
        "B: 3-replica Deployment, native",
        module.report.requests(),
        module.report.failures()
    );
}
