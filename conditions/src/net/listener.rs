//! The gRPC listener's connections, counted and capped (`--max-connections`).
//!
//! Every accepted socket is a [`LimitedIo`] registered in [`Connections`]
//! by its peer address, which is how a call finds its connection (a TLS
//! layer over the socket keeps the peer address). A connection over the cap
//! is still served, briefly: each of its calls is answered
//! RESOURCE_EXHAUSTED naming the flag (`run::RefuseOverCap`), a clear status
//! where a bare close would be a mystery, then it is closed. Past a few
//! such connections at once, further ones are closed at accept.
//!
//! A connection can be closed from outside ([`Conn::close`]): how a stream
//! that does not read is cut (`--send-timeout`), since HTTP/2 gives a stream
//! whose window is shut no chance to be reset.
//!
//! On a TLS listener a socket is first *pending*: it holds no
//! `--max-connections` slot until its handshake is done
//! ([`Ticket::established`]). Pending sockets have a bound of their own
//! (`--max-pending-handshakes`) and a shorter life (`--handshake-timeout`);
//! when the bound is full the oldest pending socket is dropped to admit the
//! new one. Sockets that never finish a handshake therefore cannot lock out
//! a client that does: a good client's handshake takes milliseconds, so it
//! is established long before it could become the oldest.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
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
use crate::telemetry::metrics::Metrics;
use crate::telemetry::ratelog::LogBudget;

/// Over-cap connections answered at once; more are closed at accept.
const REFUSING_AT_ONCE: usize = 64;
/// How long an over-cap connection is answered before it is closed.
const REFUSE_FOR: Duration = Duration::from_secs(1);

static REFUSED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static DISPLACED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

/// Where a connection is counted (`Conn::slot`).
const PENDING: u8 = 0;
const OPEN: u8 = 1;
const REFUSING: u8 = 2;
const UNCOUNTED: u8 = 3;

/// One accepted connection.
#[derive(Debug)]
pub struct Conn {
    /// The client's address (what the connection is found by).
    pub peer: SocketAddr,
    /// Accepted in this order (the oldest pending one is dropped first).
    seq: u64,
    /// PENDING, OPEN, REFUSING or UNCOUNTED.
    slot: AtomicU8,
    /// xDS streams open on it.
    pub streams: AtomicUsize,
    closed: AtomicBool,
    read_waker: AtomicWaker,
    write_waker: AtomicWaker,
}

impl Conn {
    pub(crate) fn new(peer: SocketAddr, seq: u64) -> Conn {
        Conn {
            peer,
            seq,
            slot: AtomicU8::new(PENDING),
            streams: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
        }
    }

    /// Its number: unique among the process's connections.
    pub fn id(&self) -> u64 {
        self.seq
    }

    /// Over `--max-connections`: every call is refused.
    pub fn over_cap(&self) -> bool {
        self.slot.load(Ordering::SeqCst) == REFUSING
    }

    /// Closes the connection: its reads end and its writes fail, so the
    /// HTTP/2 server drops it and every stream on it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.read_waker.wake();
        self.write_waker.wake();
    }

    /// `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// The open connections of one gRPC listener.
pub struct Connections {
    max: usize,
    max_pending: usize,
    per_connection: usize,
    open: AtomicUsize,
    refusing: AtomicUsize,
    next_seq: AtomicU64,
    /// Sockets whose handshake is not done, oldest first.
    pending: Mutex<BTreeMap<u64, Arc<Conn>>>,
    by_peer: Mutex<HashMap<SocketAddr, Arc<Conn>>>,
    metrics: Arc<Metrics>,
}

impl Connections {
    /// The bookkeeping of a listener with these limits, each exported as a `limit` gauge.
    pub fn new(limits: &GrpcLimits, metrics: Arc<Metrics>) -> Arc<Connections> {
        metrics.set_limit(names::MAX_CONNECTIONS, limits.max_connections as i64);
        metrics.set_limit(
            names::MAX_PENDING_HANDSHAKES,
            limits.max_pending_handshakes as i64,
        );
        metrics.set_limit(
            names::HANDSHAKE_TIMEOUT,
            limits.handshake_timeout.as_secs() as i64,
        );
        metrics.set_limit(
            names::MAX_STREAMS_PER_CONNECTION,
            i64::from(limits.max_streams_per_connection),
        );
        Arc::new(Connections {
            max: limits.max_connections,
            max_pending: limits.max_pending_handshakes.max(1),
            per_connection: limits.max_streams_per_connection as usize,
            open: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            pending: Mutex::new(BTreeMap::new()),
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

    /// An accepted socket: registered as pending (its handshake not done),
    /// the oldest pending one dropped when `--max-pending-handshakes` are.
    fn admit(self: &Arc<Self>, io: TcpStream, peer: SocketAddr) -> LimitedIo {
        let _ = io.set_nodelay(true);
        let conn = Arc::new(Conn::new(
            peer,
            self.next_seq.fetch_add(1, Ordering::SeqCst),
        ));
        let displaced = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let displaced = if pending.len() >= self.max_pending {
                pending.pop_first().map(|(_, c)| c)
            } else {
                None
            };
            pending.insert(conn.seq, conn.clone());
            self.metrics.set_pending_handshakes(pending.len());
            displaced
        };
        if let Some(old) = displaced {
            // Counted nowhere from now on; its handshake ends with the close.
            old.slot.store(UNCOUNTED, Ordering::SeqCst);
            old.close();
            self.metrics.limit_hit(names::MAX_PENDING_HANDSHAKES);
            if let Some(left_out) = DISPLACED_LOG.allow() {
                tracing::warn!(
                    peer = %old.peer,
                    max = self.max_pending,
                    left_out,
                    "gRPC connection dropped before its handshake was done: --max-pending-handshakes are pending (the oldest is dropped first)"
                );
            }
        }
        self.by_peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, conn.clone());
        LimitedIo {
            io,
            conn,
            connections: self.clone(),
        }
    }

    /// The handshake of `conn` is done: it takes a `--max-connections`
    /// slot, or is refused over the cap (answered RESOURCE_EXHAUSTED for a
    /// moment, then closed; closed at once past a few of those).
    fn establish(&self, conn: &Arc<Conn>) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.remove(&conn.seq).is_none() {
                // Displaced meanwhile (closed), or established already.
                return;
            }
            self.metrics.set_pending_handshakes(pending.len());
        }
        if self.open.fetch_add(1, Ordering::SeqCst) < self.max {
            conn.slot.store(OPEN, Ordering::SeqCst);
            self.metrics.connection_opened();
            return;
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.metrics.limit_hit(names::MAX_CONNECTIONS);
        self.metrics.xds_refused(names::MAX_CONNECTIONS);
        if let Some(left_out) = REFUSED_LOG.allow() {
            tracing::warn!(peer = %conn.peer, max = self.max, left_out, "gRPC connection over --max-connections: refused");
        }
        if self.refusing.fetch_add(1, Ordering::SeqCst) >= REFUSING_AT_ONCE {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
            conn.slot.store(UNCOUNTED, Ordering::SeqCst);
            conn.close();
            return;
        }
        conn.slot.store(REFUSING, Ordering::SeqCst);
        let c = conn.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFUSE_FOR).await;
            c.close();
        });
    }

    fn release(&self, conn: &Arc<Conn>) {
        let mut map = self.by_peer.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&conn.peer).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            map.remove(&conn.peer);
        }
        drop(map);
        match conn.slot.swap(UNCOUNTED, Ordering::SeqCst) {
            PENDING => {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                pending.remove(&conn.seq);
                self.metrics.set_pending_handshakes(pending.len());
            }
            OPEN => {
                self.open.fetch_sub(1, Ordering::SeqCst);
                self.metrics.connection_closed();
            }
            REFUSING => {
                self.refusing.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
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
    /// The connection this socket is.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

/// What the handshake layer reports of a socket, kept apart from the socket
/// (which the handshake consumes).
pub struct Ticket {
    conn: Arc<Conn>,
    connections: Arc<Connections>,
}

impl Ticket {
    /// The handshake is done (or there is none: plaintext).
    pub fn established(&self) {
        self.connections.establish(&self.conn);
    }

    /// Dropped to admit a newer socket (`--max-pending-handshakes`).
    pub fn displaced(&self) -> bool {
        self.conn.slot.load(Ordering::SeqCst) == UNCOUNTED && self.conn.is_closed()
    }

    /// Not done within `--handshake-timeout` (counted as that limit's hit).
    pub fn timed_out(&self) {
        self.connections.metrics.limit_hit(names::HANDSHAKE_TIMEOUT);
    }
}

/// A socket that goes through a handshake before it counts as a connection.
pub trait Admitted {
    /// The socket's ticket, for the handshake to report on.
    fn ticket(&self) -> Ticket;
}

impl Admitted for LimitedIo {
    fn ticket(&self) -> Ticket {
        Ticket {
            conn: self.conn.clone(),
            connections: self.connections.clone(),
        }
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
                        let io = connections.admit(io, peer);
                        return Some((Ok(io), (listener, connections)));
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
