//! Where EndpointSlices come from: the Kubernetes API (`kube`) or a
//! directory of files (`files`). Both send [`Update`]s: a full list
//! (`Change::Replace`) first, and whenever they had to start over, then
//! single changes.

pub mod files;
pub mod kube;

use std::time::Instant;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::mpsc;

use crate::model::slice::{Slice, SliceKey};

/// A change from a source.
#[derive(Clone, Debug)]
pub enum Change {
    Apply(Slice),
    Delete(SliceKey),
    /// Every slice there is (a full list): the index becomes exactly this,
    /// and is complete from then on.
    Replace(Vec<Slice>),
}

/// A change and when the source got it (for the lag figures).
#[derive(Clone, Debug)]
pub struct Update {
    pub change: Change,
    pub received: Instant,
}

impl Update {
    pub fn now(change: Change) -> Update {
        Update {
            change,
            received: Instant::now(),
        }
    }
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
