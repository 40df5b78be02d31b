//! Probe packets: building (TCP SYN, UDP, ICMP echo) and parsing what comes back.
//!
//! Headers are built and checksummed with `etherparse`. What is parsed by hand is only what
//! etherparse has no type for: the 8 transport bytes an ICMP error quotes (RFC 792 guarantees
//! only 8, so a full `TcpHeaderSlice` would refuse them).
//!
//! Probe identity (Paris traceroute style: the 5-tuple never changes within a trace):
//! - TCP: the sequence number is `seq_base + id`; replies acknowledge `seq_base + id + 1`,
//!   an ICMP error quotes the sequence number.
//! - UDP: the UDP checksum *is* the id; two payload bytes are chosen so that it comes out so.
//! - ICMP echo: the echo sequence is the id; two payload bytes keep the ICMP checksum constant
//!   (so per-packet load balancers hashing on it see one flow).

use std::net::{IpAddr, Ipv6Addr};

use etherparse::{
    IcmpEchoHeader, Icmpv4Header, Icmpv4Type, Icmpv6Header, Icmpv6Type, Ipv4HeaderSlice, TcpHeader,
    TcpHeaderSlice, TcpOptionElement, UdpHeader,
};
use lagtrace_wire::icmp;
use serde::{Deserialize, Serialize};

/// Transport protocol of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP SYN.
    Tcp,
    /// UDP datagram to a (normally closed) port.
    Udp,
    /// ICMP / ICMPv6 echo request.
    Icmp,
}

impl Proto {
    /// IP protocol number (ICMPv6 for IPv6 ICMP).
    pub fn ip_proto(self, v6: bool) -> u8 {
        match (self, v6) {
            (Proto::Tcp, _) => 6,
            (Proto::Udp, _) => 17,
            (Proto::Icmp, false) => 1,
            (Proto::Icmp, true) => 58,
        }
    }
}

/// TCP flag bits (one definition, in `lagtrace-wire`, shared with capture analysis).
pub use lagtrace_wire::tcp::flags as tcp_flags;

/// hping3-style flag letters (`SA`, `RA`, ...).
pub use lagtrace_wire::tcp::flag_letters as flags_str;

/// The constant identity of a probe flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Protocol.
    pub proto: Proto,
    /// Our source address (needed for pseudo-header checksums).
    pub src: IpAddr,
    /// Target.
    pub dst: IpAddr,
    /// Source port (TCP/UDP).
    pub sport: u16,
    /// Destination port (TCP/UDP).
    pub dport: u16,
    /// TCP: sequence number of probe id 0. ICMP: the echo identifier (low 16 bits).
    pub seq_base: u32,
}

/// The constant ICMP checksum all echo probes of a flow carry.
fn icmp_constant_checksum(flow: &Flow) -> u16 {
    let c = (flow.seq_base as u16) ^ 0x5a5a;
    if c == 0 || c == 0xffff { 0x1234 } else { c }
}

/// Ones' complement addition of two 16-bit words.
fn ones_add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xffff) + (s >> 16)) as u16
}

/// The payload word that turns a packet whose checksum (computed with that word = 0) is
/// `c0` into one whose checksum is `want`.
fn forcing_word(c0: u16, want: u16) -> u16 {
    ones_add(!want, c0)
}

fn v4(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => a.to_ipv4_mapped().map(|a| a.octets()).unwrap_or([0; 4]),
    }
}

fn v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

/// Payload length of UDP and ICMP probes (bytes after the 8-byte header).
pub const PROBE_PAYLOAD: usize = 12;

/// Builds the transport part of probe `id` (the kernel adds the IP header).
/// `id` must be in 1..=0x7fff (see [`id_from_wire`]).
pub fn build_probe(flow: &Flow, id: u16) -> Vec<u8> {
    let is6 = flow.dst.is_ipv6();
    match flow.proto {
        Proto::Tcp => {
            let mut h = TcpHeader::new(
                flow.sport,
                flow.dport,
                flow.seq_base.wrapping_add(u32::from(id)),
                64240,
            );
            h.syn = true;
            // MSS 1460 plus NOPs to a 4-byte boundary: a plain, common SYN.
            h.set_options(&[TcpOptionElement::MaximumSegmentSize(1460)])
                .expect("MSS option fits");
            h.checksum = if is6 {
                h.calc_checksum_ipv6_raw(v6(flow.src), v6(flow.dst), &[])
            } else {
                h.calc_checksum_ipv4_raw(v4(flow.src), v4(flow.dst), &[])
            }
            .expect("empty payload");
            h.to_bytes().to_vec()
        }
        Proto::Udp => {
            let mut payload = [0u8; PROBE_PAYLOAD];
            payload[2..].copy_from_slice(b"lagtrace\0\0");
            let csum = |p: &[u8]| -> u16 {
                if is6 {
                    UdpHeader {
                        source_port: flow.sport,
                        destination_port: flow.dport,
                        length: (8 + p.len()) as u16,
                        checksum: 0,
                    }
                    .calc_checksum_ipv6_raw(v6(flow.src), v6(flow.dst), p)
                    .expect("small")
                } else {
                    UdpHeader {
                        source_port: flow.sport,
                        destination_port: flow.dport,
                        length: (8 + p.len()) as u16,
                        checksum: 0,
                    }
                    .calc_checksum_ipv4_raw(v4(flow.src), v4(flow.dst), p)
                    .expect("small")
                }
            };
            let c0 = csum(&payload);
            // etherparse maps a computed 0 to 0xffff (RFC 768); ids are never 0 or 0xffff.
            let w = forcing_word(if c0 == 0xffff { 0 } else { c0 }, id);
            payload[..2].copy_from_slice(&w.to_be_bytes());
            let h = UdpHeader {
                source_port: flow.sport,
                destination_port: flow.dport,
                length: (8 + PROBE_PAYLOAD) as u16,
                checksum: csum(&payload),
            };
            let mut out = h.to_bytes().to_vec();
            out.extend_from_slice(&payload);
            out
        }
        Proto::Icmp => {
            let echo = IcmpEchoHeader {
                id: flow.seq_base as u16,
                seq: id,
            };
            let mut payload = [0u8; PROBE_PAYLOAD];
            payload[2..].copy_from_slice(b"lagtrace\0\0");
            let want = icmp_constant_checksum(flow);
            let csum = |p: &[u8]| -> u16 {
                if is6 {
                    Icmpv6Header::with_checksum(
                        Icmpv6Type::EchoRequest(echo),
                        v6(flow.src),
                        v6(flow.dst),
                        p,
                    )
                    .expect("small")
                    .checksum
                } else {
                    Icmpv4Header::with_checksum(Icmpv4Type::EchoRequest(echo), p).checksum
                }
            };
            let c0 = csum(&payload);
            let w = forcing_word(c0, want);
            payload[..2].copy_from_slice(&w.to_be_bytes());
            let mut out = if is6 {
                Icmpv6Header::with_checksum(
                    Icmpv6Type::EchoRequest(echo),
                    v6(flow.src),
                    v6(flow.dst),
                    &payload,
                )
                .expect("small")
                .to_bytes()
                .to_vec()
            } else {
                Icmpv4Header::with_checksum(Icmpv4Type::EchoRequest(echo), &payload)
                    .to_bytes()
                    .to_vec()
            };
            out.extend_from_slice(&payload);
            out
        }
    }
}

pub use lagtrace_wire::icmp::{IcmpError, Quoted};

/// The parsed body of a received packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A TCP segment (to us, from the target).
    Tcp {
        /// Source port (the target's).
        sport: u16,
        /// Destination port (ours).
        dport: u16,
        /// Sequence number.
        seq: u32,
        /// Acknowledgment number.
        ack: u32,
        /// Flags byte.
        flags: u8,
        /// Window.
        window: u16,
    },
    /// An ICMP echo reply.
    EchoReply {
        /// Identifier.
        id: u16,
        /// Sequence.
        seq: u16,
    },
    /// An ICMP error quoting a packet.
    Error {
        /// Kind.
        kind: IcmpError,
        /// ICMP code.
        code: u8,
        /// What it quotes.
        quoted: Quoted,
    },
}

/// A received packet that may answer a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Who sent it.
    pub from: IpAddr,
    /// To whom (our address).
    pub to: IpAddr,
    /// TTL / hop limit it arrived with (0 if unknown).
    pub ttl: u8,
    /// IPv4 identification (0 for IPv6).
    pub ip_id: u16,
    /// IPv4 don't-fragment bit.
    pub df: bool,
    /// Length of the IP packet.
    pub len: usize,
    /// What it says.
    pub body: Body,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Parses a full IPv4 packet as read from a raw IPv4 socket.
pub fn parse_ipv4(pkt: &[u8]) -> Option<Reply> {
    let ip = Ipv4HeaderSlice::from_slice(pkt).ok()?;
    let hl = ip.slice().len();
    let payload = pkt.get(hl..)?;
    let body = match ip.protocol().0 {
        6 => parse_tcp(payload)?,
        1 => icmp_body::<icmp::V4>(payload)?,
        _ => return None,
    };
    Some(Reply {
        from: IpAddr::V4(ip.source_addr()),
        to: IpAddr::V4(ip.destination_addr()),
        ttl: ip.ttl(),
        ip_id: ip.identification(),
        df: ip.dont_fragment(),
        len: usize::from(ip.total_len()),
        body,
    })
}

/// An ICMP echo reply or error, parsed once for both versions in `lagtrace-wire`.
fn icmp_body<V: icmp::Version>(payload: &[u8]) -> Option<Body> {
    Some(match icmp::parse::<V>(payload)? {
        icmp::Message::EchoReply { id, seq } => Body::EchoReply { id, seq },
        icmp::Message::Error { kind, code, quoted } => Body::Error { kind, code, quoted },
    })
}

fn parse_tcp(seg: &[u8]) -> Option<Body> {
    let t = TcpHeaderSlice::from_slice(seg).ok()?;
    Some(Body::Tcp {
        sport: t.source_port(),
        dport: t.destination_port(),
        seq: t.sequence_number(),
        ack: t.acknowledgment_number(),
        flags: seg[13],
        window: t.window_size(),
    })
}

/// Parses the payload of an IPv6 raw socket (the kernel strips the IPv6 header):
/// `next_header` is the socket's protocol, `from`/`to`/`hop_limit` come from recvmsg.
pub fn parse_ipv6(
    payload: &[u8],
    next_header: u8,
    from: Ipv6Addr,
    to: Ipv6Addr,
    hop_limit: u8,
) -> Option<Reply> {
    let body = match next_header {
        6 => parse_tcp(payload)?,
        58 => icmp_body::<icmp::V6>(payload)?,
        _ => return None,
    };
    Some(Reply {
        from: IpAddr::V6(from),
        to: IpAddr::V6(to),
        ttl: hop_limit,
        ip_id: 0,
        df: false,
        len: payload.len() + 40,
        body,
    })
}

/// What a reply says about one of our probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The target answered a TCP probe with these flags.
    Tcp {
        /// TCP flags.
        flags: u8,
        /// Window.
        window: u16,
    },
    /// The target answered an echo.
    Echo,
    /// An ICMP error about the probe (from a router or the target).
    Error(IcmpError, u8),
}

/// If `reply` answers a probe of `flow`, returns the probe id and what the answer is.
pub fn match_reply(flow: &Flow, reply: &Reply) -> Option<(u16, Answer)> {
    match &reply.body {
        Body::Tcp {
            sport,
            dport,
            ack,
            flags,
            window,
            ..
        } => {
            if flow.proto != Proto::Tcp
                || reply.from != flow.dst
                || *sport != flow.dport
                || *dport != flow.sport
            {
                return None;
            }
            if flags & (tcp_flags::SYN | tcp_flags::RST) == 0 || flags & tcp_flags::ACK == 0 {
                return None;
            }
            let id = ack.wrapping_sub(1).wrapping_sub(flow.seq_base);
            valid_id(id).map(|id| {
                (
                    id,
                    Answer::Tcp {
                        flags: *flags,
                        window: *window,
                    },
                )
            })
        }
        Body::EchoReply { id, seq } => {
            if flow.proto != Proto::Icmp || reply.from != flow.dst || *id != flow.seq_base as u16 {
                return None;
            }
            valid_id(u32::from(*seq)).map(|s| (s, Answer::Echo))
        }
        Body::Error { kind, code, quoted } => {
            if quoted.dst != flow.dst || quoted.ip_proto != flow.proto.ip_proto(flow.dst.is_ipv6())
            {
                return None;
            }
            let h = &quoted.head;
            let id = match flow.proto {
                Proto::Tcp | Proto::Udp => {
                    if be16(h, 0) != flow.sport || be16(h, 2) != flow.dport {
                        return None;
                    }
                    if flow.proto == Proto::Tcp {
                        u32::from_be_bytes([h[4], h[5], h[6], h[7]]).wrapping_sub(flow.seq_base)
                    } else {
                        u32::from(be16(h, 6))
                    }
                }
                Proto::Icmp => {
                    if be16(h, 4) != flow.seq_base as u16 {
                        return None;
                    }
                    u32::from(be16(h, 6))
                }
            };
            valid_id(id).map(|id| (id, Answer::Error(*kind, *code)))
        }
    }
}

/// Largest probe id (ids are 1..=MAX_ID so that a UDP checksum never has to be 0 or 0xffff).
pub const MAX_ID: u16 = 0x7fff;

fn valid_id(id: u32) -> Option<u16> {
    (1..=u32::from(MAX_ID)).contains(&id).then_some(id as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(proto: Proto) -> Flow {
        Flow {
            proto,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 40000,
            dport: 80,
            seq_base: 0x1000_0000,
        }
    }

    /// RFC 1071 checksum over `data`, independent of etherparse.
    fn rfc1071(parts: &[&[u8]]) -> u16 {
        let mut sum = 0u32;
        let all: Vec<u8> = parts.concat();
        for ch in all.chunks(2) {
            let w = if ch.len() == 2 {
                u16::from_be_bytes([ch[0], ch[1]])
            } else {
                u16::from(ch[0]) << 8
            };
            sum += u32::from(w);
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn tcp_syn_bytes_match_fixture() {
        let b = build_probe(&flow(Proto::Tcp), 5);
        // 40000 -> 80, seq 0x10000005, ack 0, doff 6 (24 bytes), SYN, win 64240, MSS 1460.
        let want_prefix: [u8; 16] = [
            0x9c, 0x40, 0x00, 0x50, 0x10, 0x00, 0x00, 0x05, 0, 0, 0, 0, 0x60, 0x02, 0xfa, 0xf0,
        ];
        assert_eq!(&b[..16], &want_prefix);
        assert_eq!(&b[18..], &[0, 0, 0x02, 0x04, 0x05, 0xb4]);
        // Pseudo header + segment sums to zero.
        let pseudo = [10, 0, 0, 1, 10, 0, 0, 2, 0, 6, 0, 24];
        assert_eq!(rfc1071(&[&pseudo, &b]), 0);
    }

    #[test]
    fn udp_checksum_is_the_probe_id() {
        let f = flow(Proto::Udp);
        for id in [1u16, 2, 3, 255, 0x1234, MAX_ID] {
            let b = build_probe(&f, id);
            assert_eq!(b.len(), 8 + PROBE_PAYLOAD);
            assert_eq!(be16(&b, 6), id, "id {id}");
            let pseudo = [10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 20];
            assert_eq!(rfc1071(&[&pseudo, &b]), 0, "id {id} checksum verifies");
        }
    }

    #[test]
    fn udp_checksum_forcing_works_for_ipv6() {
        let mut f = flow(Proto::Udp);
        f.src = "fd00::1".parse().unwrap();
        f.dst = "fd00::2".parse().unwrap();
        let b = build_probe(&f, 77);
        assert_eq!(be16(&b, 6), 77);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&v6(f.src));
        pseudo.extend_from_slice(&v6(f.dst));
        pseudo.extend_from_slice(&[0, 0, 0, 20, 0, 0, 0, 17]);
        assert_eq!(rfc1071(&[&pseudo, &b]), 0);
    }

    #[test]
    fn icmp_checksum_is_constant_across_ids() {
        let f = flow(Proto::Icmp);
        let a = build_probe(&f, 1);
        let b = build_probe(&f, 999);
        assert_eq!(a[0], 8, "echo request");
        assert_eq!(be16(&a, 2), be16(&b, 2), "checksum constant");
        assert_eq!(be16(&b, 6), 999);
        assert_eq!(rfc1071(&[&a]), 0);
        assert_eq!(rfc1071(&[&b]), 0);
    }

    /// An IPv4 SYN-ACK from 10.0.0.2:80 to 10.0.0.1:40000 acking seq_base+5+1, as captured.
    const SYN_ACK: [u8; 44] = [
        0x45, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06, 0x26, 0xca, 10, 0, 0, 2, 10, 0,
        0, 1, // IP
        0x00, 0x50, 0x9c, 0x40, 0xaa, 0xbb, 0xcc, 0xdd, 0x10, 0x00, 0x00, 0x06, 0x60, 0x12, 0xfa,
        0xf0, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4,
    ];

    #[test]
    fn parse_and_match_syn_ack() {
        let r = parse_ipv4(&SYN_ACK).unwrap();
        assert_eq!(r.from, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(r.ttl, 64);
        assert!(r.df);
        assert_eq!(r.len, 44);
        let (id, ans) = match_reply(&flow(Proto::Tcp), &r).unwrap();
        assert_eq!(id, 5);
        assert_eq!(
            ans,
            Answer::Tcp {
                flags: 0x12,
                window: 64240
            }
        );
        assert_eq!(flags_str(0x12), "SA");
        assert_eq!(flags_str(0x14), "RA");
        // Another flow (other port) does not match.
        let mut other = flow(Proto::Tcp);
        other.sport = 40001;
        assert!(match_reply(&other, &r).is_none());
    }

    #[test]
    fn truncated_packets_are_ignored() {
        for n in 0..SYN_ACK.len() - 4 {
            // Anything shorter than IP + 20 bytes of TCP is not a reply.
            if n < 40 {
                assert!(parse_ipv4(&SYN_ACK[..n]).is_none(), "len {n}");
            }
        }
    }

    /// A time exceeded from 10.0.1.1 quoting our UDP probe id 0x0102 (only 8 bytes quoted).
    #[test]
    fn parse_time_exceeded_quoting_udp() {
        let pkt: Vec<u8> = [
            &[
                0x45, 0xc0, 0x00, 0x38, 0x12, 0x34, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 10, 0, 1,
                1, 10, 0, 0, 1,
            ][..],
            &[11, 0, 0, 0, 0, 0, 0, 0],
            &[
                0x45, 0x00, 0x00, 0x20, 0x00, 0x01, 0x40, 0x00, 0x01, 0x11, 0x00, 0x00, 10, 0, 0,
                1, 10, 0, 0, 2,
            ],
            &[0x9c, 0x40, 0x00, 0x50, 0x00, 0x14, 0x01, 0x02],
        ]
        .concat();
        let r = parse_ipv4(&pkt).unwrap();
        assert_eq!(r.ttl, 64);
        assert_eq!(r.ip_id, 0x1234);
        let (id, ans) = match_reply(&flow(Proto::Udp), &r).unwrap();
        assert_eq!(id, 0x0102);
        assert_eq!(ans, Answer::Error(IcmpError::TimeExceeded, 0));
        // Too short a quote is not a reply.
        assert!(parse_ipv4(&pkt[..pkt.len() - 1]).is_none());
    }

    #[test]
    fn parse_icmpv6_port_unreachable() {
        let src: Ipv6Addr = "fd00::1".parse().unwrap();
        let dst: Ipv6Addr = "fd00::2".parse().unwrap();
        let mut p = vec![1, 4, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, 17, 1]);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&[0x9c, 0x40, 0x00, 0x50, 0x00, 0x14, 0x00, 0x09]);
        let r = parse_ipv6(&p, 58, dst, src, 63).unwrap();
        let mut f = flow(Proto::Udp);
        f.src = src.into();
        f.dst = dst.into();
        assert_eq!(
            match_reply(&f, &r),
            Some((9, Answer::Error(IcmpError::PortUnreachable, 4)))
        );
    }

    /// Hostile input: random bytes, every truncation and byte-flip of real replies, fed to
    /// both parsers and to the matcher, must never panic (raw sockets receive anything).
    #[test]
    fn parsers_never_panic_on_arbitrary_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let te: Vec<u8> = [
            &[
                0x45, 0xc0, 0x00, 0x38, 0x12, 0x34, 0x00, 0x00, 0x40, 0x01, 0x00, 0x00, 10, 0, 1,
                1, 10, 0, 0, 1,
            ][..],
            &[11, 0, 0, 0, 0, 0, 0, 0],
            &[
                0x45, 0x00, 0x00, 0x20, 0x00, 0x01, 0x40, 0x00, 0x01, 0x11, 0x00, 0x00, 10, 0, 0,
                1, 10, 0, 0, 2,
            ],
            &[0x9c, 0x40, 0x00, 0x50, 0x00, 0x14, 0x01, 0x02],
        ]
        .concat();
        let mut v6 = vec![1, 4, 0, 0, 0, 0, 0, 0, 0x60, 0, 0, 0, 0, 20, 17, 1];
        v6.extend_from_slice(&[0xfd; 32]);
        v6.extend_from_slice(&[0x9c, 0x40, 0x00, 0x50, 0x00, 0x14, 0x00, 0x09]);
        let flows = [flow(Proto::Tcp), flow(Proto::Udp), flow(Proto::Icmp)];
        let a6: Ipv6Addr = "fd00::1".parse().unwrap();
        let mut parsed = 0u32;
        let mut feed = |b: &[u8]| {
            let mut replies = Vec::new();
            replies.extend(parse_ipv4(b));
            for nh in [6, 58, 17, 0] {
                replies.extend(parse_ipv6(b, nh, a6, a6, 1));
            }
            for r in &replies {
                parsed += 1;
                for f in &flows {
                    let _ = match_reply(f, r);
                }
            }
        };
        let seeds: Vec<Vec<u8>> = vec![SYN_ACK.to_vec(), te.clone(), v6.clone()];
        for seed in &seeds {
            for n in 0..=seed.len() {
                feed(&seed[..n]);
            }
            for _ in 0..20_000 {
                let mut b = seed.clone();
                for _ in 0..1 + rnd() % 4 {
                    let i = (rnd() as usize) % b.len();
                    b[i] = rnd() as u8;
                }
                let cut = (rnd() as usize) % (b.len() + 1);
                feed(&b[..cut]);
                feed(&b);
            }
        }
        for _ in 0..50_000 {
            let n = (rnd() % 120) as usize;
            let mut b: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
            if n > 0 && rnd() % 2 == 0 {
                b[0] = 0x45; // look like IPv4 so the deeper paths run
            }
            feed(&b);
        }
        assert!(
            parsed > 1000,
            "mutations of real replies still parse: {parsed}"
        );
    }
}
