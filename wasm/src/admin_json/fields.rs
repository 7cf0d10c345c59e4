//! What both admin answers share: a socket address, read as the `IP:PORT`
//! an override header names, and an EDS health status name.

use super::de::Str;
use serde::de::Deserializer;
use serde::Deserialize;
use serving_picker_core::contract::EdsHealth;
use std::fmt::Write as _;
use std::net::IpAddr;

#[derive(Deserialize)]
pub(super) struct Address<'a> {
    #[serde(borrow)]
    socket_address: Option<SocketAddress<'a>>,
}

#[derive(Deserialize)]
struct SocketAddress<'a> {
    #[serde(borrow)]
    address: Str<'a>,
    port_value: Option<u32>,
}

/// An EDS health status name, read without keeping the string.
pub(super) struct HealthName(EdsHealth);

impl<'de> Deserialize<'de> for HealthName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Str::deserialize(d).map(|s| HealthName(EdsHealth::from_name(Some(&s.0))))
    }
}

pub(super) fn health_of(name: Option<HealthName>) -> EdsHealth {
    name.map_or(EdsHealth::from_name(None), |n| n.0)
}
/// Why a host's address cannot be overridden to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NotOverridable {
    /// Not a socket address (a pipe, an internal address).
    NotSocket,
    /// A socket address without `port_value`.
    NoPort,
    /// A port of 0 or over 65535.
    PortOutOfRange(u32),
    /// An address that is not an IP address.
    NotIp(String),
}

impl std::fmt::Display for NotOverridable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOverridable::NotSocket => f.write_str("not a socket address"),
            NotOverridable::NoPort => f.write_str("no port_value"),
            NotOverridable::PortOutOfRange(port) => write!(f, "port {port} out of range"),
            NotOverridable::NotIp(text) => write!(f, "{text:?} is not an IP address"),
        }
    }
}

impl std::error::Error for NotOverridable {}

/// `IP:PORT` for a socket address, or why it cannot be overridden to.
pub(super) fn host_address(address: Option<&Address<'_>>) -> Result<String, NotOverridable> {
    let socket = address
        .and_then(|a| a.socket_address.as_ref())
        .ok_or(NotOverridable::NotSocket)?;
    let port = socket.port_value.ok_or(NotOverridable::NoPort)?;
    if port == 0 || port > 65535 {
        return Err(NotOverridable::PortOutOfRange(port));
    }
    let text: &str = &socket.address.0;
    let mut out = String::with_capacity(text.len() + 6);
    if is_canonical_ipv4(text.as_bytes()) {
        // What almost every host has: it prints as it is written.
        out.push_str(text);
    } else {
        match text.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => {
                let _ = write!(out, "{ip}");
            }
            Ok(IpAddr::V6(ip)) => {
                // Canonical form (RFC 5952), as Display writes it.
                let _ = write!(out, "[{ip}]");
            }
            Err(_) => return Err(NotOverridable::NotIp(text.to_string())),
        }
    }
    out.push(':');
    push_decimal(&mut out, port);
    Ok(out)
}

/// Four decimal octets of at most 255, without leading zeros: an IPv4
/// address exactly as `Ipv4Addr` parses and then prints it. (Anything else
/// goes through the standard parser.)
fn is_canonical_ipv4(text: &[u8]) -> bool {
    let (mut dots, mut digits, mut octet) = (0, 0, 0u32);
    for &b in text {
        match b {
            b'0'..=b'9' => {
                if digits == 1 && octet == 0 {
                    return false;
                }
                octet = octet * 10 + u32::from(b - b'0');
                digits += 1;
                if octet > 255 {
                    return false;
                }
            }
            b'.' if digits > 0 && dots < 3 => {
                dots += 1;
                digits = 0;
                octet = 0;
            }
            _ => return false,
        }
    }
    dots == 3 && digits > 0
}

/// `n` in decimal, without going through `fmt`.
fn push_decimal(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut len = 0;
    while len < digits.len() {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for d in digits[..len].iter().rev() {
        out.push(char::from(*d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_print_as_the_standard_parser_reads_them() {
        let pieces = [
            "0", "00", "01", "1", "9", "10", "99", "100", "199", "255", "256", "999", "1000", "",
        ];
        let mut cases: Vec<String> = vec![
            "::1".into(),
            "::ffff:10.0.0.1".into(),
            "2001:DB8:0:0:0:0:0:1".into(),
            "1.2.3.4.".into(),
            ".1.2.3.4".into(),
            "1.2.3.4 ".into(),
            "+1.2.3.4".into(),
            "1..3.4".into(),
            "1.2.3".into(),
            "1.2.3.4.5".into(),
            "１.2.3.4".into(),
        ];
        for a in pieces {
            for b in ["0", "7", "255", "256", "08"] {
                cases.push(format!("{a}.{b}.{b}.{a}"));
                cases.push(format!("10.{a}.{b}.1"));
            }
        }
        for text in &cases {
            let std = match text.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) => Some(format!("{ip}:80")),
                Ok(IpAddr::V6(ip)) => Some(format!("[{ip}]:80")),
                Err(_) => None,
            };
            let address = Address {
                socket_address: Some(SocketAddress {
                    address: Str(text.as_str().into()),
                    port_value: Some(80),
                }),
            };
            assert_eq!(host_address(Some(&address)).ok(), std, "{text:?}");
            if is_canonical_ipv4(text.as_bytes()) {
                assert!(text.parse::<std::net::Ipv4Addr>().is_ok(), "{text:?}");
            }
        }
        let mut out = String::new();
        for n in [0, 1, 9, 10, 65535, u32::MAX] {
            out.clear();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }
}
