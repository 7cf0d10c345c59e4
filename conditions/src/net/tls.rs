//! TLS and mTLS on the gRPC listener of either mode (rustls with ring; no
//! OpenSSL).
//!
//! - `--tls-cert` / `--tls-key`: the server's chain and key, PEM, as a
//!   `kubernetes.io/tls` Secret or cert-manager mounts them (`tls.crt`,
//!   `tls.key`). `--client-ca`: client certificates are required and must
//!   chain to these CAs (`ca.crt`). `--client-san` (repeatable): only
//!   clients whose certificate carries one of these DNS or URI SANs, exactly
//!   (SPIFFE IDs are URI SANs).
//! - At start every file must read, parse, be within its validity and (key
//!   and certificate) match, else the process stops with an error naming
//!   the flag and the file.
//! - The files are watched (their directories through inotify, which sees a
//!   Secret volume's `..data` symlink swap, and re-read every
//!   `POLL_EVERY` as a safety net). New content that loads replaces the
//!   server configuration for new connections; open connections keep
//!   theirs (their session is theirs), so streams are not dropped. New
//!   content that does not load is logged, counted, and the last good
//!   configuration stays.
//! - The accept path: `incoming` takes the accepted sockets (any stream of
//!   them, e.g. one a connection cap already wraps) and hands tonic the
//!   connections whose handshake succeeded. Handshakes run on their own
//!   tasks, bounded by `--handshake-timeout` (and, in number, by the
//!   listener's `--max-pending-handshakes`); a refusal (no client
//!   certificate, another CA, a SAN not allowed, plaintext to this port, a
//!   timeout...) is counted by reason and logged at most once per peer
//!   address per `REFUSAL_LOG_EVERY`.
//! - Without `--tls-cert` the listener is plaintext (loopback demos); on a
//!   non-loopback address that is logged at warning and shown in
//!   `grpc_plaintext_exposed`.
//!
//! Nothing secret is ever logged: paths, serial numbers, validity dates and
//! SANs only.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore};
use rustls::{ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::net::listener::{Admitted, Ticket};
use crate::telemetry::metrics::Labels;
use crate::telemetry::ratelog::PerKey;
use crate::telemetry::registered;

/// At most one log line per refused peer address per this interval.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);
/// The files are re-read this often even without a change event.
pub const POLL_EVERY: Duration = Duration::from_secs(10);
/// Events arriving together (a Secret update touches several names) are
/// read once, this long after the first.
const SETTLE: Duration = Duration::from_millis(200);
/// Peer addresses remembered for rate-limiting refusal logs.
const REFUSAL_PEERS: usize = 4096;

/// The TLS flags, shared by both modes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Serve TLS with this certificate chain (PEM, leaf first; a
    /// kubernetes.io/tls Secret's tls.crt). Reloaded when it changes.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1; the
    /// Secret's tls.key). Reloaded when it changes.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates that chain to these CAs (PEM bundle; the
    /// Secret's ca.crt). Reloaded when it changes.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Let in only clients whose certificate has this DNS or URI SAN,
    /// exactly (repeatable; e.g. a SPIFFE ID
    /// spiffe://cluster.local/ns/NS/sa/ACCOUNT).
    #[arg(long = "client-san", value_name = "NAME", requires = "client_ca")]
    pub client_sans: Vec<String>,
}

/// The files of a TLS listener.
#[derive(Clone, Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    client_sans: Vec<String>,
}

impl Files {
    fn from_args(args: &TlsArgs) -> Option<Files> {
        Some(Files {
            cert: args.tls_cert.clone()?,
            key: args.tls_key.clone()?,
            client_ca: args.client_ca.clone(),
            client_sans: args.client_sans.clone(),
        })
    }

    /// The directories to watch.
    fn dirs(&self) -> BTreeSet<PathBuf> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|f| match f.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            })
            .collect()
    }
}

/// What the files held when read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// A file that does not make a usable configuration: which flag, which
/// file, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub flag: &'static str,
    pub path: PathBuf,
    pub why: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.flag, self.path.display(), self.why)
    }
}

impl std::error::Error for LoadError {}

fn fail(flag: &'static str, path: &Path, why: impl Into<String>) -> LoadError {
    LoadError {
        flag,
        path: path.to_path_buf(),
        why: why.into(),
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| fail(flag, path, format!("cannot read: {e}")))
}

fn read_all(files: &Files) -> Result<Contents, LoadError> {
    Ok(Contents {
        cert: read("--tls-cert", &files.cert)?,
        key: read("--tls-key", &files.key)?,
        client_ca: match &files.client_ca {
            Some(p) => Some(read("--client-ca", p)?),
            None => None,
        },
    })
}

/// The public facts of a certificate worth logging and exporting.
#[derive(Clone, Debug)]
struct CertFacts {
    serial: String,
    not_before: i64,
    not_after: i64,
    sans: Vec<String>,
}

fn facts(der: &CertificateDer<'_>) -> Result<CertFacts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let validity = cert.validity();
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(n) => sans.push(n.to_string()),
                x509_parser::extensions::GeneralName::URI(u) => sans.push(u.to_string()),
                _ => {}
            }
        }
    }
    Ok(CertFacts {
        serial: cert.raw_serial_as_string(),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        sans,
    })
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Seconds since the epoch as RFC 3339 (UTC), for logs and errors.
fn rfc3339(secs: i64) -> String {
    x509_parser::time::ASN1Time::from_timestamp(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| secs.to_string())
}

fn within_validity(
    flag: &'static str,
    path: &Path,
    f: &CertFacts,
    now: i64,
) -> Result<(), LoadError> {
    if now > f.not_after {
        return Err(fail(
            flag,
            path,
            format!(
                "certificate (serial {}) expired at {}",
                f.serial,
                rfc3339(f.not_after)
            ),
        ));
    }
    if now < f.not_before {
        return Err(fail(
            flag,
            path,
            format!(
                "certificate (serial {}) not valid before {}",
                f.serial,
                rfc3339(f.not_before)
            ),
        ));
    }
    Ok(())
}

fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(flag, path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(fail(
            flag,
            path,
            "no certificate (PEM CERTIFICATE block) in it",
        ));
    }
    Ok(certs)
}

/// A loaded configuration and what to tell about it.
#[derive(Debug)]
struct Loaded {
    config: Arc<ServerConfig>,
    cert: CertFacts,
    /// The earliest expiry among the client CAs still valid.
    client_ca_not_after: Option<i64>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(files: &Files, contents: &Contents, now: SystemTime) -> Result<Loaded, LoadError> {
    let now = unix(now);
    let chain = certificates("--tls-cert", &files.cert, &contents.cert)?;
    let cert = facts(&chain[0]).map_err(|e| fail("--tls-cert", &files.cert, e))?;
    within_validity("--tls-cert", &files.cert, &cert, now)?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
        fail(
            "--tls-key",
            &files.key,
            format!(
                "no usable private key (PEM PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY): {e}"
            ),
        )
    })?;
    let provider = provider();
    let signing = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| {
            fail(
                "--tls-key",
                &files.key,
                format!("unsupported private key: {e}"),
            )
        })?;
    rustls::sign::CertifiedKey::new(chain.clone(), signing)
        .keys_match()
        .map_err(|e| {
            fail(
                "--tls-key",
                &files.key,
                format!(
                    "does not match the certificate of --tls-cert {} ({e})",
                    files.cert.display()
                ),
            )
        })?;

    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail("--tls-cert", &files.cert, e.to_string()))?;
    let mut client_ca_not_after = None;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            let mut valid = 0;
            for der in certificates("--client-ca", path, pem)? {
                let f = facts(&der).map_err(|e| fail("--client-ca", path, e))?;
                if within_validity("--client-ca", path, &f, now).is_err() {
                    // A bundle in a CA rotation may still list an old CA.
                    tracing::warn!(file = %path.display(), serial = %f.serial, not_after = %rfc3339(f.not_after), "--client-ca: a CA in the bundle is outside its validity; ignored");
                    continue;
                }
                roots.add(der).map_err(|e| {
                    fail(
                        "--client-ca",
                        path,
                        format!("not a usable CA certificate: {e}"),
                    )
                })?;
                valid += 1;
                client_ca_not_after =
                    Some(client_ca_not_after.map_or(f.not_after, |t: i64| t.min(f.not_after)));
            }
            if valid == 0 {
                return Err(fail(
                    "--client-ca",
                    path,
                    "no CA certificate within its validity",
                ));
            }
            let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| fail("--client-ca", path, e.to_string()))?;
            let verifier: Arc<dyn ClientCertVerifier> = if files.client_sans.is_empty() {
                webpki
            } else {
                Arc::new(SanAllowList {
                    inner: webpki,
                    allowed: files.client_sans.clone(),
                })
            };
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        fail(
            "--tls-key",
            &files.key,
            format!("does not make a server configuration with --tls-cert: {e}"),
        )
    })?;
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Loaded {
        config: Arc::new(config),
        cert,
        client_ca_not_after,
    })
}

/// Client verification as `inner` does it, then: one of the leaf's DNS or
/// URI SANs must be in `allowed` (DNS names compared without case).
#[derive(Debug)]
struct SanAllowList {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl SanAllowList {
    fn allows(&self, sans: &[String]) -> bool {
        sans.iter().any(|san| {
            self.allowed.iter().any(|a| {
                if a.contains("://") {
                    a == san
                } else {
                    a.eq_ignore_ascii_case(san)
                }
            })
        })
    }
}

impl ClientCertVerifier for SanAllowList {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let sans = facts(end_entity).map(|f| f.sans).unwrap_or_default();
        if self.allows(&sans) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The listener's TLS metrics (prefix `serving_picker_conditions_`).
#[derive(Clone)]
struct TlsMetrics {
    handshakes: Counter,
    refusals: Family<Labels, Counter>,
    reloads: Family<Labels, Counter>,
    cert_not_after: Gauge,
    client_ca_not_after: Gauge,
    plaintext_exposed: Gauge,
}

impl TlsMetrics {
    fn register(r: &mut Registry) -> TlsMetrics {
        TlsMetrics {
            handshakes: registered(
                r,
                "tls_handshakes",
                "TLS handshakes completed on the gRPC listener",
                Counter::default(),
            ),
            refusals: registered(
                r,
                "tls_refusals",
                "Connections refused at the TLS handshake, by reason (no_client_cert, unknown_ca, \
                 san_not_allowed, bad_client_cert, not_tls, client_alert, timeout, displaced, incomplete, other)",
                Family::default(),
            ),
            reloads: registered(
                r,
                "tls_reloads",
                "Changed TLS files read, by result (ok: in use for new connections; error: the last good ones kept)",
                Family::default(),
            ),
            cert_not_after: registered(
                r,
                "tls_certificate_not_after_seconds",
                "Expiry (Unix time) of the certificate served",
                Gauge::default(),
            ),
            client_ca_not_after: registered(
                r,
                "tls_client_ca_not_after_seconds",
                "Earliest expiry (Unix time) of the client CAs in use",
                Gauge::default(),
            ),
            plaintext_exposed: registered(
                r,
                "grpc_plaintext_exposed",
                "1 when the gRPC listener is plaintext on a non-loopback address",
                Gauge::default(),
            ),
        }
    }

    fn loaded(&self, l: &Loaded) {
        self.cert_not_after.set(l.cert.not_after);
        self.client_ca_not_after
            .set(l.client_ca_not_after.unwrap_or_default());
    }

    fn reload(&self, result: &'static str) {
        self.reloads.get_or_create(&vec![("result", result)]).inc();
    }
}

/// The TLS side of a listener: the configuration in use (swapped on
/// reload), its metrics and the refusal log's rate limit.
pub struct TlsServer {
    files: Files,
    config: RwLock<Arc<ServerConfig>>,
    metrics: TlsMetrics,
    refusal_log: Mutex<PerKey<Option<IpAddr>>>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// Registers the TLS metrics, loads the files (an error names the flag and
/// the file) and starts watching them; `None` when the listener is
/// plaintext (logged at warning off loopback).
pub fn start(
    args: &TlsArgs,
    listen: SocketAddr,
    registry: &mut Registry,
) -> Result<Option<Arc<TlsServer>>, LoadError> {
    let metrics = TlsMetrics::register(registry);
    let Some(files) = Files::from_args(args) else {
        let exposed = !listen.ip().is_loopback();
        metrics.plaintext_exposed.set(i64::from(exposed));
        if exposed {
            tracing::warn!(
                listen = %listen,
                "the gRPC listener is plaintext on a non-loopback address: whoever reaches it reads every \
                 endpoint it serves and cannot tell it is genuine; serve TLS (--tls-cert, --tls-key, --client-ca)"
            );
        }
        return Ok(None);
    };
    let contents = read_all(&files)?;
    let loaded = load(&files, &contents, SystemTime::now())?;
    metrics.loaded(&loaded);
    // Both results from 0, so that an alert on increase() sees the first one.
    for result in ["ok", "error"] {
        drop(metrics.reloads.get_or_create(&vec![("result", result)]));
    }
    tracing::info!(
        listen = %listen,
        cert = %files.cert.display(),
        serial = %loaded.cert.serial,
        not_after = %rfc3339(loaded.cert.not_after),
        sans = ?loaded.cert.sans,
        client_ca = %files.client_ca.as_ref().map_or("(none: clients are not authenticated)".into(), |p| p.display().to_string()),
        client_sans = ?files.client_sans,
        "serving gRPC over TLS"
    );
    if files.client_ca.is_none() && !listen.ip().is_loopback() {
        tracing::warn!(listen = %listen, "TLS without --client-ca: any client that reaches the listener is let in");
    }
    let server = Arc::new(TlsServer {
        files,
        config: RwLock::new(loaded.config),
        metrics,
        refusal_log: Mutex::new(PerKey::new(REFUSAL_LOG_EVERY, REFUSAL_PEERS)),
    });
    tokio::spawn(watch(server.clone(), contents));
    Ok(Some(server))
}

impl TlsServer {
    fn current(&self) -> Arc<ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the files; takes new content that loads (true), keeps the
    /// last good configuration otherwise (logged and counted once per
    /// distinct failure).
    fn reload(
        &self,
        last: &mut Contents,
        failed: &mut Option<Result<Contents, LoadError>>,
    ) -> bool {
        let read = read_all(&self.files);
        let contents = match read {
            Ok(c) if c == *last => {
                *failed = None;
                return false;
            }
            Ok(c) => c,
            Err(e) => {
                let again = matches!(failed, Some(Err(f)) if *f == e);
                if !again {
                    self.metrics.reload("error");
                    tracing::warn!(error = %e, "TLS files: cannot read a changed file; the last good ones stay in use");
                    *failed = Some(Err(e));
                }
                return false;
            }
        };
        if matches!(failed, Some(Ok(f)) if *f == contents) {
            return false;
        }
        match load(&self.files, &contents, SystemTime::now()) {
            Ok(loaded) => {
                self.metrics.reload("ok");
                self.metrics.loaded(&loaded);
                tracing::info!(
                    serial = %loaded.cert.serial,
                    not_after = %rfc3339(loaded.cert.not_after),
                    sans = ?loaded.cert.sans,
                    "TLS files reloaded: new connections get them, open ones keep theirs"
                );
                *self.config.write().unwrap_or_else(|p| p.into_inner()) = loaded.config;
                *last = contents;
                *failed = None;
                true
            }
            Err(e) => {
                self.metrics.reload("error");
                tracing::warn!(error = %e, "TLS files changed but do not load: the last good ones stay in use");
                *failed = Some(Ok(contents));
                false
            }
        }
    }

    /// One connection's handshake within `timeout`; `None` when refused
    /// (counted, logged at a bounded rate). The ticket learns the outcome.
    async fn handshake<IO>(
        &self,
        io: IO,
        peer: Option<IpAddr>,
        timeout: Duration,
        ticket: &Ticket,
    ) -> Option<tokio_rustls::server::TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.current());
        match tokio::time::timeout(timeout, acceptor.accept(io)).await {
            Ok(Ok(stream)) => {
                self.metrics.handshakes.inc();
                ticket.established();
                Some(stream)
            }
            Ok(Err(_)) if ticket.displaced() => {
                // Logged by the listener (--max-pending-handshakes).
                self.metrics
                    .refusals
                    .get_or_create(&vec![("reason", "displaced")])
                    .inc();
                None
            }
            Ok(Err(e)) => {
                self.refused(refusal_reason(&e), &e.to_string(), peer);
                None
            }
            Err(_) => {
                ticket.timed_out();
                self.refused(
                    "timeout",
                    "no complete handshake within --handshake-timeout",
                    peer,
                );
                None
            }
        }
    }

    fn refused(&self, reason: &'static str, detail: &str, peer: Option<IpAddr>) {
        self.metrics
            .refusals
            .get_or_create(&vec![("reason", reason)])
            .inc();
        let allowed = self
            .refusal_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow(peer, Instant::now());
        if let Some(quiet) = allowed {
            tracing::warn!(
                peer = %peer.map_or("unknown".into(), |p| p.to_string()),
                reason,
                detail,
                not_logged_since_last = quiet,
                every_s = REFUSAL_LOG_EVERY.as_secs(),
                "TLS handshake refused (logged once per peer address per interval; all counted in tls_refusals_total)"
            );
        }
    }
}

/// Why a handshake failed, from rustls's error.
fn refusal_reason(e: &io::Error) -> &'static str {
    use rustls::Error as E;
    match e.get_ref().and_then(|i| i.downcast_ref::<E>()) {
        Some(E::NoCertificatesPresented) => "no_client_cert",
        Some(E::InvalidCertificate(CertificateError::UnknownIssuer)) => "unknown_ca",
        Some(E::InvalidCertificate(CertificateError::ApplicationVerificationFailure)) => {
            "san_not_allowed"
        }
        Some(E::InvalidCertificate(_)) => "bad_client_cert",
        Some(E::InvalidMessage(_)) => "not_tls",
        Some(E::AlertReceived(_)) => "client_alert",
        Some(_) => "other",
        None if e.kind() == io::ErrorKind::UnexpectedEof => "incomplete",
        None => "other",
    }
}

/// Watches the files until the process ends.
async fn watch(server: Arc<TlsServer>, mut last: Contents) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok() {
            let _ = tx.try_send(());
        }
    });
    let _watcher = match watcher {
        Ok(mut w) => {
            for dir in server.files.dirs() {
                if let Err(e) =
                    notify::Watcher::watch(&mut w, &dir, notify::RecursiveMode::NonRecursive)
                {
                    tracing::warn!(dir = %dir.display(), error = %e, "TLS files: cannot watch the directory; re-read every {} s", POLL_EVERY.as_secs());
                }
            }
            Some(w)
        }
        Err(e) => {
            tracing::warn!(error = %e, "TLS files: no file watcher; re-read every {} s", POLL_EVERY.as_secs());
            None
        }
    };
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed = None;
    loop {
        tokio::select! {
            ev = rx.recv() => {
                if ev.is_none() {
                    break;
                }
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
            }
            _ = tick.tick() => {}
        }
        server.reload(&mut last, &mut failed);
    }
}

/// An accepted connection, plaintext or TLS, as tonic serves it.
pub enum Conn<IO> {
    Plain(IO),
    Tls(Box<tokio_rustls::server::TlsStream<IO>>),
}

impl<IO: Connected> Connected for Conn<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Conn::Plain(io) => io.connect_info(),
            Conn::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(io) => io.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The connections tonic serves: `sockets` as they are (plaintext), or
/// those whose TLS handshake succeeded within `handshake_timeout`.
/// Handshakes run concurrently, each on its own task, so a slow one holds up
/// nobody; each socket's ticket learns when it is established.
pub fn incoming<S, IO>(
    tls: Option<Arc<TlsServer>>,
    sockets: S,
    handshake_timeout: Duration,
) -> Pin<Box<dyn Stream<Item = io::Result<Conn<IO>>> + Send>>
where
    S: Stream<Item = io::Result<IO>> + Send + 'static,
    IO: AsyncRead
        + AsyncWrite
        + Connected<ConnectInfo = TcpConnectInfo>
        + Admitted
        + Unpin
        + Send
        + 'static,
{
    let Some(tls) = tls else {
        return Box::pin(sockets.map(|s| {
            s.map(|io| {
                io.ticket().established();
                Conn::Plain(io)
            })
        }));
    };
    let (tx, rx) = mpsc::channel::<Conn<IO>>(64);
    tokio::spawn(async move {
        let mut sockets = std::pin::pin!(sockets);
        loop {
            let next = tokio::select! {
                next = sockets.next() => next,
                // tonic stopped taking connections (shutdown).
                _ = tx.closed() => break,
            };
            match next {
                Some(Ok(io)) => {
                    let tls = tls.clone();
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let peer = io.connect_info().remote_addr().map(|a| a.ip());
                        let ticket = io.ticket();
                        if let Some(stream) =
                            tls.handshake(io, peer, handshake_timeout, &ticket).await
                        {
                            let _ = tx.send(Conn::Tls(Box::new(stream))).await;
                        }
                    });
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "gRPC listener: accept failed");
                }
                None => break,
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    struct Pki {
        dir: PathBuf,
        ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Pki {
        fn new(tag: &str) -> Pki {
            let dir =
                std::env::temp_dir().join(format!("sp-tls-unit-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            std::fs::write(dir.join("ca.crt"), cert.pem()).unwrap();
            Pki {
                dir,
                ca: rcgen::Issuer::new(params, key),
            }
        }

        fn leaf(&self, name: &str, days: (i64, i64)) -> (String, String) {
            let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now + time::Duration::days(days.0);
            params.not_after = now + time::Duration::days(days.1);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.ca).unwrap();
            (cert.pem(), key.serialize_pem())
        }

        fn files(&self, cert: &str, key: &str) -> (Files, Contents) {
            std::fs::write(self.dir.join("tls.crt"), cert).unwrap();
            std::fs::write(self.dir.join("tls.key"), key).unwrap();
            let files = Files {
                cert: self.dir.join("tls.crt"),
                key: self.dir.join("tls.key"),
                client_ca: Some(self.dir.join("ca.crt")),
                client_sans: vec![],
            };
            let contents = read_all(&files).unwrap();
            (files, contents)
        }
    }

    #[test]
    fn a_good_pair_loads_and_bad_files_name_their_flag_and_path() {
        let pki = Pki::new("load");
        let (cert, key) = pki.leaf("companion", (-1, 30));
        let (files, contents) = pki.files(&cert, &key);
        let loaded = load(&files, &contents, SystemTime::now()).unwrap();
        assert_eq!(loaded.cert.sans, vec!["companion".to_string()]);
        assert_eq!(loaded.config.alpn_protocols, vec![b"h2".to_vec()]);

        let expired = pki.leaf("companion", (-30, -1));
        let (files, contents) = pki.files(&expired.0, &expired.1);
        let e = load(&files, &contents, SystemTime::now()).unwrap_err();
        assert_eq!(e.flag, "--tls-cert");
        assert!(e.why.contains("expired"), "{e}");

        let other = pki.leaf("other", (-1, 30));
        let (files, contents) = pki.files(&cert, &other.1);
        let e = load(&files, &contents, SystemTime::now()).unwrap_err();
        assert_eq!(e.flag, "--tls-key");
        assert!(e.why.contains("does not match"), "{e}");
        assert!(
            e.to_string().contains(&files.key.display().to_string()),
            "{e}"
        );

        let (files, contents) = pki.files("not a certificate", &key);
        let e = load(&files, &contents, SystemTime::now()).unwrap_err();
        assert_eq!(e.flag, "--tls-cert");

        let (files, contents) = pki.files(&cert, "");
        let e = load(&files, &contents, SystemTime::now()).unwrap_err();
        assert_eq!(e.flag, "--tls-key");
        // Never the key's content in an error.
        assert!(!e.to_string().contains("PRIVATE KEY-----"), "{e}");

        let missing = Files {
            cert: pki.dir.join("nope.crt"),
            ..files
        };
        let e = read_all(&missing).unwrap_err();
        assert_eq!(e.flag, "--tls-cert");
        assert!(e.to_string().contains("nope.crt"), "{e}");
        let _ = std::fs::remove_dir_all(&pki.dir);
    }

    #[test]
    fn san_allow_list_matches_dns_without_case_and_uris_exactly() {
        let l = SanAllowList {
            inner: WebPkiClientVerifier::builder_with_provider(
                Arc::new({
                    let pki = Pki::new("san");
                    let mut r = RootCertStore::empty();
                    let pem = std::fs::read(pki.dir.join("ca.crt")).unwrap();
                    r.add(CertificateDer::from_pem_slice(&pem).unwrap())
                        .unwrap();
                    let _ = std::fs::remove_dir_all(&pki.dir);
                    r
                }),
                provider(),
            )
            .build()
            .unwrap(),
            allowed: vec![
                "envoy.example".into(),
                "spiffe://cluster.local/ns/eg/sa/envoy-gateway".into(),
            ],
        };
        assert!(l.allows(&["Envoy.Example".into()]));
        assert!(l.allows(&[
            "x".into(),
            "spiffe://cluster.local/ns/eg/sa/envoy-gateway".into()
        ]));
        assert!(!l.allows(&["spiffe://cluster.local/ns/eg/sa/Envoy-Gateway".into()]));
        assert!(!l.allows(&["other.example".into()]));
        assert!(!l.allows(&[]));
    }
}
