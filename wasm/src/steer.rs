//! Per request: set our override header from the worker's routing table, or
//! strip the client's; hold, pass or answer 503 before the first snapshot;
//! pass everything through while the configuration does not parse or the
//! snapshot is stale (`Bypass`).
//! Every decision of the request path is here, behind `RequestHost` (the few
//! host calls a request makes); `proxy::http` only translates. Each host
//! call costs microseconds in Envoy, so the common path (a pick) makes two:
//! the cluster name, and one replace, which drops every value a client sent
//! (Envoy's `setCopy` removes them all).

use crate::config::{BeforeFirstSnapshot, OnNoServing, PluginConfig};
use crate::table::{Decision, RoutingTable};
use rustc_hash::FxBuildHasher;
use serving_picker_core::contract::Tier;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;

/// Whether `proxy_get_header_map_value`'s status says the header is there.
/// Envoy answers OK with the first value whenever the header has one, and
/// an empty first value comes back as a null pointer and no bytes: presence
/// is the status alone, never the bytes, so a client's `""` followed by a
/// second value is still seen (and stripped).
pub fn header_answer_present(status: u32) -> bool {
    status == HEADER_ANSWER_OK
}

/// The ABI's `WasmResult::Ok`.
pub const HEADER_ANSWER_OK: u32 = 0;
/// The ABI's `WasmResult::NotFound`: what Envoy answers for an absent header.
pub const HEADER_ANSWER_NOT_FOUND: u32 = 1;

/// What a request asks of its host (Envoy through proxy-wasm, or a fake).
pub trait RequestHost {
    /// The cluster the route chose (`xds.cluster_name`).
    fn cluster_name(&mut self) -> Option<Vec<u8>>;
    /// Whether the request carries this header (any value).
    fn has_header(&mut self, name: &str) -> bool;
    /// Removes every value of a request header; false when the host could not.
    fn remove_header(&mut self, name: &str) -> bool;
    /// Sets a request header, dropping every value it had; false on failure.
    fn replace_header(&mut self, name: &str, value: &str) -> bool;
    /// A local reply; `details` shows in Envoy's %RESPONSE_CODE_DETAILS%.
    fn local_response(
        &mut self,
        status: u32,
        details: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> bool;
}

/// What the request does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// On to the router (steered, passed through, or headers stripped).
    Continue,
    /// Stopped: a local reply was sent.
    Pause,
    /// Wait for the first snapshot (`before_first_snapshot: hold`): the
    /// caller holds the request and pauses it.
    Hold,
}

/// A per-request counter counted in the VM; the glue hands it to the host
/// on each tick (one host call per tick instead of one per request).
#[derive(Default, Debug)]
pub struct Tally(Cell<u64>);

impl Tally {
    /// Counts one more.
    #[inline]
    pub fn inc(&self) {
        self.0.set(self.0.get() + 1);
    }

    /// The count since the last take.
    pub fn take(&self) -> u64 {
        self.0.replace(0)
    }

    /// The count since the last take, left as it is.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// The request path's counters. `all` lists them in the order of
/// `COUNTER_NAMES`, which the glue defines in the host.
#[derive(Default, Debug)]
pub struct RequestCounts {
    /// `pick.ready`: requests given a serving, not terminating host.
    pub pick_ready: Tally,
    /// `pick.terminating_fallback`: requests given a serving and terminating host (nothing ready).
    pub pick_terminating_fallback: Tally,
    /// Picks by topology mode, indexed by `Topology` (none, node, zone).
    pub pick_topology: [Tally; 3],
    /// `reject.no_serving`: the no-serving 503.
    pub reject_no_serving: Tally,
    /// `reject.no_snapshot`: the no-snapshot-yet 503.
    pub reject_no_snapshot: Tally,
    /// `hold.no_snapshot`: requests held for the first snapshot.
    pub held_no_snapshot: Tally,
    /// `passthrough.no_serving`: no serving host, left to Envoy's load balancer.
    pub passthrough_no_serving: Tally,
    /// `passthrough.unknown_cluster`: a cluster the snapshot does not know, left to Envoy's load
    /// balancer.
    pub passthrough_unknown_cluster: Tally,
    /// `passthrough.unmanaged_cluster`: a cluster outside the `clusters` allow-list.
    pub passthrough_unmanaged: Tally,
    /// `override_header.stripped`: client override values removed on the paths that do not set the
    /// header.
    pub override_header_stripped: Tally,
    /// `passthrough.no_snapshot`: no snapshot yet, left to Envoy's load balancer.
    pub passthrough_no_snapshot: Tally,
    /// `passthrough.config_invalid`: left to Envoy's load balancer, the configuration does not
    /// parse.
    pub passthrough_config_invalid: Tally,
    /// `passthrough.stale_snapshot`: left to Envoy's load balancer, the snapshot is set aside.
    pub passthrough_stale_snapshot: Tally,
}

/// The stable names of `RequestCounts::all`, in its order.
pub const COUNTER_NAMES: [&str; 15] = {
    use serving_picker_core::counters;
    [
        counters::PICK_READY,
        counters::PICK_TERMINATING_FALLBACK,
        counters::PICK_TOPOLOGY[0],
        counters::PICK_TOPOLOGY[1],
        counters::PICK_TOPOLOGY[2],
        counters::REJECT_NO_SERVING,
        "serving_picker.reject.no_snapshot",
        "serving_picker.hold.no_snapshot",
        "serving_picker.passthrough.no_serving",
        "serving_picker.passthrough.unknown_cluster",
        "serving_picker.passthrough.unmanaged_cluster",
        "serving_picker.override_header.stripped",
        "serving_picker.passthrough.no_snapshot",
        "serving_picker.passthrough.config_invalid",
        "serving_picker.passthrough.stale_snapshot",
    ]
};

impl RequestCounts {
    /// Every counter, in the order of `COUNTER_NAMES`.
    pub fn all(&self) -> [&Tally; 15] {
        [
            &self.pick_ready,
            &self.pick_terminating_fallback,
            &self.pick_topology[0],
            &self.pick_topology[1],
            &self.pick_topology[2],
            &self.reject_no_serving,
            &self.reject_no_snapshot,
            &self.held_no_snapshot,
            &self.passthrough_no_serving,
            &self.passthrough_unknown_cluster,
            &self.passthrough_unmanaged,
            &self.override_header_stripped,
            &self.passthrough_no_snapshot,
            &self.passthrough_config_invalid,
            &self.passthrough_stale_snapshot,
        ]
    }
}

/// Why every request passes through to Envoy's load balancer (the client's
/// override header still stripped), whatever the routing table says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bypass {
    /// Steer as the table says.
    Off,
    /// The plugin configuration does not parse: the filter never polls.
    ConfigInvalid,
    /// No refresh confirmed the snapshot within `max_snapshot_age_ms`
    /// (the admin API is failing): it may name hosts that stopped serving.
    StaleSnapshot,
}

/// Requests waiting for the first snapshot, by context id, and since when
/// the oldest waits.
#[derive(Default, Debug)]
pub struct Held {
    ids: Vec<u32>,
    since_ms: u64,
}

impl Held {
    /// Adds a request; true when it is the first (the wait starts now).
    pub fn hold(&mut self, context_id: u32, now_ms: u64) -> bool {
        let first = self.ids.is_empty();
        if first {
            self.since_ms = now_ms;
        }
        self.ids.push(context_id);
        first
    }

    /// No request is held.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether the oldest has waited `timeout_ms` (then all get a 503).
    pub fn expired(&self, now_ms: u64, timeout_ms: u64) -> bool {
        !self.ids.is_empty() && now_ms.saturating_sub(self.since_ms) >= timeout_ms
    }

    /// Every held request, oldest first; none is held after.
    pub fn take(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.ids)
    }
}

/// What a worker's requests share: configuration, counters, routing table,
/// whether they all pass through, and the clusters already logged as
/// unknown since the last snapshot change.
pub struct Steering {
    /// The configuration every request of the worker reads.
    pub config: std::rc::Rc<PluginConfig>,
    /// The request path's counters, handed to the host at each tick.
    pub counts: RequestCounts,
    /// The worker's routing table, built from the snapshot it took; `None` before the first.
    pub table: RefCell<Option<RoutingTable>>,
    /// Whether every request passes through, and why.
    pub bypass: Cell<Bypass>,
    /// Clusters logged as unknown since the snapshot last changed (each is logged once).
    pub logged_unknown: RefCell<HashSet<String, FxBuildHasher>>,
}

impl Steering {
    /// A worker's state before its first snapshot: steering on, nothing counted.
    pub fn new(config: std::rc::Rc<PluginConfig>) -> Steering {
        Steering {
            config,
            counts: RequestCounts::default(),
            table: RefCell::new(None),
            bypass: Cell::new(Bypass::Off),
            logged_unknown: RefCell::new(HashSet::default()),
        }
    }

    /// A worker whose plugin configuration does not parse: every request
    /// passes through with `override_header` (the one the configuration
    /// most likely names) stripped.
    pub fn config_invalid(override_header: String) -> Steering {
        let config = PluginConfig {
            override_header,
            ..PluginConfig::default()
        };
        let s = Steering::new(std::rc::Rc::new(config));
        s.bypass.set(Bypass::ConfigInvalid);
        s
    }

    /// Sets the snapshot stale or current (not on a configuration that does
    /// not parse); true when that changed.
    pub fn set_stale(&self, stale: bool) -> bool {
        let next = match (self.bypass.get(), stale) {
            (Bypass::ConfigInvalid, _) => return false,
            (_, true) => Bypass::StaleSnapshot,
            (_, false) => Bypass::Off,
        };
        self.bypass.replace(next) != next
    }

    /// Steers the current request. `can_hold` is false where holding is no
    /// longer allowed (a held request being released).
    #[inline(never)]
    pub fn request(&self, host: &mut impl RequestHost, can_hold: bool) -> Verdict {
        match self.bypass.get() {
            Bypass::Off => {}
            Bypass::ConfigInvalid => {
                self.counts.passthrough_config_invalid.inc();
                return self.strip_client_header(host);
            }
            Bypass::StaleSnapshot => {
                self.counts.passthrough_stale_snapshot.inc();
                return self.strip_client_header(host);
            }
        }
        let header = self.config.override_header.as_str();
        let name = host.cluster_name();
        let Some(cluster) = name.as_deref().and_then(|n| std::str::from_utf8(n).ok()) else {
            return self.strip_client_header(host);
        };
        let table = self.table.borrow();
        let decision = match table.as_ref() {
            Some(table) => table.decide(cluster),
            None => Decision::Unknown,
        };
        match decision {
            Decision::Pick {
                host: picked,
                tier,
                topology,
            } => {
                // Replacing also drops what the client sent (any case, repeated, lists).
                if !host.replace_header(header, picked) {
                    log::warn!("cannot set {header}; passing through");
                    drop(table);
                    return self.strip_client_header(host);
                }
                match tier {
                    Tier::TerminatingFallback => self.counts.pick_terminating_fallback.inc(),
                    _ => self.counts.pick_ready.inc(),
                }
                if let Some(c) = self.counts.pick_topology.get(topology as usize) {
                    c.inc();
                }
                log::debug!("cluster {cluster}: tier {} host {picked}", tier.name());
                Verdict::Continue
            }
            Decision::NoServing => match self.config.on_no_serving {
                OnNoServing::Reject => {
                    drop(table);
                    self.reject(host, cluster, false)
                }
                OnNoServing::Passthrough => {
                    self.counts.passthrough_no_serving.inc();
                    self.strip_client_header(host)
                }
            },
            Decision::Unknown => {
                drop(table);
                self.unknown(host, cluster, can_hold)
            }
        }
    }

    /// Removes every value of the override header a client sent, on the paths
    /// that do not set ours; if that fails the request is refused rather than
    /// steered. Looks first, since a removal clears Envoy's route cache.
    fn strip_client_header(&self, host: &mut impl RequestHost) -> Verdict {
        let header = self.config.override_header.as_str();
        if host.has_header(header) {
            if !host.remove_header(header) {
                log::error!("cannot remove the client's {header}; rejecting");
                let _ = host.local_response(500, "serving_picker_strip_failed", &[], b"");
                return Verdict::Pause;
            }
            self.counts.override_header_stripped.inc();
        }
        Verdict::Continue
    }

    /// A local 503 saying why: `no-serving-endpoint`, or `no-snapshot-yet`
    /// (`before_first_snapshot: reject`, or a hold that expired).
    fn reject(&self, host: &mut impl RequestHost, cluster: &str, no_snapshot: bool) -> Verdict {
        let (what, why, details) = if no_snapshot {
            self.counts.reject_no_snapshot.inc();
            (
                "no-snapshot-yet",
                "knows no endpoints yet",
                "serving_picker_no_snapshot_yet",
            )
        } else {
            self.counts.reject_no_serving.inc();
            (
                "no-serving-endpoint",
                "has no serving endpoint",
                "serving_picker_no_serving_endpoint",
            )
        };
        log::debug!("cluster {cluster}: {what}, 503");
        let body = format!("{what}: cluster {cluster:?} {why}\n");
        let headers = [("x-serving-picker", what), ("content-type", "text/plain")];
        if !host.local_response(503, details, &headers, body.as_bytes()) {
            log::error!("cannot send the 503; passing through");
            return Verdict::Continue;
        }
        Verdict::Pause
    }

    fn unknown(&self, host: &mut impl RequestHost, cluster: &str, can_hold: bool) -> Verdict {
        if !self.config.manages(cluster) {
            self.counts.passthrough_unmanaged.inc();
            return self.strip_client_header(host);
        }
        if self.table.borrow().is_none() {
            match (self.config.before_first_snapshot, can_hold) {
                (BeforeFirstSnapshot::Hold, true) => {
                    self.counts.held_no_snapshot.inc();
                    return Verdict::Hold;
                }
                (BeforeFirstSnapshot::Passthrough, _) => {}
                _ => return self.reject(host, cluster, true),
            }
        }
        let no_snapshot = self.table.borrow().is_none();
        if no_snapshot {
            self.counts.passthrough_no_snapshot.inc();
        } else {
            self.counts.passthrough_unknown_cluster.inc();
        }
        if self.logged_unknown.borrow_mut().insert(cluster.to_string()) {
            // Start-up and each configuration change pass through for a
            // moment: expected, not a warning.
            if no_snapshot {
                log::info!("cluster {cluster:?}: no snapshot loaded yet; passing through to Envoy's load balancer");
            } else {
                log::warn!("cluster {cluster:?}: not in the snapshot; passing through to Envoy's load balancer");
            }
        }
        self.strip_client_header(host)
    }
}

#[cfg(test)]
mod tests;
