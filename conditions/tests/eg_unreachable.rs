//! What Envoy Gateway's hook client does when the companion cannot be
//! reached: the evidence behind the fault table's "EG hook" rows.
//!
//! EG's extension manager calls PostEndpointsModify with grpc-go's
//! `WaitForReady(true)` and `context.Background()` (envoyproxy/gateway
//! `internal/extension/registry`): the call waits for the channel to be
//! READY and has no deadline. grpc-go documents WaitForReady as "the RPC
//! blocks until the channel is READY (or the context ends)"; tonic has no
//! such option, so [`eg_call`] is that contract: a call that finds no ready
//! connection waits (grpc-go's 1 s reconnect back-off) and tries again,
//! until its deadline if it has one.
//!
//! Against a companion that is not listening, one that accepts and never
//! answers TLS, and TLS mismatches (another CA, another SAN, an expired
//! certificate), the call without a deadline has not returned after
//! `WAIT`; with a deadline it fails with DEADLINE_EXCEEDED. Against the
//! real companion, well configured, the same client is answered at once
//! (so the client itself is not what hangs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, RawPostEndpointsModifyRequest,
};
use serving_picker_xds_load::probe::{self, free_port};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use pki::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use pki::{Ca, Leaf};

/// How long a call without a deadline is watched not returning.
const WAIT: Duration = Duration::from_secs(2);
/// The deadline of the calls that have one.
const DEADLINE: Duration = Duration::from_secs(1);

/// (cert, key) PEM.
fn pair(leaf: Leaf) -> (String, String) {
    (leaf.cert_pem, leaf.key_pem)
}

struct Companion {
    child: Child,
    listen: SocketAddr,
    dir: PathBuf,
}

impl Companion {
    /// The real binary in `envoy-gateway` mode over a slice directory,
    /// serving `server` and requiring client certificates of `ca`.
    fn start(tag: &str, ca: &Ca, server: &(String, String)) -> Companion {
        let dir = std::env::temp_dir().join(format!("sp-eg-unreach-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("slices")).unwrap();
        std::fs::write(dir.join("ca.crt"), &ca.pem).unwrap();
        std::fs::write(dir.join("tls.crt"), &server.0).unwrap();
        std::fs::write(dir.join("tls.key"), &server.1).unwrap();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new(env!("CARGO_BIN_EXE_serving-picker-conditions"))
            .args(["envoy-gateway", "--listen", &listen.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .arg("--slices-dir")
            .arg(dir.join("slices"))
            .arg("--tls-cert")
            .arg(dir.join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("tls.key"))
            .arg("--client-ca")
            .arg(dir.join("ca.crt"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !probe::http_get(metrics, "/healthz").starts_with("HTTP/1.1 200") {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "companion never up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Companion { child, listen, dir }
    }
}

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How EG's hook client is set up: TLS with its `certificateRef` CA for
/// the host of `service.fqdn`, its client certificate shown.
fn eg_endpoint(
    addr: SocketAddr,
    ca_pem: &str,
    host: &str,
    identity: &(String, String),
) -> Endpoint {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(host)
        .identity(Identity::from_pem(&identity.0, &identity.1));
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
}

/// One PostEndpointsModify call as EG makes it: wait for ready, then call;
/// `deadline` `None` is `context.Background()`.
async fn eg_call(endpoint: Endpoint, deadline: Option<Duration>) -> Result<(), Status> {
    let call = async {
        let channel = endpoint.connect_lazy();
        let mut client = EnvoyGatewayExtensionClient::new(channel);
        loop {
            let req = RawPostEndpointsModifyRequest {
                load_assignment: Some(Vec::new().into()),
                post_endpoints_context: Some(Vec::new().into()),
            };
            match client.post_endpoints_modify_raw(req).await {
                Ok(_) => return Ok(()),
                // Not READY: grpc-go's WaitForReady keeps the call waiting.
                Err(s) if s.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(s) => return Err(s),
            }
        }
    };
    match deadline {
        None => call.await,
        Some(d) => tokio::time::timeout(d, call)
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("context deadline exceeded"))),
    }
}

/// The call without a deadline is still waiting after `WAIT`; with one it
/// fails with DEADLINE_EXCEEDED.
async fn never_returns_and_fails_with_a_deadline(case: &str, endpoint: Endpoint) {
    let pending = tokio::time::timeout(WAIT, eg_call(endpoint.clone(), None)).await;
    assert!(
        pending.is_err(),
        "{case}: a wait-for-ready call without a deadline returned: {pending:?}"
    );
    let with_deadline = eg_call(endpoint, Some(DEADLINE)).await;
    assert_eq!(
        with_deadline.as_ref().map_err(|s| s.code()),
        Err(Code::DeadlineExceeded),
        "{case}"
    );
    println!(
        "{case}: no answer after {:.1} s without a deadline; with a {:.0} s deadline: {:?}",
        WAIT.as_secs_f64(),
        DEADLINE.as_secs_f64(),
        with_deadline.unwrap_err().code()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eg_hook_call_to_an_unreachable_companion_never_returns_without_a_deadline() {
    let ca = Ca::new("serving-picker CA");
    let eg = pair(ca.leaf(&["envoy-gateway"], ClientAuth, -1, 30));
    let host = "serving-picker-conditions.serving-picker.svc";
    let good = Companion::start("good", &ca, &pair(ca.leaf(&[host], ServerAuth, -1, 30)));

    // The control: well configured, the same client is answered at once.
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        eg_call(eg_endpoint(good.listen, &ca.pem, host, &eg), None),
    )
    .await;
    assert!(
        matches!(answered, Ok(Ok(()))),
        "the reachable companion answers: {answered:?}"
    );

    // Nothing listening (companion down, no endpoints, a NetworkPolicy reject).
    let nobody = SocketAddr::from(([127, 0, 0, 1], free_port()));
    never_returns_and_fails_with_a_deadline(
        "nothing listening",
        eg_endpoint(nobody, &ca.pem, host, &eg),
    )
    .await;

    // Accepts and never answers TLS (a NetworkPolicy drop after a proxy, a hung peer).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let h = held.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = silent.accept().await {
            h.lock().await.push(s);
        }
    });
    never_returns_and_fails_with_a_deadline(
        "accepts, never answers TLS",
        eg_endpoint(silent_addr, &ca.pem, host, &eg),
    )
    .await;

    // EG trusts another CA (a renewed CA, the wrong certificateRef).
    let other = Ca::new("another CA");
    never_returns_and_fails_with_a_deadline(
        "another CA",
        eg_endpoint(good.listen, &other.pem, host, &eg),
    )
    .await;

    // EG dials a name the certificate does not carry.
    never_returns_and_fails_with_a_deadline(
        "another SAN",
        eg_endpoint(good.listen, &ca.pem, "other.serving-picker.svc", &eg),
    )
    .await;

    // The companion's certificate expired. The companion refuses to start
    // with an expired certificate (and keeps its last good one on reload),
    // so a rustls server stands in for one whose certificate lapsed.
    let expired = expired_server(&ca, host).await;
    never_returns_and_fails_with_a_deadline(
        "expired certificate",
        eg_endpoint(expired, &ca.pem, host, &eg),
    )
    .await;
    drop(good);
}

/// A TLS server on loopback whose certificate for `host` has expired.
async fn expired_server(ca: &Ca, host: &str) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = pair(ca.leaf(&[host], ServerAuth, -30, -1));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let a = acceptor.clone();
            tokio::spawn(async move {
                let _ = a.accept(s).await;
            });
        }
    });
    addr
}
