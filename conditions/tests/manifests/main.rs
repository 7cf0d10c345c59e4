//! Every check of the shipped manifests (deploy/, examples/, the release's
//! rendered manifests), in one test binary, without a cluster:
//!
//! - [`kubernetes`]: Kubernetes' own kinds against k8s-openapi's types, the
//!   companion's args given to the real binary, each deploy/ build reviewed
//!   as a security review would (TLS, NetworkPolicy, RBAC, spread);
//! - [`platforms`]: every object against the CRDs of every platform release
//!   it claims, EnvoyPatchPolicies applied to what Envoy Gateway generates,
//!   Helm values against the charts' keys (the `serving-picker-platforms`
//!   checkers);
//! - [`admission`]: the native overlay's ValidatingAdmissionPolicy judged
//!   on Gateways.
//!
//! `cargo test -p serving-picker-conditions --test manifests`; needs no
//! Envoy (`make unit` runs it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod admission;
mod kubernetes;
mod platforms;
