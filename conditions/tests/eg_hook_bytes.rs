//! The hook's request bytes are bounded before they are buffered: the real
//! binary in `envoy-gateway` mode, with the shipped `--max-message-size`
//! (16 MB) and the default `--max-bytes-held` (32 MiB), against two
//! connections of 16 calls each that announce 16 MB and send 15 MB of it
//! in 1 MB chunks, then stop sending (without the bound, tonic buffers
//! each: about 480 MiB). The companion's resident memory stays under
//! 160 MiB, the calls are refused (RESOURCE_EXHAUSTED over the budget,
//! DEADLINE_EXCEEDED past `--receive-timeout-ms`), counted, and a
//! well-behaved call on a connection of its own gets its edited answer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use prost::Message;
use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, RawPostEndpointsModifyRequest,
};
use serving_picker_conditions::envoy_gateway::testing::{rule_assignments, BackendRef, EgEndpoint};
use serving_picker_conditions::model::slice::ServiceKey;
use serving_picker_xds_load::probe::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::codegen::Service;

/// The shipped `--max-message-size` (deploy/envoy-gateway/companion.yaml).
const SHIPPED_MAX_MESSAGE_SIZE: usize = 16_000_000;
const CONNECTIONS: usize = 2;
const CALLS_PER_CONNECTION: usize = 16;
const CHUNK: usize = 1 << 20;
const CHUNKS_SENT: usize = 15;
const RSS_BOUND_KIB: u64 = 160 << 10;

struct Companion(Child);

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn cla_bytes() -> Vec<u8> {
    let r = BackendRef {
        service: ServiceKey {
            namespace: "shop".into(),
            name: "web".into(),
        },
        port: 80,
        weight: None,
        endpoints: (1..=3)
            .map(|i| EgEndpoint {
                addr: SocketAddr::from(([10, 0, 0, i], 8080)),
                draining: i == 3,
                zone: None,
            })
            .collect(),
    };
    rule_assignments("shop", "app", 0, &[r], false)
        .remove(0)
        .encode_to_vec()
}

fn slice_json() -> String {
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-abc", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": true, "serving": true, "terminating": false}},
            {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true}},
        ],
    })
    .to_string()
}

/// GET `path` on `addr`: the body ("" when there is no answer).
async fn http_body(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("serving_picker_conditions_{name} ")))
        .unwrap_or_else(|| panic!("{name} not exported:\n{text}"))
        .parse()
        .unwrap()
}

/// One call that announces `SHIPPED_MAX_MESSAGE_SIZE` bytes and sends
/// `CHUNKS_SENT` MiB of them, then nothing more until `hold_until`: the
/// grpc-status it ends with ("" if none).
async fn stalled_call(
    mut channel: tonic::transport::Channel,
    listen: SocketAddr,
    hold_until: Instant,
) -> String {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, tonic::Status>>(1);
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let req = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{listen}/envoygateway.extension.EnvoyGatewayExtension/PostEndpointsModify"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(body))
        .unwrap();
    futures::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .unwrap();
    let call = tokio::spawn(channel.call(req));
    let sender = tokio::spawn(async move {
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&(SHIPPED_MAX_MESSAGE_SIZE as u32).to_be_bytes());
        if tx
            .send(Ok(http_body::Frame::data(Bytes::from(prefix))))
            .await
            .is_err()
        {
            return;
        }
        let chunk = Bytes::from(vec![0x55u8; CHUNK]);
        for _ in 0..CHUNKS_SENT {
            if tx
                .send(Ok(http_body::Frame::data(chunk.clone())))
                .await
                .is_err()
            {
                return;
            }
        }
        tokio::time::sleep_until(hold_until.into()).await;
        drop(tx);
    });
    let status = match call.await.unwrap() {
        Ok(resp) => {
            let from_headers = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            match from_headers {
                Some(s) => s,
                None => resp
                    .into_body()
                    .collect()
                    .await
                    .ok()
                    .and_then(|c| c.trailers().cloned())
                    .and_then(|t| {
                        t.get("grpc-status")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string)
                    })
                    .unwrap_or_default(),
            }
        }
        Err(_) => String::new(),
    };
    sender.abort();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_announcing_large_messages_are_bounded_before_they_are_buffered() {
    let dir = std::env::temp_dir().join(format!("sp-eg-bytes-{}", std::process::id()));
    let slices = dir.join("slices");
    std::fs::create_dir_all(&slices).unwrap();
    std::fs::write(slices.join("web.json"), slice_json()).unwrap();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = std::fs::File::create(dir.join("companion.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
        .args(["envoy-gateway", "--listen", &listen.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .args(["--slices-dir", &slices.display().to_string()])
        .args(["--max-message-size", &SHIPPED_MAX_MESSAGE_SIZE.to_string()])
        .args(["--receive-timeout-ms", "1000"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let pid = child.id();
    let _companion = Companion(child);
    let cla = cla_bytes();
    let started = Instant::now();
    let good = loop {
        if let Ok(c) = EnvoyGatewayExtensionClient::connect(format!("http://{listen}")).await {
            break c;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ask = || {
        let mut c = good.clone();
        let cla = cla.clone();
        async move {
            c.post_endpoints_modify_raw(RawPostEndpointsModifyRequest {
                load_assignment: Some(Bytes::from(cla)),
                post_endpoints_context: Some(Bytes::new()),
            })
            .await
        }
    };
    // Listed: a call is edited.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = ask().await.unwrap().load_assignment.unwrap();
        if answer.as_ref() != cla.as_slice() {
            break;
        }
        assert!(Instant::now() < deadline, "never edited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idle_kib = vm_rss_kib(pid);

    let hold_until = Instant::now() + Duration::from_secs(4);
    let mut calls = Vec::new();
    for _ in 0..CONNECTIONS {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{listen}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        for _ in 0..CALLS_PER_CONNECTION {
            calls.push(tokio::spawn(stalled_call(
                channel.clone(),
                listen,
                hold_until,
            )));
        }
    }
    // While they hold their bytes: the peak of the companion's RSS, and a
    // well-behaved call asked again until answered.
    let mut peak_kib = 0;
    let mut answered_after = None;
    let attack = Instant::now();
    while Instant::now() < hold_until {
        peak_kib = peak_kib.max(vm_rss_kib(pid));
        if answered_after.is_none() {
            if let Ok(r) = ask().await {
                let answer = r.load_assignment.unwrap();
                assert_ne!(answer.as_ref(), cla.as_slice(), "edited");
                answered_after = Some(attack.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.unwrap());
    }
    let text = http_body(metrics, "/metrics").await;
    eprintln!(
        "RSS idle {idle_kib} KiB, peak {peak_kib} KiB; well-behaved call answered after {answered_after:?}; statuses {statuses:?}"
    );
    assert!(
        peak_kib < RSS_BOUND_KIB,
        "companion RSS peaked at {peak_kib} KiB (bound {RSS_BOUND_KIB} KiB)"
    );
    assert!(
        answered_after.is_some(),
        "the well-behaved call never got its answer"
    );
    // Every stalled call refused: over the budget (8) or too slow (4).
    assert!(
        statuses.iter().all(|s| s == "8" || s == "4"),
        "{statuses:?}"
    );
    assert!(metric(&text, "eg_hook_refused_total{reason=\"over_bytes\"}") >= 1.0);
    assert!(metric(&text, "eg_hook_refused_total{reason=\"receive_timeout\"}") >= 1.0);
    assert_eq!(metric(&text, "eg_hook_bytes_held"), 0.0);
    assert_eq!(metric(&text, "eg_hook_requests_receiving"), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request that announces more than `--max-message-size` is refused from
/// its 5-byte prefix with RESOURCE_EXHAUSTED (what `--help` and
/// docs/envoy-gateway.md say), counted as `too_large`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_message_size_is_refused_resource_exhausted() {
    let dir = std::env::temp_dir().join(format!("sp-eg-size-{}", std::process::id()));
    let slices = dir.join("slices");
    std::fs::create_dir_all(&slices).unwrap();
    std::fs::write(slices.join("web.json"), slice_json()).unwrap();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let cla = cla_bytes();
    let child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
        .args(["envoy-gateway", "--listen", &listen.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .args(["--slices-dir", &slices.display().to_string()])
        .args(["--max-message-size", &(cla.len() + 2).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _companion = Companion(child);
    let started = Instant::now();
    let mut client = loop {
        if let Ok(c) = EnvoyGatewayExtensionClient::connect(format!("http://{listen}")).await {
            break c;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = client
        .post_endpoints_modify_raw(RawPostEndpointsModifyRequest {
            load_assignment: Some(Bytes::from(cla.clone())),
            post_endpoints_context: Some(Bytes::new()),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-message-size"),
        "{status:?}"
    );
    let text = http_body(metrics, "/metrics").await;
    assert_eq!(
        metric(&text, "eg_hook_refused_total{reason=\"too_large\"}"),
        1.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
