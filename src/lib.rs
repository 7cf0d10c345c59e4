//! serving-picker's core: EndpointSlice conditions -> tiers -> pick.
//!
//! Plain Rust shared by every form (the proxy-wasm filter in `wasm/`, the
//! dynamic-module load balancer in `native/`): no proxy-wasm, no FFI, no
//! async. Each shell reads hosts its own way into [`host::HostRecord`]s,
//! plans them with [`plan::plan_cluster`] when endpoints change, and picks
//! per request with [`picker::Picker`].

pub mod conditions;
pub mod config;
#[doc(hidden)]
pub mod de;
pub mod host;
pub mod picker;
pub mod plan;
