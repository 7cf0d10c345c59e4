//! Parsing Envoy admin output, one job per file: `/config_dump?include_eds`
//! (endpoints and metadata: `config_dump`, with the metadata namespace's
//! reader in `metadata` and serde helpers in `de`), `/clusters?format=json`
//! (live health: `clusters`), and the two joined (`live`). Here: the check
//! every answer passes before its body is read.

mod clusters;
mod config_dump;
mod de;
mod fields;
#[cfg(test)]
mod fixtures;
mod live;
mod metadata;

pub use clusters::{parse_clusters, LiveCluster, LiveHealth, LiveHost};
pub use config_dump::{parse_config_dump, EndpointsDump};
pub use live::{implied_live_health, join_live_health, needs_live_health, NameIndex};
pub use serving_picker_core::host::{ClusterHosts, HostRecord};

/// An admin answer that cannot be used, and why (logged as the refresh's failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminJsonError(pub String);

impl std::fmt::Display for AdminJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Accepts an admin answer before its body is read: a 200 within the size
/// limit. No `:status` means the call failed (unreachable, reset, timeout).
pub fn check_admin_response(
    what: &str,
    status: Option<&[u8]>,
    body_size: usize,
    max_body: usize,
) -> Result<(), AdminJsonError> {
    match status {
        None => Err(AdminJsonError(format!(
            "{what}: no answer from the admin cluster (unreachable, reset or timed out)"
        ))),
        Some(b"200") if body_size > max_body => Err(AdminJsonError(format!(
            "{what}: body of {body_size} bytes exceeds max_admin_body_bytes ({max_body})"
        ))),
        Some(b"200") => Ok(()),
        Some(other) => Err(AdminJsonError(format!(
            "{what}: admin answered HTTP {}",
            String::from_utf8_lossy(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_response_checks() {
        assert!(check_admin_response("x", Some(b"200"), 10, 10).is_ok());
        let e = check_admin_response("x", Some(b"200"), 11, 10).unwrap_err();
        assert!(e.0.contains("exceeds"), "{e}");
        let e = check_admin_response("x", Some(b"500"), 0, 10).unwrap_err();
        assert!(e.0.contains("HTTP 500"), "{e}");
        let e = check_admin_response("x", None, 0, 10).unwrap_err();
        assert!(e.0.contains("unreachable"), "{e}");
    }
}
