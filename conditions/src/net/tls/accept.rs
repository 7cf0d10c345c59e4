//! The accept path: each socket's handshake on its own task, the
//! connections that pass handed to tonic.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::net::listener::Admitted;

use super::server::TlsServer;

/// An accepted connection, plaintext or TLS, as tonic serves it.
pub enum Conn<IO> {
    /// A plaintext connection (no `--tls-cert`).
    Plain(IO),
    /// A TLS connection, its handshake done.
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
                io.ticket().established(None);
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
