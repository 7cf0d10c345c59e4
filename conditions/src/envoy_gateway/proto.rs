//! Envoy Gateway's extension service, the PostEndpointsModify rpc only,
//! hand-written against `conditions/proto/extension/service.proto` (EG's
//! text, quoted there): the messages as prost types, a tonic server and a
//! client. No protoc is needed to build.
//!
//! Two views of the same wire messages:
//! - typed ([`PostEndpointsModifyRequest`]): the ClusterLoadAssignment
//!   decoded (envoy-types' prost type), for clients and tests;
//! - raw ([`RawPostEndpointsModifyRequest`]): the ClusterLoadAssignment
//!   field kept as its encoded bytes (a message field and a bytes field share
//!   wire type 2). The server edits the assignment on the wire (`hook`),
//!   and answers an unmanaged one with the very bytes it got: prost drops
//!   unknown fields and orders `Struct` maps unlike Go, so a decode and
//!   re-encode would not be byte-identical.
//!
//! Fields are `optional` so that an empty message still goes on the wire
//! (Go sends a present, empty context; a response must always carry the
//! assignment).

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use tonic::codegen::{http, Body, BoxFuture, StdError};

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

/// `PostEndpointsModifyRequest` with the assignment and context as bytes.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RawPostEndpointsModifyRequest {
    #[prost(bytes = "bytes", optional, tag = "1")]
    pub load_assignment: Option<Bytes>,
    #[prost(bytes = "bytes", optional, tag = "2")]
    pub post_endpoints_context: Option<Bytes>,
}

/// `PostEndpointsModifyResponse` with the assignment as bytes.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RawPostEndpointsModifyResponse {
    #[prost(bytes = "bytes", optional, tag = "1")]
    pub load_assignment: Option<Bytes>,
}

/// What the server calls for PostEndpointsModify.
#[tonic::async_trait]
pub trait PostEndpointsModify: Send + Sync + 'static {
    async fn post_endpoints_modify(
        &self,
        request: tonic::Request<RawPostEndpointsModifyRequest>,
    ) -> Result<tonic::Response<RawPostEndpointsModifyResponse>, tonic::Status>;
}

/// The tonic service: PostEndpointsModify, every other path UNIMPLEMENTED.
#[derive(Debug)]
pub struct EnvoyGatewayExtensionServer<T> {
    inner: Arc<T>,
    max_decoding_message_size: Option<usize>,
    max_encoding_message_size: Option<usize>,
}

impl<T> Clone for EnvoyGatewayExtensionServer<T> {
    fn clone(&self) -> Self {
        EnvoyGatewayExtensionServer {
            inner: self.inner.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
            max_encoding_message_size: self.max_encoding_message_size,
        }
    }
}

impl<T> EnvoyGatewayExtensionServer<T> {
    pub fn new(inner: T) -> Self {
        Self::from_arc(Arc::new(inner))
    }

    pub fn from_arc(inner: Arc<T>) -> Self {
        EnvoyGatewayExtensionServer {
            inner,
            max_decoding_message_size: None,
            max_encoding_message_size: None,
        }
    }

    /// Largest request accepted (tonic's default: 4 MiB, EG's too).
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }

    #[must_use]
    pub fn max_encoding_message_size(mut self, limit: usize) -> Self {
        self.max_encoding_message_size = Some(limit);
        self
    }
}

impl<T> tonic::server::NamedService for EnvoyGatewayExtensionServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

struct PostEndpointsModifySvc<T>(Arc<T>);

impl<T: PostEndpointsModify> tonic::server::UnaryService<RawPostEndpointsModifyRequest>
    for PostEndpointsModifySvc<T>
{
    type Response = RawPostEndpointsModifyResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RawPostEndpointsModifyRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.post_endpoints_modify(request).await })
    }
}

impl<T, B> tonic::codegen::Service<http::Request<B>> for EnvoyGatewayExtensionServer<T>
where
    T: PostEndpointsModify,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == POST_ENDPOINTS_MODIFY_PATH {
            let inner = self.inner.clone();
            let (dec, enc) = (
                self.max_decoding_message_size,
                self.max_encoding_message_size,
            );
            return Box::pin(async move {
                let codec = tonic_prost::ProstCodec::default();
                let mut grpc =
                    tonic::server::Grpc::new(codec).apply_max_message_size_config(dec, enc);
                Ok(grpc.unary(PostEndpointsModifySvc(inner), req).await)
            });
        }
        Box::pin(async move {
            let mut response = http::Response::new(tonic::body::Body::default());
            let headers = response.headers_mut();
            headers.insert(
                tonic::Status::GRPC_STATUS,
                (tonic::Code::Unimplemented as i32).into(),
            );
            headers.insert(
                http::header::CONTENT_TYPE,
                tonic::metadata::GRPC_CONTENT_TYPE,
            );
            Ok(response)
        })
    }
}

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
}
