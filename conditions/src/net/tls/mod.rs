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
//! - The files are watched (their directories through `net::watch`:
//!   inotify, which sees a Secret volume's `..data` symlink swap, debounced,
//!   and a re-read every `POLL_EVERY` as a safety net). New content that
//!   loads replaces the server configuration for new connections; open
//!   connections keep theirs (their session is theirs), so streams are not
//!   dropped. New content that does not load is logged, counted, and the
//!   last good configuration stays.
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
//! Files, one job each: `files` (which files, read), `x509` (a
//! certificate's facts and validity), `config` (files -> rustls
//! configuration), `verifier` (the `--client-san` allow-list), `metrics`,
//! `server` (the configuration in use, reloads through `net::watch`, a
//! connection's handshake), `accept` (the accept path and [`Conn`]).

mod accept;
mod config;
mod files;
mod metrics;
mod server;
mod verifier;
mod x509;

use std::path::PathBuf;
use std::time::Duration;

pub use accept::{incoming, Conn};
pub use files::LoadError;
pub use server::{start, TlsServer};
pub use x509::san_names;

/// At most one log line per refused peer address per this interval.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);
/// The files are re-read this often even without a change event.
pub const POLL_EVERY: Duration = Duration::from_secs(10);
/// Events arriving together (a Secret update touches several names) are
/// read once, this long after the first.
pub(super) const SETTLE: Duration = Duration::from_millis(200);
/// Peer addresses remembered for rate-limiting refusal logs.
pub(super) const REFUSAL_PEERS: usize = 4096;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::config::{load, provider};
    use super::files::{read_all, Contents, Files};
    use super::verifier::SanAllowList;
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use rustls::server::WebPkiClientVerifier;
    use rustls::RootCertStore;
    use std::sync::Arc;
    use std::time::SystemTime;

    /// A CA from the harness's helper, its certificate in `dir/ca.crt`.
    struct Pki {
        dir: PathBuf,
        ca: pki::Ca,
    }

    impl Pki {
        fn new(tag: &str) -> Pki {
            let dir =
                std::env::temp_dir().join(format!("sp-tls-unit-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let ca = pki::Ca::new("serving-picker test CA");
            std::fs::write(dir.join("ca.crt"), &ca.pem).unwrap();
            Pki { dir, ca }
        }

        /// A server certificate for `name`, valid from `days.0` to `days.1`
        /// days from now: (cert, key) PEM.
        fn leaf(&self, name: &str, days: (i64, i64)) -> (String, String) {
            let leaf = self.ca.leaf(
                &[name],
                pki::ExtendedKeyUsagePurpose::ServerAuth,
                days.0,
                days.1,
            );
            (leaf.cert_pem, leaf.key_pem)
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
