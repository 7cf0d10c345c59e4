//! The shipped Kubernetes manifests (deploy/, examples/) against the API's
//! own types, since no API server runs here: every Kubernetes kind is read
//! into k8s-openapi's struct and written back, and the two must be equal (a
//! misspelled or misplaced field is dropped on the way and shows up as a
//! difference; a wrong type fails to read). The companion's container args
//! are given to the real binary, which must accept them; its RBAC must allow
//! what the companion reads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every YAML document under deploy/ and examples/, with its file.
fn documents() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    for dir in ["deploy", "examples"] {
        collect(&repo().join(dir), &mut files);
    }
    files.sort();
    assert!(files.len() >= 10, "manifests not found: {files:?}");
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(repo()).unwrap().display().to_string();
        let parsed: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
        for doc in parsed.into_iter().filter(|d| !d.is_null()) {
            docs.push((name.clone(), doc));
        }
    }
    docs
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Reads `doc` as `T` and writes it back: what the type does not know is lost.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str, doc: &Value) {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{name}: {} does not read: {e}", doc["kind"]));
    let back = serde_json::to_value(&typed).unwrap();
    let mut lost = Vec::new();
    diff("", doc, &back, &mut lost);
    assert!(
        lost.is_empty(),
        "{name}: {} {}: fields the Kubernetes API does not have (or of the wrong shape): {lost:?}",
        doc["kind"],
        doc["metadata"]["name"]
    );
}

/// Paths present in `want` and missing or different in `got`.
fn diff(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let p = format!("{path}.{k}");
                match g.get(k) {
                    Some(gv) => diff(&p, v, gv, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                diff(&format!("{path}[{i}]"), wv, gv, out);
            }
        }
        _ if want != got => out.push(format!("{path}: {want} -> {got}")),
        _ => {}
    }
}

#[test]
fn kubernetes_kinds_match_the_api_types() {
    let mut checked = 0;
    let mut other = Vec::new();
    for (name, doc) in documents() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let api = doc["apiVersion"].as_str().unwrap_or_default().to_string();
        match (api.as_str(), kind.as_str()) {
            ("apps/v1", "Deployment") => round_trip::<Deployment>(&name, &doc),
            ("v1", "Service") => round_trip::<Service>(&name, &doc),
            ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(&name, &doc),
            ("v1", "Namespace") => round_trip::<Namespace>(&name, &doc),
            ("v1", "ConfigMap") => round_trip::<ConfigMap>(&name, &doc),
            ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(&name, &doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                round_trip::<ClusterRole>(&name, &doc)
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                round_trip::<ClusterRoleBinding>(&name, &doc)
            }
            // CRDs (Envoy Gateway, Istio) and kustomize: no types here.
            _ => {
                assert!(
                    !api.is_empty() && !kind.is_empty(),
                    "{name}: a document without apiVersion/kind"
                );
                other.push(format!("{api} {kind}"));
                continue;
            }
        }
        checked += 1;
    }
    println!("{checked} Kubernetes objects checked; not checked (CRDs, kustomize): {other:?}");
    assert!(checked >= 12, "only {checked} objects checked");
}

/// The companion's Deployments: the args parse (the binary is run with them;
/// a clap error exits 2 at once, anything else is past parsing), and the
/// ClusterRole lets it list and watch EndpointSlices.
#[test]
fn companion_deployments_args_parse_and_rbac_allows_the_watch() {
    let docs = documents();
    let mut deployments = 0;
    for (name, doc) in &docs {
        if doc["kind"] != "Deployment" {
            continue;
        }
        let container = &doc["spec"]["template"]["spec"]["containers"][0];
        if !container["image"]
            .as_str()
            .is_some_and(|i| i.contains("serving-picker-conditions"))
        {
            continue;
        }
        deployments += 1;
        let args: Vec<String> = container["args"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: no args"))
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let (code, stderr) = run_briefly(&args);
        assert!(
            code != Some(2) && !stderr.contains("Usage:"),
            "{name}: the companion refuses its args {args:?}: {stderr}"
        );
        // The service account it runs as is bound to a role that can watch slices.
        let account = doc["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no serviceAccountName"));
        assert!(
            can_watch_slices(&docs, account),
            "{name}: service account {account} cannot list/watch endpointslices"
        );
    }
    assert!(
        deployments >= 2,
        "companion Deployments found: {deployments}"
    );
}

/// Runs the companion with `args` for at most 3 s: its exit code (None when
/// it was still running, i.e. past argument parsing) and stderr.
fn run_briefly(args: &[String]) -> (Option<i32>, String) {
    let home = std::env::temp_dir().join(format!("sp-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
        .args(args)
        // No cluster: it fails (or retries) after parsing, never reaches one.
        .env("HOME", &home)
        .env("KUBECONFIG", home.join("none"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(3) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    (code, stderr)
}

fn can_watch_slices(docs: &[(String, Value)], account: &str) -> bool {
    let roles: Vec<&str> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "ClusterRoleBinding")
        .filter(|(_, d)| {
            d["subjects"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account)
            })
        })
        .filter_map(|(_, d)| d["roleRef"]["name"].as_str())
        .collect();
    docs.iter()
        .filter(|(_, d)| d["kind"] == "ClusterRole")
        .filter(|(_, d)| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| roles.contains(&n))
        })
        .flat_map(|(_, d)| d["rules"].as_array().cloned().unwrap_or_default())
        .any(|rule| {
            let has = |key: &str, want: &str| {
                rule[key]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == want || x == "*"))
            };
            has("apiGroups", "discovery.k8s.io")
                && has("resources", "endpointslices")
                && has("verbs", "list")
                && has("verbs", "watch")
        })
}
