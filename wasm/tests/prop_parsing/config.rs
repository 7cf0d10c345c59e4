//! The plugin configuration: arbitrary bytes, mutated text and generated
//! objects are parsed, or refused with an error naming the key.

use crate::common::*;
use crate::mutations::*;
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};
use serving_picker_wasm::config::{parse_config, BeforeFirstSnapshot, OnNoServing, PluginConfig};

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
