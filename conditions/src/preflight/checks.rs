//! What the preflight concludes from what it read: plain functions of the
//! facts, each finding with the fix when it is not ok.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use x509_parser::certificate::X509Certificate;

/// A finding's weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub level: Level,
    pub check: &'static str,
    pub detail: String,
    pub fix: Option<String>,
}

fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        level: Level::Ok,
        check,
        detail: detail.into(),
        fix: None,
    }
}

fn bad(
    level: Level,
    check: &'static str,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        level,
        check,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// The way in being prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Plain Envoy fed by the companion's EDS (`deploy/conditions`).
    Eds,
    /// Envoy Gateway's hook on a dedicated EG instance (`deploy/envoy-gateway`).
    EnvoyGateway,
}

/// A Secret the install needs, and what its certificate must say.
#[derive(Debug, Clone)]
pub struct ExpectedSecret {
    pub name: String,
    /// SANs (DNS names or URIs) the certificate must carry.
    pub sans: Vec<String>,
    /// The CA's own Secret (no chain check against itself).
    pub is_ca: bool,
}

/// What the install expects to find.
#[derive(Debug, Clone)]
pub struct Expect {
    pub mode: Mode,
    /// The companion's namespace.
    pub namespace: String,
    /// The companion's ServiceAccount (RBAC is checked for it).
    pub service_account: String,
    pub secrets: Vec<ExpectedSecret>,
    /// CRDs (name) that must be in the cluster.
    pub crds: Vec<String>,
    /// The dedicated EG instance's namespace (mode envoy-gateway).
    pub eg_namespace: String,
    /// The platform's EG namespace, which must not carry the hook.
    pub platform_eg_namespace: String,
    /// The host name EG must dial.
    pub hook_host: String,
}

/// EG's side, as read.
#[derive(Debug, Default, Clone)]
pub struct EgFacts {
    /// The dedicated instance's EnvoyGateway document, or why it is not there.
    pub dedicated: Option<Result<Value, String>>,
    /// The platform's EnvoyGateway document, when readable.
    pub platform: Option<Value>,
    /// The dedicated instance's controller image (its tag is EG's version).
    pub image: Option<String>,
}

/// Everything the preflight read.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// The API server's gitVersion, or why it could not be read.
    pub api: Option<Result<String, String>>,
    /// (verb, allowed) for the companion's ServiceAccount on EndpointSlices.
    pub rbac: Vec<(String, Result<bool, String>)>,
    /// CRD name -> present (with the version label or annotation it carries).
    pub crds: BTreeMap<String, Option<String>>,
    pub eg: EgFacts,
    /// Secret name -> its data, or None when absent.
    pub secrets: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    /// Services labelled `serving-picker.io/conditions=true`, or why not listed.
    pub labelled_services: Option<Result<Vec<String>, String>>,
}

/// The Kubernetes release serving-picker needs (EndpointSlice `serving`
/// and `terminating` conditions GA, KEP-1672).
const MIN_KUBERNETES_MINOR: u32 = 29;
/// A certificate closer than this to its end is warned about.
const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);
const DEFAULT_CONTROLLER: &str = "gateway.envoyproxy.io/gatewayclass-controller";

/// Every finding, in the order the install needs them.
pub fn judge(expect: &Expect, facts: &Facts, now: SystemTime) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(api(facts));
    for (verb, allowed) in &facts.rbac {
        out.push(match allowed {
            Ok(true) => ok("rbac", format!("{} may {verb} endpointslices", expect.service_account)),
            Ok(false) => bad(
                Level::Fail,
                "rbac",
                format!("{} may not {verb} endpointslices.discovery.k8s.io", expect.service_account),
                "apply the ClusterRole and binding the mode ships (deploy/conditions/rbac.yaml, deploy/envoy-gateway/companion.yaml; deploy/conditions-namespaced/role.yaml for one namespace)",
            ),
            Err(e) => bad(
                Level::Warn,
                "rbac",
                format!("could not ask the API server ({e})"),
                "run the preflight as a user who may create subjectaccessreviews, or check with `kubectl auth can-i list endpointslices --as system:serviceaccount:<ns>:<sa>`",
            ),
        });
    }
    for name in &expect.crds {
        out.push(match facts.crds.get(name) {
            Some(Some(version)) => ok("crd", format!("{name} ({version})")),
            Some(None) | None => bad(
                Level::Fail,
                "crd",
                format!("{name} is not installed"),
                crd_fix(name),
            ),
        });
    }
    if expect.mode == Mode::EnvoyGateway {
        out.extend(envoy_gateway(expect, &facts.eg));
    }
    for s in &expect.secrets {
        out.extend(secret(
            s,
            facts.secrets.get(&s.name).cloned().flatten(),
            &facts.secrets,
            expect,
            now,
        ));
    }
    out.push(match &facts.labelled_services {
        Some(Ok(names)) if !names.is_empty() => ok(
            "services",
            format!(
                "labelled serving-picker.io/conditions=true: {}",
                names.join(", ")
            ),
        ),
        Some(Ok(_)) => bad(
            Level::Warn,
            "services",
            "no Service is labelled serving-picker.io/conditions=true: nothing would be managed",
            "kubectl label service <name> -n <ns> serving-picker.io/conditions=true",
        ),
        Some(Err(e)) => bad(
            Level::Warn,
            "services",
            format!("could not list Services ({e})"),
            "check your kubeconfig's rights to list Services",
        ),
        None => bad(
            Level::Warn,
            "services",
            "not checked",
            "fix the API access first",
        ),
    });
    out
}

fn api(facts: &Facts) -> Finding {
    match &facts.api {
        Some(Ok(version)) => match minor_of(version) {
            Some(m) if m >= MIN_KUBERNETES_MINOR => ok("api", format!("Kubernetes {version}")),
            Some(_) => bad(
                Level::Fail,
                "api",
                format!("Kubernetes {version}: older than 1.{MIN_KUBERNETES_MINOR}"),
                format!("upgrade to Kubernetes 1.{MIN_KUBERNETES_MINOR} or newer (EndpointSlice serving/terminating conditions)"),
            ),
            None => bad(Level::Warn, "api", format!("Kubernetes {version}: version not understood"), "check it is 1.29 or newer"),
        },
        Some(Err(e)) => bad(
            Level::Fail,
            "api",
            format!("the API server cannot be reached: {e}"),
            "check KUBECONFIG / --kubeconfig and its current context",
        ),
        None => bad(Level::Fail, "api", "not checked", "check KUBECONFIG / --kubeconfig"),
    }
}

/// The minor of a gitVersion such as `v1.33.2` or `v1.31.4-eks-1234`.
fn minor_of(version: &str) -> Option<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .nth(1)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

fn crd_fix(name: &str) -> String {
    if name.ends_with("cert-manager.io") {
        "install cert-manager 1.19 to 1.21 (docs/install.md)".into()
    } else if name.ends_with("gateway.envoyproxy.io") || name.ends_with("gateway.networking.k8s.io")
    {
        "install Envoy Gateway 1.8 or 1.9 with its CRDs (helm install eg oci://docker.io/envoyproxy/gateway-helm)".into()
    } else {
        format!("install the CRD {name}")
    }
}

/// The extension manager entries of an EnvoyGateway document.
fn managers(doc: &Value) -> Vec<&Value> {
    let mut v: Vec<&Value> = doc["extensionManagers"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if doc["extensionManager"].is_object() {
        v.push(&doc["extensionManager"]);
    }
    v
}

fn dials(manager: &Value, host: &str) -> bool {
    manager["service"]["fqdn"]["hostname"].as_str() == Some(host)
}

fn envoy_gateway(expect: &Expect, eg: &EgFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    let host = &expect.hook_host;
    if let Some(platform) = &eg.platform {
        if managers(platform).iter().any(|m| dials(m, host)) {
            out.push(bad(
                Level::Fail,
                "eg-confined",
                format!("the platform's EG (namespace {}) calls the companion: a companion it cannot reach stalls every Gateway it serves", expect.platform_eg_namespace),
                "remove serving-picker's extension manager from the platform's EG; run it on the dedicated instance (deploy/envoy-gateway/envoy-gateway-values.yaml)",
            ));
        } else {
            out.push(ok(
                "eg-confined",
                format!(
                    "the platform's EG (namespace {}) does not call the companion",
                    expect.platform_eg_namespace
                ),
            ));
        }
    }
    let doc = match &eg.dedicated {
        Some(Ok(doc)) => doc,
        Some(Err(e)) => {
            out.push(bad(
                Level::Fail,
                "eg-config",
                format!("no dedicated EG configuration in namespace {}: {e}", expect.eg_namespace),
                format!("helm install eg-serving-picker oci://docker.io/envoyproxy/gateway-helm --version <EG version> -n {} --create-namespace --skip-crds -f deploy/envoy-gateway/envoy-gateway-values.yaml", expect.eg_namespace),
            ));
            return out;
        }
        None => return out,
    };
    let controller = doc["gateway"]["controllerName"]
        .as_str()
        .unwrap_or(DEFAULT_CONTROLLER);
    out.push(if controller == DEFAULT_CONTROLLER {
        bad(
            Level::Fail,
            "eg-config",
            format!("the EG in {} uses the default controllerName: it would translate (and stall) the platform's Gateways too", expect.eg_namespace),
            "set config.envoyGateway.gateway.controllerName as envoy-gateway-values.yaml does",
        )
    } else {
        ok("eg-config", format!("controllerName {controller}"))
    });
    let Some(manager) = managers(doc).into_iter().find(|m| dials(m, host)) else {
        out.push(bad(
            Level::Fail,
            "eg-hook",
            format!("no extension manager dials {host}"),
            "use the extensionManagers entry of deploy/envoy-gateway/envoy-gateway-values.yaml",
        ));
        return out;
    };
    let posts: Vec<&str> = manager["hooks"]["xdsTranslator"]["post"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push(if posts.contains(&"Endpoints") {
        ok("eg-hook", format!("post-Endpoints hook to {host}"))
    } else {
        bad(
            Level::Fail,
            "eg-hook",
            "the hook is not `post: [Endpoints]`",
            "hooks.xdsTranslator.post: [Endpoints]",
        )
    });
    out.push(if manager["failOpen"] == Value::Bool(true) {
        ok("eg-hook", "failOpen: true")
    } else {
        bad(
            Level::Warn,
            "eg-hook",
            "failOpen is not true: a hook error holds every xDS update of the class",
            "failOpen: true",
        )
    });
    out.push(if manager["service"]["tls"]["certificateRef"].is_object() {
        ok("eg-hook", "mutual TLS to the companion")
    } else {
        bad(Level::Fail, "eg-hook", "EG dials the companion without TLS", "service.tls.certificateRef and clientCertificateRef as envoy-gateway-values.yaml sets them")
    });
    if let Some(image) = &eg.image {
        let tag = image.rsplit(':').next().unwrap_or_default();
        out.push(if tag.starts_with("v1.8.") || tag.starts_with("v1.9.") {
            ok("eg-version", format!("Envoy Gateway {tag}"))
        } else {
            bad(Level::Warn, "eg-version", format!("Envoy Gateway image {image}: serving-picker's hook is tested against 1.8 and 1.9"), "use Envoy Gateway 1.8 or 1.9")
        });
    }
    out
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn secret(
    s: &ExpectedSecret,
    data: Option<BTreeMap<String, Vec<u8>>>,
    all: &BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    expect: &Expect,
    now: SystemTime,
) -> Vec<Finding> {
    let name = &s.name;
    let Some(data) = data else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{}/{name} is missing", expect.namespace),
            format!("kubectl -n {} get certificate: cert-manager issues it from the shipped Certificates once deploy/cert-manager is applied", expect.namespace),
        )];
    };
    let (Some(crt), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name} has no tls.crt and tls.key"),
            "a kubernetes.io/tls Secret from cert-manager",
        )];
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .filter_map(Result::ok)
        .collect();
    let Some(leaf) = certs.first() else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name}: tls.crt holds no certificate"),
            "re-issue it (delete the Secret; cert-manager writes it again)",
        )];
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name}: tls.crt does not parse"),
            "re-issue it",
        )];
    };
    let mut out = vec![
        expiry(name, &cert, expect, now),
        key_matches(name, &cert, key),
        sans_present(name, &cert, &s.sans),
    ];
    if !s.is_ca {
        out.push(issued_by_ca(name, &cert, all));
    }
    out
}

/// The certificate's validity left: expired, within the warning, or fine.
fn expiry(name: &str, cert: &X509Certificate<'_>, expect: &Expect, now: SystemTime) -> Finding {
    let not_after = cert.validity().not_after.timestamp();
    let left = not_after - unix(now);
    if left <= 0 {
        bad(
            Level::Fail,
            "certificate",
            format!("{name} expired"),
            format!(
                "kubectl -n {} describe certificate: renew it (cmctl renew)",
                expect.namespace
            ),
        )
    } else if left < EXPIRY_WARNING.as_secs() as i64 {
        bad(
            Level::Warn,
            "certificate",
            format!("{name} expires in {} h", left / 3600),
            "check cert-manager renews it (kubectl describe certificate)",
        )
    } else {
        ok(
            "certificate",
            format!("{name} valid for {} more days", left / 86_400),
        )
    }
}

/// `tls.key` is the key of `tls.crt`.
fn key_matches(name: &str, cert: &X509Certificate<'_>, key: &[u8]) -> Finding {
    let key_ok = PrivateKeyDer::from_pem_slice(key)
        .ok()
        .and_then(|k| rustls::crypto::ring::sign::any_supported_type(&k).ok())
        .and_then(|k| {
            k.public_key()
                .map(|spki| spki.as_ref() == cert.public_key().raw)
        })
        .unwrap_or(false);
    if key_ok {
        ok(
            "certificate",
            format!("{name}: the key matches the certificate"),
        )
    } else {
        bad(
            Level::Fail,
            "certificate",
            format!("{name}: tls.key does not match tls.crt"),
            "re-issue it (delete the Secret; cert-manager writes both again)",
        )
    }
}

/// The certificate carries every SAN the peers check.
fn sans_present(name: &str, cert: &X509Certificate<'_>, wanted: &[String]) -> Finding {
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let missing: Vec<&String> = wanted.iter().filter(|want| !sans.contains(want)).collect();
    if missing.is_empty() {
        ok(
            "certificate",
            format!(
                "{name}: SANs {}",
                if sans.is_empty() {
                    "(none needed)".into()
                } else {
                    sans.join(", ")
                }
            ),
        )
    } else {
        bad(
            Level::Fail,
            "certificate",
            format!("{name}: lacks {:?} (has {sans:?})", missing),
            "the Certificate's dnsNames/uris as deploy/ ships them",
        )
    }
}

/// Some CA Secret among `all` issued the certificate.
fn issued_by_ca(
    name: &str,
    cert: &X509Certificate<'_>,
    all: &BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
) -> Finding {
    let ca = all.iter().find_map(|(_, d)| {
        let d = d.as_ref()?;
        let c = CertificateDer::pem_slice_iter(d.get("tls.crt")?)
            .filter_map(Result::ok)
            .next()?;
        let (_, parsed) = x509_parser::parse_x509_certificate(c.as_ref()).ok()?;
        (parsed.is_ca() && parsed.subject() == cert.issuer()).then_some(())
    });
    if ca.is_some() {
        ok(
            "certificate",
            format!("{name}: issued by the CA ({})", cert.issuer()),
        )
    } else {
        bad(
            Level::Fail,
            "certificate",
            format!(
                "{name}: its issuer ({}) is not the CA's Secret",
                cert.issuer()
            ),
            "issue it from the Issuer serving-picker-ca (deploy/cert-manager)",
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn kubernetes_minors_are_read_from_git_versions() {
        assert_eq!(minor_of("v1.33.2"), Some(33));
        assert_eq!(minor_of("v1.31.4-eks-1234"), Some(31));
        assert_eq!(minor_of("v1.30+"), Some(30));
        assert_eq!(minor_of("garbage"), None);
    }
}
