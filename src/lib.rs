//! serving-picker: Kubernetes EndpointSlice-condition-aware host selection
//! for Envoy. The decision logic here is plain Rust; `wasm` is the thin
//! proxy-wasm glue that feeds it.

pub mod admin_json;
pub mod change_gate;
pub mod codec;
pub mod conditions;
pub mod config;
mod de;
pub mod election;
pub mod narrow;
pub mod picker;
pub mod plan;
pub mod snapshot;
pub mod table;

#[cfg(target_arch = "wasm32")]
mod wasm;
