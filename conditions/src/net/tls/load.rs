//! Reading the TLS files and making a rustls server configuration from
//! them; every error names the flag and the file, never a key's content.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::verifier::SanAllowList;
use super::x509::{facts, rfc3339, unix, CertFacts};
use super::TlsArgs;

/// The files of a TLS listener.
#[derive(Clone, Debug)]
pub(super) struct Files {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    pub(super) client_ca: Option<PathBuf>,
    pub(super) client_sans: Vec<String>,
}

impl Files {
    pub(super) fn from_args(args: &TlsArgs) -> Option<Files> {
        Some(Files {
            cert: args.tls_cert.clone()?,
            key: args.tls_key.clone()?,
            client_ca: args.client_ca.clone(),
            client_sans: args.client_sans.clone(),
        })
    }

    /// The directories to watch.
    pub(super) fn dirs(&self) -> BTreeSet<PathBuf> {
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
pub(super) struct Contents {
    pub(super) cert: Vec<u8>,
    pub(super) key: Vec<u8>,
    pub(super) client_ca: Option<Vec<u8>>,
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

pub(super) fn fail(flag: &'static str, path: &Path, why: impl Into<String>) -> LoadError {
    LoadError {
        flag,
        path: path.to_path_buf(),
        why: why.into(),
    }
}

pub(super) fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| fail(flag, path, format!("cannot read: {e}")))
}

pub(super) fn read_all(files: &Files) -> Result<Contents, LoadError> {
    Ok(Contents {
        cert: read("--tls-cert", &files.cert)?,
        key: read("--tls-key", &files.key)?,
        client_ca: match &files.client_ca {
            Some(p) => Some(read("--client-ca", p)?),
            None => None,
        },
    })
}

pub(super) fn within_validity(
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

pub(super) fn certificates(
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
pub(super) struct Loaded {
    pub(super) config: Arc<ServerConfig>,
    pub(super) cert: CertFacts,
    /// The earliest expiry among the client CAs still valid.
    pub(super) client_ca_not_after: Option<i64>,
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn load(
    files: &Files,
    contents: &Contents,
    now: SystemTime,
) -> Result<Loaded, LoadError> {
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

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// A CA and leaves signed by it, in a temporary directory.
    pub(in crate::net::tls) struct Pki {
        pub(in crate::net::tls) dir: PathBuf,
        ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Pki {
        pub(in crate::net::tls) fn new(tag: &str) -> Pki {
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

        pub(in crate::net::tls) fn leaf(&self, name: &str, days: (i64, i64)) -> (String, String) {
            let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now + time::Duration::days(days.0);
            params.not_after = now + time::Duration::days(days.1);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.ca).unwrap();
            (cert.pem(), key.serialize_pem())
        }

        pub(in crate::net::tls) fn files(&self, cert: &str, key: &str) -> (Files, Contents) {
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
}
