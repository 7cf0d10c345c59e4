//! The proxy-wasm filter alone.

mod behaviour;
mod client_header;
mod deploy_shapes;
mod drain;
mod ecds;
mod faults;
mod identity;
mod leader;
mod narrowed;
mod retries;
mod scoped;
mod staleness;
mod topology;
