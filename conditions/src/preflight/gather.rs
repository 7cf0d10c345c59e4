//! What the preflight reads from the cluster, through kube-rs and a
//! kubeconfig. A read that fails is recorded as such (and judged), never
//! fatal: the preflight reports everything it can.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::Value;

use super::checks::{EgFacts, Expect, ExpectedSecret, Facts, Mode};

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
    /// The platform's own Envoy Gateway namespace, which must not call the hook.
    #[arg(long, default_value = "envoy-gateway-system")]
    pub platform_eg_namespace: String,
}

impl Args {
    /// What the shipped manifests of this mode install.
    pub fn expect(&self) -> Expect {
        let ns = &self.namespace;
        let (sa, server, client_uri, client_secret) = match self.mode {
            Mode::Eds => (
                "serving-picker-conditions",
                "serving-picker-conditions",
                "spiffe://cluster.local/ns/default/sa/envoy".to_string(),
                "serving-picker-envoy-client",
            ),
            Mode::EnvoyGateway => (
                "serving-picker-conditions-eg",
                "serving-picker-conditions-eg",
                format!(
                    "spiffe://cluster.local/ns/{}/sa/envoy-gateway",
                    self.eg_namespace
                ),
                "serving-picker-eg-client",
            ),
        };
        let mut crds: Vec<String> = ["certificates.cert-manager.io", "issuers.cert-manager.io"]
            .map(String::from)
            .to_vec();
        if self.mode == Mode::EnvoyGateway {
            crds.extend(
                [
                    "gatewayclasses.gateway.networking.k8s.io",
                    "envoyproxies.gateway.envoyproxy.io",
                ]
                .map(String::from),
            );
        }
        Expect {
            mode: self.mode,
            namespace: ns.clone(),
            service_account: format!("system:serviceaccount:{ns}:{sa}"),
            secrets: vec![
                ExpectedSecret {
                    name: "serving-picker-ca".into(),
                    sans: vec![],
                    is_ca: true,
                },
                ExpectedSecret {
                    name: format!("{server}-tls"),
                    sans: vec![format!("{server}.{ns}.svc")],
                    is_ca: false,
                },
                ExpectedSecret {
                    name: client_secret.into(),
                    sans: vec![client_uri],
                    is_ca: false,
                },
            ],
            crds,
            eg_namespace: self.eg_namespace.clone(),
            platform_eg_namespace: self.platform_eg_namespace.clone(),
            hook_host: format!("{server}.{ns}.svc.cluster.local"),
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
                .map_err(|e| e.to_string()),
        ),
        ..Facts::default()
    };
    if matches!(facts.api, Some(Err(_))) {
        return Ok(facts);
    }
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    for verb in ["list", "watch"] {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(expect.service_account.clone()),
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
            .map_err(|e| e.to_string());
        facts.rbac.push((verb.into(), answer));
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in &expect.crds {
        let found = crds.get_opt(name).await.ok().flatten().map(|crd| {
            let labels = crd.metadata.labels.unwrap_or_default();
            let annotations = crd.metadata.annotations.unwrap_or_default();
            labels
                .get("app.kubernetes.io/version")
                .or_else(|| annotations.get("gateway.networking.k8s.io/bundle-version"))
                .cloned()
                .unwrap_or_else(|| "version not labelled".into())
        });
        facts.crds.insert(name.clone(), found);
    }
    if args.mode == Mode::EnvoyGateway {
        facts.eg = eg(&client, args).await;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
    for s in &expect.secrets {
        let data = secrets.get_opt(&s.name).await.ok().flatten().map(|secret| {
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        });
        facts.secrets.insert(s.name.clone(), data);
    }
    let services: Api<Service> = Api::all(client.clone());
    facts.labelled_services = Some(
        services
            .list(&ListParams::default().labels("serving-picker.io/conditions=true"))
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
            .map_err(|e| e.to_string()),
    );
    Ok(facts)
}

/// The EnvoyGateway document of EG's ConfigMap in `namespace`.
async fn eg_config(client: &Client, namespace: &str) -> Result<Value, String> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let map = maps
        .get_opt("envoy-gateway-config")
        .await
        .map_err(|e| e.to_string())?
        .ok_or("ConfigMap envoy-gateway-config not found")?;
    let text = map
        .data
        .unwrap_or_default()
        .get("envoy-gateway.yaml")
        .cloned()
        .ok_or("no envoy-gateway.yaml key")?;
    serde_saphyr::from_str(&text).map_err(|e| format!("envoy-gateway.yaml does not parse: {e}"))
}

async fn eg(client: &Client, args: &Args) -> EgFacts {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &args.eg_namespace);
    let image = deployments
        .get_opt("envoy-gateway")
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec?.template.spec?.containers.first()?.image.clone());
    EgFacts {
        dedicated: Some(eg_config(client, &args.eg_namespace).await),
        platform: eg_config(client, &args.platform_eg_namespace).await.ok(),
        image,
    }
}
