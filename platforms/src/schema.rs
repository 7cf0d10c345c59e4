//! An object against a CRD's `openAPIV3Schema`, as the API server validates
//! a create with kubectl's default strict field validation: unknown fields
//! refused (unless `x-kubernetes-preserve-unknown-fields`), types, formats
//! the API server checks, patterns (RE2: the `regex` crate's syntax),
//! enums, bounds, required fields, list types, and the CEL rules
//! ([`crate::rules`]). `null` for a field that is not `nullable` is pruned,
//! as the API server does, not refused.

use std::collections::BTreeSet;

use regex::Regex;
use serde_json::{Map, Value};

use crate::rules::{Rules, RulesSeen};

/// What validating one object found.
#[derive(Default, Debug)]
pub struct Report {
    /// Why the API server would refuse the object: `path: message`.
    pub errors: Vec<String>,
    /// CEL rules evaluated, and the ones that could not be.
    pub rules: RulesSeen,
}

/// The fields of `metadata` an object may carry when created.
const OBJECT_META: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "generateName",
    "finalizers",
    "ownerReferences",
];

/// Validates `object` against `schema` (the version's `openAPIV3Schema`).
pub fn validate(schema: &Value, object: &Value, rules: &Rules) -> Report {
    let mut report = Report::default();
    check_metadata(object, &mut report.errors);
    let mut v = Validator {
        rules,
        report: &mut report,
    };
    v.node(schema, object, "", true);
    report
}

/// `metadata.name` as the API server requires of a custom object: a DNS-1123
/// subdomain; only ObjectMeta's fields.
fn check_metadata(object: &Value, errors: &mut Vec<String>) {
    let meta = &object["metadata"];
    match meta["name"].as_str() {
        Some(name) if is_dns_subdomain(name) => {}
        Some(name) => errors.push(format!(
            "metadata.name: {name:?} is not a DNS-1123 subdomain (lower case alphanumerics, '-' and '.')"
        )),
        None => errors.push("metadata.name: Required value".into()),
    }
    if let Some(m) = meta.as_object() {
        for k in m.keys().filter(|k| !OBJECT_META.contains(&k.as_str())) {
            errors.push(format!("metadata.{k}: unknown field"));
        }
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

struct Validator<'a> {
    rules: &'a Rules,
    report: &'a mut Report,
}

impl Validator<'_> {
    fn error(&mut self, path: &str, message: impl std::fmt::Display) {
        let at = if path.is_empty() { "<root>" } else { path };
        self.report.errors.push(format!("{at}: {message}"));
    }

    /// `structural`: unknown fields are refused here (false inside the
    /// allOf/anyOf/oneOf/not value validations, which only constrain).
    fn node(&mut self, schema: &Value, value: &Value, path: &str, structural: bool) {
        if value.is_null() {
            return;
        }
        let s = |k: &str| schema.get(k);
        let int_or_string = s("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        if int_or_string {
            if !(value.is_i64() || value.is_u64() || value.is_string()) {
                self.error(path, "must be an integer or a string");
                return;
            }
        } else if let Some(t) = s("type").and_then(Value::as_str) {
            if !type_matches(t, value) {
                self.error(
                    path,
                    format!("must be of type {t}, got {}", type_name(value)),
                );
                return;
            }
        }
        if let Some(allowed) = s("enum").and_then(Value::as_array) {
            if !allowed.contains(value) {
                self.error(
                    path,
                    format!(
                        "unsupported value {value}: must be one of {}",
                        Value::Array(allowed.clone())
                    ),
                );
            }
        }
        match value {
            Value::Object(map) => self.object(schema, map, path, structural),
            Value::Array(items) => self.array(schema, items, path, structural),
            Value::String(text) => self.string(schema, text, path),
            Value::Number(_) => self.number(schema, value, path),
            _ => {}
        }
        for (key, many) in [("allOf", 0), ("anyOf", 1), ("oneOf", 2)] {
            if let Some(subs) = s(key).and_then(Value::as_array) {
                let passing = subs.iter().filter(|sub| self.passes(sub, value)).count();
                let ok = match many {
                    0 => passing == subs.len(),
                    1 => passing >= 1,
                    _ => passing == 1,
                };
                if !ok {
                    self.error(
                        path,
                        format!(
                            "does not satisfy {key} ({passing} of {} schemas pass)",
                            subs.len()
                        ),
                    );
                }
            }
        }
        if let Some(not) = s("not") {
            if self.passes(not, value) {
                self.error(path, "must not match the `not` schema");
            }
        }
        if let Some(rules) = s("x-kubernetes-validations").and_then(Value::as_array) {
            for rule in rules {
                if let Err(message) = self.rules.check(rule, value, &mut self.report.rules) {
                    self.error(path, message);
                }
            }
        }
    }

    /// Whether `value` satisfies a value-validation subschema.
    fn passes(&mut self, schema: &Value, value: &Value) -> bool {
        let mut scratch = Report::default();
        let mut v = Validator {
            rules: self.rules,
            report: &mut scratch,
        };
        v.node(schema, value, "", false);
        scratch.errors.is_empty()
    }

    fn object(&mut self, schema: &Value, map: &Map<String, Value>, path: &str, structural: bool) {
        let props = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties");
        let preserve =
            schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let embedded = schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
        for (key, child) in map {
            if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
                // TypeMeta and ObjectMeta: the API server's own (check_metadata).
                continue;
            }
            let child_path = join(path, key);
            if let Some(p) = props.and_then(|p| p.get(key)) {
                self.node(p, child, &child_path, structural);
            } else if let Some(a) = additional.filter(|a| a.is_object()) {
                self.node(a, child, &child_path, structural);
            } else if embedded && ["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
            } else if structural && !preserve && additional != Some(&Value::Bool(true)) {
                self.error(&child_path, "unknown field");
            }
        }
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(name) = req.as_str() {
                if map.get(name).is_none_or(Value::is_null) {
                    self.error(&join(path, name), "Required value");
                }
            }
        }
        let n = map.len() as u64;
        if let Some(min) = schema.get("minProperties").and_then(Value::as_u64) {
            if n < min {
                self.error(path, format!("must have at least {min} properties"));
            }
        }
        if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64) {
            if n > max {
                self.error(path, format!("must have at most {max} properties"));
            }
        }
    }

    fn array(&mut self, schema: &Value, items: &[Value], path: &str, structural: bool) {
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                self.node(item_schema, item, &format!("{path}[{i}]"), structural);
            }
        }
        let n = items.len() as u64;
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if n < min {
                self.error(path, format!("must have at least {min} items"));
            }
        }
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
            if n > max {
                self.error(path, format!("must have at most {max} items"));
            }
        }
        match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => {
                let mut seen = BTreeSet::new();
                for item in items {
                    if !seen.insert(item.to_string()) {
                        self.error(path, format!("Duplicate value: {item}"));
                    }
                }
            }
            Some("map") => {
                let keys: Vec<&str> = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let mut seen = BTreeSet::new();
                for item in items {
                    let key: Vec<String> = keys.iter().map(|k| item[*k].to_string()).collect();
                    if !seen.insert(key.clone()) {
                        self.error(path, format!("Duplicate value: {}", key.join(",")));
                    }
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, schema: &Value, text: &str, path: &str) {
        let chars = text.chars().count() as u64;
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            if chars < min {
                self.error(path, format!("must be at least {min} characters"));
            }
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            if chars > max {
                self.error(path, format!("may not be more than {max} characters"));
            }
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            match Regex::new(pattern) {
                Ok(re) if re.is_match(text) => {}
                Ok(_) => self.error(
                    path,
                    format!("{text:?} does not match the pattern {pattern}"),
                ),
                Err(e) => self.error(
                    path,
                    format!("pattern {pattern} does not compile here: {e}"),
                ),
            }
        }
        if let Some(format) = schema.get("format").and_then(Value::as_str) {
            if let Some(why) = format_error(format, text) {
                self.error(path, format!("{text:?} is not a valid {format}: {why}"));
            }
        }
    }

    fn number(&mut self, schema: &Value, value: &Value, path: &str) {
        let Some(x) = value.as_f64() else { return };
        let exclusive = |k: &str| schema.get(k) == Some(&Value::Bool(true));
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if x < min || (exclusive("exclusiveMinimum") && x == min) {
                self.error(path, format!("should be greater than or equal to {min}"));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if x > max || (exclusive("exclusiveMaximum") && x == max) {
                self.error(path, format!("should be less than or equal to {max}"));
            }
        }
        if let Some(format) = schema.get("format").and_then(Value::as_str) {
            let fits = match format {
                "int32" => value.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
                "int64" => value.as_i64().is_some(),
                _ => true,
            };
            if !fits {
                self.error(path, format!("{value} does not fit format {format}"));
            }
        }
    }
}

/// The string formats the API server checks that shipped objects use; the
/// others pass.
fn format_error(format: &str, text: &str) -> Option<&'static str> {
    match format {
        "date-time" => {
            let ok = text.len() >= 20 && text.as_bytes().get(10) == Some(&b'T');
            (!ok).then_some("not RFC 3339")
        }
        "byte" => {
            let ok = text.len().is_multiple_of(4)
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
            (!ok).then_some("not base64")
        }
        _ => None,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn errors(schema: Value, object: Value) -> Vec<String> {
        let mut object = object;
        object["metadata"] = json!({"name": "a"});
        let mut schema = schema;
        schema["properties"]["metadata"] = json!({"type": "object"});
        schema["properties"]["apiVersion"] = json!({"type": "string"});
        schema["properties"]["kind"] = json!({"type": "string"});
        validate(&schema, &object, &Rules::new()).errors
    }

    #[test]
    fn unknown_fields_types_patterns_enums_bounds_and_required_are_refused() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$", "maxLength": 8},
            "mode": {"type": "string", "enum": ["A", "B"]},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535, "format": "int32"},
            "tags": {"type": "array", "maxItems": 2, "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "size": {"x-kubernetes-int-or-string": true},
        }}}});
        let ok = errors(
            schema.clone(),
            json!({"spec": {"name": "ok-1", "mode": "A", "port": 80,
            "tags": ["a"], "free": {"anything": 1}, "size": "10%"}}),
        );
        assert!(ok.is_empty(), "{ok:?}");
        let bad = errors(
            schema,
            json!({"spec": {"name": "Bad_Name", "mode": "C", "port": 0,
            "tags": ["a", "a", "b"], "size": true, "typo": 1}}),
        );
        let all = bad.join("\n");
        for expect in [
            "spec.name: \"Bad_Name\" does not match",
            "spec.mode: unsupported value",
            "spec.port: should be greater",
            "spec.tags: must have at most 2",
            "spec.tags: Duplicate value",
            "spec.size: must be an integer or a string",
            "spec.typo: unknown field",
        ] {
            assert!(all.contains(expect), "{expect} not in:\n{all}");
        }
        let missing = errors(
            json!({"type": "object", "properties": {"spec": {"type": "object",
            "required": ["name"], "properties": {"name": {"type": "string"}}}}}),
            json!({"spec": {}}),
        );
        assert_eq!(missing, vec!["spec.name: Required value"]);
    }

    #[test]
    fn metadata_names_must_be_dns_subdomains() {
        assert!(is_dns_subdomain("serving-picker.io"));
        assert!(!is_dns_subdomain("serving_picker"));
        let r = validate(
            &json!({"type": "object"}),
            &json!({"metadata": {"name": "A"}}),
            &Rules::new(),
        );
        assert!(r.errors[0].contains("DNS-1123"), "{:?}", r.errors);
    }
}
