//! Property tests for everything that reads bytes the filter does not
//! control: the plugin configuration, Envoy's admin JSON, and the published
//! snapshot; and for what is built from them (plans, routing table).
//!
//! The number of cases comes from `PROPTEST_CASES` (proptest's default
//! config reads it; 256 without it): `make test` runs a few, `make fuzz` many.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};
use serving_picker_core::contract::{EdsHealth, MetaFlags, Tier};
use serving_picker_core::health::Health;
use serving_picker_core::plan::{ClusterPlan, PlannedHost};
use serving_picker_wasm::admin_json::{
    join_live_health, parse_clusters, parse_config_dump, ClusterHosts, EndpointsDump, HostRecord,
    LiveCluster, LiveHealth, LiveHost,
};
use serving_picker_wasm::codec;
use serving_picker_wasm::config::{
    parse_config, BeforeFirstSnapshot, OnNoServing, PluginConfig, SelectionConfig,
};
use serving_picker_wasm::plans::{build_plans, DRAINING_WEIGHT};
use serving_picker_wasm::table::{Decision, RoutingTable};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

const NS: &str = "k8s.endpointslice";

/// Real Envoy 1.40 output (tests/fixtures/README.md).
const DUMPS: [&[u8]; 5] = [
    include_bytes!("fixtures/config_dump_endpoints_masked.json"),
    include_bytes!("fixtures/config_dump_endpoints_pending_removal.json"),
    include_bytes!("fixtures/config_dump_static_endpoints.json"),
    include_bytes!("fixtures/config_dump_dynamic_endpoints.json"),
    include_bytes!("fixtures/config_dump_include_eds.json"),
];
const CLUSTERS: [&[u8]; 2] = [
    include_bytes!("fixtures/clusters.json"),
    include_bytes!("fixtures/clusters_pending_removal.json"),
];

fn fixture(i: usize) -> &'static [u8] {
    if i < DUMPS.len() {
        DUMPS[i]
    } else {
        CLUSTERS[(i - DUMPS.len()) % CLUSTERS.len()]
    }
}

const FIXTURES: usize = DUMPS.len() + CLUSTERS.len();

// ================================================================ arbitrary JSON

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

// ================================================================ plugin configuration

const KNOWN_KEYS: [&str; 17] = [
    "admin_cluster",
    "admin_path",
    "admin_health_path",
    "admin_stats_path",
    "full_refresh_interval_ms",
    "admin_timeout_ms",
    "max_admin_body_bytes",
    "metadata_namespace",
    "override_header",
    "refresh_interval_ms",
    "on_no_serving",
    "clusters",
    "local_zone",
    "local_zone_min_share",
    "retry_alternates",
    "before_first_snapshot",
    "max_snapshot_age_ms",
];

/// Values of every type, biased to the edges of what the keys accept.
fn config_value() -> impl Strategy<Value = Value> {
    let edge_numbers = [
        0u64,
        8,
        9,
        10,
        99,
        100,
        1000,
        1023,
        1024,
        2000,
        20_000,
        60_000,
        60_001,
        3_600_000,
        3_600_001,
        86_400_000,
        86_400_001,
        1 << 30,
        (1 << 30) + 1,
        u64::MAX,
    ];
    let strings = [
        "reject",
        "passthrough",
        "hold",
        "Reject",
        "",
        " ",
        "\t",
        "/config_dump?include_eds",
        "/clusters?format=json",
        "/a b",
        "/a\u{7}",
        "config_dump",
        "x-pick",
        "/clusters",
        "host",
        "x-envoy-upstream",
        "x_pick.1",
        "X-Pick",
        ":authority",
        "bad header",
        "zone-a",
        "envoy_admin",
        "\u{a0}",
    ];
    prop_oneof![
        3 => any_json(),
        2 => (0u64..5_000_000).prop_map(Value::from),
        2 => select(edge_numbers.to_vec()).prop_map(Value::from),
        1 => (-10i64..0).prop_map(Value::from),
        2 => (-0.5f64..1.5).prop_map(|f| json!(f)),
        1 => select(vec![0.0f64, 1.0, 1e-300, 100.0]).prop_map(|f| json!(f)),
        3 => select(strings.to_vec()).prop_map(|s| json!(s)),
        1 => "[a-z/_:. -]{0,10}".prop_map(Value::String),
        2 => prop::collection::vec(
            prop_oneof![Just(json!("a")), Just(json!("")), Just(json!(1)), "[a-z]{1,5}".prop_map(Value::String)],
            0..3
        )
        .prop_map(Value::Array),
    ]
}

fn config_object() -> impl Strategy<Value = Map<String, Value>> {
    let key = prop_oneof![
        8 => select(KNOWN_KEYS.to_vec()).prop_map(String::from),
        1 => "[a-z_]{1,20}",
    ];
    prop::collection::btree_map(key, config_value(), 0..8)
        .prop_map(|m| m.into_iter().collect::<Map<String, Value>>())
}

fn header_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.!#$%&'*+^`|~".contains(c)
}

fn in_range(v: &Value, min: u64, max: u64) -> bool {
    v.as_u64().is_some_and(|n| (min..=max).contains(&n))
}

fn path_ok(v: &Value, allow_empty: bool) -> bool {
    match v.as_str() {
        Some("") => allow_empty,
        Some(s) => s.starts_with('/') && !s.chars().any(|c| c.is_whitespace() || c.is_control()),
        None => false,
    }
}

fn non_empty(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.trim().is_empty())
}

/// The documented rule for one key's value, independently of parse_config.
fn key_accepts(key: &str, v: &Value) -> bool {
    match key {
        "admin_cluster" | "metadata_namespace" | "local_zone" => non_empty(v),
        "admin_path" => path_ok(v, false),
        "admin_stats_path" => path_ok(v, true),
        // Live health cannot be turned off, and must be JSON.
        "admin_health_path" => {
            path_ok(v, false) && v.as_str().is_some_and(|s| s.contains("format=json"))
        }
        "full_refresh_interval_ms" => in_range(v, 100, 86_400_000),
        "admin_timeout_ms" => in_range(v, 10, 60_000),
        "max_admin_body_bytes" => in_range(v, 1024, 1 << 30),
        "refresh_interval_ms" => in_range(v, 100, 3_600_000),
        "retry_alternates" => in_range(v, 0, 8),
        "max_snapshot_age_ms" => in_range(v, 1000, 86_400_000),
        "override_header" => v.as_str().is_some_and(|s| {
            !s.is_empty()
                && s.chars().all(header_char)
                && !s.starts_with("x-envoy-")
                && ![
                    "host",
                    "content-length",
                    "content-type",
                    "transfer-encoding",
                    "connection",
                    "keep-alive",
                    "proxy-connection",
                    "upgrade",
                    "te",
                    "trailer",
                    "expect",
                    "cookie",
                    "authorization",
                    "x-forwarded-for",
                    "x-request-id",
                ]
                .contains(&s)
        }),
        "on_no_serving" => matches!(v.as_str(), Some("reject" | "passthrough")),
        "before_first_snapshot" => matches!(v.as_str(), Some("hold" | "reject" | "passthrough")),
        "clusters" => v.as_array().is_some_and(|a| {
            !a.is_empty() && a.iter().all(|c| c.as_str().is_some_and(|s| !s.is_empty()))
        }),
        "local_zone_min_share" => v.as_f64().is_some_and(|f| f > 0.0 && f <= 1.0),
        _ => false,
    }
}

fn check_config_fields(c: &PluginConfig, obj: &Map<String, Value>) {
    let d = PluginConfig::default();
    let s = |k: &str, dflt: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .unwrap_or(dflt)
            .to_string()
    };
    let n = |k: &str, dflt: u64| obj.get(k).and_then(Value::as_u64).unwrap_or(dflt);
    assert_eq!(c.admin_cluster, s("admin_cluster", &d.admin_cluster));
    assert_eq!(c.admin_path, s("admin_path", &d.admin_path));
    assert_eq!(
        c.admin_health_path,
        s("admin_health_path", &d.admin_health_path)
    );
    assert_eq!(
        c.selection.metadata_namespace,
        s("metadata_namespace", &d.selection.metadata_namespace)
    );
    assert_eq!(c.override_header, s("override_header", &d.override_header));
    assert_eq!(
        c.admin_stats_path,
        s("admin_stats_path", &d.admin_stats_path)
    );
    // Not given: the default, raised to a longer refresh interval.
    let interval = n("refresh_interval_ms", d.refresh_interval_ms);
    assert_eq!(
        c.full_refresh_interval_ms,
        n(
            "full_refresh_interval_ms",
            d.full_refresh_interval_ms.max(interval)
        )
    );
    assert_eq!(
        c.admin_timeout_ms,
        n("admin_timeout_ms", d.admin_timeout_ms)
    );
    assert_eq!(
        c.refresh_interval_ms,
        n("refresh_interval_ms", d.refresh_interval_ms)
    );
    assert_eq!(
        c.max_admin_body_bytes as u64,
        n("max_admin_body_bytes", d.max_admin_body_bytes as u64)
    );
    assert_eq!(
        c.retry_alternates as u64,
        n("retry_alternates", d.retry_alternates as u64)
    );
    let on = match obj.get("on_no_serving").and_then(Value::as_str) {
        Some("passthrough") => OnNoServing::Passthrough,
        _ => OnNoServing::Reject,
    };
    assert_eq!(c.on_no_serving, on);
    let before = match obj.get("before_first_snapshot").and_then(Value::as_str) {
        Some("reject") => BeforeFirstSnapshot::Reject,
        Some("hold") => BeforeFirstSnapshot::Hold,
        _ => BeforeFirstSnapshot::Passthrough,
    };
    assert_eq!(c.before_first_snapshot, before);
    // Not given: 15 s, or four intervals and the admin timeout if longer.
    let min_age = interval * 4 + c.admin_timeout_ms;
    assert_eq!(
        c.max_snapshot_age_ms,
        n("max_snapshot_age_ms", min_age.max(15_000))
    );
    let clusters = obj.get("clusters").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect::<Vec<_>>()
    });
    assert_eq!(c.clusters, clusters);
    assert_eq!(
        c.selection.local_zone,
        obj.get("local_zone")
            .and_then(Value::as_str)
            .map(String::from)
    );
    let share = obj
        .get("local_zone_min_share")
        .and_then(Value::as_f64)
        .unwrap_or(d.selection.local_zone_min_share);
    assert_eq!(c.selection.local_zone_min_share, share);
}

proptest! {
    /// Arbitrary bytes: a result, never a panic; empty or blank means defaults.
    #[test]
    fn config_arbitrary_bytes(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        match parse_config(&raw) {
            Ok(c) => {
                if raw.iter().all(u8::is_ascii_whitespace) {
                    prop_assert_eq!(c, PluginConfig::default());
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// JSON text that is almost a configuration: a few bytes changed.
    #[test]
    fn config_mutated_text(obj in config_object(), muts in prop::collection::vec(mutation(), 0..4)) {
        let raw = mutate(&serde_json::to_vec(&Value::Object(obj)).unwrap(), &muts);
        let _ = parse_config(&raw);
    }

    /// Objects of known (and unknown) keys with values of every type: Ok
    /// exactly when every key accepts its value, the timeout fits the
    /// interval, a full refresh interval given is not shorter than it and a
    /// snapshot age given covers four intervals and the timeout; otherwise
    /// an error that names the first offending key.
    #[test]
    fn config_objects_ok_or_error_naming_the_key(obj in config_object(), pretty in any::<bool>()) {
        let value = Value::Object(obj.clone());
        let raw = if pretty {
            serde_json::to_vec_pretty(&value).unwrap()
        } else {
            serde_json::to_vec(&value).unwrap()
        };
        let first_bad = obj.iter().find(|(k, v)| !key_accepts(k, v)).map(|(k, _)| k.clone());
        let timeout = obj.get("admin_timeout_ms").and_then(Value::as_u64).unwrap_or(PluginConfig::default().admin_timeout_ms);
        let interval = obj.get("refresh_interval_ms").and_then(Value::as_u64).unwrap_or(PluginConfig::default().refresh_interval_ms);
        let full = obj.get("full_refresh_interval_ms").and_then(Value::as_u64);
        let max_age = obj.get("max_snapshot_age_ms").and_then(Value::as_u64);
        let expected_key = first_bad
            .or_else(|| (timeout > interval.max(1000) * 10).then(|| "admin_timeout_ms".to_string()))
            .or_else(|| full.filter(|f| *f < interval).map(|_| "full_refresh_interval_ms".to_string()))
            .or_else(|| max_age.filter(|a| *a < interval * 4 + timeout).map(|_| "max_snapshot_age_ms".to_string()));
        match (parse_config(&raw), expected_key) {
            (Ok(c), None) => check_config_fields(&c, &obj),
            (Err(e), Some(key)) => {
                prop_assert_eq!(&e.key, &key, "{}", e);
                prop_assert!(obj.contains_key(&e.key));
                prop_assert!(e.to_string().contains(&format!("`{key}`")), "{}", e);
                prop_assert!(!e.reason.is_empty());
            }
            (got, want) => prop_assert!(false, "{:?}: got {:?}, expected error on {:?}", obj, got, want),
        }
    }
}

// ================================================================ byte and value mutations

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    Insert {
        at: usize,
        byte: u8,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Truncate {
        at: usize,
    },
    Duplicate {
        at: usize,
        len: usize,
    },
    /// The next letter (digit) from `at` becomes another letter (digit):
    /// usually still JSON, with a changed key, string or number.
    Alnum {
        at: usize,
        pick: u8,
    },
}

fn json_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => select(b"{}[]\":,-.0123456789eE+tfnul \\/\n".to_vec()),
        1 => any::<u8>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        3 => (at, 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        3 => (at, json_byte()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        2 => (at, json_byte()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        2 => (at, 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        1 => at.prop_map(|at| Mutation::Truncate { at }),
        1 => (at, 1usize..256).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
        6 => (at, any::<u8>()).prop_map(|(at, pick)| Mutation::Alnum { at, pick }),
    ]
}

fn mutate(original: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = original.to_vec();
    for m in muts {
        let pos = |at: usize, b: &Vec<u8>| if b.is_empty() { 0 } else { at % b.len() };
        match *m {
            Mutation::Flip { at, mask } if !b.is_empty() => {
                let i = pos(at, &b);
                b[i] ^= mask;
            }
            Mutation::Set { at, byte } if !b.is_empty() => {
                let i = pos(at, &b);
                b[i] = byte;
            }
            Mutation::Insert { at, byte } => {
                let i = if b.is_empty() { 0 } else { at % (b.len() + 1) };
                b.insert(i, byte);
            }
            Mutation::Delete { at, len } if !b.is_empty() => {
                let i = pos(at, &b);
                let end = (i + len).min(b.len());
                b.drain(i..end);
            }
            Mutation::Truncate { at } => {
                let i = if b.is_empty() { 0 } else { at % b.len() };
                b.truncate(i);
            }
            Mutation::Duplicate { at, len } if !b.is_empty() => {
                let i = pos(at, &b);
                let end = (i + len).min(b.len());
                let piece = b[i..end].to_vec();
                b.splice(i..i, piece);
            }
            Mutation::Alnum { at, pick } if !b.is_empty() => {
                let start = pos(at, &b);
                let found = (0..b.len())
                    .map(|k| (start + k) % b.len())
                    .find(|&k| b[k].is_ascii_alphanumeric());
                if let Some(k) = found {
                    let class: &[u8] = if b[k].is_ascii_digit() {
                        b"0123456789"
                    } else {
                        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    };
                    b[k] = class[usize::from(pick) % class.len()];
                }
            }
            _ => {}
        }
    }
    b
}

/// JSON pointers of every node, depth first.
fn pointers(v: &Value, here: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{here}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                pointers(child, format!("{here}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(here);
}

#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, Value),
    Remove(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), any_json()).prop_map(|(i, v)| Edit::Replace(i, v)),
        1 => any::<usize>().prop_map(Edit::Remove),
    ]
}

/// Replaces or removes random nodes: well-formed JSON with the wrong shape.
fn edit_json(mut v: Value, edits: &[Edit]) -> Value {
    for e in edits {
        let mut all = Vec::new();
        pointers(&v, String::new(), &mut all);
        let pick = |i: usize| all[i % all.len()].clone();
        match e {
            Edit::Replace(i, new) => {
                let p = pick(*i);
                if let Some(node) = v.pointer_mut(&p) {
                    *node = new.clone();
                }
            }
            Edit::Remove(i) => {
                let p = pick(*i);
                let Some(cut) = p.rfind('/') else { continue };
                let (parent, key) = (&p[..cut], &p[cut + 1..]);
                let key = key.replace("~1", "/").replace("~0", "~");
                match v.pointer_mut(parent) {
                    Some(Value::Object(m)) => {
                        m.remove(&key);
                    }
                    Some(Value::Array(a)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            if i < a.len() {
                                a.remove(i);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    v
}

// ================================================================ pipeline invariants

/// The tier rule and everything else a plan must satisfy, from the
/// cluster's joined hosts (KEP-1669: serving and not terminating if any,
/// else serving and terminating, else none; one priority and no zone rule:
/// the hosts' own weights, duplicates merged).
fn expected_plan(c: &ClusterHosts, config: &PluginConfig) -> (Tier, Vec<PlannedHost>) {
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

fn check_plans(joined: &[ClusterHosts], plans: &[ClusterPlan], config: &PluginConfig) {
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
fn table_of(
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
fn check_table(plans: &[ClusterPlan], alternates: usize, previous: Option<RoutingTable>) {
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
fn check_pipeline(dump: &EndpointsDump, live: Option<&LiveHealth>, config: &PluginConfig) {
    let joined = join_live_health(dump.clone(), live);
    let plans = build_plans(dump.clone(), live, config);
    check_plans(&joined, &plans, config);
    let bytes = codec::encode(&plans);
    assert_eq!(codec::decode(&bytes).unwrap(), plans);
    check_table(&plans, config.retry_alternates, None);
}

fn fixture_live() -> &'static LiveHealth {
    static LIVE: OnceLock<LiveHealth> = OnceLock::new();
    LIVE.get_or_init(|| parse_clusters(CLUSTERS[0]).unwrap())
}

fn fixture_dump() -> &'static EndpointsDump {
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

// ================================================================ generated well-formed dumps

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

/// What the generated admin output must parse to.
struct Rendered {
    dump_body: Vec<u8>,
    clusters_body: Vec<u8>,
    /// Dump entries in order: (listed name, hosts with a valid address).
    dump: Vec<(String, Vec<HostRecord>)>,
    skipped: usize,
    odd: usize,
    live: LiveHealth,
    config: PluginConfig,
}

fn socket(address: &str, port: impl Into<Value>) -> Value {
    json!({"socket_address": {"address": address, "port_value": port.into()}})
}

fn expanded_v6(ip: Ipv6Addr) -> String {
    ip.segments()
        .iter()
        .map(|s| format!("{s:04X}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl HostSpec {
    /// The JSON `address` (or none), and the expected `IP:PORT` if valid.
    fn address(&self, index: usize) -> (Option<Value>, Option<String>) {
        let v4 = |high: u16| Ipv4Addr::from((u32::from(high) << 16) | index as u32);
        match &self.addr {
            Addr::V4(high) => {
                let ip = v4(*high);
                (
                    Some(socket(&ip.to_string(), self.port)),
                    Some(format!("{ip}:{}", self.port)),
                )
            }
            Addr::V6(high, expanded) => {
                let ip = Ipv6Addr::from((u128::from(*high) << 64) | index as u128);
                let written = if *expanded {
                    expanded_v6(ip)
                } else {
                    ip.to_string()
                };
                (
                    Some(socket(&written, self.port)),
                    Some(format!("[{ip}]:{}", self.port)),
                )
            }
            Addr::Name(name) => (Some(socket(name, self.port)), None),
            Addr::Port0 => (Some(socket(&v4(1).to_string(), 0)), None),
            Addr::PortAbove(p) => (Some(socket(&v4(1).to_string(), *p)), None),
            Addr::NoPort => (
                Some(json!({"socket_address": {"address": v4(1).to_string()}})),
                None,
            ),
            Addr::Pipe => (Some(json!({"pipe": {"path": "/tmp/x.sock"}})), None),
            Addr::NoAddress | Addr::NoEndpoint => (None, None),
        }
    }
}

/// Expected flags, zone and number of odd values of one namespace value.
fn read_ns(ns: Option<&Value>) -> (MetaFlags, Option<String>, usize) {
    let Some(Value::Object(m)) = ns else {
        let odd = usize::from(!matches!(ns, None | Some(Value::Null)));
        return (MetaFlags::default(), None, odd);
    };
    let mut odd = 0;
    let mut flag = |k: &str| match m.get(k) {
        Some(Value::Bool(b)) => Some(*b),
        None | Some(Value::Null) => None,
        Some(_) => {
            odd += 1;
            None
        }
    };
    let flags = MetaFlags {
        ready: flag("ready"),
        serving: flag("serving"),
        terminating: flag("terminating"),
    };
    let zone = match m.get("zone") {
        None | Some(Value::Null) => None,
        Some(Value::String(z)) if !z.is_empty() => Some(z.clone()),
        Some(_) => {
            odd += 1;
            None
        }
    };
    (flags, zone, odd)
}

fn stats(n: usize) -> Value {
    let names = [
        ("cx_connect_fail", false),
        ("cx_total", false),
        ("rq_error", false),
        ("rq_success", false),
        ("rq_timeout", false),
        ("rq_total", false),
        ("cx_active", true),
        ("rq_active", true),
        ("rq_pending_active", true),
    ];
    Value::Array(
        names
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, (name, gauge))| {
                let mut s = Map::new();
                if *gauge {
                    s.insert("type".into(), json!("GAUGE"));
                }
                s.insert("name".into(), json!(name));
                if i % 2 == 0 {
                    s.insert("value".into(), json!((i * 7).to_string()));
                }
                Value::Object(s)
            })
            .collect(),
    )
}

impl DumpSpec {
    fn names(&self, i: usize) -> (String, String) {
        if self.admin && i == 0 {
            return ("envoy_admin".into(), "envoy_admin".into());
        }
        let name = format!("{}{i}", self.prefix);
        let listed = if self.clusters[i].service {
            format!("{name}/svc")
        } else {
            name.clone()
        };
        (name, listed)
    }

    fn render(&self) -> Rendered {
        let mut statics = Vec::new();
        let mut dynamics = Vec::new();
        let mut expected_static = Vec::new();
        let mut expected_dynamic = Vec::new();
        let mut statuses = Vec::new();
        let mut live = LiveHealth::default();
        let (mut skipped, mut odd) = (0, 0);
        let mut candidates = Vec::new();
        for (ci, c) in self.clusters.iter().enumerate() {
            let (name, listed) = self.names(ci);
            candidates.push(name.clone());
            candidates.push(listed.clone());
            let mut groups = Vec::new();
            let mut records = Vec::new();
            let mut host_statuses = Vec::new();
            let mut live_hosts: HashMap<String, LiveHost, _> = HashMap::default();
            let mut index = 0;
            for g in &c.groups {
                let mut lbs = Vec::new();
                for h in &g.hosts {
                    index += 1;
                    let (address, valid) = h.address(index);
                    let mut lb = Map::new();
                    if !matches!(h.addr, Addr::NoEndpoint) {
                        let mut e = Map::new();
                        if let Some(a) = &address {
                            e.insert("address".into(), a.clone());
                        }
                        e.insert("health_check_config".into(), json!({}));
                        if h.hostname {
                            e.insert("hostname".into(), json!(format!("pod-{index}.example")));
                        }
                        lb.insert("endpoint".into(), Value::Object(e));
                    }
                    if let Some(s) = h.coarse {
                        lb.insert("health_status".into(), json!(s));
                    }
                    if h.meta.is_some() || h.other_ns.is_some() {
                        let mut fm = Map::new();
                        if let Some(m) = &h.meta {
                            fm.insert(NS.into(), m.clone());
                        }
                        if let Some(o) = &h.other_ns {
                            fm.insert("envoy.lb".into(), o.clone());
                        }
                        lb.insert("metadata".into(), json!({ "filter_metadata": fm }));
                    }
                    if let Some(w) = h.weight {
                        lb.insert("load_balancing_weight".into(), json!(w));
                    }
                    lbs.push(Value::Object(lb));
                    let Some(valid) = valid else {
                        skipped += 1;
                        if let (Some(l), Some(a)) = (&h.live, &address) {
                            host_statuses.push(json!({"address": a, "stats": stats(l.stats),
                                "health_status": {"eds_health_status": "HEALTHY"}, "weight": 1}));
                        }
                        continue;
                    };
                    let (flags, zone, odd_here) = read_ns(h.meta.as_ref());
                    odd += odd_here;
                    let weight = h.weight.unwrap_or(1).max(1);
                    records.push(HostRecord {
                        address: valid.clone(),
                        weight,
                        priority: g.priority,
                        flags,
                        zone: zone.or_else(|| g.zone.filter(|z| !z.is_empty()).map(String::from)),
                        topology: Default::default(),
                        health: Health {
                            eds: None,
                            coarse: EdsHealth::from_name(h.coarse),
                            failing: false,
                        },
                    });
                    if let Some(l) = &h.live {
                        let mut flags = Map::new();
                        for (k, on) in [
                            ("failed_active_health_check", l.failed_hc),
                            ("failed_outlier_check", l.outlier),
                            ("active_hc_timeout", l.hc_timeout),
                            ("excluded_via_immediate_hc_fail", l.excluded),
                            ("pending_dynamic_removal", l.pending_removal),
                        ] {
                            if on {
                                flags.insert(k.into(), json!(true));
                            }
                        }
                        if let Some(e) = l.eds {
                            flags.insert("eds_health_status".into(), json!(e));
                        }
                        let mut s = Map::new();
                        // /clusters writes the canonical form.
                        let (ip, port) = valid.rsplit_once(':').unwrap();
                        let ip = ip.trim_start_matches('[').trim_end_matches(']');
                        s.insert("address".into(), socket(ip, port.parse::<u16>().unwrap()));
                        s.insert("stats".into(), stats(l.stats));
                        if !flags.is_empty() || index % 3 != 0 {
                            s.insert("health_status".into(), Value::Object(flags));
                        }
                        s.insert("weight".into(), json!(weight));
                        if g.priority > 0 {
                            s.insert("priority".into(), json!(g.priority));
                        }
                        s.insert("locality".into(), json!({}));
                        host_statuses.push(Value::Object(s));
                        live_hosts.insert(
                            valid,
                            LiveHost {
                                // Pending removal drains (unless EDS refuses it anyway).
                                eds: match EdsHealth::from_name(l.eds) {
                                    EdsHealth::Unhealthy => EdsHealth::Unhealthy,
                                    EdsHealth::Timeout => EdsHealth::Timeout,
                                    _ if l.pending_removal => EdsHealth::Draining,
                                    e => e,
                                },
                                failing: l.failed_hc || l.outlier || l.hc_timeout || l.excluded,
                            },
                        );
                    }
                }
                let mut group = Map::new();
                group.insert(
                    "locality".into(),
                    match g.zone {
                        Some(z) => json!({"region": "r1", "zone": z}),
                        None => json!({}),
                    },
                );
                if !lbs.is_empty() {
                    group.insert("lb_endpoints".into(), Value::Array(lbs));
                }
                group.insert("load_balancing_weight".into(), json!(0));
                if g.priority > 0 {
                    group.insert("priority".into(), json!(g.priority));
                }
                groups.push(Value::Object(group));
            }
            // Hosts only /clusters has (not in the dump: ignored by the join).
            for k in 0..c.extra_live {
                let ip = Ipv4Addr::from(0xC000_0200 | (0x8000 + k as u32));
                host_statuses.push(json!({"address": socket(&ip.to_string(), 80), "stats": stats(3),
                    "health_status": {"eds_health_status": "HEALTHY"}, "weight": 1, "locality": {}}));
                live_hosts.insert(
                    format!("{ip}:80"),
                    LiveHost {
                        eds: EdsHealth::Healthy,
                        failing: false,
                    },
                );
            }
            let mut assignment = Map::new();
            assignment.insert(
                "@type".into(),
                json!("type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"),
            );
            assignment.insert("cluster_name".into(), json!(listed));
            if !groups.is_empty() {
                assignment.insert("endpoints".into(), Value::Array(groups));
            }
            assignment.insert("policy".into(), json!({"overprovisioning_factor": 140}));
            let entry = json!({ "endpoint_config": assignment });
            if c.dynamic {
                dynamics.push(entry);
                expected_dynamic.push((listed.clone(), records));
            } else {
                statics.push(entry);
                expected_static.push((listed.clone(), records));
            }
            // /clusters: the cluster itself, and others on the same EDS service.
            let mut owners = Vec::new();
            if c.in_live {
                let service = if c.service {
                    Some(listed.clone())
                } else if c.empty_service {
                    Some(String::new())
                } else {
                    None
                };
                owners.push((name.clone(), service));
            }
            for k in 0..c.aliases {
                let alias = format!("{name}-alias{k}");
                candidates.push(alias.clone());
                owners.push((alias, Some(listed.clone())));
            }
            for (owner, service) in owners {
                let mut s = Map::new();
                s.insert("name".into(), json!(owner));
                if c.dynamic {
                    s.insert("added_via_api".into(), json!(true));
                }
                if !host_statuses.is_empty() {
                    s.insert("host_statuses".into(), Value::Array(host_statuses.clone()));
                }
                s.insert(
                    "circuit_breakers".into(),
                    json!({"thresholds": [{"max_connections": 1024}]}),
                );
                s.insert("observability_name".into(), json!(owner));
                if let Some(svc) = &service {
                    s.insert("eds_service_name".into(), json!(svc));
                }
                statuses.push(Value::Object(s));
                live.clusters.insert(
                    owner,
                    LiveCluster {
                        eds_service_name: service.filter(|s| !s.is_empty()),
                        hosts: live_hosts.clone(),
                    },
                );
            }
        }
        let mut masked = Map::new();
        masked.insert(
            "@type".into(),
            json!("type.googleapis.com/envoy.admin.v3.EndpointsConfigDump"),
        );
        if !statics.is_empty() {
            masked.insert(
                "static_endpoint_configs".into(),
                Value::Array(statics.clone()),
            );
        }
        if !dynamics.is_empty() {
            masked.insert(
                "dynamic_endpoint_configs".into(),
                Value::Array(dynamics.clone()),
            );
        }
        let configs = match self.shape {
            Shape::Masked => vec![Value::Object(masked)],
            Shape::Full => vec![
                json!({"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
                       "bootstrap": {"node": {"id": "n"}}, "last_updated": "2026-12-02T00:00:00Z"}),
                json!({"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                       "static_clusters": [{"cluster": {"name": "x"}}]}),
                Value::Object(masked),
                json!({"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump"}),
            ],
            Shape::Resource => {
                let typed = |entry: &Value, kind: &str| {
                    let mut e = entry.as_object().unwrap().clone();
                    e.insert(
                        "@type".into(),
                        json!(format!(
                            "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump.{kind}"
                        )),
                    );
                    Value::Object(e)
                };
                statics
                    .iter()
                    .map(|e| typed(e, "StaticEndpointConfig"))
                    .chain(dynamics.iter().map(|e| typed(e, "DynamicEndpointConfig")))
                    .collect()
            }
        };
        let write = |v: &Value| {
            if self.pretty {
                serde_json::to_vec_pretty(v).unwrap()
            } else {
                serde_json::to_vec(v).unwrap()
            }
        };
        let allow = self.allow.map(|mask| {
            let mut list: Vec<String> = candidates
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> (i % 64) & 1 == 1)
                .map(|(_, n)| n.clone())
                .collect();
            list.push("not-in-the-dump".into());
            list
        });
        let config = PluginConfig {
            selection: SelectionConfig {
                local_zone: self.local_zone.map(String::from),
                local_zone_min_share: self.min_share,
                ..SelectionConfig::default()
            },
            clusters: allow,
            retry_alternates: self.alternates,
            ..PluginConfig::default()
        };
        expected_static.extend(expected_dynamic);
        Rendered {
            dump_body: write(&json!({ "configs": configs })),
            clusters_body: write(&json!({ "cluster_statuses": statuses })),
            dump: expected_static,
            skipped,
            odd,
            live,
            config,
        }
    }
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

// ================================================================ snapshot codec

fn tier() -> impl Strategy<Value = Tier> {
    select(vec![
        Tier::Ready,
        Tier::TerminatingFallback,
        Tier::NoServing,
    ])
}

fn any_plans() -> impl Strategy<Value = Vec<ClusterPlan>> {
    let host =
        ("\\PC{0,24}", any::<u32>()).prop_map(|(address, weight)| PlannedHost { address, weight });
    let plan = ("\\PC{0,20}", tier(), prop::collection::vec(host, 0..12)).prop_map(
        |(cluster, tier, hosts)| ClusterPlan {
            cluster,
            tier,
            topology: Default::default(),
            hosts,
        },
    );
    prop::collection::vec(plan, 0..8)
}

proptest! {
    #[test]
    fn codec_round_trip(plans in any_plans()) {
        let bytes = codec::encode(&plans);
        prop_assert_eq!(codec::decode(&bytes).unwrap(), plans);
        // Every strict prefix is an error, never a panic.
        for cut in [0, bytes.len() / 3, bytes.len() / 2, bytes.len().saturating_sub(1)] {
            if cut < bytes.len() {
                prop_assert!(codec::decode(&bytes[..cut]).is_err());
            }
        }
    }

    /// Names past the 16-bit length are cut at a char boundary, not corrupted.
    #[test]
    fn codec_cuts_long_names(extra in 0usize..12, tail in "[aé😀]{1,8}") {
        let name = "a".repeat(65_530 + extra) + &tail;
        let plans = vec![ClusterPlan {
            cluster: name.clone(),
            tier: Tier::Ready,
            topology: Default::default(),
            hosts: vec![PlannedHost { address: name.clone(), weight: 7 }],
        }];
        let back = codec::decode(&codec::encode(&plans)).unwrap();
        let cut = &back[0].cluster;
        prop_assert!(cut.len() <= usize::from(u16::MAX));
        prop_assert!(name.starts_with(cut.as_str()));
        if name.len() <= usize::from(u16::MAX) {
            prop_assert_eq!(cut, &name);
        } else {
            prop_assert!(usize::from(u16::MAX) - cut.len() < 4, "{}", cut.len());
        }
        prop_assert_eq!(&back[0].hosts[0].address, cut);
        prop_assert_eq!(back[0].hosts[0].weight, 7);
    }

    /// Arbitrary bytes (also behind a valid magic) never panic, and whatever
    /// decodes re-encodes to the same bytes (the encoding is canonical).
    #[test]
    fn codec_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256), magic in any::<bool>()) {
        let bytes = if magic { [b"SPK1".as_slice(), &bytes].concat() } else { bytes };
        if let Ok(plans) = codec::decode(&bytes) {
            prop_assert_eq!(codec::encode(&plans), bytes);
        }
    }

    #[test]
    fn codec_mutated_snapshots(plans in any_plans(), muts in prop::collection::vec(mutation(), 1..4)) {
        let bytes = mutate(&codec::encode(&plans), &muts);
        if let Ok(plans) = codec::decode(&bytes) {
            prop_assert_eq!(codec::encode(&plans), bytes);
        }
    }
}

// ================================================================ routing table

/// Plans with distinct `IP:PORT` hosts, as build_plans makes them (any
/// weights, tiers and names, names possibly repeated).
fn table_plans() -> impl Strategy<Value = Vec<ClusterPlan>> {
    let plan = (
        prop_oneof![3 => "[a-z]{1,3}", 1 => "\\PC{0,10}"],
        tier(),
        prop::collection::vec(
            prop_oneof![4 => Just(1u32), 2 => 0u32..10, 1 => any::<u32>()],
            0..40,
        ),
        1u16..=u16::MAX,
    )
        .prop_map(|(cluster, tier, weights, port)| ClusterPlan {
            cluster,
            tier,
            topology: Default::default(),
            hosts: weights
                .into_iter()
                .enumerate()
                .map(|(i, weight)| PlannedHost {
                    address: format!("10.0.{}.{}:{port}", i / 256, i % 256),
                    weight,
                })
                .collect(),
        });
    prop::collection::vec(plan, 0..6)
}

proptest! {
    #[test]
    fn decide_returns_a_host_of_the_plan(
        plans in table_plans(),
        before in table_plans(),
        warm in 0usize..50,
        alternates in 0usize..=8,
    ) {
        check_table(&plans, alternates, None);
        // An update of a previous table (any state, some clusters equal,
        // some changed, some gone) names the same hosts.
        let previous = table_of(&before, alternates, None);
        for p in &before {
            for _ in 0..warm {
                let _ = previous.decide(&p.cluster);
            }
        }
        check_table(&plans, alternates, Some(previous));
    }

    /// Equal weights: exact round robin, every host equally often.
    #[test]
    fn equal_weights_are_round_robin(n in 1usize..50, weight in any::<u32>(), rounds in 1usize..4) {
        let plan = ClusterPlan {
            cluster: "c".into(),
            tier: Tier::Ready,
            topology: Default::default(),
            hosts: (0..n)
                .map(|i| PlannedHost { address: format!("10.0.0.{i}:80"), weight })
                .collect(),
        };
        let table = table_of(&[plan], 0, None);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for _ in 0..n * rounds {
            match table.decide("c") {
                Decision::Pick { host, .. } => *counts.entry(host.to_string()).or_default() += 1,
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert_eq!(counts.len(), n);
        prop_assert!(counts.values().all(|c| *c == rounds));
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
