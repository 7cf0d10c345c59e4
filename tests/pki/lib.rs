//! Certificates for the tests and the demo (rcgen, made at run time: no
//! private key is ever committed): CAs, server and client certificates, the
//! files laid out as a `kubernetes.io/tls` Secret volume holds them
//! (`tls.crt`, `tls.key`, `ca.crt`, swapped atomically through a `..data`
//! symlink as the kubelet does), and Envoy's SDS files that read them.
//!
//! The one certificate helper of every test (crate `serving-picker-pki`):
//! the harness re-exports it as `support::pki`; `scripts/demo_certs.rs` and
//! the companion's own tests take it as a dev-dependency.
// Test machinery: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Its items are read beside the tests that call them (CONTRIBUTING.md, lints).
#![allow(missing_docs)]

use std::path::{Path, PathBuf};

/// What a leaf is for (`Ca::leaf`'s `usage`): `ServerAuth`, `ClientAuth`.
pub use rcgen::ExtendedKeyUsagePurpose;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The companion's name as Envoys address it (SNI, and the SAN they check),
/// the same in the demo, the tests and deploy/.
pub const COMPANION_DNS: &str = "serving-picker-conditions.serving-picker.svc";
/// The demo Envoy's identity (a SPIFFE ID: a URI SAN).
pub const ENVOY_SPIFFE: &str = "spiffe://cluster.local/ns/demo/sa/envoy";

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, PEM, and the certificate's DER.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

fn days(n: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::days(n)
}

fn san(name: &str) -> SanType {
    let text = name.to_string().try_into().unwrap();
    if name.contains("://") {
        SanType::URI(text)
    } else if let Ok(ip) = name.parse() {
        SanType::IpAddress(ip)
    } else {
        SanType::DnsName(text)
    }
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = days(-1);
        params.not_after = days(3650);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate for `sans` (`scheme://...` URIs, IPs, else DNS names),
    /// for `usage`, valid from `from` to `to` days from now.
    pub fn leaf(&self, sans: &[&str], usage: ExtendedKeyUsagePurpose, from: i64, to: i64) -> Leaf {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, sans.first().copied().unwrap_or("leaf"));
        params.subject_alt_names = sans.iter().map(|s| san(s)).collect();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        // As cert-manager's certificates do: the issuer's key identifier.
        params.use_authority_key_identifier_extension = true;
        params.not_before = days(from);
        params.not_after = days(to);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A server certificate for `sans`, valid for a year.
    pub fn server(&self, sans: &[&str]) -> Leaf {
        self.leaf(sans, ExtendedKeyUsagePurpose::ServerAuth, -1, 365)
    }

    /// A client certificate for `sans`, valid for a year.
    pub fn client(&self, sans: &[&str]) -> Leaf {
        self.leaf(sans, ExtendedKeyUsagePurpose::ClientAuth, -1, 365)
    }
}

/// A directory laid out as the kubelet lays out a Secret volume: the
/// visible names are symlinks into `..data`, a symlink to a timestamped
/// directory; an update writes a new directory and renames a new `..data`
/// over the old one (one atomic step), then removes the old directory.
pub struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    pub fn create(dir: &Path, files: &[(&str, &str)]) -> SecretVolume {
        std::fs::create_dir_all(dir).unwrap();
        let mut v = SecretVolume {
            dir: dir.to_path_buf(),
            version: 0,
        };
        v.update(files);
        for (name, _) in files {
            let link = dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
            }
        }
        v
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Replaces every file at once.
    pub fn update(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let ts = format!("..v{}", self.version);
        let ts_dir = self.dir.join(&ts);
        std::fs::create_dir_all(&ts_dir).unwrap();
        for (name, content) in files {
            std::fs::write(ts_dir.join(name), content).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            let _ = std::fs::remove_dir_all(self.dir.join(old));
        }
    }
}

/// The companion's files: its certificate and key, and the CAs its clients
/// must chain to.
pub fn companion_files(server: &Leaf, client_cas: &str) -> Vec<(&'static str, String)> {
    vec![
        ("tls.crt", server.cert_pem.clone()),
        ("tls.key", server.key_pem.clone()),
        ("ca.crt", client_cas.to_string()),
    ]
}

/// As `&str` pairs, for `SecretVolume`.
pub fn refs<'a>(files: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    files.iter().map(|(n, c)| (*n, c.as_str())).collect()
}

/// Envoy's two SDS files (name, content) for the client certificate and
/// the validation context read from the Secret volume `tls_dir` (watched:
/// a swap of its `..data` reloads them). `companion_san` is the DNS SAN the
/// companion's certificate must carry.
pub fn envoy_sds(tls_dir: &Path, companion_san: &str) -> [(&'static str, String); 2] {
    let d = tls_dir.display();
    [
        (
            "sds-certificate.yaml",
            format!(
                "# Envoy's client certificate for the companion (SDS from files; {d} is watched).\n\
                 resources:\n\
                 - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n\
                 \x20 name: serving_picker_conditions_client\n\
                 \x20 tls_certificate:\n\
                 \x20   certificate_chain: {{filename: {d}/tls.crt}}\n\
                 \x20   private_key: {{filename: {d}/tls.key}}\n\
                 \x20   watched_directory: {{path: {d}}}\n"
            ),
        ),
        (
            "sds-validation.yaml",
            format!(
                "# The CAs Envoy trusts for the companion, and the name its certificate must carry.\n\
                 resources:\n\
                 - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n\
                 \x20 name: serving_picker_conditions_ca\n\
                 \x20 validation_context:\n\
                 \x20   trusted_ca: {{filename: {d}/ca.crt}}\n\
                 \x20   watched_directory: {{path: {d}}}\n\
                 \x20   match_typed_subject_alt_names:\n\
                 \x20   - san_type: DNS\n\
                 \x20     matcher: {{exact: {companion_san}}}\n"
            ),
        ),
    ]
}

/// Writes `envoy_sds` into `sds_dir`.
pub fn write_envoy_sds(sds_dir: &Path, tls_dir: &Path, companion_san: &str) {
    std::fs::create_dir_all(sds_dir).unwrap();
    for (name, text) in envoy_sds(tls_dir, companion_san) {
        std::fs::write(sds_dir.join(name), text).unwrap();
    }
}
