//! The client certificate verifier with a SAN allow-list (`--client-san`).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::x509::facts;

/// Client verification as `inner` does it, then: one of the leaf's DNS or
/// URI SANs must be in `allowed` (DNS names compared without case).
#[derive(Debug)]
pub(super) struct SanAllowList {
    pub(super) inner: Arc<dyn ClientCertVerifier>,
    pub(super) allowed: Vec<String>,
}

impl SanAllowList {
    pub(super) fn allows(&self, sans: &[String]) -> bool {
        sans.iter().any(|san| {
            self.allowed.iter().any(|a| {
                if a.contains("://") {
                    a == san
                } else {
                    a.eq_ignore_ascii_case(san)
                }
            })
        })
    }
}

impl ClientCertVerifier for SanAllowList {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let sans = facts(end_entity).map(|f| f.sans).unwrap_or_default();
        if self.allows(&sans) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use rustls::pki_types::pem::PemObject;
    use rustls::server::WebPkiClientVerifier;
    use rustls::RootCertStore;

    use super::super::load::{provider, tests::Pki};
    use super::*;

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
