//! serving-picker as an Envoy dynamic-module load-balancing policy
//! (`envoy.load_balancing_policies.dynamic_modules`, Envoy 1.40).
//!
//! A thin shell around the core (`serving_picker_core`): `abi` declares the
//! Envoy callbacks it uses and wraps them (the only raw pointers into
//! Envoy), `hooks` are the exported `envoy_dynamic_module_on_*` functions,
//! `config` parses the policy JSON, `table` reads a cluster's hosts into the
//! core's records, plans them and picks per request, `metrics` names the
//! counters and keeps the log-once state. Everything but `abi` and `hooks`
//! is plain Rust, tested without Envoy.

pub mod abi;
pub mod config;
pub mod hooks;
pub mod metrics;
pub mod table;
