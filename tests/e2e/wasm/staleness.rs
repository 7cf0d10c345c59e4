//! How soon a change reaches traffic (issue 16): a slow full refresh must not
//! stretch the change gate's polls; before the first snapshot the filter does
//! what `before_first_snapshot` says.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::admin_stub::{AdminStub, Mode};
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

/// A serving, B not (`a_serving_b_not`), the filter configured with
/// `extra`, its admin API a stub answering 500 until told otherwise.
fn behind_a_failing_admin_api(tag: &str, extra: Value) -> (Envoy, Backend, Backend, AdminStub) {
    let stub = AdminStub::start();
    stub.set_mode(Mode::Status(500));
    let config = plugin_config(extra);
    let (envoy, a, b) = a_serving_b_not(
        EnvoyBuilder::new()
            .tag(tag)
            .with_filter(Some(&config))
            .admin_cluster_port(stub.port()),
    );
    stub.set_upstream(envoy.admin_addr());
    (envoy, a, b, stub)
}

/// Whole config dumps take 1.5 s to come (a big Envoy), narrowed ones and the
/// stats do not. Right after the first full refresh, an EDS change swaps the
/// serving host. The full refresh's duration spaces the next *full* refresh
/// (4 x 1.5 s), but the stats poll and the narrowed refresh it leads to keep
/// `refresh_interval_ms` (200 ms): the change reaches traffic within about a
/// second, not after the 6 s stretch (before the fix: ~4.5 s).
#[test]
fn a_slow_full_refresh_does_not_stretch_the_stats_poll() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let stub = AdminStub::start();
    stub.set_mode(Mode::SlowFullDump(Duration::from_millis(1500)));
    let config = plugin_config(json!({"refresh_interval_ms": 200}));
    let envoy = EnvoyBuilder::new()
        .tag("stale-stretch")
        .with_filter(Some(&config))
        .admin_cluster_port(stub.port())
        .eds_cluster(
            CLUSTER,
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .eds_cluster("other", &[Endpoint::serving(c.addr())])
        .start();
    stub.set_upstream(envoy.admin_addr());
    wait_until("the first snapshot", Duration::from_secs(15), || {
        envoy.stat_or_zero("serving_picker.snapshot.published") >= 1
    });
    expect_routing(&envoy, PATH, &[], "A picked", picked(&a));
    // Settled: the gate skips (nothing moved since the last full refresh,
    // which took > 1.5 s: the next full one waits for 4 x that). Change now.
    let skipped = envoy.stat_or_zero("serving_picker.snapshot.refresh_skipped_unchanged");
    wait_until("the gate to skip", Duration::from_secs(15), || {
        envoy.stat_or_zero("serving_picker.snapshot.refresh_skipped_unchanged") >= skipped + 2
    });
    let changed = Instant::now();
    envoy.set_endpoints(
        CLUSTER,
        &[Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
    );
    let mut seen_at = None;
    while changed.elapsed() < Duration::from_secs(10) {
        if picked(&b)(&envoy.get(PATH, &[])) {
            seen_at = Some(changed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen_at = seen_at.expect("B never picked after the EDS change");
    println!(
        "EDS change reached traffic after {} ms (refresh_interval_ms 200, full refresh ~1500 ms)",
        seen_at.as_millis()
    );
    assert!(
        seen_at < Duration::from_millis(3000),
        "the change took {} ms: the stats poll waited for the full refresh's stretch",
        seen_at.as_millis()
    );
    assert!(envoy.stat_or_zero("serving_picker.snapshot.refresh_narrowed") >= 1);
}

/// Before the first snapshot (here the admin API answers 500 at first), a
/// managed cluster's requests get what `before_first_snapshot` says; Envoy's
/// round robin would reach not-serving B.
/// - `hold`: they wait, and once the admin API answers they all go to A:
///   no 503, B never reached.
/// - `reject`: a 503 saying so, at once; B never reached.
/// - `passthrough` (the default): Envoy's own load balancer, which reaches B
///   here (counted to show what it does): B is not serving in metadata
///   only, as nothing but serving-picker reads it; the companion's default
///   output leaves such a pod out of Envoy's balancer altogether.
#[test]
fn before_the_first_snapshot_no_request_reaches_a_not_serving_host() {
    for mode in ["hold", "reject", "passthrough"] {
        let config = json!({"before_first_snapshot": mode});
        let (envoy, a, b, stub) =
            behind_a_failing_admin_api(&format!("stale-first-{mode}"), config);
        let listen = envoy.listen_addr();
        // 30 requests at once, answered while the admin API still fails
        // (reject, passthrough) or after it recovers (hold).
        let early = std::thread::scope(|scope| {
            let clients: Vec<_> = (0..30)
                .map(|_| scope.spawn(move || support::http::get(listen, PATH, &[])))
                .collect();
            if mode == "hold" {
                wait_until("requests held", Duration::from_secs(10), || {
                    envoy.stat_or_zero("serving_picker.hold.no_snapshot") >= 30
                });
                assert!(
                    clients.iter().all(|c| !c.is_finished()),
                    "a held request was answered before the first snapshot"
                );
                stub.set_mode(Mode::Healthy);
            }
            clients
                .into_iter()
                .map(|c| c.join().unwrap())
                .collect::<Vec<_>>()
        });
        let rejected = early
            .iter()
            .filter(|r| r.status == 503 && r.header("x-serving-picker") == Some("no-snapshot-yet"))
            .count();
        println!(
            "before_first_snapshot {mode}: {:?}; B reached {} times",
            tally(&early),
            b.count()
        );
        match mode {
            "hold" => assert!(early.iter().all(picked(&a)), "{:?}", tally(&early)),
            "reject" => assert_eq!(rejected, early.len(), "{:?}", tally(&early)),
            _ => assert!(b.count() > 0, "passthrough: Envoy's round robin reaches B"),
        }
        if mode != "passthrough" {
            assert_eq!(
                b.count(),
                0,
                "not-serving B reached before the first snapshot"
            );
        }
        stub.set_mode(Mode::Healthy);
        expect_routing(&envoy, PATH, &[], "A picked", picked(&a));
        if mode == "reject" {
            assert_eq!(b.count(), 0);
            assert!(envoy.stat_or_zero("serving_picker.reject.no_snapshot") >= 30);
        }
    }
}

/// `hold` is bounded: with the admin API failing for good, held requests
/// get the 503 `no-snapshot-yet` after `admin_timeout_ms`, not a hang.
#[test]
fn a_hold_ends_in_a_503_when_no_snapshot_comes() {
    let (envoy, a, b, _stub) = behind_a_failing_admin_api(
        "stale-hold-expires",
        json!({"admin_timeout_ms": 400, "before_first_snapshot": "hold"}),
    );
    let started = Instant::now();
    let r = envoy.get(PATH, &[]);
    let waited = started.elapsed();
    println!("held {} ms, then {}", waited.as_millis(), r.status);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("x-serving-picker"), Some("no-snapshot-yet"));
    assert!(
        waited >= Duration::from_millis(350),
        "answered after {} ms: not held",
        waited.as_millis()
    );
    assert_eq!(b.count() + a.count(), 0);
    assert!(envoy.stat_or_zero("serving_picker.hold.no_snapshot") >= 1);
}

/// Clusters `a:b` and `a_b` (Envoy writes `:` as `_` in stat names, so both
/// count under `cluster.a_b.*`): a change of `a:b` must not be pinned to
/// `a_b` by the narrowed refresh (which then re-reads only `a_b` and misses
/// it until the periodic full refresh, 30 s here). The filter refreshes
/// everything when names clash.
#[test]
fn stat_name_clash_falls_back_to_a_full_refresh() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let d = Backend::start("D");
    let config = plugin_config(json!({"full_refresh_interval_ms": 30000}));
    let envoy = EnvoyBuilder::new()
        .tag("stale-stat-clash")
        .with_filter(Some(&config))
        .eds_cluster(
            "a:b",
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .eds_cluster("a_b", &[Endpoint::serving(c.addr())])
        .eds_cluster("other", &[Endpoint::serving(d.addr())])
        .start();
    expect_routing(&envoy, "/a:b/x", &[], "A picked", picked(&a));
    expect_routing(&envoy, "/a_b/x", &[], "C picked", picked(&c));
    let skipped = envoy.stat_or_zero("serving_picker.snapshot.refresh_skipped_unchanged");
    wait_until("the gate to skip", Duration::from_secs(10), || {
        envoy.stat_or_zero("serving_picker.snapshot.refresh_skipped_unchanged") >= skipped + 2
    });
    envoy.set_endpoints(
        "a:b",
        &[Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
    );
    settle_for(
        &envoy,
        "/a:b/x",
        &[],
        "B picked within a few polls",
        Duration::from_secs(5),
        5,
        picked(&b),
    );
}
