//! serving-picker as a proxy-wasm filter. Everything here but `proxy` is
//! plain Rust tested natively: reading Envoy's admin API (the only way a
//! wasm filter sees hosts), the change gate, narrowing, the leader's refresh
//! (behind `refresh::AdminApi`), the poller election, the snapshot codec,
//! the per-worker routing table, the request path's decisions (`steer`,
//! behind `steer::RequestHost`) and the root context's (`poller`: lease,
//! publishing, sync, over `shared::SharedData`). `proxy` is the thin glue
//! to the proxy-wasm host; `testing` holds the fakes the native tests use
//! for it. The decision itself is the core's (`serving_picker_core`).

pub mod admin_json;
pub mod change_gate;
pub mod codec;
pub mod config;
pub mod drain;
pub mod election;
pub mod narrow;
pub mod plans;
pub mod poller;
pub mod refresh;
pub mod shared;
pub mod steer;
pub mod table;
#[cfg(test)]
mod testing;

#[cfg(target_arch = "wasm32")]
mod proxy;
