//! A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) judged on
//! one create or update, as the API server judges it: its `matchConstraints`
//! resource rules, then its `matchConditions` (all must be true for the
//! policy to apply), then its `validations` (each must be true). The CEL
//! expressions are evaluated with the `cel` crate, `object` bound to the new
//! object; an expression that fails to compile or evaluate, or uses
//! `oldObject`, `request`, `params`, `namespaceObject` or
//! `authorizer`, is an error, never a pass.

use cel::{Context, Program, Value as CelValue};
use serde_json::Value;

use crate::rules::to_cel;

/// What the policy does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The resource or an operation is outside `matchConstraints`.
    NotMatched,
    /// A match condition is false: the policy does not apply.
    Skipped(String),
    /// Every validation is true.
    Admitted,
    /// A validation is false: its message.
    Refused(String),
}

/// Judges `object` (of `group`, `version`, `resource`) on `operation`
/// (CREATE, UPDATE) against `policy`.
pub fn judge(
    policy: &Value,
    operation: &str,
    (group, version, resource): (&str, &str, &str),
    object: &Value,
) -> Result<Verdict, String> {
    let spec = &policy["spec"];
    let listed = |rule: &Value, key: &str, want: &str| {
        rule[key]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == "*" || v == want))
    };
    let matched = spec["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| {
            listed(r, "apiGroups", group)
                && listed(r, "apiVersions", version)
                && listed(r, "operations", operation)
                && listed(r, "resources", resource)
        });
    if !matched {
        return Ok(Verdict::NotMatched);
    }
    for c in spec["matchConditions"].as_array().into_iter().flatten() {
        let expr = c["expression"]
            .as_str()
            .ok_or("a matchCondition without expression")?;
        if !eval(expr, object)? {
            return Ok(Verdict::Skipped(
                c["name"].as_str().unwrap_or(expr).to_string(),
            ));
        }
    }
    for v in spec["validations"].as_array().into_iter().flatten() {
        let expr = v["expression"]
            .as_str()
            .ok_or("a validation without expression")?;
        if !eval(expr, object)? {
            let message = v["message"]
                .as_str()
                .map_or_else(|| format!("failed expression: {expr}"), str::to_string);
            return Ok(Verdict::Refused(message));
        }
    }
    Ok(Verdict::Admitted)
}

/// One expression on `object`: a bool, or why not.
fn eval(expr: &str, object: &Value) -> Result<bool, String> {
    for unbound in [
        "oldObject",
        "request",
        "params",
        "namespaceObject",
        "authorizer",
    ] {
        if expr.contains(unbound) {
            return Err(format!("`{expr}`: uses {unbound}, not bound here"));
        }
    }
    let program = Program::compile(expr).map_err(|e| format!("`{expr}`: {e}"))?;
    let mut ctx = Context::default();
    ctx.add_variable_from_value("object", to_cel(object));
    match program.execute(&ctx) {
        Ok(CelValue::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("`{expr}`: {other:?}, not a bool")),
        Err(e) => Err(format!("`{expr}`: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn constraints_then_conditions_then_validations() {
        let policy = json!({"spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["g"], "apiVersions": ["*"],
                "operations": ["CREATE"], "resources": ["things"]}]},
            "matchConditions": [{"name": "mine", "expression": "object.spec.class == 'a'"}],
            "validations": [{"expression": "!has(object.spec.x)", "message": "no x"}]}});
        let on = |op: &str, o: Value| judge(&policy, op, ("g", "v1", "things"), &o).unwrap();
        assert_eq!(
            on("CREATE", json!({"spec": {"class": "a"}})),
            Verdict::Admitted
        );
        assert_eq!(
            on("CREATE", json!({"spec": {"class": "a", "x": 1}})),
            Verdict::Refused("no x".into())
        );
        assert_eq!(
            on("CREATE", json!({"spec": {"class": "b", "x": 1}})),
            Verdict::Skipped("mine".into())
        );
        assert_eq!(
            on("UPDATE", json!({"spec": {"class": "a", "x": 1}})),
            Verdict::NotMatched
        );
        let old = json!({"spec": {"validations": [{"expression": "oldObject == object"}],
            "matchConstraints": policy["spec"]["matchConstraints"].clone()}});
        assert!(judge(&old, "CREATE", ("g", "v1", "things"), &json!({})).is_err());
    }
}
