//! serving-picker's core: EndpointSlice conditions -> tiers -> pick.
//!
//! Plain Rust shared by every form (the proxy-wasm filter in `wasm/`, the
//! dynamic-module load balancer in `native/`): no proxy-wasm, no FFI, no
//! async. [`contract`] is what the companion writes on every endpoint and
//! the shells read back. Each shell reads hosts its own way into
//! [`host::HostRecord`]s (the JSON of Envoy's admin API through
//! [`metadata`], or host by host), plans them with [`plan::plan_cluster`]
//! when endpoints change, and picks per request with [`picker::Picker`].

pub mod config;
pub mod contract;
pub mod counters;
#[doc(hidden)]
pub mod de;
pub mod health;
pub mod host;
pub mod metadata;
pub mod picker;
pub mod plan;
