//! Shared data between this Envoy's VMs (one per worker): the leader lease,
//! the published snapshot, and its version.

use crate::election::{lease_action, Lease, LeaseAction, RELEASED};
use proxy_wasm::hostcalls::{get_shared_data, set_shared_data};
use proxy_wasm::types::Status;

pub struct SharedKeys {
    lease: String,
    idle: String,
    version: String,
    snapshot: String,
}

impl SharedKeys {
    pub fn for_config(fingerprint: u64) -> SharedKeys {
        let prefix = format!("serving_picker.{fingerprint:016x}");
        SharedKeys {
            lease: format!("{prefix}.lease"),
            idle: format!("{prefix}.idle"),
            version: format!("{prefix}.version"),
            snapshot: format!("{prefix}.snapshot"),
        }
    }

    /// An idle context (one that serves no requests) says it is alive.
    pub fn idle_heartbeat(&self, now_ms: u64) {
        let _ = set_shared_data(&self.idle, Some(now_ms.to_string().as_bytes()), None);
    }

    /// Whether an idle context said so within `fresh_ms`.
    pub fn idle_alive(&self, now_ms: u64, fresh_ms: u64) -> bool {
        let seen = get_shared_data(&self.idle).ok().and_then(|(v, _)| v);
        let at = seen.and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok());
        at.is_some_and(|at| now_ms.saturating_sub(at) < fresh_ms)
    }

    /// Renews, takes, follows or gives up the lease (`lease_action`); true
    /// when this context holds it now.
    pub fn hold_lease(
        &self,
        me: u32,
        now_ms: u64,
        ttl_ms: u64,
        serving: bool,
        idle_alive: bool,
    ) -> bool {
        let (value, cas) = match get_shared_data(&self.lease) {
            Ok(found) => found,
            Err(e) => {
                log::debug!("lease read failed: {e:?}");
                return false;
            }
        };
        let current = value.as_deref().and_then(Lease::parse);
        let written = match lease_action(me, current, now_ms, ttl_ms, serving, idle_alive) {
            LeaseAction::Follow => return false,
            LeaseAction::Release => RELEASED,
            LeaseAction::Renew | LeaseAction::Acquire => Lease {
                holder: me,
                renewed_ms: now_ms,
            },
        };
        // A missing key cannot be compare-and-set; create it, then race for it.
        let cas = match cas {
            Some(cas) if value.is_some() => cas,
            _ => {
                let _ = set_shared_data(&self.lease, Some(b""), None);
                match get_shared_data(&self.lease) {
                    Ok((_, Some(cas))) => cas,
                    _ => return false,
                }
            }
        };
        match set_shared_data(&self.lease, Some(written.encode().as_bytes()), Some(cas)) {
            Ok(()) => written.holder == me,
            Err(Status::CasMismatch) => false,
            Err(e) => {
                log::debug!("lease write failed: {e:?}");
                false
            }
        }
    }

    pub fn version(&self) -> Option<Vec<u8>> {
        get_shared_data(&self.version).ok().and_then(|(v, _)| v)
    }

    pub fn snapshot(&self) -> Option<Vec<u8>> {
        get_shared_data(&self.snapshot).ok().and_then(|(v, _)| v)
    }

    /// Writes the snapshot, then its version (readers look at the version first).
    pub fn publish(&self, snapshot: &[u8], version: &[u8]) -> Result<(), Status> {
        set_shared_data(&self.snapshot, Some(snapshot), None)?;
        set_shared_data(&self.version, Some(version), None)
    }
}
