//! The policy configuration: the JSON in `lb_policy_config` (a
//! `google.protobuf.StringValue`), parsed once in config_new.
//!
//! The native policy takes the keys that shape the choice of hosts, shared
//! with the wasm filter (same names, same meanings): `metadata_namespace`,
//! `local_zone`, `local_node`, `local_zone_min_share`. The wasm filter's own
//! keys (admin polling, the override header, passthrough) have no meaning
//! here and are refused with a message that says so; any other key is refused
//! as unknown. Which key is which form's is the core's registry
//! (`serving_picker_core::config_keys`).
//! `drain_window_ms` (shared with the wasm filter too) turns on the stream
//! drain of the module's HTTP filter for the cluster (`drain`).

use serving_picker_core::config::{err, json_object, ConfigError, SelectionConfig};
use serving_picker_core::config_keys::{self as keys, Form, KeyId};
use serving_picker_core::drain::DrainConfig;

/// The one `lb_policy_name` this module serves.
pub const POLICY_NAME: &str = "serving_picker";

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
        // The registry (`serving_picker_core::config_keys`) says which keys this form takes.
        let info = keys::find(&key).filter(|k| k.forms.take(Form::Native));
        match info.map(|k| k.id) {
            Some(KeyId::DrainWindowMs) => config.drain = Some(keys::DRAIN_WINDOW_MS.read(value)?),
            Some(_) => config.selection.set(&key, value)?,
            None if keys::find(&key).is_some() => {
                return Err(err(
                    &key,
                    "applies to the wasm filter only, not to the native load-balancing policy",
                ))
            }
            None => {
                let taken: Vec<_> = keys::names_for(Form::Native).collect();
                return Err(err(
                    &key,
                    format!("unknown key (the native policy takes {})", taken.join(", ")),
                ));
            }
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
    fn the_registry_decides_which_keys_are_taken() {
        for key in keys::ALL {
            let raw = format!(r#"{{"{}": {}}}"#, key.name, key.example);
            let parsed = parse(raw.as_bytes());
            if key.forms.take(Form::Native) {
                assert!(parsed.is_ok(), "{raw}: {parsed:?}");
            } else {
                let e = parsed.unwrap_err();
                assert_eq!(e.key, key.name);
                assert_eq!(
                    e.reason,
                    "applies to the wasm filter only, not to the native load-balancing policy"
                );
            }
        }
        let e = parse(br#"{"bogus": 1}"#).unwrap_err();
        assert_eq!(
            e.reason,
            "unknown key (the native policy takes metadata_namespace, local_zone, local_node, \
             local_zone_min_share, drain_window_ms)"
        );
    }

    #[test]
    fn a_key_given_twice_is_refused_by_name() {
        for (raw, key) in [
            (r#"{"local_zone": "a", "local_zone": "b"}"#, "local_zone"),
            (
                r#"{"drain_window_ms": 15000, "local_node": "n", "drain_window_ms": 20000}"#,
                "drain_window_ms",
            ),
            (r#"{"clusters": ["a"], "clusters": ["a"]}"#, "clusters"),
        ] {
            let e = parse(raw.as_bytes()).unwrap_err();
            assert_eq!(
                (e.key.as_str(), e.reason.as_str()),
                (key, "given more than once")
            );
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
