//! Envoy Gateway (mode envoy-gateway): the hook confined to the dedicated
//! instance wherever the platform's EG runs, the dedicated instance's
//! configuration, its GatewayClass, its version, and its Envoy against the
//! native module's range.

use super::eg_document::{EgDocument, ExtensionManager};
use super::facts::{EgFacts, EnvoyProxyFact, Expect, GatewayClassFact, OtherEg, Workload};
use super::finding::{bad, ok, Finding, Level};
use super::versions::{self, Minor, NativeFit};

const DEFAULT_CONTROLLER: &str = "gateway.envoyproxy.io/gatewayclass-controller";
/// Envoy Gateway's controllerNames share this prefix (`gateway.controllerName`
/// is free text, but EG's default and the shipped one start so).
const EG_CONTROLLER_PREFIX: &str = "gateway.envoyproxy.io/";

/// Every finding on Envoy Gateway.
pub fn judge(expect: &Expect, eg: &EgFacts) -> Vec<Finding> {
    let mut out = confined(expect, eg);
    let doc = match &eg.dedicated {
        Some(Ok(doc)) => doc,
        Some(Err(e)) => {
            out.push(bad(
                Level::Fail,
                "eg-config",
                format!("no dedicated EG configuration in namespace {}: {e}", expect.eg_namespace),
                format!("helm install eg-serving-picker oci://docker.io/envoyproxy/gateway-helm --version <EG version> -n {} --skip-crds -f deploy/envoy-gateway/envoy-gateway-values.yaml", expect.eg_namespace),
            ));
            return out;
        }
        None => return out,
    };
    let controller = controller_of(doc);
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
    out.push(class(expect, eg, controller));
    out.extend(watch(expect, eg, doc));
    out.extend(hook(expect, doc));
    match &eg.deployment {
        Some(w) => out.extend(deployment(w)),
        None => out.push(bad(
            Level::Warn,
            "eg-version",
            format!("no Envoy Gateway Deployment found in {} (the chart's envoy-gateway, labelled control-plane=envoy-gateway): its version, replicas and Envoy were not checked", expect.eg_namespace),
            format!("kubectl -n {} get deployment envoy-gateway: install the dedicated EG with the chart (deploy/envoy-gateway/envoy-gateway-values.yaml)", expect.eg_namespace),
        )),
    }
    out.extend(envoy(expect, eg, doc));
    out
}

/// The namespaces the dedicated instance watches: where it may read Secrets
/// (the chart grants them per listed namespace, cluster-wide when none is
/// listed), and where it sees EnvoyProxies (its own namespace only when
/// listed: envoyproxy/gateway@v1.9.0 internal/provider/kubernetes/
/// kubernetes.go DefaultNamespaces).
fn watch(expect: &Expect, eg: &EgFacts, doc: &EgDocument) -> Vec<Finding> {
    let listed: Vec<&str> = doc.watch_namespaces.iter().map(String::as_str).collect();
    let values = "config.envoyGateway.provider.kubernetes.watch: {type: Namespaces, namespaces: [...]} as envoy-gateway-values.yaml sets it";
    let mut out = Vec::new();
    if doc.watch_type.as_deref() != Some("Namespaces") || listed.is_empty() {
        out.push(bad(
            Level::Warn,
            "eg-watch",
            format!("the EG in {} watches every namespace: its chart lets it read every Secret, the CA's key in {}/serving-picker-ca included", expect.eg_namespace, expect.namespace),
            values,
        ));
        return out;
    }
    out.push(if listed.contains(&expect.namespace.as_str()) {
        bad(
            Level::Warn,
            "eg-watch",
            format!("watch.namespaces lists {}: EG may read the CA's key there", expect.namespace),
            format!("leave {} out of watch.namespaces (EG gets its client certificate there by name: eg-secrets.yaml)", expect.namespace),
        )
    } else {
        ok("eg-watch", format!("watches {} only", listed.join(", ")))
    });
    let class = match &eg.classes {
        Some(Ok(classes)) => classes.iter().find(|c| c.name == expect.gateway_class),
        _ => None,
    };
    if let Some((ns, name)) = class.and_then(|c| c.envoy_proxy.as_ref()) {
        if !listed.contains(&ns.as_str()) {
            out.push(bad(
                Level::Fail,
                "eg-watch",
                format!("the class's EnvoyProxy {ns}/{name} is outside watch.namespaces: EG cannot see it and the GatewayClass is not accepted (InvalidParameters)"),
                format!("add {ns} to watch.namespaces, or keep the EnvoyProxy in {} (deploy/envoy-gateway/envoy-proxy.yaml)", expect.eg_namespace),
            ));
        }
    }
    out
}

fn controller_of(doc: &EgDocument) -> &str {
    doc.controller_name.as_deref().unwrap_or(DEFAULT_CONTROLLER)
}

/// The manager dials the companion: `host`, or `host` with a cluster domain.
fn dials(manager: &ExtensionManager, host: &str) -> bool {
    let h = manager.hostname.trim_end_matches('.');
    h == host
        || h.strip_prefix(host)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// No Envoy Gateway but the dedicated one calls the companion, wherever it
/// runs; or plainly that it could not look.
fn confined(expect: &Expect, eg: &EgFacts) -> Vec<Finding> {
    let host = &expect.hook_host;
    let mut out = Vec::new();
    let calls = |doc: &EgDocument| doc.extension_managers.iter().any(|m| dials(m, host));
    let stalls = |where_: String| {
        bad(
            Level::Fail,
            "eg-confined",
            format!("the Envoy Gateway in {where_} calls the companion: a companion it cannot reach stalls every Gateway it serves"),
            "remove serving-picker's extension manager from that EG; the hook runs on the dedicated instance only (deploy/envoy-gateway/envoy-gateway-values.yaml)",
        )
    };
    match &eg.others {
        Some(Ok(others)) => {
            let mut clean = Vec::new();
            for OtherEg {
                workload: w,
                config,
            } in others
            {
                let at = format!("{}/{}", w.namespace, w.name);
                match config {
                    Ok(doc) if calls(doc) => out.push(stalls(format!("namespace {}", w.namespace))),
                    Ok(doc) => {
                        if controller_of(doc) == controller_of_dedicated(eg) {
                            out.push(bad(
                                Level::Fail,
                                "eg-confined",
                                format!("the Envoy Gateway {at} has the dedicated instance's controllerName {}: both would translate class {}", controller_of(doc), expect.gateway_class),
                                "give the dedicated instance a controllerName of its own (envoy-gateway-values.yaml)",
                            ));
                        }
                        clean.push(format!("{at} ({})", controller_of(doc)));
                    }
                    Err(e) => out.push(bad(
                        Level::Warn,
                        "eg-confined",
                        format!("found the Envoy Gateway {at}, could not read its configuration: {e}"),
                        format!("check that `kubectl -n {} get configmap envoy-gateway-config -o yaml` has no extensionManager dialing {host}", w.namespace),
                    )),
                }
            }
            let served: Vec<String> = others
                .iter()
                .filter_map(|o| o.config.as_ref().ok())
                .map(|d| controller_of(d).to_string())
                .chain(
                    eg.dedicated
                        .iter()
                        .filter_map(|d| d.as_ref().ok())
                        .map(|d| controller_of(d).to_string()),
                )
                .collect();
            if let Some(Ok(classes)) = &eg.classes {
                for c in classes.iter().filter(|c| {
                    c.controller.starts_with(EG_CONTROLLER_PREFIX)
                        && !served.contains(&c.controller)
                }) {
                    out.push(bad(
                        Level::Warn,
                        "eg-confined",
                        format!("GatewayClass {} names controller {}, which no Envoy Gateway found here serves (found: Deployments labelled control-plane=envoy-gateway in every namespace)", c.name, c.controller),
                        format!("find the EG that serves it and check that its configuration has no extensionManager dialing {host}"),
                    ));
                }
            }
            if out.is_empty() {
                out.push(ok(
                    "eg-confined",
                    if clean.is_empty() {
                        "no other Envoy Gateway in any namespace: nothing else calls the companion"
                            .to_string()
                    } else {
                        format!(
                            "other Envoy Gateways, none calls the companion: {}",
                            clean.join(", ")
                        )
                    },
                ));
            }
        }
        Some(Err(e)) => {
            let ns = &expect.platform_eg_namespace;
            match &eg.fallback {
                Some(Ok(doc)) if calls(doc) => out.push(stalls(format!("namespace {ns}"))),
                Some(Ok(_)) => out.push(ok(
                    "eg-confined",
                    format!("the Envoy Gateway in namespace {ns} does not call the companion"),
                )),
                _ => {}
            }
            out.push(bad(
                Level::Warn,
                "eg-confined",
                format!("could not look for Envoy Gateways in every namespace ({e}); only namespace {ns} was read"),
                format!("run the preflight as a user who may list deployments in every namespace, or check each EG's envoy-gateway-config for an extensionManager dialing {host}"),
            ));
        }
        None => out.push(bad(
            Level::Warn,
            "eg-confined",
            "not checked",
            "fix the API access first",
        )),
    }
    out
}

fn controller_of_dedicated(eg: &EgFacts) -> &str {
    match &eg.dedicated {
        Some(Ok(doc)) => controller_of(doc),
        _ => "",
    }
}

/// The GatewayClass is the dedicated instance's.
fn class(expect: &Expect, eg: &EgFacts, controller: &str) -> Finding {
    let name = &expect.gateway_class;
    match &eg.classes {
        Some(Ok(classes)) => match classes.iter().find(|c| &c.name == name) {
            Some(c) if c.controller == controller => ok(
                "eg-class",
                format!("GatewayClass {name}: controller {controller}, the dedicated instance's"),
            ),
            Some(c) => bad(
                Level::Fail,
                "eg-class",
                format!("GatewayClass {name} names controller {}, the dedicated EG is {controller}: its Gateways are not the dedicated instance's", c.controller),
                "the GatewayClass's controllerName and the values' gateway.controllerName must be equal (deploy/envoy-gateway/gatewayclass.yaml, envoy-gateway-values.yaml); a GatewayClass's controllerName cannot change: delete and re-create it",
            ),
            None => bad(
                Level::Fail,
                "eg-class",
                format!("no GatewayClass {name}"),
                "kubectl apply -k deploy/envoy-gateway (gatewayclass.yaml)",
            ),
        },
        Some(Err(e)) => bad(
            Level::Warn,
            "eg-class",
            format!("could not list GatewayClasses ({e})"),
            format!("kubectl get gatewayclass {name} -o jsonpath='{{.spec.controllerName}}' must print {controller}"),
        ),
        None => bad(Level::Warn, "eg-class", "not checked", "fix the API access first"),
    }
}

/// The hook as the dedicated instance is configured to call it.
fn hook(expect: &Expect, doc: &EgDocument) -> Vec<Finding> {
    let host = &expect.hook_host;
    let Some(manager) = doc.extension_managers.iter().find(|m| dials(m, host)) else {
        return vec![bad(
            Level::Fail,
            "eg-hook",
            format!("no extension manager dials {host}"),
            "use the extensionManagers entry of deploy/envoy-gateway/envoy-gateway-values.yaml",
        )];
    };
    let mut out = Vec::new();
    let dialed = &manager.hostname;
    out.push(if dialed.trim_end_matches('.') == host {
        ok("eg-hook", format!("dials {host}"))
    } else {
        bad(
            Level::Warn,
            "eg-hook",
            format!("dials {dialed}: written with a cluster domain, it resolves only on a cluster of that domain"),
            format!("service.fqdn.hostname: {host} (the pod's DNS search path completes it)"),
        )
    });
    out.push(if manager.post_hooks.iter().any(|p| p == "Endpoints") {
        ok("eg-hook", format!("post-Endpoints hook to {host}"))
    } else {
        bad(
            Level::Fail,
            "eg-hook",
            "the hook is not `post: [Endpoints]`",
            "hooks.xdsTranslator.post: [Endpoints]",
        )
    });
    out.push(if manager.fail_open {
        ok("eg-hook", "failOpen: true")
    } else {
        bad(
            Level::Warn,
            "eg-hook",
            "failOpen is not true: a hook error holds every xDS update of the class",
            "failOpen: true",
        )
    });
    out.push(match &manager.certificate_ref {
        None => bad(
            Level::Fail,
            "eg-hook",
            "EG dials the companion without TLS",
            "service.tls.certificateRef and clientCertificateRef as envoy-gateway-values.yaml sets them",
        ),
        Some(ca) => {
            let namespace = ca.namespace.as_deref().unwrap_or(&expect.eg_namespace);
            if ca.name.as_deref() == Some("serving-picker-ca") && namespace == expect.namespace {
                bad(
                    Level::Fail,
                    "eg-hook",
                    format!("certificateRef is the CA's own Secret ({}/serving-picker-ca), which holds the CA's key", expect.namespace),
                    format!("certificateRef: {{kind: Secret, name: serving-picker-ca-bundle, namespace: {}}} (the CA-only bundle, deploy/envoy-gateway/ca-bundle.yaml)", expect.eg_namespace),
                )
            } else {
                ok(
                    "eg-hook",
                    format!(
                        "mutual TLS to the companion, trusting {namespace}/{}",
                        ca.name.as_deref().unwrap_or("?")
                    ),
                )
            }
        }
    });
    out
}

/// The dedicated instance's Deployment: its release (tag, or label when the
/// image is pinned by digest alone) and its replicas.
fn deployment(w: &Workload) -> Vec<Finding> {
    let mut out = Vec::new();
    match versions::workload_version(w) {
        Some(((1, 8 | 9), shown)) => out.push(ok("eg-version", format!("Envoy Gateway {shown}"))),
        Some((_, shown)) => out.push(bad(
            Level::Warn,
            "eg-version",
            format!("Envoy Gateway {shown}: serving-picker's hook is checked against 1.8 and 1.9"),
            "use Envoy Gateway 1.8 or 1.9",
        )),
        // kubernetes_range says it could not be read.
        None => {}
    }
    let replicas = w.replicas.unwrap_or(1);
    if replicas < 2 {
        out.push(bad(
            Level::Warn,
            "eg-version",
            format!("the dedicated Envoy Gateway runs {replicas} replica: while it restarts, no config change reaches the Gateways of its class"),
            "deployment.replicas: 2 and podDisruptionBudget.minAvailable: 1 (envoy-gateway-values.yaml)",
        ));
    }
    out
}

/// The Envoy an EnvoyProxy gives its proxies: its own image, else the
/// dedicated instance's default (its EnvoyGateway document's, else its
/// release's built-in one).
fn envoy_of(image: Option<&str>, default: &Option<(Minor, String)>) -> Option<(Minor, String)> {
    match image {
        Some(i) => versions::envoy_minor(i).map(|m| (m, i.to_string())),
        None => default.clone(),
    }
}

/// The native module against the Envoy of the dedicated instance.
fn envoy(expect: &Expect, eg: &EgFacts, doc: &EgDocument) -> Vec<Finding> {
    let configured = doc.envoy_image.as_deref();
    let release = eg.deployment.as_ref().and_then(versions::workload_version);
    let builtin = release.as_ref().and_then(|(m, shown)| {
        versions::eg_default_envoy(*m).map(|e| (e, format!("the default of Envoy Gateway {shown}")))
    });
    let class = match &eg.classes {
        Some(Ok(classes)) => classes.iter().find(|c| c.name == expect.gateway_class),
        _ => None,
    };
    let proxies: &[EnvoyProxyFact] = match &eg.envoy_proxies {
        Some(Ok(p)) => p,
        _ => &[],
    };
    let class_proxy = class
        .and_then(|c: &GatewayClassFact| c.envoy_proxy.as_ref())
        .and_then(|(ns, name)| {
            proxies
                .iter()
                .find(|p| &p.namespace == ns && &p.name == name)
        });
    let default = envoy_of(configured, &builtin);
    let class_envoy = envoy_of(class_proxy.and_then(|p| p.image.as_deref()), &default);
    let mut out = Vec::new();
    let native: Vec<&EnvoyProxyFact> = proxies.iter().filter(|p| p.mounts_native).collect();
    let judge = |what: String, envoy: &Option<(Minor, String)>, installed: bool| -> Finding {
        let Some((minor, from)) = envoy else {
            return bad(
                Level::Warn,
                "eg-envoy",
                format!("{what}: the Envoy version cannot be read"),
                "check the Envoy image's tag against the native module's range (1.38 to 1.40; docs/compatibility.md)",
            );
        };
        let v = versions::show(*minor);
        match (versions::native_fit(*minor), installed) {
            (NativeFit::Tested, _) => ok("eg-envoy", format!("{what}: Envoy {v} ({from}): the native module loads in it")),
            (NativeFit::Later, _) => bad(
                Level::Warn,
                "eg-envoy",
                format!("{what}: Envoy {v} ({from}): one minor after the module's tested ones; it loads with a warning (serving_picker.envoy.untested 1)"),
                "watch for a serving-picker release tested with this Envoy",
            ),
            (NativeFit::Refused, true) => bad(
                Level::Fail,
                "eg-envoy",
                format!("{what}: Envoy {v} ({from}): the native module does not load in it, and Envoy rejects the cluster that uses it"),
                "use an Envoy 1.38 to 1.41 for these proxies, or the wasm form (docs/compatibility.md)",
            ),
            (NativeFit::Refused, false) => bad(
                Level::Warn,
                "eg-envoy",
                format!("{what}: Envoy {v} ({from}): the native module would not load in it"),
                "use the wasm form, or an Envoy 1.38 to 1.41 (docs/compatibility.md)",
            ),
        }
    };
    if native.is_empty() {
        out.push(judge(
            format!(
                "class {} (native form not mounted by any EnvoyProxy)",
                expect.gateway_class
            ),
            &class_envoy,
            false,
        ));
    }
    for p in native {
        let envoy = match &p.image {
            Some(_) => envoy_of(p.image.as_deref(), &default),
            None => class_envoy.clone(),
        };
        out.push(judge(
            format!(
                "EnvoyProxy {}/{} mounts the native module",
                p.namespace, p.name
            ),
            &envoy,
            true,
        ));
    }
    if let Some(Err(e)) = &eg.envoy_proxies {
        out.push(bad(
            Level::Warn,
            "eg-envoy",
            format!("could not list EnvoyProxies ({e}): which proxies mount the native module is unknown"),
            "check each EnvoyProxy that mounts serving-picker-native runs an Envoy 1.38 to 1.41",
        ));
    }
    out
}
