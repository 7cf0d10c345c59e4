//! The public facts of an X.509 certificate (serial, validity, DNS and
//! URI SANs), for checks, logs and metrics.

use std::time::SystemTime;

use rustls::pki_types::CertificateDer;

/// The public facts of a certificate worth logging and exporting.
#[derive(Clone, Debug)]
pub(super) struct CertFacts {
    pub(super) serial: String,
    pub(super) not_before: i64,
    pub(super) not_after: i64,
    pub(super) sans: Vec<String>,
}

pub(super) fn facts(der: &CertificateDer<'_>) -> Result<CertFacts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let validity = cert.validity();
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
    Ok(CertFacts {
        serial: cert.raw_serial_as_string(),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        sans,
    })
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
