//! Reading a host's metadata namespace: the contract's keys (`contract`)
//! from JSON, values of the wrong type read as absent and reported.

use crate::contract::{key, MetaFlags};
use crate::de::Field;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// One metadata value that had to be ignored, for a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OddValue {
    pub key: &'static str,
    pub found: String,
}

/// A host's topology keys (`node_name`, `hints_zones`, `hints_nodes`), as
/// the EndpointSlice has them: the hint keys are comma-separated names, and
/// an empty string (or an absent key) is no hint.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TopologyMeta {
    pub node_name: String,
    pub hints_zones: String,
    pub hints_nodes: String,
}

/// Whether a hint list names anything (commas alone do not).
pub fn has_hints(list: &str) -> bool {
    list.bytes().any(|b| b != b',')
}

/// Whether a hint list names `name` (never the empty name). Names are
/// Kubernetes zone and node names, which hold no commas nor spaces.
pub fn hinted(list: &str, name: &str) -> bool {
    let name = name.as_bytes();
    !name.is_empty() && list.as_bytes().split(|b| *b == b',').any(|n| n == name)
}

/// A host's metadata: condition flags, zone, topology, and the values that were ignored.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct MetaReading {
    pub flags: MetaFlags,
    pub zone: Option<String>,
    pub topology: TopologyMeta,
    pub odd: Vec<OddValue>,
}

fn describe(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 40 {
        format!("{}...", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

/// A metadata value as far as the reading needs it: `null` is absent, and
/// only odd values (to be described in a note) are built into a `Value`.
enum Slot<'de> {
    Absent,
    Bool(bool),
    Str(Cow<'de, str>),
    Other(Value),
    /// The namespace's object, already read.
    Namespace(MetaReading),
}

impl Slot<'_> {
    fn odd(self, key: &'static str, odd: &mut Vec<OddValue>) {
        let value = match self {
            // A key's value is never `Namespace`: nested objects are `Other`.
            Slot::Absent | Slot::Namespace(_) => return,
            Slot::Bool(b) => Value::Bool(b),
            Slot::Str(s) => Value::String(s.into_owned()),
            Slot::Other(v) => v,
        };
        odd.push(OddValue {
            key,
            found: describe(&value),
        });
    }

    /// A string key where empty is absent: anything but a string is odd.
    fn text(self, key: &'static str, odd: &mut Vec<OddValue>) -> String {
        match self {
            Slot::Str(s) => s.into_owned(),
            other => {
                other.odd(key, odd);
                String::new()
            }
        }
    }

    fn flag(self, key: &'static str, odd: &mut Vec<OddValue>) -> Option<bool> {
        match self {
            Slot::Bool(b) => Some(b),
            other => {
                other.odd(key, odd);
                None
            }
        }
    }
}

/// Reads one value into a `Slot`; objects are read as the namespace only
/// when `namespace` (a nested object is just an odd value).
struct SlotVisitor {
    namespace: bool,
}

impl<'de> DeserializeSeed<'de> for SlotVisitor {
    type Value = Slot<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Slot<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SlotVisitor {
    type Value = Slot<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Slot<'de>, E> {
        Ok(Slot::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Slot<'de>, E> {
        Ok(Slot::Other(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Slot<'de>, E> {
        Ok(Slot::Other(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Slot<'de>, E> {
        // As serde_json's own Value does.
        Ok(Slot::Other(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Slot<'de>, E> {
        Ok(Slot::Str(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Slot<'de>, E> {
        Ok(Slot::Str(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Slot<'de>, E> {
        Ok(Slot::Str(Cow::Owned(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Slot<'de>, E> {
        Ok(Slot::Absent)
    }

    fn visit_none<E: de::Error>(self) -> Result<Slot<'de>, E> {
        Ok(Slot::Absent)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Slot<'de>, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Slot<'de>, A::Error> {
        Value::deserialize(SeqAccessDeserializer::new(seq)).map(Slot::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Slot<'de>, A::Error> {
        if !self.namespace {
            return Value::deserialize(MapAccessDeserializer::new(map)).map(Slot::Other);
        }
        // Later keys win, as in a JSON object read whole.
        let mut slots = [
            Slot::Absent,
            Slot::Absent,
            Slot::Absent,
            Slot::Absent,
            Slot::Absent,
            Slot::Absent,
            Slot::Absent,
        ];
        while let Some(key) = map.next_key_seed(Field(&key::ALL))? {
            match key.and_then(|i| slots.get_mut(i)) {
                Some(slot) => *slot = map.next_value_seed(SlotVisitor { namespace: false })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let [ready, serving, terminating, zone, node_name, hints_zones, hints_nodes] = slots;
        let mut reading = MetaReading::default();
        reading.flags = MetaFlags {
            ready: ready.flag(key::READY, &mut reading.odd),
            serving: serving.flag(key::SERVING, &mut reading.odd),
            terminating: terminating.flag(key::TERMINATING, &mut reading.odd),
        };
        reading.zone = match zone {
            Slot::Str(z) if !z.is_empty() => Some(z.into_owned()),
            other => {
                other.odd(key::ZONE, &mut reading.odd);
                None
            }
        };
        reading.topology = TopologyMeta {
            node_name: node_name.text(key::NODE_NAME, &mut reading.odd),
            hints_zones: hints_zones.text(key::HINTS_ZONES, &mut reading.odd),
            hints_nodes: hints_nodes.text(key::HINTS_NODES, &mut reading.odd),
        };
        Ok(Slot::Namespace(reading))
    }
}

/// Reads the namespace's metadata value straight from the JSON (no `Value`
/// is built unless a value is odd): what `read_metadata` reads from a `Value`.
pub struct NamespaceSeed;

impl<'de> DeserializeSeed<'de> for NamespaceSeed {
    type Value = MetaReading;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<MetaReading, D::Error> {
        let mut reading = MetaReading::default();
        match (SlotVisitor { namespace: true }).deserialize(d)? {
            Slot::Namespace(r) => reading = r,
            other => other.odd("(namespace)", &mut reading.odd),
        }
        Ok(reading)
    }
}

/// Reads the namespace's metadata object; values of the wrong type read as absent.
pub fn read_metadata(namespace: Option<&Value>) -> MetaReading {
    // Reading a `Value` cannot fail: the default is never used.
    namespace
        .and_then(|v| NamespaceSeed.deserialize(v).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Conditions;
    use crate::health::{effective, Health};
    use serde_json::json;

    #[test]
    fn odd_types_are_absent_and_reported() {
        let r = read_metadata(Some(
            &json!({"serving": "yes", "terminating": 1, "ready": [true], "zone": 7}),
        ));
        assert_eq!(r.flags, MetaFlags::default());
        assert_eq!(effective(&r.flags, &Health::UNKNOWN), Conditions::READY);
        assert_eq!(r.zone, None);
        let keys: Vec<_> = r.odd.iter().map(|o| o.key).collect();
        assert_eq!(keys, ["ready", "serving", "terminating", "zone"]);
        assert_eq!(r.odd[1].found, "\"yes\"");
        let long = read_metadata(Some(&json!({"serving": "x".repeat(500)})));
        assert!(long.odd[0].found.len() < 50);
    }

    #[test]
    fn topology_keys() {
        let r = read_metadata(Some(&json!({
            "node_name": "node-1", "hints_zones": "zone-a,zone-b", "hints_nodes": ""
        })));
        assert_eq!(
            r.topology,
            TopologyMeta {
                node_name: "node-1".into(),
                hints_zones: "zone-a,zone-b".into(),
                hints_nodes: String::new(),
            }
        );
        assert!(r.odd.is_empty());
        assert!(hinted(&r.topology.hints_zones, "zone-b"));
        assert!(!hinted(&r.topology.hints_zones, "zone"));
        assert!(!has_hints(&r.topology.hints_nodes));
        assert!(!has_hints(",,") && has_hints(",a,") && hinted(",a,", "a"));
        assert!(!hinted(",", ""));
        let bad = read_metadata(Some(
            &json!({"node_name": 1, "hints_zones": ["zone-a"], "hints_nodes": null}),
        ));
        assert_eq!(bad.topology, TopologyMeta::default());
        let keys: Vec<_> = bad.odd.iter().map(|o| o.key).collect();
        assert_eq!(keys, ["node_name", "hints_zones"]);
    }

    #[test]
    fn reading_from_json_text_is_reading_from_a_value() {
        for text in [
            r#"{"ready": true, "serving": false, "terminating": null, "zone": "z1"}"#,
            r#"{"serving": "yes", "terminating": 1, "ready": [true, {"b": 1, "a": 2}], "zone": 7}"#,
            r#"{"serving": "yes", "serving": true, "zone": "a", "zone": null}"#,
            r#"{"serving": true, "serving": "yes", "zone": "", "x": {"y": [1]}}"#,
            r#"{"re\u0061dy": false, "zone": "z\"\u00e9", "ready": 1.5e300, "Ready": true}"#,
            r#"{"serving": {"a": 1}, "terminating": -3, "zone": false}"#,
            r#"{"hints_zones": "a,b", "hints_nodes": 3, "node_name": "n", "hints_zones": ""}"#,
            r#"[1, 2]"#,
            r#""serving""#,
            r#"null"#,
            r#"true"#,
            r#"{}"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            let mut de = serde_json::Deserializer::from_str(text);
            let streamed = NamespaceSeed.deserialize(&mut de).unwrap();
            assert_eq!(streamed, read_metadata(Some(&value)), "{text}");
        }
    }
}
