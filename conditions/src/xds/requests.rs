//! Requests as they arrive on a stream, without a network: gRPC messages
//! (a 5-byte header: compressed flag and length) that [`next_message`] cuts
//! from a stream's buffer, refusing one over the size limit before it is
//! buffered; a DiscoveryRequest read without its node ([`RequestView`]).

use std::collections::HashMap;
use std::hash::Hasher;

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::google::rpc::Status as RpcStatus;

use crate::eds::response_bytes::GRPC_HEADER;

/// A DiscoveryRequest read without its node: Envoy sends its node (about
/// 60 KB with the list of its extensions) on every request, ACKs included;
/// kept as bytes, it costs a copy, not a parse of hundreds of messages.
/// Same field numbers as DiscoveryRequest (`resource_locators` skipped);
/// names as bytes (the same wire type as strings).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestView {
    /// The version the request acknowledges (empty on the first).
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// The encoded `Node`.
    #[prost(bytes = "bytes", tag = "2")]
    pub node: Bytes,
    /// The resources asked for (`ClusterLoadAssignment` names), as bytes.
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resource_names: Vec<Bytes>,
    /// The resource type (`type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment`).
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// The nonce of the response this request answers (empty on the first).
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    /// Set when Envoy rejects that response (a NACK).
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<RpcStatus>,
}

/// A DeltaDiscoveryRequest read the same way (field numbers of
/// DeltaDiscoveryRequest; `resource_locators` skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaRequestView {
    /// The encoded `Node` (Envoy sends it on the first request).
    #[prost(bytes = "bytes", tag = "1")]
    pub node: Bytes,
    /// The resource type.
    #[prost(string, tag = "2")]
    pub type_url: String,
    /// Names subscribed by this request.
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resource_names_subscribe: Vec<Bytes>,
    /// Names unsubscribed by this request.
    #[prost(bytes = "bytes", repeated, tag = "4")]
    pub resource_names_unsubscribe: Vec<Bytes>,
    /// The versions Envoy holds, by name (on a stream's first request).
    #[prost(map = "string, string", tag = "5")]
    pub initial_resource_versions: HashMap<String, String>,
    /// The nonce of the response this request answers.
    #[prost(string, tag = "6")]
    pub response_nonce: String,
    /// Set when Envoy rejects that response (a NACK).
    #[prost(message, optional, tag = "7")]
    pub error_detail: Option<RpcStatus>,
}

/// A name as text (a name that is not UTF-8 is no name any cluster has).
pub fn name_str(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or("")
}

/// A cheap fingerprint of a request's names, in order: an ACK that names
/// what the last request named is recognised without reading each name.
pub fn names_fingerprint(names: &[Bytes]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    h.write_usize(names.len());
    for n in names {
        h.write_usize(n.len());
        h.write(n);
    }
    h.finish()
}

/// Why a request stream cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The compressed flag: this server announces no compression.
    #[error("a compressed message (no grpc-encoding is announced)")]
    Compressed,
    /// A message longer than the limit (its announced length).
    #[error("a message of {0} bytes, over the limit")]
    TooLarge(usize),
}

/// Cuts the next whole message (without its header) from `buf`; `None`
/// until one is complete. A message announced longer than `max` is refused
/// from its header, before its bytes are kept.
pub fn next_message(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, MessageError> {
    if buf.len() < GRPC_HEADER {
        return Ok(None);
    }
    if buf[0] != 0 {
        return Err(MessageError::Compressed);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > max {
        return Err(MessageError::TooLarge(len));
    }
    if buf.len() < GRPC_HEADER + len {
        return Ok(None);
    }
    buf.advance(GRPC_HEADER);
    Ok(Some(buf.split_to(len).freeze()))
}

/// The announced length of the message being received, if its header is in.
pub fn announced_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= GRPC_HEADER)
        .then(|| u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use prost::Message;

    const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    #[test]
    fn a_request_read_without_its_node_keeps_every_other_field() {
        use envoy_types::pb::envoy::config::core::v3::Node;
        use envoy_types::pb::envoy::service::discovery::v3::{
            DeltaDiscoveryRequest, DiscoveryRequest,
        };
        let node = Node {
            id: "envoy-1".into(),
            cluster: "c".into(),
            ..Default::default()
        };
        let req = DiscoveryRequest {
            version_info: "v1".into(),
            node: Some(node.clone()),
            resource_names: vec!["a".into(), "b".into()],
            type_url: TYPE_URL.into(),
            response_nonce: "3".into(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "bad".into(),
                details: vec![],
            }),
            ..Default::default()
        };
        let view = RequestView::decode(req.encode_to_vec().as_slice()).unwrap();
        assert_eq!(Node::decode(view.node.clone()).unwrap(), node);
        assert_eq!(view.version_info, "v1");
        assert_eq!(view.resource_names, vec![&b"a"[..], &b"b"[..]]);
        assert_eq!(view.type_url, TYPE_URL);
        assert_eq!(view.response_nonce, "3");
        assert_eq!(view.error_detail, req.error_detail);
        let delta = DeltaDiscoveryRequest {
            node: Some(node.clone()),
            type_url: TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into()],
            resource_names_unsubscribe: vec!["b".into()],
            initial_resource_versions: [("c".to_string(), "v9".to_string())].into(),
            response_nonce: "4".into(),
            ..Default::default()
        };
        let d = DeltaRequestView::decode(delta.encode_to_vec().as_slice()).unwrap();
        assert_eq!(Node::decode(d.node).unwrap(), node);
        assert_eq!(d.resource_names_subscribe, vec![&b"a"[..]]);
        assert_eq!(d.resource_names_unsubscribe, vec![&b"b"[..]]);
        assert_eq!(d.initial_resource_versions["c"], "v9");
        assert_eq!(d.response_nonce, "4");
        // The same names in the same order: the same fingerprint.
        assert_eq!(
            names_fingerprint(&view.resource_names),
            names_fingerprint(&[Bytes::from("a"), Bytes::from("b")])
        );
        assert_ne!(
            names_fingerprint(&view.resource_names),
            names_fingerprint(&[Bytes::from("ab")])
        );
    }

    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn messages_are_cut_whole_and_oversized_ones_refused_from_the_header() {
        let mut buf = BytesMut::new();
        let two = [framed(b"abc"), framed(b"")].concat();
        buf.extend_from_slice(&two[..4]);
        assert_eq!(next_message(&mut buf, 10), Ok(None));
        buf.extend_from_slice(&two[4..7]);
        assert_eq!(next_message(&mut buf, 10), Ok(None));
        buf.extend_from_slice(&two[7..]);
        assert_eq!(next_message(&mut buf, 10).unwrap().unwrap(), &b"abc"[..]);
        assert_eq!(next_message(&mut buf, 10).unwrap().unwrap(), &b""[..]);
        assert!(buf.is_empty());
        // Only the header of a large message is needed to refuse it.
        let mut big = BytesMut::from(&framed(&[0u8; 11])[..GRPC_HEADER]);
        assert_eq!(announced_len(&big), Some(11));
        assert_eq!(next_message(&mut big, 10), Err(MessageError::TooLarge(11)));
        let mut compressed = BytesMut::from(&[1u8, 0, 0, 0, 1, 0][..]);
        assert_eq!(
            next_message(&mut compressed, 10),
            Err(MessageError::Compressed)
        );
    }
}
