//! Envoy Gateway never waits on the companion: the real binary in
//! `envoy-gateway` mode whose API server refuses every connection (it can
//! never list) answers every PostEndpointsModify call, sequential and
//! concurrent, within 500 ms with EG's assignment unchanged, and the
//! readiness probe of the shipped manifest (deploy/envoy-gateway) says the
//! pod can serve in that state, while `/readyz` (a full list in) says no.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, RawPostEndpointsModifyRequest,
};
use serving_picker_conditions::envoy_gateway::testing::{rule_assignments, BackendRef, EgEndpoint};
use serving_picker_conditions::model::slice::ServiceKey;
use serving_picker_xds_load::probe::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The readinessProbe (path, port name) of the companion in the shipped
/// envoy-gateway manifest.
fn shipped_readiness_probe() -> (String, String) {
    let text = std::fs::read_to_string(repo().join("deploy/envoy-gateway/companion.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment in companion.yaml");
    let probe =
        &deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"];
    (
        probe["path"].as_str().unwrap().to_string(),
        probe["port"].as_str().unwrap().to_string(),
    )
}

struct Companion {
    child: Child,
    log: PathBuf,
}

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "companion log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// A kubeconfig whose API server refuses connections.
fn refusing_kubeconfig(dir: &Path) -> PathBuf {
    let port = free_port();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .unwrap();
    path
}

fn cla_bytes(n: usize) -> Vec<u8> {
    let r = BackendRef {
        service: ServiceKey {
            namespace: "shop".into(),
            name: "web".into(),
        },
        port: 80,
        weight: None,
        endpoints: (0..n)
            .map(|i| EgEndpoint {
                addr: SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250 + 1) as u8], 8080)),
                draining: i % 3 == 0,
                zone: None,
            })
            .collect(),
    };
    rule_assignments("shop", "app", 0, &[r], false)
        .remove(0)
        .encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_companion_that_can_never_list_answers_every_call_unchanged_within_500_ms() {
    let dir = std::env::temp_dir().join(format!("sp-eg-never-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = dir.join("companion.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
        .args(["envoy-gateway", "--listen", &listen.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .env("KUBECONFIG", refusing_kubeconfig(&dir))
        .env("HOME", &dir)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let _companion = Companion {
        child,
        log: log.clone(),
    };

    let (probe_path, probe_port) = shipped_readiness_probe();
    assert_eq!(probe_port, "metrics", "the probe is on the metrics port");
    let started = Instant::now();
    while http_status_or_zero(metrics, &probe_path).await != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "probe {probe_path} never 200"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client = EnvoyGatewayExtensionClient::connect(format!("http://{listen}"))
        .await
        .unwrap();
    let call = |bytes: Vec<u8>| {
        let mut c = client.clone();
        async move {
            let t = Instant::now();
            let r = c
                .post_endpoints_modify_raw(RawPostEndpointsModifyRequest {
                    load_assignment: Some(Bytes::from(bytes)),
                    post_endpoints_context: Some(Bytes::new()),
                })
                .await
                .unwrap();
            (t.elapsed(), r.load_assignment.unwrap().to_vec())
        }
    };
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    // For 3 s (the watcher retrying its list with back-off all along):
    // single calls and bursts of 16 concurrent ones, small and large.
    while started.elapsed() < Duration::from_secs(3) {
        for n in [1, 100, 2000] {
            let bytes = cla_bytes(n);
            let (took, answer) = call(bytes.clone()).await;
            assert_eq!(answer, bytes, "unchanged");
            slowest = slowest.max(took);
            calls += 1;
        }
        let bytes = cla_bytes(500);
        let burst: Vec<_> = (0..16).map(|_| tokio::spawn(call(bytes.clone()))).collect();
        for b in burst {
            let (took, answer) = b.await.unwrap();
            assert_eq!(answer, bytes, "unchanged");
            slowest = slowest.max(took);
            calls += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{calls} calls, slowest {slowest:?}");
    assert!(
        slowest < Duration::from_millis(500),
        "slowest call {slowest:?}"
    );
    // Still not listed: /readyz keeps its meaning, the probe says serving.
    assert_eq!(http_status_or_zero(metrics, "/readyz").await, 503);
    assert_eq!(http_status_or_zero(metrics, &probe_path).await, 200);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("EndpointSlice watch error"), "{text}");
    // What the alerts read: the source never succeeded and keeps failing
    // (ServingPickerSourceFailing), EG's calls arrive (ServingPickerEgHookNotCalled
    // stays quiet), none is outstanding (ServingPickerEgHookCallStuck).
    let metrics_text = http_body(metrics, "/metrics").await;
    let value = |name: &str| -> f64 {
        metrics_text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("serving_picker_conditions_{name} ")))
            .unwrap_or_else(|| panic!("{name} not exported:\n{metrics_text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("source_last_success_timestamp_seconds"), 0.0);
    assert!(value("source_errors_total{kind=\"watch\"}") > 0.0);
    let last_call = value("eg_hook_last_call_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(last_call > now - 10.0 && last_call <= now, "{last_call}");
    assert_eq!(value("eg_hook_oldest_call_timestamp_seconds"), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// GET `path` on `addr`: the body ("" when there is no answer).
async fn http_body(addr: SocketAddr, path: &str) -> String {
    let got = tokio::time::timeout(Duration::from_secs(2), async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out.split_once("\r\n\r\n")?.1.to_string())
    })
    .await;
    got.ok().flatten().unwrap_or_default()
}

/// GET `path` on `addr`: the status code, 0 when there is no answer.
async fn http_status_or_zero(addr: SocketAddr, path: &str) -> u16 {
    match tokio::time::timeout(Duration::from_secs(1), async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        out.split_whitespace().nth(1)?.parse().ok()
    })
    .await
    {
        Ok(Some(code)) => code,
        _ => 0,
    }
}
