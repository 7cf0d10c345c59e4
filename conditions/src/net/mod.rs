//! Network plumbing, knowing nothing of EndpointSlices or xDS: the gRPC
//! listener's connections, counted and capped (`listener`), and TLS or
//! mutual TLS on it with files reloaded as they change (`tls`).

pub mod admin;
pub mod listener;
pub mod tls;
