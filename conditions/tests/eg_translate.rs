//! PostTranslateModify over gRPC on loopback, in process: a tonic client
//! plays Envoy Gateway's translation. Each translation calls
//! PostEndpointsModify for every EDS assignment, then PostTranslateModify
//! once with every cluster (envoyproxy/gateway@v1.9.0
//! `internal/xds/translator/translator.go`, `extension.go`); the clusters
//! are EG's shape (`testing::eg_rule_cluster`, from EG's translator
//! testdata) and the assignments EG >= 1.6's (`testing::rule_assignments`).
//! With `--native-lb-policy` the dynamic-module policy goes on exactly the
//! clusters whose assignments the hook wrote whole; every other resource
//! comes back byte for byte, in order. The real binary with a real Envoy:
//! `tests/e2e/companion/envoy_gateway.rs` at the repository root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use prost::Message;
use serving_picker_conditions::envoy_gateway::apply_updates;
use serving_picker_conditions::envoy_gateway::native_lb::{NativeLbMetrics, POLICY_EXTENSION};
use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, PostTranslateModifyRequest, RawPostEndpointsModifyRequest,
    RawPostTranslateModifyRequest, Wire,
};
use serving_picker_conditions::envoy_gateway::service::{
    HookConfig, HookMetrics, HookService, Shared,
};
use serving_picker_conditions::envoy_gateway::testing::{
    eg_draining, eg_rule_cluster, rule_assignments, rule_cluster, BackendRef, EgEndpoint,
};
use serving_picker_conditions::model::slice::{ServiceKey, Slice};
use serving_picker_conditions::source::{Change, Update};

type Cond = (bool, bool, bool);
const READY: Cond = (true, true, false);
const SERVING_TERMINATING: Cond = (false, true, true);

fn slice(service: &str, eps: &[(&str, Cond)]) -> Slice {
    let obj = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abc"), "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps.iter().map(|(ip, (r, s, t))| serde_json::json!({
            "addresses": [ip], "conditions": {"ready": r, "serving": s, "terminating": t}
        })).collect::<Vec<_>>(),
    });
    Slice::from_k8s(&serde_json::from_value(obj).unwrap())
        .unwrap()
        .0
}

fn backend(service: &str, eps: &[(&str, Cond)]) -> BackendRef {
    BackendRef {
        service: ServiceKey {
            namespace: "shop".into(),
            name: service.into(),
        },
        port: 80,
        weight: None,
        endpoints: eps
            .iter()
            .map(|(ip, (r, s, t))| EgEndpoint {
                addr: SocketAddr::new(ip.parse().unwrap(), 8080),
                draining: eg_draining(Some(*r), Some(*s), Some(*t)),
                zone: None,
            })
            .collect(),
    }
}

struct Server {
    shared: Arc<Shared>,
    registry: prometheus_client::registry::Registry,
    client: EnvoyGatewayExtensionClient,
    addr: SocketAddr,
    rt: tokio::runtime::Runtime,
}

fn server(native_lb: bool) -> Server {
    server_with(HookConfig {
        native_lb,
        ..HookConfig::default()
    })
}

fn server_with(config: HookConfig) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let shared = Arc::new(Shared::default());
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = HookMetrics::register(&mut registry);
    let native = NativeLbMetrics::register(&mut registry);
    let hook =
        HookService::new(shared.clone(), config, None, metrics).with_native_lb_metrics(native);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(hook.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let client = rt
        .block_on(EnvoyGatewayExtensionClient::connect(format!(
            "http://{addr}"
        )))
        .unwrap();
    Server {
        shared,
        registry,
        client,
        addr,
        rt,
    }
}

impl Server {
    fn full_list(&self, slices: Vec<Slice>) {
        apply_updates(&self.shared, vec![Update::now(Change::Replace(slices))]);
    }

    /// A client on a connection of its own (another EG replica, or EG
    /// after a reconnect).
    fn connect(&self) -> EnvoyGatewayExtensionClient {
        self.rt
            .block_on(EnvoyGatewayExtensionClient::connect(format!(
                "http://{}",
                self.addr
            )))
            .unwrap()
    }

    fn endpoints(&self, cla: &ClusterLoadAssignment) -> ClusterLoadAssignment {
        self.endpoints_on(&self.client, cla)
    }

    /// A call that may be refused (over a limit, as it arrives).
    fn try_endpoints(
        &self,
        cla: &ClusterLoadAssignment,
    ) -> Result<ClusterLoadAssignment, tonic::Status> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.post_endpoints_modify_raw(RawPostEndpointsModifyRequest {
                load_assignment: Some(Bytes::from(cla.encode_to_vec())),
                post_endpoints_context: Some(Bytes::new()),
            }))?;
        Ok(ClusterLoadAssignment::decode(r.load_assignment.unwrap()).unwrap())
    }

    fn endpoints_on(
        &self,
        client: &EnvoyGatewayExtensionClient,
        cla: &ClusterLoadAssignment,
    ) -> ClusterLoadAssignment {
        let mut c = client.clone();
        let r = self
            .rt
            .block_on(c.post_endpoints_modify_raw(RawPostEndpointsModifyRequest {
                load_assignment: Some(Bytes::from(cla.encode_to_vec())),
                post_endpoints_context: Some(Bytes::new()),
            }))
            .unwrap();
        ClusterLoadAssignment::decode(r.load_assignment.unwrap()).unwrap()
    }

    fn translate_raw(
        &self,
        req: RawPostTranslateModifyRequest,
    ) -> Result<
        serving_picker_conditions::envoy_gateway::proto::RawPostTranslateModifyResponse,
        tonic::Status,
    > {
        self.translate_on(&self.client, req)
    }

    fn translate_on(
        &self,
        client: &EnvoyGatewayExtensionClient,
        req: RawPostTranslateModifyRequest,
    ) -> Result<
        serving_picker_conditions::envoy_gateway::proto::RawPostTranslateModifyResponse,
        tonic::Status,
    > {
        let mut c = client.clone();
        self.rt.block_on(c.post_translate_modify_raw(req))
    }

    /// Whether the answer to a PostTranslateModify of `cluster` alone put
    /// the module on it (else it came back byte for byte).
    fn sets(&self, client: &EnvoyGatewayExtensionClient, cluster: &Cluster) -> bool {
        let req = request(std::slice::from_ref(cluster), &[]);
        let sent = req.clusters[0].clone();
        let got = self.translate_on(client, req).unwrap().clusters[0].clone();
        if got == sent {
            return false;
        }
        assert_eq!(
            policy_name(&Cluster::decode(got).unwrap()),
            POLICY_EXTENSION
        );
        true
    }

    fn metric(&self, line: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{line} ")))
            .map_or(0, |v| v.parse().unwrap())
    }
}

/// EG's request for these clusters and secrets, as Go encodes it (the
/// context present), every resource as bytes.
fn request(clusters: &[Cluster], secrets: &[Secret]) -> RawPostTranslateModifyRequest {
    let typed = PostTranslateModifyRequest {
        post_translate_context: Some(Default::default()),
        clusters: clusters.to_vec(),
        secrets: secrets.to_vec(),
        listeners: vec![],
        routes: vec![],
    };
    RawPostTranslateModifyRequest::decode(typed.encode_to_vec().as_slice()).unwrap()
}

fn policy_name(c: &Cluster) -> String {
    c.load_balancing_policy.as_ref().unwrap().policies[0]
        .typed_extension_config
        .as_ref()
        .unwrap()
        .name
        .clone()
}

/// One translation of a Gateway with these routes: `app` (web alone,
/// managed), `api` (an unlabelled Service), `mixed` (web and api in one
/// rule), `two` (web twice: two backendRefs, weights between them),
/// `doubt` (web with a pod the index has not seen: left as EG sent it),
/// plus a cluster EG never asks PostEndpointsModify about and a DNS
/// cluster named like `app`'s.
#[test]
fn the_native_policy_goes_on_exactly_the_clusters_the_hook_wrote() {
    let s = server(true);
    let web = [("10.0.0.1", READY), ("10.0.0.2", SERVING_TERMINATING)];
    s.full_list(vec![slice("web", &web)]);
    let api = [("10.0.1.1", READY)];
    let mut doubtful = web.to_vec();
    doubtful.push(("10.0.0.9", READY));
    let assignments = [
        rule_assignments("shop", "app", 0, &[backend("web", &web)], false),
        rule_assignments("shop", "api", 0, &[backend("api", &api)], false),
        rule_assignments(
            "shop",
            "mixed",
            0,
            &[backend("web", &web), backend("api", &api)],
            false,
        ),
        rule_assignments(
            "shop",
            "two",
            0,
            &[backend("web", &web), {
                let mut b = backend("web", &web);
                b.port = 81;
                b
            }],
            false,
        ),
        rule_assignments("shop", "doubt", 0, &[backend("web", &doubtful)], false),
    ];
    for cla in assignments.iter().flatten() {
        s.endpoints(cla);
    }
    let names = ["app", "api", "mixed", "two", "doubt", "never-asked"];
    let mut clusters: Vec<Cluster> = names
        .iter()
        .map(|r| eg_rule_cluster(&rule_cluster("shop", r, 0)))
        .collect();
    let mut dns = eg_rule_cluster(&rule_cluster("shop", "app", 0));
    dns.name = "dns-app".into();
    dns.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
        cluster::DiscoveryType::StrictDns as i32,
    ));
    clusters.push(dns);
    let secret = Secret {
        name: "gateway-tls".into(),
        ..Default::default()
    };
    let req = request(&clusters, std::slice::from_ref(&secret));
    let sent = req.clone();
    let answer = s.translate_raw(req).unwrap();

    // Every resource back, in order; only app's cluster changed.
    assert_eq!(answer.clusters.len(), sent.clusters.len());
    assert_eq!(answer.secrets, sent.secrets, "secrets byte for byte");
    assert!(answer.listeners.is_empty() && answer.routes.is_empty());
    for (i, (got, was)) in answer.clusters.iter().zip(&sent.clusters).enumerate() {
        if i == 0 {
            assert_ne!(got, was);
        } else {
            assert_eq!(got, was, "cluster {i} byte for byte");
        }
    }
    let app = Cluster::decode(answer.clusters[0].clone()).unwrap();
    assert_eq!(policy_name(&app), POLICY_EXTENSION);
    let mut expected = clusters[0].clone();
    expected.load_balancing_policy = app.load_balancing_policy.clone();
    expected.common_lb_config = app.common_lb_config.clone();
    assert_eq!(app, expected, "only the policy and the override set change");
    assert_eq!(
        app.common_lb_config
            .unwrap()
            .override_host_status
            .unwrap()
            .statuses
            .len(),
        2
    );

    let outcome = |o: &str| s.metric(&format!("eg_native_lb_clusters_total{{outcome=\"{o}\"}}"));
    assert_eq!(outcome("set"), 1);
    assert_eq!(outcome("not_eligible"), 4, "api, mixed, two, doubt");
    assert_eq!(outcome("no_verdict"), 1, "never-asked");
    assert_eq!(outcome("not_eds"), 1, "the DNS cluster");
    assert_eq!(s.metric("eg_translate_calls_total{result=\"modified\"}"), 1);
    assert_eq!(s.metric("eg_native_lb_verdicts"), 0, "taken by the call");

    // The Service loses its label (its slices leave the index): the next
    // translation's PostEndpointsModify leaves app's assignment as EG's,
    // and PostTranslateModify leaves app's cluster as EG's.
    s.full_list(vec![slice("other", &api)]);
    for cla in &assignments[0] {
        s.endpoints(cla);
    }
    let answer = s.translate_raw(request(&clusters[..1], &[])).unwrap();
    assert_eq!(answer.clusters[0], sent.clusters[0]);
    assert_eq!(
        s.metric("eg_translate_calls_total{result=\"unchanged\"}"),
        1
    );
}

#[test]
fn off_by_default_every_resource_comes_back_unchanged() {
    let s = server(false);
    let web = [("10.0.0.1", READY)];
    s.full_list(vec![slice("web", &web)]);
    for cla in rule_assignments("shop", "app", 0, &[backend("web", &web)], false) {
        s.endpoints(&cla);
    }
    let req = request(&[eg_rule_cluster(&rule_cluster("shop", "app", 0))], &[]);
    let sent = req.clone();
    let answer = s.translate_raw(req).unwrap();
    assert_eq!(answer.clusters, sent.clusters);
    assert_eq!(s.metric("eg_translate_calls_total{result=\"disabled\"}"), 1);
    assert_eq!(s.metric("eg_native_lb_verdicts"), 0);
}

#[test]
fn before_the_first_list_nothing_is_eligible() {
    let s = server(true);
    let web = [("10.0.0.1", READY)];
    for cla in rule_assignments("shop", "app", 0, &[backend("web", &web)], false) {
        s.endpoints(&cla);
    }
    let req = request(&[eg_rule_cluster(&rule_cluster("shop", "app", 0))], &[]);
    let sent = req.clone();
    assert_eq!(s.translate_raw(req).unwrap().clusters, sent.clusters);
}

/// A later EG that adds a resource list to the request: the answer would
/// drop it, and EG takes the answer's lists as final. Refused instead (EG
/// with failOpen keeps its own).
#[test]
fn a_request_with_a_field_this_version_does_not_know_is_refused() {
    let s = server(true);
    let typed = PostTranslateModifyRequest {
        clusters: vec![eg_rule_cluster("c")],
        ..Default::default()
    };
    let mut wire = typed.encode_to_vec();
    wire.extend_from_slice(&[0x32, 0x02, 0x0a, 0x00]); // field 6, a message
    let req = RawPostTranslateModifyRequest::decode(wire.as_slice()).unwrap();
    assert_eq!(req.unknown_fields, vec![6]);
    let mut c = s.client.clone();
    let err =
        s.rt.block_on(c.post_translate_modify_wire(Wire(wire)))
            .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(s.metric("eg_translate_calls_total{result=\"refused\"}"), 1);
}

/// The managed Service `web` and its route `app`'s assignment and cluster.
fn web_app(s: &Server) -> (Vec<ClusterLoadAssignment>, Cluster) {
    let web = [("10.0.0.1", READY), ("10.0.0.2", SERVING_TERMINATING)];
    s.full_list(vec![slice("web", &web)]);
    (
        rule_assignments("shop", "app", 0, &[backend("web", &web)], false),
        eg_rule_cluster(&rule_cluster("shop", "app", 0)),
    )
}

/// Two EG replicas translate at once, on two connections, their calls
/// interleaved: each PostTranslateModify sees only its own connection's
/// verdicts, and takes them (the next translation starts from none).
#[test]
fn a_verdict_counts_only_for_the_translation_on_its_connection() {
    let s = server(true);
    let (app, app_cluster) = web_app(&s);
    let (a, b) = (s.connect(), s.connect());
    for cla in &app {
        s.endpoints_on(&a, cla);
    }
    assert_eq!(s.metric("eg_native_lb_verdicts"), 1);
    assert_eq!(s.metric("eg_native_lb_verdict_connections"), 1);
    assert!(s.metric("eg_native_lb_verdict_bytes") > 0);
    // B's translation never asked about app: no verdict on B.
    assert!(!s.sets(&b, &app_cluster), "B gets nothing of A's");
    assert_eq!(s.metric("eg_native_lb_verdicts"), 1, "A's still waits");
    for cla in &app {
        s.endpoints_on(&b, cla);
    }
    assert!(s.sets(&a, &app_cluster), "A's own verdict");
    assert!(s.sets(&b, &app_cluster), "B's own verdict");
    assert_eq!(s.metric("eg_native_lb_verdicts"), 0);
    assert_eq!(s.metric("eg_native_lb_verdict_bytes"), 0);
    // The next translation on A: its call about app never came.
    assert!(!s.sets(&a, &app_cluster), "a missing call is no");
    assert_eq!(
        s.metric("eg_native_lb_clusters_total{outcome=\"no_verdict\"}"),
        2
    );
}

/// Two translations interleaved on one connection (not what EG does: one
/// connection per EG process, one translation at a time): the first
/// PostTranslateModify takes every verdict of the connection; the second
/// finds none and leaves its clusters as EG wrote them.
#[test]
fn two_translations_on_one_connection_never_share_a_stale_yes() {
    let s = server(true);
    let (web, api) = ([("10.0.0.1", READY)], [("10.0.1.1", READY)]);
    s.full_list(vec![slice("web", &web), slice("api", &api)]);
    let app = rule_assignments("shop", "app", 0, &[backend("web", &web)], false);
    let other = rule_assignments("shop", "api", 0, &[backend("api", &api)], false);
    // Translation 1 asks about app, translation 2 about api, then each
    // calls PostTranslateModify.
    for cla in app.iter().chain(&other) {
        s.endpoints(cla);
    }
    let app_cluster = eg_rule_cluster(&rule_cluster("shop", "app", 0));
    let api_cluster = eg_rule_cluster(&rule_cluster("shop", "api", 0));
    assert!(s.sets(&s.client, &app_cluster));
    assert!(!s.sets(&s.client, &api_cluster), "taken by the first");
}

/// The companion restarts between the two hooks (or EG reconnects): the
/// PostTranslateModify arrives on a connection, or in a process, with no
/// verdicts, and every cluster keeps EG's policy.
#[test]
fn a_restart_or_a_reconnect_between_the_hooks_means_no() {
    let s = server(true);
    let (app, app_cluster) = web_app(&s);
    for cla in &app {
        s.endpoints(cla);
    }
    let reconnected = s.connect();
    assert!(!s.sets(&reconnected, &app_cluster));
    let restarted = server(true);
    web_app(&restarted);
    assert!(!restarted.sets(&restarted.client, &app_cluster));
    assert!(
        s.sets(&s.client, &app_cluster),
        "the first connection's own"
    );
}

/// A call over a limit is answered with EG's assignment and records no
/// verdict; one about a cluster name over 1 KiB records none either.
#[test]
fn a_call_refused_over_a_limit_leaves_no_verdict() {
    let s = server_with(HookConfig {
        native_lb: true,
        max_bytes_held: 64,
        ..HookConfig::default()
    });
    let (app, app_cluster) = web_app(&s);
    // Over the bytes budget: refused as it arrives (RESOURCE_EXHAUSTED), or
    // answered with EG's own when the budget is taken later.
    for cla in &app {
        match s.try_endpoints(cla) {
            Ok(got) => assert_eq!(&got, cla, "EG's own back"),
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}"),
        }
    }
    assert!(
        s.metric("eg_hook_calls_total{result=\"over_bytes\"}")
            + s.metric("eg_hook_refused_total{reason=\"over_bytes\"}")
            >= 1
    );
    assert_eq!(s.metric("eg_native_lb_verdicts"), 0);
    // PostTranslateModify: refused over the same budget, or EG's cluster
    // back as sent; never the module.
    let req = request(std::slice::from_ref(&app_cluster), &[]);
    let sent = req.clusters[0].clone();
    match s.translate_raw(req) {
        Ok(answer) => assert_eq!(answer.clusters[0], sent),
        Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}"),
    }

    let s = server(true);
    let long = "r".repeat(1100);
    let web = [("10.0.0.1", READY)];
    s.full_list(vec![slice("web", &web)]);
    for cla in rule_assignments("shop", &long, 0, &[backend("web", &web)], false) {
        s.endpoints(&cla);
    }
    assert_eq!(s.metric("eg_native_lb_verdict_keys_too_long_total"), 1);
    assert_eq!(s.metric("eg_native_lb_verdicts"), 0);
    assert!(!s.sets(&s.client, &eg_rule_cluster(&rule_cluster("shop", &long, 0))));
}

/// `--native-lb-max-clusters` bounds the verdicts of every connection
/// together: one over it is not kept (counted), its cluster keeps EG's
/// policy.
#[test]
fn the_verdict_count_is_bounded() {
    let s = server_with(HookConfig {
        native_lb: true,
        native_lb_max_clusters: 1,
        ..HookConfig::default()
    });
    let web = [("10.0.0.1", READY)];
    s.full_list(vec![slice("web", &web)]);
    for route in ["one", "two"] {
        for cla in rule_assignments("shop", route, 0, &[backend("web", &web)], false) {
            s.endpoints(&cla);
        }
    }
    assert_eq!(s.metric("eg_native_lb_verdicts"), 1);
    assert_eq!(s.metric("eg_native_lb_verdicts_refused_total"), 1);
    let one = eg_rule_cluster(&rule_cluster("shop", "one", 0));
    let two = eg_rule_cluster(&rule_cluster("shop", "two", 0));
    let sent = request(&[one, two], &[]);
    let answer = s.translate_raw(sent.clone()).unwrap();
    assert_ne!(answer.clusters[0], sent.clusters[0], "one: set");
    assert_eq!(answer.clusters[1], sent.clusters[1], "two: EG's");
}

/// A team's load balancer on a cluster the companion wrote whole: kept,
/// counted by shape.
#[test]
fn a_teams_load_balancer_is_kept_and_counted() {
    let s = server(true);
    let (app, mut app_cluster) = web_app(&s);
    for cla in &app {
        s.endpoints(cla);
    }
    let p = app_cluster.load_balancing_policy.as_mut().unwrap();
    let Some(t) = p.policies[0].typed_extension_config.as_mut() else {
        panic!("EG's cluster has a policy")
    };
    t.name = "envoy.load_balancing_policies.maglev".into();
    t.typed_config = Some(envoy_types::pb::google::protobuf::Any {
        type_url: "type.googleapis.com/envoy.extensions.load_balancing_policies.maglev.v3.Maglev"
            .into(),
        value: vec![],
    });
    assert!(!s.sets(&s.client, &app_cluster));
    assert_eq!(
        s.metric("eg_native_lb_clusters_total{outcome=\"team_policy\"}"),
        1
    );
    assert_eq!(
        s.metric("eg_native_lb_team_policies_total{shape=\"maglev\"}"),
        1
    );
    assert_eq!(
        s.metric("eg_native_lb_team_policies_total{shape=\"round_robin\"}"),
        0
    );
}
