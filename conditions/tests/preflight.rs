//! `serving-picker-conditions preflight` (the real binary) against an API
//! server double: a small HTTP server of our own that answers the reads the
//! preflight makes (version, SubjectAccessReviews, CRDs, Envoy Gateway's
//! ConfigMaps and Deployment, Secrets, labelled Services) with objects
//! built from k8s-openapi's types, through a kubeconfig as a user's.
//! A cluster ready for each mode passes; each way it can be wrong fails (or
//! warns) on its own line, with the fix.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::ByteString;
use serde_json::{json, Value};

/// Answers by `METHOD path` (query string dropped); 404 otherwise.
#[derive(Clone, Default)]
struct FakeApi {
    routes: Arc<Mutex<BTreeMap<String, Value>>>,
    /// SubjectAccessReview verbs allowed.
    allowed: Arc<Mutex<Vec<String>>>,
}

impl FakeApi {
    fn set(&self, key: &str, body: Value) {
        self.routes.lock().unwrap().insert(key.into(), body);
    }

    fn remove(&self, key: &str) {
        self.routes.lock().unwrap().remove(key);
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
            let path = target.split('?').next().unwrap_or_default();
            let (status, answer) = if method == "POST"
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
                match self.routes.lock().unwrap().get(&format!("{method} {path}")) {
                    Some(v) => (200, v.clone()),
                    None => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": format!("{path} not found"), "reason": "NotFound", "code": 404}),
                    ),
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

struct Pki {
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
    ca_key: String,
}

impl Pki {
    fn new() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "serving-picker-ca");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            ca_key: key.serialize_pem(),
            ca: rcgen::Issuer::new(params, key),
        }
    }

    /// (cert, key) PEM for `sans` (DNS names, or URIs when they have ://),
    /// valid from `days.0` to `days.1` days from now.
    fn leaf(&self, sans: &[&str], days: (i64, i64)) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans
            .iter()
            .map(|s| {
                if s.contains("://") {
                    rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*s).unwrap())
                } else {
                    rcgen::SanType::DnsName(rcgen::string::Ia5String::try_from(*s).unwrap())
                }
            })
            .collect();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(days.0);
        params.not_after = now + time::Duration::days(days.1);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn secret(ns: &str, name: &str, cert: &str, key: &str, ca: &str) -> Value {
    let data: BTreeMap<String, ByteString> = [("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let mut s = Secret {
        data: Some(data),
        type_: Some("kubernetes.io/tls".into()),
        ..Secret::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    serde_json::to_value(s).unwrap()
}

fn crd(name: &str, version: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/version": version}},
        "spec": {"group": name.split_once('.').unwrap().1, "scope": "Namespaced",
                 "names": {"plural": name.split('.').next().unwrap(), "kind": "X"},
                 "versions": []}})
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

/// The shipped values' EnvoyGateway document (what the chart writes).
fn shipped_eg_doc() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/envoy-gateway/envoy-gateway-values.yaml");
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    values["config"]["envoyGateway"].clone()
}

/// A cluster ready for `mode` ("eds" or "envoy-gateway").
fn ready_cluster(mode: &str) -> (FakeApi, Pki) {
    let api = FakeApi::default();
    *api.allowed.lock().unwrap() = vec!["list".into(), "watch".into()];
    api.set(
        "GET /version",
        json!({"major": "1", "minor": "33", "gitVersion": "v1.33.2", "gitCommit": "x",
               "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
               "compiler": "gc", "platform": "linux/amd64"}),
    );
    for name in [
        "certificates.cert-manager.io",
        "issuers.cert-manager.io",
        "gatewayclasses.gateway.networking.k8s.io",
        "envoyproxies.gateway.envoyproxy.io",
    ] {
        api.set(
            &format!("GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"),
            crd(name, "v1.20.3"),
        );
    }
    let pki = Pki::new();
    let ns = "serving-picker";
    let put = |name: &str, (cert, key): (String, String)| {
        api.set(
            &format!("GET /api/v1/namespaces/{ns}/secrets/{name}"),
            secret(ns, name, &cert, &key, &pki.ca_pem),
        );
    };
    put(
        "serving-picker-ca",
        (pki.ca_pem.clone(), pki.ca_key.clone()),
    );
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
        pki.leaf(
            &[
                &format!("{server}.{ns}.svc"),
                &format!("{server}.{ns}.svc.cluster.local"),
            ],
            (-1, 90),
        ),
    );
    put(client, pki.leaf(&[&id], (-1, 90)));
    let mut svc = Service::default();
    svc.metadata.name = Some("web".into());
    svc.metadata.namespace = Some("shop".into());
    api.set(
        "GET /api/v1/services",
        json!({"apiVersion": "v1", "kind": "ServiceList", "metadata": {}, "items": [serde_json::to_value(svc).unwrap()]}),
    );
    api.set(
        "GET /api/v1/namespaces/serving-picker-gateway/configmaps/envoy-gateway-config",
        eg_config_map("serving-picker-gateway", &shipped_eg_doc()),
    );
    api.set(
        "GET /api/v1/namespaces/envoy-gateway-system/configmaps/envoy-gateway-config",
        eg_config_map(
            "envoy-gateway-system",
            &json!({"gateway": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"}}),
        ),
    );
    api.set(
        "GET /apis/apps/v1/namespaces/serving-picker-gateway/deployments/envoy-gateway",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "envoy-gateway"},
               "spec": {"selector": {}, "template": {"spec": {"containers": [
                   {"name": "envoy-gateway", "image": "docker.io/envoyproxy/gateway:v1.9.0"}]}}}}),
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

#[test]
fn a_ready_cluster_passes_in_both_modes() {
    for mode in ["eds", "envoy-gateway"] {
        let (api, _pki) = ready_cluster(mode);
        let (passed, out) = preflight(&api, mode);
        println!("--- {mode}\n{out}");
        assert!(passed, "{mode}:\n{out}");
        assert!(
            !out.contains("FAIL") && !out.contains("warn "),
            "{mode}:\n{out}"
        );
        assert!(has_line(&out, "ok", "api", "v1.33.2"), "{out}");
        assert!(has_line(&out, "ok", "rbac", "may watch"), "{out}");
        assert!(has_line(&out, "ok", "services", "shop/web"), "{out}");
        assert!(
            has_line(&out, "ok", "certificate", "issued by the CA"),
            "{out}"
        );
        if mode == "envoy-gateway" {
            assert!(
                has_line(&out, "ok", "eg-confined", "does not call"),
                "{out}"
            );
            assert!(has_line(&out, "ok", "eg-version", "v1.9.0"), "{out}");
        }
    }
}

#[test]
fn each_problem_fails_on_its_own_line_with_the_fix() {
    let (api, pki) = ready_cluster("envoy-gateway");
    // RBAC: watch not allowed.
    *api.allowed.lock().unwrap() = vec!["list".into()];
    // cert-manager missing.
    api.remove(
        "GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/certificates.cert-manager.io",
    );
    // The companion's certificate expired; the client's key from another pair.
    let (old, old_key) = pki.leaf(
        &["serving-picker-conditions-eg.serving-picker.svc"],
        (-30, -1),
    );
    api.set(
        "GET /api/v1/namespaces/serving-picker/secrets/serving-picker-conditions-eg-tls",
        secret(
            "serving-picker",
            "serving-picker-conditions-eg-tls",
            &old,
            &old_key,
            &pki.ca_pem,
        ),
    );
    let (cert, _) = pki.leaf(
        &["spiffe://cluster.local/ns/serving-picker-gateway/sa/envoy-gateway"],
        (-1, 90),
    );
    let (_, other_key) = pki.leaf(&["x"], (-1, 90));
    api.set(
        "GET /api/v1/namespaces/serving-picker/secrets/serving-picker-eg-client",
        secret(
            "serving-picker",
            "serving-picker-eg-client",
            &cert,
            &other_key,
            &pki.ca_pem,
        ),
    );
    // The platform's EG carries the hook too.
    api.set(
        "GET /api/v1/namespaces/envoy-gateway-system/configmaps/envoy-gateway-config",
        eg_config_map("envoy-gateway-system", &shipped_eg_doc()),
    );
    // No Service labelled.
    api.set(
        "GET /api/v1/services",
        json!({"apiVersion": "v1", "kind": "ServiceList", "metadata": {}, "items": []}),
    );
    let (passed, out) = preflight(&api, "envoy-gateway");
    println!("{out}");
    assert!(!passed, "{out}");
    for (level, check, needle) in [
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
        ("FAIL", "eg-confined", "the platform's EG"),
        ("warn", "services", "no Service is labelled"),
    ] {
        assert!(
            has_line(&out, level, check, needle),
            "missing {level} {check} {needle}:\n{out}"
        );
    }
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
