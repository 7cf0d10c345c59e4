//! The end-to-end tests: a real Envoy 1.40 with the real modules, the real
//! companion binary, real loopback backends. One binary, a module per family:
//!
//! - `wasm`: the proxy-wasm filter alone (admin refresh, change gate, leader,
//!   faults of the admin API, deployment shapes, retries, topology);
//! - `native`: the dynamic-module load-balancing policy alone (its ABI
//!   against Envoy's symbols, counters, refused configurations);
//! - `companion`: the conditions companion in the chain (EDS server, the
//!   Envoy Gateway hook), with either form or none;
//! - `both`: scenarios run against both forms (`<name>::wasm`,
//!   `<name>::native`): the behaviour table, soak, hostile input, hints;
//! - `harness`: self-tests of the harness (the `support` library).
//!
//! One family or test: `cargo test -p serving-picker-e2e --test e2e both::table::`.
//! A new test file goes to `<family>/<name>.rs` with `mod <name>;` in the
//! family's mod.rs (the library's layout test fails otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod both;
mod companion;
mod harness;
mod native;
mod wasm;
