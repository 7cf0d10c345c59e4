//! The lease and the published snapshot over a fake of Envoy's shared data
//! (CAS tokens as Envoy keeps them): what only several VMs in one Envoy
//! reached before.

use super::*;
use crate::testing::FakeShared;

fn keys(data: &FakeShared) -> SharedKeys<&FakeShared> {
    SharedKeys::for_config(data, 0xabc)
}

const LEASE: &str = "serving_picker.0000000000000abc.lease";

#[test]
fn keys_are_per_configuration() {
    let data = FakeShared::default();
    keys(&data).publish(b"snap", b"1.1").unwrap();
    assert_eq!(
        data.value("0000000000000abc.snapshot").as_deref(),
        Some(&b"snap"[..])
    );
    let other = SharedKeys::for_config(&data, 0xdef);
    assert_eq!(other.version(), None, "another configuration sees nothing");
    assert_eq!(keys(&data).version().as_deref(), Some(&b"1.1"[..]));
}

#[test]
fn the_snapshot_is_written_before_its_version() {
    let data = FakeShared::default();
    keys(&data).publish(b"snap", b"1.1").unwrap();
    let writes = data.writes.borrow();
    let order: Vec<&str> = writes
        .iter()
        .map(|(k, _)| k.rsplit('.').next().unwrap())
        .collect();
    assert_eq!(order, ["snapshot", "version"]);
}

#[test]
fn a_failed_snapshot_write_publishes_no_version() {
    let data = FakeShared::default();
    data.broken.borrow_mut().push(".snapshot".into());
    assert!(keys(&data).publish(b"snap", b"1.1").is_err());
    assert_eq!(
        keys(&data).version(),
        None,
        "readers never see a version without its snapshot"
    );
}

#[test]
fn the_first_context_creates_the_lease_and_holds_it() {
    let data = FakeShared::default();
    let k = keys(&data);
    assert!(k.hold_lease(1, 1_000, 500, false, false));
    assert_eq!(
        data.value(".lease"),
        Some(
            Lease {
                holder: 1,
                renewed_ms: 1_000
            }
            .encode()
            .into_bytes()
        )
    );
    // Another context follows while the lease is fresh, takes it once expired.
    assert!(!k.hold_lease(2, 1_400, 500, false, false));
    assert!(k.hold_lease(1, 1_400, 500, false, false), "renewed");
    assert!(!k.hold_lease(2, 1_899, 500, false, false));
    assert!(
        k.hold_lease(2, 1_901, 500, false, false),
        "expired: taken over"
    );
    assert!(!k.hold_lease(1, 1_902, 500, false, false));
}

#[test]
fn a_lost_race_for_the_lease_is_following() {
    // The lease expired; another context takes it between this one's read and write.
    let data = FakeShared::default();
    let stale = Lease {
        holder: 9,
        renewed_ms: 0,
    }
    .encode();
    data.put(LEASE, stale.as_bytes());
    let theirs = Lease {
        holder: 2,
        renewed_ms: 10_000,
    }
    .encode();
    *data.race.borrow_mut() = Some((LEASE.into(), theirs.clone().into_bytes()));
    let k = keys(&data);
    assert!(!k.hold_lease(1, 10_000, 500, false, false));
    assert_eq!(
        data.value(".lease"),
        Some(theirs.into_bytes()),
        "theirs stands"
    );
    assert!(
        !k.hold_lease(1, 10_001, 500, false, false),
        "and is followed"
    );
}

#[test]
fn a_lease_that_cannot_be_written_is_not_held() {
    let data = FakeShared::default();
    data.broken.borrow_mut().push(".lease".into());
    assert!(!keys(&data).hold_lease(1, 1_000, 500, false, false));
}

#[test]
fn a_serving_leader_hands_the_lease_to_a_live_idle_context() {
    let data = FakeShared::default();
    let k = keys(&data);
    assert!(
        k.hold_lease(5, 1_000, 10_000, true, false),
        "a worker polls while no idle one is alive"
    );
    assert!(!k.idle_alive(1_000, 1_000));
    k.idle_heartbeat(1_500);
    assert!(k.idle_alive(2_000, 1_000));
    assert!(
        !k.idle_alive(2_500, 1_000),
        "a heartbeat is fresh for fresh_ms only"
    );
    // The worker releases; the idle context takes it at once.
    assert!(!k.hold_lease(5, 2_000, 10_000, true, true));
    assert!(k.hold_lease(6, 2_001, 10_000, false, false));
}

#[test]
fn the_confirmation_time_is_shared_and_garbage_reads_as_none() {
    let data = FakeShared::default();
    assert_eq!(keys(&data).confirmed(), None);
    keys(&data).confirm(1_700_000_000_123);
    assert_eq!(keys(&data).confirmed(), Some(1_700_000_000_123));
    assert_eq!(
        SharedKeys::for_config(&data, 0xdef).confirmed(),
        None,
        "another configuration's"
    );
    (&data)
        .set(
            "serving_picker.0000000000000abc.confirmed",
            Some(b"x"),
            None,
        )
        .unwrap();
    assert_eq!(keys(&data).confirmed(), None);
}
