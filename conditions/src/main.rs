//! serving-picker-conditions: EndpointSlices -> endpoint conditions for Envoy.
fn main() {}
