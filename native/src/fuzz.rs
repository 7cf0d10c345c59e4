//! Fuzzed host sources through the whole policy: configuration, table build and picks. Hosts
//! come with any mix of priorities, health, offered or not, weights, conditions present, absent
//! or of the wrong type, topology strings of any content. Invariants, each named:
//! - `never_not_serving`: a pick is an offered host whose conditions, as Kubernetes gave them,
//!   say serving;
//! - `ready_first`: while an offered host is ready, every pick is a ready host;
//! - `no_pick_only_when_nothing_serves`: a 503 only when no offered host is serving;
//! - `no_panic`: building, rebuilding and picking never panic (proptest fails on a panic).
//!
//! Short runs in `make test` (PROPTEST_CASES), long ones in `make fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use proptest::prelude::*;
use serving_picker_core::contract::{key, Conditions, MetaFlags, DEFAULT_NAMESPACE};

use crate::policy::{LbInstance, PolicyConfig};
use crate::table::HostHealth;
use crate::testing::{FakeCluster, FakeHost, FakeRequest, RecordingProxy};

/// One condition's metadata: absent, a boolean, or a string (the wrong type: read as absent).
#[derive(Clone, Debug)]
enum Meta {
    Absent,
    Bool(bool),
    WrongType(String),
}

fn meta() -> impl Strategy<Value = Meta> {
    prop_oneof![
        Just(Meta::Absent),
        any::<bool>().prop_map(Meta::Bool),
        "[a-z]{0,5}".prop_map(Meta::WrongType),
    ]
}

fn health() -> impl Strategy<Value = HostHealth> {
    prop_oneof![
        Just(HostHealth::Healthy),
        Just(HostHealth::Degraded),
        Just(HostHealth::Unhealthy),
    ]
}

fn topology_string() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        Just("zone-a".to_string()),
        Just("zone-b".to_string()),
        Just("zone-a,zone-b".to_string()),
        ".{0,12}",
    ])
}

#[derive(Clone, Debug)]
struct HostSpec {
    offered: bool,
    health: HostHealth,
    weight: u32,
    ready: Meta,
    serving: Meta,
    terminating: Meta,
    zone: Option<String>,
    hints_zones: Option<String>,
    node_name: Option<String>,
    locality_zone: Option<String>,
}

fn host_spec() -> impl Strategy<Value = HostSpec> {
    (
        any::<bool>(),
        health(),
        1u32..5,
        (meta(), meta(), meta()),
        (topology_string(), topology_string(), topology_string()),
        topology_string(),
    )
        .prop_map(
            |(
                offered,
                health,
                weight,
                (ready, serving, terminating),
                (zone, hints_zones, node_name),
                locality_zone,
            )| HostSpec {
                offered,
                health,
                weight,
                ready,
                serving,
                terminating,
                zone,
                hints_zones,
                node_name,
                locality_zone,
            },
        )
}

fn cluster() -> impl Strategy<Value = Vec<Vec<HostSpec>>> {
    proptest::collection::vec(proptest::collection::vec(host_spec(), 0..7), 1..4)
}

const CONFIGS: [&str; 4] = [
    "",
    r#"{"local_zone": "zone-a"}"#,
    r#"{"local_zone": "zone-b", "local_node": "zone-a", "local_zone_min_share": 0.5}"#,
    r#"{"metadata_namespace": "k8s.endpointslice"}"#,
];

fn build(spec: &[Vec<HostSpec>]) -> FakeCluster {
    let mut cluster = FakeCluster::default();
    for (p, hosts) in spec.iter().enumerate() {
        let mut list = Vec::new();
        for (i, h) in hosts.iter().enumerate() {
            let mut fake = FakeHost::new(&format!("10.0.{p}.{i}:8080")).weight(h.weight);
            fake.health = h.health;
            fake.offered = h.offered;
            fake.locality_zone = h.locality_zone.clone();
            for (k, m) in [
                (key::READY, &h.ready),
                (key::SERVING, &h.serving),
                (key::TERMINATING, &h.terminating),
            ] {
                match m {
                    Meta::Absent => {}
                    Meta::Bool(b) => fake.bools.push((DEFAULT_NAMESPACE.into(), k.into(), *b)),
                    Meta::WrongType(s) => {
                        fake.strings
                            .push((DEFAULT_NAMESPACE.into(), k.into(), s.clone()))
                    }
                }
            }
            for (k, v) in [
                (key::ZONE, &h.zone),
                (key::HINTS_ZONES, &h.hints_zones),
                (key::NODE_NAME, &h.node_name),
            ] {
                if let Some(v) = v {
                    fake.strings
                        .push((DEFAULT_NAMESPACE.into(), k.into(), v.clone()));
                }
            }
            list.push(fake);
        }
        cluster.priorities.push(list);
    }
    cluster
}

/// What Kubernetes says of a host, from its metadata alone (the contract's nil rules): `None`
/// when it carries no condition of the right type (its EDS status then decides).
fn kubernetes_says(h: &HostSpec) -> Option<Conditions> {
    let flag = |m: &Meta| match m {
        Meta::Bool(b) => Some(*b),
        _ => None,
    };
    let flags = MetaFlags {
        ready: flag(&h.ready),
        serving: flag(&h.serving),
        terminating: flag(&h.terminating),
    };
    flags.any().then(|| flags.resolve().host())
}

/// The host a pick names: `(priority, index into the priority's offered hosts)`.
fn picked(spec: &[Vec<HostSpec>], pick: (u32, u32)) -> Option<&HostSpec> {
    spec.get(pick.0 as usize)?
        .iter()
        .filter(|h| h.offered)
        .nth(pick.1 as usize)
}

/// Serving as the table sees an offered host: Kubernetes' word when it gave one, else its
/// health (an offered host with no conditions is as Envoy reports it).
fn serving(h: &HostSpec) -> bool {
    kubernetes_says(h).is_none_or(|c| c.serving)
}

fn ready(h: &HostSpec) -> bool {
    kubernetes_says(h).is_none_or(|c| c == Conditions::READY)
}

proptest! {
    /// The main thread's instance (reads metadata through Envoy, publishes it) and a worker's
    /// (builds from the main thread's copy), updated in either order: every pick after both
    /// updates keeps the table.
    #[test]
    fn picks_over_fuzzed_hosts_keep_the_table(
        spec in cluster(),
        next in cluster(),
        config in 0usize..CONFIGS.len(),
        picks in 1usize..40,
        worker_first in any::<bool>(),
    ) {
        let proxy = RecordingProxy::default();
        let Some(cfg) = PolicyConfig::new(proxy, b"serving_picker", CONFIGS[config].as_bytes()) else {
            return Err(TestCaseError::fail("a shipped-shape config refused"));
        };
        let cfg = Arc::new(cfg);
        let first = build(&spec);
        let main = LbInstance::with_role(Arc::clone(&cfg), "c".into(), &first, true);
        let worker = LbInstance::with_role(cfg, "c".into(), &first, false);
        // The tables as built, then after a membership update to another fuzzed host set.
        for (spec, source, update) in [(&spec, first, false), (&next, build(&next), true)] {
            if update {
                if worker_first {
                    worker.on_membership_update(&source, 1, 1);
                    main.on_membership_update(&source, 1, 1);
                } else {
                    main.on_membership_update(&source, 1, 1);
                    worker.on_membership_update(&source, 1, 1);
                }
            }
            let any_offered_serving = spec.iter().flatten().any(|h| h.offered && serving(h));
            let any_offered_ready = spec.iter().flatten().any(|h| h.offered && ready(h));
            for k in 0..picks {
                let lb = if k % 2 == 0 { &main } else { &worker };
                let choice = lb.choose(&source, None::<&FakeRequest>);
                match choice {
                    None => prop_assert!(!any_offered_serving, "no_pick_only_when_nothing_serves"),
                    Some(pick) => {
                        let h = picked(spec, pick);
                        prop_assert!(h.is_some(), "never_not_serving: {pick:?} names no offered host");
                        let h = h.unwrap();
                        prop_assert!(serving(h), "never_not_serving: {h:?}");
                        if any_offered_ready {
                            prop_assert!(ready(h), "ready_first: {h:?}");
                        }
                    }
                }
            }
        }
    }
}
