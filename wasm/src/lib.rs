//! serving-picker as a proxy-wasm filter. Everything here but `proxy` is
//! plain Rust tested natively: reading Envoy's admin API (the only way a
//! wasm filter sees hosts), the change gate, narrowing, the leader's refresh
//! (behind `refresh::AdminApi`), the poller election, the snapshot codec and
//! the per-worker routing table. `proxy` is the thin glue to the proxy-wasm
//! host. The decision itself is the core's.

pub use serving_picker_core::{contract, health, host, metadata, picker, plan};

pub mod admin_json;
pub mod change_gate;
pub mod codec;
pub mod config;
pub mod election;
pub mod narrow;
pub mod plans;
pub mod refresh;
pub mod table;

#[cfg(target_arch = "wasm32")]
mod proxy;
