//! serving-picker as an Envoy dynamic-module load-balancing policy
//! (`envoy.load_balancing_policies.dynamic_modules`, Envoy 1.38 to 1.40; one
//! build for all of them, docs/compatibility.md).
//!
//! A thin shell around the core (`serving_picker_core`):
//! - `hooks`: the exported `envoy_dynamic_module_on_*` functions and the
//!   panic guard, nothing else;
//! - `policy`: what the hooks do (configuration, rebuilds, picks, logs,
//!   metrics), plain Rust against small traits, tested against fakes;
//! - `envoy_host`: Envoy behind those traits; `abi`: the Envoy callbacks
//!   and the hooks' pointer conversions (the only raw pointers);
//! - `envoy_version`: which Envoy loads the module, and the load-time check;
//! - `config` parses the policy JSON, `table` reads a cluster's hosts into
//!   the core's records, plans them and picks per request, `metrics` names
//!   the counters and keeps the log-once state;
//! - `metadata_board`: host metadata read on the main thread only (where
//!   Envoy replaces it) and shared with the workers' instances;
//! - the stream drain, an HTTP filter in the same module
//!   (`filter_name: serving_picker_drain`): `http_hooks` are its hooks,
//!   `http_filter` what a stream is and how it ends, `drain` the board of
//!   open streams and draining hosts (published by the policy) and the timer
//!   thread that wakes due streams;
//! - `testing` (tests and the `testing` feature only): the fakes.

pub mod abi;
pub mod config;
pub mod drain;
pub mod envoy_host;
pub mod envoy_version;
#[cfg(test)]
mod fuzz;
pub mod hooks;
pub mod http_filter;
pub mod http_hooks;
pub mod metadata_board;
pub mod metrics;
pub mod policy;
pub mod table;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
