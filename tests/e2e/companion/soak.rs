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
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::json;
use support::companion::{
    eds_from_companion, plain_round_robin, Companion, Picker, SliceDir, XdsApi,
};
use support::envoy::fresh_dir;
use support::load::{Load, LoadConfig};
use support::mtls::Mtls;
use support::tweak::{envoy_yaml_outlier_detection, envoy_yaml_retry_policy, merge_cluster};
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
        Picker::PlainRoundRobin => vec!["--priorities".into()],
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
        Picker::PlainRoundRobin => builder
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
        report.served_by_in("B", added, ready),
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
        assert_eq!(
            companion.metric("serving_picker_conditions_tls_refusals_total"),
            None
        );
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
