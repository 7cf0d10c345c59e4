//! The parts of an EnvoyGateway configuration document (`envoy-gateway.yaml`
//! of EG's ConfigMap) the preflight judges, typed. Read from EG's own schema
//! leniently, as EG writes it: a field of another type than EG's reads as
//! absent, and an odd item in a list is skipped, so one unexpected value
//! never hides the rest of the document from the checks.

use serde_json::Value;

/// What the checks read of one EnvoyGateway document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgDocument {
    /// `gateway.controllerName`.
    pub controller_name: Option<String>,
    /// `provider.kubernetes.watch.type`.
    pub watch_type: Option<String>,
    /// `provider.kubernetes.watch.namespaces`.
    pub watch_namespaces: Vec<String>,
    /// `extensionManagers[]`, then the older single `extensionManager`.
    pub extension_managers: Vec<ExtensionManager>,
    /// `envoyProxy.provider.kubernetes.envoyDeployment.container.image`.
    pub envoy_image: Option<String>,
}

/// One extension manager of the document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtensionManager {
    /// `service.fqdn.hostname` ("" when absent).
    pub hostname: String,
    /// `hooks.xdsTranslator.post`.
    pub post_hooks: Vec<String>,
    /// `failOpen` is `true`.
    pub fail_open: bool,
    /// `service.tls.certificateRef`, when it is an object.
    pub certificate_ref: Option<SecretRef>,
}

/// A reference to a Secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRef {
    /// `name`.
    pub name: Option<String>,
    /// `namespace` (EG's own namespace when absent).
    pub namespace: Option<String>,
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

fn texts(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(text).collect())
        .unwrap_or_default()
}

impl ExtensionManager {
    fn from_value(m: &Value) -> ExtensionManager {
        let ca = &m["service"]["tls"]["certificateRef"];
        ExtensionManager {
            hostname: text(&m["service"]["fqdn"]["hostname"]).unwrap_or_default(),
            post_hooks: texts(&m["hooks"]["xdsTranslator"]["post"]),
            fail_open: m["failOpen"] == Value::Bool(true),
            certificate_ref: ca.is_object().then(|| SecretRef {
                name: text(&ca["name"]),
                namespace: text(&ca["namespace"]),
            }),
        }
    }
}

impl EgDocument {
    /// The checked parts of a parsed document.
    pub fn from_value(doc: &Value) -> EgDocument {
        let watch = &doc["provider"]["kubernetes"]["watch"];
        let mut extension_managers: Vec<ExtensionManager> = doc["extensionManagers"]
            .as_array()
            .map(|a| a.iter().map(ExtensionManager::from_value).collect())
            .unwrap_or_default();
        if doc["extensionManager"].is_object() {
            extension_managers.push(ExtensionManager::from_value(&doc["extensionManager"]));
        }
        EgDocument {
            controller_name: text(&doc["gateway"]["controllerName"]),
            watch_type: text(&watch["type"]),
            watch_namespaces: texts(&watch["namespaces"]),
            extension_managers,
            envoy_image: text(
                &doc["envoyProxy"]["provider"]["kubernetes"]["envoyDeployment"]["container"]
                    ["image"],
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_checked_fields_are_read_and_odd_values_read_as_absent() {
        let doc: Value = serde_saphyr::from_str(
            r#"
gateway: {controllerName: gateway.envoyproxy.io/serving-picker}
provider:
  kubernetes:
    watch: {type: Namespaces, namespaces: [envoy-gateway-serving-picker, 7, apps]}
extensionManagers:
- service:
    fqdn: {hostname: serving-picker-conditions.serving-picker.svc, port: 9001}
    tls:
      certificateRef: {kind: Secret, name: serving-picker-ca-bundle}
  hooks: {xdsTranslator: {post: [Endpoints, Translation]}}
  failOpen: true
- service: {fqdn: {hostname: 42}}
  failOpen: "yes"
extensionManager:
  service: {fqdn: {hostname: other.example}}
envoyProxy:
  provider:
    kubernetes:
      envoyDeployment: {container: {image: "docker.io/envoyproxy/envoy:distroless-v1.38.3"}}
"#,
        )
        .unwrap();
        let d = EgDocument::from_value(&doc);
        assert_eq!(
            d.controller_name.as_deref(),
            Some("gateway.envoyproxy.io/serving-picker")
        );
        assert_eq!(d.watch_type.as_deref(), Some("Namespaces"));
        assert_eq!(d.watch_namespaces, ["envoy-gateway-serving-picker", "apps"]);
        assert_eq!(d.extension_managers.len(), 3);
        let first = &d.extension_managers[0];
        assert_eq!(
            first.hostname,
            "serving-picker-conditions.serving-picker.svc"
        );
        assert_eq!(first.post_hooks, ["Endpoints", "Translation"]);
        assert!(first.fail_open);
        assert_eq!(
            first.certificate_ref,
            Some(SecretRef {
                name: Some("serving-picker-ca-bundle".into()),
                namespace: None
            })
        );
        let odd = &d.extension_managers[1];
        assert_eq!(odd.hostname, "");
        assert!(!odd.fail_open, "failOpen \"yes\" is not true");
        assert_eq!(odd.certificate_ref, None);
        assert_eq!(d.extension_managers[2].hostname, "other.example");
        assert_eq!(
            d.envoy_image.as_deref(),
            Some("docker.io/envoyproxy/envoy:distroless-v1.38.3")
        );
        assert_eq!(EgDocument::from_value(&Value::Null), EgDocument::default());
    }
}
