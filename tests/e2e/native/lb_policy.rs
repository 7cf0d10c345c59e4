//! What only the native form (the dynamic-module load-balancing policy) has,
//! in a real Envoy 1.40 with the real libserving_picker.so: its counters as
//! Envoy shows them, hosts that are serving but not offered (logged once,
//! counted), retries that avoid the host already tried through Envoy's retry
//! host predicate, refused configurations, and the shipped envoy-native.yaml.
//! The reaction time of both forms is in both::hostile.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::envoy::{envoy_bin, native_module};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

fn native() -> EnvoyBuilder {
    EnvoyBuilder::new().form(Form::Native)
}

/// Counters and gauges show in /stats as `dynamicmodulescustom.<name>`.
#[test]
fn counters_show_as_dynamicmodulescustom() {
    let a = Backend::start("A");
    let t = Backend::start("T");
    let envoy = native()
        .tag("native-counters")
        .eds_cluster("ready", &[Endpoint::serving(a.addr())])
        .eds_cluster("fallback", &[Endpoint::serving_terminating(t.addr())])
        .eds_cluster("nothing", &[Endpoint::not_serving(a.addr())])
        .start();
    expect_routing(&envoy, "/ready/x", &[], "A", picked(&a));
    expect_routing(&envoy, "/fallback/x", &[], "T", picked(&t));
    expect_routing(&envoy, "/nothing/x", &[], "503", no_serving_503("nothing"));
    let all = envoy.stats_matching("serving_picker");
    println!("native stats: {all:?}");
    for name in [
        "serving_picker.pick.ready",
        "serving_picker.pick.terminating_fallback",
        "serving_picker.reject.no_serving",
    ] {
        let full = format!("dynamicmodulescustom.{name}");
        let v = all
            .iter()
            .find(|(k, _)| *k == full)
            .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0));
        assert!(
            v.is_some_and(|v| v >= BATCH as u64),
            "{full} missing or < {BATCH}: {all:?}"
        );
    }
    // Three clusters, three LB instances each (two workers and the main
    // thread), each built at least once with hosts.
    assert!(
        envoy.stat_or_zero("serving_picker.rebuilds") >= 9,
        "{all:?}"
    );
    for name in [
        "serving_picker.retry.other_host",
        "serving_picker.hosts.serving_not_offered",
        "serving_picker.rebuild_us",
    ] {
        assert!(
            all.iter()
                .any(|(k, _)| *k == format!("dynamicmodulescustom.{name}")),
            "{name} not defined: {all:?}"
        );
    }
    // Envoy's own view: the 503s are its `no healthy upstream` (flag UH).
    assert!(envoy.stat_or_zero("cluster.nothing.upstream_cx_none_healthy") >= BATCH as u64);
}

/// A host whose metadata says serving but that Envoy does not offer as
/// healthy (EDS DRAINING here) cannot be picked: it is counted in the gauge
/// and logged once (not once per worker, not once per update), and logged
/// again when it is back.
#[test]
fn serving_but_not_offered_is_counted_and_logged_once() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = native()
        .tag("native-not-offered")
        .eds_cluster(
            CLUSTER,
            &[
                Endpoint::serving(a.addr()),
                Endpoint::serving(b.addr()).health_status("DRAINING"),
            ],
        )
        .start();
    expect_routing(&envoy, PATH, &[], "A alone (B not offered)", picked(&a));
    assert_eq!(b.count(), 0, "DRAINING B was reached");
    wait_until("the gauge to show B", SETTLE_TIMEOUT, || {
        envoy.stat_or_zero("serving_picker.hosts.serving_not_offered") == 1
    });
    // More updates that leave B not offered: no new line.
    envoy.set_endpoints(
        CLUSTER,
        &[
            Endpoint::serving(a.addr()).weight(2),
            Endpoint::serving(b.addr()).health_status("DRAINING"),
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let b_addr = b.addr().to_string();
    let lines = |what: &str| {
        envoy
            .log_lines(&format!("host {b_addr} {what}"))
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        lines("is serving by its metadata but Envoy does not offer it").len(),
        1,
        "{:?}",
        envoy.log_lines(&b_addr)
    );
    // Back to healthy: picked again, the gauge drops, one line says so.
    envoy.set_endpoints(
        CLUSTER,
        &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
    );
    let ab = [&a, &b];
    wait_until("B picked again", SETTLE_TIMEOUT, || {
        served_by(&b)(&envoy.get(PATH, &[]))
    });
    expect_routing(&envoy, PATH, &[], "A or B", picked_any(&ab));
    assert_eq!(
        envoy.stat_or_zero("serving_picker.hosts.serving_not_offered"),
        0
    );
    wait_until("the recovery line", Duration::from_secs(2), || {
        lines("is offered again").len() == 1
    });
}

/// Retries avoid the host already tried when the tier has another one: R
/// refuses connections and carries almost all the weight (R:B = 100:1), so
/// a retry that picked again would nearly always land on R. A host Envoy
/// does not offer is listed first, so that R's index among all hosts (what
/// `should_select_another_host` takes) differs from its healthy index (what
/// `choose_host` answers). With the previous_hosts predicate every request
/// succeeds on B after one connect failure, and the module counts the moves.
#[test]
fn retries_avoid_the_host_already_tried() {
    let refusing = std::net::SocketAddr::from(([127, 0, 0, 1], support::ports::free_port()));
    let b = Backend::start("B");
    let x = Backend::start("X");
    let envoy = native()
        .tag("native-retries")
        .eds_cluster(
            CLUSTER,
            &[
                Endpoint::serving(x.addr()).health_status("UNHEALTHY"),
                Endpoint::serving(refusing).weight(100),
                Endpoint::serving(b.addr()).weight(1),
            ],
        )
        .retry_policy(json!({"retry_on": "connect-failure", "num_retries": 1}))
        .start();
    let n = 100;
    let rs = batch(&envoy, PATH, &[], n);
    let t = tally(&rs);
    println!("retries: {t:?}");
    let moved = envoy.stat_or_zero("serving_picker.retry.other_host");
    let retries = envoy.stat_or_zero("cluster.backend.upstream_rq_retry");
    println!("retries {retries}, moved by the module {moved}");
    // One retry per request: a retry whose host Envoy then rejects once
    // more (the module is asked a bounded number of times) may still fail;
    // seen once in a hundred on a loaded machine. Without the module's
    // check nearly every request fails (the second half of this test).
    let on_b = per_backend(&rs).get("B").copied().unwrap_or(0);
    assert!(
        on_b >= n * 97 / 100,
        "nearly every request should end on B: {t:?}"
    );
    assert!(
        retries >= (n as u64) * 9 / 10,
        "R was not tried first: {retries}"
    );
    // A retry whose next pick is B anyway (about 1 in 100) needs no move.
    assert!(
        moved >= retries * 9 / 10,
        "retries {retries}, moved {moved}"
    );
    assert_eq!(x.count(), 0);

    // Without a host predicate Envoy never asks for another host: the module
    // picks as usual (R again, nearly always) and the retry fails too.
    let b2 = Backend::start("B2");
    let plain = native()
        .tag("native-retries-no-predicate")
        .eds_cluster(
            CLUSTER,
            &[
                Endpoint::serving(refusing).weight(100),
                Endpoint::serving(b2.addr()).weight(1),
            ],
        )
        .retry_policy(json!({
            "retry_on": "connect-failure",
            "num_retries": 1,
            "retry_host_predicate": [],
            "host_selection_retry_max_attempts": 0
        }))
        .start();
    let rs = batch(&plain, PATH, &[], n);
    let failed = rs.iter().filter(|r| r.status != 200).count();
    println!("without the predicate: {:?}", tally(&rs));
    assert!(failed > n / 2, "{:?}", tally(&rs));
    assert_eq!(plain.stat_or_zero("serving_picker.retry.other_host"), 0);
}

fn validate_with(config_value: &str) -> (bool, String) {
    let so = native_module();
    let dir = support::envoy::fresh_dir("native-refused");
    let yaml = std::fs::read_to_string(support::repo_root().join("envoy-native.yaml")).unwrap();
    let shipped =
        r#"value: '{"metadata_namespace": "k8s.endpointslice", "drain_window_ms": 15000}'"#;
    assert!(
        yaml.contains(shipped),
        "envoy-native.yaml changed: update this test"
    );
    let bad = yaml.replace(shipped, &format!("value: '{config_value}'"));
    let path = dir.join("bad.yaml");
    std::fs::write(&path, bad).unwrap();
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .args(["--disable-hot-restart", "-l", "info"])
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", so.parent().unwrap())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    (out.status.success(), text)
}

/// A bad policy configuration is refused: the module logs why (naming the
/// key) and Envoy rejects the configuration.
#[test]
fn bad_policy_config_is_refused_with_the_key_named() {
    for (value, key) in [
        (r#"{"local_zone_min_share": 7}"#, "local_zone_min_share"),
        (r#"{"refresh_interval_ms": 100}"#, "refresh_interval_ms"),
        (r#"{"bogus": true}"#, "bogus"),
        (r#"{"local_zone": "a", "local_zone": "b"}"#, "local_zone"),
        (r#"not json"#, "not valid JSON"),
    ] {
        let (ok, text) = validate_with(value);
        let ours: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("serving_picker: lb_policy_config refused"))
            .collect();
        assert!(!ok, "{value}: Envoy accepted it\n{text}");
        assert!(
            ours.len() == 1 && ours[0].contains(key) && ours[0].contains("[error]"),
            "{value}: no error line naming {key}:\n{text}"
        );
    }
    let (ok, text) = validate_with("{}");
    assert!(ok, "{{}} should validate\n{text}");
}

/// envoy-native.yaml, as shipped, loads and routes: pod-a only, and the
/// no-serving 503 on /none/.
#[test]
fn shipped_envoy_native_yaml_validates() {
    let so = native_module();
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(support::repo_root().join("envoy-native.yaml"))
        .args(["--disable-hot-restart", "-l", "info"])
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", so.parent().unwrap())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("serving_picker: cluster backend: tier ready with 1 pickable host(s) of 3"),
        "{text}"
    );
}
