//! The TLS side of a listener: start (load, register, log, watch) and the
//! configuration in use, swapped on reload.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use prometheus_client::registry::Registry;
use rustls::ServerConfig;

use super::load::{load, read_all, Files, LoadError};
use super::metrics::TlsMetrics;
use super::x509::rfc3339;
use super::{TlsArgs, REFUSAL_LOG_EVERY};
use crate::telemetry::log_limit::PerKey;

/// Peer addresses remembered for rate-limiting refusal logs.
const REFUSAL_PEERS: usize = 4096;

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
    tokio::spawn(super::reload::watch(server.clone(), contents));
    Ok(Some(server))
}

impl TlsServer {
    pub(super) fn current(&self) -> Arc<ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
