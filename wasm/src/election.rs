//! Electing one root context (of all of Envoy's VMs) to poll the admin API:
//! a lease in shared data that its holder renews every tick. The main
//! thread's context is preferred: it never serves requests, so a refresh
//! there (tens of milliseconds at 10,000 hosts) delays no request, while on a
//! worker it delays every request of that worker. A context knows it is a
//! worker's once it has made an HTTP context; the idle ones (the main
//! thread's, and workers' before their first request) say they are alive
//! through a heartbeat in shared data.

/// The lease as stored: `"<holder id> <renewed at, ms since epoch>"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The root context holding it (its id; 0 is nobody).
    pub holder: u32,
    /// When the holder last renewed it, in ms since the epoch.
    pub renewed_ms: u64,
}

impl Lease {
    /// The lease as stored; `None` when it does not read as one.
    pub fn parse(bytes: &[u8]) -> Option<Lease> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (holder, renewed) = text.split_once(' ')?;
        Some(Lease {
            holder: holder.parse().ok()?,
            renewed_ms: renewed.parse().ok()?,
        })
    }

    /// The lease as stored.
    pub fn encode(&self) -> String {
        format!("{} {}", self.holder, self.renewed_ms)
    }
}

/// The lease a holder writes to give it up: nobody's, long expired.
pub const RELEASED: Lease = Lease {
    holder: 0,
    renewed_ms: 0,
};

/// What a root context does with the lease at a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// Ours: renew it and poll.
    Renew,
    /// Missing, unreadable or expired: try to take it.
    Acquire,
    /// Somebody else's and alive, or left to an idle context.
    Follow,
    /// Ours, but we serve requests and an idle context is alive: give it up.
    Release,
}

/// What this context does with the lease. `serving`: it has served requests
/// (a worker's); `idle_alive`: an idle context's heartbeat is fresh.
pub fn lease_action(
    me: u32,
    current: Option<Lease>,
    now_ms: u64,
    ttl_ms: u64,
    serving: bool,
    idle_alive: bool,
) -> LeaseAction {
    let handover = serving && idle_alive;
    match current {
        Some(lease) if lease.holder == me && handover => LeaseAction::Release,
        Some(lease) if lease.holder == me => LeaseAction::Renew,
        Some(lease) if lease != RELEASED && now_ms.saturating_sub(lease.renewed_ms) < ttl_ms => {
            LeaseAction::Follow
        }
        _ if handover => LeaseAction::Follow,
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
        let act = |me, lease, now| lease_action(me, lease, now, 3000, false, false);
        assert_eq!(act(1, lease, 99_999), LeaseAction::Renew);
        assert_eq!(act(2, lease, 12_999), LeaseAction::Follow);
        assert_eq!(act(2, lease, 13_000), LeaseAction::Acquire);
        assert_eq!(act(2, None, 0), LeaseAction::Acquire);
        assert_eq!(act(2, Some(RELEASED), 100), LeaseAction::Acquire);
        // A clock that went backwards does not expire a live lease.
        assert_eq!(act(2, lease, 5_000), LeaseAction::Follow);
    }

    #[test]
    fn a_worker_leaves_the_lease_to_an_idle_context() {
        let lease = Some(Lease {
            holder: 1,
            renewed_ms: 10_000,
        });
        let act = |me, lease, serving, idle_alive| {
            lease_action(me, lease, 11_000, 3000, serving, idle_alive)
        };
        // The holder serves requests and an idle context is alive: it gives up.
        assert_eq!(act(1, lease, true, true), LeaseAction::Release);
        // With no idle context alive a worker keeps it, and takes a free one.
        assert_eq!(act(1, lease, true, false), LeaseAction::Renew);
        assert_eq!(act(2, Some(RELEASED), true, false), LeaseAction::Acquire);
        // ... but leaves a free lease to a live idle context.
        assert_eq!(act(2, Some(RELEASED), true, true), LeaseAction::Follow);
        assert_eq!(act(2, None, true, true), LeaseAction::Follow);
        // The idle context itself takes it, and keeps it.
        assert_eq!(act(2, Some(RELEASED), false, true), LeaseAction::Acquire);
        assert_eq!(act(1, lease, false, true), LeaseAction::Renew);
    }
}
