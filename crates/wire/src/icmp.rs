//! ICMPv4 and ICMPv6: echo replies and the errors that quote a probe (time exceeded,
//! destination unreachable). The two versions share one shape (type, code, checksum, 4 bytes
//! of rest-of-header, then the invoking packet), so one parser, generic over [`Version`],
//! serves both; only the type numbers and the quoted IP header differ.

use std::net::{IpAddr, Ipv6Addr};

use etherparse::Ipv4HeaderSlice;
use serde::{Deserialize, Serialize};

use crate::be16;

/// Byte ranges of the ICMP header (RFC 792, RFC 4443).
pub mod field {
    use std::ops::Range;
    /// Message type.
    pub const TYPE: usize = 0;
    /// Code.
    pub const CODE: usize = 1;
    /// Checksum.
    pub const CHECKSUM: Range<usize> = 2..4;
    /// Echo identifier.
    pub const ECHO_IDENT: Range<usize> = 4..6;
    /// Echo sequence number.
    pub const ECHO_SEQNO: Range<usize> = 6..8;
    /// Where the body (echo data, or the invoking packet of an error) starts.
    pub const BODY: usize = 8;
}

/// The buffer is shorter than an ICMP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ICMP header cut short")
    }
}

impl std::error::Error for Truncated {}

/// A zero-copy view of an ICMP (v4 or v6) message.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The view after the one length check that makes every accessor safe.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        if buffer.as_ref().len() < field::BODY {
            return Err(Truncated);
        }
        Ok(Packet { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.b()[field::TYPE]
    }

    /// Code.
    pub fn code(&self) -> u8 {
        self.b()[field::CODE]
    }

    /// Checksum as on the wire (never verified here).
    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM.start)
    }

    /// Echo identifier (meaningful for echo messages).
    pub fn echo_ident(&self) -> u16 {
        be16(self.b(), field::ECHO_IDENT.start)
    }

    /// Echo sequence number (meaningful for echo messages).
    pub fn echo_seq_no(&self) -> u16 {
        be16(self.b(), field::ECHO_SEQNO.start)
    }

    /// Everything after the 8-byte header.
    pub fn body(&self) -> &[u8] {
        &self.b()[field::BODY..]
    }
}

/// What kind of ICMP error came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IcmpError {
    /// Time exceeded in transit (a router on the path).
    TimeExceeded,
    /// Destination unreachable, port (the target's answer to a UDP probe).
    PortUnreachable,
    /// Any other destination unreachable (code in the reply).
    Unreachable,
}

/// The part of our probe an ICMP error quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quoted {
    /// Protocol number of the quoted packet.
    pub ip_proto: u8,
    /// Its source.
    pub src: IpAddr,
    /// Its destination.
    pub dst: IpAddr,
    /// Its first 8 transport bytes (all RFC 792 guarantees).
    pub head: [u8; 8],
}

/// An ICMP message a probe cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// An echo reply.
    EchoReply {
        /// Identifier.
        id: u16,
        /// Sequence.
        seq: u16,
    },
    /// An error quoting a packet.
    Error {
        /// Kind.
        kind: IcmpError,
        /// ICMP code.
        code: u8,
        /// What it quotes.
        quoted: Quoted,
    },
}

/// What differs between ICMPv4 and ICMPv6.
pub trait Version {
    /// Echo reply type.
    const ECHO_REPLY: u8;
    /// Destination unreachable type.
    const DST_UNREACHABLE: u8;
    /// Time exceeded type.
    const TIME_EXCEEDED: u8;
    /// The destination-unreachable code for "port unreachable".
    const PORT_UNREACHABLE: u8;
    /// Reads the quoted IP header and the 8 transport bytes after it from an error's body.
    fn quoted(body: &[u8]) -> Option<Quoted>;
}

/// ICMPv4 (RFC 792).
#[derive(Debug)]
pub enum V4 {}

/// ICMPv6 (RFC 4443).
#[derive(Debug)]
pub enum V6 {}

impl Version for V4 {
    const ECHO_REPLY: u8 = 0;
    const DST_UNREACHABLE: u8 = 3;
    const TIME_EXCEEDED: u8 = 11;
    const PORT_UNREACHABLE: u8 = 3;

    fn quoted(body: &[u8]) -> Option<Quoted> {
        let q = Ipv4HeaderSlice::from_slice(body).ok()?;
        let hl = q.slice().len();
        Some(Quoted {
            ip_proto: q.protocol().0,
            src: IpAddr::V4(q.source_addr()),
            dst: IpAddr::V4(q.destination_addr()),
            head: body.get(hl..hl + 8)?.try_into().ok()?,
        })
    }
}

impl Version for V6 {
    const ECHO_REPLY: u8 = 129;
    const DST_UNREACHABLE: u8 = 1;
    const TIME_EXCEEDED: u8 = 3;
    const PORT_UNREACHABLE: u8 = 4;

    fn quoted(body: &[u8]) -> Option<Quoted> {
        // The fixed 40-byte IPv6 header, then the transport's first 8 bytes.
        let q = body.get(..48)?;
        if q[0] >> 4 != 6 {
            return None;
        }
        let src: [u8; 16] = q[8..24].try_into().ok()?;
        let dst: [u8; 16] = q[24..40].try_into().ok()?;
        Some(Quoted {
            ip_proto: q[6],
            src: IpAddr::V6(Ipv6Addr::from(src)),
            dst: IpAddr::V6(Ipv6Addr::from(dst)),
            head: q[40..48].try_into().ok()?,
        })
    }
}

/// Parses an ICMP message of version `V`: an echo reply, or an error with the packet it
/// quotes. `None` for anything else, a truncated header or an unreadable quote.
pub fn parse<V: Version>(bytes: &[u8]) -> Option<Message> {
    let p = Packet::new_checked(bytes).ok()?;
    let (ty, code) = (p.msg_type(), p.code());
    if ty == V::ECHO_REPLY {
        return Some(Message::EchoReply {
            id: p.echo_ident(),
            seq: p.echo_seq_no(),
        });
    }
    let kind = if ty == V::TIME_EXCEEDED {
        IcmpError::TimeExceeded
    } else if ty != V::DST_UNREACHABLE {
        return None;
    } else if code == V::PORT_UNREACHABLE {
        IcmpError::PortUnreachable
    } else {
        IcmpError::Unreachable
    };
    Some(Message::Error {
        kind,
        code,
        quoted: V::quoted(p.body())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ICMPv4 time exceeded from a router, quoting our UDP probe 10.0.0.1:40000 -> 10.0.0.9:33434.
    const TIME_EXCEEDED_V4: [u8; 36] = [
        11, 0, 0xf4, 0xff, 0, 0, 0, 0, // type 11, code 0, checksum, unused
        0x45, 0, 0, 32, 0, 1, 0, 0, 1, 17, 0, 0, // IPv4 header: ihl 5, ttl 1, proto 17
        10, 0, 0, 1, 10, 0, 0, 9, // src, dst
        0x9c, 0x40, 0x82, 0x9a, 0, 20, 0x12, 0x34, // UDP: ports, length, checksum (= id)
    ];

    /// ICMPv6 port unreachable from the target, quoting a UDP probe fd00::1 -> fd00::9.
    fn port_unreachable_v6() -> Vec<u8> {
        let mut b = vec![1, 4, 0, 0, 0, 0, 0, 0];
        let mut ip = [0u8; 40];
        ip[0] = 0x60;
        ip[6] = 17;
        ip[7] = 64;
        ip[8] = 0xfd;
        ip[23] = 1;
        ip[24] = 0xfd;
        ip[39] = 9;
        b.extend_from_slice(&ip);
        b.extend_from_slice(&[0x9c, 0x40, 0x82, 0x9a, 0, 20, 0xab, 0xcd]);
        b
    }

    #[test]
    fn parse_echo_reply_both_versions() {
        let v4 = [0, 0, 0, 0, 0x12, 0x34, 0, 7, b'x'];
        let v6 = [129, 0, 0, 0, 0x12, 0x34, 0, 7];
        for m in [parse::<V4>(&v4), parse::<V6>(&v6)] {
            assert_eq!(m, Some(Message::EchoReply { id: 0x1234, seq: 7 }));
        }
        // A v4 echo reply type means nothing in v6 (0 is reserved there).
        assert_eq!(parse::<V6>(&v4), None);
    }

    #[test]
    fn parse_errors_quote_the_probe() {
        let Some(Message::Error { kind, code, quoted }) = parse::<V4>(&TIME_EXCEEDED_V4) else {
            panic!("not an error")
        };
        assert_eq!((kind, code), (IcmpError::TimeExceeded, 0));
        assert_eq!(quoted.ip_proto, 17);
        assert_eq!(quoted.src, IpAddr::from([10, 0, 0, 1]));
        assert_eq!(quoted.dst, IpAddr::from([10, 0, 0, 9]));
        assert_eq!(quoted.head, [0x9c, 0x40, 0x82, 0x9a, 0, 20, 0x12, 0x34]);

        let b = port_unreachable_v6();
        let Some(Message::Error { kind, code, quoted }) = parse::<V6>(&b) else {
            panic!("not an error")
        };
        assert_eq!((kind, code), (IcmpError::PortUnreachable, 4));
        assert_eq!(quoted.ip_proto, 17);
        assert_eq!(quoted.dst, "fd00::9".parse::<IpAddr>().unwrap());
        assert_eq!(quoted.head[6..], [0xab, 0xcd]);

        // Other unreachable codes, and v4's port-unreachable code 3.
        let mut other = TIME_EXCEEDED_V4;
        other[0] = 3;
        other[1] = 1;
        assert!(matches!(
            parse::<V4>(&other),
            Some(Message::Error {
                kind: IcmpError::Unreachable,
                code: 1,
                ..
            })
        ));
        other[1] = 3;
        assert!(matches!(
            parse::<V4>(&other),
            Some(Message::Error {
                kind: IcmpError::PortUnreachable,
                ..
            })
        ));
        // Types that are neither echo reply nor these errors are not ours.
        other[0] = 8;
        assert_eq!(parse::<V4>(&other), None);
    }

    #[test]
    fn emit_with_etherparse_parses_back() {
        use etherparse::{IcmpEchoHeader, Icmpv4Header, Icmpv4Type};
        let echo = IcmpEchoHeader { id: 0xbeef, seq: 3 };
        let bytes =
            Icmpv4Header::with_checksum(Icmpv4Type::EchoReply(echo), b"lagtrace").to_bytes();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!((p.msg_type(), p.code()), (0, 0));
        assert_ne!(p.checksum(), 0);
        assert_eq!(
            parse::<V4>(&bytes),
            Some(Message::EchoReply { id: 0xbeef, seq: 3 })
        );
    }

    #[test]
    fn truncated_never_panics() {
        assert_eq!(Packet::new_checked(&[0u8; 7][..]).err(), Some(Truncated));
        for n in 0..TIME_EXCEEDED_V4.len() {
            // Cut before the quote's 8 transport bytes: no answer, never a panic.
            assert_eq!(parse::<V4>(&TIME_EXCEEDED_V4[..n]), None, "{n}");
        }
        let b = port_unreachable_v6();
        for n in 0..b.len() {
            assert_eq!(parse::<V6>(&b[..n]), None, "{n}");
        }
    }
}
