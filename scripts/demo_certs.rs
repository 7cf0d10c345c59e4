//! The demo's certificates (`make demo-certs`, which `make run` and `make
//! validate` need): a CA, the companion's server certificate and the demo
//! Envoy's client certificate, made here (never committed), and Envoy's
//! SDS files that read them. Does nothing while the ones in DIR are valid
//! for 30 more days.
//!
//! `cargo run --example demo-certs -- DIR` (default `.run/tls`), from the
//! repository root (the SDS files name DIR as given):
//!   DIR/companion/{tls.crt,tls.key,ca.crt}  --tls-cert, --tls-key, --client-ca
//!   DIR/envoy/{tls.crt,tls.key,ca.crt}      Envoy's client certificate, the CA it trusts
//!   DIR/envoy-sds/sds-{certificate,validation}.yaml   read by envoy-companion.yaml
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

const VALID_DAYS: u64 = 365;
const RENEW_DAYS: u64 = 30;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn write(path: &Path, content: &str, secret: bool) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if secret {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".run/tls".into());
    let dir = Path::new(&dir);
    let stamp = dir.join("expires");
    let expires: u64 = std::fs::read_to_string(&stamp)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if expires > now() + RENEW_DAYS * 86_400 && dir.join("envoy-sds/sds-validation.yaml").is_file()
    {
        return;
    }
    let ca = pki::Ca::new("serving-picker demo CA");
    let companion = ca.server(&[pki::COMPANION_DNS, "localhost", "127.0.0.1"]);
    let envoy = ca.client(&[pki::ENVOY_SPIFFE]);
    for (who, leaf) in [("companion", &companion), ("envoy", &envoy)] {
        write(&dir.join(who).join("tls.crt"), &leaf.cert_pem, false);
        write(&dir.join(who).join("tls.key"), &leaf.key_pem, true);
        write(&dir.join(who).join("ca.crt"), &ca.pem, false);
    }
    pki::write_envoy_sds(
        &dir.join("envoy-sds"),
        &dir.join("envoy"),
        pki::COMPANION_DNS,
    );
    write(&stamp, &(now() + VALID_DAYS * 86_400).to_string(), false);
    println!(
        "demo certificates in {}: companion {} (SAN {}), Envoy client (SAN {})",
        dir.display(),
        dir.join("companion").display(),
        pki::COMPANION_DNS,
        pki::ENVOY_SPIFFE
    );
}
