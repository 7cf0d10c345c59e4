//! What the preflight concludes from what it read: plain functions of the
//! facts, each finding with the fix when it is not ok. This file orders
//! them and judges what every way in shares (the API server and its
//! version, RBAC, CRDs, the Services); [`super::certificates`],
//! [`super::eg_checks`] and [`super::istio`] judge the rest.

use std::time::SystemTime;

pub use super::facts::{Expect, Facts, Mode};
use super::finding::{bad, ok};
pub use super::finding::{Finding, Level};
use super::versions::{self, Minor, Supported};

/// Every finding, in the order the install needs them.
pub fn judge(expect: &Expect, facts: &Facts, now: SystemTime) -> Vec<Finding> {
    let mut out = Vec::new();
    let (api, kubernetes) = api(expect, facts);
    out.push(api);
    if let Some(k8s) = kubernetes {
        out.extend(platform_versions(expect, facts, k8s));
    }
    for (verb, allowed) in &facts.rbac {
        let account = expect.service_account.as_deref().unwrap_or("-");
        out.push(match allowed {
            Ok(true) => ok("rbac", format!("{account} may {verb} endpointslices")),
            Ok(false) => bad(
                Level::Fail,
                "rbac",
                format!("{account} may not {verb} endpointslices.discovery.k8s.io"),
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
    match expect.mode {
        Mode::EnvoyGateway => out.extend(super::eg_checks::judge(expect, &facts.eg)),
        Mode::Istio => out.extend(super::istio::judge(&facts.istio)),
        Mode::Eds => {}
    }
    out.extend(super::certificates::judge(expect, &facts.secrets, now));
    out.push(services(expect, facts));
    out
}

/// The Kubernetes minor no supported release of the way in's platform
/// (and of the cert-manager it needs) runs below.
fn floor(mode: Mode) -> u32 {
    match mode {
        Mode::Eds => versions::oldest(&versions::CERT_MANAGER),
        Mode::EnvoyGateway => versions::oldest(&versions::CERT_MANAGER)
            .max(versions::oldest(&versions::ENVOY_GATEWAY)),
        Mode::Istio => versions::oldest(&versions::ISTIO),
    }
}

/// The API server, and its Kubernetes minor when it answered one.
fn api(expect: &Expect, facts: &Facts) -> (Finding, Option<u32>) {
    let floor = floor(expect.mode);
    match &facts.api {
        Some(Ok(version)) => match versions::minor_of(version) {
            Some((1, m)) if m >= floor => (ok("api", format!("Kubernetes {version}")), Some(m)),
            Some((1, m)) => (
                bad(
                    Level::Fail,
                    "api",
                    format!("Kubernetes {version}: older than 1.{floor}, the oldest any supported release of this way in's platform runs on"),
                    format!("upgrade to Kubernetes 1.{floor} or newer (docs/install.md, before you install)"),
                ),
                Some(m),
            ),
            _ => (
                bad(
                    Level::Warn,
                    "api",
                    format!("Kubernetes {version}: version not understood"),
                    format!("check it is 1.{floor} or newer"),
                ),
                None,
            ),
        },
        Some(Err(e)) => (
            bad(
                Level::Fail,
                "api",
                format!("the API server cannot be reached: {e}"),
                "check KUBECONFIG / --kubeconfig and its current context",
            ),
            None,
        ),
        None => (
            bad(Level::Fail, "api", "not checked", "check KUBECONFIG / --kubeconfig"),
            None,
        ),
    }
}

/// `what` at `release` against the Kubernetes minor `k8s`, as upstream
/// states it in `table`.
pub(super) fn kubernetes_range(
    what: &str,
    release: Minor,
    shown: &str,
    table: &[Supported],
    source: &str,
    k8s: u32,
) -> Finding {
    let Some(s) = versions::supported(table, release) else {
        let claimed: Vec<String> = table.iter().map(|s| versions::show(s.release)).collect();
        return bad(
            Level::Warn,
            "versions",
            format!(
                "{what} {shown}: serving-picker is checked against {}",
                claimed.join(", ")
            ),
            format!("use {what} {}", claimed.join(" or ")),
        );
    };
    let range = match s.newest {
        Some(n) => format!("Kubernetes 1.{} to 1.{n}", s.oldest),
        None => format!("Kubernetes 1.{} and newer", s.oldest),
    };
    if k8s < s.oldest {
        bad(
            Level::Fail,
            "versions",
            format!("{what} {shown} supports {range} ({source}), not 1.{k8s}"),
            format!(
                "upgrade Kubernetes to 1.{} or use a {what} release that supports 1.{k8s}",
                s.oldest
            ),
        )
    } else if s.newest.is_some_and(|n| k8s > n) {
        bad(
            Level::Warn,
            "versions",
            format!("{what} {shown} supports {range} ({source}): 1.{k8s} is newer"),
            format!("upgrade {what} to a release that supports Kubernetes 1.{k8s}"),
        )
    } else {
        ok(
            "versions",
            format!("{what} {shown} supports {range} ({source}): 1.{k8s} is one"),
        )
    }
}

/// Each platform part found, against the Kubernetes it runs on.
fn platform_versions(expect: &Expect, facts: &Facts, k8s: u32) -> Vec<Finding> {
    let mut out = Vec::new();
    // cert-manager's absence is the crd check's finding.
    if let (true, Some(Some(label))) = (
        expect.mode != Mode::Istio,
        facts.crds.get("certificates.cert-manager.io"),
    ) {
        out.push(match versions::minor_of(label) {
            Some(m) => kubernetes_range(
                "cert-manager",
                m,
                label,
                &versions::CERT_MANAGER,
                versions::CERT_MANAGER_SOURCE,
                k8s,
            ),
            None => bad(
                Level::Warn,
                "versions",
                format!("cert-manager's version is not known (its CRD says {label:?})"),
                "check your cert-manager release supports this Kubernetes (cert-manager.io supported releases)",
            ),
        });
    }
    if expect.mode == Mode::EnvoyGateway {
        if let Some(w) = &facts.eg.deployment {
            match versions::workload_version(w) {
                Some((m, shown)) => out.push(kubernetes_range(
                    "Envoy Gateway",
                    m,
                    &shown,
                    &versions::ENVOY_GATEWAY,
                    versions::ENVOY_GATEWAY_SOURCE,
                    k8s,
                )),
                None => out.push(bad(
                    Level::Warn,
                    "versions",
                    format!(
                        "the dedicated Envoy Gateway's version cannot be read: image {:?}, no app.kubernetes.io/version label",
                        w.image.as_deref().unwrap_or("-")
                    ),
                    "install it with the chart (it labels the Deployment), or check by hand that it is 1.8 or 1.9",
                )),
            }
        }
    }
    if expect.mode == Mode::Istio {
        if let Some(Ok(istiods)) = &facts.istio.istiods {
            for w in istiods {
                if let Some((m, shown)) = versions::workload_version(w) {
                    out.push(kubernetes_range(
                        &format!("Istio ({}/{})", w.namespace, w.name),
                        m,
                        &shown,
                        &versions::ISTIO,
                        versions::ISTIO_SOURCE,
                        k8s,
                    ));
                }
            }
        }
    }
    out
}

fn services(expect: &Expect, facts: &Facts) -> Finding {
    let label = &expect.service_label;
    let fix = match expect.mode {
        Mode::Istio => format!(
            "kubectl patch --patch-file examples/istio/patches/service-label.yaml service <name> -n <ns> (adds {label}: without it Istio drops terminating pods)"
        ),
        _ => format!("kubectl label service <name> -n <ns> {label}"),
    };
    match &facts.labelled_services {
        Some(Ok(names)) if !names.is_empty() => ok(
            "services",
            format!("labelled {label}: {}", names.join(", ")),
        ),
        Some(Ok(_)) => bad(
            Level::Warn,
            "services",
            format!("no Service is labelled {label}: nothing would be managed"),
            fix,
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
    }
}

fn crd_fix(name: &str) -> String {
    if name.ends_with("cert-manager.io") {
        "install cert-manager 1.19 to 1.21 (docs/install.md)".into()
    } else if name.ends_with("gateway.envoyproxy.io") || name.ends_with("gateway.networking.k8s.io")
    {
        "install Envoy Gateway 1.8 or 1.9 with its CRDs (helm install eg oci://docker.io/envoyproxy/gateway-helm)".into()
    } else if name.ends_with("istio.io") {
        "install Istio 1.28 to 1.31 (its base chart installs the CRDs)".into()
    } else {
        format!("install the CRD {name}")
    }
}
