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
//!
//! Each established connection belongs to a *peer* ([`PeerKey`]: its
//! address, and under mutual TLS the client certificate it showed), which
//! has a bounded share of the connections (`--max-connections-per-peer`)
//! and, through [`PeerShare`], of the xDS streams and request bytes. A
//! connection whose first call has not come within `--preface-timeout` of
//! its accept is closed, and one still open `--max-connection-age-grace`
//! after the GOAWAY of `--max-connection-age` is closed too.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
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
static DEADLINE_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

/// Who a connection is, for the per-peer shares: its address, and under
/// mutual TLS the client certificate it showed (a keyed hash of it, never
/// the certificate). A fleet of Envoys may share one certificate, so the
/// address is always part of the key: one certificate alone would put a
/// whole fleet in one share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerKey {
    ip: IpAddr,
    identity: Option<u64>,
}

impl PeerKey {
    /// The key of a connection from `ip` that showed `certificate` (DER;
    /// `None`: no client certificate).
    pub fn new(ip: IpAddr, certificate: Option<&[u8]>) -> PeerKey {
        static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        PeerKey {
            ip,
            identity: certificate.map(|der| KEYS.get_or_init(Default::default).hash_one(der)),
        }
    }

    /// The label of its class in metrics (`peer_class`): `mtls` or `address`.
    pub fn class(&self) -> &'static str {
        if self.identity.is_some() {
            "mtls"
        } else {
            "address"
        }
    }
}

/// What one peer holds, over its connections.
#[derive(Debug)]
pub struct PeerShare {
    /// Whose share.
    pub key: PeerKey,
    /// Its connections that hold a `--max-connections` slot.
    connections: AtomicUsize,
    /// Its xDS streams open (`--max-streams-per-peer`).
    pub streams: AtomicUsize,
    /// Its share of the request buffer (`--request-buffer-bytes-per-peer`),
    /// made by the xDS server when the peer's first stream opens.
    request_budget: OnceLock<Arc<Semaphore>>,
}

impl PeerShare {
    fn new(key: PeerKey) -> PeerShare {
        PeerShare {
            key,
            connections: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            request_budget: OnceLock::new(),
        }
    }

    /// Its request budget, of `bytes` when it is made.
    pub fn request_budget(&self, bytes: usize) -> Arc<Semaphore> {
        self.request_budget
            .get_or_init(|| Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))))
            .clone()
    }
}

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
    /// When it was accepted (`--preface-timeout` runs from it).
    accepted: Instant,
    /// A call came on it (`--preface-timeout` is met).
    called: AtomicBool,
    /// Its peer's share, once established.
    share: OnceLock<Arc<PeerShare>>,
    /// Refused over its peer's share (`--max-connections-per-peer`), not
    /// over `--max-connections`.
    over_peer_share: AtomicBool,
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
            accepted: Instant::now(),
            called: AtomicBool::new(false),
            share: OnceLock::new(),
            over_peer_share: AtomicBool::new(false),
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

    /// A call came on it: `--preface-timeout` is met.
    pub fn called(&self) {
        self.called.store(true, Ordering::SeqCst);
    }

    /// Its peer's share (`None` before it is established, or refused).
    pub fn share(&self) -> Option<&Arc<PeerShare>> {
        self.share.get()
    }
}

/// The open connections of one gRPC listener.
pub struct Connections {
    max: usize,
    max_pending: usize,
    per_connection: usize,
    per_peer: usize,
    preface_timeout: Duration,
    max_age: Duration,
    age_grace: Duration,
    /// Each peer's share, while it has a connection.
    peers: Mutex<HashMap<PeerKey, Arc<PeerShare>>>,
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
        metrics.set_limit(
            names::MAX_CONNECTIONS_PER_PEER,
            limits.max_connections_per_peer as i64,
        );
        metrics.set_limit(
            names::PREFACE_TIMEOUT,
            limits.preface_timeout.as_secs() as i64,
        );
        metrics.set_limit(
            names::MAX_CONNECTION_AGE,
            limits.max_connection_age.as_secs() as i64,
        );
        metrics.set_limit(
            names::MAX_CONNECTION_AGE_GRACE,
            limits.max_connection_age_grace.as_secs() as i64,
        );
        Arc::new(Connections {
            max: limits.max_connections,
            max_pending: limits.max_pending_handshakes.max(1),
            per_connection: limits.max_streams_per_connection as usize,
            per_peer: limits.max_connections_per_peer.max(1),
            preface_timeout: limits.preface_timeout,
            max_age: limits.max_connection_age,
            age_grace: limits.max_connection_age_grace,
            peers: Mutex::new(HashMap::new()),
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

    /// A per-peer share or deadline was hit by a peer of this class.
    pub fn peer_limit_hit(&self, name: &'static str, peer_class: &'static str) {
        self.metrics.peer_limit_hit(name, peer_class);
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
    fn establish(&self, conn: &Arc<Conn>, key: PeerKey) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.remove(&conn.seq).is_none() {
                // Displaced meanwhile (closed), or established already.
                return;
            }
            self.metrics.set_pending_handshakes(pending.len());
        }
        // Counted under the lock that forgets a share with its last
        // connection, so that a share is never counted once forgotten.
        let (share, over_share) = {
            let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            let share = peers
                .entry(key)
                .or_insert_with(|| Arc::new(PeerShare::new(key)))
                .clone();
            let over = share.connections.load(Ordering::SeqCst) >= self.per_peer;
            if !over {
                share.connections.fetch_add(1, Ordering::SeqCst);
            }
            (share, over)
        };
        if over_share {
            conn.over_peer_share.store(true, Ordering::SeqCst);
            self.metrics
                .peer_limit_hit(names::MAX_CONNECTIONS_PER_PEER, key.class());
            self.metrics.xds_refused(names::MAX_CONNECTIONS_PER_PEER);
            if let Some(left_out) = REFUSED_LOG.allow() {
                tracing::warn!(peer = %conn.peer, peer_class = key.class(), max = self.per_peer, left_out, "gRPC connection over --max-connections-per-peer: refused");
            }
        } else if self.open.fetch_add(1, Ordering::SeqCst) < self.max {
            conn.slot.store(OPEN, Ordering::SeqCst);
            let _ = conn.share.set(share);
            self.metrics.connection_opened();
            self.spawn_deadlines(conn);
            return;
        } else {
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.forget_share(&share);
            self.metrics.limit_hit(names::MAX_CONNECTIONS);
            self.metrics.xds_refused(names::MAX_CONNECTIONS);
            if let Some(left_out) = REFUSED_LOG.allow() {
                tracing::warn!(peer = %conn.peer, max = self.max, left_out, "gRPC connection over --max-connections: refused");
            }
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

    /// Gives back a connection slot of `share`; the share is forgotten
    /// with its last connection.
    fn forget_share(&self, share: &Arc<PeerShare>) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if share.connections.fetch_sub(1, Ordering::SeqCst) == 1
            && peers.get(&share.key).is_some_and(|s| Arc::ptr_eq(s, share))
        {
            peers.remove(&share.key);
        }
    }

    /// The deadlines of an established connection: its first call within
    /// `--preface-timeout` of its accept, and its end within
    /// `--max-connection-age-grace` after `--max-connection-age` (whose
    /// GOAWAY the HTTP/2 server sends).
    fn spawn_deadlines(&self, conn: &Arc<Conn>) {
        let weak = Arc::downgrade(conn);
        let metrics = self.metrics.clone();
        // A duration too long to add is no deadline.
        let preface_due = conn.accepted.checked_add(self.preface_timeout);
        let age_due = conn.accepted.checked_add(self.max_age);
        let grace_due = age_due.and_then(|a| a.checked_add(self.age_grace));
        tokio::spawn(async move {
            let Some(preface_due) = preface_due else {
                return;
            };
            tokio::time::sleep_until(preface_due).await;
            let Some(c) = weak.upgrade() else { return };
            if !c.called.load(Ordering::SeqCst) && !c.is_closed() {
                c.close();
                let class = c.share().map_or("address", |s| s.key.class());
                metrics.peer_limit_hit(names::PREFACE_TIMEOUT, class);
                if let Some(left_out) = DEADLINE_LOG.allow() {
                    tracing::warn!(peer = %c.peer, left_out, "gRPC connection without a call within --preface-timeout: closed");
                }
                return;
            }
            drop(c);
            let (Some(age_due), Some(grace_due)) = (age_due, grace_due) else {
                return;
            };
            tokio::time::sleep_until(age_due).await;
            let Some(c) = weak.upgrade() else { return };
            if c.is_closed() {
                return;
            }
            let class = c.share().map_or("address", |s| s.key.class());
            metrics.connection_aged(names::MAX_CONNECTION_AGE, class);
            drop(c);
            tokio::time::sleep_until(grace_due).await;
            let Some(c) = weak.upgrade() else { return };
            if !c.is_closed() {
                c.close();
                metrics.connection_aged(names::MAX_CONNECTION_AGE_GRACE, class);
                if let Some(left_out) = DEADLINE_LOG.allow() {
                    tracing::info!(peer = %c.peer, left_out, "gRPC connection still open --max-connection-age-grace after its GOAWAY (--max-connection-age): closed");
                }
            }
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
                if let Some(share) = conn.share() {
                    self.forget_share(share);
                }
                self.metrics.connection_closed();
            }
            REFUSING => {
                self.refusing.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    /// The status every call on an over-cap connection gets.
    pub fn over_cap_status(&self, conn: &Conn) -> Status {
        if conn.over_peer_share.load(Ordering::SeqCst) {
            return Status::resource_exhausted(format!(
                "connection limit reached: {} gRPC connections are open from this peer (--max-connections-per-peer); retry later",
                self.per_peer
            ));
        }
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
    /// The handshake is done (or there is none: plaintext); `certificate`:
    /// the client certificate it showed (DER), part of its peer's key.
    pub fn established(&self, certificate: Option<&[u8]>) {
        let key = PeerKey::new(self.conn.peer.ip(), certificate);
        self.connections.establish(&self.conn, key);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_peer_is_its_address_and_under_mutual_tls_its_certificate_on_it() {
        let a = IpAddr::from([10, 0, 0, 1]);
        let b = IpAddr::from([10, 0, 0, 2]);
        assert_eq!(PeerKey::new(a, None).class(), "address");
        assert_eq!(PeerKey::new(a, Some(b"cert-1")).class(), "mtls");
        assert_eq!(PeerKey::new(a, None), PeerKey::new(a, None));
        assert_ne!(PeerKey::new(a, None), PeerKey::new(b, None));
        assert_eq!(
            PeerKey::new(a, Some(b"cert-1")),
            PeerKey::new(a, Some(b"cert-1"))
        );
        // A fleet sharing one certificate: one share per pod address.
        assert_ne!(
            PeerKey::new(a, Some(b"cert-1")),
            PeerKey::new(b, Some(b"cert-1"))
        );
        assert_ne!(
            PeerKey::new(a, Some(b"cert-1")),
            PeerKey::new(a, Some(b"cert-2"))
        );
        assert_ne!(PeerKey::new(a, Some(b"cert-1")), PeerKey::new(a, None));
    }

    #[tokio::test]
    async fn a_peer_holds_at_most_its_share_of_the_connections() {
        let metrics = Arc::new(Metrics::with_registry(
            Metrics::new_registry(),
            Default::default(),
        ));
        let limits = GrpcLimits {
            max_connections: 10,
            max_connections_per_peer: 2,
            ..GrpcLimits::default()
        };
        let connections = Connections::new(&limits, metrics.clone());
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        for _ in 0..3 {
            let _client = TcpStream::connect(addr).await.unwrap();
            let (io, peer) = listener.accept().await.unwrap();
            let io = connections.admit(io, peer);
            io.ticket().established(None);
            held.push((io, _client));
        }
        assert_eq!(connections.open(), 2);
        assert!(!held[0].0.conn().over_cap() && !held[1].0.conn().over_cap());
        let third = held[2].0.conn().clone();
        assert!(third.over_cap());
        assert!(connections
            .over_cap_status(&third)
            .message()
            .contains("--max-connections-per-peer"));
        // The share is given back with a connection, and forgotten with the last.
        held.remove(0);
        assert_eq!(connections.open(), 1);
        held.clear();
        assert_eq!(connections.open(), 0);
        assert!(connections.peers.lock().unwrap().is_empty());
        assert!(metrics.render().contains(
            "peer_limit_hits_total{limit=\"max-connections-per-peer\",peer_class=\"address\"} 1"
        ));
    }
}
