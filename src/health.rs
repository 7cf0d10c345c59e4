//! What Envoy knows of a host's health, and the effective conditions:
//! the metadata's (the contract's nil rules), else the EDS status, with
//! Envoy's health on top.

use crate::contract::{Conditions, EdsHealth, MetaFlags};

/// What Envoy knows of a host's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    /// The configured EDS status, from `/clusters` (the only place DRAINING shows).
    pub eds: Option<EdsHealth>,
    /// The config dump's `health_status`: Envoy's coarse verdict, in which
    /// DRAINING, failed checks and ejection all read UNHEALTHY.
    pub coarse: EdsHealth,
    /// Failing active health checks or ejected by outlier detection.
    pub failing: bool,
}

impl Health {
    /// Nothing known: no EDS status, a coarse UNKNOWN, not failing.
    pub const UNKNOWN: Health = Health {
        eds: None,
        coarse: EdsHealth::Unknown,
        failing: false,
    };
}

/// The effective conditions. Metadata decides when it carries a condition
/// (the contract's nil rules, `MetaFlags::resolve`); without one, the EDS
/// status does. On top: EDS DRAINING marks the
/// host terminating, EDS UNHEALTHY/TIMEOUT and failing live health make it not
/// serving (the override_host policy itself never checks health).
pub fn effective(flags: &MetaFlags, health: &Health) -> Conditions {
    let mut c = if flags.any() {
        flags.resolve().host()
    } else {
        // Without live health only the coarse verdict is known.
        health.eds.unwrap_or(health.coarse).conditions()
    };
    if let Some(eds) = health.eds {
        c.terminating |= eds == EdsHealth::Draining;
        c.serving &= !eds.refuses();
    }
    c.serving &= !health.failing;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metadata with these conditions (`None`: the key is absent).
    fn meta(ready: Option<bool>, serving: Option<bool>, terminating: Option<bool>) -> MetaFlags {
        MetaFlags {
            ready,
            serving,
            terminating,
        }
    }

    fn read(flags: MetaFlags) -> Conditions {
        effective(&flags, &Health::UNKNOWN)
    }

    fn live(eds: EdsHealth) -> Health {
        Health {
            eds: Some(eds),
            coarse: EdsHealth::Healthy,
            failing: false,
        }
    }

    #[test]
    fn nil_defaults() {
        assert_eq!(read(meta(Some(true), None, None)), Conditions::READY);
        assert_eq!(read(meta(None, None, Some(false))), Conditions::READY);
        assert_eq!(
            read(meta(None, None, Some(true))),
            Conditions::SERVING_TERMINATING
        );
        assert_eq!(read(meta(None, None, None)), Conditions::READY);
    }

    #[test]
    fn serving_wins_over_ready() {
        // A pod in preStop: ready=false, serving=true, terminating=true.
        assert_eq!(
            read(meta(Some(false), Some(true), Some(true))),
            Conditions::SERVING_TERMINATING
        );
        assert_eq!(
            read(meta(Some(true), Some(false), None)),
            Conditions::NOT_SERVING
        );
        // Without `serving`, `ready` stands in for it.
        assert_eq!(read(meta(Some(false), None, None)), Conditions::NOT_SERVING);
        assert_eq!(
            read(meta(Some(false), None, Some(true))),
            Conditions {
                serving: false,
                terminating: true
            }
        );
    }

    #[test]
    fn no_metadata_reads_eds_health() {
        let none = MetaFlags::default();
        assert_eq!(
            effective(&none, &live(EdsHealth::Healthy)),
            Conditions::READY
        );
        assert_eq!(
            effective(&none, &live(EdsHealth::Unknown)),
            Conditions::READY
        );
        assert_eq!(
            effective(&none, &live(EdsHealth::Degraded)),
            Conditions::READY
        );
        assert_eq!(
            effective(&none, &live(EdsHealth::Draining)),
            Conditions::SERVING_TERMINATING
        );
        assert_eq!(
            effective(&none, &live(EdsHealth::Unhealthy)),
            Conditions::NOT_SERVING
        );
        assert_eq!(
            effective(&none, &live(EdsHealth::Timeout)),
            Conditions::NOT_SERVING
        );
        assert_eq!(EdsHealth::from_name(Some("bogus")), EdsHealth::Unknown);
    }

    #[test]
    fn coarse_health_only_without_live_view() {
        let none = MetaFlags::default();
        let coarse = |c| Health {
            eds: None,
            coarse: c,
            failing: false,
        };
        assert_eq!(
            effective(&none, &coarse(EdsHealth::Healthy)),
            Conditions::READY
        );
        assert_eq!(
            effective(&none, &coarse(EdsHealth::Unhealthy)),
            Conditions::NOT_SERVING
        );
        // The coarse verdict says UNHEALTHY for DRAINING too: metadata is not overruled by it.
        let pre_stop = meta(None, Some(true), Some(true));
        assert_eq!(
            effective(&pre_stop, &coarse(EdsHealth::Unhealthy)),
            Conditions::SERVING_TERMINATING
        );
    }

    #[test]
    fn live_health_overrides_metadata() {
        let serving = meta(None, Some(true), None);
        assert!(!effective(&serving, &live(EdsHealth::Unhealthy)).serving);
        assert_eq!(
            effective(&serving, &live(EdsHealth::Draining)),
            Conditions::SERVING_TERMINATING
        );
        let failing = Health {
            eds: Some(EdsHealth::Healthy),
            coarse: EdsHealth::Unhealthy,
            failing: true,
        };
        assert!(!effective(&serving, &failing).serving);
    }
}
