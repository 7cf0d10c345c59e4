//! Shared data between this Envoy's VMs (one per worker): the leader lease,
//! the published snapshot, its version, and when a refresh last confirmed it, behind `SharedData` (proxy-wasm's
//! shared-data calls in Envoy, a map in tests).

use crate::election::{lease_action, Lease, LeaseAction, RELEASED};

/// Why a shared-data write failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetError {
    /// Another VM wrote the key since this one read it.
    CasMismatch,
    /// Any other failure, as the host reported it.
    Other(String),
}

/// proxy-wasm's shared data: values with a compare-and-swap token. A key
/// never written reads as `(None, None)`.
pub trait SharedData {
    /// The value of `key` and its compare-and-swap token.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), String>;
    /// Writes `value` to `key`; with `cas`, only if nobody wrote it since
    /// that token was read.
    fn set(&self, key: &str, value: Option<&[u8]>, cas: Option<u32>) -> Result<(), SetError>;
}

/// One configuration's shared-data keys over `data`: the lease, the idle
/// heartbeat, the published version and snapshot, and when a refresh last
/// confirmed it.
pub struct SharedKeys<S> {
    data: S,
    lease: String,
    idle: String,
    version: String,
    snapshot: String,
    confirmed: String,
}

impl<S: SharedData> SharedKeys<S> {
    /// The keys of the configuration whose `fingerprint` this is
    /// (`config::fingerprint`): filters configured otherwise keep their own.
    pub fn for_config(data: S, fingerprint: u64) -> SharedKeys<S> {
        let prefix = format!("serving_picker.{fingerprint:016x}");
        SharedKeys {
            data,
            lease: format!("{prefix}.lease"),
            idle: format!("{prefix}.idle"),
            version: format!("{prefix}.version"),
            snapshot: format!("{prefix}.snapshot"),
            confirmed: format!("{prefix}.confirmed"),
        }
    }

    /// An idle context (one that serves no requests) says it is alive.
    pub fn idle_heartbeat(&self, now_ms: u64) {
        let _ = self
            .data
            .set(&self.idle, Some(now_ms.to_string().as_bytes()), None);
    }

    /// Whether an idle context said so within `fresh_ms`.
    pub fn idle_alive(&self, now_ms: u64, fresh_ms: u64) -> bool {
        let seen = self.data.get(&self.idle).ok().and_then(|(v, _)| v);
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
        let (value, cas) = match self.data.get(&self.lease) {
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
                let _ = self.data.set(&self.lease, Some(b""), None);
                match self.data.get(&self.lease) {
                    Ok((_, Some(cas))) => cas,
                    _ => return false,
                }
            }
        };
        match self
            .data
            .set(&self.lease, Some(written.encode().as_bytes()), Some(cas))
        {
            Ok(()) => written.holder == me,
            Err(SetError::CasMismatch) => false,
            Err(e) => {
                log::debug!("lease write failed: {e:?}");
                false
            }
        }
    }

    /// The version of the published snapshot (`<id>.<seq>`), if any.
    pub fn version(&self) -> Option<Vec<u8>> {
        self.data.get(&self.version).ok().and_then(|(v, _)| v)
    }

    /// The published snapshot (`codec`), if any.
    pub fn snapshot(&self) -> Option<Vec<u8>> {
        self.data.get(&self.snapshot).ok().and_then(|(v, _)| v)
    }

    /// A refresh succeeded at `now_ms`: the published snapshot is current.
    pub fn confirm(&self, now_ms: u64) {
        let _ = self
            .data
            .set(&self.confirmed, Some(now_ms.to_string().as_bytes()), None);
    }

    /// When a refresh last confirmed the published snapshot, if ever.
    pub fn confirmed(&self) -> Option<u64> {
        let seen = self.data.get(&self.confirmed).ok().and_then(|(v, _)| v)?;
        std::str::from_utf8(&seen).ok()?.parse().ok()
    }

    /// Writes the snapshot, then its version (readers look at the version first).
    pub fn publish(&self, snapshot: &[u8], version: &[u8]) -> Result<(), SetError> {
        self.data.set(&self.snapshot, Some(snapshot), None)?;
        self.data.set(&self.version, Some(version), None)
    }
}

#[cfg(test)]
mod tests;
