//! Envoy Gateway's extension service, the PostEndpointsModify and
//! PostTranslateModify rpcs.
//!
//! The server and the messages it takes are generated at build time
//! (`conditions/build.rs`: protox and tonic-prost-build, no protoc) from
//! `conditions/proto/extension/hooks.proto`, EG's package, service and rpcs
//! with every Envoy resource kept as its encoded bytes. The hooks edit on
//! the wire and answer what they leave alone with the very bytes they got:
//! prost drops unknown fields and orders `Struct` maps unlike Go, so a
//! decode and re-encode would not be byte-identical.
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

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use tonic::codegen::http;

/// The gRPC service name.
pub const SERVICE_NAME: &str = "envoygateway.extension.EnvoyGatewayExtension";
/// The PostEndpointsModify rpc's path.
pub const POST_ENDPOINTS_MODIFY_PATH: &str =
    "/envoygateway.extension.EnvoyGatewayExtension/PostEndpointsModify";
/// The PostTranslateModify rpc's path.
pub const POST_TRANSLATE_MODIFY_PATH: &str =
    "/envoygateway.extension.EnvoyGatewayExtension/PostTranslateModify";

/// `PostEndpointsExtensionContext` (empty in every EG version read).
#[derive(Clone, Copy, PartialEq, ::prost::Message)]
pub struct PostEndpointsExtensionContext {}

/// `PostEndpointsModifyRequest`, typed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostEndpointsModifyRequest {
    /// The assignment EG built for one cluster.
    #[prost(message, optional, tag = "1")]
    pub load_assignment: Option<ClusterLoadAssignment>,
    /// The context EG sends with it (empty).
    #[prost(message, optional, tag = "2")]
    pub post_endpoints_context: Option<PostEndpointsExtensionContext>,
}

/// `PostEndpointsModifyResponse`, typed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostEndpointsModifyResponse {
    /// The assignment to use instead (EG's own when the hook leaves it alone).
    #[prost(message, optional, tag = "1")]
    pub load_assignment: Option<ClusterLoadAssignment>,
}

/// `PostTranslateExtensionContext`: the extension's own policies (none
/// for serving-picker; kept as bytes, never read).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostTranslateExtensionContext {
    /// The extension's own resources, each encoded (none for serving-picker).
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub extension_resources: Vec<Vec<u8>>,
}

/// `PostTranslateModifyRequest`, typed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostTranslateModifyRequest {
    /// The context EG sends (the extension's resources).
    #[prost(message, optional, tag = "1")]
    pub post_translate_context: Option<PostTranslateExtensionContext>,
    /// The clusters EG sends (its `translation` settings choose the kinds).
    #[prost(message, repeated, tag = "2")]
    pub clusters: Vec<Cluster>,
    /// The Secrets EG sends (every one by default; the shipped values send
    /// none).
    #[prost(message, repeated, tag = "3")]
    pub secrets: Vec<Secret>,
    /// The listeners EG sends.
    #[prost(message, repeated, tag = "4")]
    pub listeners: Vec<Listener>,
    /// The route configurations EG sends.
    #[prost(message, repeated, tag = "5")]
    pub routes: Vec<RouteConfiguration>,
}

/// `PostTranslateModifyResponse`, typed.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PostTranslateModifyResponse {
    /// The final list of clusters: the request's, in order, each as sent or
    /// with the policy set.
    #[prost(message, repeated, tag = "1")]
    pub clusters: Vec<Cluster>,
    /// The Secrets, as sent.
    #[prost(message, repeated, tag = "2")]
    pub secrets: Vec<Secret>,
    /// The listeners, as sent.
    #[prost(message, repeated, tag = "3")]
    pub listeners: Vec<Listener>,
    /// The route configurations, as sent.
    #[prost(message, repeated, tag = "4")]
    pub routes: Vec<RouteConfiguration>,
}

/// A request's exact wire bytes, sent as they are (a client playing a later
/// EG: fields this version does not know).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wire(pub Vec<u8>);

impl prost::Message for Wire {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// The generated messages and server (`conditions/build.rs`); EG's proto
/// documents them.
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
mod generated {
    tonic::include_proto!("envoygateway.extension");
}

pub use super::native_lb::RawPostTranslateModifyRequest;
pub use generated::envoy_gateway_extension_server::{
    EnvoyGatewayExtension, EnvoyGatewayExtensionServer,
};
pub use generated::{
    PostEndpointsModifyRequest as RawPostEndpointsModifyRequest,
    PostEndpointsModifyResponse as RawPostEndpointsModifyResponse,
    PostTranslateModifyResponse as RawPostTranslateModifyResponse,
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

    /// A client over `channel`, taking answers of any size.
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

    /// PostTranslateModify, typed.
    pub async fn post_translate_modify(
        &mut self,
        req: PostTranslateModifyRequest,
    ) -> Result<PostTranslateModifyResponse, tonic::Status> {
        self.unary(POST_TRANSLATE_MODIFY_PATH, req).await
    }

    /// PostTranslateModify, every resource as bytes both ways.
    pub async fn post_translate_modify_raw(
        &mut self,
        req: RawPostTranslateModifyRequest,
    ) -> Result<RawPostTranslateModifyResponse, tonic::Status> {
        self.unary(POST_TRANSLATE_MODIFY_PATH, req).await
    }

    /// PostTranslateModify with these exact request bytes.
    pub async fn post_translate_modify_wire(
        &mut self,
        req: Wire,
    ) -> Result<RawPostTranslateModifyResponse, tonic::Status> {
        self.unary(POST_TRANSLATE_MODIFY_PATH, req).await
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
        assert_eq!(
            format!("/{SERVICE_NAME}/PostTranslateModify"),
            POST_TRANSLATE_MODIFY_PATH
        );
    }
}
