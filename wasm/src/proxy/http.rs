//! Per request: set our override header from the worker's routing table, or
//! strip the client's. Each host call costs microseconds in Envoy, so the
//! common path (a pick) makes two: the cluster name, and one replace, which
//! drops every value a client sent (Envoy's `setCopy` removes them all).

use super::host;
use super::worker::Worker;
use crate::config::{BeforeFirstSnapshot, OnNoServing};
use crate::plan::Tier;
use crate::table::Decision;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::rc::Rc;

/// `xds.cluster_name` as the ABI's NUL-separated property path.
const CLUSTER_NAME: &[u8] = b"xds\0cluster_name";

pub struct PickerHttp {
    worker: Rc<Worker>,
    context_id: u32,
}

impl PickerHttp {
    pub fn new(worker: Rc<Worker>, context_id: u32) -> PickerHttp {
        PickerHttp { worker, context_id }
    }
}

/// Steers the current request (the effective context: a held one when the
/// root context releases it). `context_id` is `None` where holding is no
/// longer allowed.
pub struct Steer<'a> {
    pub worker: &'a Worker,
    pub context_id: Option<u32>,
}

impl Steer<'_> {
    /// Removes every value of the override header a client sent, on the paths
    /// that do not set ours; if that fails the request is refused rather than
    /// steered. Looks first, since a removal clears Envoy's route cache.
    fn strip_client_header(&self) -> Action {
        let header = self.worker.config.override_header.as_str();
        if host::header(MapType::HttpRequestHeaders, header).is_some() {
            if !host::remove_header(MapType::HttpRequestHeaders, header) {
                log::error!("cannot remove the client's {header}; rejecting");
                let _ = host::local_response(500, "serving_picker_strip_failed", &[], b"");
                return Action::Pause;
            }
            self.worker.counters.override_header_stripped.inc();
        }
        Action::Continue
    }

    /// A local 503 saying why: `no-serving-endpoint`, or `no-snapshot-yet`
    /// (`before_first_snapshot: reject`, or a hold that expired).
    pub fn reject(&self, cluster: &str, no_snapshot: bool) -> Action {
        let (what, why, details) = if no_snapshot {
            self.worker.counters.reject_no_snapshot.inc();
            (
                "no-snapshot-yet",
                "knows no endpoints yet",
                "serving_picker_no_snapshot_yet",
            )
        } else {
            self.worker.counters.reject_no_serving.inc();
            (
                "no-serving-endpoint",
                "has no serving endpoint",
                "serving_picker_no_serving_endpoint",
            )
        };
        log::debug!("cluster {cluster}: {what}, 503");
        let body = format!("{what}: cluster {cluster:?} {why}\n");
        let headers = vec![("x-serving-picker", what), ("content-type", "text/plain")];
        if !host::local_response(503, details, &headers, body.as_bytes()) {
            log::error!("cannot send the 503; passing through");
            return Action::Continue;
        }
        Action::Pause
    }

    fn unknown(&self, cluster: &str) -> Action {
        let w = &self.worker;
        if !w.config.manages(cluster) {
            w.counters.passthrough_unmanaged.inc();
            return self.strip_client_header();
        }
        if w.table.borrow().is_none() {
            match (w.config.before_first_snapshot, self.context_id) {
                (BeforeFirstSnapshot::Hold, Some(id)) => {
                    w.hold(id);
                    return Action::Pause;
                }
                (BeforeFirstSnapshot::Passthrough, _) => {}
                _ => return self.reject(cluster, true),
            }
        }
        w.counters.passthrough_unknown_cluster.inc();
        if w.logged_unknown.borrow_mut().insert(cluster.to_string()) {
            let why = if w.table.borrow().is_none() {
                "no snapshot loaded yet"
            } else {
                "not in the snapshot"
            };
            log::warn!("cluster {cluster:?}: {why}; passing through to Envoy's load balancer");
        }
        self.strip_client_header()
    }
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        Steer {
            worker: &self.worker,
            context_id: Some(self.context_id),
        }
        .request()
    }
}

impl Steer<'_> {
    #[inline(never)]
    pub fn request(&self) -> Action {
        let w = self.worker;
        let header = w.config.override_header.as_str();
        let name = host::property(CLUSTER_NAME);
        let Some(cluster) = name.as_deref().and_then(|n| std::str::from_utf8(n).ok()) else {
            return self.strip_client_header();
        };
        let table = w.table.borrow();
        let decision = match table.as_ref() {
            Some(table) => table.decide(cluster),
            None => Decision::Unknown,
        };
        match decision {
            Decision::Pick {
                host,
                tier,
                topology,
            } => {
                // Replacing also drops what the client sent (any case, repeated, lists).
                if !host::replace_header(MapType::HttpRequestHeaders, header, host) {
                    log::warn!("cannot set {header}; passing through");
                    drop(table);
                    return self.strip_client_header();
                }
                match tier {
                    Tier::TerminatingFallback => w.counters.pick_terminating_fallback.inc(),
                    _ => w.counters.pick_ready.inc(),
                }
                if let Some(c) = w.counters.pick_topology.get(topology as usize) {
                    c.inc();
                }
                log::debug!("cluster {cluster}: tier {} host {host}", tier.name());
                Action::Continue
            }
            Decision::NoServing => match w.config.on_no_serving {
                OnNoServing::Reject => {
                    drop(table);
                    self.reject(cluster, false)
                }
                OnNoServing::Passthrough => {
                    w.counters.passthrough_no_serving.inc();
                    self.strip_client_header()
                }
            },
            Decision::Unknown => {
                drop(table);
                self.unknown(cluster)
            }
        }
    }
}
