//! The files read -> a rustls server configuration.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls::ServerConfig;

use super::files::{fail, Contents, Files, LoadError};
use super::verifier::SanAllowList;
use super::x509::{certificates, facts, rfc3339, unix, within_validity, CertFacts};

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

/// The configuration `contents` make: the server's chain and key, and
/// client verification when `--client-ca` is given.
pub(super) fn load(
    files: &Files,
    contents: &Contents,
    now: SystemTime,
) -> Result<Loaded, LoadError> {
    let now = unix(now);
    let chain = certificates("--tls-cert", &files.cert, &contents.cert)?;
    let cert = facts(&chain[0]).map_err(|e| fail("--tls-cert", &files.cert, e.to_string()))?;
    within_validity("--tls-cert", &files.cert, &cert, now)?;
    let provider = provider();
    let key = matching_key(files, contents, &chain, &provider)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail("--tls-cert", &files.cert, e.to_string()))?;
    let mut client_ca_not_after = None;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let (verifier, not_after) = client_verifier(files, path, pem, provider, now)?;
            client_ca_not_after = Some(not_after);
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

/// The private key of `--tls-key`, usable and matching the leaf of
/// `chain`.
fn matching_key(
    files: &Files,
    contents: &Contents,
    chain: &[CertificateDer<'static>],
    provider: &CryptoProvider,
) -> Result<PrivateKeyDer<'static>, LoadError> {
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
        fail(
            "--tls-key",
            &files.key,
            format!(
                "no usable private key (PEM PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY): {e}"
            ),
        )
    })?;
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
    rustls::sign::CertifiedKey::new(chain.to_vec(), signing)
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
    Ok(key)
}

/// The client verifier of `--client-ca` (the CAs of the bundle within
/// their validity; a CA outside it is logged and ignored) and
/// `--client-san`, with the earliest expiry among the CAs used.
fn client_verifier(
    files: &Files,
    path: &Path,
    pem: &[u8],
    provider: Arc<CryptoProvider>,
    now: i64,
) -> Result<(Arc<dyn ClientCertVerifier>, i64), LoadError> {
    let mut roots = RootCertStore::empty();
    let mut not_after: Option<i64> = None;
    for der in certificates("--client-ca", path, pem)? {
        let f = facts(&der).map_err(|e| fail("--client-ca", path, e.to_string()))?;
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
        not_after = Some(not_after.map_or(f.not_after, |t| t.min(f.not_after)));
    }
    let Some(not_after) = not_after else {
        return Err(fail(
            "--client-ca",
            path,
            "no CA certificate within its validity",
        ));
    };
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
    Ok((verifier, not_after))
}
