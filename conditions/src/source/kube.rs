//! EndpointSlices from the Kubernetes API through kube-rs's watcher:
//! list, then watch from the list's resourceVersion with bookmarks; on 410
//! Gone (or any desync) the watcher lists again; errors back off
//! exponentially while the API server is away (0.8 s doubling to 30 s by
//! default).
//!
//! The back-off is paced here, not by kube-rs's `StreamBackoff`: that one
//! resets on every `Ok` item, and the watcher starts each retry with an
//! `Ok(Event::Init)` before its list fails: with it, a refused list is
//! retried at the minimum interval for ever. Here only progress (a full list, or a
//! watch event) counts as health, and the back-off starts over only after
//! the source has been healthy for `RESET_AFTER_HEALTHY`: a watch that
//! fails right after each successful list keeps backing off too.
//!
//! The watcher reports a (re-)list as `Init`, `InitApply`..., `InitDone`;
//! the objects are collected and sent as one full list at `InitDone`, so
//! the index is never half built, and a re-list replaces it as a whole
//! (slices deleted while the watch was down go away). Then every `Apply` or
//! `Delete` is sent as it comes.
//!
//! Only the slices of the configured Services are asked for (label selector
//! `kubernetes.io/service-name in (...)`), in their namespace when they all
//! share one (a Role suffices), else cluster-wide.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::mpsc;

use crate::model::cluster::ClusterSpec;
use crate::model::selector::LabelSelector;
use crate::model::slice::{SliceKey, SERVICE_NAME_LABEL};
use crate::source::metrics::SourceMetrics;
use crate::source::{Change, Update};

/// How long the source must make progress without an error before the
/// back-off starts over from its minimum.
pub const RESET_AFTER_HEALTHY: Duration = Duration::from_secs(30);

/// Exponential back-off with a reset: `min`, doubling up to `max`.
#[derive(Clone, Debug)]
pub struct ExpBackoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl ExpBackoff {
    /// A back-off from `min`, doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> ExpBackoff {
        ExpBackoff {
            min,
            max,
            next: min,
        }
    }
}

impl Default for ExpBackoff {
    /// kube-rs's defaults: 0.8 s doubling to 30 s.
    fn default() -> Self {
        ExpBackoff::new(Duration::from_millis(800), Duration::from_secs(30))
    }
}

impl Iterator for ExpBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = self.next.checked_mul(2).unwrap_or(self.max).min(self.max);
        Some(d)
    }
}

impl Backoff for ExpBackoff {
    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Which slices to watch for these clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// `Some(ns)` when every cluster's Service is in `ns`.
    pub namespace: Option<String>,
    /// The label selector the watch asks the API server for (empty: every slice).
    pub label_selector: String,
    /// Slices kept from what the watch returns (`None`: all of them): for a
    /// choice the API server cannot make with one selector.
    pub keep: Option<Keep>,
}

/// Slices kept by the companion itself: those of the named Services, and
/// those `manage` selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keep {
    /// Service names whose slices are kept (the `--cluster` Services').
    pub services: BTreeSet<String>,
    /// `--manage`: slices whose labels it selects are kept.
    pub manage: LabelSelector,
}

impl Keep {
    /// The `clusters`' Services' slices, and those `manage` selects.
    pub fn of(clusters: &[ClusterSpec], manage: &LabelSelector) -> Keep {
        Keep {
            services: clusters.iter().map(|c| c.service.name.clone()).collect(),
            manage: manage.clone(),
        }
    }

    /// Whether `obj` is one of the slices kept.
    pub fn keeps(&self, obj: &EndpointSlice) -> bool {
        let empty = std::collections::BTreeMap::new();
        let labels = obj.metadata.labels.as_ref().unwrap_or(&empty);
        labels
            .get(SERVICE_NAME_LABEL)
            .is_some_and(|s| self.services.contains(s))
            || self.manage.matches(labels)
    }
}

/// Which slices to watch in mode `eds`: the `--cluster` Services' (by name,
/// as [`selection`]), the Services `--manage` selects (the API server
/// selects), or both: then every slice is watched and the companion keeps
/// the union (one selector cannot say "these names, or these labels").
pub fn selection_for(clusters: &[ClusterSpec], manage: Option<&LabelSelector>) -> Selection {
    let Some(manage) = manage else {
        return selection(clusters);
    };
    if clusters.is_empty() {
        return Selection {
            namespace: None,
            label_selector: manage.as_str().to_string(),
            keep: None,
        };
    }
    Selection {
        namespace: None,
        label_selector: String::new(),
        keep: Some(Keep::of(clusters, manage)),
    }
}

/// The slices of the `--cluster` Services: by name (`kubernetes.io/service-name in (...)`), in
/// their namespace when they share one.
pub fn selection(clusters: &[ClusterSpec]) -> Selection {
    let namespaces: BTreeSet<&str> = clusters
        .iter()
        .map(|c| c.service.namespace.as_str())
        .collect();
    let names: BTreeSet<&str> = clusters.iter().map(|c| c.service.name.as_str()).collect();
    Selection {
        namespace: (namespaces.len() == 1)
            .then(|| namespaces.into_iter().next().map(str::to_string))
            .flatten(),
        label_selector: format!(
            "{SERVICE_NAME_LABEL} in ({})",
            names.into_iter().collect::<Vec<_>>().join(",")
        ),
        keep: None,
    }
}

fn key_of(obj: &EndpointSlice) -> Option<SliceKey> {
    Some(SliceKey {
        namespace: obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: obj.metadata.name.clone()?,
    })
}

/// Watches until the receiver goes. `backoff` paces retries after errors
/// (a `None` from it ends the watch).
pub async fn run<B: Backoff + 'static>(
    client: Client,
    clusters: &[ClusterSpec],
    updates: mpsc::Sender<Update>,
    metrics: SourceMetrics,
    backoff: B,
) {
    run_selection(client, selection(clusters), updates, metrics, backoff).await
}

/// Watches the slices `sel` selects (an empty selector: all of them), as
/// `run` does; the `envoy-gateway` mode's `--manage`.
pub async fn run_selection<B: Backoff + 'static>(
    client: Client,
    sel: Selection,
    updates: mpsc::Sender<Update>,
    metrics: SourceMetrics,
    mut backoff: B,
) {
    let api: Api<EndpointSlice> = match &sel.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    tracing::info!(
        namespace = sel.namespace.as_deref().unwrap_or("(all)"),
        selector = %sel.label_selector,
        "watching EndpointSlices"
    );
    let config = if sel.label_selector.is_empty() {
        watcher::Config::default()
    } else {
        watcher::Config::default().labels(&sel.label_selector)
    };
    // The watcher does nothing unless polled: sleeping between polls after
    // an error is the back-off.
    let mut stream = watcher::watcher(api, config).boxed();
    let mut listing: Option<Vec<crate::model::slice::Slice>> = None;
    let mut healthy_since: Option<Instant> = None;
    let keep = sel.keep.clone();
    let keeps = |obj: &EndpointSlice| keep.as_ref().is_none_or(|k| k.keeps(obj));
    metrics.started("watch");
    while let Some(item) = stream.next().await {
        let mut trigger = None;
        if matches!(
            item,
            Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_))
        ) {
            healthy_since.get_or_insert_with(Instant::now);
            metrics.progress(!matches!(item, Ok(Event::InitDone)));
        }
        let change = match item {
            Ok(Event::Init) => {
                metrics.watch_event("init");
                tracing::info!("listing EndpointSlices");
                listing = Some(Vec::new());
                None
            }
            Ok(Event::InitApply(obj)) => {
                metrics.watch_event("init_apply");
                if keeps(&obj) {
                    if let (Some(list), Some(s)) =
                        (listing.as_mut(), super::read_slice(&obj, "api"))
                    {
                        list.push(s);
                    }
                }
                None
            }
            Ok(Event::InitDone) => {
                metrics.watch_event("init_done");
                let all = listing.take().unwrap_or_default();
                tracing::info!(slices = all.len(), "EndpointSlices listed");
                Some(Change::Replace(all))
            }
            Ok(Event::Apply(obj)) => {
                metrics.watch_event("apply");
                trigger = super::trigger_time(obj.metadata.annotations.as_ref());
                match keeps(&obj)
                    .then(|| super::read_slice(&obj, "api"))
                    .flatten()
                {
                    Some(s) => Some(Change::Apply(s)),
                    // Unusable or no longer kept now: whatever it said
                    // before no longer holds.
                    None => key_of(&obj).map(Change::Delete),
                }
            }
            Ok(Event::Delete(obj)) => {
                metrics.watch_event("delete");
                key_of(&obj).map(Change::Delete)
            }
            Err(e) => {
                metrics.error("watch");
                if healthy_since
                    .take()
                    .is_some_and(|t| t.elapsed() >= RESET_AFTER_HEALTHY)
                {
                    backoff.reset();
                }
                let Some(wait) = backoff.next() else {
                    tracing::error!(error = %e, "EndpointSlice watch error: giving up");
                    break;
                };
                tracing::warn!(
                    error = %e,
                    retry_in_ms = wait.as_millis() as u64,
                    "EndpointSlice watch error: retrying with back-off; the last good state is served"
                );
                tokio::time::sleep(wait).await;
                None
            }
        };
        if let Some(change) = change {
            if updates
                .send(Update::triggered(change, trigger))
                .await
                .is_err()
            {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn selection_narrows_to_the_services_and_their_namespace() {
        let one: Vec<ClusterSpec> = vec![
            "a=shop/web:http".parse().unwrap(),
            "b=shop/api:grpc".parse().unwrap(),
        ];
        let s = selection(&one);
        assert_eq!(s.namespace.as_deref(), Some("shop"));
        assert_eq!(s.label_selector, "kubernetes.io/service-name in (api,web)");
        let two: Vec<ClusterSpec> = vec![
            "a=shop/web:http".parse().unwrap(),
            "b=blog/web:http".parse().unwrap(),
        ];
        let s = selection(&two);
        assert_eq!(s.namespace, None);
        assert_eq!(s.label_selector, "kubernetes.io/service-name in (web)");
        // --manage alone: the API server selects; with --cluster: the union,
        // kept here.
        let manage: LabelSelector = "serving-picker.io/conditions=true".parse().unwrap();
        let m = selection_for(&[], Some(&manage));
        assert_eq!(m.label_selector, "serving-picker.io/conditions=true");
        assert!(m.keep.is_none());
        let both = selection_for(&two, Some(&manage));
        assert_eq!(both.label_selector, "");
        let obj = |labels: serde_json::Value| -> EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "x", "labels": labels},
                "addressType": "IPv4", "endpoints": []
            }))
            .unwrap()
        };
        let keep = both.keep.unwrap();
        assert!(keep.keeps(&obj(
            serde_json::json!({"kubernetes.io/service-name": "web"})
        )));
        assert!(keep.keeps(&obj(serde_json::json!({
            "kubernetes.io/service-name": "api", "serving-picker.io/conditions": "true"}))));
        assert!(!keep.keeps(&obj(
            serde_json::json!({"kubernetes.io/service-name": "api"})
        )));
        assert!("a b".parse::<LabelSelector>().is_err());
    }

    #[test]
    fn backoff_doubles_and_resets() {
        let mut b = ExpBackoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let v: Vec<u128> = (&mut b).take(4).map(|d| d.as_millis()).collect();
        assert_eq!(v, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next().map(|d| d.as_millis()), Some(100));
    }
}
