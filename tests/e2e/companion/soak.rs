//! The one-replica rolling update (both::soak, walk A) through the
//! companion chain: the pods' EndpointSlices change in a slice file, the
//! real `serving-picker-conditions eds` pushes EDS to a real Envoy 1.40, and
//! a steady load (8 keep-alive clients, 800 req/s in total) runs through it.
//!
//! Three times: with the wasm form and the native form (conditions as
//! metadata), and with the
//! companion's priority output and Envoy's plain round robin (no module);
//! and once more with the native form over mutual TLS, as
//! envoy-companion.yaml reaches the companion.
//! Both with envoy.yaml's retry policy and outlier detection. Asserted for
//! both: no failed request over the whole walk; B never reached before it is
//! serving; no new request reaches A later than the grace after B serves.
//!
//! Then the picker removed halfway, each form, on the companion's default
//! output: two one-replica updates (A -> B with the picker, then B -> C)
//! with the cluster swapped by CDS to Envoy's plain round robin between
//! them, as when a patch or policy stops attaching. Every pod keeps
//! answering while it is not serving, so a request sent to one shows as
//! served by it: 0 failures, and 0 requests to a pod that is not serving,
//! in both halves. The wasm form takes its endpoints over plain EDS (the
//! swapped cluster opens a stream of its own), the native form over ADS:
//! the swapped cluster's watch re-sends Envoy's last ACK on the shared
//! stream, and the companion answers it, so the cluster warms from an EDS
//! update, not from Envoy's initial fetch timeout (15 s) and its cache.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use support::companion::{
    eds_from_companion, plain_round_robin, round_robin_policy, Companion, Picker, SliceDir, XdsApi,
};
use support::envoy::fresh_dir;
use support::load::{Load, LoadConfig};
use support::mtls::Mtls;
use support::tweak::{
    cluster_from_cds_file, envoy_yaml_outlier_detection, envoy_yaml_retry_policy, merge_cluster,
    CdsFile,
};
use support::*;

const CLUSTER: &str = "backend";
const SERVICE: &str = "web";
const PATH: &str = "/backend/soak";
/// The file watch, the push and (wasm form) the filter's 100 ms refresh.
const GRACE: Duration = Duration::from_millis(500);
const PHASE: Duration = Duration::from_millis(1000);

fn walk_one_replica(picker: Picker, mtls: Option<Mtls>) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let slices = SliceDir::create(&fresh_dir("soak-slices"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    let mut extra: Vec<String> = match picker {
        Picker::Module(_) => vec![],
        _ => vec!["--priorities".into()],
    };
    extra.extend(mtls.iter().flat_map(Mtls::companion_args));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let companion = Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &extra);
    let mut builder = EnvoyBuilder::new()
        .tag(&format!("companion-soak-{picker:?}"))
        .eds_cluster(CLUSTER, &[])
        .retry_policy(envoy_yaml_retry_policy())
        .bootstrap_hook(merge_cluster(
            CLUSTER,
            json!({"outlier_detection": envoy_yaml_outlier_detection()}),
        ))
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), XdsApi::Ads));
    if let Some(m) = &mtls {
        builder = builder.bootstrap_hook(m.envoy_hook());
    }
    builder = match picker {
        Picker::Module(form) => builder.form(form),
        _ => builder
            .with_filter(None)
            .bootstrap_hook(plain_round_robin(CLUSTER)),
    };
    let envoy = builder.start();
    match picker {
        Picker::Module(Form::Wasm) => settle(
            &envoy,
            PATH,
            &[],
            "filter routes to A",
            filter_routed_to(&a),
        ),
        _ => settle(&envoy, PATH, &[], "A serves", served_by(&a)),
    }
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig {
            threads: 8,
            rate_per_thread: 100.0,
            path: PATH.into(),
            timeout: Duration::from_secs(5),
        },
        "A serving",
    );
    let step = |name: &str, eps: &[Endpoint]| {
        load.phase(name);
        slices.set_endpoints(SERVICE, eps);
    };
    std::thread::sleep(PHASE);
    let prestop = PHASE * 4 + GRACE + PHASE / 2;
    step(
        "A serving+terminating (preStop starts)",
        &[Endpoint::serving_terminating(a.addr())],
    );
    a.begin_termination(prestop);
    std::thread::sleep(PHASE);
    step(
        "B appears, not serving",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
    );
    std::thread::sleep(PHASE);
    step(
        "B serving (first 0.5 s: propagation)",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    std::thread::sleep(GRACE);
    load.phase("B serving");
    std::thread::sleep(PHASE);
    step(
        "A terminating not serving (A's listener closes)",
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    std::thread::sleep(PHASE);
    wait_until("A's preStop to end", Duration::from_secs(5), || {
        a.is_stopped()
    });
    step("A removed", &[Endpoint::serving(b.addr())]);
    std::thread::sleep(PHASE);
    let report = load.finish();
    let over = if mtls.is_some() { " over mTLS" } else { "" };
    let title = format!("one-replica update through the companion{over}, {picker:?}");
    let table = report.phase_table(&title);
    println!("{table}");
    println!(
        "companion-soak-summary | {picker:?}{over} | requests {} | failures {} | {:.0} req/s",
        report.requests(),
        report.failures(),
        report.rate()
    );
    assert_eq!(report.failures(), 0, "no request may fail\n{table}");
    let added = report.phase_start("B appears, not serving");
    let ready = report.phase_start("B serving (first 0.5 s: propagation)");
    assert_eq!(
        report.served_by_within("B", added, ready),
        0,
        "B was reached while not serving\n{table}"
    );
    let after = report.phase_start("B serving");
    assert_eq!(
        report.served_by_in("A", after, report.end),
        0,
        "new requests reached A more than {GRACE:?} after B was serving\n{table}"
    );
    assert!(
        report.served_by_in("B", after, report.end) > 0,
        "B took no traffic\n{table}"
    );
    assert!(
        report.rate() >= 300.0,
        "the load fell to {:.0} req/s",
        report.rate()
    );
    assert_eq!(
        companion.metric("serving_picker_conditions_xds_nacks_total"),
        Some(0.0)
    );
    if mtls.is_some() {
        assert!(
            companion
                .metric("serving_picker_conditions_tls_handshakes_total")
                .unwrap_or(0.0)
                >= 1.0
        );
        let refused = companion.identity_refusals();
        assert!(refused.is_empty(), "refused: {refused:?}");
    }
}

#[test]
fn soak_one_replica_update_wasm_form() {
    walk_one_replica(Picker::Module(Form::Wasm), None);
}

#[test]
fn soak_one_replica_update_native_form() {
    walk_one_replica(Picker::Module(Form::Native), None);
}

#[test]
fn soak_one_replica_update_priority_output_plain_round_robin() {
    walk_one_replica(Picker::PlainRoundRobin, None);
}

#[test]
fn soak_one_replica_update_native_form_over_mtls() {
    walk_one_replica(Picker::Module(Form::Native), Some(Mtls::new("soak")));
}

/// One one-replica update, `old` to `new`, under the running load; phases
/// named `<n>: ...`. Every pod keeps answering throughout.
fn update(load: &Load, slices: &SliceDir, n: &str, old: &Backend, new: &Backend) {
    let (o, w) = (old.name(), new.name());
    let step = |name: String, eps: &[Endpoint]| {
        load.phase(&name);
        slices.set_endpoints(SERVICE, eps);
    };
    step(
        format!("{n}: {w} created, not serving"),
        &[
            Endpoint::serving(old.addr()),
            Endpoint::not_serving(new.addr()),
        ],
    );
    std::thread::sleep(PHASE);
    step(
        format!("{n}: {o} serving+terminating, {w} not serving"),
        &[
            Endpoint::serving_terminating(old.addr()),
            Endpoint::not_serving(new.addr()),
        ],
    );
    std::thread::sleep(PHASE);
    step(
        format!("{n}: {w} serving (first 0.5 s: propagation)"),
        &[
            Endpoint::serving_terminating(old.addr()),
            Endpoint::serving(new.addr()),
        ],
    );
    std::thread::sleep(GRACE);
    load.phase(&format!("{n}: {w} serving"));
    std::thread::sleep(PHASE);
    step(
        format!("{n}: {o} not serving (first 0.5 s: propagation)"),
        &[
            Endpoint::terminating_not_serving(old.addr()),
            Endpoint::serving(new.addr()),
        ],
    );
    std::thread::sleep(GRACE);
    load.phase(&format!("{n}: {o} not serving"));
    std::thread::sleep(PHASE);
    step(format!("{n}: {o} gone"), &[Endpoint::serving(new.addr())]);
    std::thread::sleep(PHASE);
}

/// Requests a pod got while it was not serving in update `n` (`new` before
/// it served, `old` from the grace after it stopped), and requests `old`
/// got from the grace after `new` served (row 5: new requests go to the
/// ready pod); also whether `old` served in its serving+terminating phase
/// (row 4: the only serving pod).
fn update_misroutes(
    report: &support::load::LoadReport,
    n: &str,
    old: &Backend,
    new: &Backend,
) -> (usize, usize, usize) {
    let (o, w) = (old.name(), new.name());
    let created = report.phase_start(&format!("{n}: {w} created, not serving"));
    let serving = report.phase_start(&format!("{n}: {w} serving (first 0.5 s: propagation)"));
    let new_served = report.phase_start(&format!("{n}: {w} serving"));
    let stopped = report.phase_start(&format!("{n}: {o} not serving"));
    let terminating = report.phase_start(&format!("{n}: {o} serving+terminating, {w} not serving"));
    (
        report.served_by_within(w, created, serving) + report.served_by_in(o, stopped, report.end),
        report.served_by_in(o, new_served, report.end),
        report.served_by_in(o, terminating, serving),
    )
}

/// Whether cluster `name` is active with a round-robin policy and nothing
/// is warming (the CDS swap applied).
fn runs_round_robin(envoy: &Envoy, name: &str) -> bool {
    let r = envoy.admin_get("/config_dump?resource=dynamic_active_clusters");
    let warming = envoy.admin_get("/config_dump?resource=dynamic_warming_clusters");
    let Ok(j) = serde_json::from_str::<serde_json::Value>(&r.body) else {
        return false;
    };
    let active = j["configs"].as_array().into_iter().flatten().any(|c| {
        let cluster = &c["cluster"];
        cluster["name"] == name
            && cluster["load_balancing_policy"]
                .to_string()
                .contains("round_robin")
            && !cluster["load_balancing_policy"]
                .to_string()
                .contains("dynamic_modules")
            && !cluster["load_balancing_policy"]
                .to_string()
                .contains("override_host")
    });
    active && !warming.body.contains(name)
}

/// Cluster `name`'s EDS counters: (update_success, init_fetch_timeout,
/// assignment_use_cached).
fn eds_counters(envoy: &Envoy, name: &str) -> (u64, u64, u64) {
    let stat = |s: &str| envoy.stat_or_zero(&format!("cluster.{name}.{s}"));
    (
        stat("update_success"),
        stat("init_fetch_timeout"),
        stat("assignment_use_cached"),
    )
}

fn picker_removed_halfway(form: Form, api: XdsApi) {
    let (a, b, c) = (
        Backend::start("A"),
        Backend::start("B"),
        Backend::start("C"),
    );
    let slices = SliceDir::create(&fresh_dir("soak-removed-slices"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    let companion = Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &[]);
    let envoy = EnvoyBuilder::new()
        .tag(&format!("companion-soak-removed-{form:?}"))
        .eds_cluster(CLUSTER, &[])
        .retry_policy(envoy_yaml_retry_policy())
        .bootstrap_hook(merge_cluster(
            CLUSTER,
            json!({"outlier_detection": envoy_yaml_outlier_detection()}),
        ))
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), api))
        .form(form)
        .bootstrap_hook(cluster_from_cds_file(CLUSTER))
        .start();
    match form {
        Form::Wasm => settle(
            &envoy,
            PATH,
            &[],
            "filter routes to A",
            filter_routed_to(&a),
        ),
        Form::Native => settle(&envoy, PATH, &[], "A serves", served_by(&a)),
    }
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig {
            threads: 8,
            rate_per_thread: 100.0,
            path: PATH.into(),
            timeout: Duration::from_secs(5),
        },
        "A serving, with the picker",
    );
    std::thread::sleep(PHASE);
    update(&load, &slices, "1", &a, &b);
    load.phase("picker removed: the cluster on plain round robin");
    let (updates, _, _) = eds_counters(&envoy, CLUSTER);
    CdsFile::in_envoy_dir(envoy.dir()).set_policy(CLUSTER, round_robin_policy());
    // Longer than the initial fetch timeout (15 s): whichever way the
    // cluster warms, the counters below say which.
    wait_until(
        "the cluster runs plain round robin",
        Duration::from_secs(20),
        || runs_round_robin(&envoy, CLUSTER),
    );
    assert_eq!(envoy.stat_or_zero("cluster_manager.warming_clusters"), 0);
    let (updates_after, fetch_timeouts, cached) = eds_counters(&envoy, CLUSTER);
    assert_eq!(
        (fetch_timeouts, cached),
        (0, 0),
        "the swapped cluster ({api:?}) warmed at its initial fetch timeout, from Envoy's cache, not from an EDS update"
    );
    assert!(
        updates_after > updates,
        "no EDS update reached the swapped cluster ({api:?})"
    );
    std::thread::sleep(PHASE);
    update(&load, &slices, "2", &b, &c);
    let report = load.finish();
    let title = format!("picker removed halfway through the companion's default output, {form:?}");
    let table = report.phase_table(&title);
    println!("{table}");
    let (to_not_serving_1, late_1, row4_1) = update_misroutes(&report, "1", &a, &b);
    let (to_not_serving_2, late_2, row4_2) = update_misroutes(&report, "2", &b, &c);
    println!(
        "companion-soak-removed-summary | {form:?} | requests {} | failures {} | to a not serving pod: with the picker {to_not_serving_1}, without {to_not_serving_2} | {:.0} req/s",
        report.requests(),
        report.failures(),
        report.rate()
    );
    assert_eq!(report.failures(), 0, "no request may fail\n{table}");
    assert_eq!(
        (to_not_serving_1, to_not_serving_2),
        (0, 0),
        "requests reached a pod that was not serving (with the picker, without)\n{table}"
    );
    assert_eq!(
        (late_1, late_2),
        (0, 0),
        "new requests reached the old pod after the grace once the new one served\n{table}"
    );
    assert!(
        row4_1 > 0 && row4_2 > 0,
        "the serving+terminating pod served while it was the only serving one\n{table}"
    );
    assert!(
        report.served_by_in("C", report.phase_start("2: C serving"), report.end) > 0,
        "C took no traffic\n{table}"
    );
    assert!(
        report.rate() >= 300.0,
        "the load fell to {:.0} req/s",
        report.rate()
    );
    assert_eq!(
        companion.metric("serving_picker_conditions_xds_nacks_total"),
        Some(0.0)
    );
}

#[test]
fn soak_picker_removed_halfway_wasm_form() {
    picker_removed_halfway(Form::Wasm, XdsApi::Eds);
}

#[test]
fn soak_picker_removed_halfway_native_form_over_ads() {
    picker_removed_halfway(Form::Native, XdsApi::Ads);
}
