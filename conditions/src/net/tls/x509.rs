//! A certificate's public facts (serial, SANs, validity) and the checks
//! on them at load.

use std::path::Path;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::files::{fail, LoadError};

/// The public facts of a certificate worth logging and exporting.
#[derive(Clone, Debug)]
pub(super) struct CertFacts {
    pub(super) serial: String,
    pub(super) not_before: i64,
    pub(super) not_after: i64,
    pub(super) sans: Vec<String>,
}

/// Bytes that do not read as an X.509 certificate.
#[derive(Debug, thiserror::Error)]
#[error("not an X.509 certificate: {0}")]
pub(super) struct NotX509(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>);

pub(super) fn facts(der: &CertificateDer<'_>) -> Result<CertFacts, NotX509> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(NotX509)?;
    let validity = cert.validity();
    Ok(CertFacts {
        serial: cert.raw_serial_as_string(),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        sans: san_names(&cert),
    })
}

/// The DNS and URI SANs of a certificate, in its order: the names the
/// `--client-san` allow-list and the preflight compare.
pub fn san_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(n) => sans.push(n.to_string()),
                x509_parser::extensions::GeneralName::URI(u) => sans.push(u.to_string()),
                _ => {}
            }
        }
    }
    sans
}

pub(super) fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Seconds since the epoch as RFC 3339 (UTC), for logs and errors.
pub(super) fn rfc3339(secs: i64) -> String {
    x509_parser::time::ASN1Time::from_timestamp(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| secs.to_string())
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
