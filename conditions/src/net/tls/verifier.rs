//! The client verifier: the CA chain, then the `--client-san` allow-list.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::SignatureScheme;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName};

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
