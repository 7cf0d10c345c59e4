//! serving-picker's shipped Kubernetes objects against the platforms' own
//! schemas, as the API server would judge them, with no API server:
//!
//! - [`crds`]: the CRDs of each platform release serving-picker claims,
//!   copied at their tags (`platforms/crds/<platform>/<tag>/<Kind>.yaml`);
//! - [`schema`]: an object against its CRD version's `openAPIV3Schema`, with
//!   kubectl's default strict field validation (unknown fields refused);
//! - [`rules`]: the schema's `x-kubernetes-validations` CEL rules, and the
//!   ones this checker cannot evaluate;
//! - [`objects`]: every object under `deploy/` (each kustomization built) and
//!   `examples/`;
//! - [`patch`]: an EnvoyPatchPolicy's JSON patches applied one op at a time,
//!   as Envoy Gateway applies them;
//! - [`helm`]: Helm values against the chart's own defaults at each tag;
//! - [`admission`]: a ValidatingAdmissionPolicy's CEL expressions evaluated
//!   on an object, as the API server evaluates them on a request.
//!
//! Built-in kinds (Deployment, Service, ...) are checked against
//! k8s-openapi's types by the companion's `manifests` test (`conditions/tests/manifests/`).

pub mod admission;
pub mod crds;
pub mod helm;
pub mod objects;
pub mod patch;
pub mod rules;
pub mod schema;
