//! The accept path: TLS handshakes on their own tasks, bounded in time,
//! and refusals counted by reason and logged at a bounded rate.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use rustls::CertificateError;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::conn::Conn;
use super::server::TlsServer;
use super::REFUSAL_LOG_EVERY;
use crate::net::listener::{Admitted, Ticket};

impl TlsServer {
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
