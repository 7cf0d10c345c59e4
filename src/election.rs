//! Electing one root context (of all worker VMs) to poll the admin API: a
//! lease in shared data that its holder renews every tick.

/// The lease as stored: `"<holder id> <renewed at, ms since epoch>"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub holder: u32,
    pub renewed_ms: u64,
}

impl Lease {
    pub fn parse(bytes: &[u8]) -> Option<Lease> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (holder, renewed) = text.split_once(' ')?;
        Some(Lease {
            holder: holder.parse().ok()?,
            renewed_ms: renewed.parse().ok()?,
        })
    }

    pub fn encode(&self) -> String {
        format!("{} {}", self.holder, self.renewed_ms)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// Ours: renew it and poll.
    Renew,
    /// Missing, unreadable or expired: try to take it.
    Acquire,
    /// Somebody else's and alive.
    Follow,
}

pub fn lease_action(me: u32, current: Option<Lease>, now_ms: u64, ttl_ms: u64) -> LeaseAction {
    match current {
        Some(lease) if lease.holder == me => LeaseAction::Renew,
        Some(lease) if now_ms.saturating_sub(lease.renewed_ms) < ttl_ms => LeaseAction::Follow,
        _ => LeaseAction::Acquire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_round_trip_and_garbage() {
        let l = Lease {
            holder: 7,
            renewed_ms: 1_700_000_000_123,
        };
        assert_eq!(Lease::parse(l.encode().as_bytes()), Some(l));
        for bad in [&b""[..], b"7", b"x 1", b"7 y", b"\xff\xfe", b"-1 5"] {
            assert_eq!(Lease::parse(bad), None);
        }
    }

    #[test]
    fn actions() {
        let lease = Some(Lease {
            holder: 1,
            renewed_ms: 10_000,
        });
        assert_eq!(lease_action(1, lease, 99_999, 3000), LeaseAction::Renew);
        assert_eq!(lease_action(2, lease, 12_999, 3000), LeaseAction::Follow);
        assert_eq!(lease_action(2, lease, 13_000, 3000), LeaseAction::Acquire);
        assert_eq!(lease_action(2, None, 0, 3000), LeaseAction::Acquire);
        // A clock that went backwards does not expire a live lease.
        assert_eq!(lease_action(2, lease, 5_000, 3000), LeaseAction::Follow);
    }
}
