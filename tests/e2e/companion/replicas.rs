//! Two companion replicas, as shipped (`deploy/conditions/deployment.yaml`,
//! `deploy/envoy-gateway/companion.yaml`: two replicas behind one Service),
//! tested as one service.
//!
//! EDS: two release binaries in `eds` mode read the same slice directory
//! (as two pods read the same API server) and are both hosts of Envoy's one
//! xDS cluster (envoy-companion.yaml's `serving_picker_conditions`, with
//! two hosts: what a Service's address is to Envoy). Under a steady load
//! and slices changing every few hundred milliseconds, the replica that
//! holds Envoy's stream is SIGKILLed: Envoy's stream moves to the other
//! within seconds, takes its versions (no NACK, no rejected update), no
//! request fails, and every slice change made after the kill is in
//! Envoy's hosts (admin `/clusters`) within 5 s of being made. For ADS and
//! plain EDS, state of the world (`GRPC`) and incremental (`DELTA_GRPC`).
//!
//! Envoy Gateway's hook: two replicas in `envoy-gateway` mode on the same
//! slices; the test plays EG. EG's grpc-go channel dials the Service and
//! reconnects to a replica that runs; the test models that as its client
//! switching to the other replica's address once the first is killed. The
//! replicas answer the same request bytes with the same answer bytes,
//! before and after the kill.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use prost::Message;
use support::companion::{
    eds_from_companions, envoy_hosts, plain_round_robin, Companion, SliceDir, XdsApi,
};
use support::envoy::fresh_dir;
use support::load::{Load, LoadConfig, Record};
use support::*;

use super::envoy_gateway::{ask, eg_cla, Eg, EgCompanion, SERVICE as EG_SERVICE};

const CLUSTER: &str = "backend";
const SERVICE: &str = "web";
const PATH: &str = "/backend/x";
/// How long a slice change may take to reach Envoy, kill or not.
const REACH: Duration = Duration::from_secs(5);
/// Time between two slice changes.
const CHURN: Duration = Duration::from_millis(300);
/// Slice changes made after the kill.
const CHANGES_AFTER_KILL: usize = 12;
/// The companion's default output (tiers as priorities), as `ask` checks it.
const TIERED: bool = true;
/// The hook's calls answered for a managed assignment.
const MANAGED: &str = "serving_picker_conditions_eg_hook_calls_total{result=\"managed\"}";

/// The i-th state of the churn: two of the pool serving (the next two in
/// turn), the others not serving (the companion leaves them out).
fn state(pool: &[Backend], i: usize) -> (Vec<Endpoint>, BTreeSet<SocketAddr>) {
    let on = [i % pool.len(), (i + 1) % pool.len()];
    let eps = pool
        .iter()
        .enumerate()
        .map(|(k, b)| {
            if on.contains(&k) {
                Endpoint::serving(b.addr())
            } else {
                Endpoint::not_serving(b.addr())
            }
        })
        .collect();
    let want = on.iter().map(|&k| pool[k].addr()).collect();
    (eps, want)
}

/// The backends serving in churn state `i`.
fn serving_names(pool: &[Backend], i: usize) -> BTreeSet<String> {
    [i % pool.len(), (i + 1) % pool.len()]
        .iter()
        .map(|&k| pool[k].name().to_string())
        .collect()
}

/// One slice change: its churn state, when it was made and when Envoy's
/// hosts were seen to be its serving ones (load time).
struct Change {
    state: usize,
    made: Duration,
    reached: Duration,
}

/// Writes churn state `i` and waits until Envoy's hosts are exactly its
/// serving ones (panics after `REACH`).
fn change_and_wait(
    envoy: &Envoy,
    slices: &SliceDir,
    pool: &[Backend],
    load: &Load,
    i: usize,
) -> Change {
    let (eps, want) = state(pool, i);
    let made = load.now();
    slices.set_endpoints(SERVICE, &eps);
    loop {
        let got = envoy_hosts(envoy, CLUSTER);
        if got == want {
            return Change {
                state: i,
                made,
                reached: load.now(),
            };
        }
        if load.now() - made > REACH {
            panic!(
                "slice change {i} not in Envoy's hosts within {REACH:?}: want {want:?}, got {got:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a request sent at `sent` that took `took` went to a backend
/// serving in a state Envoy may have held meanwhile: state k from when it
/// was made until the next one was seen in Envoy.
fn served_in_time(pool: &[Backend], changes: &[Change], r: &Record) -> bool {
    let Some(b) = r.backend() else {
        return false;
    };
    let (from, to) = (r.sent, r.sent + r.took);
    changes.iter().enumerate().any(|(k, c)| {
        let until = changes.get(k + 1).map_or(Duration::MAX, |n| n.reached);
        c.made <= to && from <= until && serving_names(pool, c.state).contains(b)
    })
}

/// Which replica holds Envoy's stream (its `xds_streams` is 1), once one does.
fn holder(replicas: &[Companion; 2], within: Duration) -> usize {
    let mut found = None;
    wait_until("one replica to hold Envoy's stream", within, || {
        let streams: Vec<f64> = replicas
            .iter()
            .map(|c| {
                c.metric("serving_picker_conditions_xds_streams")
                    .unwrap_or(0.0)
            })
            .collect();
        found = streams.iter().position(|&s| s == 1.0);
        found.is_some()
    });
    found.unwrap()
}

fn failover_under_churn(api: XdsApi) {
    let pool: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("P{i}"))).collect();
    let slices = SliceDir::create(&fresh_dir("replicas-slices"));
    slices.set_endpoints(SERVICE, &state(&pool, 0).0);
    let mut replicas = [
        Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &[]),
        Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &[]),
    ];
    let envoy = EnvoyBuilder::new()
        .tag(&format!("replicas-{api:?}"))
        .eds_cluster(CLUSTER, &[])
        .with_filter(None)
        .bootstrap_hook(plain_round_robin(CLUSTER))
        .bootstrap_hook(eds_from_companions(
            &[replicas[0].listen_addr(), replicas[1].listen_addr()],
            api,
        ))
        .start();
    wait_until("Envoy has the first state", REACH, || {
        envoy_hosts(&envoy, CLUSTER) == state(&pool, 0).1
    });
    let killed = holder(&replicas, REACH);
    let survivor = 1 - killed;

    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig::paced(4, 50.0, PATH),
        "both replicas up, slices churning",
    );
    let mut changes = vec![Change {
        state: 0,
        made: Duration::ZERO,
        reached: Duration::ZERO,
    }];
    for i in 1..4 {
        changes.push(change_and_wait(&envoy, &slices, &pool, &load, i));
        std::thread::sleep(CHURN);
    }

    load.phase("one replica killed, slices churning");
    let updates = || envoy.stat_or_zero(&format!("cluster.{CLUSTER}.update_success"));
    let updates_before = updates();
    replicas[killed].kill();
    let before_kill = changes.len();
    for i in 4..4 + CHANGES_AFTER_KILL {
        let c = change_and_wait(&envoy, &slices, &pool, &load, i);
        let spent = load.now() - c.made;
        changes.push(c);
        std::thread::sleep(CHURN.saturating_sub(spent));
    }
    let moved = holder(&replicas, Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(300));
    let report = load.finish();

    let reach: Vec<Duration> = changes[before_kill..]
        .iter()
        .map(|c| c.reached - c.made)
        .collect();
    println!(
        "replicas {api:?}: {} requests; {} slice changes after the kill reached Envoy in max {:?} (the first {:?})",
        report.requests(),
        reach.len(),
        reach.iter().max().unwrap(),
        reach[0],
    );
    assert_eq!(moved, survivor, "Envoy's stream is on the survivor");
    report.assert_no_failures(
        &format!("replicas {api:?}"),
        "requests failed across the replica's crash",
    );
    for r in &report.records {
        assert!(
            served_in_time(&pool, &changes, r),
            "a request answered by a backend not serving then: {r:?}"
        );
    }
    let after = report.phase_start("one replica killed, slices churning");
    assert!(
        report.window(after, report.duration()).count() > 100,
        "the load ran through the failover"
    );
    // Envoy took the survivor's versions: every change as an update,
    // nothing rejected, nothing NACKed.
    assert!(
        updates() >= updates_before + CHANGES_AFTER_KILL as u64,
        "Envoy's EDS updates after the kill: {updates_before} -> {}",
        updates()
    );
    assert_eq!(
        envoy.stat_or_zero(&format!("cluster.{CLUSTER}.update_rejected")),
        0,
        "Envoy rejected an assignment"
    );
    assert_eq!(
        replicas[survivor]
            .metric("serving_picker_conditions_xds_nacks_total")
            .unwrap_or(0.0),
        0.0,
        "Envoy NACKed the survivor"
    );
    assert!(
        envoy
            .log_lines("gRPC config for")
            .iter()
            .all(|l| !l.contains("rejected")),
        "Envoy logged a rejected config"
    );
}

#[test]
fn replica_killed_under_churn_ads_sotw() {
    failover_under_churn(XdsApi::Ads);
}

#[test]
fn replica_killed_under_churn_ads_delta() {
    failover_under_churn(XdsApi::DeltaAds);
}

#[test]
fn replica_killed_under_churn_eds_sotw() {
    failover_under_churn(XdsApi::Eds);
}

#[test]
fn replica_killed_under_churn_eds_delta() {
    failover_under_churn(XdsApi::DeltaEds);
}

/// EG's hook on two replicas: the same answers from either; one killed
/// between calls, the calls that follow (on the other, as EG's channel
/// reconnects to a replica that runs) get the answers the killed one gave.
#[test]
fn eg_hook_calls_move_to_the_other_replica() {
    let pool: Vec<Backend> = (0..4).map(|i| Backend::start(&format!("P{i}"))).collect();
    let slices = SliceDir::create(&fresh_dir("replicas-eg-slices"));
    let mut first = EgCompanion::start(slices.path(), &[]);
    let second = EgCompanion::start(slices.path(), &[]);
    let a = Eg::connect(first.listen);
    let b = Eg::connect(second.listen);

    // Before the kill: each state asked of both (until both have read the
    // slices), then the same request bytes to both: the same answer bytes.
    let mut asked = Vec::new();
    for i in 0..4 {
        let (eps, _) = state(&pool, i);
        slices.set_endpoints(EG_SERVICE, &eps);
        ask(&a, &eps, TIERED, &format!("state {i}, first replica"));
        ask(&b, &eps, TIERED, &format!("state {i}, second replica"));
        let sent = eg_cla(EG_SERVICE, &eps).encode_to_vec();
        let from_a = a.try_modify_raw(sent.clone()).unwrap();
        let from_b = b.try_modify_raw(sent.clone()).unwrap();
        assert_eq!(from_a, from_b, "state {i}: the replicas answer differently");
        asked.push((sent, from_a));
    }

    let managed_before = second.metric(MANAGED);
    first.kill();
    let sent = eg_cla(EG_SERVICE, &state(&pool, 3).0).encode_to_vec();
    assert!(
        a.try_modify_raw(sent).is_err(),
        "a call to the killed replica fails (EG's channel then reconnects)"
    );
    // The calls that follow go to the other replica: the states seen
    // before get the same bytes, and new changes are followed.
    for i in 0..8 {
        let (eps, _) = state(&pool, i);
        slices.set_endpoints(EG_SERVICE, &eps);
        ask(&b, &eps, TIERED, &format!("state {i} after the kill"));
        if let Some((sent, before)) = asked.get(i) {
            let got = b.try_modify_raw(sent.clone()).unwrap();
            assert_eq!(&got, before, "state {i}: not the killed replica's answer");
        }
    }
    let managed = second.metric(MANAGED);
    assert!(
        managed >= managed_before + 8.0,
        "the survivor answered the calls that followed: {managed_before} -> {managed}"
    );
}
