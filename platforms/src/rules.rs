//! A schema's `x-kubernetes-validations`: CEL rules evaluated with the `cel`
//! crate on the value they sit on (`self`), as the API server evaluates
//! them on create. Transition rules (`oldSelf`) do not apply to a create
//! and are skipped. A rule that uses what the crate lacks (Kubernetes' CEL
//! libraries: `isURL`, `quantity`, `ip`, `cidr`, `format`, ...) is recorded
//! as not evaluated, never passed silently.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use cel::objects::Map as CelMap;
use cel::{Context, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

/// Rules compiled once each.
#[derive(Default)]
pub struct Rules {
    compiled: Mutex<HashMap<String, Result<std::sync::Arc<Program>, String>>>,
}

/// What the rules met while validating.
#[derive(Default, Debug)]
pub struct RulesSeen {
    /// Distinct rules evaluated to true or false.
    pub evaluated: BTreeSet<String>,
    /// Distinct rules that could not be evaluated here, with why.
    pub not_evaluated: BTreeMap<String, String>,
    /// Transition rules skipped (they apply to updates only).
    pub transition: BTreeSet<String>,
}

impl Rules {
    /// No rule compiled yet.
    pub fn new() -> Rules {
        Rules::default()
    }

    /// Checks one rule (`{rule, message}`) against `value`: `Err` with the
    /// API server's message when the rule is false or fails on the value.
    pub fn check(&self, rule: &Value, value: &Value, seen: &mut RulesSeen) -> Result<(), String> {
        let Some(text) = rule["rule"].as_str() else {
            return Ok(());
        };
        if text.contains("oldSelf") {
            seen.transition.insert(text.to_string());
            return Ok(());
        }
        let program = match self.compile(text) {
            Ok(p) => p,
            Err(why) => {
                seen.not_evaluated.insert(text.to_string(), why);
                return Ok(());
            }
        };
        let mut ctx = Context::default();
        ctx.add_variable_from_value("self", to_cel(value));
        let message = || {
            rule["message"]
                .as_str()
                .map_or_else(|| format!("failed rule: {text}"), str::to_string)
        };
        match program.execute(&ctx) {
            Ok(CelValue::Bool(true)) => {
                seen.evaluated.insert(text.to_string());
                Ok(())
            }
            Ok(CelValue::Bool(false)) => {
                seen.evaluated.insert(text.to_string());
                Err(message())
            }
            Ok(other) => {
                seen.not_evaluated.insert(
                    text.to_string(),
                    format!("evaluates to {other:?}, not a bool"),
                );
                Ok(())
            }
            // The API server fails a rule that reads a field the object
            // does not have (the rule should have used has()).
            Err(ExecutionError::NoSuchKey(key)) => {
                seen.evaluated.insert(text.to_string());
                Err(format!("{}: no such key: {key}", message()))
            }
            Err(e) => {
                seen.not_evaluated.insert(text.to_string(), e.to_string());
                Ok(())
            }
        }
    }

    fn compile(&self, text: &str) -> Result<std::sync::Arc<Program>, String> {
        let mut cache = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .entry(text.to_string())
            .or_insert_with(|| {
                Program::compile(text)
                    .map(std::sync::Arc::new)
                    .map_err(|e| format!("does not parse here: {e}"))
            })
            .clone()
    }
}

/// JSON as CEL sees a Kubernetes object: integers are `int`.
pub(crate) fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => CelValue::Int(i),
            None => CelValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => CelValue::String(s.clone().into()),
        Value::Array(items) => CelValue::List(items.iter().map(to_cel).collect::<Vec<_>>().into()),
        Value::Object(map) => {
            let m: HashMap<String, CelValue> =
                map.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            CelValue::Map(CelMap::from(m))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn true_passes_false_fails_with_the_message_and_unknown_functions_are_recorded() {
        let rules = Rules::new();
        let mut seen = RulesSeen::default();
        let rule = json!({"rule": "self.type == 'Local' ? has(self.local) : true", "message": "local needs a path"});
        assert!(rules
            .check(&rule, &json!({"type": "Local", "local": {}}), &mut seen)
            .is_ok());
        assert_eq!(
            rules.check(&rule, &json!({"type": "Local"}), &mut seen),
            Err("local needs a path".into())
        );
        let sized = json!({"rule": "size(self.items) <= 2 && self.items.all(i, i > 0)"});
        assert!(rules
            .check(&sized, &json!({"items": [1, 2]}), &mut seen)
            .is_ok());
        assert!(rules
            .check(&sized, &json!({"items": [1, 0]}), &mut seen)
            .is_err());
        let k8s = json!({"rule": "isURL(self.url)"});
        assert!(rules
            .check(&k8s, &json!({"url": "https://x"}), &mut seen)
            .is_ok());
        assert!(
            seen.not_evaluated.contains_key("isURL(self.url)"),
            "{seen:?}"
        );
        let transition = json!({"rule": "self == oldSelf"});
        assert!(rules.check(&transition, &json!(1), &mut seen).is_ok());
        assert!(seen.transition.contains("self == oldSelf"));
    }
}
