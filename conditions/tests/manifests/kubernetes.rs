//! The shipped Kubernetes manifests (deploy/, examples/) against the API's
//! own types, since no API server runs here: every Kubernetes kind is read
//! into k8s-openapi's struct and written back, and the two must be equal (a
//! misspelled or misplaced field is dropped on the way and shows up as a
//! difference; a wrong type fails to read). The companion's container args
//! are given to the real binary, which must accept them; its RBAC must allow
//! what the companion reads.
//!
//! Every folder under deploy/ is built with `kubectl kustomize` (offline),
//! and each build with a companion is checked as a security review would:
//! mutual TLS with files from a cert-manager Certificate of the build, the
//! client identity it lets in issued there too, a NetworkPolicy that admits
//! named clients only, a PodDisruptionBudget, spread over nodes and zones,
//! RBAC that allows the watch (a Role in the Services' namespace for the
//! namespaced variant), and the readiness each mode needs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
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
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && !is_helm_values(&path)
        {
            out.push(path);
        }
    }
}

/// Values for another project's Helm chart (`*-values.yaml`), Prometheus
/// rule files (`*.rules.yaml`) and scrape jobs (`*.scrape.yaml`): not
/// Kubernetes objects.
fn is_helm_values(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        n.ends_with("-values.yaml") || n.ends_with(".rules.yaml") || n.ends_with(".scrape.yaml")
    })
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

/// Reads `doc` into its k8s-openapi type and back (see `round_trip`);
/// false for kinds without a type here (CRDs, kustomize).
fn check_kind(name: &str, doc: &Value) -> bool {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    const RBAC: &str = "rbac.authorization.k8s.io/v1";
    match (api, kind) {
        ("apps/v1", "Deployment") => round_trip::<Deployment>(name, doc),
        ("v1", "Service") => round_trip::<Service>(name, doc),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(name, doc),
        ("v1", "Namespace") => round_trip::<Namespace>(name, doc),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(name, doc),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(name, doc),
        ("networking.k8s.io/v1", "NetworkPolicy") => round_trip::<NetworkPolicy>(name, doc),
        (RBAC, "ClusterRole") => round_trip::<ClusterRole>(name, doc),
        (RBAC, "ClusterRoleBinding") => round_trip::<ClusterRoleBinding>(name, doc),
        (RBAC, "Role") => round_trip::<Role>(name, doc),
        (RBAC, "RoleBinding") => round_trip::<RoleBinding>(name, doc),
        ("scheduling.k8s.io/v1", "PriorityClass") => round_trip::<PriorityClass>(name, doc),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<ValidatingAdmissionPolicy>(name, doc)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<ValidatingAdmissionPolicyBinding>(name, doc)
        }
        // CRDs (Envoy Gateway, Istio, cert-manager) and kustomize: no types here.
        _ => return false,
    }
    true
}

#[test]
fn kubernetes_kinds_match_the_api_types() {
    let mut checked = 0;
    let mut other = Vec::new();
    for (name, doc) in documents() {
        if check_kind(&name, &doc) {
            checked += 1;
            continue;
        }
        let kind = doc["kind"].as_str().unwrap_or_default();
        let api = doc["apiVersion"].as_str().unwrap_or_default();
        assert!(
            !api.is_empty() && !kind.is_empty(),
            "{name}: a document without apiVersion/kind"
        );
        other.push(format!("{api} {kind}"));
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

/// `kubectl kustomize` of every folder under deploy/: (folder, documents).
fn kustomize_builds() -> Vec<(String, Vec<Value>)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|dir| {
            let name = dir.strip_prefix(repo()).unwrap().display().to_string();
            assert!(
                dir.join("kustomization.yaml").is_file(),
                "{name}: every folder under deploy/ is a kustomization"
            );
            let out = Command::new("kubectl")
                .arg("kustomize")
                .arg(dir)
                .output()
                .unwrap_or_else(|e| panic!("kubectl (Debian's kubectl package) not runnable: {e}"));
            let text = String::from_utf8(out.stdout).unwrap();
            assert!(
                out.status.success(),
                "kubectl kustomize {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("kubectl kustomize {name}: not YAML: {e}"));
            (name, docs.into_iter().filter(|d| !d.is_null()).collect())
        })
        .collect()
}

#[test]
fn every_deploy_folder_builds_with_kubectl_kustomize() {
    let builds = kustomize_builds();
    let names: Vec<&str> = builds.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "deploy/cert-manager",
        "deploy/conditions",
        "deploy/conditions-namespaced",
        "deploy/envoy-gateway",
        "deploy/envoy-gateway-native",
        "deploy/envoy-gateway-native-eg1.8",
    ] {
        assert!(names.contains(&want), "{want} not built: {names:?}");
    }
    for (name, docs) in &builds {
        assert!(!docs.is_empty(), "{name}: nothing built");
        let checked = docs
            .iter()
            .filter(|d| check_kind(&format!("kubectl kustomize {name}"), d))
            .count();
        println!(
            "kubectl kustomize {name}: {} objects, {checked} checked against the API types",
            docs.len()
        );
    }
}

fn is_companion(doc: &Value) -> bool {
    doc["kind"] == "Deployment"
        && doc["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .is_some_and(|i| i.contains("serving-picker-conditions"))
}

/// Every label of `selector` (a matchLabels map) is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The values of `--flag=value` (and `--flag value`) in `args`.
fn flag_values(args: &[String], flag: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
            out.push(v.to_string());
        } else if a == flag {
            if let Some(v) = args.get(i + 1) {
                out.push(v.clone());
            }
        }
    }
    out
}

fn of_kind<'a>(docs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    docs.iter().filter(move |d| d["kind"] == kind)
}

/// The rules bound to `account` (in `account_ns`) allow listing and
/// watching EndpointSlices cluster-wide, or in `namespace` when given.
fn allows_the_watch(
    docs: &[Value],
    account_ns: &str,
    account: &str,
    namespace: Option<&str>,
) -> bool {
    let bound = |b: &Value| {
        b["subjects"].as_array().is_some_and(|s| {
            s.iter().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == account
                    && s["namespace"] == account_ns
            })
        })
    };
    let allows = |rules: &Value| {
        rules.as_array().is_some_and(|rules| {
            rules.iter().any(|rule| {
                let has = |key: &str, want: &str| {
                    strings(&rule[key]).iter().any(|x| x == want || x == "*")
                };
                has("apiGroups", "discovery.k8s.io")
                    && has("resources", "endpointslices")
                    && has("verbs", "list")
                    && has("verbs", "watch")
            })
        })
    };
    let role = |kind: &str, name: &Value, ns: Option<&Value>| {
        of_kind(docs, kind)
            .filter(|r| r["metadata"]["name"] == *name)
            .filter(|r| ns.is_none_or(|ns| r["metadata"]["namespace"] == *ns))
            .any(|r| allows(&r["rules"]))
    };
    let cluster_wide = of_kind(docs, "ClusterRoleBinding")
        .filter(|b| bound(b))
        .any(|b| role("ClusterRole", &b["roleRef"]["name"], None));
    let in_namespace = namespace.is_some_and(|ns| {
        of_kind(docs, "RoleBinding")
            .filter(|b| b["metadata"]["namespace"] == ns && bound(b))
            .any(|b| match b["roleRef"]["kind"].as_str() {
                Some("Role") => role(
                    "Role",
                    &b["roleRef"]["name"],
                    Some(&b["metadata"]["namespace"]),
                ),
                Some("ClusterRole") => role("ClusterRole", &b["roleRef"]["name"], None),
                _ => false,
            })
    });
    cluster_wide || in_namespace
}

/// One companion Deployment of a build, as a security review reads it.
fn review(build: &str, dep: &Value, docs: &[Value]) {
    let what = format!("{build}: Deployment {}", dep["metadata"]["name"]);
    let ns = dep["metadata"]["namespace"].as_str().unwrap();
    let pod = &dep["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    let spec = &pod["spec"];
    let container = &spec["containers"][0];
    let args = strings(&container["args"]);
    let mode = args[0].as_str();
    let one = |flag: &str| {
        let v = flag_values(&args, flag);
        assert_eq!(v.len(), 1, "{what}: {flag} given {v:?}: TLS is the default");
        v[0].clone()
    };

    // Mutual TLS, the files from a Secret volume a Certificate of the build writes.
    let files = [one("--tls-cert"), one("--tls-key"), one("--client-ca")];
    let sans = flag_values(&args, "--client-san");
    assert!(
        !sans.is_empty(),
        "{what}: no --client-san: any client of the CA gets in"
    );
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| {
            m.iter().find(|m| {
                let dir = m["mountPath"].as_str().unwrap_or_default();
                files
                    .iter()
                    .all(|f| Path::new(f).parent() == Some(Path::new(dir)))
            })
        })
        .unwrap_or_else(|| panic!("{what}: {files:?} are not in one mounted volume"));
    let names: Vec<&str> = files
        .iter()
        .map(|f| f.rsplit('/').next().unwrap())
        .collect();
    assert_eq!(
        names,
        ["tls.crt", "tls.key", "ca.crt"],
        "{what}: the Secret's keys"
    );
    let volume = spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("{what}: no volume {}", mount["name"]));
    let secret = volume["secret"]["secretName"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: the TLS volume is not a Secret"));
    let server = of_kind(docs, "Certificate")
        .find(|c| c["spec"]["secretName"] == secret && c["metadata"]["namespace"] == ns)
        .unwrap_or_else(|| panic!("{what}: no Certificate writes Secret {secret}"));
    assert!(
        strings(&server["spec"]["usages"]).contains(&"server auth".to_string()),
        "{what}"
    );
    let issuer = &server["spec"]["issuerRef"];
    assert!(
        docs.iter()
            .any(|d| d["kind"] == issuer["kind"] && d["metadata"]["name"] == issuer["name"]),
        "{what}: the issuer {issuer} is not in the build"
    );
    // The name clients dial is in the certificate.
    let service = of_kind(docs, "Service")
        .find(|s| s["metadata"]["namespace"] == ns && selects(&s["spec"]["selector"], labels))
        .unwrap_or_else(|| panic!("{what}: no Service selects it"));
    let dns = format!("{}.{ns}.svc", service["metadata"]["name"].as_str().unwrap());
    assert!(
        strings(&server["spec"]["dnsNames"]).contains(&dns),
        "{what}: {dns} not in the server certificate"
    );
    // Each identity let in is a client Certificate of the same issuer.
    for san in &sans {
        assert!(
            of_kind(docs, "Certificate").any(|c| strings(&c["spec"]["uris"]).contains(san)
                && strings(&c["spec"]["usages"]).contains(&"client auth".to_string())
                && c["spec"]["issuerRef"] == *issuer),
            "{what}: no client Certificate of {issuer} for --client-san {san}"
        );
    }

    // A NetworkPolicy admits named clients, to the container's ports only.
    let policy = of_kind(docs, "NetworkPolicy")
        .find(|p| {
            p["metadata"]["namespace"] == ns
                && selects(&p["spec"]["podSelector"]["matchLabels"], labels)
        })
        .unwrap_or_else(|| panic!("{what}: no NetworkPolicy selects it"));
    assert!(strings(&policy["spec"]["policyTypes"]).contains(&"Ingress".to_string()));
    let mut admitted = Vec::new();
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        let from = rule["from"]
            .as_array()
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| panic!("{what}: an ingress rule without `from` admits everyone"));
        for peer in from {
            let named = |sel: &Value| {
                sel["matchLabels"]
                    .as_object()
                    .is_some_and(|m| !m.is_empty())
            };
            assert!(
                named(&peer["namespaceSelector"]) && named(&peer["podSelector"]),
                "{what}: a peer without namespace and pod labels: {peer}"
            );
        }
        let ports = rule["ports"]
            .as_array()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| panic!("{what}: an ingress rule without `ports` opens every port"));
        admitted.extend(ports.iter().map(|p| p["port"].clone()));
    }
    let named: Vec<Value> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].clone())
        .collect();
    assert_eq!(
        admitted.len(),
        named.len(),
        "{what}: admitted {admitted:?}, ports {named:?}"
    );
    assert!(
        named.iter().all(|n| admitted.contains(n)),
        "{what}: admitted {admitted:?}, ports {named:?}"
    );

    // A PodDisruptionBudget, and replicas spread over nodes and zones.
    assert!(
        of_kind(docs, "PodDisruptionBudget").any(|p| p["metadata"]["namespace"] == ns
            && selects(&p["spec"]["selector"]["matchLabels"], labels)
            && p["spec"]["minAvailable"].as_i64().unwrap_or(0) >= 1),
        "{what}: no PodDisruptionBudget keeps a replica"
    );
    assert!(
        dep["spec"]["replicas"].as_i64().unwrap_or(1) >= 2,
        "{what}: one replica"
    );
    let spread: Vec<String> = spec["topologySpreadConstraints"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no topologySpreadConstraints"))
        .iter()
        .filter(|t| selects(&t["labelSelector"]["matchLabels"], labels))
        .map(|t| t["topologyKey"].as_str().unwrap().to_string())
        .collect();
    for key in ["kubernetes.io/hostname", "topology.kubernetes.io/zone"] {
        assert!(
            spread.contains(&key.to_string()),
            "{what}: not spread over {key}"
        );
    }

    // RBAC: the watch it makes. eds: in the --clusters' namespace when they
    // share one (a Role suffices), else cluster-wide; envoy-gateway: cluster-wide.
    let account = spec["serviceAccountName"].as_str().unwrap();
    let cluster_namespaces: std::collections::BTreeSet<String> = flag_values(&args, "--cluster")
        .iter()
        .map(|c| {
            c.split_once('=')
                .unwrap()
                .1
                .split('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let watch_ns = match (mode, cluster_namespaces.len()) {
        ("eds", 1) => cluster_namespaces.iter().next().map(String::as_str),
        _ => None,
    };
    assert!(
        allows_the_watch(docs, ns, account, watch_ns),
        "{what}: {account} cannot list/watch EndpointSlices (watching {watch_ns:?})"
    );

    // Readiness: eds serves nothing before its first list; the hook answers always.
    let ready = container["readinessProbe"]["httpGet"]["path"]
        .as_str()
        .unwrap();
    let want = if mode == "eds" { "/readyz" } else { "/serving" };
    assert_eq!(ready, want, "{what}: readiness");

    // Envoy Gateway waits on the hook without a deadline, and every Envoy's
    // endpoint updates on the eds companion: either is scheduled ahead of
    // ordinary pods, with a PriorityClass of the build.
    let class = spec["priorityClassName"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no priorityClassName"));
    assert!(
        of_kind(docs, "PriorityClass")
            .any(|p| p["metadata"]["name"] == class && p["value"].as_i64().unwrap_or(0) > 0),
        "{what}: PriorityClass {class} not in the build"
    );
}

#[test]
fn every_companion_build_is_secure_by_default() {
    let mut reviewed = Vec::new();
    for (build, docs) in kustomize_builds() {
        for dep in docs.iter().filter(|d| is_companion(d)) {
            review(&build, dep, &docs);
            reviewed.push(build.clone());
        }
    }
    assert_eq!(
        reviewed,
        [
            "deploy/conditions",
            "deploy/conditions-namespaced",
            "deploy/envoy-gateway",
            "deploy/envoy-gateway-native",
            "deploy/envoy-gateway-native-eg1.8"
        ],
        "companion builds reviewed"
    );
    // One PriorityClass serving-picker-critical, the same object in every
    // build that has it (both installs may share a cluster).
    let classes: std::collections::BTreeSet<String> = kustomize_builds()
        .iter()
        .flat_map(|(_, docs)| of_kind(docs, "PriorityClass").cloned().collect::<Vec<_>>())
        .map(|p| p.to_string())
        .collect();
    assert_eq!(classes.len(), 1, "PriorityClasses differ: {classes:?}");
    // The namespaced variant has no ClusterRole left.
    let (_, namespaced) = kustomize_builds()
        .into_iter()
        .find(|(b, _)| b == "deploy/conditions-namespaced")
        .unwrap();
    assert_eq!(of_kind(&namespaced, "ClusterRole").count(), 0);
    assert_eq!(of_kind(&namespaced, "ClusterRoleBinding").count(), 0);
}

/// Envoy Gateway's Helm values are those of a dedicated instance: its own
/// controllerName (the shipped GatewayClass's), one named entry of
/// `extensionManagers`, a watch list of namespaces, and nothing else under
/// `config.envoyGateway`; the chart's crds subchart off, two replicas, a
/// PodDisruptionBudget, a priority class of the build, resources.
/// EnvoyPatchPolicy stays off unless the native form's opt-in file is added,
/// which sets that one key only. The hook is EG's post-Endpoints hook alone
/// (the Translation hook is the native values' addition), fails open, and
/// dials the envoy-gateway-mode companion's Service at its gRPC port as
/// `<service>.<namespace>.svc` (no cluster domain), with an answer size the
/// companion's `--max-message-size` matches. EG trusts a CA-only Secret in
/// its namespace that no shipped object writes (the installer does, from a
/// leaf Secret's ca.crt) and reads its two Secrets through Roles that name
/// them.
#[test]
fn envoy_gateway_values_configure_a_dedicated_instance() {
    let read = |f: &str| -> Value {
        let path = repo().join("deploy/envoy-gateway").join(f);
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let values = read("envoy-gateway-values.yaml");
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&values),
        ["config", "crds", "deployment", "podDisruptionBudget"]
    );
    assert_eq!(values["crds"], serde_json::json!({"enabled": false}));
    assert_eq!(keys(&values["config"]), ["envoyGateway"]);
    let eg = &values["config"]["envoyGateway"];
    assert_eq!(keys(eg), ["extensionManagers", "gateway", "provider"]);
    let controller = eg["gateway"]["controllerName"].as_str().unwrap();
    assert_ne!(controller, "gateway.envoyproxy.io/gatewayclass-controller");
    let class = read("gatewayclass.yaml");
    assert_eq!(class["spec"]["controllerName"], controller);
    let native = read("envoy-gateway-patch-policy-values.yaml");
    assert_eq!(
        native,
        serde_json::json!({"config": {"envoyGateway": {"extensionApis": {"enableEnvoyPatchPolicy": true}}}})
    );
    assert_eq!(eg["extensionManagers"].as_array().unwrap().len(), 1);
    let manager = &eg["extensionManagers"][0];
    assert_eq!(manager["name"], "serving-picker");
    // The base install: PostEndpointsModify only, no Translation hook.
    assert_eq!(
        manager["hooks"]["xdsTranslator"],
        serde_json::json!({"post": ["Endpoints"]})
    );
    assert_eq!(manager["failOpen"], true);
    assert_eq!(manager["maxMessageSize"], "16M");

    let host = manager["service"]["fqdn"]["hostname"].as_str().unwrap();
    let port = manager["service"]["fqdn"]["port"].as_u64().unwrap();
    let mut labels = host.split('.');
    let (name, namespace) = (labels.next().unwrap(), labels.next().unwrap());
    assert_eq!(
        host,
        format!("{name}.{namespace}.svc"),
        "the hook's address with no cluster domain"
    );
    let docs = documents();
    let service = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| {
            d["kind"] == "Service"
                && d["metadata"]["name"] == name
                && d["metadata"]["namespace"] == namespace
        })
        .unwrap_or_else(|| panic!("no Service {namespace}/{name} for EG's {host}"));
    assert!(
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"].as_u64() == Some(port)),
        "Service {namespace}/{name} has no port {port}"
    );
    let companion = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| {
            is_companion(d) && d["metadata"]["namespace"] == namespace && {
                let args = strings(&d["spec"]["template"]["spec"]["containers"][0]["args"]);
                args.first().map(String::as_str) == Some("envoy-gateway")
            }
        })
        .expect("the envoy-gateway-mode companion Deployment");
    let args = strings(&companion["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert_eq!(flag_values(&args, "--max-message-size"), ["16000000"]);

    // Sized and owned like the platform's EG.
    assert_eq!(values["deployment"]["replicas"], 2);
    assert_eq!(values["podDisruptionBudget"]["minAvailable"], 1);
    let (build, built) = kustomize_builds()
        .into_iter()
        .find(|(b, _)| b == "deploy/envoy-gateway")
        .unwrap();
    let priority = values["deployment"]["priorityClassName"].as_str().unwrap();
    assert!(
        of_kind(&built, "PriorityClass").any(|p| p["metadata"]["name"] == priority),
        "{build}: no PriorityClass {priority}"
    );
    assert!(values["deployment"]["envoyGateway"]["resources"]["limits"]["memory"].is_string());

    // Trust without the CA's key: certificateRef is a Secret in EG's
    // namespace, never the CA's own; no shipped object writes it (the
    // installer does, ca-bundle.yaml), so no copier reads Secrets.
    let eg_namespace = "serving-picker-gateway";
    let tls = &manager["service"]["tls"];
    let ca_ref = &tls["certificateRef"];
    assert_eq!(ca_ref["namespace"], eg_namespace);
    assert_ne!(ca_ref["name"], "serving-picker-ca");
    for (build, docs) in kustomize_builds() {
        for d in &docs {
            let api = d["apiVersion"].as_str().unwrap_or_default();
            assert!(
                !api.starts_with("trust.cert-manager.io/"),
                "{build}: a trust-manager object ({}): its Secret targets make it a reader of every Secret",
                d["kind"]
            );
            assert!(
                !(d["kind"] == "Secret" && d["metadata"]["name"] == ca_ref["name"]),
                "{build}: ships the CA bundle's Secret, which a re-apply would overwrite"
            );
        }
    }
    // EG's ServiceAccount may get exactly its two Secrets, by name.
    for (ns, secret) in [
        (
            tls["clientCertificateRef"]["namespace"].as_str().unwrap(),
            tls["clientCertificateRef"]["name"].as_str().unwrap(),
        ),
        (eg_namespace, ca_ref["name"].as_str().unwrap()),
    ] {
        let granted = of_kind(&built, "RoleBinding")
            .filter(|b| b["metadata"]["namespace"] == ns)
            .filter(|b| {
                b["subjects"].as_array().is_some_and(|s| {
                    s.iter()
                        .any(|s| s["name"] == "envoy-gateway" && s["namespace"] == eg_namespace)
                })
            })
            .any(|b| {
                of_kind(&built, "Role")
                    .filter(|r| {
                        r["metadata"]["namespace"] == ns
                            && r["metadata"]["name"] == b["roleRef"]["name"]
                    })
                    .any(|r| {
                        r["rules"].as_array().unwrap().iter().all(|rule| {
                            strings(&rule["resourceNames"]) == [secret.to_string()]
                                && strings(&rule["verbs"]) == ["get".to_string()]
                        })
                    })
            });
        assert!(granted, "{build}: EG may not get {ns}/{secret} by name");
    }
}

/// The native form's overlays (EG 1.9's, EG 1.8's): the base, with the
/// GatewayClass referencing the platform's EnvoyProxy (which the base
/// applies, inert, in a namespace EG watches, and which mounts the module of
/// that EG minor's Envoy and leaves EG's own Envoy image in place), the
/// companion on `--native-lb-policy`, and the admission policy that keeps a
/// Gateway of the class on that EnvoyProxy; the base alone has none of them.
#[test]
fn the_native_overlay_mounts_the_module_class_wide_and_turns_the_policy_on() {
    let builds = kustomize_builds();
    let build = |name: &str| {
        builds
            .iter()
            .find(|(b, _)| b == name)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("{name} not built"))
    };
    let companion_args = |docs: &[Value]| {
        let d = docs
            .iter()
            .find(|d| {
                d["kind"] == "Deployment" && d["metadata"]["name"] == "serving-picker-conditions-eg"
            })
            .unwrap();
        strings(&d["spec"]["template"]["spec"]["containers"][0]["args"])
    };
    let class = |docs: &[Value]| {
        docs.iter()
            .find(|d| d["kind"] == "GatewayClass")
            .cloned()
            .unwrap()
    };
    let base = build("deploy/envoy-gateway");
    assert!(!companion_args(&base).contains(&"--native-lb-policy".to_string()));
    assert!(class(&base)["spec"].get("parametersRef").is_none());
    assert_eq!(of_kind(&base, "ValidatingAdmissionPolicy").count(), 0);
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("deploy/envoy-gateway/envoy-gateway-values.yaml"))
            .unwrap(),
    )
    .unwrap();
    let watched =
        strings(&values["config"]["envoyGateway"]["provider"]["kubernetes"]["watch"]["namespaces"]);
    for (name, envoy_minor) in [
        ("deploy/envoy-gateway-native", "1.39"),
        ("deploy/envoy-gateway-native-eg1.8", "1.38"),
    ] {
        let native = build(name);
        assert!(companion_args(&native).contains(&"--native-lb-policy".to_string()));
        let r = &class(&native)["spec"]["parametersRef"];
        assert_eq!(
            (&r["group"], &r["kind"]),
            (
                &Value::from("gateway.envoyproxy.io"),
                &Value::from("EnvoyProxy")
            )
        );
        let proxy = native
            .iter()
            .find(|d| {
                d["kind"] == "EnvoyProxy"
                    && d["metadata"]["name"] == r["name"]
                    && d["metadata"]["namespace"] == r["namespace"]
            })
            .unwrap_or_else(|| {
                panic!("{name}: the EnvoyProxy the GatewayClass names is not in the build: {r}")
            });
        // EG reads the class's EnvoyProxy through the cache of the watched
        // namespaces only.
        let ns = r["namespace"].as_str().unwrap();
        assert!(
            watched.iter().any(|w| w == ns),
            "{name}: the EnvoyProxy's namespace {ns} is not in watch.namespaces {watched:?}: the class would be Accepted=False"
        );
        let k8s = &proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"];
        // EG's own Envoy: no image pinned here.
        assert!(
            k8s["container"].get("image").is_none(),
            "{name}: the EnvoyProxy pins an Envoy image: {}",
            k8s["container"]["image"]
        );
        let env = k8s["container"]["env"].as_array().unwrap();
        let path = env
            .iter()
            .find(|e| e["name"] == "ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
            .unwrap()["value"]
            .clone();
        let mount = k8s["container"]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("{name}: nothing mounted at {path}"));
        let volume = k8s["pod"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let module = volume["image"]["reference"].as_str().unwrap();
        assert!(
            module.contains("/serving-picker-native:")
                && module.ends_with(&format!("-envoy{envoy_minor}")),
            "{name}: the module for Envoy {envoy_minor}: {module}"
        );
        // The namespace it lives in is created by the base itself.
        assert!(base
            .iter()
            .any(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == r["namespace"]));
        // A Gateway of the class keeps it: the policy and a Deny binding.
        let policy = of_kind(&native, "ValidatingAdmissionPolicy")
            .next()
            .unwrap_or_else(|| panic!("{name}: no ValidatingAdmissionPolicy"));
        assert!(
            of_kind(&native, "ValidatingAdmissionPolicyBinding")
                .any(|b| b["spec"]["policyName"] == policy["metadata"]["name"]
                    && strings(&b["spec"]["validationActions"]) == ["Deny"]),
            "{name}: the policy is not bound with Deny"
        );
        let class_name = class(&native)["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            strings(
                &policy["spec"]["matchConditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["expression"].clone())
                    .collect::<Value>()
            )
            .iter()
            .any(|e| e.contains(&format!("'{class_name}'"))),
            "{name}: the policy does not select the class {class_name}"
        );
    }
}

/// The Translation hook only where it is used: the base values call
/// PostEndpointsModify alone; the native form's values file repeats the
/// base's one extensionManagers entry (Helm replaces a list as a whole)
/// with exactly `Translation` added to `post` and the clusters-only
/// `translation` block, and sets nothing else.
#[test]
fn the_translation_hook_is_the_native_values_alone() {
    let read = |f: &str| -> Value {
        let path = repo().join("deploy/envoy-gateway").join(f);
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let base = read("envoy-gateway-values.yaml");
    let native = read("envoy-gateway-native-values.yaml");
    let base_managers = &base["config"]["envoyGateway"]["extensionManagers"];
    let posts = |v: &Value| strings(&v[0]["hooks"]["xdsTranslator"]["post"]);
    assert_eq!(posts(base_managers), ["Endpoints"]);
    assert!(base_managers[0]["hooks"]["xdsTranslator"]
        .get("translation")
        .is_none());
    assert_eq!(
        native,
        serde_json::json!({"config": {"envoyGateway": {"extensionManagers": native["config"]["envoyGateway"]["extensionManagers"].clone()}}}),
        "the native values set extensionManagers only"
    );
    let mut native_managers = native["config"]["envoyGateway"]["extensionManagers"].clone();
    assert_eq!(posts(&native_managers), ["Endpoints", "Translation"]);
    // PostTranslateModify gets the clusters only: never the Gateways'
    // secrets (EG sends clusters and secrets unless told otherwise).
    assert_eq!(
        native_managers[0]["hooks"]["xdsTranslator"]["translation"],
        serde_json::json!({
            "cluster": {"includeAll": true},
            "secret": {"includeAll": false},
            "listener": {"includeAll": false},
            "route": {"includeAll": false},
        })
    );
    let hooks = native_managers[0]["hooks"]["xdsTranslator"]
        .as_object_mut()
        .unwrap();
    hooks.remove("translation");
    hooks.insert("post".into(), serde_json::json!(["Endpoints"]));
    assert_eq!(
        &native_managers, base_managers,
        "the native entry differs from the base's in more than the Translation hook"
    );
}

// Who can read the CA's key: RBAC evaluated over the shipped builds, Envoy
// Gateway's chart RBAC at each claimed tag rendered with the shipped values,
// and cert-manager's controller. helm is not available offline: the EG
// chart's RBAC templates are vendored verbatim (platforms/eg-chart/<tag>/
// templates/, their source and commit on the first line) and rendered here
// by reading them: `define` blocks of _rbac.tpl resolved, the branch of
// envoy-gateway-rbac.yaml on watch.namespaces taken as Helm takes it (the
// test checks the template has that shape), and every other conditional
// (topology injector, GatewayNamespace mode) taken as true, which can only
// add readers.

/// A grant of Secret reading: who, where (None: every namespace), and
/// which names (empty: all).
#[derive(Debug, Clone)]
struct SecretGrant {
    subject: String,
    namespace: Option<String>,
    names: Vec<String>,
}

/// A rule lets its holder read Secrets (get, list or watch: list and watch
/// return the data too).
fn reads_secrets(rule: &Value) -> bool {
    let has = |key: &str, want: &[&str]| {
        strings(&rule[key])
            .iter()
            .any(|v| v == "*" || want.contains(&v.as_str()))
    };
    has("apiGroups", &[""])
        && has("resources", &["secrets"])
        && has("verbs", &["get", "list", "watch"])
}

/// Every Secret-reading grant the RBAC objects of `docs` make.
fn secret_grants(docs: &[Value]) -> Vec<SecretGrant> {
    assert!(
        docs.iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .all(|d| d.get("aggregationRule").is_none()),
        "an aggregated ClusterRole: not modelled here"
    );
    let rules_of = |kind: &str, name: &Value, ns: Option<&Value>| -> Vec<Value> {
        docs.iter()
            .filter(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == *name
                    && ns.is_none_or(|n| d["metadata"]["namespace"] == *n)
            })
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .filter(reads_secrets)
            .collect()
    };
    let mut out = Vec::new();
    for b in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        let namespace = (b["kind"] == "RoleBinding").then(|| b["metadata"]["namespace"].clone());
        let rules = match b["roleRef"]["kind"].as_str() {
            Some("Role") => rules_of("Role", &b["roleRef"]["name"], namespace.as_ref()),
            _ => rules_of("ClusterRole", &b["roleRef"]["name"], None),
        };
        for s in b["subjects"].as_array().into_iter().flatten() {
            let subject = match s["kind"].as_str() {
                Some("ServiceAccount") => format!(
                    "ServiceAccount {}/{}",
                    s["namespace"].as_str().unwrap_or("?"),
                    s["name"].as_str().unwrap_or("?")
                ),
                k => format!("{} {}", k.unwrap_or("?"), s["name"].as_str().unwrap_or("?")),
            };
            for rule in &rules {
                out.push(SecretGrant {
                    subject: subject.clone(),
                    namespace: namespace
                        .as_ref()
                        .and_then(|n| n.as_str())
                        .map(str::to_string),
                    names: strings(&rule["resourceNames"]),
                });
            }
        }
    }
    out
}

/// Who may read Secret `namespace/name`.
fn readers(
    grants: &[SecretGrant],
    namespace: &str,
    name: &str,
) -> std::collections::BTreeSet<String> {
    grants
        .iter()
        .filter(|g| g.namespace.as_deref().is_none_or(|n| n == namespace))
        .filter(|g| g.names.is_empty() || g.names.iter().any(|n| n == name))
        .map(|g| g.subject.clone())
        .collect()
}

/// The `define` blocks of a chart's _rbac.tpl: name -> rules (a composite
/// block's includes resolved; its `if` lines taken as true).
fn chart_defines(text: &str) -> std::collections::BTreeMap<String, Vec<Value>> {
    let mut raw: Vec<(String, Vec<String>)> = Vec::new();
    let mut depth = 0usize;
    for line in text.lines() {
        let t = line.trim();
        if depth == 0 {
            if let Some(rest) = t.strip_prefix("{{- define \"") {
                raw.push((rest.split('"').next().unwrap().to_string(), Vec::new()));
                depth = 1;
            }
            continue;
        }
        if t.starts_with("{{- if") || t.starts_with("{{ if") || t.starts_with("{{- with") {
            depth += 1;
            continue;
        }
        if t.starts_with("{{- end") || t.starts_with("{{ end") {
            depth -= 1;
            continue;
        }
        raw.last_mut().unwrap().1.push(line.to_string());
    }
    let mut out = std::collections::BTreeMap::new();
    // Leaves first, then the blocks made of includes (one level, as _rbac.tpl has).
    for (name, lines) in &raw {
        if lines.iter().any(|l| l.contains("{{ include")) {
            continue;
        }
        let body: Value = serde_saphyr::from_str(&lines.join("\n")).unwrap_or(Value::Null);
        let rules = match body {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => vec![other],
        };
        out.insert(name.clone(), rules);
    }
    for (name, lines) in &raw {
        let includes: Vec<String> = lines
            .iter()
            .filter_map(|l| l.split("{{ include \"").nth(1))
            .map(|r| r.split('"').next().unwrap().to_string())
            .collect();
        if includes.is_empty() {
            continue;
        }
        let rules = includes
            .iter()
            .flat_map(|i| {
                out.get(i)
                    .cloned()
                    .unwrap_or_else(|| panic!("_rbac.tpl: {name} includes unknown {i}"))
            })
            .collect();
        out.insert(name.clone(), rules);
    }
    out
}

/// EG's chart RBAC at `tag`, rendered for release namespace `eg_ns` and
/// `watch.namespaces` `watched` (empty: unset).
fn eg_chart_rbac(tag: &str, eg_ns: &str, watched: &[String]) -> Vec<Value> {
    let dir = repo()
        .join("platforms/eg-chart")
        .join(tag)
        .join("templates");
    let read =
        |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{tag} {f}: {e}"));
    let defines = chart_defines(&read("_rbac.tpl"));
    let rules = |name: &str| -> Value {
        Value::from(
            defines
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("{tag}: no define {name}")),
        )
    };
    let sa = serde_json::json!([{"kind": "ServiceAccount", "name": "envoy-gateway", "namespace": eg_ns}]);
    let mut out = Vec::new();
    // envoy-gateway-rbac.yaml: a Role per watched namespace with the
    // namespaced rules and a ClusterRole with the cluster ones; else one
    // ClusterRole with both. Its shape is checked, not assumed.
    let main = read("envoy-gateway-rbac.yaml");
    for marker in [
        "{{ range $_, $ns := $watchedNamespaces }}",
        "namespace: {{ $ns | quote }}",
        "rules:\n{{ include \"eg.rbac.namespaced\" $ }}",
        "rules:\n{{ include \"eg.rbac.cluster\" . }}\n---",
        "{{ else }}",
        "rules:\n{{ include \"eg.rbac.cluster\" . }}\n{{ include \"eg.rbac.namespaced\" . }}",
    ] {
        assert!(
            main.contains(marker),
            "EG {tag} envoy-gateway-rbac.yaml changed shape: no {marker:?}"
        );
    }
    if watched.is_empty() {
        let mut all = rules("eg.rbac.cluster").as_array().unwrap().clone();
        all.extend(rules("eg.rbac.namespaced").as_array().unwrap().clone());
        out.push(
            serde_json::json!({"kind": "ClusterRole", "metadata": {"name": "eg"}, "rules": all}),
        );
    } else {
        for ns in watched {
            out.push(serde_json::json!({"kind": "Role", "metadata": {"name": "eg", "namespace": ns}, "rules": rules("eg.rbac.namespaced")}));
            out.push(serde_json::json!({"kind": "RoleBinding", "metadata": {"name": "eg", "namespace": ns},
                "roleRef": {"kind": "Role", "name": "eg"}, "subjects": sa}));
        }
        out.push(serde_json::json!({"kind": "ClusterRole", "metadata": {"name": "eg"}, "rules": rules("eg.rbac.cluster")}));
    }
    out.push(
        serde_json::json!({"kind": "ClusterRoleBinding", "metadata": {"name": "eg"},
        "roleRef": {"kind": "ClusterRole", "name": "eg"}, "subjects": sa}),
    );
    // The other RBAC templates: every Role and ClusterRole in them, their
    // includes resolved and every conditional taken, bound as written.
    for file in [
        "infra-manager-rbac.yaml",
        "namespaced-infra-manager-rbac.yaml",
        "leader-election-rbac.yaml",
        "certgen-rbac.yaml",
    ] {
        let text = read(file);
        for chunk in text.split("\n---") {
            let kind = chunk
                .lines()
                .find_map(|l| l.strip_prefix("kind: "))
                .map(str::trim);
            let Some(kind) = kind else { continue };
            let mut yaml = Vec::new();
            let mut included = Vec::new();
            for line in chunk.lines() {
                let t = line.trim();
                if let Some(rest) = t.strip_prefix("{{ include \"") {
                    included.push(rest.split('"').next().unwrap().to_string());
                    continue;
                }
                if t.starts_with("{{") {
                    continue;
                }
                // Names: the template's text, the same in a Role and its
                // binding; the namespace: the release's (or, in the
                // GatewayNamespace-mode file, each watched one: taken as
                // the release's, where the CA's key is not either way).
                let line = line
                    .replace("{{ include \"eg.namespace\" . }}", eg_ns)
                    .replace("{{ include \"eg.namespace\" $ }}", eg_ns)
                    .replace("{{ $ns | quote }}", eg_ns)
                    .replace('$', ".")
                    .replace("{{", "<")
                    .replace("}}", ">");
                yaml.push(line);
            }
            let mut doc: Value = serde_saphyr::from_str(&yaml.join("\n"))
                .unwrap_or_else(|e| panic!("EG {tag} {file}: {e}\n{}", yaml.join("\n")));
            if doc.is_null() {
                continue;
            }
            if kind == "Role" || kind == "ClusterRole" {
                let mut all = doc["rules"].as_array().cloned().unwrap_or_default();
                for i in &included {
                    all.extend(
                        defines
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| panic!("EG {tag} {file}: unknown {i}")),
                    );
                }
                doc["rules"] = Value::from(all);
            }
            doc["kind"] = Value::from(kind);
            out.push(doc);
        }
    }
    out
}

/// The readers of the CA's key Secret (serving-picker/serving-picker-ca),
/// from every shipped build, EG's chart RBAC at each claimed tag with the
/// shipped values (platforms/eg-chart), and cert-manager's controller
/// (platforms/cert-manager-chart): cert-manager's ServiceAccount alone. The
/// same computation finds EG's ServiceAccount among them when
/// watch.namespaces is unset or lists serving-picker, and finds the
/// chart's Secret rule at all (so the model reads the templates).
#[test]
fn only_cert_manager_can_read_the_ca_key() {
    let (ca_ns, ca_secret) = ("serving-picker", "serving-picker-ca");
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("deploy/envoy-gateway/envoy-gateway-values.yaml"))
            .unwrap(),
    )
    .unwrap();
    let watch = &values["config"]["envoyGateway"]["provider"]["kubernetes"]["watch"];
    assert_eq!(
        watch["type"], "Namespaces",
        "a NamespaceSelector renders the cluster-wide ClusterRole"
    );
    let watched = strings(&watch["namespaces"]);
    let eg_ns = "serving-picker-gateway";
    let cert_manager: Vec<Value> = serde_saphyr::from_multiple(
        &std::fs::read_to_string(
            repo().join("platforms/cert-manager-chart/v1.21.1/controller-issuers.rbac.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut shipped = Vec::new();
    for (_, docs) in kustomize_builds() {
        shipped.extend(docs);
    }
    let eg_sa = format!("ServiceAccount {eg_ns}/envoy-gateway");
    let want: std::collections::BTreeSet<String> =
        ["ServiceAccount cert-manager/cert-manager".to_string()].into();
    for tag in ["v1.8.3", "v1.9.0"] {
        let mut docs = shipped.clone();
        docs.extend(cert_manager.clone());
        docs.extend(eg_chart_rbac(tag, eg_ns, &watched));
        let grants = secret_grants(&docs);
        let who = readers(&grants, ca_ns, ca_secret);
        println!("EG {tag}, watch.namespaces {watched:?}: readers of {ca_ns}/{ca_secret}: {who:?}");
        assert_eq!(who, want, "EG {tag}: who can read {ca_ns}/{ca_secret}");
        // EG reads what it must: its client certificate and the CA bundle.
        assert!(readers(&grants, ca_ns, "serving-picker-eg-client").contains(&eg_sa));
        assert!(readers(&grants, eg_ns, "serving-picker-ca-bundle").contains(&eg_sa));
        // The same model, values changed: EG becomes a reader.
        for other in [
            Vec::new(),
            [watched.clone(), vec![ca_ns.to_string()]].concat(),
        ] {
            let mut docs = shipped.clone();
            docs.extend(eg_chart_rbac(tag, eg_ns, &other));
            let who = readers(&secret_grants(&docs), ca_ns, ca_secret);
            assert!(
                who.contains(&eg_sa),
                "EG {tag}, watch.namespaces {other:?}: {who:?}"
            );
        }
    }
}
