//! The TLS side of a listener: the configuration in use, reloaded as the
//! files change, and each connection's handshake.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::registry::Registry;
use rustls::CertificateError;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::net::listener::Ticket;
use crate::telemetry::ratelog::PerKey;

use super::config::load;
use super::files::{read_all, Contents, Files, LoadError};
use super::metrics::TlsMetrics;
use super::x509::rfc3339;
use crate::net::watch::DirWatch;

use super::{TlsArgs, POLL_EVERY, REFUSAL_LOG_EVERY, REFUSAL_PEERS, SETTLE};

/// The TLS side of a listener: the configuration in use (swapped on
/// reload), its metrics and the refusal log's rate limit.
pub struct TlsServer {
    pub(super) files: Files,
    pub(super) config: RwLock<Arc<ServerConfig>>,
    pub(super) metrics: TlsMetrics,
    pub(super) refusal_log: Mutex<PerKey<Option<IpAddr>>>,
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
    pub(super) fn current(&self) -> Arc<ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the files; takes new content that loads (true), keeps the
    /// last good configuration otherwise (logged and counted once per
    /// distinct failure).
    pub(super) fn reload(
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
    pub(super) async fn handshake<IO>(
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
                let certificate = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|leaf| leaf.as_ref());
                ticket.established(certificate);
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

    pub(super) fn refused(&self, reason: &'static str, detail: &str, peer: Option<IpAddr>) {
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
pub(super) fn refusal_reason(e: &io::Error) -> &'static str {
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
    let (mut changes, not_watched) = DirWatch::start(server.files.dirs(), SETTLE, POLL_EVERY);
    for n in not_watched {
        tracing::warn!(dir = %n.dir.display(), error = %n.error, "TLS files: cannot watch the directory; re-read every {} s", POLL_EVERY.as_secs());
    }
    let mut failed = None;
    loop {
        changes.next().await;
        server.reload(&mut last, &mut failed);
    }
}
