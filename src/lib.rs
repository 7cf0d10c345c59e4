//! serving-picker's core: EndpointSlice conditions -> tiers -> pick.
//!
//! Plain Rust shared by every form (the proxy-wasm filter in `wasm/`, the
//! dynamic-module load balancer in `native/`, the companion in
//! `conditions/`): no proxy-wasm, no FFI, no async. [`contract`] is what the
//! companion writes on every endpoint and the shells read back. Each shell
//! reads hosts its own way into [`host::HostRecord`]s (the wasm filter from
//! the JSON of Envoy's admin API, the native module host by host through
//! the ABI) and plans them when endpoints change: the wasm filter with
//! [`plan::plan_cluster_at`] (one weighted list of addresses per cluster),
//! the native module with [`plan::plan_weights`] (the same decision by host
//! index). Requests are picked with [`picker::Picker`].

pub mod build_info;
pub mod config;
pub mod config_keys;
pub mod contract;
pub mod counters;
pub mod drain;
pub mod health;
pub mod host;
pub mod picker;
pub mod plan;
pub mod topology;
