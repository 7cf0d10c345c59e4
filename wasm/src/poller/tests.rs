//! The root context's decisions over fakes of shared data and the admin
//! API: what only several VMs in a running Envoy reached before (publish
//! de-duplication and versions, the lease's TTL, resets on a change of
//! leader, which snapshot a follower takes, when a poll starts).

use super::*;
use crate::codec::DecodeError;
use crate::testing::{FakeAdmin, FakeShared};
use serving_picker_core::contract::Tier;
use serving_picker_core::plan::{PlannedHost, Topology};
use std::cell::RefCell;

fn keys(data: &FakeShared) -> SharedKeys<&FakeShared> {
    SharedKeys::for_config(data, 1)
}

fn plans(host: &str) -> Vec<ClusterPlan> {
    vec![ClusterPlan {
        cluster: "c".into(),
        tier: Tier::Ready,
        topology: Topology::None,
        hosts: vec![PlannedHost {
            address: host.into(),
            weight: 1,
        }],
    }]
}

/// What a worker took into its table, in order.
#[derive(Default)]
struct Installs(RefCell<Vec<Vec<u8>>>);

impl Installs {
    fn take(&self) -> impl FnOnce(&[u8]) -> Result<(), DecodeError> + '_ {
        |b| {
            self.0.borrow_mut().push(b.to_vec());
            Ok(())
        }
    }
    fn count(&self) -> usize {
        self.0.borrow().len()
    }
}

#[test]
fn the_lease_outlives_three_polls_and_an_admin_timeout() {
    let config = PluginConfig {
        refresh_interval_ms: 1_000,
        admin_timeout_ms: 5_000,
        ..PluginConfig::default()
    };
    assert_eq!(lease_ttl_ms(&config), 8_000);
    let data = FakeShared::default();
    let (mut a, mut b) = (Poller::new(1), Poller::new(2));
    assert!(a.lease(&keys(&data), &config, 10_000, false));
    assert!(
        !b.lease(&keys(&data), &config, 17_999, false),
        "a's lease is alive"
    );
    assert!(
        b.lease(&keys(&data), &config, 18_000, false),
        "a missed it: b takes over"
    );
    assert!(!a.lease(&keys(&data), &config, 18_001, false));
}

#[test]
fn ticks_and_heartbeats_follow_the_refresh_interval() {
    assert_eq!(tick_period(1_000), Duration::from_millis(250));
    assert_eq!(tick_period(400), Duration::from_millis(100));
    assert_eq!(tick_period(100), Duration::from_millis(50));
    assert_eq!(tick_period(60_000), Duration::from_millis(250));
    let config = PluginConfig {
        refresh_interval_ms: 400,
        ..PluginConfig::default()
    };
    assert_eq!(idle_fresh_ms(&config), 400);
    assert!(HOLD_TICK < tick_period(100));
}

#[test]
fn a_serving_context_leaves_the_lease_to_a_live_idle_one() {
    let config = PluginConfig::default();
    let data = FakeShared::default();
    let (mut worker, mut idle) = (Poller::new(1), Poller::new(2));
    assert!(
        worker.lease(&keys(&data), &config, 1_000, true),
        "no idle context yet"
    );
    // The idle context beats while it follows, then takes the released lease.
    assert!(!idle.lease(&keys(&data), &config, 1_100, false));
    assert!(
        !worker.lease(&keys(&data), &config, 1_200, true),
        "released"
    );
    assert!(idle.lease(&keys(&data), &config, 1_300, false));
    // The idle one stops beating: after four ticks the worker takes over once the lease expires.
    let later = 1_300 + lease_ttl_ms(&config);
    assert!(worker.lease(&keys(&data), &config, later, true));
}

#[test]
fn equal_bytes_publish_nothing_and_a_change_is_a_new_version() {
    let data = FakeShared::default();
    let installs = Installs::default();
    let mut p = Poller::new(7);
    let one = codec::encode(&plans("10.0.0.1:80"));
    assert!(p.publish(
        &keys(&data),
        one.clone(),
        &plans("x"),
        true,
        installs.take()
    ));
    assert_eq!(keys(&data).version().as_deref(), Some(&b"7.1"[..]));
    assert_eq!(p.seen_version(), Some(&b"7.1"[..]));
    assert_eq!(installs.count(), 1, "the leader takes its own snapshot");
    // The same bytes again: no version, no write, no install.
    let writes = data.writes.borrow().len();
    assert!(!p.publish(&keys(&data), one.clone(), &[], false, installs.take()));
    assert_eq!(data.writes.borrow().len(), writes);
    assert_eq!(installs.count(), 1);
    // Changed: the next version.
    let two = codec::encode(&plans("10.0.0.2:80"));
    assert!(p.publish(&keys(&data), two.clone(), &[], false, installs.take()));
    assert_eq!(keys(&data).version().as_deref(), Some(&b"7.2"[..]));
    assert_eq!(keys(&data).snapshot(), Some(two));
    assert_eq!(installs.count(), 2);
}

#[test]
fn a_new_leader_does_not_republish_what_is_already_shared() {
    let data = FakeShared::default();
    let bytes = codec::encode(&plans("10.0.0.1:80"));
    let mut old = Poller::new(1);
    assert!(old.publish(&keys(&data), bytes.clone(), &[], true, |_| Ok(())));
    // A new leader's first refresh finds the same endpoints: version 1.1 stays,
    // and a leader with no table yet takes the bytes it would have published.
    let installs = Installs::default();
    let mut new = Poller::new(2);
    assert!(!new.publish(&keys(&data), bytes, &[], true, installs.take()));
    assert_eq!(keys(&data).version().as_deref(), Some(&b"1.1"[..]));
    assert_eq!(installs.count(), 1);
}

#[test]
fn a_change_of_leader_forgets_what_the_last_term_published() {
    let config = PluginConfig::default();
    let data = FakeShared::default();
    let bytes = codec::encode(&plans("10.0.0.1:80"));
    let mut a = Poller::new(1);
    assert!(a.lease(&keys(&data), &config, 0, false));
    assert!(a.publish(&keys(&data), bytes.clone(), &[], true, |_| Ok(())));
    // Another leader publishes something else while a is out.
    let mut b = Poller::new(2);
    let ttl = lease_ttl_ms(&config);
    assert!(b.lease(&keys(&data), &config, ttl, false));
    assert!(!a.lease(&keys(&data), &config, ttl + 1, false));
    let other = codec::encode(&plans("10.0.0.9:80"));
    assert!(b.publish(&keys(&data), other, &[], false, |_| Ok(())));
    // a leads again: nothing of its last term is left to patch, and a's old
    // endpoints are published anew, since a no longer compares against its
    // own last term.
    assert!(a.lease(&keys(&data), &config, 3 * ttl, false));
    assert_eq!(a.patched(&plans("10.0.0.5:80")), None);
    assert!(a.publish(&keys(&data), bytes.clone(), &[], false, |_| Ok(())));
    assert_eq!(keys(&data).snapshot(), Some(bytes));
    assert_eq!(keys(&data).version().as_deref(), Some(&b"1.2"[..]));
}

#[test]
fn a_patch_splices_into_the_published_snapshot_or_asks_for_a_full_read() {
    let data = FakeShared::default();
    let mut p = Poller::new(1);
    assert_eq!(
        p.patched(&plans("10.0.0.2:80")),
        None,
        "nothing published yet"
    );
    let full = [
        plans("10.0.0.1:80"),
        vec![ClusterPlan {
            cluster: "d".into(),
            ..plans("10.0.0.3:80").remove(0)
        }],
    ]
    .concat();
    assert!(p.publish(&keys(&data), codec::encode(&full), &[], true, |_| Ok(())));
    let patched = p.patched(&plans("10.0.0.2:80")).unwrap();
    let decoded = codec::decode(&patched).unwrap();
    assert_eq!(decoded.len(), 2);
    assert_eq!(decoded[0].hosts[0].address, "10.0.0.2:80");
    assert_eq!(decoded[1].hosts[0].address, "10.0.0.3:80");
}

#[test]
fn a_follower_takes_each_new_version_once_and_keeps_its_table_on_garbage() {
    let data = FakeShared::default();
    let mut leader = Poller::new(1);
    let mut follower = Poller::new(2);
    let installs = Installs::default();
    follower.sync(&keys(&data), installs.take());
    assert_eq!(installs.count(), 0, "nothing published yet");
    let bytes = codec::encode(&plans("10.0.0.1:80"));
    assert!(leader.publish(&keys(&data), bytes.clone(), &[], true, |_| Ok(())));
    follower.sync(&keys(&data), installs.take());
    follower.sync(&keys(&data), installs.take());
    assert_eq!(*installs.0.borrow(), [bytes]);
    assert_eq!(follower.seen_version(), Some(&b"1.1"[..]));
    // A version whose snapshot does not read: kept out, tried again next tick.
    keys(&data).publish(b"garbage", b"1.2").unwrap();
    follower.sync(&keys(&data), |_| Err(DecodeError("bad")));
    assert_eq!(follower.seen_version(), Some(&b"1.1"[..]));
    follower.sync(&keys(&data), installs.take());
    assert_eq!(follower.seen_version(), Some(&b"1.2"[..]));
}

#[test]
fn a_poll_is_due_each_interval_or_at_once_without_a_snapshot() {
    let config = PluginConfig {
        refresh_interval_ms: 1_000,
        ..PluginConfig::default()
    };
    let mut admin = FakeAdmin::default();
    let mut p = Poller::new(1);
    assert_eq!(p.poll(&mut admin, &config, 5_000, false), Start::Started);
    assert_eq!(admin.asked, std::slice::from_ref(&config.admin_stats_path));
    // The stats call's answer is pending: busy until it comes (or is lost).
    assert_eq!(p.poll(&mut admin, &config, 5_100, false), Start::Busy);

    // Within the interval: only while there is no snapshot yet.
    let mut admin = FakeAdmin::default();
    assert_eq!(
        Poller::new(2).poll(&mut admin, &config, 500, false),
        Start::NotDue
    );
    assert!(admin.asked.is_empty());
    assert_eq!(
        Poller::new(2).poll(&mut admin, &config, 500, true),
        Start::Started
    );
    assert_eq!(admin.asked.len(), 1);
}

#[test]
fn a_failing_admin_api_waits_for_the_interval_even_without_a_snapshot() {
    let config = PluginConfig {
        refresh_interval_ms: 1_000,
        ..PluginConfig::default()
    };
    let mut admin = FakeAdmin {
        refuse: true,
        ..FakeAdmin::default()
    };
    let mut p = Poller::new(1);
    assert_eq!(p.poll(&mut admin, &config, 1_000, true), Start::Failed);
    assert_eq!(
        p.poll(&mut admin, &config, 1_100, true),
        Start::NotDue,
        "no retry storm"
    );
    assert_eq!(
        p.poll(&mut admin, &config, 2_000, true),
        Start::Failed,
        "due again"
    );
}

#[test]
fn reconfiguring_forgets_what_was_seen_and_published() {
    let data = FakeShared::default();
    let mut p = Poller::new(1);
    let bytes = codec::encode(&plans("10.0.0.1:80"));
    assert!(p.publish(&keys(&data), bytes, &[], true, |_| Ok(())));
    p.reconfigured();
    assert_eq!(p.seen_version(), None);
    let installs = Installs::default();
    p.sync(&keys(&data), installs.take());
    assert_eq!(installs.count(), 1, "the shared snapshot is taken again");
}

#[test]
fn the_summary_names_each_changed_cluster_up_to_eight() {
    assert_eq!(summary(&plans("a")), "c=ready x1 ".replace(" x", "x"));
    let many: Vec<ClusterPlan> = (0..10)
        .map(|i| ClusterPlan {
            cluster: format!("c{i}"),
            ..plans("a").remove(0)
        })
        .collect();
    let line = summary(&many);
    assert!(line.starts_with("c0=ready"), "{line}");
    assert!(line.ends_with("(+2 clusters)"), "{line}");
    assert!(!line.contains("c8="), "{line}");
}

#[test]
fn a_snapshot_goes_stale_only_when_confirmations_stop_for_the_max_age() {
    // Confirmed 15 s ago or less: current.
    assert!(!stale(Some(100_000), 115_000, 15_000, true));
    assert!(stale(Some(100_000), 115_001, 15_000, true));
    // No table: nothing to set aside (before_first_snapshot applies).
    assert!(!stale(Some(100_000), 200_000, 15_000, false));
    // Never confirmed yet (a follower that took a snapshot just published).
    assert!(!stale(None, 200_000, 15_000, true));
    // A clock that went backwards is not an age.
    assert!(!stale(Some(100_000), 50_000, 15_000, true));
}
