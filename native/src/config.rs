//! The policy configuration: the JSON in `lb_policy_config` (a
//! `google.protobuf.StringValue`), parsed once in config_new.
//!
//! The native policy takes the keys that shape the choice of hosts, shared
//! with the wasm filter (same names, same meanings): `metadata_namespace`,
//! `local_zone`, `local_zone_min_share`. The wasm filter's own keys (admin
//! polling, the override header, passthrough) have no meaning here and are
//! refused with a message that says so; any other key is refused as unknown.
//! `drain_window_ms` (shared with the wasm filter too) turns on the stream
//! drain of the module's HTTP filter for the cluster (`drain`).

use serving_picker_core::config::{err, json_object, ConfigError, SelectionConfig};
use serving_picker_core::drain::{DrainConfig, DRAIN_WINDOW_KEY};

/// The one `lb_policy_name` this module serves.
pub const POLICY_NAME: &str = "serving_picker";

/// Keys of the wasm filter that do not apply to the native policy.
pub const WASM_ONLY_KEYS: [&str; 15] = [
    "admin_cluster",
    "admin_path",
    "admin_health_path",
    "admin_stats_path",
    "admin_timeout_ms",
    "before_first_snapshot",
    "clusters",
    "full_refresh_interval_ms",
    "max_admin_body_bytes",
    "max_snapshot_age_ms",
    "on_no_serving",
    "override_header",
    "partial_refresh",
    "refresh_interval_ms",
    "retry_alternates",
];

/// The policy's configuration, parsed from `lb_policy_config`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NativeConfig {
    /// The keys shared with the wasm filter (`metadata_namespace`, `local_zone`, `local_node`,
    /// `local_zone_min_share`).
    pub selection: SelectionConfig,
    /// `drain_window_ms`: streams on this cluster's draining hosts end within the window
    /// (`None`: the cluster's streams are never ended early).
    pub drain: Option<DrainConfig>,
}

/// Parses the policy configuration; empty means every default.
pub fn parse(raw: &[u8]) -> Result<NativeConfig, ConfigError> {
    let mut config = NativeConfig::default();
    let Some(map) = json_object(raw)? else {
        return Ok(config);
    };
    for (key, value) in map {
        if SelectionConfig::KEYS.contains(&key.as_str()) {
            config.selection.set(&key, value)?;
        } else if key == DRAIN_WINDOW_KEY {
            config.drain = Some(DrainConfig::parse(value)?);
        } else if WASM_ONLY_KEYS.contains(&key.as_str()) {
            return Err(err(
                &key,
                "applies to the wasm filter only, not to the native load-balancing policy",
            ));
        } else {
            return Err(err(
                &key,
                format!(
                    "unknown key (the native policy takes {}, {DRAIN_WINDOW_KEY})",
                    SelectionConfig::KEYS.join(", ")
                ),
            ));
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_all_defaults() {
        for raw in ["", "  ", "{}"] {
            assert_eq!(parse(raw.as_bytes()).unwrap(), NativeConfig::default());
        }
        let d = parse(b"").unwrap().selection;
        assert_eq!(d.metadata_namespace, "k8s.endpointslice");
        assert_eq!(d.local_zone, None);
    }

    #[test]
    fn shared_keys() {
        let c = parse(
            br#"{"metadata_namespace": "ns", "local_zone": "z1", "local_zone_min_share": 0.5}"#,
        )
        .unwrap()
        .selection;
        assert_eq!(c.metadata_namespace, "ns");
        assert_eq!(c.local_zone.as_deref(), Some("z1"));
        assert_eq!(c.local_zone_min_share, 0.5);
    }

    #[test]
    fn the_drain_window_is_opt_in() {
        assert_eq!(parse(b"{}").unwrap().drain, None);
        let c = parse(br#"{"drain_window_ms": 15000}"#).unwrap();
        assert_eq!(c.drain, Some(DrainConfig { window_ms: 15_000 }));
    }

    #[test]
    fn the_wasm_filters_snapshot_keys_are_named_as_wasm_only() {
        for key in ["before_first_snapshot", "max_snapshot_age_ms"] {
            let e = parse(format!(r#"{{"{key}": 1}}"#).as_bytes()).unwrap_err();
            assert_eq!(e.key, key);
            assert!(e.reason.contains("wasm filter only"), "{e}");
        }
    }

    #[test]
    fn refusals_name_the_key() {
        for (raw, key, says) in [
            (
                r#"{"local_zone_min_share": 2}"#,
                "local_zone_min_share",
                "outside",
            ),
            (r#"{"local_zone": ""}"#, "local_zone", "empty"),
            (
                r#"{"metadata_namespace": 7}"#,
                "metadata_namespace",
                "invalid type",
            ),
            (
                r#"{"refresh_interval_ms": 100}"#,
                "refresh_interval_ms",
                "wasm filter only",
            ),
            (
                r#"{"on_no_serving": "reject"}"#,
                "on_no_serving",
                "wasm filter only",
            ),
            (r#"{"bogus": 1}"#, "bogus", "unknown key"),
        ] {
            let e = parse(raw.as_bytes()).unwrap_err();
            assert_eq!(e.key, key, "{raw}");
            assert!(e.reason.contains(says), "{raw}: {e}");
            assert!(e.to_string().contains(key));
        }
        for (raw, says) in [
            (r#"{"drain_window_ms": 10}"#, ""),
            (r#"{"drain_window_ms": "15s"}"#, ""),
        ] {
            let e = parse(raw.as_bytes()).unwrap_err();
            assert_eq!(e.key, "drain_window_ms", "{raw}");
            assert!(e.reason.contains(says));
        }
        assert!(parse(b"[1]").unwrap_err().reason.contains("JSON object"));
        assert!(parse(b"{").unwrap_err().reason.contains("not valid JSON"));
    }
}
