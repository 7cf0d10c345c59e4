//! The metadata contract: what the companion writes on every endpoint, and
//! what both shells read back, in one place.
//!
//! - **Where**: `filter_metadata[<namespace>]`, [`DEFAULT_NAMESPACE`] unless
//!   configured (`metadata_namespace`, `--metadata-namespace`).
//! - **Keys** ([`key`]): `ready`, `serving`, `terminating` (booleans, always
//!   written), `zone`, `node_name`, `hints_zones`, `hints_nodes` (strings,
//!   written only when set; hints comma-separated).
//! - **Nil rules** (EndpointSlice discovery/v1): nil `ready` is true, nil
//!   `serving` is `ready` (so a present `serving` wins over `ready`), nil
//!   `terminating` is false ([`MetaFlags::resolve`]).
//! - **Tiers** ([`Conditions::tier`]): serving and not terminating is the
//!   ready tier, serving and terminating the fallback, not serving none.
//!   The companion's output (tiered by default) puts them at priorities 0
//!   and 1 and leaves the last out ([`Tier::priority`]); its EDS health is
//!   HEALTHY for serving endpoints, UNHEALTHY otherwise (what the flat
//!   output sends for them: [`SliceConditions::eds_health`]).
//! - **Envoy Gateway's drain rule**: EG marks an endpoint DRAINING when
//!   `terminating || !serving`, that is every endpoint outside the ready
//!   tier ([`SliceConditions::eg_would_drain`]).
//! - **Copies of one endpoint** (in several slices): the most cautious view
//!   ([`SliceConditions::cautious`]).

/// The metadata namespace the conditions are written to and read from.
pub const DEFAULT_NAMESPACE: &str = "k8s.endpointslice";

/// The keys of the namespace.
pub mod key {
    /// `ready` (boolean): the EndpointSlice's `conditions.ready`, nil rule applied.
    pub const READY: &str = "ready";
    /// `serving` (boolean): `conditions.serving`, nil rule applied.
    pub const SERVING: &str = "serving";
    /// `terminating` (boolean): `conditions.terminating`, nil rule applied.
    pub const TERMINATING: &str = "terminating";
    /// `zone` (string): the endpoint's `zone`, when set.
    pub const ZONE: &str = "zone";
    /// `node_name` (string): the endpoint's `nodeName`, when set.
    pub const NODE_NAME: &str = "node_name";
    /// `hints_zones` (string): the zones of `hints.forZones`, comma-separated.
    pub const HINTS_ZONES: &str = "hints_zones";
    /// `hints_nodes` (string): the nodes of `hints.forNodes`, comma-separated.
    pub const HINTS_NODES: &str = "hints_nodes";
    /// Every key, in the order the companion writes them.
    pub const ALL: [&str; 7] = [
        READY,
        SERVING,
        TERMINATING,
        ZONE,
        NODE_NAME,
        HINTS_ZONES,
        HINTS_NODES,
    ];
}

/// The three conditions as an EndpointSlice or a host's metadata carries
/// them: each may be absent (nil, or in metadata of the wrong type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MetaFlags {
    /// `conditions.ready`, if present.
    pub ready: Option<bool>,
    /// `conditions.serving`, if present.
    pub serving: Option<bool>,
    /// `conditions.terminating`, if present.
    pub terminating: Option<bool>,
}

impl MetaFlags {
    /// Whether any condition is present.
    pub fn any(&self) -> bool {
        self.ready.is_some() || self.serving.is_some() || self.terminating.is_some()
    }

    /// The nil rules: nil `ready` is true, nil `serving` is `ready`, nil
    /// `terminating` is false.
    pub fn resolve(self) -> SliceConditions {
        let ready = self.ready.unwrap_or(true);
        SliceConditions {
            ready,
            serving: self.serving.unwrap_or(ready),
            terminating: self.terminating.unwrap_or(false),
        }
    }
}

/// An endpoint's three conditions, nil rules applied: what the companion
/// writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceConditions {
    /// The pod passes its readiness probe and is not terminating.
    pub ready: bool,
    /// The pod passes its readiness probe, terminating or not.
    pub serving: bool,
    /// The pod is shutting down.
    pub terminating: bool,
}

impl SliceConditions {
    /// What a shell decides with (`ready` says nothing once `serving` is known).
    pub fn host(self) -> Conditions {
        Conditions {
            serving: self.serving,
            terminating: self.terminating,
        }
    }

    /// The host's tier (`Conditions::tier`).
    pub fn tier(self) -> Tier {
        self.host().tier()
    }

    /// The most cautious view of two copies of one endpoint: ready and
    /// serving only if both say so, terminating if either does (a pod never
    /// stops terminating).
    pub fn cautious(self, other: SliceConditions) -> SliceConditions {
        SliceConditions {
            ready: self.ready && other.ready,
            serving: self.serving && other.serving,
            terminating: self.terminating || other.terminating,
        }
    }

    /// The EDS health status written: serving HEALTHY, the others UNHEALTHY.
    pub fn eds_health(self) -> EdsHealth {
        if self.serving {
            EdsHealth::Healthy
        } else {
            EdsHealth::Unhealthy
        }
    }

    /// Envoy Gateway's drain rule: DRAINING when `terminating || !serving`.
    pub fn eg_would_drain(self) -> bool {
        self.tier() != Tier::Ready
    }
}

/// The effective conditions of one host, as a shell plans with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conditions {
    /// The host may take requests.
    pub serving: bool,
    /// The host is shutting down (requests to it drain).
    pub terminating: bool,
}

impl Conditions {
    /// Serving, not terminating: the ready tier.
    pub const READY: Conditions = Conditions {
        serving: true,
        terminating: false,
    };
    /// Serving and terminating: the fallback tier.
    pub const SERVING_TERMINATING: Conditions = Conditions {
        serving: true,
        terminating: true,
    };
    /// Not serving: no tier serves from it.
    pub const NOT_SERVING: Conditions = Conditions {
        serving: false,
        terminating: false,
    };

    /// The tier this host belongs to.
    pub fn tier(self) -> Tier {
        match (self.serving, self.terminating) {
            (true, false) => Tier::Ready,
            (true, true) => Tier::TerminatingFallback,
            (false, _) => Tier::NoServing,
        }
    }
}

/// A tier of hosts (KEP-1669): a cluster is served from its best non-empty
/// one, and each host belongs to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Serving and not terminating.
    Ready = 1,
    /// Nothing ready: serving but terminating (a pod in preStop).
    TerminatingFallback = 2,
    /// No serving host at all.
    NoServing = 3,
}

impl Tier {
    /// The tier of its code (`Tier as u8`), as the wasm filter's shared plans
    /// store it; `None` for any other byte.
    pub fn from_code(code: u8) -> Option<Tier> {
        match code {
            1 => Some(Tier::Ready),
            2 => Some(Tier::TerminatingFallback),
            3 => Some(Tier::NoServing),
            _ => None,
        }
    }

    /// The tier's name in logs, metrics and the status page.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Ready => "ready",
            Tier::TerminatingFallback => "terminating_fallback",
            Tier::NoServing => "no_serving",
        }
    }

    /// The companion's tiered output: a host of this tier at this
    /// priority, or left out (`None`). Left out rather than UNHEALTHY: with
    /// every host unhealthy Envoy's panic mode would route to them.
    pub fn priority(self) -> Option<u32> {
        match self {
            Tier::Ready => Some(0),
            Tier::TerminatingFallback => Some(1),
            Tier::NoServing => None,
        }
    }
}

/// An EDS health status name (absent or unrecognised means UNKNOWN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EdsHealth {
    /// No status, or one Envoy does not name.
    Unknown,
    /// `HEALTHY`.
    Healthy,
    /// `UNHEALTHY`: Envoy does not route to the host.
    Unhealthy,
    /// `DRAINING`: the host is going away (what Envoy Gateway writes outside
    /// the ready tier).
    Draining,
    /// `TIMEOUT`: the host's health check timed out; Envoy takes it as
    /// unhealthy.
    Timeout,
    /// `DEGRADED`: routed to only when too few hosts are healthy.
    Degraded,
}

impl EdsHealth {
    /// The status of an EDS health name (`HEALTHY`, ...); anything else is
    /// `Unknown`.
    pub fn from_name(name: Option<&str>) -> EdsHealth {
        match name {
            Some("HEALTHY") => EdsHealth::Healthy,
            Some("UNHEALTHY") => EdsHealth::Unhealthy,
            Some("DRAINING") => EdsHealth::Draining,
            Some("TIMEOUT") => EdsHealth::Timeout,
            Some("DEGRADED") => EdsHealth::Degraded,
            _ => EdsHealth::Unknown,
        }
    }

    /// A host's conditions when its metadata carries none.
    pub fn conditions(self) -> Conditions {
        match self {
            EdsHealth::Unknown | EdsHealth::Healthy | EdsHealth::Degraded => Conditions::READY,
            EdsHealth::Draining => Conditions::SERVING_TERMINATING,
            EdsHealth::Unhealthy | EdsHealth::Timeout => Conditions::NOT_SERVING,
        }
    }

    /// Envoy will not route to a host with this status.
    pub fn refuses(self) -> bool {
        matches!(self, EdsHealth::Unhealthy | EdsHealth::Timeout)
    }
}

/// A metadata value as written (both shells read booleans and strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataValue<'a> {
    /// A boolean (`ready`, `serving`, `terminating`).
    Bool(bool),
    /// A string (`zone`, `node_name`, the hint lists).
    Str(&'a str),
}

/// An endpoint's topology strings as written; `None` is left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopologyFields<'a> {
    /// The `zone` key's value.
    pub zone: Option<&'a str>,
    /// The `node_name` key's value.
    pub node_name: Option<&'a str>,
    /// Comma-separated zone names.
    pub hints_zones: Option<&'a str>,
    /// Comma-separated node names.
    pub hints_nodes: Option<&'a str>,
}

/// The metadata fields of one endpoint, in the order written: the
/// conditions always, the topology strings only when set.
pub fn metadata_fields(
    c: SliceConditions,
    t: TopologyFields<'_>,
) -> Vec<(&'static str, MetadataValue<'_>)> {
    let mut fields = vec![
        (key::READY, MetadataValue::Bool(c.ready)),
        (key::SERVING, MetadataValue::Bool(c.serving)),
        (key::TERMINATING, MetadataValue::Bool(c.terminating)),
    ];
    for (key, value) in [
        (key::ZONE, t.zone),
        (key::NODE_NAME, t.node_name),
        (key::HINTS_ZONES, t.hints_zones),
        (key::HINTS_NODES, t.hints_nodes),
    ] {
        if let Some(s) = value {
            fields.push((key, MetadataValue::Str(s)));
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(r: Option<bool>, s: Option<bool>, t: Option<bool>) -> SliceConditions {
        MetaFlags {
            ready: r,
            serving: s,
            terminating: t,
        }
        .resolve()
    }

    fn c(ready: bool, serving: bool, terminating: bool) -> SliceConditions {
        SliceConditions {
            ready,
            serving,
            terminating,
        }
    }

    #[test]
    fn nil_rules_follow_the_api() {
        assert_eq!(flags(None, None, None), c(true, true, false));
        // serving nil defers to ready.
        assert_eq!(flags(Some(false), None, None), c(false, false, false));
        // A present serving wins over ready (a pod in preStop).
        assert_eq!(
            flags(Some(false), Some(true), Some(true)),
            c(false, true, true)
        );
        assert_eq!(flags(None, Some(false), None), c(true, false, false));
        assert_eq!(flags(Some(true), Some(false), None), c(true, false, false));
    }

    #[test]
    fn tiers_priorities_health_and_eg_drain() {
        // (conditions, tier, priority, EDS health, EG drains)
        for (conds, tier, priority, health, drains) in [
            (
                c(true, true, false),
                Tier::Ready,
                Some(0),
                EdsHealth::Healthy,
                false,
            ),
            (
                c(false, true, true),
                Tier::TerminatingFallback,
                Some(1),
                EdsHealth::Healthy,
                true,
            ),
            (
                c(false, false, true),
                Tier::NoServing,
                None,
                EdsHealth::Unhealthy,
                true,
            ),
            (
                c(false, false, false),
                Tier::NoServing,
                None,
                EdsHealth::Unhealthy,
                true,
            ),
            // ready without serving: serving decides.
            (
                c(true, false, false),
                Tier::NoServing,
                None,
                EdsHealth::Unhealthy,
                true,
            ),
        ] {
            assert_eq!(conds.tier(), tier, "{conds:?}");
            assert_eq!(tier.priority(), priority);
            assert_eq!(conds.eds_health(), health);
            assert_eq!(conds.eg_would_drain(), drains);
            assert_eq!(conds.eg_would_drain(), conds.terminating || !conds.serving);
            // The written health, read back without metadata, keeps serving.
            assert_eq!(health.conditions().serving, conds.serving);
        }
    }

    #[test]
    fn cautious_merge() {
        assert_eq!(
            c(true, true, false).cautious(c(false, true, true)),
            c(false, true, true)
        );
        assert_eq!(
            c(true, true, false).cautious(c(false, false, false)),
            c(false, false, false)
        );
        let x = c(true, false, true);
        assert_eq!(x.cautious(x), x);
    }

    #[test]
    fn fields_written_in_order_strings_only_when_set() {
        let keys = |t| -> Vec<&str> {
            metadata_fields(c(true, true, false), t)
                .iter()
                .map(|(k, _)| *k)
                .collect()
        };
        assert_eq!(keys(TopologyFields::default()), key::ALL[..3]);
        let all = TopologyFields {
            zone: Some("z1"),
            node_name: Some("n1"),
            hints_zones: Some("z1,z2"),
            hints_nodes: Some("n1"),
        };
        assert_eq!(keys(all), key::ALL);
        let f = metadata_fields(c(false, true, true), all);
        assert_eq!(f[0], (key::READY, MetadataValue::Bool(false)));
        assert_eq!(f[5], (key::HINTS_ZONES, MetadataValue::Str("z1,z2")));
    }

    #[test]
    fn eds_names() {
        assert_eq!(EdsHealth::from_name(Some("DRAINING")), EdsHealth::Draining);
        assert_eq!(EdsHealth::from_name(Some("bogus")), EdsHealth::Unknown);
        assert_eq!(EdsHealth::from_name(None), EdsHealth::Unknown);
    }
}
