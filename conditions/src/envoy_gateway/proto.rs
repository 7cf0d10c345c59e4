//! Envoy Gateway's extension service, the PostEndpointsModify rpc only.
//!
//! The server and the messages it takes are generated at build time
//! (`conditions/build.rs`: protox and tonic-prost-build, no protoc) from
//! `conditions/proto/extension/post_endpoints.proto`, EG's package, service
//! and rpc with the ClusterLoadAssignment kept as its encoded bytes. The
//! hook edits the assignment on the wire and answers an unmanaged one with
//! the very bytes it got: prost drops unknown fields and orders `Struct`
//! maps unlike Go, so a decode and re-encode would not be byte-identical.
//!
//! Two views of the same wire messages:
//! - raw ([`RawPostEndpointsModifyRequest`], generated): the assignment
//!   and the context as bytes (a message field and a bytes field share wire
//!   type 2), what the server takes;
//! - typed ([`PostEndpointsModifyRequest`]): the ClusterLoadAssignment
//!   decoded (envoy-types' prost type), for clients and tests.
//!
//! Fields are `optional` so that an empty message still goes on the wire
//! (Go sends a present, empty context; a response must always carry the
//! assignment). [`EnvoyGatewayExtensionClient`] calls the rpc as EG does
//! (tests, benchmarks, debugging).

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use tonic::codegen::http;

/// The gRPC service name.
pub const SERVICE_NAME: &str = "envoygateway.extension.EnvoyGatewayExtension";
/// The one rpc implemented.
pub const POST_ENDPOINTS_MODIFY_PATH: &str =
    "/envoygateway.extension.EnvoyGatewayExtension/PostEndpointsModify";

/// `PostEndpointsExtensionContext` (empty in every EG version read).
#[derive(Clone, Copy, PartialEq, ::prost::Message)]
pub struct PostEndpointsExtensionContext {}

/// `PostEndpointsModifyRequest`, typed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostEndpointsModifyRequest {
    #[prost(message, optional, tag = "1")]
    pub load_assignment: Option<ClusterLoadAssignment>,
    #[prost(message, optional, tag = "2")]
    pub post_endpoints_context: Option<PostEndpointsExtensionContext>,
}

/// `PostEndpointsModifyResponse`, typed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostEndpointsModifyResponse {
    #[prost(message, optional, tag = "1")]
    pub load_assignment: Option<ClusterLoadAssignment>,
}

/// The generated messages and server (`conditions/build.rs`).
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
mod generated {
    tonic::include_proto!("envoygateway.extension");
}

pub use generated::envoy_gateway_extension_server::{
    EnvoyGatewayExtension, EnvoyGatewayExtensionServer,
};
pub use generated::{
    PostEndpointsModifyRequest as RawPostEndpointsModifyRequest,
    PostEndpointsModifyResponse as RawPostEndpointsModifyResponse,
};

/// A client, as Envoy Gateway is one (tests, benchmarks, debugging).
#[derive(Clone, Debug)]
pub struct EnvoyGatewayExtensionClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl EnvoyGatewayExtensionClient {
    /// Connects to `dst` (`http://ADDR:PORT`).
    pub async fn connect(dst: String) -> Result<Self, tonic::transport::Error> {
        let channel = tonic::transport::Endpoint::new(dst)?.connect().await?;
        Ok(Self::new(channel))
    }

    pub fn new(channel: tonic::transport::Channel) -> Self {
        EnvoyGatewayExtensionClient {
            inner: tonic::client::Grpc::new(channel).max_decoding_message_size(usize::MAX),
        }
    }

    async fn unary<M1, M2>(&mut self, path: &'static str, req: M1) -> Result<M2, tonic::Status>
    where
        M1: prost::Message + Send + Sync + 'static,
        M2: prost::Message + Default + Send + Sync + 'static,
    {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("service not ready: {e}")))?;
        let codec = tonic_prost::ProstCodec::<M1, M2>::default();
        let path = http::uri::PathAndQuery::from_static(path);
        Ok(self
            .inner
            .unary(tonic::Request::new(req), path, codec)
            .await?
            .into_inner())
    }

    /// PostEndpointsModify, typed.
    pub async fn post_endpoints_modify(
        &mut self,
        req: PostEndpointsModifyRequest,
    ) -> Result<PostEndpointsModifyResponse, tonic::Status> {
        self.unary(POST_ENDPOINTS_MODIFY_PATH, req).await
    }

    /// PostEndpointsModify, the assignment as bytes both ways.
    pub async fn post_endpoints_modify_raw(
        &mut self,
        req: RawPostEndpointsModifyRequest,
    ) -> Result<RawPostEndpointsModifyResponse, tonic::Status> {
        self.unary(POST_ENDPOINTS_MODIFY_PATH, req).await
    }

    /// PostRouteModify with an empty request (this server does not implement it).
    pub async fn post_route_modify_empty(&mut self) -> Result<(), tonic::Status> {
        self.unary::<PostEndpointsExtensionContext, PostEndpointsExtensionContext>(
            "/envoygateway.extension.EnvoyGatewayExtension/PostRouteModify",
            PostEndpointsExtensionContext {},
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use bytes::Bytes;
    use prost::Message;

    #[test]
    fn raw_and_typed_views_share_the_wire() {
        let cla = ClusterLoadAssignment {
            cluster_name: "httproute/default/app/rule/0".into(),
            ..Default::default()
        };
        let typed = PostEndpointsModifyRequest {
            load_assignment: Some(cla.clone()),
            post_endpoints_context: Some(PostEndpointsExtensionContext {}),
        };
        let wire = typed.encode_to_vec();
        let raw = RawPostEndpointsModifyRequest::decode(wire.as_slice()).unwrap();
        assert_eq!(
            raw.load_assignment.as_deref(),
            Some(cla.encode_to_vec().as_slice())
        );
        // The empty context is present (tag 2, length 0), as Go sends it.
        assert_eq!(raw.post_endpoints_context.as_deref(), Some(&[][..]));
        assert_eq!(raw.encode_to_vec(), wire, "raw re-encodes byte for byte");
        // An empty assignment still goes on the wire.
        let resp = RawPostEndpointsModifyResponse {
            load_assignment: Some(Bytes::new()),
        };
        let typed = PostEndpointsModifyResponse::decode(resp.encode_to_vec().as_slice()).unwrap();
        assert_eq!(
            typed.load_assignment,
            Some(ClusterLoadAssignment::default())
        );
    }

    #[test]
    fn the_generated_service_is_egs() {
        assert_eq!(
            generated::envoy_gateway_extension_server::SERVICE_NAME,
            SERVICE_NAME
        );
        assert_eq!(
            format!("/{SERVICE_NAME}/PostEndpointsModify"),
            POST_ENDPOINTS_MODIFY_PATH
        );
    }
}
