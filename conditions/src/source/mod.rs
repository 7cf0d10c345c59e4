//! Where EndpointSlices come from: the Kubernetes API (`kube`) or a
//! directory of files (`files`). Both send `publish::Update`s: a full list
//! (`Change::Replace`) first, and whenever they had to start over, then
//! single changes.

pub mod files;
pub mod kube;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::slice::Slice;

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
