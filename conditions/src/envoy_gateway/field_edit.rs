//! The protobuf wire format, as much as the hook needs to edit Envoy
//! Gateway's encoded assignment in place: walk a message's fields, copy the
//! ones it does not change byte for byte, write the few it does.
//!
//! Walking an encoded message costs a few nanoseconds a field; decoding it
//! into prost types and encoding it again costs allocations for every
//! string and map and is not byte-identical (prost drops unknown fields,
//! orders maps its own way).

use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint};
use prost::encoding::{key_len, WireType};

/// One field of an encoded message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    /// The field number.
    pub number: u32,
    /// Its wire type.
    pub wire_type: WireType,
    /// The whole field, key included (what a copy writes).
    pub raw: &'a [u8],
    /// Length-delimited: the payload; otherwise empty.
    pub payload: &'a [u8],
    /// Varint: the value; otherwise 0.
    pub varint: u64,
}

/// A message that is not valid protobuf (or uses groups, which no Envoy
/// message does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed;

/// The fields of an encoded message, in wire order.
pub fn fields(msg: &[u8]) -> Fields<'_> {
    Fields { rest: msg }
}

/// Iterator over [`fields`]; stops after the first `Err`.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = next_field(self.rest);
        match field {
            Ok(f) => self.rest = &self.rest[f.raw.len()..],
            Err(_) => self.rest = &[],
        }
        Some(field)
    }
}

fn take(buf: &mut &[u8], n: usize) -> Result<(), Malformed> {
    *buf = buf.get(n..).ok_or(Malformed)?;
    Ok(())
}

fn next_field(msg: &[u8]) -> Result<Field<'_>, Malformed> {
    let mut buf = msg;
    let (number, wire_type) = decode_key(&mut buf).map_err(|_| Malformed)?;
    let mut payload: &[u8] = &[];
    let mut varint = 0;
    match wire_type {
        WireType::Varint => varint = decode_varint(&mut buf).map_err(|_| Malformed)?,
        WireType::SixtyFourBit => take(&mut buf, 8)?,
        WireType::ThirtyTwoBit => take(&mut buf, 4)?,
        WireType::LengthDelimited => {
            let len = decode_varint(&mut buf).map_err(|_| Malformed)?;
            let len = usize::try_from(len).map_err(|_| Malformed)?;
            payload = buf.get(..len).ok_or(Malformed)?;
            take(&mut buf, len)?;
        }
        WireType::StartGroup | WireType::EndGroup => return Err(Malformed),
    }
    let used = msg.len() - buf.len();
    Ok(Field {
        number,
        wire_type,
        raw: &msg[..used],
        payload,
        varint,
    })
}

/// Encoded size of a length-delimited field with a payload of `len` bytes.
pub fn len_field_size(number: u32, len: usize) -> usize {
    key_len(number) + encoded_len_varint(len as u64) + len
}

/// Writes a length-delimited field's key and length; the payload follows.
pub fn put_len_head(buf: &mut Vec<u8>, number: u32, len: usize) {
    encode_key(number, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Encoded size of a varint field.
pub fn varint_field_size(number: u32, value: u64) -> usize {
    key_len(number) + encoded_len_varint(value)
}

/// Writes a varint field.
pub fn put_varint(buf: &mut Vec<u8>, number: u32, value: u64) {
    encode_key(number, WireType::Varint, buf);
    encode_varint(value, buf);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use envoy_types::pb::envoy::config::endpoint::v3::LocalityLbEndpoints;
    use envoy_types::pb::google::protobuf::UInt32Value;
    use prost::Message;

    #[test]
    fn walks_and_rebuilds_a_message() {
        let l = LocalityLbEndpoints {
            priority: 300,
            load_balancing_weight: Some(UInt32Value { value: 7 }),
            proximity: Some(UInt32Value { value: 1 }),
            ..Default::default()
        };
        let bytes = l.encode_to_vec();
        let all: Vec<Field<'_>> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        let numbers: Vec<u32> = all.iter().map(|f| f.number).collect();
        assert_eq!(numbers, vec![3, 5, 6]);
        assert_eq!(all[1].varint, 300);
        assert_eq!(
            UInt32Value::decode(all[0].payload).unwrap(),
            UInt32Value { value: 7 }
        );
        // Copying every raw field gives the message back; rewriting one works.
        let mut out = Vec::new();
        for f in &all {
            if f.number == 5 {
                put_varint(&mut out, 5, 2);
            } else {
                out.extend_from_slice(f.raw);
            }
        }
        let back = LocalityLbEndpoints::decode(out.as_slice()).unwrap();
        assert_eq!(back.priority, 2);
        assert_eq!(back.load_balancing_weight, l.load_balancing_weight);
        assert_eq!(varint_field_size(5, 300), 3);
        assert_eq!(len_field_size(3, 2), all[0].raw.len());
    }

    #[test]
    fn truncated_and_grouped_messages_are_malformed() {
        let bytes = LocalityLbEndpoints {
            load_balancing_weight: Some(UInt32Value { value: 7 }),
            ..Default::default()
        }
        .encode_to_vec();
        let cut = &bytes[..bytes.len() - 1];
        assert_eq!(fields(cut).last(), Some(Err(Malformed)));
        // Field 1, wire type 3 (start group).
        assert_eq!(fields(&[0x0b]).next(), Some(Err(Malformed)));
        assert_eq!(fields(&[]).next(), None);
    }
}
