//! Faults around the serving_picker filter in a real Envoy: the admin API
//! unreachable or misbehaving, a stale snapshot, a hot reload of the
//! filter's configuration through LDS, hostile client headers. A backend
//! killed under load and live health, for both forms, are in `both::faults`.
//! Each test states its expectation in its doc comment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::json;
use support::admin_stub::{AdminStub, Mode};
use support::tweak::{listener_from_lds_file, LdsFile};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";
/// The filter's warning for a failed refresh.
const REFRESH_FAILED: &str = "admin refresh failed, keeping the last good snapshot";
const REFRESH_RECOVERED: &str = "admin refresh recovered";

/// Log lines with `needle`, after letting Envoy flush its log (100 ms).
fn flushed_log_lines(envoy: &Envoy, needle: &str) -> Vec<String> {
    std::thread::sleep(Duration::from_millis(400));
    envoy.log_lines(needle)
}

fn no_panic_or_critical(envoy: &Envoy) {
    no_panic_or_critical_except(envoy, &[]);
}

/// No panic and no critical line in the Envoy log, except lines containing
/// one of `expected`.
fn no_panic_or_critical_except(envoy: &Envoy, expected: &[&str]) {
    let log = envoy.log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("panicked") || l.contains("[critical]"))
        .filter(|l| !expected.iter().any(|e| l.contains(e)))
        .collect();
    assert!(
        bad.is_empty(),
        "panic/critical lines in the Envoy log:\n{}",
        bad.join("\n")
    );
}

// ---------------------------------------------------------------------------
// The admin API unreachable

/// The `envoy_admin` cluster points at a port nobody listens on, with
/// `before_first_snapshot: passthrough` (the default; `hold` answers 503
/// after `admin_timeout_ms`: wasm::behaviour). Expected:
/// the filter fails open (no snapshot: every request goes to Envoy's own
/// round robin, no 5xx from the filter, the client's override header still
/// stripped), `serving_picker.snapshot.refresh_error` keeps growing (one per
/// refresh), and the refresh-failed warning is logged once per poller (a
/// worker that won the lease hands it to the main thread's context), not per
/// refresh.
#[test]
fn admin_unreachable_fails_open_and_warns_once() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let closed = support::ports::free_port();
    let config = plugin_config(serde_json::json!({"before_first_snapshot": "passthrough"}));
    let envoy = EnvoyBuilder::new()
        .tag("fault-admin-dead")
        .with_filter(Some(&config))
        .admin_cluster_port(closed)
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .start();
    let b_addr = b.addr().to_string();
    let hostile = [(OVERRIDE_HEADER, b_addr.as_str())];
    std::thread::sleep(Duration::from_millis(500));
    let errors_early = envoy.stat_or_zero("serving_picker.snapshot.refresh_error");
    let mut all = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        all.extend(batch(&envoy, PATH, &hostile, 5));
        std::thread::sleep(POLL_EVERY);
    }
    assert_all(
        &all,
        "passed through to Envoy's LB (fail open)",
        passed_through,
    );
    let counts = per_backend(&all);
    assert!(
        counts.get("A").copied().unwrap_or(0) > all.len() / 4
            && counts.get("B").copied().unwrap_or(0) > all.len() / 4,
        "Envoy's round robin over A and B expected: {counts:?}"
    );
    let errors = envoy.stat_or_zero("serving_picker.snapshot.refresh_error");
    assert!(
        errors >= errors_early + 15,
        "refresh_error should grow by about one per 100 ms refresh over 3 s: {errors_early} -> {errors}"
    );
    assert_eq!(envoy.stat_or_zero("serving_picker.snapshot.refresh_ok"), 0);
    // Once per poller: a worker that won the lease at start-up hands it to the
    // main thread's context once it serves requests, and that one says it too.
    let warned = flushed_log_lines(&envoy, REFRESH_FAILED);
    assert!(
        once_per_poller(&envoy, &warned),
        "the refresh failure should be logged once per poller, not per refresh \
         ({errors} failures):\n{}",
        warned.join("\n")
    );
    println!(
        "admin unreachable: {errors} failed refreshes, warning logged once per poller: {}",
        warned.join(" | ")
    );
    no_panic_or_critical(&envoy);
}

/// No admin cluster at all (`admin_cluster: prometheus_stats`, which this
/// Envoy lacks, as Envoy Gateway's bootstrap does with Prometheus disabled),
/// the shipped `before_first_snapshot: passthrough`, `max_snapshot_age_ms`
/// 1000. Expected: every request passes through to Envoy's round robin from
/// the start, the client's header removed, nothing answered by the filter;
/// every poll fails (`snapshot.refresh_error`), none succeeds; after
/// `max_snapshot_age_ms` the `snapshot.stale` gauge says the filter has no
/// current snapshot. No panic, no critical line.
#[test]
fn no_admin_cluster_at_all_passes_through_and_says_so() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let config = plugin_config(json!({
        "admin_cluster": "prometheus_stats",
        "before_first_snapshot": "passthrough",
        "admin_timeout_ms": 200,
        "max_snapshot_age_ms": 1000
    }));
    let envoy = EnvoyBuilder::new()
        .tag("fault-no-admin-cluster")
        .with_filter(Some(&config))
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .start();
    let b_addr = b.addr().to_string();
    let hostile = [(OVERRIDE_HEADER, b_addr.as_str())];
    let rs = assert_batch(
        &envoy,
        PATH,
        &hostile,
        BATCH,
        "no admin cluster: Envoy's round robin, the client header removed",
        passed_through,
    );
    assert_eq!(per_backend(&rs).len(), 2, "{:?}", tally(&rs));
    wait_until("snapshot.stale 1", Duration::from_secs(5), || {
        envoy.stat("serving_picker.snapshot.stale") == Some(1)
    });
    assert!(envoy.stat_or_zero("serving_picker.snapshot.refresh_error") > 0);
    assert_eq!(envoy.stat_or_zero("serving_picker.snapshot.refresh_ok"), 0);
    wait_until("passthrough.no_snapshot", Duration::from_secs(2), || {
        envoy.stat_or_zero("serving_picker.passthrough.no_snapshot") >= BATCH as u64
    });
    println!(
        "no admin cluster: {:?}; refresh_error {}",
        tally(&rs),
        envoy.stat_or_zero("serving_picker.snapshot.refresh_error")
    );
    no_panic_or_critical(&envoy);
}

// ---------------------------------------------------------------------------
// The admin API misbehaving (through a stub between the filter and the real one)

/// The shared scenario: A serving+terminating, B not serving => A. Then the
/// admin API misbehaves in `mode`; then EDS changes to B serving. Expected
/// while it misbehaves: the last good snapshot is kept (every request still
/// picked A: no round robin over not-serving B, no passthrough), no refresh
/// succeeds, the failure is logged once. After the stub recovers, the EDS
/// change takes effect (B picked) and the recovery is logged.
fn last_good_snapshot_survives(tag: &str, mode: Mode) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let stub = AdminStub::start();
    let config = plugin_config(json!({"admin_timeout_ms": 200, "max_admin_body_bytes": 1_048_576}));
    let envoy = EnvoyBuilder::new()
        .tag(tag)
        .admin_cluster_port(stub.port())
        .with_filter(Some(&config))
        .eds_cluster(
            CLUSTER,
            &[
                Endpoint::serving_terminating(a.addr()),
                Endpoint::not_serving(b.addr()),
            ],
        )
        .start();
    stub.set_upstream(envoy.admin_addr());
    expect_routing(
        &envoy,
        PATH,
        &[],
        "healthy admin: A s+t, B not serving -> A",
        picked(&a),
    );
    let warned_before = flushed_log_lines(&envoy, REFRESH_FAILED).len();
    let errors_before = envoy.stat_or_zero("serving_picker.snapshot.refresh_error");

    stub.set_mode(mode.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while envoy.stat_or_zero("serving_picker.snapshot.refresh_error") < errors_before + 5 {
        let panics = envoy.log_lines("serving_picker panicked");
        if !panics.is_empty() {
            // Let the other VMs take the lease (and meet the same answer).
            std::thread::sleep(Duration::from_secs(2));
            let rs = batch(&envoy, PATH, &[], 20);
            let traps = envoy.log_lines("Uncaught RuntimeError");
            panic!(
                "FILTER BUG: with the admin API {} the filter panicked ({} VM traps); \
                 requests now get {:?}\n{}\n{}",
                mode.name(),
                traps.len(),
                tally(&rs),
                envoy.log_lines("serving_picker panicked").join("\n"),
                traps.join("\n")
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for five failed refreshes with the admin API {}",
            mode.name()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ok_broken = envoy.stat_or_zero("serving_picker.snapshot.refresh_ok");
    b.reset();
    assert_batch(
        &envoy,
        PATH,
        &[],
        BATCH,
        &format!("admin {}: last good snapshot kept -> A", mode.name()),
        picked(&a),
    );
    // Change the endpoints while the filter cannot see them.
    envoy.set_endpoints(
        CLUSTER,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_batch(
        &envoy,
        PATH,
        &[],
        BATCH,
        &format!("admin {}: still the last good snapshot -> A", mode.name()),
        picked(&a),
    );
    assert_eq!(b.count(), 0, "B was reached while the admin API was broken");
    assert_eq!(
        envoy.stat_or_zero("serving_picker.snapshot.refresh_ok"),
        ok_broken,
        "a refresh succeeded although the admin API was {}",
        mode.name()
    );
    assert!(stub.misbehaved() > 0);
    let errors_broken = envoy.stat_or_zero("serving_picker.snapshot.refresh_error") - errors_before;
    let warned = flushed_log_lines(&envoy, REFRESH_FAILED);
    let new_warnings = &warned[warned_before..];
    assert_eq!(
        new_warnings.len(),
        1,
        "admin {}: {errors_broken} failed refreshes should give one warning:\n{}",
        mode.name(),
        new_warnings.join("\n")
    );
    println!(
        "admin {}: {errors_broken} failed refreshes, one warning: {}",
        mode.name(),
        new_warnings[0]
    );

    let recovered_before = envoy.log_lines(REFRESH_RECOVERED).len();
    stub.set_mode(Mode::Healthy);
    expect_routing(
        &envoy,
        PATH,
        &[],
        "admin recovered: the change made while broken takes effect -> B",
        picked(&b),
    );
    assert!(
        flushed_log_lines(&envoy, REFRESH_RECOVERED).len() > recovered_before,
        "the recovery should be logged"
    );
    no_panic_or_critical(&envoy);
}

/// Admin answers after 1 s, the filter's admin_timeout_ms is 200: every
/// refresh times out. Expectation: see `last_good_snapshot_survives`.
#[test]
fn admin_slow_times_out_and_last_good_snapshot_is_kept() {
    last_good_snapshot_survives("fault-admin-slow", Mode::Slow(Duration::from_secs(1)));
}

/// Admin answers HTTP 500. Expectation: see `last_good_snapshot_survives`.
#[test]
fn admin_500_keeps_last_good_snapshot() {
    last_good_snapshot_survives("fault-admin-500", Mode::Status(500));
}

/// Admin answers 200 with the first half of the real config dump.
/// Expectation: see `last_good_snapshot_survives`.
#[test]
fn admin_truncated_json_keeps_last_good_snapshot() {
    last_good_snapshot_survives("fault-admin-truncated", Mode::TruncatedJson);
}

/// Admin answers 200 with an HTML page. Expectation: see
/// `last_good_snapshot_survives`.
#[test]
fn admin_not_json_keeps_last_good_snapshot() {
    last_good_snapshot_survives("fault-admin-html", Mode::NotJson);
}

/// Admin answers 200 with 2 MiB (max_admin_body_bytes is 1 MiB) of a valid
/// document that would parse as an empty snapshot: the size limit must
/// reject it before parsing. Expectation: see `last_good_snapshot_survives`.
#[test]
fn admin_huge_body_is_refused_and_last_good_snapshot_is_kept() {
    last_good_snapshot_survives("fault-admin-huge", Mode::Huge(2 << 20));
}

/// Admin announces the full Content-Length, sends half and closes the
/// connection. Expectation: see `last_good_snapshot_survives`.
#[test]
fn admin_connection_cut_mid_body_keeps_last_good_snapshot() {
    last_good_snapshot_survives("fault-admin-cut", Mode::CutMidBody);
}

/// Admin sends the headers and half the body at once, the rest after 1 s
/// (admin_timeout_ms is 200): a large dump streaming slower than the
/// timeout, so the call times out after the response headers arrived.
/// Expectation: see `last_good_snapshot_survives`.
#[test]
fn admin_body_slower_than_the_timeout_keeps_last_good_snapshot() {
    last_good_snapshot_survives(
        "fault-admin-slow-body",
        Mode::SlowBody(Duration::from_secs(1)),
    );
}

/// The admin API fails for longer than `max_snapshot_age_ms` (2 s here)
/// after the first snapshot (A serving+terminating, B serving): the last
/// good snapshot steers until then, and after it every request passes
/// through to Envoy's own load balancer, the client's header still removed
/// (`snapshot.stale` 1, `passthrough.stale_snapshot` counted, one warning);
/// a stale snapshot that names a host that stopped serving would otherwise
/// keep sending it traffic, and override_host never checks health. When
/// the admin API answers again, steering resumes (`snapshot.stale` 0).
#[test]
fn a_snapshot_no_refresh_confirms_is_set_aside_after_max_snapshot_age() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let stub = AdminStub::start();
    let config = plugin_config(json!({"admin_timeout_ms": 200, "max_snapshot_age_ms": 2000}));
    let envoy = EnvoyBuilder::new()
        .tag("fault-admin-stale")
        .admin_cluster_port(stub.port())
        .with_filter(Some(&config))
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .start();
    stub.set_upstream(envoy.admin_addr());
    settle(&envoy, PATH, &[], "A or B picked", picked_any(&[&a, &b]));
    stub.set_mode(Mode::Status(500));
    let broken = Instant::now();
    // Within the age: still steered.
    std::thread::sleep(Duration::from_millis(800));
    assert_batch(
        &envoy,
        PATH,
        &[],
        10,
        "last good snapshot",
        picked_any(&[&a, &b]),
    );
    assert_eq!(envoy.stat("serving_picker.snapshot.stale"), Some(0));
    // Past it: passed through, the header a client sends removed.
    let b_addr = b.addr().to_string();
    let hostile = [(OVERRIDE_HEADER, b_addr.as_str())];
    settle(
        &envoy,
        PATH,
        &hostile,
        "past max_snapshot_age_ms: Envoy's balancer",
        passed_through,
    );
    let set_aside = broken.elapsed();
    assert!(
        set_aside >= Duration::from_millis(2000),
        "set aside after {set_aside:?}, before max_snapshot_age_ms"
    );
    let rs = assert_batch(
        &envoy,
        PATH,
        &hostile,
        BATCH,
        "passed through",
        passed_through,
    );
    let counts = per_backend(&rs);
    assert!(
        counts.len() == 2,
        "Envoy's round robin over A and B (the client's B ignored): {counts:?}"
    );
    wait_until("snapshot.stale 1", Duration::from_secs(2), || {
        envoy.stat("serving_picker.snapshot.stale") == Some(1)
    });
    wait_until("passthrough.stale_snapshot", Duration::from_secs(2), || {
        envoy.stat_or_zero("serving_picker.passthrough.stale_snapshot") >= BATCH as u64
    });
    let warned = flushed_log_lines(
        &envoy,
        "every request passes through to Envoy's load balancer until one does",
    );
    assert!(!warned.is_empty(), "the set-aside is logged");
    println!(
        "admin failing: snapshot set aside after {} ms (max_snapshot_age_ms 2000): {}",
        set_aside.as_millis(),
        warned[0]
    );
    stub.set_mode(Mode::Healthy);
    settle(
        &envoy,
        PATH,
        &[],
        "admin back: steered again",
        picked_any(&[&a, &b]),
    );
    wait_until("snapshot.stale 0", Duration::from_secs(2), || {
        envoy.stat("serving_picker.snapshot.stale") == Some(0)
    });
    no_panic_or_critical(&envoy);
}

// ---------------------------------------------------------------------------
// A stale snapshot

/// The snapshot names a host Envoy no longer has: refresh_interval_ms 5000,
/// retry_alternates 0 (one address per header), no retry policy. Right after
/// a refresh, A is removed from EDS and stopped; for the next ~2.5 s the
/// filter still picks A for half of the requests. Expected (what Envoy's
/// override_host policy does): an override naming an address that is not in
/// the cluster's host map is ignored and the fallback round robin serves the
/// request from the hosts Envoy has (B): no request fails, and B receives the
/// stale override value naming A.
#[test]
fn stale_snapshot_naming_a_removed_host_falls_back_without_failures() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let config = plugin_config(json!({"refresh_interval_ms": 5000, "retry_alternates": 0}));
    let envoy = EnvoyBuilder::new()
        .tag("fault-stale-snapshot")
        .with_filter(Some(&config))
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .start();
    settle_for(
        &envoy,
        PATH,
        &[],
        "the first snapshot (after 5 s): A or B picked",
        Duration::from_secs(15),
        CONSECUTIVE,
        picked_any(&[&a, &b]),
    );
    let ok = envoy.stat_or_zero("serving_picker.snapshot.refresh_ok");
    wait_until("the next refresh", Duration::from_secs(12), || {
        envoy.stat_or_zero("serving_picker.snapshot.refresh_ok") > ok
    });
    let refreshed = Instant::now();
    envoy.set_endpoints(CLUSTER, &[Endpoint::serving(b.addr())]);
    a.stop();
    b.reset();
    let ok_stale = envoy.stat_or_zero("serving_picker.snapshot.refresh_ok");
    let mut all = Vec::new();
    std::thread::sleep(Duration::from_millis(100)); // the EDS file watch
    while refreshed.elapsed() < Duration::from_millis(3000) {
        all.push(envoy.get(PATH, &[]));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        envoy.stat_or_zero("serving_picker.snapshot.refresh_ok"),
        ok_stale,
        "a refresh happened during the stale window; the test did not exercise it"
    );
    assert_all(
        &all,
        "served by B while the snapshot still named removed A",
        served_by(&b),
    );
    let a_addr = a.addr().to_string();
    let stale = b.override_values().iter().filter(|v| **v == a_addr).count();
    assert!(
        stale > all.len() / 4,
        "B should have received the stale override naming A (ignored by override_host) \
         for about half of {} requests; got {stale}",
        all.len()
    );
    println!(
        "stale snapshot: {} requests, all served by B; {stale} carried the stale override naming A",
        all.len()
    );
}

// ---------------------------------------------------------------------------
// Hot reload of the filter configuration

/// The listener comes from LDS (a watched file, as a control plane would
/// serve it); its serving_picker plugin configuration is changed at run time.
/// The only endpoint is not serving. Expected: on_no_serving "reject" gives
/// the filter's 503; after the update to "passthrough" Envoy's LB serves A
/// (new config in effect); back to "reject" gives the 503 again (so the new
/// plugin instance loaded a snapshot of its own); an invalid configuration
/// is accepted and passes every request through to Envoy's LB (the filter
/// logs why and sets `config_invalid`; Envoy rejects nothing); a valid
/// update after that applies. Envoy keeps running; no panic or critical
/// line in its log.
#[test]
fn hot_reload_of_the_plugin_config_through_lds() {
    let a = Backend::start("A");
    let mut envoy = EnvoyBuilder::new()
        .tag("fault-lds-reload")
        .with_filter(Some(&plugin_config(json!({"on_no_serving": "reject"}))))
        .eds_cluster(CLUSTER, &[Endpoint::not_serving(a.addr())])
        .bootstrap_hook(listener_from_lds_file())
        .start();
    let lds = LdsFile::in_envoy_dir(envoy.dir());
    assert!(lds.plugin_config().contains("reject"));
    // An LDS update of the plugin's `on_no_serving`.
    let set_on_no_serving = |mode: &str| {
        let v = lds.set_plugin_config(&plugin_config(json!({"on_no_serving": mode})));
        println!("LDS v{v}: on_no_serving {mode}");
    };
    let envoys_lb_serves_a = |r: &Response| passed_through(r) && served_by(&a)(r);
    expect_routing(
        &envoy,
        PATH,
        &[],
        "reject: the filter's 503",
        no_serving_503(CLUSTER),
    );

    set_on_no_serving("passthrough");
    expect_routing(
        &envoy,
        PATH,
        &[],
        "passthrough after the LDS update: Envoy's LB serves A",
        envoys_lb_serves_a,
    );
    wait_until(
        "the passthrough config's own snapshot (passthrough.no_serving counted)",
        Duration::from_secs(10),
        || {
            let _ = envoy.get(PATH, &[]);
            envoy.stat_or_zero("serving_picker.passthrough.no_serving") > 0
        },
    );

    set_on_no_serving("reject");
    expect_routing(
        &envoy,
        PATH,
        &[],
        "reject again: the filter's 503",
        no_serving_503(CLUSTER),
    );

    let refused_before = envoy.log_lines("invalid configuration").len();
    let rejected_before = envoy.stat_or_zero("listener_manager.lds.update_rejected");
    let v = lds.set_plugin_config(r#"{"refresh_interval_ms": 5}"#);
    println!("LDS v{v}: an invalid plugin configuration");
    wait_until(
        "the filter to say why it cannot parse the configuration",
        Duration::from_secs(10),
        || envoy.log_lines("invalid configuration").len() > refused_before,
    );
    assert!(
        envoy.is_running(),
        "Envoy exited on an invalid plugin configuration"
    );
    let a_addr = a.addr().to_string();
    expect_routing(
        &envoy,
        PATH,
        &[(OVERRIDE_HEADER, a_addr.as_str())],
        "invalid configuration: every request to Envoy's LB, the client header removed",
        envoys_lb_serves_a,
    );
    assert_eq!(
        envoy.stat_or_zero("listener_manager.lds.update_rejected"),
        rejected_before,
        "Envoy rejected the listener"
    );
    assert!(
        envoy.stat_or_zero("serving_picker.config_invalid") >= 1,
        "config_invalid counts the contexts on the configuration"
    );

    set_on_no_serving("passthrough");
    expect_routing(
        &envoy,
        PATH,
        &[],
        "a valid update after the invalid one applies",
        envoys_lb_serves_a,
    );
    assert!(envoy.is_running());
    wait_until("config_invalid back to 0", Duration::from_secs(15), || {
        envoy.stat("serving_picker.config_invalid") == Some(0)
    });
    no_panic_or_critical(&envoy);
}

// ---------------------------------------------------------------------------
// Hostile client input

/// A serving, C not serving (alive: a request reaching it would be served).
/// Clients send the override header in every case, repeated, as comma lists
/// naming C first, padded, huge, empty, and naming A then C. Expected: every
/// request is picked A (A receives exactly one override value, its own
/// address), C receives nothing, A never sees a client's value. With nothing
/// serving (C alone, not serving), the same headers get the filter's 503 and
/// still never reach C.
#[test]
fn hostile_override_headers_never_steer() {
    let a = Backend::start("A");
    let c = Backend::start("C");
    let envoy = EnvoyBuilder::new()
        .tag("fault-hostile-headers")
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(c.addr())],
        )
        .start();
    expect_routing(&envoy, PATH, &[], "A picked", picked(&a));
    a.reset();
    c.reset();
    let a_addr = a.addr().to_string();
    let c_addr = c.addr().to_string();
    let c_first = format!("{c_addr},{a_addr}");
    let c_first_spaced = format!(" {c_addr} , {a_addr} ");
    let padded = format!("  {c_addr}  ");
    let c_many = vec![c_addr.as_str(); 400].join(",");
    let a_then_c = format!("{a_addr},{c_addr}");
    let variants: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "upper case",
            vec![("X-GATEWAY-DESTINATION-ENDPOINT", c_addr.as_str())],
        ),
        (
            "odd case",
            vec![("x-gAtEwAy-DeStInAtIoN-eNdPoInT", c_addr.as_str())],
        ),
        (
            "repeated in three cases",
            vec![
                (OVERRIDE_HEADER, c_addr.as_str()),
                ("X-Gateway-Destination-Endpoint", c_addr.as_str()),
                ("X-GATEWAY-DESTINATION-ENDPOINT", c_addr.as_str()),
            ],
        ),
        (
            "comma list naming C first",
            vec![(OVERRIDE_HEADER, c_first.as_str())],
        ),
        (
            "spaced comma list",
            vec![(OVERRIDE_HEADER, c_first_spaced.as_str())],
        ),
        ("padded value", vec![(OVERRIDE_HEADER, padded.as_str())]),
        (
            "C 400 times (~6 KB)",
            vec![(OVERRIDE_HEADER, c_many.as_str())],
        ),
        ("empty value", vec![(OVERRIDE_HEADER, "")]),
        ("A then C", vec![(OVERRIDE_HEADER, a_then_c.as_str())]),
        (
            "C, then a second header naming A",
            vec![
                (OVERRIDE_HEADER, c_addr.as_str()),
                (OVERRIDE_HEADER, a_addr.as_str()),
            ],
        ),
    ];
    assert_despite_each(&envoy, PATH, &variants, 20, "A picked", picked(&a));
    assert_eq!(
        c.count(),
        0,
        "not-serving C was reached through a client header"
    );
    assert_no_foreign_override(&a);

    // Nothing serving: the 503, and still nothing reaches C.
    envoy.set_endpoints(CLUSTER, &[Endpoint::not_serving(c.addr())]);
    settle(
        &envoy,
        PATH,
        &[],
        "nothing serving: 503",
        no_serving_503(CLUSTER),
    );
    // Until the filter's next refresh its snapshot still names A, which Envoy
    // no longer has: override_host ignores it and its fallback round robin
    // sends those requests to C (a refresh-lag effect, not a header leak).
    c.reset();
    assert_despite_each(&envoy, PATH, &variants, 10, "503", no_serving_503(CLUSTER));
    assert_eq!(
        c.count(),
        0,
        "not-serving C was reached through a client header"
    );
    // No strip count here: a pick's replace drops client values uncounted and a
    // 503 has no upstream. wasm::behaviour's allow-list test checks the counter.
}
