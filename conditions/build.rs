//! Generates the server of Envoy Gateway's extension service (the
//! PostEndpointsModify rpc the hook answers) from
//! `proto/extension/post_endpoints.proto`: protox compiles the proto in
//! Rust (no protoc on the build machine), tonic-prost-build writes the
//! messages and the tonic service.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/extension/post_endpoints.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
