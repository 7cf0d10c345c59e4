//! Generated well-formed admin output (every value type the metadata can
//! hold), rendered by `render`: parsed exactly, joined and planned by the rules.

use crate::admin::*;
use crate::common::*;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};
use serving_picker_core::contract::{EdsHealth, Tier};
use serving_picker_wasm::admin_json::{
    join_live_health, parse_clusters, parse_config_dump, HostRecord, LiveCluster, LiveHealth,
};
use serving_picker_wasm::plans::build_plans;
use std::collections::{BTreeMap, HashMap};

mod render;

#[derive(Debug, Clone)]
enum Addr {
    V4(u16),
    /// High 64 bits; written fully expanded when true.
    V6(u64, bool),
    /// Not an IP: skipped with a note.
    Name(String),
    Port0,
    PortAbove(u32),
    NoPort,
    Pipe,
    NoAddress,
    NoEndpoint,
}

#[derive(Debug, Clone)]
struct LiveSpec {
    eds: Option<&'static str>,
    failed_hc: bool,
    outlier: bool,
    hc_timeout: bool,
    excluded: bool,
    pending_removal: bool,
    stats: usize,
}

#[derive(Debug, Clone)]
struct HostSpec {
    addr: Addr,
    port: u16,
    weight: Option<u32>,
    coarse: Option<&'static str>,
    /// The namespace's value (`None`: the namespace is absent).
    meta: Option<Value>,
    other_ns: Option<Value>,
    hostname: bool,
    /// `None`: Envoy no longer has the host (missing from /clusters).
    live: Option<LiveSpec>,
}

#[derive(Debug, Clone)]
struct GroupSpec {
    zone: Option<&'static str>,
    priority: u32,
    hosts: Vec<HostSpec>,
}

#[derive(Debug, Clone)]
struct ClusterSpec {
    /// The dump lists it under `NAME/svc` (its EDS service name).
    service: bool,
    empty_service: bool,
    dynamic: bool,
    in_live: bool,
    /// Other Envoy clusters using the same EDS service.
    aliases: usize,
    extra_live: usize,
    groups: Vec<GroupSpec>,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Masked,
    Resource,
    Full,
}

#[derive(Debug, Clone)]
struct DumpSpec {
    prefix: String,
    admin: bool,
    clusters: Vec<ClusterSpec>,
    shape: Shape,
    pretty: bool,
    local_zone: Option<&'static str>,
    min_share: f64,
    allow: Option<u64>,
    alternates: usize,
}

const ZONES: [Option<&str>; 4] = [None, Some("zone-a"), Some("zone-b"), Some("")];
const COARSE: [Option<&str>; 5] = [
    None,
    Some("HEALTHY"),
    Some("UNHEALTHY"),
    Some("DEGRADED"),
    Some("TIMEOUT"),
];
const EDS: [Option<&str>; 8] = [
    None,
    Some("HEALTHY"),
    Some("UNKNOWN"),
    Some("DRAINING"),
    Some("UNHEALTHY"),
    Some("DEGRADED"),
    Some("TIMEOUT"),
    Some("SOMETHING_NEW"),
];

fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("yes")),
        Just(json!("true")),
        Just(json!(1)),
        Just(json!(0)),
        Just(json!(1.5)),
        Just(json!([])),
        Just(json!({})),
        Just(json!([true])),
    ]
}

fn meta_flag() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        3 => Just(None),
        8 => any::<bool>().prop_map(|b| Some(json!(b))),
        1 => Just(Some(Value::Null)),
        1 => odd_value().prop_map(Some),
    ]
}

fn meta_zone() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        3 => Just(None),
        3 => Just(Some(json!("zone-a"))),
        2 => Just(Some(json!("zone-b"))),
        1 => Just(Some(json!(""))),
        1 => Just(Some(Value::Null)),
        1 => odd_value().prop_map(Some),
    ]
}

fn meta_ns() -> impl Strategy<Value = Value> {
    let object = (
        meta_flag(),
        meta_flag(),
        meta_flag(),
        meta_zone(),
        prop::collection::btree_map("x-[a-z]{1,5}", json_leaf(), 0..2),
    )
        .prop_map(|(ready, serving, terminating, zone, extra)| {
            let mut m: Map<String, Value> = extra.into_iter().collect();
            for (k, v) in [
                ("ready", ready),
                ("serving", serving),
                ("terminating", terminating),
                ("zone", zone),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            Value::Object(m)
        });
    prop_oneof![
        10 => object,
        1 => Just(Value::Null),
        1 => odd_value(),
    ]
}

fn addr() -> impl Strategy<Value = Addr> {
    prop_oneof![
        12 => any::<u16>().prop_map(Addr::V4),
        3 => (any::<u64>(), any::<bool>()).prop_map(|(h, e)| Addr::V6(h, e)),
        1 => prop_oneof![Just(String::new()), "[a-z][a-z0-9.-]{0,15}"].prop_map(Addr::Name),
        1 => Just(Addr::Port0),
        1 => (65_536u32..=u32::MAX).prop_map(Addr::PortAbove),
        1 => Just(Addr::NoPort),
        1 => Just(Addr::Pipe),
        1 => Just(Addr::NoAddress),
        1 => Just(Addr::NoEndpoint),
    ]
}

fn live_spec() -> impl Strategy<Value = LiveSpec> {
    (
        select(EDS.to_vec()),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
        0usize..10,
    )
        .prop_map(
            |(eds, failed_hc, outlier, hc_timeout, excluded, pending_removal, stats)| LiveSpec {
                eds,
                failed_hc,
                outlier,
                hc_timeout,
                excluded,
                pending_removal,
                stats,
            },
        )
}

fn host_spec() -> impl Strategy<Value = HostSpec> {
    (
        addr(),
        1u16..=u16::MAX,
        prop_oneof![
            1 => Just(None),
            6 => Just(Some(1u32)),
            3 => (0u32..20).prop_map(Some),
            1 => any::<u32>().prop_map(Some),
        ],
        select(COARSE.to_vec()),
        prop_oneof![1 => Just(None), 6 => meta_ns().prop_map(Some)],
        prop_oneof![4 => Just(None), 1 => any_json().prop_map(Some)],
        any::<bool>(),
        prop_oneof![1 => Just(None), 8 => live_spec().prop_map(Some)],
    )
        .prop_map(
            |(addr, port, weight, coarse, meta, other_ns, hostname, live)| HostSpec {
                addr,
                port,
                weight,
                coarse,
                meta,
                other_ns,
                hostname,
                live,
            },
        )
}

fn group_spec() -> impl Strategy<Value = GroupSpec> {
    (
        select(ZONES.to_vec()),
        prop_oneof![4 => Just(0u32), 1 => 1u32..3],
        prop::collection::vec(host_spec(), 0..8),
    )
        .prop_map(|(zone, priority, hosts)| GroupSpec {
            zone,
            priority,
            hosts,
        })
}

fn cluster_spec() -> impl Strategy<Value = ClusterSpec> {
    (
        any::<bool>(),
        prop::bool::weighted(0.2),
        any::<bool>(),
        prop::bool::weighted(0.85),
        prop_oneof![4 => Just(0usize), 1 => 1usize..3],
        0usize..3,
        prop::collection::vec(group_spec(), 0..4),
    )
        .prop_map(
            |(service, empty_service, dynamic, in_live, aliases, extra_live, groups)| ClusterSpec {
                service,
                empty_service,
                dynamic,
                in_live,
                aliases,
                extra_live,
                groups,
            },
        )
}

fn dump_spec() -> impl Strategy<Value = DumpSpec> {
    (
        "[a-zA-Z0-9_./|\"\\\\ é-]{0,8}",
        prop::bool::weighted(0.3),
        prop::collection::vec(cluster_spec(), 0..6),
        prop_oneof![
            Just(Shape::Masked),
            Just(Shape::Resource),
            Just(Shape::Full)
        ],
        any::<bool>(),
        select(vec![None, Some("zone-a"), Some("zone-b")]),
        prop_oneof![Just(1.0f64), Just(0.5), 0.001f64..=1.0],
        prop_oneof![2 => Just(None), 1 => any::<u64>().prop_map(Some)],
        0usize..=8,
    )
        .prop_map(
            |(prefix, admin, clusters, shape, pretty, local_zone, min_share, allow, alternates)| {
                DumpSpec {
                    prefix,
                    admin,
                    clusters,
                    shape,
                    pretty,
                    local_zone,
                    min_share,
                    allow,
                    alternates,
                }
            },
        )
}

/// The join, from its documentation: each Envoy cluster gets the hosts of
/// the dump entry it is listed under (its EDS service name, else its name)
/// that Envoy still has, with live health; unclaimed entries stand as they are.
fn expected_join(
    dump: &[(String, Vec<HostRecord>)],
    live: &LiveHealth,
) -> BTreeMap<String, Vec<HostRecord>> {
    let mut out = BTreeMap::new();
    for (listed, hosts) in dump {
        let owners: Vec<(&String, &LiveCluster)> = live
            .clusters
            .iter()
            .filter(|(name, c)| c.eds_service_name.as_ref().unwrap_or(*name) == listed)
            .collect();
        if owners.is_empty() {
            assert!(out.insert(listed.clone(), hosts.clone()).is_none());
            continue;
        }
        for (name, c) in owners {
            let hosts = hosts
                .iter()
                .filter_map(|h| {
                    let seen = c.hosts.get(&h.address)?;
                    let mut h = h.clone();
                    h.health.eds = Some(seen.eds);
                    h.health.failing = seen.failing;
                    Some(h)
                })
                .collect();
            assert!(
                out.insert(name.clone(), hosts).is_none(),
                "generator: name clash"
            );
        }
    }
    out
}

proptest! {
    /// Generated well-formed admin output, with every value type the
    /// metadata can hold: parsed exactly; every host with a valid IP:PORT
    /// once, the others skipped with a note; joined and planned by the rules.
    #[test]
    fn generated_admin_output(spec in dump_spec()) {
        let r = spec.render();
        let dump = parse_config_dump(&r.dump_body, NS).unwrap();
        let live = parse_clusters(&r.clusters_body).unwrap();

        let names: Vec<&str> = dump.clusters.iter().map(|c| c.name.as_str()).collect();
        let want: Vec<&str> = r.dump.iter().map(|(n, _)| n.as_str()).collect();
        prop_assert_eq!(names, want);
        for (got, (_, hosts)) in dump.clusters.iter().zip(&r.dump) {
            prop_assert_eq!(&got.hosts, hosts);
            for h in hosts {
                let n = got.hosts.iter().filter(|g| g.address == h.address).count();
                prop_assert_eq!(n, 1, "{} once", &h.address);
            }
        }
        let skipped = dump.notes.iter().filter(|n| n.contains("host skipped")).count();
        prop_assert_eq!(skipped, r.skipped, "{:?}", dump.notes);
        prop_assert_eq!(dump.notes.len(), r.skipped + r.odd, "{:?}", dump.notes);
        prop_assert_eq!(&live, &r.live);

        let joined = join_live_health(dump.clone(), Some(&live));
        let mut by_name = BTreeMap::new();
        for c in &joined {
            prop_assert!(by_name.insert(c.name.clone(), c.hosts.clone()).is_none(), "{} twice", &c.name);
        }
        prop_assert_eq!(by_name, expected_join(&r.dump, &r.live));
        // Without live health the dump stands.
        prop_assert_eq!(&join_live_health(dump.clone(), None), &dump.clusters);

        check_pipeline(&dump, Some(&live), &r.config);
        check_pipeline(&dump, None, &r.config);
    }
}

/// The generator of admin output does reach the interesting cases (so the
/// property above is not vacuous): every tier, skipped and odd hosts,
/// clusters that several Envoy clusters share, hosts Envoy dropped.
#[test]
fn generated_admin_output_covers_the_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = dump_spec();
    let mut tiers: HashMap<&str, usize> = HashMap::new();
    let (mut skipped, mut odd, mut shared, mut dropped, mut draining, mut zoned) =
        (0, 0, 0, 0, 0, 0);
    for _ in 0..300 {
        let spec = strategy.new_tree(&mut runner).unwrap().current();
        let r = spec.render();
        skipped += r.skipped;
        odd += r.odd;
        let dump = parse_config_dump(&r.dump_body, NS).unwrap();
        let live = parse_clusters(&r.clusters_body).unwrap();
        let joined = join_live_health(dump.clone(), Some(&live));
        let before: usize = dump.clusters.iter().map(|c| c.hosts.len()).sum();
        let claimed = |name: &str| {
            live.clusters
                .values()
                .filter(|c| c.eds_service_name.as_deref() == Some(name))
                .count()
        };
        shared += dump
            .clusters
            .iter()
            .filter(|c| claimed(&c.name) > 1)
            .count();
        let after: usize = joined.iter().map(|c| c.hosts.len()).sum();
        dropped += usize::from(after < before);
        draining += joined
            .iter()
            .flat_map(|c| &c.hosts)
            .filter(|h| h.health.eds == Some(EdsHealth::Draining))
            .count();
        let plans = build_plans(dump, Some(&live), &r.config);
        zoned += usize::from(
            r.config.selection.local_zone.is_some() && plans.iter().any(|p| p.hosts.len() > 1),
        );
        for p in plans {
            *tiers.entry(p.tier.name()).or_default() += 1;
        }
    }
    for tier in [Tier::Ready, Tier::TerminatingFallback, Tier::NoServing] {
        assert!(
            tiers.get(tier.name()).copied().unwrap_or(0) > 5,
            "{tiers:?}"
        );
    }
    for (what, n) in [
        ("skipped", skipped),
        ("odd", odd),
        ("shared", shared),
        ("dropped", dropped),
        ("draining", draining),
        ("zoned", zoned),
    ] {
        assert!(n > 5, "{what}: {n}");
    }
}
