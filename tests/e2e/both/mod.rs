//! Scenarios run against both forms: each `fn name(form: Form)` becomes the
//! tests `name::wasm` and `name::native` (`both_forms!`).

mod behaviour;
mod hostile;
mod soak;
mod table;
mod topology_hints;
