//! The PostEndpointsModify service over gRPC on loopback, in process: a
//! tonic client plays Envoy Gateway. Covers what the pure hook tests
//! cannot: byte-identical echoes, readiness, UNIMPLEMENTED for the other
//! rpcs, the bounded re-read (from a slice directory, and a source that
//! hangs) and a rolling update step by step. The real binary with a real
//! Envoy: `tests/e2e/companion/envoy_gateway.rs` at the repository root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use prost::Message;
use serving_picker_conditions::envoy_gateway::apply_updates;
use serving_picker_conditions::envoy_gateway::hook::lb_addr;
use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, RawPostEndpointsModifyRequest,
};
use serving_picker_conditions::envoy_gateway::service::{
    FilesReread, HookConfig, HookMetrics, HookService, Reread, RereadError, Shared,
};
use serving_picker_conditions::envoy_gateway::testing::{
    eg_draining, rule_assignments, BackendRef, EgEndpoint,
};
use serving_picker_conditions::model::slice::{ServiceKey, Slice};
use serving_picker_conditions::source::metrics::SourceMetrics;
use serving_picker_conditions::source::{Change, Update};

type Cond = (bool, bool, bool);
const READY: Cond = (true, true, false);
const SERVING_TERMINATING: Cond = (false, true, true);
const TERMINATING_NOT_SERVING: Cond = (false, false, true);
const NOT_SERVING: Cond = (false, false, false);

fn slice_json(service: &str, eps: &[(&str, Cond)]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abc"), "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps.iter().map(|(ip, (r, s, t))| serde_json::json!({
            "addresses": [ip], "conditions": {"ready": r, "serving": s, "terminating": t}
        })).collect::<Vec<_>>(),
    })
}

fn slice(service: &str, eps: &[(&str, Cond)]) -> Slice {
    Slice::from_k8s(&serde_json::from_value(slice_json(service, eps)).unwrap())
        .unwrap()
        .0
}

/// The assignment EG >= 1.6 sends for these slice endpoints.
fn eg_cla(service: &str, eps: &[(&str, Cond)]) -> ClusterLoadAssignment {
    let r = BackendRef {
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
    };
    rule_assignments("shop", "app", 0, &[r], false).remove(0)
}

/// EG's request bytes for an assignment (Go: context present and empty).
fn request(cla_bytes: Vec<u8>) -> RawPostEndpointsModifyRequest {
    RawPostEndpointsModifyRequest {
        load_assignment: Some(Bytes::from(cla_bytes)),
        post_endpoints_context: Some(Bytes::new()),
    }
}

struct Server {
    shared: Arc<Shared>,
    registry: prometheus_client::registry::Registry,
    client: EnvoyGatewayExtensionClient,
    _rt: tokio::runtime::Runtime,
}

fn server(priorities: bool, reread: Option<Arc<dyn Reread>>, timeout: Duration) -> Server {
    let mut config = HookConfig {
        reread_timeout: timeout,
        ..HookConfig::default()
    };
    config.output.flat = !priorities;
    server_with(config, reread)
}

fn server_with(config: HookConfig, reread: Option<Arc<dyn Reread>>) -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let shared = Arc::new(Shared::default());
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = HookMetrics::register(&mut registry);
    let hook = HookService::new(shared.clone(), config, reread, metrics);
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
        _rt: rt,
    }
}

impl Server {
    fn call(&mut self, cla: &ClusterLoadAssignment) -> (Vec<u8>, ClusterLoadAssignment) {
        let bytes = self.call_raw(cla.encode_to_vec());
        let out = ClusterLoadAssignment::decode(bytes.as_slice()).unwrap();
        (bytes, out)
    }

    fn call_raw(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        let mut c = self.client.clone();
        let r = self
            ._rt
            .block_on(c.post_endpoints_modify_raw(request(bytes)))
            .unwrap();
        r.load_assignment.unwrap().to_vec()
    }

    fn full_list(&self, slices: Vec<Slice>) {
        apply_updates(&self.shared, vec![Update::now(Change::Replace(slices))]);
    }

    /// The value of `eg_rereads_total{result="<result>"}`.
    fn rereads(&self, result: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let want = format!("eg_rereads_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&want))
            .map_or(0, |v| v.parse().unwrap())
    }

    /// The value of the gauge `name` (0 when it is not rendered).
    fn gauge(&self, name: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let want = format!("{name} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&want))
            .map_or(0.0, |v| v.parse().unwrap())
    }

    /// The value of `eg_hook_refused_total{reason="<reason>"}`.
    fn refused(&self, reason: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let want = format!("eg_hook_refused_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&want))
            .map_or(0, |v| v.parse().unwrap())
    }

    /// The value of `eg_hook_calls_total{result="<result>"}`.
    fn calls(&self, result: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let want = format!("eg_hook_calls_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&want))
            .map_or(0, |v| v.parse().unwrap())
    }
}

/// (addr, priority, health, serving metadata) of one endpoint.
type Seen = (String, u32, HealthStatus, Option<bool>);

/// Every endpoint's `Seen`.
fn seen(cla: &ClusterLoadAssignment) -> Vec<Seen> {
    use envoy_types::pb::google::protobuf::value::Kind;
    cla.endpoints
        .iter()
        .flat_map(|l| {
            l.lb_endpoints.iter().map(move |lb| {
                let serving = lb
                    .metadata
                    .as_ref()
                    .and_then(|m| m.filter_metadata.get("k8s.endpointslice"))
                    .and_then(|s| s.fields.get("serving"))
                    .and_then(|v| match v.kind {
                        Some(Kind::BoolValue(b)) => Some(b),
                        _ => None,
                    });
                (
                    lb_addr(lb).unwrap().to_string(),
                    l.priority,
                    HealthStatus::try_from(lb.health_status).unwrap(),
                    serving,
                )
            })
        })
        .collect()
}

#[test]
fn unmanaged_and_not_ready_come_back_byte_identical_and_other_rpcs_are_unimplemented() {
    let mut s = server(false, None, Duration::from_millis(200));
    let cla = eg_cla("web", &[("10.0.0.1", READY)]);
    // Hand-made bytes prost would not reproduce: an unknown field (99) at
    // the end of the assignment.
    let mut bytes = cla.encode_to_vec();
    bytes.extend_from_slice(&[0x9a, 0x06, 0x03, b'a', b'b', b'c']);
    // Before the first full list: EG's bytes.
    assert_eq!(s.call_raw(bytes.clone()), bytes);
    // Ready, but "web" is not managed (no slices): EG's bytes.
    s.full_list(vec![slice("api", &[("10.0.9.9", READY)])]);
    assert_eq!(s.call_raw(bytes.clone()), bytes);
    // Not an assignment at all: EG's bytes.
    let junk = vec![0xff, 0xff, 0xff];
    assert_eq!(s.call_raw(junk.clone()), junk);
    // Managed: modified (and re-encoded).
    s.full_list(vec![slice("web", &[("10.0.0.1", READY)])]);
    assert_ne!(s.call_raw(bytes.clone()), bytes);

    let mut c = s.client.clone();
    let err = s._rt.block_on(c.post_route_modify_empty()).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}

#[test]
fn seed_rows_as_eg_sends_them() {
    use HealthStatus::{Healthy, Unhealthy};
    let mut s = server(false, None, Duration::from_millis(200));
    let mut p = server(true, None, Duration::from_millis(200));
    let (a, b) = ("10.0.0.1", "10.0.0.2");
    let (a8, b8) = ("10.0.0.1:8080".to_string(), "10.0.0.2:8080".to_string());
    type Row = (
        &'static str,
        Vec<(&'static str, Cond)>,
        Vec<Seen>,
        Vec<Seen>,
    );
    let rows: Vec<Row> = vec![
        (
            "A serving",
            vec![(a, READY)],
            vec![(a8.clone(), 0, Healthy, Some(true))],
            vec![(a8.clone(), 0, Healthy, Some(true))],
        ),
        (
            "A not serving",
            vec![(a, NOT_SERVING)],
            vec![(a8.clone(), 0, Unhealthy, Some(false))],
            vec![],
        ),
        (
            "A terminating not serving",
            vec![(a, TERMINATING_NOT_SERVING)],
            vec![(a8.clone(), 0, Unhealthy, Some(false))],
            vec![],
        ),
        (
            "A serving+terminating",
            vec![(a, SERVING_TERMINATING)],
            vec![(a8.clone(), 0, Healthy, Some(true))],
            vec![(a8.clone(), 0, Healthy, Some(true))],
        ),
        (
            "A serving+terminating, B not yet serving",
            vec![(a, SERVING_TERMINATING), (b, NOT_SERVING)],
            vec![
                (a8.clone(), 0, Healthy, Some(true)),
                (b8.clone(), 0, Unhealthy, Some(false)),
            ],
            vec![(a8.clone(), 0, Healthy, Some(true))],
        ),
        (
            "A serving+terminating, B serving",
            vec![(a, SERVING_TERMINATING), (b, READY)],
            vec![
                (a8.clone(), 0, Healthy, Some(true)),
                (b8.clone(), 0, Healthy, Some(true)),
            ],
            vec![
                (b8.clone(), 0, Healthy, Some(true)),
                (a8.clone(), 1, Healthy, Some(true)),
            ],
        ),
        (
            "A terminating not serving, B serving",
            vec![(a, TERMINATING_NOT_SERVING), (b, READY)],
            vec![
                (a8.clone(), 0, Unhealthy, Some(false)),
                (b8.clone(), 0, Healthy, Some(true)),
            ],
            vec![(b8.clone(), 0, Healthy, Some(true))],
        ),
    ];
    for (what, eps, plain, prio) in rows {
        s.full_list(vec![slice("web", &eps)]);
        p.full_list(vec![slice("web", &eps)]);
        let cla = eg_cla("web", &eps);
        assert_eq!(seen(&s.call(&cla).1), plain, "{what}");
        assert_eq!(seen(&p.call(&cla).1), prio, "{what} (priorities)");
    }
}

#[test]
fn a_rolling_update_step_by_step() {
    // One replica: A ready; B created; A terminates (preStop) while B starts;
    // B ready; A stops serving; A gone. Companion and EG in step.
    use HealthStatus::Healthy;
    let mut s = server(true, None, Duration::from_millis(200));
    let (a, b) = ("10.0.0.1", "10.0.0.2");
    let (a8, b8) = ("10.0.0.1:8080".to_string(), "10.0.0.2:8080".to_string());
    type Step = (Vec<(&'static str, Cond)>, Vec<Seen>);
    let steps: Vec<Step> = vec![
        (vec![(a, READY)], vec![(a8.clone(), 0, Healthy, Some(true))]),
        (
            vec![(a, READY), (b, NOT_SERVING)],
            vec![(a8.clone(), 0, Healthy, Some(true))],
        ),
        (
            vec![(a, SERVING_TERMINATING), (b, NOT_SERVING)],
            vec![(a8.clone(), 0, Healthy, Some(true))],
        ),
        (
            vec![(a, SERVING_TERMINATING), (b, READY)],
            vec![
                (b8.clone(), 0, Healthy, Some(true)),
                (a8.clone(), 1, Healthy, Some(true)),
            ],
        ),
        (
            vec![(a, TERMINATING_NOT_SERVING), (b, READY)],
            vec![(b8.clone(), 0, Healthy, Some(true))],
        ),
        (vec![(b, READY)], vec![(b8.clone(), 0, Healthy, Some(true))]),
    ];
    for (i, (eps, want)) in steps.into_iter().enumerate() {
        s.full_list(vec![slice("web", &eps)]);
        assert_eq!(seen(&s.call(&eg_cla("web", &eps)).1), want, "step {i}");
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sp-eg-hook-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_slice(dir: &Path, service: &str, eps: &[(&str, Cond)]) {
    let tmp = dir.join(format!(".{service}.tmp"));
    std::fs::write(&tmp, slice_json(service, eps).to_string()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{service}.json"))).unwrap();
}

#[test]
fn eg_ahead_of_the_index_re_reads_the_service() {
    // The index still has A ready; the slice file (the source) already says
    // A serving+terminating and B ready, and EG translated from it.
    let dir = temp_dir("reread");
    write_slice(&dir, "web", &[("10.0.0.1", READY)]);
    let reread: Arc<dyn Reread> = Arc::new(FilesReread::new(
        dir.clone(),
        SourceMetrics::register(&mut Default::default()),
    ));
    let mut s = server(true, Some(reread), Duration::from_millis(500));
    s.full_list(vec![slice("web", &[("10.0.0.1", READY)])]);
    let now = [("10.0.0.1", SERVING_TERMINATING), ("10.0.0.2", READY)];
    write_slice(&dir, "web", &now);
    let (_, out) = s.call(&eg_cla("web", &now));
    assert_eq!(
        seen(&out),
        vec![
            ("10.0.0.2:8080".into(), 0, HealthStatus::Healthy, Some(true)),
            ("10.0.0.1:8080".into(), 1, HealthStatus::Healthy, Some(true)),
        ]
    );
    // The index learnt it too.
    let ix = s.shared.index.read().unwrap();
    let svc = ServiceKey {
        namespace: "shop".into(),
        name: "web".into(),
    };
    assert_eq!(ix.slices_of(&svc).next().unwrap().endpoints.len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

struct Hangs;

#[tonic::async_trait]
impl Reread for Hangs {
    async fn reread(&self, _: &ServiceKey) -> Result<Vec<Slice>, RereadError> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(vec![])
    }
}

#[test]
fn a_source_that_hangs_costs_at_most_the_bound_and_eg_keeps_its_view() {
    let mut s = server(false, Some(Arc::new(Hangs)), Duration::from_millis(150));
    s.full_list(vec![slice("web", &[("10.0.0.1", READY)])]);
    // EG: A DRAINING (not ready any more), and C the index does not know.
    let eps = [("10.0.0.1", NOT_SERVING), ("10.0.0.3", READY)];
    let cla = eg_cla("web", &eps);
    let t = Instant::now();
    let (_, out) = s.call(&cla);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    eprintln!("answer with a hanging source: {took:?} (bound 150 ms)");
    // Both exactly as EG sent them.
    assert_eq!(out, cla);
    // Within the re-read interval no second attempt (no second wait), and a
    // failed re-read does not make the index trusted: still EG's view.
    let t = Instant::now();
    let (_, again) = s.call(&cla);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(again, cla);
}

/// Re-reads in one translation (calls back to back) share
/// `--reread-budget-ms`: once it is spent, the calls of Services in doubt
/// are answered from the index at once, counted as over budget; after a
/// pause (a new translation) the budget is back.
#[test]
fn rereads_in_one_translation_share_the_budget() {
    let config = HookConfig {
        reread_timeout: Duration::from_millis(200),
        reread_budget: Duration::from_millis(300),
        ..HookConfig::default()
    };
    let mut s = server_with(config, Some(Arc::new(Hangs)));
    let services: Vec<String> = (0..5).map(|i| format!("svc-{i}")).collect();
    s.full_list(
        services
            .iter()
            .map(|n| slice(n, &[("10.0.0.1", READY)]))
            .collect(),
    );
    // EG knows an endpoint the index does not: a doubt, a re-read each.
    let eps = [("10.0.0.1", READY), ("10.0.0.9", READY)];
    for n in &services {
        let cla = eg_cla(n, &eps);
        let (_, out) = s.call(&cla);
        assert_eq!(seen(&out).len(), 2);
    }
    // 200 ms, then the 100 ms left: two re-reads timed out; three not done.
    assert_eq!(s.rereads("timeout"), 2);
    assert_eq!(s.rereads("over_budget"), 3);
    std::thread::sleep(Duration::from_millis(1200));
    let cla = eg_cla("svc-4", &eps);
    s.call(&cla);
    assert_eq!(s.rereads("timeout"), 3, "a new translation, a new budget");
}

/// One call answered at a time: while it waits on a re-read, another call
/// gets EG's bytes back at once, counted.
#[test]
fn a_call_over_the_concurrency_limit_is_answered_unchanged_at_once() {
    let config = HookConfig {
        reread_timeout: Duration::from_millis(1500),
        max_calls: 1,
        ..HookConfig::default()
    };
    let s = server_with(config, Some(Arc::new(Hangs)));
    s.full_list(vec![slice("web", &[("10.0.0.1", READY)])]);
    // A doubt (10.0.0.3 unknown): this call holds the only slot, re-reading.
    let doubtful = eg_cla("web", &[("10.0.0.1", READY), ("10.0.0.3", READY)]);
    let mut c = s.client.clone();
    let first = s._rt.spawn(async move {
        c.post_endpoints_modify_raw(request(doubtful.encode_to_vec()))
            .await
    });
    std::thread::sleep(Duration::from_millis(300));
    // Managed, no doubt: would be annotated, but there is no slot.
    let plain = eg_cla("web", &[("10.0.0.1", READY)]).encode_to_vec();
    let mut c = s.client.clone();
    let t = Instant::now();
    let r = s
        ._rt
        .block_on(c.post_endpoints_modify_raw(request(plain.clone())))
        .unwrap();
    let took = t.elapsed();
    assert_eq!(r.load_assignment.unwrap().to_vec(), plain, "unchanged");
    assert!(took < Duration::from_millis(500), "answered in {took:?}");
    assert_eq!(s.calls("over_calls"), 1);
    s._rt.block_on(first).unwrap().unwrap();
    // The slot is free again: the same call is annotated now.
    let mut c = s.client.clone();
    let r = s
        ._rt
        .block_on(c.post_endpoints_modify_raw(request(plain.clone())))
        .unwrap();
    assert_ne!(r.load_assignment.unwrap().to_vec(), plain);
    assert_eq!(s.calls("managed"), 2);
}

/// The call accounting the alerts read: `eg_hook_last_call_timestamp_seconds`
/// (when EG last called, any result) and
/// `eg_hook_oldest_call_timestamp_seconds` (when the oldest call still being
/// answered arrived; 0 when none is): here a call held by a re-read, then
/// answered.
#[test]
fn the_oldest_outstanding_call_and_the_last_call_are_gauges() {
    let config = HookConfig {
        reread_timeout: Duration::from_millis(1500),
        ..HookConfig::default()
    };
    let s = server_with(config, Some(Arc::new(Hangs)));
    assert_eq!(s.gauge("eg_hook_last_call_timestamp_seconds"), 0.0);
    assert_eq!(s.gauge("eg_hook_oldest_call_timestamp_seconds"), 0.0);
    s.full_list(vec![slice("web", &[("10.0.0.1", READY)])]);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let before = now();
    // A doubt (10.0.0.3 unknown): the call waits on the re-read.
    let doubtful = eg_cla("web", &[("10.0.0.1", READY), ("10.0.0.3", READY)]);
    let mut c = s.client.clone();
    let held = s._rt.spawn(async move {
        c.post_endpoints_modify_raw(request(doubtful.encode_to_vec()))
            .await
    });
    std::thread::sleep(Duration::from_millis(300));
    let oldest = s.gauge("eg_hook_oldest_call_timestamp_seconds");
    assert!(
        oldest >= before && oldest <= now(),
        "the held call's arrival: {oldest} (test started {before})"
    );
    // A second call, answered at once, leaves the oldest as it is.
    let plain = eg_cla("other", &[("10.0.0.9", READY)]).encode_to_vec();
    let mut c = s.client.clone();
    s._rt
        .block_on(c.post_endpoints_modify_raw(request(plain)))
        .unwrap();
    assert_eq!(s.gauge("eg_hook_oldest_call_timestamp_seconds"), oldest);
    let last = s.gauge("eg_hook_last_call_timestamp_seconds");
    assert!(
        last > oldest,
        "the last call came after the held one: {last} {oldest}"
    );
    s._rt.block_on(held).unwrap().unwrap();
    assert_eq!(s.gauge("eg_hook_oldest_call_timestamp_seconds"), 0.0);
    assert_eq!(s.gauge("eg_hook_last_call_timestamp_seconds"), last);
}

/// Bytes held are bounded: over gRPC, a request whose share (twice its
/// bytes, counted as they arrive) does not fit is refused with
/// RESOURCE_EXHAUSTED before it is buffered (EG with failOpen keeps its
/// own); in process (no intake), it is answered unchanged.
#[test]
fn a_call_over_the_bytes_budget_is_refused_as_it_arrives() {
    let eps: Vec<(String, Cond)> = (0..200)
        .map(|i| (format!("10.0.{}.{}", i / 250, i % 250 + 1), READY))
        .collect();
    let eps: Vec<(&str, Cond)> = eps.iter().map(|(a, c)| (a.as_str(), *c)).collect();
    let cla = eg_cla("web", &eps).encode_to_vec();
    let config = HookConfig {
        max_bytes_held: cla.len() * 2 - 1,
        ..HookConfig::default()
    };
    let mut s = server_with(config.clone(), None);
    s.full_list(vec![slice("web", &eps)]);
    let mut c = s.client.clone();
    let status = s
        ._rt
        .block_on(c.post_endpoints_modify_raw(request(cla.clone())))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("--max-bytes-held"), "{status:?}");
    assert_eq!(s.refused("over_bytes"), 1);
    assert_eq!(s.gauge("eg_hook_bytes_held"), 0.0);
    // A smaller assignment of the same Service fits and is annotated; its
    // bytes are given back once answered.
    let small = eg_cla("web", &eps[..10]).encode_to_vec();
    assert_ne!(s.call_raw(small.clone()), small);
    assert_eq!(s.calls("managed"), 1);
    assert_eq!(s.gauge("eg_hook_bytes_held"), 0.0);
    assert_eq!(s.gauge("eg_hook_requests_receiving"), 0.0);

    // In process: answered unchanged, counted.
    let shared = Arc::new(Shared::default());
    apply_updates(
        &shared,
        vec![Update::now(Change::Replace(vec![slice("web", &eps)]))],
    );
    let mut registry = prometheus_client::registry::Registry::default();
    let hook = HookService::new(shared, config, None, HookMetrics::register(&mut registry));
    let answer = s._rt.block_on(hook.answer(request(cla.clone())));
    assert_eq!(answer.load_assignment.as_deref(), Some(cla.as_slice()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("eg_hook_calls_total{result=\"over_bytes\"} 1"),
        "{text}"
    );
}

/// A request that announces more than `--max-message-size` is refused
/// from its prefix with RESOURCE_EXHAUSTED, counted as `too_large`.
#[test]
fn a_request_over_the_message_size_is_refused_from_its_prefix() {
    let eps = [("10.0.0.1", READY)];
    let cla = eg_cla("web", &eps).encode_to_vec();
    let config = HookConfig {
        max_message_size: cla.len(),
        ..HookConfig::default()
    };
    let s = server_with(config, None);
    s.full_list(vec![slice("web", &eps)]);
    let mut c = s.client.clone();
    let status = s
        ._rt
        .block_on(c.post_endpoints_modify_raw(request(cla)))
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-message-size"),
        "{status:?}"
    );
    assert_eq!(s.refused("too_large"), 1);
    assert_eq!(s.gauge("eg_hook_bytes_held"), 0.0);
}

/// An edited answer larger than EG accepts (--max-message-size) would be
/// refused by EG: its own assignment goes back instead.
#[test]
fn an_answer_larger_than_eg_accepts_is_replaced_by_egs_own() {
    let eps = [("10.0.0.1", READY), ("10.0.0.2", SERVING_TERMINATING)];
    let cla = eg_cla("web", &eps).encode_to_vec();
    let mut s = server(false, None, Duration::from_millis(500));
    s.full_list(vec![slice("web", &eps)]);
    let edited = s.call_raw(cla.clone());
    assert!(edited.len() > cla.len());
    let config = HookConfig {
        max_message_size: edited.len() - 1,
        ..HookConfig::default()
    };
    let mut s = server_with(config, None);
    s.full_list(vec![slice("web", &eps)]);
    assert_eq!(s.call_raw(cla.clone()), cla);
    assert_eq!(s.calls("answer_too_big"), 1);
}
