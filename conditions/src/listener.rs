//! The gRPC listener's connections, counted and capped (`--max-connections`).
//!
//! Every accepted socket is a [`LimitedIo`] registered in [`Connections`]
//! by its peer address, which is how a call finds its connection (a TLS
//! layer over the socket keeps the peer address). A connection over the cap
//! is still served, briefly: each of its calls is answered
//! RESOURCE_EXHAUSTED naming the flag (`serve::RefuseOverCap`), a clear status
//! where a bare close would be a mystery, then it is closed. Past a few
//! such connections at once, further ones are closed at accept.
//!
//! A connection can be closed from outside ([`Conn::close`]): how a stream
//! that does not read is cut (`--send-timeout`), since HTTP/2 gives a stream
//! whose window is shut no chance to be reset.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::Status;

use crate::limits::{names, GrpcLimits};
use crate::metrics::Metrics;
use crate::ratelog::LogBudget;

/// Over-cap connections answered at once; more are closed at accept.
const REFUSING_AT_ONCE: usize = 64;
/// How long an over-cap connection is answered before it is closed.
const REFUSE_FOR: Duration = Duration::from_secs(1);

static REFUSED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

/// One accepted connection.
#[derive(Debug)]
pub struct Conn {
    pub peer: SocketAddr,
    /// Over `--max-connections`: every call is refused.
    pub over_cap: bool,
    /// xDS streams open on it.
    pub streams: AtomicUsize,
    closed: AtomicBool,
    read_waker: AtomicWaker,
    write_waker: AtomicWaker,
}

impl Conn {
    fn new(peer: SocketAddr, over_cap: bool) -> Conn {
        Conn {
            peer,
            over_cap,
            streams: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
        }
    }

    /// Closes the connection: its reads end and its writes fail, so the
    /// HTTP/2 server drops it and every stream on it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.read_waker.wake();
        self.write_waker.wake();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// The open connections of one gRPC listener.
pub struct Connections {
    max: usize,
    per_connection: usize,
    open: AtomicUsize,
    refusing: AtomicUsize,
    by_peer: Mutex<HashMap<SocketAddr, Arc<Conn>>>,
    metrics: Arc<Metrics>,
}

impl Connections {
    pub fn new(limits: &GrpcLimits, metrics: Arc<Metrics>) -> Arc<Connections> {
        metrics.set_limit(names::MAX_CONNECTIONS, limits.max_connections as i64);
        metrics.set_limit(
            names::MAX_STREAMS_PER_CONNECTION,
            i64::from(limits.max_streams_per_connection),
        );
        Arc::new(Connections {
            max: limits.max_connections,
            per_connection: limits.max_streams_per_connection as usize,
            open: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
            by_peer: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// `--max-streams-per-connection`.
    pub fn max_streams_per_connection(&self) -> usize {
        self.per_connection
    }

    /// Connections open (over-cap ones being refused not counted).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The connection a request came on.
    pub fn of<T>(&self, req: &tonic::Request<T>) -> Option<Arc<Conn>> {
        self.by_addr(req.remote_addr()?)
    }

    /// The connection an HTTP request came on (through tonic's reading of
    /// the peer address, which sees through its TLS layer).
    pub fn of_http<B>(&self, req: &http::Request<B>) -> Option<Arc<Conn>> {
        let mut probe = http::Request::new(());
        *probe.extensions_mut() = req.extensions().clone();
        self.of(&tonic::Request::from_http(probe))
    }

    fn by_addr(&self, addr: SocketAddr) -> Option<Arc<Conn>> {
        self.by_peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    /// An accepted socket: registered, or `None` when it is closed at once.
    fn admit(self: &Arc<Self>, io: TcpStream, peer: SocketAddr) -> Option<LimitedIo> {
        let _ = io.set_nodelay(true);
        let over_cap = self.open.fetch_add(1, Ordering::SeqCst) >= self.max;
        if over_cap {
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.metrics.limit_hit(names::MAX_CONNECTIONS);
            self.metrics.xds_refused(names::MAX_CONNECTIONS);
            if let Some(left_out) = REFUSED_LOG.allow() {
                tracing::warn!(peer = %peer, max = self.max, left_out, "gRPC connection over --max-connections: refused");
            }
            if self.refusing.fetch_add(1, Ordering::SeqCst) >= REFUSING_AT_ONCE {
                self.refusing.fetch_sub(1, Ordering::SeqCst);
                return None;
            }
        } else {
            self.metrics.connection_opened();
        }
        let conn = Arc::new(Conn::new(peer, over_cap));
        self.by_peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, conn.clone());
        if over_cap {
            let c = conn.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REFUSE_FOR).await;
                c.close();
            });
        }
        Some(LimitedIo {
            io,
            conn,
            connections: self.clone(),
        })
    }

    fn release(&self, conn: &Arc<Conn>) {
        let mut map = self.by_peer.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&conn.peer).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            map.remove(&conn.peer);
        }
        drop(map);
        if conn.over_cap {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
        } else {
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.metrics.connection_closed();
        }
    }

    /// The status every call on an over-cap connection gets.
    pub fn over_cap_status(&self) -> Status {
        Status::resource_exhausted(format!(
            "connection limit reached: {} gRPC connections are open (--max-connections); retry later",
            self.max
        ))
    }
}

/// An accepted socket, counted until dropped, closable from outside.
pub struct LimitedIo {
    io: TcpStream,
    conn: Arc<Conn>,
    connections: Arc<Connections>,
}

impl LimitedIo {
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl Drop for LimitedIo {
    fn drop(&mut self) {
        self.connections.release(&self.conn);
    }
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "closed by the companion")
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.conn.read_waker.register(cx.waker());
        if self.conn.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.conn.write_waker.register(cx.waker());
        if self.conn.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.conn.write_waker.register(cx.waker());
        if self.conn.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.conn.is_closed() {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connected for LimitedIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

/// Connections the kernel queues for `accept` (it caps it at
/// `net.core.somaxconn`): a fleet of Envoys reconnecting at once, after a
/// restart, must not overflow the queue (std's 128 drops connections).
pub const ACCEPT_BACKLOG: u32 = 4096;

/// A listening socket on `addr` with [`ACCEPT_BACKLOG`] (and
/// SO_REUSEADDR, as tokio's own bind).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// The listener's connections as the gRPC server takes them.
pub fn incoming(
    listener: TcpListener,
    connections: Arc<Connections>,
) -> impl Stream<Item = io::Result<LimitedIo>> + Send + 'static {
    futures::stream::unfold(
        (listener, connections),
        |(listener, connections)| async move {
            loop {
                match listener.accept().await {
                    Ok((io, peer)) => {
                        if let Some(io) = connections.admit(io, peer) {
                            return Some((Ok(io), (listener, connections)));
                        }
                    }
                    Err(e) => {
                        // Out of file descriptors, mostly: wait instead of spinning.
                        tracing::warn!(error = %e, "gRPC listener: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        },
    )
}
