//! Helm values against a chart's own default values: a key the chart does
//! not have is silently ignored by Helm (the setting a review reads would do
//! nothing), so every key a shipped values file sets must be one of the
//! chart's, at every release claimed. The chart's defaults are copied at the
//! tags (`platforms/eg-chart/<tag>/values.tmpl.yaml`).

use serde_json::Value;

/// The dotted paths `values` sets that `defaults` lacks. Below `free` paths
/// (documents the chart writes out as they are, e.g. Envoy Gateway's
/// `config.envoyGateway`) nothing is compared. A key whose default is not a
/// map (a list, a scalar, `null`, `{}`) takes any value.
pub fn unknown_keys(values: &Value, defaults: &Value, free: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    walk(values, defaults, "", free, &mut out);
    out
}

fn walk(values: &Value, defaults: &Value, path: &str, free: &[&str], out: &mut Vec<String>) {
    let Some(map) = values.as_object() else {
        return;
    };
    let Some(known) = defaults.as_object().filter(|m| !m.is_empty()) else {
        return;
    };
    for (key, value) in map {
        let here = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        if free.contains(&here.as_str()) {
            continue;
        }
        match known.get(key) {
            Some(default) => walk(value, default, &here, free, out),
            None => out.push(here),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keys_are_named_known_and_free_ones_pass() {
        let defaults = json!({"crds": {"enabled": true}, "deployment": {"replicas": 1,
            "pod": {"labels": {}, "tolerations": []}}, "config": {"envoyGateway": {"gateway": {}}}});
        let values = json!({"crds": {"enabled": false, "typo": 1}, "deployment": {"replicas": 2,
            "pod": {"labels": {"a": "b"}, "tolerations": [{"key": "k"}]}, "replica": 3},
            "config": {"envoyGateway": {"anything": {"at": "all"}}}, "crd": {"enabled": false}});
        let mut got = unknown_keys(&values, &defaults, &["config.envoyGateway"]);
        got.sort();
        assert_eq!(got, ["crd", "crds.typo", "deployment.replica"]);
    }
}
