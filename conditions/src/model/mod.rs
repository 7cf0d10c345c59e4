//! The model: what Kubernetes says, kept without IO. EndpointSlices as
//! kept (`slice`), the index of slices by Service and of endpoints by
//! address:port with which copy wins (`index`), one endpoint's conditions,
//! health and priority (`endpoint`), one Service port's endpoints kept up
//! to date slice by slice (`port_view`), the `--cluster` specs and the
//! `--manage` resource names (`cluster`), label selectors (`selector`).
//! Imports nothing else of the crate.

pub mod cluster;
pub mod endpoint;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod fuzz;
pub mod index;
pub mod port_view;
pub mod selector;
pub mod slice;
