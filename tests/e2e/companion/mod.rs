//! The conditions companion in the chain: EndpointSlice files -> the real
//! `serving-picker-conditions` binary -> Envoy -> either form, or none.

mod chain;
mod envoy_gateway;
mod handshake_flood;
mod hostile_clients;
mod monitoring;
mod prometheus;
mod release;
mod replicas;
mod sessions;
mod soak;
mod status_page;
mod tls;
mod unreachable;
