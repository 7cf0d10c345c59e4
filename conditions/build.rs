//! Generates the server of Envoy Gateway's extension service (the
//! PostEndpointsModify and PostTranslateModify rpcs the hook answers) from
//! `proto/extension/hooks.proto`: protox compiles the proto in Rust (no
//! protoc on the build machine), tonic-prost-build writes the messages and
//! the tonic service. PostTranslateModify's request is a hand-written type
//! (`envoy_gateway::native_lb`) that records fields it does not know.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/extension/hooks.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .bytes(".")
        .extern_path(
            ".envoygateway.extension.PostTranslateModifyRequest",
            "crate::envoy_gateway::native_lb::RawPostTranslateModifyRequest",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
