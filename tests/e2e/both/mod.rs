//! Scenarios run against both forms: each `fn name(form: Form)` becomes the
//! tests `name::wasm` and `name::native` (`both_forms!`); and the metadata
//! contract, without Envoy: what the companion writes, both forms read alike.

mod behaviour;
mod contract;
mod faults;
mod hostile;
mod soak;
mod table;
mod topology_hints;
