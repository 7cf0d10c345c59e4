//! `serving-picker-conditions preflight` (the real binary) against an API
//! server double: a small HTTP server of our own that answers the reads the
//! preflight makes (version, SubjectAccessReviews, CRDs, Envoy Gateway's
//! ConfigMaps, Deployments listed in every namespace with their label
//! selector applied, GatewayClasses, EnvoyProxies, Secrets, labelled
//! Services) with objects built from k8s-openapi's types, through a
//! kubeconfig as a user's. It records every request, so what the preflight
//! never reads (the CA's key) is checked too. A cluster ready for each mode
//! passes; each way it can be wrong fails (or warns) on its own line, with
//! the fix; a look it cannot take is said, never skipped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::ByteString;
use pki::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use serde_json::{json, Value};

use pki::{Ca, Leaf};

const DIGEST: &str = "sha256:4f0a1c6e3d2b9a8877665544332211ffeeddccbbaa00998877665544332211ff";

/// Answers by `METHOD path` (a list's `labelSelector` applied to its items);
/// 404 otherwise, or the status set for the path.
#[derive(Clone, Default)]
struct FakeApi {
    routes: Arc<Mutex<BTreeMap<String, Value>>>,
    /// Paths answered with this status instead (e.g. 403 Forbidden).
    statuses: Arc<Mutex<BTreeMap<String, u16>>>,
    /// SubjectAccessReview verbs allowed.
    allowed: Arc<Mutex<Vec<String>>>,
    /// Every `METHOD path` asked, in order.
    seen: Arc<Mutex<Vec<String>>>,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// The items of a list kept by a label selector of `k=v` and `k` terms.
fn select(list: &Value, selector: &str) -> Value {
    let mut list = list.clone();
    let keep = |item: &Value| {
        selector.split(',').filter(|t| !t.is_empty()).all(|term| {
            let labels = &item["metadata"]["labels"];
            match term.split_once('=') {
                Some((k, v)) => labels[k] == v,
                None => labels.get(term).is_some(),
            }
        })
    };
    if let Some(items) = list["items"].as_array_mut() {
        items.retain(keep);
    }
    list
}

impl FakeApi {
    fn set(&self, key: &str, body: Value) {
        self.routes.lock().unwrap().insert(key.into(), body);
    }

    fn remove(&self, key: &str) {
        self.routes.lock().unwrap().remove(key);
    }

    fn status(&self, key: &str, code: u16) {
        self.statuses.lock().unwrap().insert(key.into(), code);
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    fn start(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let api = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let api = api.clone();
                std::thread::spawn(move || api.serve(stream));
            }
        });
        url
    }

    fn serve(&self, stream: std::net::TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut out = stream;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let mut parts = line.split_whitespace();
            let method = parts.next().unwrap_or_default().to_string();
            let target = parts.next().unwrap_or_default().to_string();
            let mut length = 0;
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                if h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let key = format!("{method} {path}");
            self.seen.lock().unwrap().push(key.clone());
            let selector = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("labelSelector="))
                .map(percent_decode);
            let failure = |code: u16, reason: &str| {
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": format!("{path} {reason}"), "reason": reason, "code": code})
            };
            let forced = self.statuses.lock().unwrap().get(&key).copied();
            let (status, answer) = if let Some(code) = forced {
                (code, failure(code, "Forbidden"))
            } else if method == "POST"
                && path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
            {
                let mut review: Value = serde_json::from_slice(&body).unwrap();
                let verb = review["spec"]["resourceAttributes"]["verb"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let allowed = self.allowed.lock().unwrap().contains(&verb);
                review["status"] = json!({"allowed": allowed});
                (201, review)
            } else {
                match self.routes.lock().unwrap().get(&key) {
                    Some(v) => match &selector {
                        Some(s) => (200, select(v, s)),
                        None => (200, v.clone()),
                    },
                    None => (404, failure(404, "NotFound")),
                }
            };
            let text = answer.to_string();
            let _ = write!(
                out,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                text.len()
            );
        }
    }
}

/// (cert, key) PEM.
fn pair(leaf: Leaf) -> (String, String) {
    (leaf.cert_pem, leaf.key_pem)
}

fn secret_with(ns: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let data: BTreeMap<String, ByteString> = data
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let mut s = Secret {
        data: Some(data),
        ..Secret::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    serde_json::to_value(s).unwrap()
}

fn secret(ns: &str, name: &str, cert: &str, key: &str, ca: &str) -> Value {
    let mut s = secret_with(
        ns,
        name,
        &[("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)],
    );
    s["type"] = json!("kubernetes.io/tls");
    s
}

fn crd(name: &str, version: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/version": version}},
        "spec": {"group": name.split_once('.').unwrap().1, "scope": "Namespaced",
                 "names": {"plural": name.split('.').next().unwrap(), "kind": "X"},
                 "versions": []}})
}

fn crd_path(name: &str) -> String {
    format!("GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
}

fn eg_config_map(ns: &str, eg_doc: &Value) -> Value {
    let mut m = ConfigMap {
        data: Some(BTreeMap::from([(
            "envoy-gateway.yaml".to_string(),
            serde_json::to_string(eg_doc).unwrap(),
        )])),
        ..ConfigMap::default()
    };
    m.metadata.name = Some("envoy-gateway-config".into());
    m.metadata.namespace = Some(ns.into());
    serde_json::to_value(m).unwrap()
}

fn config_path(ns: &str) -> String {
    format!("GET /api/v1/namespaces/{ns}/configmaps/envoy-gateway-config")
}

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": {}, "items": items})
}

/// A Deployment as Envoy Gateway's chart (or Istio's) labels it.
fn deployment(
    ns: &str,
    name: &str,
    labels: Value,
    image: &str,
    replicas: i32,
    env: Value,
) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "namespace": ns, "labels": labels},
           "spec": {"replicas": replicas, "selector": {}, "template": {"spec": {"containers": [
               {"name": name, "image": image, "env": env}]}}}})
}

fn eg_deployment(ns: &str, image: &str, version_label: Option<&str>) -> Value {
    let mut labels =
        json!({"control-plane": "envoy-gateway", "app.kubernetes.io/name": "gateway-helm"});
    if let Some(v) = version_label {
        labels["app.kubernetes.io/version"] = json!(v);
    }
    deployment(ns, "envoy-gateway", labels, image, 2, json!([]))
}

const DEPLOYMENTS: &str = "GET /apis/apps/v1/deployments";
const CLASSES: &str = "GET /apis/gateway.networking.k8s.io/v1/gatewayclasses";
const PROXIES: &str = "GET /apis/gateway.envoyproxy.io/v1alpha1/envoyproxies";
const CA_SECRET: &str = "GET /api/v1/namespaces/serving-picker/secrets/serving-picker-ca";
const BUNDLE: &str =
    "GET /api/v1/namespaces/serving-picker-gateway/secrets/serving-picker-ca-bundle";

fn class(name: &str, controller: &str, envoy_proxy: Option<(&str, &str)>) -> Value {
    let mut spec = json!({"controllerName": controller});
    if let Some((ns, n)) = envoy_proxy {
        spec["parametersRef"] = json!({"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "namespace": ns, "name": n});
    }
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
           "metadata": {"name": name}, "spec": spec})
}

/// An EnvoyProxy, with the native module's image volume or not, and an
/// Envoy image of its own or not.
fn envoy_proxy(ns: &str, name: &str, native: bool, image: Option<&str>) -> Value {
    let mut deployment = json!({});
    if native {
        deployment["pod"] = json!({"volumes": [{"name": "serving-picker-module", "image": {
            "reference": "registry.example.com/serving-picker-native:0.1.0-envoy1.39"}}]});
    }
    if let Some(i) = image {
        deployment["container"] = json!({"image": i});
    }
    json!({"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "EnvoyProxy",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"provider": {"type": "Kubernetes", "kubernetes": {"envoyDeployment": deployment}}}})
}

/// The shipped values' EnvoyGateway document (what the chart writes).
fn shipped_eg_doc() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/envoy-gateway/envoy-gateway-values.yaml");
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    values["config"]["envoyGateway"].clone()
}

fn platform_eg_doc() -> Value {
    json!({"gateway": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"}})
}

/// The Kubernetes version the API server answers.
fn set_version(api: &FakeApi, git: &str) {
    let minor = git.split('.').nth(1).unwrap();
    api.set(
        "GET /version",
        json!({"major": "1", "minor": minor, "gitVersion": git, "gitCommit": "x",
               "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
               "compiler": "gc", "platform": "linux/amd64"}),
    );
}

/// Every EG Deployment (dedicated first) and istiod the double lists.
fn set_deployments(api: &FakeApi, items: Vec<Value>) {
    api.set(DEPLOYMENTS, list("Deployment", "apps/v1", items));
}

/// A cluster ready for `mode` ("eds", "envoy-gateway" or "istio").
fn ready_cluster(mode: &str) -> (FakeApi, Ca) {
    let api = FakeApi::default();
    *api.allowed.lock().unwrap() = vec!["list".into(), "watch".into()];
    set_version(&api, "v1.33.2");
    for name in [
        "certificates.cert-manager.io",
        "issuers.cert-manager.io",
        "gatewayclasses.gateway.networking.k8s.io",
        "envoyproxies.gateway.envoyproxy.io",
        "wasmplugins.extensions.istio.io",
        "envoyfilters.networking.istio.io",
    ] {
        api.set(&crd_path(name), crd(name, "v1.20.3"));
    }
    let pki = Ca::new("serving-picker-ca");
    let ns = "serving-picker";
    // The CA's own Secret is in the cluster (with its key): the preflight
    // must never read it.
    api.set(
        CA_SECRET,
        secret(ns, "serving-picker-ca", &pki.pem, "KEY", &pki.pem),
    );
    let put = |name: &str, (cert, key): (String, String)| {
        api.set(
            &format!("GET /api/v1/namespaces/{ns}/secrets/{name}"),
            secret(ns, name, &cert, &key, &pki.pem),
        );
    };
    let (server, client, id) = if mode == "eds" {
        (
            "serving-picker-conditions",
            "serving-picker-envoy-client",
            "spiffe://cluster.local/ns/default/sa/envoy".to_string(),
        )
    } else {
        (
            "serving-picker-conditions-eg",
            "serving-picker-eg-client",
            "spiffe://cluster.local/ns/serving-picker-gateway/sa/envoy-gateway".to_string(),
        )
    };
    put(
        &format!("{server}-tls"),
        pair(pki.leaf(
            &[
                &format!("{server}.{ns}.svc"),
                &format!("{server}.{ns}.svc.cluster.local"),
            ],
            ServerAuth,
            -1,
            90,
        )),
    );
    put(client, pair(pki.leaf(&[&id], ClientAuth, -1, 90)));
    // The CA-only bundle the installer writes: tls.crt, no key.
    api.set(
        BUNDLE,
        secret_with(
            "serving-picker-gateway",
            "serving-picker-ca-bundle",
            &[("tls.crt", &pki.pem)],
        ),
    );
    let mut svc = Service::default();
    svc.metadata.name = Some("web".into());
    svc.metadata.namespace = Some("shop".into());
    svc.metadata.labels = Some(BTreeMap::from([
        (
            "serving-picker.io/conditions".to_string(),
            "true".to_string(),
        ),
        (
            "istio.io/persistent-session".to_string(),
            "web-session".to_string(),
        ),
    ]));
    api.set(
        "GET /api/v1/services",
        list("Service", "v1", vec![serde_json::to_value(svc).unwrap()]),
    );
    api.set(
        &config_path("serving-picker-gateway"),
        eg_config_map("serving-picker-gateway", &shipped_eg_doc()),
    );
    api.set(
        &config_path("envoy-gateway-system"),
        eg_config_map("envoy-gateway-system", &platform_eg_doc()),
    );
    set_deployments(
        &api,
        vec![
            eg_deployment(
                "serving-picker-gateway",
                "docker.io/envoyproxy/gateway:v1.9.0",
                Some("v1.9.0"),
            ),
            eg_deployment(
                "envoy-gateway-system",
                "docker.io/envoyproxy/gateway:v1.9.0",
                Some("v1.9.0"),
            ),
            deployment(
                "istio-system",
                "istiod",
                json!({"app": "istiod"}),
                "docker.io/istio/pilot:1.30.3",
                2,
                json!([]),
            ),
        ],
    );
    api.set(
        CLASSES,
        list(
            "GatewayClass",
            "gateway.networking.k8s.io/v1",
            vec![
                class(
                    "serving-picker",
                    "gateway.envoyproxy.io/serving-picker",
                    None,
                ),
                class("eg", "gateway.envoyproxy.io/gatewayclass-controller", None),
            ],
        ),
    );
    api.set(
        PROXIES,
        list(
            "EnvoyProxy",
            "gateway.envoyproxy.io/v1alpha1",
            vec![envoy_proxy("default", "serving-picker", true, None)],
        ),
    );
    (api, pki)
}

/// Runs the preflight against `api`: (passed, output).
fn preflight(api: &FakeApi, mode: &str) -> (bool, String) {
    let url = api.start();
    let dir = std::env::temp_dir().join(format!(
        "sp-preflight-{}-{}",
        std::process::id(),
        url.rsplit(':').next().unwrap()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{url}\"}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: u}}\n\
             current-context: fake\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
        .args(["preflight", "--mode", mode, "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn has_line(out: &str, level: &str, check: &str, needle: &str) -> bool {
    out.lines().any(|l| {
        let mut w = l.split_whitespace();
        w.next() == Some(level) && w.next() == Some(check) && l.contains(needle)
    })
}

fn assert_lines(out: &str, want: &[(&str, &str, &str)]) {
    for (level, check, needle) in want {
        assert!(
            has_line(out, level, check, needle),
            "missing `{level} {check} ...{needle}...`:\n{out}"
        );
    }
}

#[test]
fn a_ready_cluster_passes_in_every_mode() {
    for mode in ["eds", "envoy-gateway", "istio"] {
        let (api, _pki) = ready_cluster(mode);
        let (passed, out) = preflight(&api, mode);
        println!("--- {mode}\n{out}");
        assert!(passed, "{mode}:\n{out}");
        assert!(
            !out.contains("FAIL") && !out.contains("warn "),
            "{mode}:\n{out}"
        );
        assert!(has_line(&out, "ok", "api", "v1.33.2"), "{out}");
        match mode {
            "eds" | "envoy-gateway" => {
                assert_lines(
                    &out,
                    &[
                        ("ok", "rbac", "may watch"),
                        ("ok", "services", "shop/web"),
                        ("ok", "trust", "issued by a CA"),
                        (
                            "ok",
                            "versions",
                            "cert-manager v1.20.3 supports Kubernetes 1.32 to 1.35",
                        ),
                    ],
                );
            }
            _ => assert_lines(
                &out,
                &[
                    ("ok", "istio", "istiod istio-system/istiod: Istio 1.30.3"),
                    ("ok", "versions", "supports Kubernetes 1.32 to 1.36"),
                    ("ok", "istio", "PILOT_ENABLE_PERSISTENT_SESSION_FILTER off"),
                    ("ok", "services", "istio.io/persistent-session: shop/web"),
                ],
            ),
        }
        if mode == "envoy-gateway" {
            assert_lines(
                &out,
                &[
                    ("ok", "eg-confined", "envoy-gateway-system/envoy-gateway"),
                    ("ok", "eg-version", "v1.9.0"),
                    ("ok", "versions", "Envoy Gateway v1.9.0 (image tag) supports Kubernetes 1.33 to 1.36"),
                    ("ok", "eg-class", "GatewayClass serving-picker: controller gateway.envoyproxy.io/serving-picker"),
                    ("ok", "eg-watch", "watches serving-picker-gateway, default only"),
                    ("ok", "eg-hook", "dials serving-picker-conditions-eg.serving-picker.svc"),
                    ("ok", "eg-hook", "trusting serving-picker-gateway/serving-picker-ca-bundle"),
                    ("ok", "certificate", "serving-picker-gateway/serving-picker-ca-bundle: CA-only bundle of 1"),
                    ("ok", "trust", "Envoy Gateway's certificateRef"),
                    ("ok", "eg-envoy", "EnvoyProxy default/serving-picker mounts the native module: Envoy 1.39 (the default of Envoy Gateway v1.9.0"),
                ],
            );
        }
        // Never the CA's own Secret: it holds the CA's key.
        assert!(
            !api.seen().iter().any(|s| s == CA_SECRET),
            "{:?}",
            api.seen()
        );
    }
}

#[test]
fn each_problem_fails_on_its_own_line_with_the_fix() {
    let (api, pki) = ready_cluster("envoy-gateway");
    // RBAC: watch not allowed.
    *api.allowed.lock().unwrap() = vec!["list".into()];
    // cert-manager missing.
    api.remove(&crd_path("certificates.cert-manager.io"));
    // The companion's certificate expired; the client's key from another pair.
    let (old, old_key) = pair(pki.leaf(
        &["serving-picker-conditions-eg.serving-picker.svc"],
        ServerAuth,
        -30,
        -1,
    ));
    api.set(
        "GET /api/v1/namespaces/serving-picker/secrets/serving-picker-conditions-eg-tls",
        secret(
            "serving-picker",
            "serving-picker-conditions-eg-tls",
            &old,
            &old_key,
            &pki.pem,
        ),
    );
    let (cert, _) = pair(pki.leaf(
        &["spiffe://cluster.local/ns/serving-picker-gateway/sa/envoy-gateway"],
        ClientAuth,
        -1,
        90,
    ));
    let (_, other_key) = pair(pki.leaf(&["x"], ClientAuth, -1, 90));
    api.set(
        "GET /api/v1/namespaces/serving-picker/secrets/serving-picker-eg-client",
        secret(
            "serving-picker",
            "serving-picker-eg-client",
            &cert,
            &other_key,
            &pki.pem,
        ),
    );
    // The platform's EG carries the hook too.
    api.set(
        &config_path("envoy-gateway-system"),
        eg_config_map("envoy-gateway-system", &shipped_eg_doc()),
    );
    // No Service labelled.
    api.set("GET /api/v1/services", list("Service", "v1", vec![]));
    let (passed, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[
            ("FAIL", "rbac", "may not watch"),
            (
                "FAIL",
                "crd",
                "certificates.cert-manager.io is not installed",
            ),
            (
                "FAIL",
                "certificate",
                "serving-picker-conditions-eg-tls expired",
            ),
            ("FAIL", "certificate", "tls.key does not match"),
            (
                "FAIL",
                "eg-confined",
                "namespace envoy-gateway-system calls the companion",
            ),
            ("warn", "services", "no Service is labelled"),
        ],
    );
    assert!(out.contains("fix: apply the ClusterRole"), "{out}");
    assert!(has_line(&out, "ok", "rbac", "may list"), "{out}");
}

#[test]
fn an_unreachable_api_server_fails_at_once_and_says_where_to_look() {
    let api = FakeApi::default();
    let url = api.start();
    // Nothing answers /version: the double says 404 to everything.
    let _ = url;
    let (passed, out) = preflight(&api, "eds");
    assert!(!passed, "{out}");
    assert!(has_line(&out, "FAIL", "api", "cannot be reached"), "{out}");
    assert!(out.contains("fix: check KUBECONFIG"), "{out}");
}

/// The platform's Envoy Gateway is found wherever it runs (its Deployment's
/// chart label, every namespace), not only in envoy-gateway-system: one in
/// `gateways-prod` that dials the companion fails, naming the namespace.
#[test]
fn the_platform_eg_is_found_in_any_namespace() {
    let (api, _pki) = ready_cluster("envoy-gateway");
    let mut platform = eg_deployment("gateways-prod", "docker.io/envoyproxy/gateway:v1.9.0", None);
    platform["metadata"]["name"] = json!("envoy-gateway");
    set_deployments(
        &api,
        vec![
            eg_deployment(
                "serving-picker-gateway",
                "docker.io/envoyproxy/gateway:v1.9.0",
                None,
            ),
            platform,
        ],
    );
    // The companion's host written with the cluster domain still counts.
    let mut doc = shipped_eg_doc();
    doc["gateway"]["controllerName"] = json!("gateway.envoyproxy.io/gatewayclass-controller");
    doc["extensionManagers"][0]["service"]["fqdn"]["hostname"] =
        json!("serving-picker-conditions-eg.serving-picker.svc.cluster.local");
    api.set(
        &config_path("gateways-prod"),
        eg_config_map("gateways-prod", &doc),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[(
            "FAIL",
            "eg-confined",
            "namespace gateways-prod calls the companion",
        )],
    );
    // envoy-gateway-system holds no EG here, and was not needed.
    assert!(
        !has_line(&out, "ok", "eg-confined", "envoy-gateway-system"),
        "{out}"
    );
}

/// When Deployments cannot be listed in every namespace, the preflight says
/// so and reads the one namespace it was told of; with that unreadable too,
/// it says plainly it could not look, and does not pass the check.
#[test]
fn when_it_cannot_look_for_envoy_gateways_it_says_so() {
    let (api, _pki) = ready_cluster("envoy-gateway");
    api.status(DEPLOYMENTS, 403);
    api.set(
        "GET /apis/apps/v1/namespaces/serving-picker-gateway/deployments/envoy-gateway",
        eg_deployment(
            "serving-picker-gateway",
            "docker.io/envoyproxy/gateway:v1.9.0",
            None,
        ),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert!(passed, "a warning, not a failure:\n{out}");
    assert_lines(
        &out,
        &[
            (
                "warn",
                "eg-confined",
                "could not look for Envoy Gateways in every namespace",
            ),
            (
                "ok",
                "eg-confined",
                "namespace envoy-gateway-system does not call the companion",
            ),
            // The dedicated instance is still read by name.
            ("ok", "eg-version", "v1.9.0"),
        ],
    );
    api.remove(&config_path("envoy-gateway-system"));
    api.remove("GET /apis/apps/v1/namespaces/serving-picker-gateway/deployments/envoy-gateway");
    let (_, out) = preflight(&api, "envoy-gateway");
    assert!(
        has_line(&out, "warn", "eg-confined", "could not look"),
        "{out}"
    );
    assert!(!has_line(&out, "ok", "eg-confined", ""), "{out}");
    // Nor is the dedicated instance's Deployment skipped without a word.
    assert!(
        has_line(
            &out,
            "warn",
            "eg-version",
            "no Envoy Gateway Deployment found in serving-picker-gateway"
        ),
        "{out}"
    );
}

/// A GatewayClass whose Envoy Gateway controller no EG found here serves is
/// named: an EG the label search missed could be calling the companion.
#[test]
fn a_gatewayclass_of_an_eg_not_found_is_named() {
    let (api, _pki) = ready_cluster("envoy-gateway");
    api.set(
        CLASSES,
        list(
            "GatewayClass",
            "gateway.networking.k8s.io/v1",
            vec![
                class(
                    "serving-picker",
                    "gateway.envoyproxy.io/serving-picker",
                    None,
                ),
                class("team-a", "gateway.envoyproxy.io/team-a", None),
                class("other", "example.com/not-envoy-gateway", None),
            ],
        ),
    );
    let (_, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert_lines(
        &out,
        &[(
            "warn",
            "eg-confined",
            "GatewayClass team-a names controller gateway.envoyproxy.io/team-a",
        )],
    );
    assert!(!out.contains("GatewayClass other"), "{out}");
}

/// Digest-pinned images: `repo:tag@sha256:...` reads its tag;
/// `repo@sha256:...` the Deployment's version label; with neither, it says
/// the version cannot be read instead of calling it wrong.
#[test]
fn digest_pinned_eg_images_are_read() {
    for (image, label, level, needle) in [
        (
            format!("docker.io/envoyproxy/gateway:v1.8.3@{DIGEST}"),
            None,
            "ok",
            "Envoy Gateway v1.8.3 (image tag)",
        ),
        (
            format!("docker.io/envoyproxy/gateway@{DIGEST}"),
            Some("v1.9.0"),
            "ok",
            "Envoy Gateway v1.9.0 (the image is pinned by digest; the Deployment's app.kubernetes.io/version)",
        ),
        (
            format!("docker.io/envoyproxy/gateway@{DIGEST}"),
            None,
            "warn",
            "the dedicated Envoy Gateway's version cannot be read",
        ),
        (
            "docker.io/envoyproxy/gateway:v1.7.2".to_string(),
            None,
            "warn",
            "Envoy Gateway v1.7.2 (image tag): serving-picker's hook is checked against 1.8 and 1.9",
        ),
    ] {
        let (api, _pki) = ready_cluster("envoy-gateway");
        set_deployments(
            &api,
            vec![eg_deployment("serving-picker-gateway", &image, label)],
        );
        let (_, out) = preflight(&api, "envoy-gateway");
        println!("--- {image} {label:?}\n{out}");
        let check = if needle.contains("cannot be read") { "versions" } else { "eg-version" };
        assert!(has_line(&out, level, check, needle), "{image}:\n{out}");
    }
}

/// The dedicated EG's controllerName and its GatewayClass's must be one: a
/// class of another controller, or none, fails.
#[test]
fn the_gatewayclass_must_be_the_dedicated_instances() {
    let (api, _pki) = ready_cluster("envoy-gateway");
    api.set(
        CLASSES,
        list(
            "GatewayClass",
            "gateway.networking.k8s.io/v1",
            vec![class(
                "serving-picker",
                "gateway.envoyproxy.io/gatewayclass-controller",
                None,
            )],
        ),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[(
            "FAIL",
            "eg-class",
            "GatewayClass serving-picker names controller gateway.envoyproxy.io/gatewayclass-controller, the dedicated EG is gateway.envoyproxy.io/serving-picker",
        )],
    );
    api.set(
        CLASSES,
        list("GatewayClass", "gateway.networking.k8s.io/v1", vec![]),
    );
    let (_, out) = preflight(&api, "envoy-gateway");
    assert_lines(
        &out,
        &[("FAIL", "eg-class", "no GatewayClass serving-picker")],
    );
}

/// The native module against the Envoy each proxy runs: EG's default per
/// release, the EnvoyProxy of the class, or the EnvoyProxy's own image.
#[test]
fn the_native_module_is_checked_against_eg_envoy() {
    for (eg_image, class_proxy, native_image, level, needle) in [
        // EG 1.8.3's default Envoy is 1.38.
        ("docker.io/envoyproxy/gateway:v1.8.3", None, None, "ok",
         "EnvoyProxy default/serving-picker mounts the native module: Envoy 1.38 (the default of Envoy Gateway v1.8.3"),
        // The EnvoyProxy sets an Envoy the module does not load in.
        ("docker.io/envoyproxy/gateway:v1.9.0", None, Some("docker.io/envoyproxy/envoy:distroless-v1.37.0"), "FAIL",
         "EnvoyProxy default/serving-picker mounts the native module: Envoy 1.37"),
        // One minor after the tested ones: loads with a warning.
        ("docker.io/envoyproxy/gateway:v1.9.0", None, Some("docker.io/envoyproxy/envoy:distroless-v1.41.0"), "warn",
         "Envoy 1.41"),
        // The class's EnvoyProxy sets the image for every proxy of the class.
        ("docker.io/envoyproxy/gateway:v1.9.0", Some("docker.io/envoyproxy/envoy:distroless-v1.40.0"), None, "ok",
         "EnvoyProxy default/serving-picker mounts the native module: Envoy 1.40 (docker.io/envoyproxy/envoy:distroless-v1.40.0)"),
    ] {
        let (api, _pki) = ready_cluster("envoy-gateway");
        set_deployments(&api, vec![eg_deployment("serving-picker-gateway", eg_image, None)]);
        let mut proxies = vec![envoy_proxy("default", "serving-picker", true, native_image)];
        if let Some(image) = class_proxy {
            proxies.push(envoy_proxy("serving-picker-gateway", "class-proxy", false, Some(image)));
            api.set(
                CLASSES,
                list(
                    "GatewayClass",
                    "gateway.networking.k8s.io/v1",
                    vec![class(
                        "serving-picker",
                        "gateway.envoyproxy.io/serving-picker",
                        Some(("serving-picker-gateway", "class-proxy")),
                    )],
                ),
            );
        }
        api.set(PROXIES, list("EnvoyProxy", "gateway.envoyproxy.io/v1alpha1", proxies));
        let (passed, out) = preflight(&api, "envoy-gateway");
        println!("--- {eg_image} {native_image:?}\n{out}");
        assert!(has_line(&out, level, "eg-envoy", needle), "{out}");
        assert_eq!(passed, level != "FAIL", "{out}");
    }
    // No EnvoyProxy mounts the module: the class's Envoy is still judged,
    // as a warning only.
    let (api, _pki) = ready_cluster("envoy-gateway");
    set_deployments(
        &api,
        vec![eg_deployment(
            "serving-picker-gateway",
            "docker.io/envoyproxy/gateway:v1.9.0",
            None,
        )],
    );
    api.set(
        PROXIES,
        list("EnvoyProxy", "gateway.envoyproxy.io/v1alpha1", vec![]),
    );
    let (_, out) = preflight(&api, "envoy-gateway");
    assert!(
        has_line(
            &out,
            "ok",
            "eg-envoy",
            "class serving-picker (native form not mounted by any EnvoyProxy): Envoy 1.39"
        ),
        "{out}"
    );
}

/// Kubernetes minimums per way in, as upstream states them: below the way
/// in's floor fails at `api`; below a found release's range fails on its own
/// line (cert-manager, Envoy Gateway, Istio).
#[test]
fn kubernetes_minimums_are_upstreams_per_way_in() {
    // eds: no supported cert-manager runs below 1.31.
    let (api, _pki) = ready_cluster("eds");
    set_version(&api, "v1.30.4");
    let (passed, out) = preflight(&api, "eds");
    assert!(!passed, "{out}");
    assert_lines(&out, &[("FAIL", "api", "older than 1.31")]);
    // envoy-gateway: EG 1.9 wants 1.33, cert-manager 1.21 too.
    let (api, _pki) = ready_cluster("envoy-gateway");
    set_version(&api, "v1.32.5");
    api.set(
        &crd_path("certificates.cert-manager.io"),
        crd("certificates.cert-manager.io", "v1.21.1"),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[
            ("ok", "api", "v1.32.5"),
            ("FAIL", "versions", "Envoy Gateway v1.9.0 (image tag) supports Kubernetes 1.33 to 1.36 (Envoy Gateway's compatibility matrix), not 1.32"),
            ("FAIL", "versions", "cert-manager v1.21.1 supports Kubernetes 1.33 to 1.36"),
        ],
    );
    // istio: Istio 1.30 wants 1.32; newer than a release's range warns.
    let (api, _pki) = ready_cluster("istio");
    set_version(&api, "v1.31.9");
    let (passed, out) = preflight(&api, "istio");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[(
            "FAIL",
            "versions",
            "Istio (istio-system/istiod) 1.30.3 (image tag) supports Kubernetes 1.32 to 1.36",
        )],
    );
    let (api, _pki) = ready_cluster("istio");
    set_version(&api, "v1.37.0");
    let (_, out) = preflight(&api, "istio");
    assert_lines(&out, &[("warn", "versions", "1.37 is newer")]);
}

/// The dedicated EG's watch list: unset (its chart then reads every Secret)
/// warns, one that lists the CA's namespace warns, and a class's EnvoyProxy
/// outside it fails (EG cannot see it: the class is not accepted).
#[test]
fn eg_watches_its_own_namespaces_and_not_the_cas() {
    let set_doc = |api: &FakeApi, doc: &Value| {
        api.set(
            &config_path("serving-picker-gateway"),
            eg_config_map("serving-picker-gateway", doc),
        );
    };
    let (api, _pki) = ready_cluster("envoy-gateway");
    let mut doc = shipped_eg_doc();
    doc.as_object_mut().unwrap().remove("provider");
    set_doc(&api, &doc);
    let (_, out) = preflight(&api, "envoy-gateway");
    assert_lines(&out, &[("warn", "eg-watch", "watches every namespace")]);

    let mut doc = shipped_eg_doc();
    doc["provider"]["kubernetes"]["watch"]["namespaces"] =
        json!(["serving-picker-gateway", "serving-picker"]);
    set_doc(&api, &doc);
    let (_, out) = preflight(&api, "envoy-gateway");
    assert_lines(
        &out,
        &[("warn", "eg-watch", "watch.namespaces lists serving-picker")],
    );

    let (api, _pki) = ready_cluster("envoy-gateway");
    api.set(
        CLASSES,
        list(
            "GatewayClass",
            "gateway.networking.k8s.io/v1",
            vec![class(
                "serving-picker",
                "gateway.envoyproxy.io/serving-picker",
                Some(("serving-picker", "serving-picker")),
            )],
        ),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[(
            "FAIL",
            "eg-watch",
            "EnvoyProxy serving-picker/serving-picker is outside watch.namespaces",
        )],
    );
}

/// The CA-only bundle Envoy Gateway trusts: a key in it fails, a CA that did
/// not issue the companion's certificate fails (EG would refuse the
/// handshake), and certificateRef naming the CA's own Secret fails.
#[test]
fn eg_trusts_a_ca_only_bundle() {
    let (api, pki) = ready_cluster("envoy-gateway");
    api.set(
        BUNDLE,
        secret_with(
            "serving-picker-gateway",
            "serving-picker-ca-bundle",
            &[("tls.crt", &pki.pem), ("tls.key", "KEY")],
        ),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    assert!(!passed, "{out}");
    assert_lines(&out, &[("FAIL", "secret", "holds a private key (tls.key)")]);

    let other = Ca::new("serving-picker-ca");
    api.set(
        BUNDLE,
        secret_with(
            "serving-picker-gateway",
            "serving-picker-ca-bundle",
            &[("tls.crt", &other.pem)],
        ),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert!(!passed, "{out}");
    // Same subject name, another key: the key identifiers tell them apart.
    assert_lines(
        &out,
        &[("FAIL", "trust", "is not a CA Envoy Gateway's certificateRef (serving-picker-gateway/serving-picker-ca-bundle tls.crt) trusts")],
    );

    let (api, _pki) = ready_cluster("envoy-gateway");
    let mut doc = shipped_eg_doc();
    doc["extensionManagers"][0]["service"]["tls"]["certificateRef"] =
        json!({"kind": "Secret", "name": "serving-picker-ca", "namespace": "serving-picker"});
    api.set(
        &config_path("serving-picker-gateway"),
        eg_config_map("serving-picker-gateway", &doc),
    );
    api.remove(BUNDLE);
    let (passed, out) = preflight(&api, "envoy-gateway");
    assert!(!passed, "{out}");
    assert_lines(
        &out,
        &[
            ("FAIL", "eg-hook", "certificateRef is the CA's own Secret"),
            (
                "FAIL",
                "secret",
                "serving-picker-gateway/serving-picker-ca-bundle is missing",
            ),
        ],
    );
    assert!(
        !api.seen().iter().any(|s| s == CA_SECRET),
        "{:?}",
        api.seen()
    );
}

/// The hook's address written with a cluster domain resolves only on a
/// cluster of that domain: warned, with the `.svc` form as the fix.
#[test]
fn a_hook_address_with_a_cluster_domain_is_warned() {
    let (api, _pki) = ready_cluster("envoy-gateway");
    let mut doc = shipped_eg_doc();
    doc["extensionManagers"][0]["service"]["fqdn"]["hostname"] =
        json!("serving-picker-conditions-eg.serving-picker.svc.cluster.local");
    api.set(
        &config_path("serving-picker-gateway"),
        eg_config_map("serving-picker-gateway", &doc),
    );
    let (_, out) = preflight(&api, "envoy-gateway");
    assert_lines(
        &out,
        &[(
            "warn",
            "eg-hook",
            "dials serving-picker-conditions-eg.serving-picker.svc.cluster.local",
        )],
    );
    assert!(
        out.contains("fix: service.fqdn.hostname: serving-picker-conditions-eg.serving-picker.svc"),
        "{out}"
    );
}

/// Istio: no istiod fails; a release outside 1.28 to 1.31 warns; the
/// session flag, when on, is said to be mesh-wide.
#[test]
fn istio_is_found_and_its_session_flag_explained() {
    let (api, _pki) = ready_cluster("istio");
    set_deployments(&api, vec![]);
    let (passed, out) = preflight(&api, "istio");
    assert!(!passed, "{out}");
    assert_lines(&out, &[("FAIL", "istio", "no istiod found")]);
    set_deployments(
        &api,
        vec![deployment(
            "istio-system",
            "istiod-1-27",
            json!({"app": "istiod"}),
            &format!("docker.io/istio/pilot:1.27.9-distroless@{DIGEST}"),
            1,
            json!([{"name": "PILOT_ENABLE_PERSISTENT_SESSION_FILTER", "value": "true"}]),
        )],
    );
    let (_, out) = preflight(&api, "istio");
    println!("{out}");
    assert_lines(
        &out,
        &[
            ("warn", "istio", "Istio 1.27.9-distroless (image tag): serving-picker's objects are checked against 1.28 to 1.31"),
            ("ok", "istio", "PILOT_ENABLE_PERSISTENT_SESSION_FILTER=true: mesh-wide"),
        ],
    );
}
