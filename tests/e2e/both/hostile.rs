//! Hostile input and rough handling, against both forms (`<name>::wasm`,
//! `<name>::native`): metadata of the wrong types and huge strings, a
//! 10,000-host cluster, empty clusters, many clusters, EDS churn under load,
//! Envoy shut down with load running; and the reaction time of a drain under
//! load (printed: how long after the EDS change new requests still reached
//! the drained host). Nothing may crash Envoy; the module logs no internal
//! error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::load::{Load, LoadConfig};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

/// No panic caught in the module, no crash, nothing critical.
fn assert_no_internal_error(envoy: &Envoy) {
    for needle in [
        "internal error (panic)",
        "[critical]",
        "Caught ",
        "stack_decode",
    ] {
        let lines = envoy.log_lines(needle);
        assert!(lines.is_empty(), "{needle} in Envoy's log: {lines:?}");
    }
}

/// Addresses nobody listens on (never reached: they are not serving).
fn fake_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 1, (i >> 8) as u8, (i & 255) as u8], 9))
}

fn with(addr: SocketAddr, serving: Value, terminating: Value, ready: Value) -> Endpoint {
    let mut e = Endpoint::bare(addr);
    e.serving = Some(serving);
    e.terminating = Some(terminating);
    e.ready = Some(ready);
    e
}

fn hostile_metadata_types_and_huge_strings(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let huge = "x".repeat(1 << 20);
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("hostile-metadata")
        .with_filter(Some(&plugin_config(json!({"local_zone": "zone-a"}))))
        .eds_cluster(
            CLUSTER,
            &[
                // Wrong types everywhere: read as absent (serving, not terminating).
                with(
                    a.addr(),
                    json!(huge),
                    json!({"nested": [1, 2, {"x": huge}]}),
                    json!(1.5e300),
                ),
                // A 1 MB zone and a list where a bool belongs; not serving.
                with(b.addr(), json!(false), json!([true]), json!(null)).zone(&huge),
                // Not serving, with a huge unrelated key.
                Endpoint::not_serving(c.addr()),
            ],
        )
        .start();
    let what = "A (wrong types = absent = serving)";
    settle(&envoy, PATH, &[], what, picked(&a));
    // Settling included: the wasm form holds requests until its first snapshot.
    assert_batch(&envoy, PATH, &[], BATCH, what, picked(&a));
    assert_eq!(b.count() + c.count(), 0);
    assert_no_internal_error(&envoy);
}

fn ten_thousand_hosts(form: Form) {
    let a = Backend::start("A");
    let mut eps: Vec<Endpoint> = (0..9_999)
        .map(|i| {
            Endpoint::not_serving(fake_addr(i)).zone(if i % 2 == 0 { "zone-a" } else { "zone-b" })
        })
        .collect();
    eps.push(Endpoint::serving(a.addr()));
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("hostile-10k")
        .eds_cluster(CLUSTER, &eps)
        .start();
    settle_for(
        &envoy,
        PATH,
        &[],
        "A, the only serving host of 10,000",
        Duration::from_secs(60),
        CONSECUTIVE,
        picked(&a),
    );
    // Every host serving but A terminating: the 9,999 others are the tier
    // (they refuse connections: the requests fail, but none reaches A).
    let mut eps: Vec<Endpoint> = (0..9_999)
        .map(|i| Endpoint::serving(fake_addr(i)))
        .collect();
    eps.push(Endpoint::serving_terminating(a.addr()));
    let t = Instant::now();
    envoy.set_endpoints(CLUSTER, &eps);
    wait_until("A no longer picked", Duration::from_secs(60), || {
        (0..5).all(|_| !served_by(&a)(&envoy.get(PATH, &[])))
    });
    println!(
        "{}: 10,000 hosts, a change took effect within {:?}",
        form.name(),
        t.elapsed()
    );
    if form == Form::Native {
        // Every instance (workers and main thread) logs each rebuild at
        // debug, "..., {wall} us ({cpu} us CPU)": the first load of the
        // 10,000 hosts (+10000, 9,999 not serving) and the change (update,
        // all serving). The log is flushed every 100 ms: wait for every
        // instance's line of the change.
        let instances = envoy.log_lines("rebuilt (lb_new)").len();
        wait_until(
            "every instance's rebuild logged",
            Duration::from_secs(10),
            || envoy.log_lines("rebuilt (update)").len() >= instances,
        );
        for (what, needle) in [("first load", "(+10000 -0)"), ("change", "(update)")] {
            let micros: Vec<(u64, u64)> = envoy
                .log_lines(needle)
                .iter()
                .filter_map(|l| {
                    let (wall, cpu) = l.rsplit(", ").next()?.split_once(" us (")?;
                    Some((wall.parse().ok()?, cpu.split(' ').next()?.parse().ok()?))
                })
                .collect();
            println!(
                "native: rebuilds of the 10,000-host table in Envoy, {what} (all instances, (wall us, CPU us)): {micros:?}"
            );
            assert!(!micros.is_empty());
        }
    }
    assert_no_internal_error(&envoy);
}

fn empty_cluster_then_hosts(form: Form) {
    let a = Backend::start("A");
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("hostile-empty")
        .eds_cluster(CLUSTER, &[])
        .eds_cluster("other", &[Endpoint::serving(a.addr())])
        .start();
    expect_routing(&envoy, PATH, &[], "empty: 503", no_serving_503(CLUSTER));
    envoy.set_endpoints(CLUSTER, &[Endpoint::serving(a.addr())]);
    expect_routing(&envoy, PATH, &[], "A", picked(&a));
    envoy.set_endpoints(CLUSTER, &[]);
    expect_routing(
        &envoy,
        PATH,
        &[],
        "empty again: 503",
        no_serving_503(CLUSTER),
    );
    expect_routing(&envoy, "/other/x", &[], "other: A", picked(&a));
    assert_no_internal_error(&envoy);
}

fn many_clusters(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let n = 60;
    let mut builder = EnvoyBuilder::new().form(form).tag("hostile-many");
    for i in 0..n {
        // Even clusters: A ready, B terminating; odd: the other way round.
        let (r, t) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        builder = builder.eds_cluster(
            &format!("c{i}"),
            &[
                Endpoint::serving(r.addr()),
                Endpoint::serving_terminating(t.addr()),
            ],
        );
    }
    let envoy = builder.start();
    for i in 0..n {
        let want = if i % 2 == 0 { &a } else { &b };
        settle(
            &envoy,
            &format!("/c{i}/x"),
            &[],
            "ready host of the cluster",
            picked(want),
        );
    }
    assert_no_internal_error(&envoy);
}

fn eds_churn_under_load(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag("hostile-churn")
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(c.addr())],
        )
        .start();
    settle(&envoy, PATH, &[], "A", picked(&a));
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig::paced(4, 100.0, PATH),
        "churn",
    );
    // 150 EDS versions in 3 s: B flips between ready and terminating, its
    // weight changes, C stays not serving; A is always ready.
    for i in 0..150u32 {
        let bb = if i % 2 == 0 {
            Endpoint::serving(b.addr()).weight(1 + i % 5)
        } else {
            Endpoint::serving_terminating(b.addr())
        };
        envoy.set_endpoints(
            CLUSTER,
            &[
                Endpoint::serving(a.addr()).weight(1 + i % 3),
                bb,
                Endpoint::not_serving(c.addr()),
            ],
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let report = load.finish();
    println!(
        "{}",
        report.phase_table(&format!("EDS churn under load, {}", form.name()))
    );
    assert_eq!(report.failures(), 0, "{}", report.phase_table("churn"));
    assert_eq!(c.count(), 0, "the not-serving host was reached");
    assert!(report.requests() > 500);
    assert_no_internal_error(&envoy);
}

/// A and B serving, both picked, on an Envoy of `form`.
fn a_and_b_serving(form: Form, tag: &str) -> (Envoy, Backend, Backend) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag(tag)
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .start();
    settle(&envoy, PATH, &[], "A or B", picked_any(&[&a, &b]));
    (envoy, a, b)
}

fn shutdown_with_load_running(form: Form) {
    let (mut envoy, a, _b) = a_and_b_serving(form, "hostile-shutdown");
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig {
            threads: 8,
            rate_per_thread: 0.0,
            path: PATH.into(),
            timeout: Duration::from_secs(2),
        },
        "full speed",
    );
    std::thread::sleep(Duration::from_millis(700));
    // An EDS change racing the shutdown too.
    envoy.set_endpoints(CLUSTER, &[Endpoint::serving(a.addr())]);
    let status = envoy.terminate();
    let report = load.finish();
    println!(
        "{}: shut down under load after {} requests: {status:?}",
        form.name(),
        report.requests()
    );
    let status = status.expect("Envoy did not exit within 10 s of SIGTERM");
    assert!(
        status.success(),
        "Envoy did not exit cleanly under load: {status:?}\n{}",
        envoy
            .log()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_no_internal_error(&envoy);
}

/// Under load, A and B serving; then an EDS change drains A (serving and
/// terminating, B ready). Printed: how long after the file was renamed the
/// last request that A served had been sent. No timing is asserted.
fn reaction_time_of_a_drain_under_load(form: Form) {
    let (envoy, a, b) = a_and_b_serving(form, "reaction");
    let mut figures = Vec::new();
    for round in 0..5 {
        envoy.set_endpoints(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        );
        wait_until("A picked again", SETTLE_TIMEOUT, || {
            served_by(&a)(&envoy.get(PATH, &[]))
        });
        let load = Load::start(
            envoy.listen_addr(),
            LoadConfig::paced(4, 500.0, PATH),
            "A and B",
        );
        std::thread::sleep(Duration::from_millis(300));
        let t0 = load.phase("A drained");
        envoy.set_endpoints(
            CLUSTER,
            &[
                Endpoint::serving_terminating(a.addr()),
                Endpoint::serving(b.addr()),
            ],
        );
        std::thread::sleep(Duration::from_millis(if form == Form::Native {
            500
        } else {
            2500
        }));
        let report = load.finish();
        let last_to_a = report
            .records
            .iter()
            .filter(|r| r.sent >= t0 && r.backend() == Some("A"))
            .map(|r| r.sent + r.took - t0)
            .max()
            .unwrap_or_default();
        let to_a = report.served_by_in("A", t0, report.end);
        let rate = report.rate();
        println!(
            "reaction {} round {round}: last request to A answered {:.1} ms after the EDS rename ({to_a} requests reached A after it; load {rate:.0} req/s)",
            form.name(),
            last_to_a.as_secs_f64() * 1e3
        );
        assert_eq!(report.failures(), 0);
        figures.push(last_to_a);
        // A receives nothing at all once the change is in.
        let late = report.served_by_in(
            "A",
            t0 + Duration::from_millis(if form == Form::Native { 200 } else { 2000 }),
            report.end,
        );
        assert_eq!(late, 0, "A still served long after the drain");
    }
    figures.sort();
    println!(
        "reaction-summary {}: median {:.1} ms, max {:.1} ms over {} rounds",
        form.name(),
        figures[figures.len() / 2].as_secs_f64() * 1e3,
        figures[figures.len() - 1].as_secs_f64() * 1e3,
        figures.len()
    );
}

both_forms!(
    hostile_metadata_types_and_huge_strings,
    ten_thousand_hosts,
    empty_cluster_then_hosts,
    many_clusters,
    eds_churn_under_load,
    shutdown_with_load_running,
    reaction_time_of_a_drain_under_load,
);
