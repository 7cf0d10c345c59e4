//! Network plumbing, knowing nothing of EndpointSlices or xDS: the gRPC
//! listener's connections, counted and capped (`listener`), and TLS or
//! mutual TLS on it with files reloaded as they change (`tls`), the admin
//! HTTP server (`admin`), and the debounced directory watcher that the TLS
//! files and the slices directory share (`watch`).

pub mod admin;
pub mod listener;
pub mod tls;
pub mod watch;
