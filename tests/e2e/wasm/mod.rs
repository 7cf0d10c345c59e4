//! The proxy-wasm filter alone.

mod behaviour;
mod deploy_shapes;
mod faults;
mod leader;
mod narrowed;
mod retries;
mod staleness;
mod topology;
