//! Where EndpointSlices come from: the Kubernetes API (`kube`) or a
//! directory of files (`files`). Both send [`Update`]s: a full list
//! (`Change::Replace`) first, and whenever they had to start over, then
//! single changes, and report in `metrics`.

pub mod files;
pub mod files_watch;
pub mod kube;
pub mod metrics;

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::mpsc;

use crate::model::slice::{Slice, SliceKey};

/// A change from a source.
#[derive(Clone, Debug)]
pub enum Change {
    /// A slice added or changed: the index holds it as given.
    Apply(Slice),
    /// A slice gone.
    Delete(SliceKey),
    /// Every slice there is (a full list): the index becomes exactly this,
    /// and is complete from then on.
    Replace(Vec<Slice>),
}

/// A change and when the source got it (for the lag figures).
#[derive(Clone, Debug)]
pub struct Update {
    /// What changed.
    pub change: Change,
    /// When the source got it (monotonic: the lag figures start here).
    pub received: Instant,
    /// The same moment on the wall clock (programming latency starts here
    /// when the slice names no trigger time).
    pub seen: SystemTime,
    /// The slice's `endpoints.kubernetes.io/last-change-trigger-time`: when
    /// the change that led to it happened (a pod or Service change).
    pub trigger: Option<SystemTime>,
}

impl Update {
    /// `change`, got now, with no trigger time.
    pub fn now(change: Change) -> Update {
        Update {
            change,
            received: Instant::now(),
            seen: SystemTime::now(),
            trigger: None,
        }
    }

    /// With the slice's trigger time, when it has one.
    pub fn triggered(change: Change, trigger: Option<SystemTime>) -> Update {
        Update {
            trigger,
            ..Update::now(change)
        }
    }

    /// Where programming latency starts: the trigger time, else when the
    /// source saw the change.
    pub fn started(&self) -> SystemTime {
        self.trigger.unwrap_or(self.seen)
    }
}

/// The annotation the EndpointSlice controller writes with the time of the
/// change that triggered a slice's update (what kube-proxy's
/// network_programming_duration_seconds starts from).
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// An object's trigger time (RFC 3339), if it has a readable one.
pub fn trigger_time(annotations: Option<&BTreeMap<String, String>>) -> Option<SystemTime> {
    let text = annotations?.get(TRIGGER_TIME_ANNOTATION)?;
    humantime::parse_rfc3339_weak(text).ok()
}

/// The next batch: waits for an update, then takes every other one waiting
/// with it. `None` once every source has gone.
pub async fn next_batch(updates: &mut mpsc::Receiver<Update>) -> Option<Vec<Update>> {
    let first = updates.recv().await?;
    let mut batch = vec![first];
    while let Ok(more) = updates.try_recv() {
        batch.push(more);
    }
    Some(batch)
}

/// Reads an object into a `Slice`, logging what was left out; `None` when
/// the object cannot be used at all (logged).
pub fn read_slice(obj: &EndpointSlice, origin: &str) -> Option<Slice> {
    read_slice_if(obj, origin, None)
}

/// As [`read_slice`], `None` also when `keep` does not keep the object
/// (left out quietly: it is not managed).
pub fn read_slice_if(
    obj: &EndpointSlice,
    origin: &str,
    keep: Option<&self::kube::Keep>,
) -> Option<Slice> {
    if keep.is_some_and(|k| !k.keeps(obj)) {
        return None;
    }
    match Slice::from_k8s(obj) {
        Ok((slice, skipped)) => {
            if skipped.bad_addresses > 0 || skipped.ports > 0 {
                tracing::warn!(
                    slice = %slice.key,
                    origin,
                    bad_addresses = skipped.bad_addresses,
                    skipped_ports = skipped.ports,
                    "EndpointSlice: endpoints without a usable address, or ports that are not TCP with a number, left out"
                );
            }
            Some(slice)
        }
        Err(e) => {
            tracing::warn!(origin, error = %e, "EndpointSlice ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn the_trigger_time_annotation_is_read() {
        let mut a = BTreeMap::new();
        a.insert(
            TRIGGER_TIME_ANNOTATION.to_string(),
            "2026-12-05T14:00:00Z".to_string(),
        );
        let t = trigger_time(Some(&a)).unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::from_secs(1_796_479_200)
        );
        a.insert(TRIGGER_TIME_ANNOTATION.to_string(), "yesterday".to_string());
        assert_eq!(trigger_time(Some(&a)), None);
        assert_eq!(trigger_time(None), None);
        let u = Update::triggered(Change::Replace(vec![]), Some(t));
        assert_eq!(u.started(), t);
        assert!(Update::now(Change::Replace(vec![])).started() > t);
    }
}
