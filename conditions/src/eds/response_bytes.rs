//! A `DiscoveryResponse`'s bytes, built once per snapshot and shared.
//!
//! A response is written as `[gRPC message header][version_info]
//! [resources...][type_url][nonce]`. Each resource is an assignment's `Any`,
//! framed as field 2 of a DiscoveryResponse once per version ([`resource_entry`])
//! and shared by every stream (`bytes::Bytes`); a stream adds only its head
//! and tail, about a hundred bytes ([`frame`]). Fields are in number order,
//! so the bytes are exactly prost's encoding of the same message.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

/// The gRPC length-prefixed message header: a compressed flag, a u32 length.
pub const GRPC_HEADER: usize = 5;

const RESPONSE_VERSION_INFO: u32 = 1;
const RESPONSE_RESOURCES: u32 = 2;
const RESPONSE_TYPE_URL: u32 = 4;
const RESPONSE_NONCE: u32 = 5;
const ANY_TYPE_URL: u32 = 1;
const ANY_VALUE: u32 = 2;

/// Bytes of a length-delimited field of `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_field(buf: &mut BytesMut, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

/// Bytes of a string field as prost writes it (an empty string is left out).
fn string_field_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        field_len(tag, s.len())
    }
}

fn put_string_field(buf: &mut BytesMut, tag: u32, s: &str) {
    if !s.is_empty() {
        put_field(buf, tag, s.as_bytes());
    }
}

/// One resource as a DiscoveryResponse carries it (`resources` entry: an
/// `Any` of `type_url` and `value`), and where `value` starts in it.
pub fn resource_entry(type_url: &str, value: &[u8]) -> (Bytes, usize) {
    let value_len = if value.is_empty() {
        0
    } else {
        field_len(ANY_VALUE, value.len())
    };
    let any_len = string_field_len(ANY_TYPE_URL, type_url) + value_len;
    let mut buf = BytesMut::with_capacity(field_len(RESPONSE_RESOURCES, any_len));
    encode_key(RESPONSE_RESOURCES, WireType::LengthDelimited, &mut buf);
    encode_varint(any_len as u64, &mut buf);
    put_string_field(&mut buf, ANY_TYPE_URL, type_url);
    if !value.is_empty() {
        encode_key(ANY_VALUE, WireType::LengthDelimited, &mut buf);
        encode_varint(value.len() as u64, &mut buf);
    }
    let value_at = buf.len();
    buf.put_slice(value);
    (buf.freeze(), value_at)
}

const DELTA_SYSTEM_VERSION_INFO: u32 = 1;
const DELTA_RESOURCES: u32 = 2;
const DELTA_TYPE_URL: u32 = 4;
const DELTA_NONCE: u32 = 5;
const DELTA_REMOVED_RESOURCES: u32 = 6;
const RESOURCE_VERSION: u32 = 1;
const RESOURCE_RESOURCE: u32 = 2;
const RESOURCE_NAME: u32 = 3;

/// One resource as a DeltaDiscoveryResponse carries it (a `resources`
/// entry: a `Resource` of `name`, `version` and an `Any` of `type_url` and
/// a value of `value_len` bytes), as the bytes before the value and the
/// bytes after it: the value itself is shared with the state-of-the-world
/// entry, not copied.
pub fn delta_entry_parts(
    name: &str,
    version: &str,
    type_url: &str,
    value_len: usize,
) -> (Bytes, Bytes) {
    let value_field = if value_len == 0 {
        0
    } else {
        field_len(ANY_VALUE, value_len)
    };
    let any_len = string_field_len(ANY_TYPE_URL, type_url) + value_field;
    let resource_len = string_field_len(RESOURCE_VERSION, version)
        + field_len(RESOURCE_RESOURCE, any_len)
        + string_field_len(RESOURCE_NAME, name);
    let mut head = BytesMut::with_capacity(64 + version.len() + type_url.len());
    encode_key(DELTA_RESOURCES, WireType::LengthDelimited, &mut head);
    encode_varint(resource_len as u64, &mut head);
    put_string_field(&mut head, RESOURCE_VERSION, version);
    encode_key(RESOURCE_RESOURCE, WireType::LengthDelimited, &mut head);
    encode_varint(any_len as u64, &mut head);
    put_string_field(&mut head, ANY_TYPE_URL, type_url);
    if value_len > 0 {
        encode_key(ANY_VALUE, WireType::LengthDelimited, &mut head);
        encode_varint(value_len as u64, &mut head);
    }
    let mut tail = BytesMut::with_capacity(8 + name.len());
    put_string_field(&mut tail, RESOURCE_NAME, name);
    (head.freeze(), tail.freeze())
}

/// Head and tail of a DeltaDiscoveryResponse whose resource entries take
/// `entries_len` bytes, naming `removed` as removed.
pub fn delta_frame(
    system_version: &str,
    type_url: &str,
    nonce: &str,
    removed: &[String],
    entries_len: usize,
) -> Frame {
    let removed_len: usize = removed
        .iter()
        .map(|r| field_len(DELTA_REMOVED_RESOURCES, r.len()))
        .sum();
    let head_fields = string_field_len(DELTA_SYSTEM_VERSION_INFO, system_version);
    let tail_len = string_field_len(DELTA_TYPE_URL, type_url)
        + string_field_len(DELTA_NONCE, nonce)
        + removed_len;
    let message_len = head_fields + entries_len + tail_len;
    let mut buf = BytesMut::with_capacity(GRPC_HEADER + head_fields + tail_len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message_len).unwrap_or(u32::MAX));
    put_string_field(&mut buf, DELTA_SYSTEM_VERSION_INFO, system_version);
    put_string_field(&mut buf, DELTA_TYPE_URL, type_url);
    put_string_field(&mut buf, DELTA_NONCE, nonce);
    for r in removed {
        put_field(&mut buf, DELTA_REMOVED_RESOURCES, r.as_bytes());
    }
    let mut all = buf.freeze();
    let head = all.split_to(GRPC_HEADER + head_fields);
    Frame {
        head,
        tail: all,
        message_len,
    }
}

/// Message length of a delta response (gRPC header excluded).
pub fn delta_message_len(
    system_version: &str,
    type_url: &str,
    nonce: &str,
    removed: &[String],
    entries_len: usize,
) -> usize {
    string_field_len(DELTA_SYSTEM_VERSION_INFO, system_version)
        + entries_len
        + string_field_len(DELTA_TYPE_URL, type_url)
        + string_field_len(DELTA_NONCE, nonce)
        + removed
            .iter()
            .map(|r| field_len(DELTA_REMOVED_RESOURCES, r.len()))
            .sum::<usize>()
}

/// The per-stream parts of a response whose resource entries take
/// `entries_len` bytes: the head (gRPC header, version_info) and the tail
/// (type_url, nonce), and the message length (without the gRPC header).
pub struct Frame {
    /// The gRPC header and the fields before the entries.
    pub head: Bytes,
    /// The fields after the entries.
    pub tail: Bytes,
    /// The message's length, without the gRPC header.
    pub message_len: usize,
}

/// Message length of a response with these fields (gRPC header excluded).
pub fn message_len(version: &str, type_url: &str, nonce: &str, entries_len: usize) -> usize {
    string_field_len(RESPONSE_VERSION_INFO, version)
        + entries_len
        + string_field_len(RESPONSE_TYPE_URL, type_url)
        + string_field_len(RESPONSE_NONCE, nonce)
}

/// Head and tail of a response (see [`Frame`]), in one allocation.
pub fn frame(version: &str, type_url: &str, nonce: &str, entries_len: usize) -> Frame {
    let message_len = message_len(version, type_url, nonce, entries_len);
    let head_len = GRPC_HEADER + string_field_len(RESPONSE_VERSION_INFO, version);
    let tail_len =
        string_field_len(RESPONSE_TYPE_URL, type_url) + string_field_len(RESPONSE_NONCE, nonce);
    let mut buf = BytesMut::with_capacity(head_len + tail_len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message_len).unwrap_or(u32::MAX));
    put_string_field(&mut buf, RESPONSE_VERSION_INFO, version);
    put_string_field(&mut buf, RESPONSE_TYPE_URL, type_url);
    put_string_field(&mut buf, RESPONSE_NONCE, nonce);
    let mut all = buf.freeze();
    let head = all.split_to(head_len);
    Frame {
        head,
        tail: all,
        message_len,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use envoy_types::pb::google::protobuf::Any;
    use prost::Message;

    const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

    #[test]
    fn assembled_responses_are_prosts_encoding() {
        for values in [
            vec![],
            vec![vec![1u8, 2, 3]],
            vec![vec![7u8; 300], vec![], vec![9u8; 70_000]],
        ] {
            for (version, nonce) in [("1700000000000-42", "7"), ("", "1")] {
                let entries: Vec<Bytes> = values
                    .iter()
                    .map(|v| resource_entry(TYPE_URL, v).0)
                    .collect();
                let entries_len = entries.iter().map(Bytes::len).sum();
                let f = frame(version, TYPE_URL, nonce, entries_len);
                let mut wire = f.head.to_vec();
                for e in &entries {
                    wire.extend_from_slice(e);
                }
                wire.extend_from_slice(&f.tail);
                let expected = DiscoveryResponse {
                    version_info: version.into(),
                    resources: values
                        .iter()
                        .map(|v| Any {
                            type_url: TYPE_URL.into(),
                            value: v.clone(),
                        })
                        .collect(),
                    type_url: TYPE_URL.into(),
                    nonce: nonce.into(),
                    ..Default::default()
                }
                .encode_to_vec();
                assert_eq!(wire[0], 0);
                assert_eq!(
                    u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize,
                    expected.len()
                );
                assert_eq!(f.message_len, expected.len());
                assert_eq!(&wire[GRPC_HEADER..], &expected[..]);
            }
        }
    }

    #[test]
    fn assembled_delta_responses_are_prosts_encoding() {
        use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
        let values = [vec![1u8, 2, 3], vec![], vec![9u8; 70_000]];
        let names = ["a", "ns/web:http", "big"];
        let mut wire = Vec::new();
        let mut entries = Vec::new();
        for (v, n) in values.iter().zip(names) {
            let (head, tail) = delta_entry_parts(n, "00ff", TYPE_URL, v.len());
            let mut e = head.to_vec();
            e.extend_from_slice(v);
            e.extend_from_slice(&tail);
            entries.push(e);
        }
        let entries_len = entries.iter().map(Vec::len).sum();
        let removed = vec!["gone".to_string(), "never".to_string()];
        let f = delta_frame("1-7", TYPE_URL, "3", &removed, entries_len);
        wire.extend_from_slice(&f.head);
        for e in &entries {
            wire.extend_from_slice(e);
        }
        wire.extend_from_slice(&f.tail);
        assert_eq!(
            f.message_len,
            delta_message_len("1-7", TYPE_URL, "3", &removed, entries_len)
        );
        let got = DeltaDiscoveryResponse::decode(&wire[GRPC_HEADER..]).unwrap();
        let want = DeltaDiscoveryResponse {
            system_version_info: "1-7".into(),
            resources: values
                .iter()
                .zip(names)
                .map(|(v, n)| Resource {
                    name: n.into(),
                    version: "00ff".into(),
                    resource: Some(Any {
                        type_url: TYPE_URL.into(),
                        value: v.clone(),
                    }),
                    ..Default::default()
                })
                .collect(),
            type_url: TYPE_URL.into(),
            removed_resources: removed.clone(),
            nonce: "3".into(),
            ..Default::default()
        };
        assert_eq!(got, want);
        assert_eq!(&wire[GRPC_HEADER..], &want.encode_to_vec()[..]);
        assert_eq!(
            u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize,
            wire.len() - GRPC_HEADER
        );
    }

    #[test]
    fn the_value_is_found_inside_its_entry() {
        let (entry, at) = resource_entry(TYPE_URL, b"assignment");
        assert_eq!(&entry[at..], b"assignment");
    }
}
