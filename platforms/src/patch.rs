//! An EnvoyPatchPolicy's JSON patches applied as Envoy Gateway applies them
//! (`internal/xds/translator/jsonpatch.go`, `internal/utils/jsonpatch/
//! patch.go`, v1.8 and v1.9): to the xDS resource marshalled with protojson
//! `UseProtoNames` (snake_case field names), one op at a time, an `add`
//! creating the path's missing parents (EnsurePathExistsOnAdd), and an op
//! that fails (a `remove` or `replace` of a path the resource does not
//! have) reported as the policy's translation error.

use serde_json::{Map, Value};

/// Applies `ops` to `resource` one at a time; the error of each op that fails.
pub fn apply_as_eg(resource: &mut Value, ops: &[Value]) -> Vec<String> {
    let mut errors = Vec::new();
    for op in ops {
        if op["op"] == "add" {
            if let Some(path) = op["path"].as_str() {
                ensure_parents(resource, path);
            }
        }
        let patch: Result<json_patch::Patch, _> =
            serde_json::from_value(Value::Array(vec![op.clone()]));
        let result = match patch {
            Ok(p) => json_patch::patch(resource, &p).map_err(|e| e.to_string()),
            Err(e) => Err(format!("not a JSON patch op: {e}")),
        };
        if let Err(e) = result {
            errors.push(format!(
                "{} {}: {e}",
                op["op"].as_str().unwrap_or("?"),
                op["path"].as_str().unwrap_or("?")
            ));
        }
    }
    errors
}

fn ensure_parents(resource: &mut Value, path: &str) {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let mut at = resource;
    for part in parts.iter().take(parts.len().saturating_sub(1)) {
        let key = part.replace("~1", "/").replace("~0", "~");
        let Value::Object(map) = at else { return };
        at = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
    }
}

/// protojson's default (camelCase) names as `UseProtoNames` writes them
/// (snake_case); `@type` and the values stay.
pub fn proto_names(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    (
                        if k.starts_with('@') {
                            k.clone()
                        } else {
                            snake(k)
                        },
                        proto_names(v),
                    )
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(proto_names).collect()),
        other => other.clone(),
    }
}

fn snake(k: &str) -> String {
    let mut out = String::with_capacity(k.len() + 4);
    for c in k.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn ops_apply_one_at_a_time_with_parents_made_on_add_and_missing_removes_failing() {
        let mut c =
            proto_names(&json!({"commonLbConfig": {}, "loadBalancingPolicy": {"policies": []}}));
        assert_eq!(
            c,
            json!({"common_lb_config": {}, "load_balancing_policy": {"policies": []}})
        );
        let errors = apply_as_eg(
            &mut c,
            &[
                json!({"op": "remove", "path": "/common_lb_config/locality_weighted_lb_config"}),
                json!({"op": "add", "path": "/a/b/c", "value": 1}),
                json!({"op": "replace", "path": "/load_balancing_policy", "value": {"policies": [1]}}),
            ],
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("remove /common_lb_config/locality_weighted_lb_config"));
        assert_eq!(c["a"]["b"]["c"], 1);
        assert_eq!(c["load_balancing_policy"]["policies"][0], 1);
    }
}
