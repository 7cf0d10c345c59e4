//! Cost of one PostEndpointsModify call on a 1,000-endpoint assignment (the
//! issue's target: < 2 ms), as Envoy Gateway >= 1.6 sends it: one
//! backendRef, 1,000 endpoints in 10 EndpointSlices of 100, a rolling
//! update's mix of conditions (90% ready, 5% serving+terminating, 5% not
//! serving).
//!
//! 1. `hook::modify` alone (EG's encoded assignment in, the answer's out);
//! 2. the service's answer without the network: the request's bytes
//!    walked, modified, written (what a call costs the companion), with the
//!    default (tiered) output and with `--flat-output`, and for an
//!    unmanaged assignment (echo);
//! 3. a gRPC round trip on loopback (tonic client and server, one core
//!    each at most), as EG would see it;
//! 4. PostTranslateModify over 1,000 of EG's clusters, half of them with a
//!    verdict for the native policy (`--native-lb-policy`), and the echo
//!    without the flag.
//!
//! 5. A translation at Kubernetes' limits: 10,000 Services of 15 endpoints,
//!    one call per Service one after the other as EG makes them, in
//!    process and over gRPC: the total a translation waits on the hook;
//!    over gRPC also with the client on a thread and runtime of its own (as
//!    EG, a process of its own, calls: one connection, one call at a time)
//!    with the process's CPU time a call, against the server as the
//!    companion serves it (`HookService::into_server`) and without its
//!    intake.
//!
//! Prints p50 / p99 / mean; asserts nothing about time.
//! `cargo bench -p serving-picker-conditions --bench eg_hook`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use serving_picker_conditions::eds::assignment::Output;
use serving_picker_conditions::envoy_gateway::apply_updates;
use serving_picker_conditions::envoy_gateway::hook;
use serving_picker_conditions::envoy_gateway::prepared::PreparedIndex;
use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, EnvoyGatewayExtensionServer, RawPostEndpointsModifyRequest,
};
use serving_picker_conditions::envoy_gateway::service::{
    HookConfig, HookMetrics, HookService, Shared,
};
use serving_picker_conditions::envoy_gateway::testing::{
    eg_draining, eg_rule_cluster, rule_assignments, BackendRef, EgEndpoint,
};
use serving_picker_conditions::model::slice::{ServiceKey, Slice};
use serving_picker_conditions::source::{Change, Update};

const ENDPOINTS: usize = 1000;
const PER_SLICE: usize = 100;

fn cond(i: usize) -> (bool, bool, bool) {
    match i % 20 {
        0 => (false, true, true),   // serving+terminating
        1 => (false, false, false), // not serving (new pod)
        _ => (true, true, false),
    }
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, (i / 250) as u8, (i % 250 + 1) as u8)
}

fn slices(service: &str) -> Vec<Slice> {
    (0..ENDPOINTS / PER_SLICE)
        .map(|s| {
            let eps: Vec<serde_json::Value> = (s * PER_SLICE..(s + 1) * PER_SLICE)
                .map(|i| {
                    let (r, sv, t) = cond(i);
                    serde_json::json!({
                        "addresses": [ip(i).to_string()], "zone": format!("zone-{}", i % 3),
                        "nodeName": format!("node-{}", i % 50),
                        "conditions": {"ready": r, "serving": sv, "terminating": t}
                    })
                })
                .collect();
            let obj = serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{service}-{s}"), "namespace": "shop",
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": eps,
            });
            Slice::from_k8s(&serde_json::from_value(obj).unwrap())
                .unwrap()
                .0
        })
        .collect()
}

fn eg_cla(service: &str) -> Vec<u8> {
    let r = BackendRef {
        service: ServiceKey {
            namespace: "shop".into(),
            name: service.into(),
        },
        port: 80,
        weight: None,
        endpoints: (0..ENDPOINTS)
            .map(|i| {
                let (r, s, t) = cond(i);
                EgEndpoint {
                    addr: SocketAddr::new(ip(i).into(), 8080),
                    draining: eg_draining(Some(r), Some(s), Some(t)),
                    zone: None,
                }
            })
            .collect(),
    };
    rule_assignments("shop", "app", 0, &[r], false)
        .remove(0)
        .encode_to_vec()
}

fn report(what: &str, mut t: Vec<Duration>) {
    t.sort();
    let n = t.len();
    let mean = t.iter().sum::<Duration>() / n as u32;
    println!(
        "{what:<58} p50 {:>8.1} us  p99 {:>8.1} us  mean {:>8.1} us  (n={n})",
        t[n / 2].as_secs_f64() * 1e6,
        t[(n * 99 / 100).min(n - 1)].as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6
    );
}

fn time(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..n / 10 {
        f();
    }
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn service(priorities: bool) -> HookService {
    let shared = Arc::new(Shared::default());
    apply_updates(&shared, vec![Update::now(Change::Replace(slices("web")))]);
    let mut config = HookConfig::default();
    config.output.flat = !priorities;
    let metrics = HookMetrics::register(&mut prometheus_client::registry::Registry::default());
    HookService::new(shared, config, None, metrics)
}

fn main() {
    let n = 2000;
    let cla_bytes = eg_cla("web");
    let slices_once = slices("web");
    println!(
        "PostEndpointsModify, {ENDPOINTS} endpoints in {} slices; EG's assignment {} bytes",
        ENDPOINTS / PER_SLICE,
        cla_bytes.len()
    );

    let mut ix = PreparedIndex::new();
    ix.edit([Change::Replace(slices("web"))]);
    let out = Output::default();
    let trusted = BTreeSet::new();
    let mut answer_len = 0;
    report(
        "hook::modify (encoded assignment in, encoded answer out)",
        time(n, || {
            let m = hook::modify(&cla_bytes, &ix, &trusted, &out).unwrap();
            assert_eq!(m.answer.annotated, ENDPOINTS);
            answer_len = m.assignment.unwrap().len();
        }),
    );
    // One slice of the Service changes (a pod's conditions flip): the
    // index and the Service's prepared endpoints follow, under the lock
    // hook calls read.
    let mut flipped = slices_once[0].clone();
    flipped.endpoints[0].ready = Some(!flipped.endpoints[0].ready.unwrap_or(true));
    let versions = [flipped, slices_once[0].clone()];
    let mut i = 0;
    report(
        "one slice changes: the Service prepared again (not per call)",
        time(n / 4, || {
            i += 1;
            ix.edit([Change::Apply(versions[i % 2].clone())]);
        }),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = |bytes: &[u8]| RawPostEndpointsModifyRequest {
        load_assignment: Some(Bytes::copy_from_slice(bytes)),
        post_endpoints_context: Some(Bytes::new()),
    };
    for (what, priorities) in [
        ("answer: walk + modify + write, --flat-output", false),
        ("answer: walk + modify + write, tiered (default)", true),
    ] {
        let svc = service(priorities);
        report(
            what,
            time(n, || {
                let r = rt.block_on(svc.answer(request(&cla_bytes)));
                assert!(r.load_assignment.is_some());
            }),
        );
    }
    let other = eg_cla("other");
    let svc = service(false);
    report(
        "answer: unmanaged (walk, echo EG's bytes)",
        time(n, || {
            let r = rt.block_on(svc.answer(request(&other)));
            assert_eq!(r.load_assignment.as_deref(), Some(other.as_slice()));
        }),
    );
    println!("answer size: {answer_len} bytes (EG's + conditions metadata)");

    // 3. Over gRPC on loopback.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(service(false).into_server())
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    let client = rt
        .block_on(EnvoyGatewayExtensionClient::connect(format!(
            "http://{addr}"
        )))
        .unwrap();
    report(
        "gRPC round trip on loopback (client + server)",
        time(n / 2, || {
            let mut c = client.clone();
            let r = rt
                .block_on(c.post_endpoints_modify_raw(request(&cla_bytes)))
                .unwrap();
            assert!(r.load_assignment.is_some());
        }),
    );

    // 4. PostTranslateModify: 1,000 clusters, the first 500 with a yes.
    let clusters = 1000;
    let mut native = HookConfig {
        native_lb: true,
        ..HookConfig::default()
    };
    native.output.flat = false;
    let shared = Arc::new(Shared::default());
    apply_updates(&shared, vec![Update::now(Change::Replace(slices("web")))]);
    let metrics = HookMetrics::register(&mut prometheus_client::registry::Registry::default());
    let svc = HookService::new(shared, native, None, metrics);
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut cla = envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
        cla_bytes.as_slice(),
    )
    .unwrap();
    for i in 0..clusters / 2 {
        cla.cluster_name = format!("c{i}");
        ct.block_on(svc.answer(request(&cla.encode_to_vec())));
    }
    let typed = serving_picker_conditions::envoy_gateway::proto::PostTranslateModifyRequest {
        post_translate_context: Some(Default::default()),
        clusters: (0..clusters)
            .map(|i| eg_rule_cluster(&format!("c{i}")))
            .collect(),
        ..Default::default()
    };
    let wire = typed.encode_to_vec();
    println!(
        "PostTranslateModify: {clusters} of EG's clusters, {} bytes",
        wire.len()
    );
    let raw = || {
        serving_picker_conditions::envoy_gateway::proto::RawPostTranslateModifyRequest::decode(
            wire.as_slice(),
        )
        .unwrap()
    };
    report(
        "PostTranslateModify: 500 set, 500 kept (decode + answer)",
        time(n / 10, || {
            let r = ct.block_on(svc.translate(raw())).unwrap();
            assert_eq!(r.clusters.len(), clusters);
        }),
    );
    let off = service(true);
    report(
        "PostTranslateModify without --native-lb-policy (decode + echo)",
        time(n / 10, || {
            let r = ct.block_on(off.translate(raw())).unwrap();
            assert_eq!(r.clusters.len(), clusters);
        }),
    );
    translation(&rt, &client_for_translation(&rt));
}

/// A gRPC server of its own over a 10,000-Service index, and a client.
fn client_for_translation(
    rt: &tokio::runtime::Runtime,
) -> (
    EnvoyGatewayExtensionClient,
    Vec<Vec<u8>>,
    HookService,
    SocketAddr,
    SocketAddr,
) {
    let services = 10_000;
    let per = 15;
    let shared = Arc::new(Shared::default());
    let mut all = Vec::with_capacity(services);
    let mut clas = Vec::with_capacity(services);
    for s in 0..services {
        let name = format!("svc-{s:05}");
        let eps: Vec<serde_json::Value> = (0..per)
            .map(|i| {
                let n = s * per + i;
                let (r, sv, t) = cond(i);
                serde_json::json!({
                    "addresses": [format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255)],
                    "zone": format!("zone-{}", i % 3),
                    "conditions": {"ready": r, "serving": sv, "terminating": t}
                })
            })
            .collect();
        let obj = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-0"), "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": eps,
        });
        all.push(
            Slice::from_k8s(&serde_json::from_value(obj).unwrap())
                .unwrap()
                .0,
        );
        let r = BackendRef {
            service: ServiceKey {
                namespace: "shop".into(),
                name: name.clone(),
            },
            port: 80,
            weight: None,
            endpoints: (0..per)
                .map(|i| {
                    let n = s * per + i;
                    let (r, sv, t) = cond(i);
                    EgEndpoint {
                        addr: SocketAddr::new(
                            Ipv4Addr::new(
                                10,
                                (n >> 16 & 255) as u8,
                                (n >> 8 & 255) as u8,
                                (n & 255) as u8,
                            )
                            .into(),
                            8080,
                        ),
                        draining: eg_draining(Some(r), Some(sv), Some(t)),
                        zone: None,
                    }
                })
                .collect(),
        };
        clas.push(
            rule_assignments("shop", &name, 0, &[r], false)
                .remove(0)
                .encode_to_vec(),
        );
    }
    apply_updates(&shared, vec![Update::now(Change::Replace(all))]);
    let metrics = HookMetrics::register(&mut prometheus_client::registry::Registry::default());
    let local = HookService::new(shared.clone(), HookConfig::default(), None, metrics.clone());
    let served = HookService::new(shared.clone(), HookConfig::default(), None, metrics.clone());
    let alone = HookService::new(shared, HookConfig::default(), None, metrics);
    let own_addr = serve_without_intake(rt, alone);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(served.into_server())
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    let client = rt
        .block_on(EnvoyGatewayExtensionClient::connect(format!(
            "http://{addr}"
        )))
        .unwrap();
    (client, clas, local, addr, own_addr)
}

/// `hook` served without the intake (its requests buffered whole by tonic
/// before they count): what the intake costs a call.
fn serve_without_intake(rt: &tokio::runtime::Runtime, hook: HookService) -> SocketAddr {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(EnvoyGatewayExtensionServer::new(hook))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    addr
}

/// CPU time of this process so far (user + system, /proc/self/stat), for
/// the CPU a translation costs whatever the machine's load.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // Clock ticks of 10 ms (USER_HZ 100).
    Duration::from_millis(f.iter().sum::<u64>() * 10)
}

/// CPU time of the threads named `tokio-rt-worker` (the multi-threaded
/// runtime's workers, where the servers run; the client apart runs on the
/// main thread).
fn server_cpu_time() -> Duration {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let Some((head, after)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.contains("tokio-rt-worker") {
            continue;
        }
        ticks += after
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|v| v.parse::<u64>().ok())
            .sum::<u64>();
    }
    Duration::from_millis(ticks * 10)
}

/// One translation: a call per Service, one after the other; in process,
/// over gRPC with the client on the server's runtime (called from outside
/// it), and with the client on a thread and runtime of its own, as EG (a
/// process of its own) calls: one connection, one call at a time.
fn translation(
    rt: &tokio::runtime::Runtime,
    (client, clas, local, addr, own_addr): &(
        EnvoyGatewayExtensionClient,
        Vec<Vec<u8>>,
        HookService,
        SocketAddr,
        SocketAddr,
    ),
) {
    let request = |bytes: &[u8]| RawPostEndpointsModifyRequest {
        load_assignment: Some(Bytes::copy_from_slice(bytes)),
        post_endpoints_context: Some(Bytes::new()),
    };
    let own = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let own_client = own
        .block_on(EnvoyGatewayExtensionClient::connect(format!(
            "http://{addr}"
        )))
        .unwrap();
    let own_server = own
        .block_on(EnvoyGatewayExtensionClient::connect(format!(
            "http://{own_addr}"
        )))
        .unwrap();
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / clas.len() as f64;
    for round in 0..2 {
        let t = Instant::now();
        let mut managed = 0;
        for cla in clas {
            let r = rt.block_on(local.answer(request(cla)));
            managed += usize::from(r.load_assignment.as_deref() != Some(cla.as_slice()));
        }
        let in_process = t.elapsed();
        let t = Instant::now();
        for cla in clas {
            let mut c = client.clone();
            let r = rt
                .block_on(c.post_endpoints_modify_raw(request(cla)))
                .unwrap();
            assert!(r.load_assignment.is_some());
        }
        let grpc = t.elapsed();
        let cpu = cpu_time();
        let server_cpu = server_cpu_time();
        let t = Instant::now();
        let mut c = own_client.clone();
        for cla in clas {
            let r = own
                .block_on(c.post_endpoints_modify_raw(request(cla)))
                .unwrap();
            assert!(r.load_assignment.is_some());
        }
        let apart = t.elapsed();
        let apart_cpu = cpu_time().saturating_sub(cpu);
        let apart_server_cpu = server_cpu_time().saturating_sub(server_cpu);
        let cpu = cpu_time();
        let server_cpu = server_cpu_time();
        let t = Instant::now();
        let mut c = own_server.clone();
        for cla in clas {
            let r = own
                .block_on(c.post_endpoints_modify_raw(request(cla)))
                .unwrap();
            assert!(r.load_assignment.is_some());
        }
        let single = t.elapsed();
        let single_cpu = cpu_time().saturating_sub(cpu);
        let single_server_cpu = server_cpu_time().saturating_sub(server_cpu);
        println!(
            "translation {round}: the same without the intake (requests counted once buffered): {:.0} ms in all ({:.1} us a call, CPU client + server {:.1} us a call, server {:.1} us)",
            single.as_secs_f64() * 1e3,
            per_call(single),
            per_call(single_cpu),
            per_call(single_server_cpu),
        );
        println!(
            "translation {round}: {} calls (15 endpoints each, {managed} edited): in process {:.0} ms in all ({:.1} us a call); over gRPC on loopback {:.0} ms in all ({:.1} us a call); over gRPC, the client on a thread of its own (as EG) {:.0} ms in all ({:.1} us a call, CPU client + server {:.1} us a call, server {:.1} us)",
            clas.len(),
            in_process.as_secs_f64() * 1e3,
            per_call(in_process),
            grpc.as_secs_f64() * 1e3,
            per_call(grpc),
            apart.as_secs_f64() * 1e3,
            per_call(apart),
            per_call(apart_cpu),
            per_call(apart_server_cpu),
        );
    }
}
