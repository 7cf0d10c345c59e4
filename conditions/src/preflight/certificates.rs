//! The mutual TLS material, as each side of a connection uses it: every
//! certificate present, valid, with its key, carrying the names the other
//! side checks, and issued by a CA the other side trusts. The CAs are read
//! from what the peers themselves read (the `ca.crt` cert-manager writes
//! beside each certificate, the CA-only bundle Envoy Gateway trusts), never
//! from the CA's own Secret: the preflight does not read the CA's key.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;

use super::facts::{Expect, ExpectedSecret, SecretRole};
use super::finding::{bad, ok, Finding, Level};
use crate::net::tls::san_names;

/// A certificate closer than this to its end is warned about.
const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

type SecretData = BTreeMap<String, Vec<u8>>;

/// Every finding on the Secrets `expect` names (`secrets`: `namespace/name`
/// -> data, None when absent).
pub fn judge(
    expect: &Expect,
    secrets: &BTreeMap<String, Option<SecretData>>,
    now: SystemTime,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let data = |s: &ExpectedSecret| secrets.get(&s.key()).cloned().flatten();
    for s in &expect.secrets {
        out.extend(secret(s, data(s).as_ref(), now));
    }
    // Who trusts whom: the companion's --client-ca is the ca.crt of its own
    // Secret; a client trusts the CA of what it reads (its own ca.crt for
    // Envoy's SDS, the bundle for Envoy Gateway).
    let by_role = |role| expect.secrets.iter().find(|s| s.role == role);
    let (Some(server), Some(client)) = (by_role(SecretRole::Server), by_role(SecretRole::Client))
    else {
        return out;
    };
    let (Some(server_data), Some(client_data)) = (data(server), data(client)) else {
        return out;
    };
    out.push(trusted_by(
        &client.key(),
        &client_data,
        &format!("the companion's --client-ca ({} ca.crt)", server.name),
        server_data.get("ca.crt"),
    ));
    match by_role(SecretRole::Bundle) {
        Some(bundle) => out.push(trusted_by(
            &server.key(),
            &server_data,
            &format!("Envoy Gateway's certificateRef ({} tls.crt)", bundle.key()),
            data(bundle).as_ref().and_then(|d| d.get("tls.crt")),
        )),
        None => out.push(trusted_by(
            &server.key(),
            &server_data,
            &format!("the Envoys' validation context ({} ca.crt)", client.name),
            client_data.get("ca.crt"),
        )),
    }
    out
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn pem_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

fn secret(s: &ExpectedSecret, data: Option<&SecretData>, now: SystemTime) -> Vec<Finding> {
    let name = s.key();
    let Some(data) = data else {
        let fix = match s.role {
            SecretRole::Bundle => format!("write it once from EG's client certificate's ca.crt (the command is in deploy/envoy-gateway/ca-bundle.yaml): `kubectl -n {} create secret generic {} --from-file=tls.crt=serving-picker-ca.crt`", s.namespace, s.name),
            _ => format!("kubectl -n {} get certificate: cert-manager issues it from the shipped Certificates once deploy/cert-manager is applied", s.namespace),
        };
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name} is missing"),
            fix,
        )];
    };
    if s.role == SecretRole::Bundle {
        return bundle(&name, data, now);
    }
    let (Some(crt), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name} has no tls.crt and tls.key"),
            "a kubernetes.io/tls Secret from cert-manager",
        )];
    };
    let certs = pem_certs(crt);
    let Some(leaf) = certs.first() else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name}: tls.crt holds no certificate"),
            "re-issue it (delete the Secret; cert-manager writes it again)",
        )];
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return vec![bad(
            Level::Fail,
            "secret",
            format!("{name}: tls.crt does not parse"),
            "re-issue it",
        )];
    };
    vec![
        expiry(&name, &cert, &s.namespace, now),
        key_matches(&name, &cert, key),
        sans_present(&name, &cert, &s.sans),
        trusted_by(&name, data, "its own ca.crt", data.get("ca.crt")),
    ]
}

/// The CA-only bundle: CA certificates, valid, and no key.
fn bundle(name: &str, data: &SecretData, now: SystemTime) -> Vec<Finding> {
    let mut out = Vec::new();
    if data.contains_key("tls.key") {
        out.push(bad(
            Level::Fail,
            "secret",
            format!("{name} holds a private key (tls.key): Envoy Gateway must get the CA's certificate only"),
            "write it from a leaf Secret's ca.crt (deploy/envoy-gateway/ca-bundle.yaml); never point certificateRef at the CA's own Secret",
        ));
    }
    let certs = data
        .get("tls.crt")
        .map(|p| pem_certs(p))
        .unwrap_or_default();
    let parsed: Vec<X509Certificate<'_>> = certs
        .iter()
        .filter_map(|c| x509_parser::parse_x509_certificate(c.as_ref()).ok())
        .map(|(_, c)| c)
        .collect();
    let cas: Vec<&X509Certificate<'_>> = parsed.iter().filter(|c| c.is_ca()).collect();
    if cas.is_empty() {
        out.push(bad(
            Level::Fail,
            "secret",
            format!("{name}: tls.crt holds no CA certificate (Envoy Gateway reads its CAs from that key only)"),
            "put the CA's certificate in its tls.crt, from a leaf Secret's ca.crt (deploy/envoy-gateway/ca-bundle.yaml)",
        ));
        return out;
    }
    let subjects: Vec<String> = cas.iter().map(|c| c.subject().to_string()).collect();
    let valid = cas
        .iter()
        .filter(|c| c.validity().not_after.timestamp() > unix(now))
        .count();
    out.push(if valid == 0 {
        bad(
            Level::Fail,
            "certificate",
            format!("{name}: every CA in it expired"),
            "put the current CA's certificate in the bundle's source (docs/security.md, CA rotation)",
        )
    } else {
        ok(
            "certificate",
            format!("{name}: CA-only bundle of {} ({})", cas.len(), subjects.join("; ")),
        )
    });
    out
}

/// The certificate's validity left: expired, within the warning, or fine.
fn expiry(name: &str, cert: &X509Certificate<'_>, namespace: &str, now: SystemTime) -> Finding {
    let left = cert.validity().not_after.timestamp() - unix(now);
    if left <= 0 {
        bad(
            Level::Fail,
            "certificate",
            format!("{name} expired"),
            format!("kubectl -n {namespace} describe certificate: renew it (cmctl renew)"),
        )
    } else if left < EXPIRY_WARNING.as_secs() as i64 {
        bad(
            Level::Warn,
            "certificate",
            format!("{name} expires in {} h", left / 3600),
            "check cert-manager renews it (kubectl describe certificate)",
        )
    } else {
        ok(
            "certificate",
            format!("{name} valid for {} more days", left / 86_400),
        )
    }
}

/// `tls.key` is the key of `tls.crt` (the one read of a private key: the
/// peer's own, which it needs; never a CA's).
fn key_matches(name: &str, cert: &X509Certificate<'_>, key: &[u8]) -> Finding {
    let key_ok = PrivateKeyDer::from_pem_slice(key)
        .ok()
        .and_then(|k| rustls::crypto::ring::sign::any_supported_type(&k).ok())
        .and_then(|k| {
            k.public_key()
                .map(|spki| spki.as_ref() == cert.public_key().raw)
        })
        .unwrap_or(false);
    if key_ok {
        ok(
            "certificate",
            format!("{name}: the key matches the certificate"),
        )
    } else {
        bad(
            Level::Fail,
            "certificate",
            format!("{name}: tls.key does not match tls.crt"),
            "re-issue it (delete the Secret; cert-manager writes both again)",
        )
    }
}

/// The certificate carries every SAN the peers check.
fn sans_present(name: &str, cert: &X509Certificate<'_>, wanted: &[String]) -> Finding {
    let sans = san_names(cert);
    let missing: Vec<&String> = wanted.iter().filter(|want| !sans.contains(want)).collect();
    if missing.is_empty() {
        ok(
            "certificate",
            format!(
                "{name}: SANs {}",
                if sans.is_empty() {
                    "(none needed)".into()
                } else {
                    sans.join(", ")
                }
            ),
        )
    } else {
        bad(
            Level::Fail,
            "certificate",
            format!("{name}: lacks {missing:?} (has {sans:?})"),
            "the Certificate's dnsNames/uris as deploy/ ships them",
        )
    }
}

fn key_identifier<'a>(cert: &'a X509Certificate<'_>, authority: bool) -> Option<&'a [u8]> {
    cert.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) if authority => {
                aki.key_identifier.as_ref().map(|k| k.0)
            }
            ParsedExtension::SubjectKeyIdentifier(ski) if !authority => Some(ski.0),
            _ => None,
        })
}

/// `ca` issued `cert`: its subject is the certificate's issuer and, when
/// both carry key identifiers (cert-manager writes them), they match.
fn issued(cert: &X509Certificate<'_>, ca: &X509Certificate<'_>) -> bool {
    ca.is_ca()
        && ca.subject() == cert.issuer()
        && match (key_identifier(cert, true), key_identifier(ca, false)) {
            (Some(a), Some(s)) => a == s,
            _ => true,
        }
}

/// The certificate of Secret `name` (`data`) is issued by a CA of `cas`
/// (PEM), which is what `who` trusts.
fn trusted_by(name: &str, data: &SecretData, who: &str, cas: Option<&Vec<u8>>) -> Finding {
    let leaf = data
        .get("tls.crt")
        .map(|p| pem_certs(p))
        .unwrap_or_default();
    let Some(Ok((_, cert))) = leaf
        .first()
        .map(|c| x509_parser::parse_x509_certificate(c.as_ref()))
    else {
        return bad(
            Level::Fail,
            "trust",
            format!("{name}: no certificate to check against {who}"),
            "re-issue it",
        );
    };
    let cas = cas.map(|p| pem_certs(p)).unwrap_or_default();
    let trusted = cas.iter().any(|c| {
        x509_parser::parse_x509_certificate(c.as_ref())
            .map(|(_, ca)| issued(&cert, &ca))
            .unwrap_or(false)
    });
    if trusted {
        ok(
            "trust",
            format!("{name}: issued by a CA {who} trusts ({})", cert.issuer()),
        )
    } else if cas.is_empty() {
        bad(
            Level::Fail,
            "trust",
            format!("{name}: {who} holds no CA certificate"),
            "check cert-manager's Certificates (deploy/cert-manager) and, for Envoy Gateway, the CA bundle (deploy/envoy-gateway/ca-bundle.yaml)",
        )
    } else {
        bad(
            Level::Fail,
            "trust",
            format!("{name}: its issuer ({}) is not a CA {who} trusts: that side refuses the handshake", cert.issuer()),
            "issue it from the Issuer serving-picker-ca (deploy/cert-manager), and put that CA's certificate in the bundle (deploy/envoy-gateway/ca-bundle.yaml)",
        )
    }
}
