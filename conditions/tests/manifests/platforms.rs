//! Every object serving-picker ships (deploy/, examples/, their
//! kustomizations, the release's rendered manifests) against the CRDs of
//! every platform release it claims, and the EnvoyPatchPolicies against
//! what Envoy Gateway generates. A summary per release is printed
//! (`cargo test -p serving-picker-conditions --test manifests -- --nocapture`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use serving_picker_platforms::crds::{self, platform_of};
use serving_picker_platforms::helm::unknown_keys;
use serving_picker_platforms::objects::{self, repo, Shipped};
use serving_picker_platforms::patch::{apply_as_eg, proto_names};
use serving_picker_platforms::rules::{Rules, RulesSeen};
use serving_picker_platforms::schema::validate;

/// API groups of Kubernetes' own kinds: checked against k8s-openapi's types
/// by conditions/tests/manifests/kubernetes.rs.
const BUILT_IN_GROUPS: &[&str] = &[
    "",
    "apps",
    "rbac.authorization.k8s.io",
    "networking.k8s.io",
    "policy",
    "scheduling.k8s.io",
    "admissionregistration.k8s.io",
];

fn all_shipped(tag: &str) -> Vec<Shipped> {
    let root = repo();
    let mut all = objects::shipped(&root).unwrap();
    let rendered = std::env::temp_dir().join(format!(
        "serving-picker-platforms-{}-{tag}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&rendered);
    objects::render_release(&root, &rendered).unwrap();
    for file in objects::yaml_files(&rendered.join("manifests")) {
        let name = format!(
            "release: {}",
            file.strip_prefix(&rendered).unwrap().display()
        );
        let text = std::fs::read_to_string(&file).unwrap();
        all.extend(objects::parse(&name, &text).unwrap());
    }
    let _ = std::fs::remove_dir_all(&rendered);
    all
}

#[test]
fn every_shipped_object_is_accepted_by_every_release_it_claims() {
    let releases = crds::releases(&crds::root()).unwrap();
    let rules = Rules::new();
    let shipped = all_shipped("schemas");
    assert!(
        shipped.len() > 20,
        "too few objects found: {}",
        shipped.len()
    );
    let mut failures = Vec::new();
    let mut per_release: BTreeMap<String, (usize, usize, RulesSeen)> = BTreeMap::new();
    for s in &shipped {
        let (group, version, kind) = s.gvk();
        let Some(platform) = platform_of(&group) else {
            if !BUILT_IN_GROUPS.contains(&group.as_str()) {
                failures.push(format!(
                    "{}: {}: no platform CRDs here for {group} (add its CRDs under platforms/crds/)",
                    s.source,
                    s.name()
                ));
            }
            continue;
        };
        let mine: Vec<_> = releases.iter().filter(|r| r.platform == platform).collect();
        assert!(
            !mine.is_empty(),
            "no release of {platform} under platforms/crds/"
        );
        for r in mine {
            let entry = per_release
                .entry(format!("{} {}", r.platform, r.tag))
                .or_default();
            entry.0 += 1;
            match r.schema(&group, &version, &kind) {
                Err(e) => failures.push(format!("{}: {}: {e}", s.source, s.name())),
                Ok((schema, _)) => {
                    let report = validate(schema, &s.object, &rules);
                    if report.errors.is_empty() {
                        entry.1 += 1;
                    }
                    for e in &report.errors {
                        failures.push(format!(
                            "{} {}: {}: {}: {e}",
                            r.platform,
                            r.tag,
                            s.source,
                            s.name()
                        ));
                    }
                    let seen = &mut entry.2;
                    seen.evaluated.extend(report.rules.evaluated);
                    seen.not_evaluated.extend(report.rules.not_evaluated);
                    seen.transition.extend(report.rules.transition);
                }
            }
        }
    }
    println!("| release | objects checked | accepted | CEL rules evaluated | not evaluated | transition rules (update only) |");
    println!("|---|---|---|---|---|---|");
    for (release, (checked, ok, seen)) in &per_release {
        println!(
            "| {release} | {checked} | {ok} | {} | {} | {} |",
            seen.evaluated.len(),
            seen.not_evaluated.len(),
            seen.transition.len()
        );
    }
    for (release, (_, _, seen)) in &per_release {
        for (rule, why) in &seen.not_evaluated {
            println!("not evaluated ({release}): `{rule}`: {why}");
        }
    }
    let failures: BTreeSet<String> = failures.into_iter().collect();
    assert!(
        failures.is_empty(),
        "{} refusals:\n{}",
        failures.len(),
        failures.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The Cluster EG's translator generates for an HTTPRoute to a Service at
/// `tag` (its own testdata), with protojson UseProtoNames names.
fn eg_cluster(tag: &str) -> Value {
    let path = repo().join(format!("platforms/eg-xds/{tag}/http-route.clusters.yaml"));
    let clusters: Vec<Value> =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    proto_names(&clusters[0])
}

#[test]
fn every_envoy_patch_policy_applies_to_what_envoy_gateway_generates() {
    let policies: BTreeMap<String, Value> = all_shipped("patches")
        .into_iter()
        .filter(|s| s.object["kind"] == "EnvoyPatchPolicy" && !s.source.starts_with("release"))
        .map(|s| (s.name(), s.object))
        .collect();
    assert!(!policies.is_empty(), "no EnvoyPatchPolicy shipped");
    for tag in ["v1.8.3", "v1.9.0"] {
        for (name, policy) in &policies {
            let ops: Vec<Value> = policy["spec"]["jsonPatches"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster")
                .map(|p| p["operation"].clone())
                .collect();
            if ops.is_empty() {
                continue;
            }
            let mut cluster = eg_cluster(tag);
            let errors = apply_as_eg(&mut cluster, &ops);
            assert!(
                errors.is_empty(),
                "EG {tag}: {name}: translation errors: {errors:?}"
            );
            let policies = &cluster["load_balancing_policy"]["policies"];
            assert_eq!(
                policies[0]["typed_extension_config"]["name"],
                "envoy.load_balancing_policies.dynamic_modules",
                "EG {tag}: {name}: the cluster is not on the dynamic-module policy: {cluster}"
            );
            println!(
                "EG {tag}: {name}: {} ops applied to {}",
                ops.len(),
                cluster["name"]
            );
        }
    }
}

/// The Envoy Gateway releases whose Helm chart is copied under
/// `platforms/eg-chart/<tag>/` (values.tmpl.yaml, Chart.yaml).
const EG_CHART_TAGS: [&str; 2] = ["v1.8.3", "v1.9.0"];

fn yaml_file(path: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every key the shipped Envoy Gateway values set is one of the chart's at
/// both tags (Helm ignores the others without a word), `config.envoyGateway`
/// aside (the chart writes it out as the EnvoyGateway document:
/// conditions/tests/manifests/kubernetes.rs checks its keys). And the settings a
/// review relies on hold in the chart itself: `crds.enabled` is the
/// condition of the crds subchart (which renders the Gateway API's
/// ValidatingAdmissionPolicy), the chart default is on, the values turn it
/// off; replicas, a PodDisruptionBudget the chart renders (minAvailable >= 1)
/// and a priority class are set.
#[test]
fn envoy_gateway_values_use_only_the_charts_keys() {
    let files = [
        "deploy/envoy-gateway/envoy-gateway-values.yaml",
        "deploy/envoy-gateway/envoy-gateway-patch-policy-values.yaml",
        "deploy/envoy-gateway/envoy-gateway-native-values.yaml",
    ];
    for tag in EG_CHART_TAGS {
        let defaults = yaml_file(&format!("platforms/eg-chart/{tag}/values.tmpl.yaml"));
        let chart = yaml_file(&format!("platforms/eg-chart/{tag}/Chart.yaml"));
        let crds = chart["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "crds")
            .unwrap_or_else(|| panic!("EG {tag}: no crds subchart"));
        assert_eq!(crds["condition"], "crds.enabled", "EG {tag}");
        assert_eq!(defaults["crds"]["enabled"], true, "EG {tag}: the default");
        for file in files {
            let values = yaml_file(file);
            let unknown = unknown_keys(&values, &defaults, &["config.envoyGateway"]);
            assert!(
                unknown.is_empty(),
                "EG {tag}: {file} sets keys the chart does not have: {unknown:?}"
            );
            println!("EG {tag}: {file}: every key is the chart's");
        }
    }
    let values = yaml_file(files[0]);
    assert_eq!(values["crds"]["enabled"], false);
    assert!(values["deployment"]["replicas"].as_u64().unwrap() >= 2);
    assert!(
        values["podDisruptionBudget"]["minAvailable"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(values["deployment"]["priorityClassName"].is_string());
    let resources = &values["deployment"]["envoyGateway"]["resources"];
    assert!(
        resources["requests"]["memory"].is_string() && resources["limits"]["memory"].is_string()
    );
}

/// The Istio releases whose istiod chart is copied under
/// `platforms/istio-chart/<tag>/` (values.yaml, zzy_descope_legacy.yaml).
const ISTIO_CHART_TAGS: [&str; 4] = ["1.28.10", "1.29.6", "1.30.3", "1.31.0-rc.0"];

/// The istiod values shipped (examples/istio/istiod-values.yaml) set only
/// keys of the istiod chart at every Istio release claimed: the chart copies
/// `pilot.*` to its top level (its zzy_descope_legacy.yaml), where `env`
/// is one of its values and becomes the Deployment's environment.
#[test]
fn istiod_values_use_only_the_charts_keys() {
    let values = yaml_file("examples/istio/istiod-values.yaml");
    let keys: Vec<&String> = values.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["pilot"],
        "only `pilot.*`, the prefix istioctl's values use too"
    );
    assert_eq!(
        values["pilot"]["env"]["PILOT_ENABLE_PERSISTENT_SESSION_FILTER"], "true",
        "a string: the chart writes env values quoted"
    );
    for tag in ISTIO_CHART_TAGS {
        let descope = std::fs::read_to_string(repo().join(format!(
            "platforms/istio-chart/{tag}/zzy_descope_legacy.yaml"
        )))
        .unwrap();
        assert!(
            descope.contains(r#"mustMergeOverwrite $.Values (index $.Values "pilot")"#),
            "Istio {tag}: the chart no longer copies pilot.* to its top level"
        );
        let defaults = yaml_file(&format!("platforms/istio-chart/{tag}/values.yaml"));
        let top = &defaults["_internal_defaults_do_not_set"];
        let unknown = unknown_keys(&values["pilot"], top, &["env"]);
        assert!(
            unknown.is_empty(),
            "Istio {tag}: unknown istiod values {unknown:?}"
        );
        assert!(top["env"].is_object(), "Istio {tag}: no `env` value");
        println!("Istio {tag}: istiod-values.yaml: every key is the chart's");
    }
}
