//! The filter's own behaviour in a real Envoy: client-supplied override
//! headers, passthrough, the allow-list, an unreachable admin API, a custom
//! override header, counters, the change gate in front of the admin dump.
//! What both forms share (health statuses, weights, condition types, several
//! clusters, the 503) is in `both::behaviour`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// Allow-list passthroughs, counted as unknown_cluster or, if the filter
/// keeps one, a separate unmanaged_cluster counter.
fn passthroughs(envoy: &Envoy) -> u64 {
    ["unknown_cluster", "unmanaged_cluster"]
        .map(|c| {
            envoy
                .stat(&format!("serving_picker.passthrough.{c}"))
                .unwrap_or(0)
        })
        .iter()
        .sum()
}

#[test]
fn client_supplied_override_header_is_ignored() {
    let (envoy, a, b) = a_serving_b_not(EnvoyBuilder::new().tag("client-header"));
    expect_routing(&envoy, "/backend/x", &[], "A picked", picked(&a));
    a.reset();
    b.reset();
    let b_addr = b.addr().to_string();
    let a_addr = a.addr().to_string();
    let list1 = format!("{b_addr},{b_addr}");
    let list2 = format!("{b_addr}, {a_addr}");
    let variants: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "single header naming B",
            vec![(OVERRIDE_HEADER, b_addr.as_str())],
        ),
        (
            "header naming B twice",
            vec![
                (OVERRIDE_HEADER, b_addr.as_str()),
                (OVERRIDE_HEADER, b_addr.as_str()),
            ],
        ),
        (
            "mixed-case name",
            vec![("X-Gateway-Destination-Endpoint", b_addr.as_str())],
        ),
        ("comma list B,B", vec![(OVERRIDE_HEADER, list1.as_str())]),
        ("comma list B, A", vec![(OVERRIDE_HEADER, list2.as_str())]),
        (
            "naming an unknown address",
            vec![(OVERRIDE_HEADER, "127.0.0.1:1")],
        ),
    ];
    // picked(&a): A saw exactly one override value, its own address.
    assert_despite_each(
        &envoy,
        "/backend/x",
        &variants,
        BATCH,
        "A picked",
        picked(&a),
    );
    assert_eq!(
        b.count(),
        0,
        "not-serving B was reached through a client header"
    );
    assert_no_foreign_override(&a);
}

#[test]
fn passthrough_mode_leaves_no_serving_to_envoy() {
    let cfg = plugin_config(json!({"on_no_serving": "passthrough"}));
    let (envoy, a, b) = a_serving_b_not(
        EnvoyBuilder::new()
            .tag("passthrough")
            .with_filter(Some(&cfg)),
    );
    // The filter knows the endpoints: only A.
    expect_routing(&envoy, "/backend/x", &[], "A picked", picked(&a));
    // Nobody serving: round robin over both, no 503.
    envoy.set_endpoints(
        "backend",
        &[
            Endpoint::not_serving(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
    );
    b.reset();
    let start = Instant::now();
    while b.count() == 0 && start.elapsed() < SETTLE_TIMEOUT {
        let r = envoy.get("/backend/x", &[]);
        assert_eq!(
            r.status,
            200,
            "passthrough must not reject: {}",
            r.summary()
        );
        std::thread::sleep(POLL_EVERY);
    }
    assert!(
        b.count() > 0,
        "B never reached after nobody serves (passthrough should round-robin)"
    );
    settle(
        &envoy,
        "/backend/x",
        &[],
        "passed through to Envoy's LB",
        passed_through,
    );
    let rs = assert_batch(
        &envoy,
        "/backend/x",
        &[],
        BATCH,
        "passed through, no 503",
        |r: &Response| passed_through(r) && r.header("x-serving-picker").is_none(),
    );
    let counts = per_backend(&rs);
    assert!(
        count(&counts, "A") >= 10 && count(&counts, "B") >= 10,
        "round robin over A and B expected: {counts:?}"
    );
    // Only a not-serving host: it gets the traffic.
    envoy.set_endpoints("backend", &[Endpoint::not_serving(b.addr())]);
    expect_routing(
        &envoy,
        "/backend/x",
        &[],
        "B via Envoy's LB",
        |r: &Response| passed_through(r) && r.header(BACKEND_HEADER) == Some("B"),
    );
}

#[test]
fn cluster_outside_allow_list_is_passed_through_and_client_header_stripped() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let d = Backend::start("D");
    let cfg = plugin_config(json!({"clusters": ["picked"]}));
    let envoy = EnvoyBuilder::new()
        .tag("allow-list")
        .with_filter(Some(&cfg))
        .eds_cluster(
            "picked",
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .eds_cluster(
            "other",
            &[Endpoint::serving(c.addr()), Endpoint::not_serving(d.addr())],
        )
        .start();
    // The filter is active and knows the endpoints.
    expect_routing(&envoy, "/picked/x", &[], "picked -> A", picked(&a));
    // "other": plain round robin over C and not-serving D; the client header
    // (naming D) is stripped, so D does not get everything.
    let d_addr = d.addr().to_string();
    let hdr = [(OVERRIDE_HEADER, d_addr.as_str())];
    let rs = assert_batch(
        &envoy,
        "/other/x",
        &hdr,
        BATCH,
        "passed through, header stripped",
        passed_through,
    );
    let counts = per_backend(&rs);
    assert!(
        count(&counts, "C") >= 10 && count(&counts, "D") >= 10,
        "round robin over C and D (not in the allow-list) expected: {counts:?}"
    );
    let seen: Vec<String> = c
        .override_values()
        .into_iter()
        .chain(d.override_values())
        .collect();
    assert!(
        seen.is_empty(),
        "override header reached a passed-through cluster's hosts: {seen:?}"
    );
    // The allow-listed cluster still strips and picks.
    let b_addr = b.addr().to_string();
    assert_batch(
        &envoy,
        "/picked/x",
        &[(OVERRIDE_HEADER, b_addr.as_str())],
        BATCH,
        "picked -> A",
        picked(&a),
    );
    // Per-request counters reach Envoy on the next tick (at least every 50 ms here).
    eventually(Duration::from_secs(2), || {
        passthroughs(&envoy) >= BATCH as u64
    });
    // The passed-through batch carried a client header each time: each was removed and counted.
    // Each worker hands its counts to Envoy on its own tick: wait for them.
    let stripped_count = || {
        envoy
            .stat("serving_picker.override_header.stripped")
            .unwrap_or(0)
    };
    eventually(Duration::from_secs(3), || stripped_count() >= BATCH as u64);
    let stripped = stripped_count();
    assert!(
        stripped >= BATCH as u64,
        "override_header.stripped = {stripped}, expected >= {BATCH} (one per passed-through request)"
    );
    let unknown = envoy.stat("serving_picker.passthrough.unknown_cluster");
    let unmanaged = envoy.stat("serving_picker.passthrough.unmanaged_cluster");
    if unknown.is_some() || unmanaged.is_some() {
        let n = unknown.unwrap_or(0) + unmanaged.unwrap_or(0);
        assert!(
            n >= BATCH as u64,
            "passthrough.unknown_cluster {unknown:?} + passthrough.unmanaged_cluster {unmanaged:?} = {n}, expected >= {BATCH}"
        );
    }
}

/// A and B as in `a_serving_b_not`, the filter's admin cluster pointing at
/// a port nobody listens on.
fn admin_unreachable(tag: &str, extra: Value) -> (Envoy, Backend, Backend) {
    let closed = support::ports::free_port();
    let config = plugin_config(extra);
    a_serving_b_not(
        EnvoyBuilder::new()
            .tag(tag)
            .with_filter(Some(&config))
            .admin_cluster_port(closed),
    )
}

/// Admin API unreachable from the start, `before_first_snapshot: hold`: a
/// request, even one naming not-serving B in the client header, waits for a
/// snapshot that never comes and gets the 503 `no-snapshot-yet` after
/// `admin_timeout_ms`. Nothing reaches B.
#[test]
fn admin_unreachable_holds_then_503_and_reaches_nothing() {
    let (envoy, a, b) = admin_unreachable(
        "admin-unreachable-hold",
        json!({"admin_timeout_ms": 300, "before_first_snapshot": "hold"}),
    );
    let b_addr = b.addr().to_string();
    let hdr = [(OVERRIDE_HEADER, b_addr.as_str())];
    let rs = batch(&envoy, "/backend/x", &hdr, 5);
    assert!(
        rs.iter()
            .all(|r| r.status == 503 && r.header("x-serving-picker") == Some("no-snapshot-yet")),
        "{:?}",
        tally(&rs)
    );
    assert_eq!(a.count() + b.count(), 0, "{:?}", tally(&rs));
    assert!(envoy.stat("serving_picker.reject.no_snapshot").unwrap_or(0) >= 5);
}

/// The same with `before_first_snapshot: passthrough` (the default): the
/// filter leaves every request to Envoy's round robin, still strips the
/// client's header, and counts it in `passthrough.no_snapshot`.
#[test]
fn admin_unreachable_passthrough_fails_open_and_still_strips() {
    // A serves too (round robin), unnamed here.
    let (envoy, _a, b) = admin_unreachable(
        "admin-unreachable",
        json!({"before_first_snapshot": "passthrough"}),
    );
    let b_addr = b.addr().to_string();
    let hdr = [(OVERRIDE_HEADER, b_addr.as_str())];
    // Over ~2 s (20 refresh intervals, all failing): every request passes
    // through to Envoy's round robin with the client header removed.
    let mut all = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        all.extend(assert_batch(
            &envoy,
            "/backend/x",
            &hdr,
            5,
            "fail open, header stripped",
            passed_through,
        ));
        std::thread::sleep(POLL_EVERY);
    }
    all.extend(assert_batch(
        &envoy,
        "/backend/x",
        &hdr,
        BATCH,
        "fail open, header stripped",
        passed_through,
    ));
    let counts = per_backend(&all);
    let n = all.len();
    assert!(
        count(&counts, "A") >= n / 4 && count(&counts, "B") >= n / 4,
        "round robin over A and B expected with the admin API unreachable: {counts:?}"
    );
    if let Some(e) = envoy.stat("serving_picker.snapshot.refresh_error") {
        assert!(
            e > 0,
            "snapshot.refresh_error should count the failed polls"
        );
    }
    wait_until(
        "passthrough.no_snapshot counted",
        Duration::from_secs(2),
        || envoy.stat_or_zero("serving_picker.passthrough.no_snapshot") >= n as u64,
    );
}

#[test]
fn custom_override_header() {
    let cfg = plugin_config(json!({"override_header": "x-picked-endpoint"}));
    let (envoy, a, b) = a_serving_b_not(
        EnvoyBuilder::new()
            .tag("custom-header")
            .with_filter(Some(&cfg))
            .override_header("x-picked-endpoint"),
    );
    let b_addr = b.addr().to_string();
    let a_addr = a.addr().to_string();
    let hdr = [("x-picked-endpoint", b_addr.as_str())];
    expect_routing(&envoy, "/backend/x", &[], "A", served_by(&a));
    a.reset();
    b.reset();
    assert_batch(
        &envoy,
        "/backend/x",
        &hdr,
        BATCH,
        "A despite a client x-picked-endpoint naming B",
        served_by(&a),
    );
    assert_eq!(b.count(), 0);
    let values = a.header_values("x-picked-endpoint");
    assert_eq!(
        values.len(),
        BATCH,
        "A should see x-picked-endpoint once per request: {values:?}"
    );
    assert!(
        values
            .iter()
            .all(|v| override_list(v).iter().all(|x| *x == a_addr)),
        "A saw x-picked-endpoint values {values:?}"
    );
}

#[test]
fn counters_are_exported() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let d = Backend::start("D");
    let cfg = plugin_config(json!({"clusters": ["fresh", "draining", "dead"]}));
    let envoy = EnvoyBuilder::new()
        .tag("counters")
        .with_filter(Some(&cfg))
        .eds_cluster("fresh", &[Endpoint::serving(a.addr())])
        .eds_cluster("draining", &[Endpoint::serving_terminating(b.addr())])
        .eds_cluster("dead", &[Endpoint::not_serving(c.addr())])
        .eds_cluster("other", &[Endpoint::serving(d.addr())])
        .start();
    expect_routing(&envoy, "/fresh/x", &[], "A", picked(&a));
    expect_routing(&envoy, "/draining/x", &[], "B", picked(&b));
    expect_routing(&envoy, "/dead/x", &[], "503", no_serving_503("dead"));
    assert_batch(
        &envoy,
        "/other/x",
        &[],
        BATCH,
        "D passed through",
        passed_through,
    );
    let names = [
        "serving_picker.pick.ready",
        "serving_picker.pick.terminating_fallback",
        "serving_picker.reject.no_serving",
    ];
    // Per-request counters are counted in the VM and handed to Envoy on each
    // tick (a quarter of refresh_interval_ms, at least 50 ms): wait a few.
    let flushed = |n: &str| envoy.stat(n).is_some_and(|v| v >= BATCH as u64);
    eventually(Duration::from_secs(2), || {
        names.iter().all(|n| flushed(n)) && passthroughs(&envoy) >= BATCH as u64
    });
    let mut missing = Vec::new();
    for n in names {
        match envoy.stat(n) {
            Some(v) if v >= BATCH as u64 => {}
            other => missing.push(format!("{n} = {other:?}")),
        }
    }
    // "other" is outside the allow-list: unknown_cluster, or a separate
    // unmanaged_cluster counter if the filter keeps one.
    let unknown = envoy.stat("serving_picker.passthrough.unknown_cluster");
    let unmanaged = envoy.stat("serving_picker.passthrough.unmanaged_cluster");
    if unknown.is_none() || unknown.unwrap_or(0) + unmanaged.unwrap_or(0) < BATCH as u64 {
        missing.push(format!(
            "passthrough.unknown_cluster {unknown:?} + passthrough.unmanaged_cluster {unmanaged:?}"
        ));
    }
    // The snapshot is refreshed every 100 ms: over 2 s at least 10 refreshes.
    let before = envoy.stat("serving_picker.snapshot.refresh_ok");
    std::thread::sleep(Duration::from_secs(2));
    let after = envoy.stat("serving_picker.snapshot.refresh_ok");
    match (before, after) {
        (Some(b), Some(a)) if a >= b + 10 => {}
        _ => missing.push(format!(
            "snapshot.refresh_ok {before:?} -> {after:?} over 2 s (refresh_interval_ms 100)"
        )),
    }
    assert!(
        missing.is_empty(),
        "counters missing or too low (expected wasmcustom.<name>, >= {BATCH} for the per-request ones): {missing:?}\nall filter stats: {:?}",
        envoy.stats_matching("serving_picker")
    );
    eprintln!(
        "snapshot.refresh_error with a reachable admin API: {:?}",
        envoy.stat("serving_picker.snapshot.refresh_error")
    );
}

/// What the leader did over `window`: polls (refresh_ok counts skips too),
/// gate skips, and bytes it read from the admin API (Envoy's own count for
/// the `envoy_admin` cluster; the test's admin reads bypass that cluster).
fn admin_traffic(envoy: &Envoy, window: Duration) -> (u64, u64, u64) {
    let read = || {
        [
            "serving_picker.snapshot.refresh_ok",
            SKIPPED,
            "cluster.envoy_admin.upstream_cx_rx_bytes_total",
        ]
        .map(|n| envoy.stat(n).unwrap_or(0))
    };
    let before = read();
    std::thread::sleep(window);
    let after = read();
    (
        after[0] - before[0],
        after[1] - before[1],
        after[2] - before[2],
    )
}

/// `a_serving_b_not`, routing to A.
fn start_a_serving_b_not(builder: EnvoyBuilder) -> (Envoy, Backend, Backend) {
    let (envoy, a, b) = a_serving_b_not(builder);
    expect_routing(
        &envoy,
        "/backend/x",
        &[],
        "A serving, B not -> A",
        picked(&a),
    );
    (envoy, a, b)
}

/// A metadata-only EDS change: A no longer serving, B serving.
fn swap_a_and_b(envoy: &Envoy, a: &Backend, b: &Backend) {
    envoy.set_endpoints(
        "backend",
        &[Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
    );
}

/// A: serving, B: not serving; then a metadata-only EDS change swaps them.
/// Returns the Envoy's admin traffic at steady state before the change.
fn gate_scenario(tag: &str, extra: Value) -> (Envoy, (u64, u64, u64)) {
    let builder = EnvoyBuilder::new()
        .tag(tag)
        .with_filter(Some(&plugin_config(extra)));
    let (envoy, a, b) = start_a_serving_b_not(builder);
    let steady = admin_traffic(&envoy, Duration::from_secs(2));
    swap_a_and_b(&envoy, &a, &b);
    // Promptly: well inside full_refresh_interval_ms (60 s below).
    settle_for(
        &envoy,
        "/backend/x",
        &[],
        "after the metadata-only EDS change: B",
        Duration::from_secs(3),
        CONSECUTIVE,
        picked(&b),
    );
    assert_batch(&envoy, "/backend/x", &[], BATCH, "B", picked(&b));
    (envoy, steady)
}

/// The change gate: at steady state the leader polls the small stats answer
/// every refresh interval and skips the config dump (the skip counter rises,
/// at most one full refresh in 2 s, far fewer admin bytes per poll than with
/// the gate off); a metadata-only EDS change (which moves only
/// `update_success`) still reaches routing within a few polls. With
/// `admin_stats_path: ""` every poll is a full refresh, as before the gate.
#[test]
fn change_gate_skips_the_dump_at_steady_state_and_still_sees_changes() {
    let (gated, (polls, skips, bytes)) = gate_scenario(
        "change-gate-on",
        json!({"full_refresh_interval_ms": 60_000}),
    );
    assert!(polls >= 10, "polls in 2 s at 100 ms: {polls}");
    assert!(
        skips + 1 >= polls,
        "at most one full refresh in 2 s of steady state: {polls} polls, {skips} skipped"
    );
    let (_, skips_after, _) = admin_traffic(&gated, Duration::from_secs(1));
    assert!(
        skips_after >= 5,
        "skips again after the change: {skips_after}"
    );

    let (plain, (polls_off, skips_off, bytes_off)) =
        gate_scenario("change-gate-off", json!({"admin_stats_path": ""}));
    assert!(
        polls_off >= 10,
        "polls in 2 s at 100 ms without the gate: {polls_off}"
    );
    assert_eq!(skips_off, 0, "no skips with the gate off");
    assert_eq!(plain.stat(SKIPPED).unwrap_or(0), 0);
    let per_poll = bytes / polls;
    let per_poll_off = bytes_off / polls_off;
    assert!(
        per_poll * 2 < per_poll_off,
        "admin bytes per poll: {per_poll} with the gate, {per_poll_off} without"
    );
    println!(
        "change gate: {polls} polls, {skips} skipped, {per_poll} admin bytes/poll; \
         off: {polls_off} polls, {per_poll_off} admin bytes/poll"
    );
}

/// An Envoy with its stats turned off (`stats_matcher: reject_all`) answers
/// the gate's stats query with an empty 200: no gate, every poll a full
/// refresh, said once in the log; routing follows EDS as usual.
#[test]
fn change_gate_without_stats_is_off_and_says_so_once() {
    let builder = EnvoyBuilder::new()
        .tag("change-gate-no-stats")
        .bootstrap_hook(|bootstrap, _dir| {
            bootstrap["stats_config"] = json!({"stats_matcher": {"reject_all": true}});
        });
    let (envoy, a, b) = start_a_serving_b_not(builder);
    swap_a_and_b(&envoy, &a, &b);
    expect_routing(
        &envoy,
        "/backend/x",
        &[],
        "after the EDS change: B",
        picked(&b),
    );
    std::thread::sleep(Duration::from_millis(400)); // the log flush
    let said = envoy.log_lines("admin stats gate off");
    assert!(
        once_per_poller(&envoy, &said),
        "one line per poller for the empty stats answer:\n{}",
        said.join("\n")
    );
    assert!(said[0].contains("empty"), "{}", said[0]);
    assert!(envoy.log_lines("admin refresh failed").is_empty());
}

const SKIPPED: &str = "serving_picker.snapshot.refresh_skipped_unchanged";

fn count(counts: &std::collections::BTreeMap<String, usize>, name: &str) -> usize {
    counts.get(name).copied().unwrap_or(0)
}
