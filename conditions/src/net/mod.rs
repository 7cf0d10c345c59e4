//! Network plumbing, knowing nothing of EndpointSlices or xDS: the gRPC
//! listener's connections, counted and capped (`listener`), and TLS or
//! mutual TLS on it with files reloaded as they change (`tls`), one way to
//! watch files (`watch`), and the admin HTTP server (`admin`).

pub mod admin;
pub mod listener;
pub mod tls;
pub mod watch;
