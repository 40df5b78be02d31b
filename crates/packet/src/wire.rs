//! Borrow-only decoding of link, IP and TCP headers from one captured frame.
//!
//! Shape after smoltcp's `wire` module: every accessor checks its length once, nothing is
//! copied, checksums are never verified (captures taken on the sending host carry offloaded,
//! unfilled checksums). A frame cut by the snaplen keeps its headers: the TCP payload length
//! comes from the IP header, the captured payload is whatever bytes are present.

use std::net::IpAddr;

/// Link types this decoder understands (pcap `LINKTYPE_*` values).
pub mod linktype {
    /// BSD loopback: 4-byte address family in host byte order.
    pub const NULL: u32 = 0;
    /// Ethernet II.
    pub const ETHERNET: u32 = 1;
    /// Raw IP (some platforms use 12 or 14 for it).
    pub const RAW: u32 = 101;
    /// Raw IP (OpenBSD's DLT_RAW value as written in some files).
    pub const RAW_12: u32 = 12;
    /// Raw IP (another historical value).
    pub const RAW_14: u32 = 14;
    /// OpenBSD loopback: 4-byte address family in network byte order.
    pub const LOOP: u32 = 108;
    /// Linux cooked capture v1.
    pub const LINUX_SLL: u32 = 113;
    /// Raw IPv4.
    pub const IPV4: u32 = 228;
    /// Raw IPv6.
    pub const IPV6: u32 = 229;
    /// Linux cooked capture v2.
    pub const LINUX_SLL2: u32 = 276;
}

/// TCP flag bits (one definition, in `lagtrace-wire`, shared with the probes).
pub use lagtrace_wire::tcp::flags;

/// Why a frame was not decoded as TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A link type this decoder does not know.
    UnknownLinkType(u32),
    /// Not IPv4/IPv6 (ARP, LLDP, ...).
    NotIp,
    /// IP but not TCP (UDP, ICMP, ...), or a non-first fragment.
    NotTcp,
    /// Headers cut short or inconsistent.
    Malformed(&'static str),
}

/// SYN options of interest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpOptions {
    /// Maximum segment size option.
    pub mss: Option<u16>,
    /// Window scale shift.
    pub wscale: Option<u8>,
    /// SACK permitted.
    pub sack_permitted: bool,
    /// Timestamps option present.
    pub timestamps: bool,
    /// The first SACK block `(left, right)`, raw sequence numbers: below the ACK it
    /// reports data received twice (a D-SACK, RFC 2883).
    pub first_sack: Option<(u32, u32)>,
}

/// One decoded TCP segment, borrowing the frame.
#[derive(Debug, Clone, Copy)]
pub struct TcpSegment<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Raw sequence number.
    pub seq: u32,
    /// Raw acknowledgement number.
    pub ack: u32,
    /// Flag bits ([`flags`]).
    pub flags: u8,
    /// Raw (unscaled) window.
    pub window: u16,
    /// TCP payload length from the IP header (not limited by the snaplen).
    pub payload_len: u32,
    /// Captured payload bytes (may be shorter than `payload_len`).
    pub payload: &'a [u8],
    /// Options (parsed on every segment; only meaningful on SYNs for MSS/wscale).
    pub options: TcpOptions,
    /// The raw option bytes as captured (timestamps, SACK blocks...).
    pub option_bytes: &'a [u8],
    /// IPv4 identification (0 for IPv6, which has none in its fixed header).
    pub ip_id: u16,
    /// Captured on a loopback device (all-zero Ethernet addresses, an SLL header's
    /// ARPHRD_LOOPBACK, a BSD loopback header) or between loopback addresses: its MTU is
    /// 64 KiB, not Ethernet's 1500, which is what a stream without a captured SYN has for MSS.
    pub loopback: bool,
}

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes a frame of the given link type down to TCP.
pub fn decode(linktype: u32, frame: &[u8]) -> Result<TcpSegment<'_>, Skip> {
    /// `ARPHRD_LOOPBACK`, as SLL headers give the device type.
    const ARPHRD_LOOPBACK: u16 = 772;
    let loopback = match linktype {
        linktype::ETHERNET => frame.get(..12).is_some_and(|m| m.iter().all(|&b| b == 0)),
        linktype::LINUX_SLL => frame.len() >= 4 && be16(frame, 2) == ARPHRD_LOOPBACK,
        linktype::LINUX_SLL2 => frame.len() >= 10 && be16(frame, 8) == ARPHRD_LOOPBACK,
        linktype::NULL | linktype::LOOP => true,
        _ => false,
    };
    let (ethertype, rest) = match linktype {
        linktype::ETHERNET => {
            if frame.len() < 14 {
                return Err(Skip::Malformed("ethernet header cut"));
            }
            let mut et = be16(frame, 12);
            let mut off = 14;
            // 802.1Q, 802.1ad, old QinQ: 4-byte tags, possibly stacked.
            while matches!(et, 0x8100 | 0x88a8 | 0x9100) {
                if frame.len() < off + 4 {
                    return Err(Skip::Malformed("vlan tag cut"));
                }
                et = be16(frame, off + 2);
                off += 4;
            }
            (et, &frame[off..])
        }
        linktype::LINUX_SLL => {
            if frame.len() < 16 {
                return Err(Skip::Malformed("sll header cut"));
            }
            (be16(frame, 14), &frame[16..])
        }
        linktype::LINUX_SLL2 => {
            if frame.len() < 20 {
                return Err(Skip::Malformed("sll2 header cut"));
            }
            (be16(frame, 0), &frame[20..])
        }
        linktype::RAW | linktype::RAW_12 | linktype::RAW_14 | linktype::IPV4 | linktype::IPV6 => {
            match frame.first().map(|b| b >> 4) {
                Some(4) => (0x0800, frame),
                Some(6) => (0x86dd, frame),
                _ => return Err(Skip::NotIp),
            }
        }
        linktype::NULL | linktype::LOOP => {
            if frame.len() < 4 {
                return Err(Skip::Malformed("loopback header cut"));
            }
            // The family is in host byte order (NULL) or network order (LOOP); files move
            // between hosts, so accept either.
            let le = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]);
            let be = be32(frame, 0);
            let fam = if le < 256 { le } else { be };
            let et = match fam {
                2 => 0x0800,
                10 | 24 | 28 | 30 => 0x86dd,
                _ => return Err(Skip::NotIp),
            };
            (et, &frame[4..])
        }
        other => return Err(Skip::UnknownLinkType(other)),
    };
    let mut seg = match ethertype {
        0x0800 => ipv4(rest),
        0x86dd => ipv6(rest),
        _ => Err(Skip::NotIp),
    }?;
    seg.loopback = loopback || (seg.src.is_loopback() && seg.dst.is_loopback());
    Ok(seg)
}

fn ipv4(p: &[u8]) -> Result<TcpSegment<'_>, Skip> {
    if p.len() < 20 {
        return Err(Skip::Malformed("ipv4 header cut"));
    }
    if p[0] >> 4 != 4 {
        return Err(Skip::Malformed("ipv4 version"));
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    if ihl < 20 || p.len() < ihl {
        return Err(Skip::Malformed("ipv4 header length"));
    }
    if p[9] != 6 {
        return Err(Skip::NotTcp);
    }
    let frag_off = be16(p, 6) & 0x1fff;
    if frag_off != 0 {
        return Err(Skip::NotTcp);
    }
    let total = usize::from(be16(p, 2));
    // TSO on the capturing host can leave total length 0: fall back to what is captured.
    let ip_payload = if total == 0 {
        p.len() - ihl
    } else if total < ihl {
        return Err(Skip::Malformed("ipv4 total length"));
    } else {
        total - ihl
    };
    let src = IpAddr::from([p[12], p[13], p[14], p[15]]);
    let dst = IpAddr::from([p[16], p[17], p[18], p[19]]);
    let mut seg = tcp(src, dst, &p[ihl..], ip_payload)?;
    seg.ip_id = be16(p, 4);
    Ok(seg)
}

fn ipv6(p: &[u8]) -> Result<TcpSegment<'_>, Skip> {
    if p.len() < 40 {
        return Err(Skip::Malformed("ipv6 header cut"));
    }
    if p[0] >> 4 != 6 {
        return Err(Skip::Malformed("ipv6 version"));
    }
    let mut payload_len = usize::from(be16(p, 4));
    if payload_len == 0 {
        payload_len = p.len() - 40; // jumbogram or TSO: use what is captured
    }
    let mut next = p[6];
    let src: [u8; 16] = p[8..24].try_into().unwrap_or([0; 16]);
    let dst: [u8; 16] = p[24..40].try_into().unwrap_or([0; 16]);
    let mut off = 40;
    // Walk extension headers.
    loop {
        match next {
            6 => break,
            0 | 43 | 60 => {
                if p.len() < off + 2 {
                    return Err(Skip::Malformed("ipv6 extension cut"));
                }
                let len = (usize::from(p[off + 1]) + 1) * 8;
                next = p[off];
                off += len;
                payload_len = payload_len.saturating_sub(len);
            }
            44 => {
                if p.len() < off + 8 {
                    return Err(Skip::Malformed("ipv6 fragment header cut"));
                }
                if be16(p, off + 2) & 0xfff8 != 0 {
                    return Err(Skip::NotTcp);
                }
                next = p[off];
                off += 8;
                payload_len = payload_len.saturating_sub(8);
            }
            _ => return Err(Skip::NotTcp),
        }
        if off > p.len() {
            return Err(Skip::Malformed("ipv6 extension length"));
        }
    }
    tcp(IpAddr::from(src), IpAddr::from(dst), &p[off..], payload_len)
}

fn tcp(src: IpAddr, dst: IpAddr, t: &[u8], ip_payload: usize) -> Result<TcpSegment<'_>, Skip> {
    if t.len() < 20 {
        return Err(Skip::Malformed("tcp header cut"));
    }
    let doff = usize::from(t[12] >> 4) * 4;
    if doff < 20 {
        return Err(Skip::Malformed("tcp data offset"));
    }
    let payload_len = ip_payload.saturating_sub(doff);
    let opts_end = doff.min(t.len());
    let options = parse_options(&t[20..opts_end]);
    let payload = if t.len() > doff {
        let end = t.len().min(doff + payload_len);
        &t[doff..end]
    } else {
        &[][..]
    };
    Ok(TcpSegment {
        src,
        dst,
        sport: be16(t, 0),
        dport: be16(t, 2),
        seq: be32(t, 4),
        ack: be32(t, 8),
        flags: t[13],
        window: be16(t, 14),
        payload_len: u32::try_from(payload_len).unwrap_or(u32::MAX),
        payload,
        options,
        option_bytes: &t[20..opts_end],
        ip_id: 0,
        loopback: false,
    })
}

/// Parses TCP options; stops quietly at anything malformed.
pub fn parse_options(mut o: &[u8]) -> TcpOptions {
    let mut out = TcpOptions::default();
    while let Some(&kind) = o.first() {
        match kind {
            0 => break,
            1 => o = &o[1..],
            _ => {
                let Some(&len) = o.get(1) else { break };
                let len = usize::from(len);
                if len < 2 || o.len() < len {
                    break;
                }
                match (kind, len) {
                    (2, 4) => out.mss = Some(be16(o, 2)),
                    (3, 3) => out.wscale = Some(o[2].min(14)),
                    (4, 2) => out.sack_permitted = true,
                    (8, 10) => out.timestamps = true,
                    (5, l) if l >= 10 && out.first_sack.is_none() => {
                        out.first_sack = Some((be32(o, 2), be32(o, 6)));
                    }
                    _ => {}
                }
                o = &o[len..];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv4 + TCP SYN with MSS 65495, SACK-permitted, timestamps, wscale 7
    /// (frame 1 of the reference capture, addresses 10.200.0.1:40788 -> 10.200.0.2:8080).
    const SYN: [u8; 74] = [
        0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00, // ethernet
        0x45, 0, 0, 60, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 200, 0, 1, 10, 200, 0,
        2, // ipv4
        0x9f, 0x54, 0x1f, 0x90, 0, 0, 0, 100, 0, 0, 0, 0, 0xa0, 0x02, 0xff, 0xd7, 0, 0, 0, 0, 2, 4,
        0xff, 0xd7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ];

    #[test]
    fn parses_syn_with_options() {
        let s = decode(linktype::ETHERNET, &SYN).unwrap();
        assert_eq!(s.src, IpAddr::from([10, 200, 0, 1]));
        assert_eq!((s.sport, s.dport), (40788, 8080));
        assert_eq!(s.seq, 100);
        assert_eq!(s.flags, flags::SYN);
        assert_eq!(s.payload_len, 0);
        assert_eq!(s.options.mss, Some(65495));
        assert_eq!(s.options.wscale, Some(7));
        assert!(s.options.sack_permitted && s.options.timestamps);
    }

    #[test]
    fn truncated_frames_are_errors_not_panics() {
        for n in 0..SYN.len() {
            let r = decode(linktype::ETHERNET, &SYN[..n]);
            if n < 14 + 20 + 20 {
                assert!(r.is_err(), "cut at {n} decoded");
            }
        }
    }

    #[test]
    fn snaplen_cut_payload_keeps_ip_length() {
        // A 100-byte payload claimed by the IP header, only 10 captured.
        let mut f = SYN[..14 + 20 + 20].to_vec();
        f[14 + 2..14 + 4].copy_from_slice(&(20u16 + 20 + 100).to_be_bytes());
        f[14 + 20 + 12] = 0x50;
        f[14 + 20 + 13] = flags::ACK | flags::PSH;
        f.extend_from_slice(b"GET / HTTP");
        let s = decode(linktype::ETHERNET, &f).unwrap();
        assert_eq!(s.payload_len, 100);
        assert_eq!(s.payload, b"GET / HTTP");
    }

    #[test]
    fn vlan_sll_sll2_raw_loopback() {
        let ip = &SYN[14..];
        let mut vlan = SYN[..12].to_vec();
        vlan.extend_from_slice(&[0x81, 0, 0, 5, 0x08, 0]);
        vlan.extend_from_slice(ip);
        assert_eq!(decode(linktype::ETHERNET, &vlan).unwrap().dport, 8080);
        let mut sll = vec![0u8; 14];
        sll.extend_from_slice(&[0x08, 0]);
        sll.extend_from_slice(ip);
        assert_eq!(decode(linktype::LINUX_SLL, &sll).unwrap().dport, 8080);
        let mut sll2 = vec![0x08, 0];
        sll2.extend_from_slice(&[0u8; 18]);
        sll2.extend_from_slice(ip);
        assert_eq!(decode(linktype::LINUX_SLL2, &sll2).unwrap().dport, 8080);
        assert_eq!(decode(linktype::RAW, ip).unwrap().dport, 8080);
        let mut null = 2u32.to_le_bytes().to_vec();
        null.extend_from_slice(ip);
        assert_eq!(decode(linktype::NULL, &null).unwrap().dport, 8080);
        let mut lo = 2u32.to_be_bytes().to_vec();
        lo.extend_from_slice(ip);
        assert_eq!(decode(linktype::LOOP, &lo).unwrap().dport, 8080);
        assert_eq!(decode(147, ip).unwrap_err(), Skip::UnknownLinkType(147));
    }

    #[test]
    fn ipv6_tcp() {
        let mut f = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        f.extend_from_slice(&[0u8; 15]);
        f.push(1); // ::1
        f.extend_from_slice(&[0u8; 15]);
        f.push(1);
        f.extend_from_slice(&SYN[34..54]);
        f[40 + 12] = 0x50;
        let s = decode(linktype::RAW, &f).unwrap();
        assert_eq!(s.src, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(s.dport, 8080);
    }

    #[test]
    fn udp_is_skipped() {
        let mut f = SYN.to_vec();
        f[14 + 9] = 17;
        assert_eq!(decode(linktype::ETHERNET, &f).unwrap_err(), Skip::NotTcp);
    }
}
