//! Configuration every form shares: the keys that shape the choice of hosts
//! (same names, same meanings in the wasm filter and the native policy) and
//! the checks every key goes through. Each form parses its JSON once, at
//! configuration time, into a typed struct; errors name the key.

use crate::config_keys::{LOCAL_NODE, LOCAL_ZONE, LOCAL_ZONE_MIN_SHARE, METADATA_NAMESPACE};
use crate::plan::ZonePreference;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, Error as _, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// A configuration error that names the offending key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The key as the configuration spells it; empty for the document as a
    /// whole (not an object, not JSON).
    pub key: String,
    /// What is wrong with its value.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "plugin configuration: {}", self.reason)
        } else {
            write!(
                f,
                "plugin configuration key `{}`: {}",
                self.key, self.reason
            )
        }
    }
}

/// A `ConfigError` for `key`.
pub fn err(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        reason: reason.into(),
    }
}

/// `value` read as a `T`; a type mismatch names `key`.
pub fn typed<T: DeserializeOwned>(key: &str, value: Value) -> Result<T, ConfigError> {
    serde_json::from_value(value).map_err(|e| err(key, e.to_string()))
}

/// `value` as a string with something besides spaces in it.
pub fn non_empty(key: &str, value: Value) -> Result<String, ConfigError> {
    let s: String = typed(key, value)?;
    if s.trim().is_empty() {
        return Err(err(key, "must not be empty"));
    }
    Ok(s)
}

/// `value` as an integer within `min..=max`.
pub fn bounded_u64(key: &str, value: Value, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n: u64 = typed(key, value)?;
    if n < min || n > max {
        return Err(err(key, format!("{n} is outside {min}..={max}")));
    }
    Ok(n)
}

/// A top-level object whose keys are each given once: JSON parsers keep the
/// last of a repeated key (serde_json, Envoy's), so a repeat is a mistake the
/// user would not see. The visitor stops at the first repeat and leaves its
/// key in `repeated`, where [`json_object`] reads it.
struct UniqueKeys<'a> {
    repeated: &'a mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let error = A::Error::custom(format_args!("duplicate key `{key}`"));
                *self.repeated = Some(key);
                return Err(error);
            }
            let value = map.next_value()?;
            out.insert(key, value);
        }
        Ok(out)
    }
}

/// The configuration's JSON object; `None` for empty or whitespace-only
/// input (no configuration at all: every default). A key given twice is an
/// error naming it.
pub fn json_object(raw: &[u8]) -> Result<Option<Map<String, Value>>, ConfigError> {
    if raw.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    let mut repeated = None;
    let mut de = serde_json::Deserializer::from_slice(raw);
    let parsed = UniqueKeys {
        repeated: &mut repeated,
    }
    .deserialize(&mut de)
    .and_then(|map| de.end().map(|()| map));
    match (parsed, repeated) {
        (Ok(map), _) => Ok(Some(map)),
        (Err(_), Some(key)) => Err(err(&key, "given more than once")),
        // Not an object: say what it is.
        (Err(_), None) => match serde_json::from_slice::<Value>(raw) {
            Ok(other) => Err(err("", format!("must be a JSON object, got {other}"))),
            Err(e) => Err(err("", format!("not valid JSON: {e}"))),
        },
    }
}

/// `local_zone_min_share` when not given: the local zone is preferred
/// while it holds at least this share of the tier's weight.
pub const DEFAULT_LOCAL_ZONE_MIN_SHARE: f64 = 0.2;

/// The keys that decide which hosts a request may go to, in every form.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectionConfig {
    /// filter_metadata namespace of the conditions.
    pub metadata_namespace: String,
    /// This Envoy's zone: for zone hints, and to prefer its hosts inside the
    /// chosen tier when no hints are in play.
    pub local_zone: Option<String>,
    /// This Envoy's Kubernetes node name, for node hints.
    pub local_node: Option<String>,
    /// ... when they hold at least this share of the tier's weight.
    pub local_zone_min_share: f64,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        SelectionConfig {
            metadata_namespace: crate::contract::DEFAULT_NAMESPACE.into(),
            local_zone: None,
            local_node: None,
            local_zone_min_share: DEFAULT_LOCAL_ZONE_MIN_SHARE,
        }
    }
}

impl SelectionConfig {
    /// The shared keys; every other key is the form's own (or unknown).
    pub const KEYS: [&'static str; 4] = [
        METADATA_NAMESPACE.name(),
        LOCAL_ZONE.name(),
        LOCAL_NODE.name(),
        LOCAL_ZONE_MIN_SHARE.name(),
    ];

    /// Sets one of the shared `KEYS`, read by the registry's validator
    /// ([`crate::config_keys`]); any other key is refused as unknown.
    pub fn set(&mut self, key: &str, value: Value) -> Result<(), ConfigError> {
        match key {
            k if k == METADATA_NAMESPACE.name() => {
                self.metadata_namespace = METADATA_NAMESPACE.read(value)?
            }
            k if k == LOCAL_ZONE.name() => self.local_zone = Some(LOCAL_ZONE.read(value)?),
            k if k == LOCAL_NODE.name() => self.local_node = Some(LOCAL_NODE.read(value)?),
            k if k == LOCAL_ZONE_MIN_SHARE.name() => {
                self.local_zone_min_share = LOCAL_ZONE_MIN_SHARE.read(value)?
            }
            _ => return Err(err(key, "unknown key")),
        }
        Ok(())
    }

    /// The zone rule for the planner, when a local zone is configured.
    pub fn zone_preference(&self) -> Option<ZonePreference> {
        self.local_zone.as_ref().map(|z| ZonePreference {
            local_zone: z.clone(),
            min_share: self.local_zone_min_share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn take(key: &str, value: Value) -> Result<SelectionConfig, ConfigError> {
        let mut c = SelectionConfig::default();
        c.set(key, value).map(|()| c)
    }

    #[test]
    fn shared_keys_parse() {
        let c = take("local_zone", json!("z1")).unwrap();
        assert_eq!(c.local_zone.as_deref(), Some("z1"));
        let pref = c.zone_preference().unwrap();
        assert_eq!((pref.local_zone.as_str(), pref.min_share), ("z1", 0.2));
        let c = take("metadata_namespace", json!("ns")).unwrap();
        assert_eq!(c.metadata_namespace, "ns");
        assert_eq!(c.zone_preference(), None);
        let c = take("local_node", json!("node-1")).unwrap();
        assert_eq!(c.local_node.as_deref(), Some("node-1"));
        let c = take("local_zone_min_share", json!(1.0)).unwrap();
        assert_eq!(c.local_zone_min_share, 1.0);
    }

    #[test]
    fn bad_values_and_other_keys_name_the_key() {
        for (key, value) in [
            ("local_zone", json!("")),
            ("local_zone", json!(3)),
            ("local_node", json!("  ")),
            ("local_node", json!(false)),
            ("metadata_namespace", json!(null)),
            ("local_zone_min_share", json!(0)),
            ("local_zone_min_share", json!(1.5)),
            ("local_zone_min_share", json!("0.5")),
        ] {
            assert_eq!(take(key, value).unwrap_err().key, key);
        }
        assert_eq!(
            take("clusters", json!([])).unwrap_err().reason,
            "unknown key"
        );
        assert!(SelectionConfig::KEYS
            .iter()
            .all(|k| take(k, json!("")).is_err()));
    }

    #[test]
    fn a_key_given_twice_is_named() {
        let e = json_object(br#"{"local_zone":"a","x":1,"local_zone":"b"}"#).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.as_str()),
            ("local_zone", "given more than once")
        );
        // Nested objects are the keys' own business; distinct keys pass.
        let ok = json_object(br#"{"a":{"b":1,"b":2},"c":[{"d":1}]}"#)
            .unwrap()
            .unwrap();
        assert_eq!(ok.len(), 2);
        // Bad JSON after a repeat is still reported as the repeat (first error).
        assert_eq!(json_object(br#"{"k":1,"k":2"#).unwrap_err().key, "k");
    }

    #[test]
    fn json_object_only() {
        assert_eq!(json_object(b"  \n"), Ok(None));
        assert!(json_object(b"{}").unwrap().unwrap().is_empty());
        assert!(json_object(b"[]")
            .unwrap_err()
            .reason
            .contains("JSON object"));
        assert!(json_object(b"{")
            .unwrap_err()
            .reason
            .contains("not valid JSON"));
    }
}
