//! Mutual TLS between Envoy and the companion, as shipped: a CA, the
//! companion's Secret volume (`--tls-cert`, `--tls-key`, `--client-ca`,
//! `--client-san`), Envoy's Secret volume and SDS files, and the
//! `transport_socket` of envoy-companion.yaml's companion cluster (read
//! from the shipped file, so what ships is what is tested). Also a rustls
//! client that dials the companion as any other client would.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;

use super::companion::XDS_CLUSTER;
use super::envoy::fresh_dir;
use super::pki::{self, refs, Ca, Leaf, SecretVolume, COMPANION_DNS, ENVOY_SPIFFE};

/// Where the shipped config's SDS files live (`make demo-certs`).
const SHIPPED_SDS_DIR: &str = ".run/tls/envoy-sds";

/// The files of one mTLS chain, all under one fresh directory.
pub struct Mtls {
    pub ca: Ca,
    pub companion_cert: Leaf,
    pub envoy_cert: Leaf,
    pub companion: SecretVolume,
    pub envoy: SecretVolume,
    pub sds_dir: PathBuf,
}

impl Mtls {
    pub fn new(tag: &str) -> Mtls {
        let dir = fresh_dir(&format!("mtls-{tag}"));
        let ca = Ca::new(&format!("test CA {tag}"));
        let companion_cert = ca.server(&[COMPANION_DNS, "localhost", "127.0.0.1"]);
        let envoy_cert = ca.client(&[ENVOY_SPIFFE]);
        let companion = SecretVolume::create(
            &dir.join("companion"),
            &refs(&pki::companion_files(&companion_cert, &ca.pem)),
        );
        let envoy = SecretVolume::create(
            &dir.join("envoy"),
            &refs(&pki::companion_files(&envoy_cert, &ca.pem)),
        );
        let sds_dir = dir.join("envoy-sds");
        pki::write_envoy_sds(&sds_dir, envoy.path(), COMPANION_DNS);
        Mtls {
            ca,
            companion_cert,
            envoy_cert,
            companion,
            envoy,
            sds_dir,
        }
    }

    /// The companion's TLS flags: its files, and Envoy's identity only.
    pub fn companion_args(&self) -> Vec<String> {
        let f = |n: &str| self.companion.file(n).display().to_string();
        vec![
            "--tls-cert".into(),
            f("tls.crt"),
            "--tls-key".into(),
            f("tls.key"),
            "--client-ca".into(),
            f("ca.crt"),
            "--client-san".into(),
            ENVOY_SPIFFE.into(),
        ]
    }

    /// A bootstrap hook: envoy-companion.yaml's transport socket on the
    /// companion cluster, reading this chain's SDS files.
    pub fn envoy_hook(&self) -> impl Fn(&mut Value, &Path) + 'static {
        let socket = shipped_transport_socket(&self.sds_dir);
        move |bootstrap: &mut Value, _dir: &Path| {
            let clusters = bootstrap["static_resources"]["clusters"]
                .as_array_mut()
                .unwrap_or_else(|| panic!("bootstrap without clusters"));
            let c = clusters
                .iter_mut()
                .find(|c| c["name"] == XDS_CLUSTER)
                .unwrap_or_else(|| {
                    panic!("no {XDS_CLUSTER} cluster: add eds_from_companion first")
                });
            c["transport_socket"] = socket.clone();
        }
    }
}

/// The `transport_socket` of envoy-companion.yaml's companion cluster, its
/// SDS paths moved to `sds_dir`.
pub fn shipped_transport_socket(sds_dir: &Path) -> Value {
    let path = crate::repo_root().join("envoy-companion.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let config: Value = serde_saphyr::from_str(&text).unwrap();
    let cluster = config["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == XDS_CLUSTER)
        .unwrap_or_else(|| panic!("envoy-companion.yaml has no {XDS_CLUSTER} cluster"))
        .clone();
    let socket = cluster["transport_socket"].clone();
    assert!(
        socket.is_object(),
        "envoy-companion.yaml: the companion cluster has no transport_socket"
    );
    let text = socket
        .to_string()
        .replace(SHIPPED_SDS_DIR, &sds_dir.display().to_string());
    assert!(
        text.contains(&sds_dir.display().to_string()),
        "envoy-companion.yaml's SDS files are not under {SHIPPED_SDS_DIR}"
    );
    serde_json::from_str(&text).unwrap()
}

/// What a client got from a TLS dial of the companion.
#[derive(Debug)]
pub enum Dial {
    /// The handshake went through and the server did not refuse the client
    /// afterwards: its certificate (DER) and the ALPN protocol agreed.
    Accepted {
        server_cert: Vec<u8>,
        alpn: Option<Vec<u8>>,
    },
    /// Refused: the error the client saw.
    Refused(String),
}

impl Dial {
    pub fn server_cert(&self) -> &[u8] {
        match self {
            Dial::Accepted { server_cert, .. } => server_cert,
            Dial::Refused(e) => panic!("refused: {e}"),
        }
    }

    pub fn is_refused(&self) -> bool {
        matches!(self, Dial::Refused(_))
    }
}

/// Dials `addr` over TLS, trusting `ca_pem`, checking the name `server`,
/// showing `identity` (certificate and key PEM) if any, from the local
/// address `from` (127.0.0.x) if given. The HTTP/2 preface is sent and an
/// answer awaited: with TLS 1.3 the server's verdict on the client
/// certificate arrives after the client's handshake is done.
pub fn dial(
    addr: SocketAddr,
    ca_pem: &str,
    server: &str,
    identity: Option<&Leaf>,
    from: Option<std::net::IpAddr>,
) -> Dial {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match identity {
            Some(leaf) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = connect_from(addr, from).await;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from(server.to_string()).unwrap();
        let mut tls = match connector.connect(name, tcp).await {
            Ok(s) => s,
            Err(e) => return Dial::Refused(e.to_string()),
        };
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        if let Err(e) = tls.write_all(preface).await {
            return Dial::Refused(e.to_string());
        }
        let mut buf = [0u8; 9];
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(5), tls.read(&mut buf)).await;
        match read {
            Ok(Ok(n)) if n > 0 => {
                let (_, conn) = tls.get_ref();
                Dial::Accepted {
                    server_cert: conn.peer_certificates().unwrap()[0].to_vec(),
                    alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
                }
            }
            Ok(Ok(_)) => Dial::Refused("closed".into()),
            Ok(Err(e)) => Dial::Refused(e.to_string()),
            Err(_) => Dial::Refused("no answer in 5 s".into()),
        }
    })
}

async fn connect_from(addr: SocketAddr, from: Option<std::net::IpAddr>) -> tokio::net::TcpStream {
    match from {
        Some(ip) => {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind(SocketAddr::new(ip, 0)).unwrap();
            s.connect(addr).await.unwrap()
        }
        None => tokio::net::TcpStream::connect(addr).await.unwrap(),
    }
}

/// Plaintext HTTP/2 (a gRPC client without TLS) to the TLS port: what
/// comes back (the server must not answer HTTP/2).
pub fn dial_plaintext(addr: SocketAddr, from: Option<std::net::IpAddr>) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = connect_from(addr, from).await;
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        let _ = tcp.write_all(preface).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read_to_end(&mut out))
            .await;
        out
    })
}
