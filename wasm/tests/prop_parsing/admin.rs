//! Envoy's admin JSON (the config dump and `/clusters`): arbitrary, mutated
//! and edited input, then what is built from it (joined hosts, plans, the
//! routing table) checked against the tier rules.

use crate::common::*;
use crate::mutations::*;
use proptest::prelude::*;
use serde_json::{json, Value};
use serving_picker_core::contract::Tier;
use serving_picker_core::plan::{ClusterPlan, PlannedHost};
use serving_picker_wasm::admin_json::{
    join_live_health, parse_clusters, parse_config_dump, ClusterHosts, EndpointsDump, HostRecord,
    LiveHealth,
};
use serving_picker_wasm::codec;
use serving_picker_wasm::config::PluginConfig;
use serving_picker_wasm::plans::{build_plans, DRAINING_WEIGHT};
use serving_picker_wasm::table::{Decision, RoutingTable};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;

/// The tier rule and everything else a plan must satisfy, from the
/// cluster's joined hosts (KEP-1669: serving and not terminating if any,
/// else serving and terminating, else none; one priority and no zone rule:
/// the hosts' own weights, duplicates merged).
pub(crate) fn expected_plan(c: &ClusterHosts, config: &PluginConfig) -> (Tier, Vec<PlannedHost>) {
    let ready: Vec<&HostRecord> = c
        .hosts
        .iter()
        .filter(|h| h.conditions().serving && !h.conditions().terminating)
        .collect();
    let serving: Vec<&HostRecord> = c.hosts.iter().filter(|h| h.conditions().serving).collect();
    let (tier, set) = if !ready.is_empty() {
        (Tier::Ready, ready)
    } else if !serving.is_empty() {
        (Tier::TerminatingFallback, serving)
    } else {
        (Tier::NoServing, Vec::new())
    };
    // Priorities and zones split the load (the core's plan tests check the
    // shares); here: one priority and no zone rule keep the hosts' weights,
    // anything else only hosts of the tier, which `check_plans` checks.
    let top = set.iter().map(|h| h.priority).min();
    if config.selection.local_zone.is_some() || set.iter().any(|h| Some(h.priority) != top) {
        return (tier, Vec::new());
    }
    let mut merged: BTreeMap<String, u32> = BTreeMap::new();
    for h in set {
        let w = merged.entry(h.address.clone()).or_insert(0);
        *w = w.saturating_add(h.weight);
    }
    let hosts = merged
        .into_iter()
        .map(|(address, weight)| PlannedHost { address, weight })
        .collect();
    (tier, hosts)
}

pub(crate) fn check_plans(joined: &[ClusterHosts], plans: &[ClusterPlan], config: &PluginConfig) {
    for pair in plans.windows(2) {
        assert!(pair[0].cluster < pair[1].cluster, "sorted, unique");
    }
    // build_plans sorts stably and keeps the first of equal names.
    let mut first: HashMap<&str, &ClusterHosts> = HashMap::new();
    for c in joined {
        first.entry(c.name.as_str()).or_insert(c);
    }
    let managed: HashSet<&str> = first
        .keys()
        .copied()
        .filter(|n| config.manages(n))
        .collect();
    let planned: HashSet<&str> = plans.iter().map(|p| p.cluster.as_str()).collect();
    assert_eq!(planned, managed);
    for plan in plans {
        let c = first[plan.cluster.as_str()];
        // The brief's invariants, stated directly:
        for h in &plan.hosts {
            let fits = c.hosts.iter().any(|r| {
                r.address == h.address
                    && r.conditions().serving
                    && (plan.tier != Tier::Ready || !r.conditions().terminating)
            });
            assert!(
                fits,
                "{}: {} is not a serving host of the tier",
                plan.cluster, h.address
            );
        }
        let any_ready = c
            .hosts
            .iter()
            .any(|h| h.conditions().serving && !h.conditions().terminating);
        if any_ready {
            assert_eq!(plan.tier, Tier::Ready, "{}", plan.cluster);
        }
        assert_eq!(plan.hosts.is_empty(), plan.tier == Tier::NoServing);
        // ... and the whole rule.
        let (tier, hosts) = expected_plan(c, config);
        assert_eq!(plan.tier, tier, "{}", plan.cluster);
        if !hosts.is_empty() || tier == Tier::NoServing {
            assert_eq!(plan.hosts, hosts, "{}", plan.cluster);
        }
    }
}

/// A table as a worker has it after taking in `plans` (into `previous`, when
/// it had one).
pub(crate) fn table_of(
    plans: &[ClusterPlan],
    alternates: usize,
    previous: Option<RoutingTable>,
) -> RoutingTable {
    let mut table = previous.unwrap_or_else(|| RoutingTable::new(alternates));
    table.update(&codec::encode(plans)).unwrap();
    table
}

/// `decide` only ever names hosts of the plan: the picked one first, then
/// alternates of the same plan (cycled); an updated table holds what a fresh
/// one would.
pub(crate) fn check_table(
    plans: &[ClusterPlan],
    alternates: usize,
    previous: Option<RoutingTable>,
) {
    let table = table_of(plans, alternates, previous);
    let fresh = table_of(plans, alternates, None);
    assert_eq!(
        (table.cluster_count(), table.host_count()),
        (fresh.cluster_count(), fresh.host_count())
    );
    let names: HashSet<&str> = plans.iter().map(|p| p.cluster.as_str()).collect();
    assert_eq!(table.cluster_count(), names.len());
    // The first plan of a name wins (as build_plans keeps the first).
    let mut last: HashMap<&str, &ClusterPlan> = HashMap::new();
    for p in plans {
        last.entry(p.cluster.as_str()).or_insert(p);
    }
    for (name, plan) in &last {
        // Hosts at DRAINING_WEIGHT are kept for the stream drain, never picked.
        let pickable: Vec<_> = plan
            .hosts
            .iter()
            .filter(|h| h.weight != DRAINING_WEIGHT)
            .collect();
        let hosts: HashSet<&str> = pickable.iter().map(|h| h.address.as_str()).collect();
        let n = pickable.len();
        for _ in 0..(2 * n + 3).min(200) {
            match table.decide(name) {
                Decision::Pick { host, tier, .. } => {
                    assert!(n > 0);
                    assert_eq!(tier, plan.tier);
                    let parts: Vec<&str> = host.split(',').collect();
                    // One entry per attempt, whatever the tier's size: the
                    // tier cycles, and no retry runs out of entries.
                    assert_eq!(parts.len(), alternates + 1, "{host}");
                    assert!(
                        parts.iter().all(|p| hosts.contains(p)),
                        "{host} not in {hosts:?}"
                    );
                    if hosts.len() == n {
                        // Every host of the tier before any repeats.
                        let first = &parts[..parts.len().min(n)];
                        let distinct: HashSet<&&str> = first.iter().collect();
                        assert_eq!(distinct.len(), first.len(), "{host}");
                        assert!(parts.iter().zip(parts.iter().skip(n)).all(|(a, b)| a == b));
                    }
                }
                Decision::NoServing => assert_eq!(n, 0, "{name}"),
                Decision::Unknown => panic!("{name} unknown"),
            }
        }
    }
    let unknown = "no-such-cluster-\u{1}";
    if !names.contains(unknown) {
        assert_eq!(table.decide(unknown), Decision::Unknown);
    }
}

/// Everything after parsing: join, plans, the snapshot round trip, the table.
pub(crate) fn check_pipeline(
    dump: &EndpointsDump,
    live: Option<&LiveHealth>,
    config: &PluginConfig,
) {
    let joined = join_live_health(dump.clone(), live);
    let plans = build_plans(dump.clone(), live, config);
    check_plans(&joined, &plans, config);
    let bytes = codec::encode(&plans);
    assert_eq!(codec::decode(&bytes).unwrap(), plans);
    check_table(&plans, config.retry_alternates, None);
}

pub(crate) fn fixture_live() -> &'static LiveHealth {
    static LIVE: OnceLock<LiveHealth> = OnceLock::new();
    LIVE.get_or_init(|| parse_clusters(CLUSTERS[0]).unwrap())
}

pub(crate) fn fixture_dump() -> &'static EndpointsDump {
    static DUMP: OnceLock<EndpointsDump> = OnceLock::new();
    DUMP.get_or_init(|| parse_config_dump(DUMPS[0], NS).unwrap())
}

proptest! {
    #[test]
    fn admin_parsers_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_config_dump(&bytes, NS);
        let _ = parse_clusters(&bytes);
    }

    /// Any JSON, also inside the right top-level keys.
    #[test]
    fn admin_parsers_arbitrary_json(v in any_json(), inner in any_json()) {
        for body in [
            v.clone(),
            json!({"configs": [v.clone()]}),
            json!({"configs": [{"static_endpoint_configs": [v.clone()]}]}),
            json!({"configs": [{"dynamic_endpoint_configs": [{"endpoint_config": {"cluster_name": "c", "endpoints": [v.clone()]}}]}]}),
            json!({"configs": [{"endpoint_config": {"cluster_name": "c", "endpoints": [{"lb_endpoints": [inner.clone()]}]}}]}),
            json!({"cluster_statuses": [v.clone()]}),
            json!({"cluster_statuses": [{"name": "c", "host_statuses": [inner.clone()]}]}),
        ] {
            let bytes = serde_json::to_vec(&body).unwrap();
            if let Ok(dump) = parse_config_dump(&bytes, NS) {
                check_pipeline(&dump, None, &PluginConfig::default());
                check_pipeline(&dump, Some(fixture_live()), &PluginConfig::default());
            }
            if let Ok(live) = parse_clusters(&bytes) {
                check_pipeline(fixture_dump(), Some(&live), &PluginConfig::default());
            }
        }
    }

    /// The real fixtures, byte-flipped, truncated, cut and spliced.
    #[test]
    fn admin_parsers_mutated_fixtures(
        which in 0..FIXTURES,
        muts in prop::collection::vec(mutation(), 1..8),
    ) {
        let body = mutate(fixture(which), &muts);
        if let Ok(dump) = parse_config_dump(&body, NS) {
            check_pipeline(&dump, Some(fixture_live()), &PluginConfig::default());
        }
        if let Ok(live) = parse_clusters(&body) {
            check_pipeline(fixture_dump(), Some(&live), &PluginConfig::default());
        }
    }

    /// The real fixtures with nodes replaced by any JSON or removed: valid
    /// JSON of the wrong shape (wrong types, missing keys).
    #[test]
    fn admin_parsers_edited_fixtures(
        which in 0..FIXTURES - 1,
        edits in prop::collection::vec(edit(), 1..5),
    ) {
        // config_dump_include_eds.json (165 KB) is left to the byte mutations.
        let which = if which >= 4 { which + 1 } else { which };
        let original: Value = serde_json::from_slice(fixture(which)).unwrap();
        let body = serde_json::to_vec(&edit_json(original, &edits)).unwrap();
        if let Ok(dump) = parse_config_dump(&body, NS) {
            check_pipeline(&dump, Some(fixture_live()), &PluginConfig::default());
            check_pipeline(&dump, None, &PluginConfig::default());
        }
        if let Ok(live) = parse_clusters(&body) {
            check_pipeline(fixture_dump(), Some(&live), &PluginConfig::default());
        }
    }
}

#[test]
fn unmutated_fixtures_pass_the_pipeline() {
    for dump in DUMPS {
        let dump = parse_config_dump(dump, NS).unwrap();
        for live in CLUSTERS {
            check_pipeline(
                &dump,
                Some(&parse_clusters(live).unwrap()),
                &PluginConfig::default(),
            );
        }
        check_pipeline(&dump, None, &PluginConfig::default());
    }
}

/// Byte mutations of the fixtures do leave some parseable (so the pipeline
/// checks on them run), and node edits even more.
#[test]
fn mutated_fixtures_are_sometimes_still_parseable() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let muts = prop::collection::vec(mutation(), 1..8);
    let edits = prop::collection::vec(edit(), 1..5);
    let (mut bytes_ok, mut edits_ok, mut edits_planned) = (0, 0, 0);
    for i in 0..300 {
        let which = i % FIXTURES;
        let m = muts.new_tree(&mut runner).unwrap().current();
        let body = mutate(fixture(which), &m);
        bytes_ok +=
            usize::from(parse_config_dump(&body, NS).is_ok() || parse_clusters(&body).is_ok());
        let e = edits.new_tree(&mut runner).unwrap().current();
        let original: Value = serde_json::from_slice(fixture(which % 4)).unwrap();
        let body = serde_json::to_vec(&edit_json(original, &e)).unwrap();
        if let Ok(dump) = parse_config_dump(&body, NS) {
            edits_ok += 1;
            let plans = build_plans(dump, Some(fixture_live()), &PluginConfig::default());
            edits_planned += usize::from(plans.iter().any(|p| !p.hosts.is_empty()));
        }
    }
    eprintln!("byte-mutated parseable: {bytes_ok}/300, edited: {edits_ok}/300 ({edits_planned} with hosts)");
    assert!(
        bytes_ok > 10 && edits_ok > 30 && edits_planned > 10,
        "{bytes_ok} {edits_ok} {edits_planned}"
    );
}
