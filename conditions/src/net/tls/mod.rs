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
//!
//! One job per file: `load` (reading the files, making a rustls
//! configuration, the errors naming flag and file), `x509` (a
//! certificate's public facts), `verifier` (the client SAN allow-list),
//! `metrics`, `server` (start and the configuration in use), `reload`
//! (watching the files), `accept` (handshakes and refusals), `conn` (the
//! connection type tonic serves).

use std::path::PathBuf;
use std::time::Duration;

mod accept;
mod conn;
mod load;
mod metrics;
mod reload;
mod server;
mod verifier;
mod x509;

pub use accept::incoming;
pub use conn::Conn;
pub use load::LoadError;
pub use server::{start, TlsServer};

/// At most one log line per refused peer address per this interval.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);
/// The files are re-read this often even without a change event.
pub const POLL_EVERY: Duration = Duration::from_secs(10);

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
