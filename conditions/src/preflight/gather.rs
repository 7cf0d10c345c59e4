//! What the preflight reads from the cluster, through kube-rs and a
//! kubeconfig. A read that fails is recorded as such (and judged), never
//! fatal: the preflight reports everything it can, and says what it could
//! not look at. It reads no Secret it does not judge, and no CA's key: the CA
//! certificates come from the CA-only bundle (envoy-gateway) and from the
//! `ca.crt` cert-manager writes beside each certificate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::Value;

use super::eg_document::EgDocument;

use super::facts::{
    EgFacts, EnvoyProxyFact, Expect, ExpectedSecret, Facts, GatewayClassFact, IstioFacts,
    LookError, Mode, OtherEg, SecretRole, Workload,
};
use crate::envoy_gateway::DEFAULT_MANAGE_SELECTOR;

/// The label Envoy Gateway's Helm chart puts on its controller Deployment.
const EG_DEPLOYMENT_LABEL: &str = "control-plane=envoy-gateway";
/// The label of istiod's Deployment (Istio's charts).
const ISTIOD_LABEL: &str = "app=istiod";
/// The label that keeps terminating pods in Istio's EDS (as DRAINING).
const ISTIO_PERSISTENT_SESSION_LABEL: &str = "istio.io/persistent-session";
/// The image of serving-picker's native module, as an EnvoyProxy mounts it.
const NATIVE_IMAGE: &str = "serving-picker-native";

/// `serving-picker-conditions preflight`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The way in to check.
    #[arg(long, value_enum, default_value_t = Mode::Eds)]
    pub mode: Mode,
    /// The kubeconfig (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current one).
    #[arg(long)]
    pub context: Option<String>,
    /// The companion's namespace.
    #[arg(long, default_value = "serving-picker")]
    pub namespace: String,
    /// The dedicated Envoy Gateway instance's namespace (mode envoy-gateway).
    #[arg(long, default_value = "serving-picker-gateway")]
    pub eg_namespace: String,
    /// Where the platform's own Envoy Gateway runs, read when Envoy Gateway
    /// Deployments cannot be listed in every namespace (otherwise every EG
    /// found is checked, wherever it runs).
    #[arg(long, default_value = "envoy-gateway-system")]
    pub platform_eg_namespace: String,
}

impl Args {
    /// What the shipped manifests of this mode install.
    pub fn expect(&self) -> Expect {
        let ns = &self.namespace;
        let leaf = |name: &str, san: String, role| ExpectedSecret {
            namespace: ns.clone(),
            name: name.into(),
            sans: vec![san],
            role,
        };
        let (account, secrets, service_label) = match self.mode {
            Mode::Eds => (
                Some("serving-picker-conditions"),
                vec![
                    leaf(
                        "serving-picker-conditions-tls",
                        format!("serving-picker-conditions.{ns}.svc"),
                        SecretRole::Server,
                    ),
                    leaf(
                        "serving-picker-envoy-client",
                        "spiffe://cluster.local/ns/default/sa/envoy".into(),
                        SecretRole::Client,
                    ),
                ],
                DEFAULT_MANAGE_SELECTOR,
            ),
            Mode::EnvoyGateway => (
                Some("serving-picker-conditions-eg"),
                vec![
                    leaf(
                        "serving-picker-conditions-eg-tls",
                        format!("serving-picker-conditions-eg.{ns}.svc"),
                        SecretRole::Server,
                    ),
                    leaf(
                        "serving-picker-eg-client",
                        format!(
                            "spiffe://cluster.local/ns/{}/sa/envoy-gateway",
                            self.eg_namespace
                        ),
                        SecretRole::Client,
                    ),
                    ExpectedSecret {
                        namespace: self.eg_namespace.clone(),
                        name: "serving-picker-ca-bundle".into(),
                        sans: vec![],
                        role: SecretRole::Bundle,
                    },
                ],
                DEFAULT_MANAGE_SELECTOR,
            ),
            Mode::Istio => (None, vec![], ISTIO_PERSISTENT_SESSION_LABEL),
        };
        let crds: &[&str] = match self.mode {
            Mode::Eds => &["certificates.cert-manager.io", "issuers.cert-manager.io"],
            Mode::EnvoyGateway => &[
                "certificates.cert-manager.io",
                "issuers.cert-manager.io",
                "gatewayclasses.gateway.networking.k8s.io",
                "envoyproxies.gateway.envoyproxy.io",
            ],
            Mode::Istio => &[
                "wasmplugins.extensions.istio.io",
                "envoyfilters.networking.istio.io",
            ],
        };
        Expect {
            mode: self.mode,
            namespace: ns.clone(),
            service_account: account.map(|sa| format!("system:serviceaccount:{ns}:{sa}")),
            secrets,
            crds: crds.iter().map(|c| c.to_string()).collect(),
            service_label: service_label.into(),
            eg_namespace: self.eg_namespace.clone(),
            platform_eg_namespace: self.platform_eg_namespace.clone(),
            hook_host: format!("serving-picker-conditions-eg.{ns}.svc"),
            gateway_class: "serving-picker".into(),
        }
    }
}

async fn client(args: &Args) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &options).await?
        }
        None => Config::from_kubeconfig(&options).await?,
    };
    Ok(Client::try_from(config)?)
}

/// Reads everything the checks need.
pub async fn gather(args: &Args) -> anyhow::Result<Facts> {
    let client = client(args).await?;
    let expect = args.expect();
    let mut facts = Facts {
        api: Some(
            client
                .apiserver_version()
                .await
                .map(|v| v.git_version)
                .map_err(LookError::from),
        ),
        ..Facts::default()
    };
    if matches!(facts.api, Some(Err(_))) {
        return Ok(facts);
    }
    if let Some(account) = &expect.service_account {
        facts.rbac = rbac(&client, account).await;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in &expect.crds {
        facts
            .crds
            .insert(name.clone(), crd_version(&crds, name).await);
    }
    // cert-manager's version decides which Kubernetes it supports.
    if expect.mode != Mode::Istio {
        let name = "certificates.cert-manager.io".to_string();
        if !facts.crds.contains_key(&name) {
            facts
                .crds
                .insert(name.clone(), crd_version(&crds, &name).await);
        }
    }
    match args.mode {
        Mode::EnvoyGateway => facts.eg = eg(&client, args).await,
        Mode::Istio => {
            facts.istio = IstioFacts {
                istiods: Some(deployments(&client, ISTIOD_LABEL).await),
            }
        }
        Mode::Eds => {}
    }
    for s in &expect.secrets {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &s.namespace);
        let data = secrets.get_opt(&s.name).await.ok().flatten().map(|secret| {
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        });
        facts.secrets.insert(s.key(), data);
    }
    let services: Api<Service> = Api::all(client.clone());
    facts.labelled_services = Some(
        services
            .list(&ListParams::default().labels(&expect.service_label))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|s| {
                        format!(
                            "{}/{}",
                            s.metadata.namespace.as_deref().unwrap_or("-"),
                            s.metadata.name.as_deref().unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .map_err(LookError::from),
    );
    Ok(facts)
}

/// May `account` list and watch EndpointSlices (SubjectAccessReviews).
async fn rbac(client: &Client, account: &str) -> Vec<(String, Result<bool, LookError>)> {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut out = Vec::new();
    for verb in ["list", "watch"] {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(account.into()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("discovery.k8s.io".into()),
                    resource: Some("endpointslices".into()),
                    verb: Some(verb.into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map(|r| r.status.is_some_and(|s| s.allowed))
            .map_err(LookError::from);
        out.push((verb.into(), answer));
    }
    out
}

/// A CRD's version label or annotation, when it is installed.
async fn crd_version(crds: &Api<CustomResourceDefinition>, name: &str) -> Option<String> {
    crds.get_opt(name).await.ok().flatten().map(|crd| {
        let labels = crd.metadata.labels.unwrap_or_default();
        let annotations = crd.metadata.annotations.unwrap_or_default();
        labels
            .get("app.kubernetes.io/version")
            .or_else(|| annotations.get("gateway.networking.k8s.io/bundle-version"))
            .cloned()
            .unwrap_or_else(|| "version not labelled".into())
    })
}

fn workload(d: &Deployment) -> Workload {
    let container = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first());
    Workload {
        namespace: d.metadata.namespace.clone().unwrap_or_default(),
        name: d.metadata.name.clone().unwrap_or_default(),
        image: container.and_then(|c| c.image.clone()),
        version_label: d
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/version").cloned()),
        replicas: d.spec.as_ref().and_then(|s| s.replicas),
        env: container
            .and_then(|c| c.env.as_ref())
            .map(|env| {
                env.iter()
                    .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Deployments carrying `label`, in every namespace.
async fn deployments(client: &Client, label: &str) -> Result<Vec<Workload>, LookError> {
    let api: Api<Deployment> = Api::all(client.clone());
    api.list(&ListParams::default().labels(label))
        .await
        .map(|l| l.items.iter().map(workload).collect())
        .map_err(LookError::from)
}

/// The EnvoyGateway document of EG's ConfigMap in `namespace`.
async fn eg_config(client: &Client, namespace: &str) -> Result<EgDocument, LookError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = maps
        .get_opt("envoy-gateway-config")
        .await?
        .ok_or(LookError::Missing(
            "ConfigMap envoy-gateway-config not found",
        ))?;
    let text = map
        .data
        .unwrap_or_default()
        .get("envoy-gateway.yaml")
        .cloned()
        .ok_or(LookError::Missing("no envoy-gateway.yaml key"))?;
    serde_saphyr::from_str::<Value>(&text)
        .map(|doc| EgDocument::from_value(&doc))
        .map_err(|e| LookError::Unparsable(Arc::new(e)))
}

fn dynamic(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

async fn gateway_classes(client: &Client) -> Result<Vec<GatewayClassFact>, LookError> {
    let api = dynamic(
        client,
        "gateway.networking.k8s.io",
        "v1",
        "GatewayClass",
        "gatewayclasses",
    );
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|c| {
            let spec = &c.data["spec"];
            let param = &spec["parametersRef"];
            let envoy_proxy = (param["kind"] == "EnvoyProxy"
                && param["group"] == "gateway.envoyproxy.io")
                .then(|| {
                    Some((
                        param["namespace"].as_str()?.to_string(),
                        param["name"].as_str()?.to_string(),
                    ))
                })
                .flatten();
            GatewayClassFact {
                name: c.metadata.name.clone().unwrap_or_default(),
                controller: spec["controllerName"].as_str().unwrap_or_default().into(),
                envoy_proxy,
            }
        })
        .collect())
}

async fn envoy_proxies(client: &Client) -> Result<Vec<EnvoyProxyFact>, LookError> {
    let api = dynamic(
        client,
        "gateway.envoyproxy.io",
        "v1alpha1",
        "EnvoyProxy",
        "envoyproxies",
    );
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|p| {
            let deployment = &p.data["spec"]["provider"]["kubernetes"]["envoyDeployment"];
            let mounts_native = deployment["pod"]["volumes"]
                .as_array()
                .is_some_and(|volumes| {
                    volumes.iter().any(|v| {
                        v["image"]["reference"]
                            .as_str()
                            .is_some_and(|r| r.contains(NATIVE_IMAGE))
                    })
                });
            EnvoyProxyFact {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                image: deployment["container"]["image"].as_str().map(String::from),
                mounts_native,
            }
        })
        .collect())
}

async fn eg(client: &Client, args: &Args) -> EgFacts {
    let mut facts = EgFacts {
        dedicated: Some(eg_config(client, &args.eg_namespace).await),
        classes: Some(gateway_classes(client).await),
        envoy_proxies: Some(envoy_proxies(client).await),
        ..EgFacts::default()
    };
    match deployments(client, EG_DEPLOYMENT_LABEL).await {
        Ok(found) => {
            let mut others = Vec::new();
            for w in found {
                if w.namespace == args.eg_namespace {
                    facts.deployment = Some(w);
                } else {
                    let config = eg_config(client, &w.namespace).await;
                    others.push(OtherEg {
                        workload: w,
                        config,
                    });
                }
            }
            facts.others = Some(Ok(others));
        }
        Err(e) => {
            facts.others = Some(Err(e));
            facts.fallback = Some(eg_config(client, &args.platform_eg_namespace).await);
            let api: Api<Deployment> = Api::namespaced(client.clone(), &args.eg_namespace);
            facts.deployment = api
                .get_opt("envoy-gateway")
                .await
                .ok()
                .flatten()
                .as_ref()
                .map(workload);
        }
    }
    facts
}
