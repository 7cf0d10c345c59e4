//! What the preflight expects (per way in) and what it read: plain data
//! between [`super::gather`] and the checks.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::eg_document::EgDocument;

/// Why a look at the cluster gave no answer (said in the finding).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookError {
    /// The API server refused or failed the request.
    #[error("{0}")]
    Api(#[source] Arc<kube::Error>),
    /// What was looked for is not there.
    #[error("{0}")]
    Missing(&'static str),
    /// Envoy Gateway's configuration does not parse.
    #[error("envoy-gateway.yaml does not parse: {0}")]
    Unparsable(#[source] Arc<serde_saphyr::Error>),
}

impl From<kube::Error> for LookError {
    fn from(e: kube::Error) -> LookError {
        LookError::Api(Arc::new(e))
    }
}

/// The way in being prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Plain Envoy fed by the companion's EDS (`deploy/conditions`).
    Eds,
    /// Envoy Gateway's hook on a dedicated EG instance (`deploy/envoy-gateway`).
    EnvoyGateway,
    /// The wasm form on Istio (`examples/istio`): no companion.
    Istio,
}

/// What a Secret is for, which decides what must be in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretRole {
    /// The companion's server certificate (tls.crt, tls.key, ca.crt).
    Server,
    /// A client's certificate (tls.crt, tls.key, ca.crt).
    Client,
    /// CA certificates only, in `tls.crt`, and no key (what EG trusts).
    Bundle,
}

/// A Secret the install needs, and what its certificate must say.
#[derive(Debug, Clone)]
pub struct ExpectedSecret {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// SANs (DNS names or URIs) the certificate must carry.
    pub sans: Vec<String>,
    /// What it is for, which decides the keys it must hold.
    pub role: SecretRole,
}

impl ExpectedSecret {
    /// `namespace/name`: the key of [`Facts::secrets`].
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What the install expects to find.
#[derive(Debug, Clone)]
pub struct Expect {
    /// The way in being prepared.
    pub mode: Mode,
    /// The companion's namespace.
    pub namespace: String,
    /// The companion's ServiceAccount (RBAC is checked for it); None when
    /// the way in has no companion.
    pub service_account: Option<String>,
    /// The Secrets the install needs.
    pub secrets: Vec<ExpectedSecret>,
    /// CRDs (name) that must be in the cluster.
    pub crds: Vec<String>,
    /// The label selector of the Services serving-picker acts on.
    pub service_label: String,
    /// The dedicated EG instance's namespace (mode envoy-gateway).
    pub eg_namespace: String,
    /// Where to look for the platform's EG when EG Deployments cannot be listed.
    pub platform_eg_namespace: String,
    /// The host name EG must dial (`<service>.<namespace>.svc`).
    pub hook_host: String,
    /// The GatewayClass of the dedicated EG.
    pub gateway_class: String,
}

/// A Deployment as read: where it runs and what it runs.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    /// The Deployment's namespace.
    pub namespace: String,
    /// The Deployment's name.
    pub name: String,
    /// The first container's image.
    pub image: Option<String>,
    /// Its `app.kubernetes.io/version` label (Helm charts set it).
    pub version_label: Option<String>,
    /// `spec.replicas`, when set.
    pub replicas: Option<i32>,
    /// The first container's environment (literal values only).
    pub env: BTreeMap<String, String>,
}

/// A GatewayClass as read.
#[derive(Debug, Clone, Default)]
pub struct GatewayClassFact {
    /// `metadata.name`.
    pub name: String,
    /// `spec.controllerName`.
    pub controller: String,
    /// `spec.parametersRef` when it names an EnvoyProxy: (namespace, name).
    pub envoy_proxy: Option<(String, String)>,
}

/// An EnvoyProxy as read.
#[derive(Debug, Clone, Default)]
pub struct EnvoyProxyFact {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The Envoy image it sets, if any.
    pub image: Option<String>,
    /// Whether it mounts serving-picker's native module (an image volume of
    /// `serving-picker-native`).
    pub mounts_native: bool,
}

/// An Envoy Gateway other than the dedicated one, as found.
#[derive(Debug, Clone)]
pub struct OtherEg {
    /// Its controller Deployment.
    pub workload: Workload,
    /// Its EnvoyGateway document, or why it could not be read.
    pub config: Result<EgDocument, LookError>,
}

/// Envoy Gateway's side, as read (mode envoy-gateway).
#[derive(Debug, Default, Clone)]
pub struct EgFacts {
    /// The dedicated instance's EnvoyGateway document, or why it is not there.
    pub dedicated: Option<Result<EgDocument, LookError>>,
    /// The dedicated instance's controller Deployment.
    pub deployment: Option<Workload>,
    /// Every other Envoy Gateway found (Deployments labelled
    /// `control-plane=envoy-gateway` in every namespace) with its
    /// EnvoyGateway document or why it could not be read; Err: they could
    /// not be listed (then `fallback` is the one namespace read instead).
    pub others: Option<Result<Vec<OtherEg>, LookError>>,
    /// The EnvoyGateway document in `--platform-eg-namespace`, read when
    /// `others` could not be listed.
    pub fallback: Option<Result<EgDocument, LookError>>,
    /// Every GatewayClass, or why they could not be listed.
    pub classes: Option<Result<Vec<GatewayClassFact>, LookError>>,
    /// Every EnvoyProxy, or why they could not be listed.
    pub envoy_proxies: Option<Result<Vec<EnvoyProxyFact>, LookError>>,
}

/// Istio's side, as read (mode istio).
#[derive(Debug, Default, Clone)]
pub struct IstioFacts {
    /// Every istiod (Deployments labelled `app=istiod`), or why not listed.
    pub istiods: Option<Result<Vec<Workload>, LookError>>,
}

/// Everything the preflight read.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// The API server's gitVersion, or why it could not be read.
    pub api: Option<Result<String, LookError>>,
    /// (verb, allowed) for the companion's ServiceAccount on EndpointSlices.
    pub rbac: Vec<(String, Result<bool, LookError>)>,
    /// CRD name -> present (with the version label or annotation it carries).
    pub crds: BTreeMap<String, Option<String>>,
    /// Envoy Gateway's side (mode envoy-gateway).
    pub eg: EgFacts,
    /// Istio's side (mode istio).
    pub istio: IstioFacts,
    /// `namespace/name` -> the Secret's data, or None when absent.
    pub secrets: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    /// Services carrying `Expect::service_label`, or why not listed.
    pub labelled_services: Option<Result<Vec<String>, LookError>>,
}
