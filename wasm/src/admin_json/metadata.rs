//! Reading a host's metadata namespace from the admin API's JSON: the
//! contract's keys (`serving_picker_core::contract`), values of the wrong
//! type read as absent and reported.

use super::de::Field;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use serving_picker_core::contract::{key, MetaFlags};
use serving_picker_core::topology::TopologyMeta;
use std::borrow::Cow;
use std::fmt;

/// One metadata value that had to be ignored, for a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OddValue {
    pub key: &'static str,
    pub found: String,
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

/// Reads the namespace's metadata object; values of the wrong type read as
/// absent. What the tests compare `NamespaceSeed`'s streaming reading with.
#[cfg(test)]
pub fn read_metadata(namespace: Option<&Value>) -> MetaReading {
    // Reading a `Value` cannot fail: the default is never used.
    namespace
        .and_then(|v| NamespaceSeed.deserialize(v).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serving_picker_core::contract::{Conditions, EdsHealth};
    use serving_picker_core::health::{effective, Health};
    use serving_picker_core::topology::hinted;

    fn live(eds: EdsHealth) -> Health {
        Health {
            eds: Some(eds),
            coarse: EdsHealth::Healthy,
            failing: false,
        }
    }

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
        let bad = read_metadata(Some(
            &json!({"node_name": 1, "hints_zones": ["zone-a"], "hints_nodes": null}),
        ));
        assert_eq!(bad.topology, TopologyMeta::default());
        let keys: Vec<_> = bad.odd.iter().map(|o| o.key).collect();
        assert_eq!(keys, ["node_name", "hints_zones"]);
    }

    #[test]
    fn null_conditions_are_absent() {
        let r = read_metadata(Some(
            &json!({"ready": null, "serving": null, "terminating": null}),
        ));
        assert_eq!(r.flags, MetaFlags::default());
        assert!(r.odd.is_empty());
        let r = read_metadata(Some(
            &json!({"ready": false, "serving": true, "terminating": true}),
        ));
        assert_eq!(
            effective(&r.flags, &Health::UNKNOWN),
            Conditions::SERVING_TERMINATING
        );
    }

    #[test]
    fn namespace_not_an_object_falls_back_to_health() {
        let r = read_metadata(Some(&json!("serving")));
        assert_eq!(r.odd.len(), 1);
        assert_eq!(
            effective(&r.flags, &live(EdsHealth::Draining)),
            Conditions::SERVING_TERMINATING
        );
    }

    #[test]
    fn metadata_with_only_zone_reads_health() {
        let r = read_metadata(Some(&json!({"zone": "z1"})));
        assert_eq!(
            effective(&r.flags, &live(EdsHealth::Draining)),
            Conditions::SERVING_TERMINATING
        );
        assert_eq!(r.zone.as_deref(), Some("z1"));
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
