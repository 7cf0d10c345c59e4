//! Property tests for everything that reads bytes the filter does not
//! control: the plugin configuration, Envoy's admin JSON, and the published
//! snapshot; and for what is built from them (plans, routing table).
//!
//! The number of cases comes from `PROPTEST_CASES` (proptest's default
//! config reads it; 256 without it): `make test` runs a few, `make fuzz` many.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//!
//! One module per input: `config` (the plugin configuration), `admin` (Envoy's
//! admin JSON and the pipeline built from it), `generated` (well-formed admin
//! output generated and rendered), `codec` (the published snapshot), `table`
//! (the routing table); `common` and `mutations` hold what they share.

mod admin;
mod codec;
mod common;
mod config;
mod generated;
mod mutations;
mod table;
