//! TCP socket enumeration through sock_diag netlink (`NETLINK_SOCK_DIAG`,
//! `SOCK_DIAG_BY_FAMILY` with an `inet_diag_req_v2`), built by hand: the request is 56
//! bytes and the answer a fixed `inet_diag_msg` plus attributes. `struct tcp_info` is parsed
//! with a length check per field, because its size grows with every kernel.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::netlink::{self, NLMSG_HDRLEN};

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

const INET_DIAG_INFO: u16 = 2;
const INET_DIAG_CONG: u16 = 4;
const INET_DIAG_SKMEMINFO: u16 = 7;

const INET_DIAG_MSG_LEN: usize = 72;

/// TCP states as numbered by the kernel (`include/net/tcp_states.h`).
pub const TCP_STATES: [&str; 13] = [
    "UNKNOWN",
    "ESTABLISHED",
    "SYN-SENT",
    "SYN-RECV",
    "FIN-WAIT-1",
    "FIN-WAIT-2",
    "TIME-WAIT",
    "CLOSE",
    "CLOSE-WAIT",
    "LAST-ACK",
    "LISTEN",
    "CLOSING",
    "NEW-SYN-RECV",
];

/// The kernel's state number for a state name (case-insensitive, `_` or `-`).
pub fn state_number(name: &str) -> Option<u8> {
    let n = name.to_ascii_uppercase().replace('_', "-");
    let n = match n.as_str() {
        "ESTAB" => "ESTABLISHED",
        "LISTENING" => "LISTEN",
        other => other,
    };
    TCP_STATES.iter().position(|s| *s == n).map(|i| i as u8)
}

/// One TCP socket as sock_diag reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiagSocket {
    /// Kernel state number (see [`TCP_STATES`]).
    pub state: u8,
    /// Local address and port.
    pub local: SocketAddr,
    /// Remote address and port (unspecified for listeners).
    pub remote: SocketAddr,
    /// Socket inode (0 for time-wait and request sockets, which belong to no file).
    pub inode: u64,
    /// Owner uid of the socket.
    pub uid: u32,
    /// Bytes queued for reading (listen: accept-queue length).
    pub recv_q: u32,
    /// Bytes queued for sending (listen: accept-queue limit).
    pub send_q: u32,
    /// Parsed `INET_DIAG_INFO` (`struct tcp_info`).
    pub tcp_info: Option<TcpInfo>,
    /// Congestion control algorithm name (`INET_DIAG_CONG`).
    pub congestion: Option<String>,
    /// Socket memory (`INET_DIAG_SKMEMINFO`).
    pub skmem: Option<SkMemInfo>,
}

/// `INET_DIAG_SKMEMINFO`: the socket's memory accounting, bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SkMemInfo {
    /// Receive memory in use.
    pub rmem_alloc: u32,
    /// Receive buffer size (sk_rcvbuf).
    pub rcvbuf: u32,
    /// Transmit memory in use.
    pub wmem_alloc: u32,
    /// Send buffer size (sk_sndbuf).
    pub sndbuf: u32,
    /// Queued for transmission.
    pub wmem_queued: u32,
    /// Packets dropped before reaching the socket (0 on kernels without the field).
    pub drops: Option<u32>,
}

/// `struct tcp_info`, the fields that matter for latency. A field is `None` when the
/// kernel's structure is too short to contain it. Times are microseconds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TcpInfo {
    /// Retransmission timeout.
    pub rto_us: Option<u32>,
    /// Delayed-ACK timeout currently in force (40 ms minimum on Linux).
    pub ato_us: Option<u32>,
    /// Send MSS.
    pub snd_mss: Option<u32>,
    /// Receive MSS estimate.
    pub rcv_mss: Option<u32>,
    /// Segments sent but not yet acknowledged.
    pub unacked: Option<u32>,
    /// Segments presumed lost.
    pub lost: Option<u32>,
    /// Segments being retransmitted now.
    pub retrans: Option<u32>,
    /// Time since the last data was sent.
    pub last_data_sent_us: Option<u64>,
    /// Time since the last data was received.
    pub last_data_recv_us: Option<u64>,
    /// Time since the last ACK was received.
    pub last_ack_recv_us: Option<u64>,
    /// Smoothed RTT.
    pub rtt_us: Option<u32>,
    /// RTT variance.
    pub rttvar_us: Option<u32>,
    /// Slow-start threshold (segments).
    pub snd_ssthresh: Option<u32>,
    /// Congestion window (segments).
    pub snd_cwnd: Option<u32>,
    /// Total retransmissions over the connection's life.
    pub total_retrans: Option<u32>,
    /// Minimum RTT seen.
    pub min_rtt_us: Option<u32>,
    /// Bytes written but not yet sent.
    pub notsent_bytes: Option<u32>,
    /// Delivery rate estimate, bytes per second.
    pub delivery_rate: Option<u64>,
    /// Time spent busy sending data.
    pub busy_time_us: Option<u64>,
    /// Time limited by the receiver's window.
    pub rwnd_limited_us: Option<u64>,
    /// Time limited by the send buffer.
    pub sndbuf_limited_us: Option<u64>,
    /// Bytes acknowledged by the peer.
    pub bytes_acked: Option<u64>,
    /// Bytes received.
    pub bytes_received: Option<u64>,
    /// Segments sent.
    pub segs_out: Option<u32>,
    /// Segments received.
    pub segs_in: Option<u32>,
    /// Peer's advertised receive window (bytes).
    pub snd_wnd: Option<u32>,
    /// Length of the structure the kernel returned.
    pub struct_len: usize,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_ne_bytes(s.try_into().expect("4 bytes")))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    b.get(off..off + 8)
        .map(|s| u64::from_ne_bytes(s.try_into().expect("8 bytes")))
}

impl TcpInfo {
    /// Parses a `struct tcp_info` of any length: fields beyond the end are `None`.
    /// Offsets from `include/uapi/linux/tcp.h`.
    pub fn parse(b: &[u8]) -> TcpInfo {
        let ms = |off| u32_at(b, off).map(|v| u64::from(v) * 1000);
        TcpInfo {
            rto_us: u32_at(b, 8),
            ato_us: u32_at(b, 12),
            snd_mss: u32_at(b, 16),
            rcv_mss: u32_at(b, 20),
            unacked: u32_at(b, 24),
            lost: u32_at(b, 32),
            retrans: u32_at(b, 36),
            last_data_sent_us: ms(44),
            last_data_recv_us: ms(52),
            last_ack_recv_us: ms(56),
            rtt_us: u32_at(b, 68),
            rttvar_us: u32_at(b, 72),
            snd_ssthresh: u32_at(b, 76),
            snd_cwnd: u32_at(b, 80),
            total_retrans: u32_at(b, 100),
            bytes_acked: u64_at(b, 120),
            bytes_received: u64_at(b, 128),
            segs_out: u32_at(b, 136),
            segs_in: u32_at(b, 140),
            notsent_bytes: u32_at(b, 144),
            min_rtt_us: u32_at(b, 148),
            delivery_rate: u64_at(b, 160),
            busy_time_us: u64_at(b, 168),
            rwnd_limited_us: u64_at(b, 176),
            sndbuf_limited_us: u64_at(b, 184),
            snd_wnd: u32_at(b, 228),
            struct_len: b.len(),
        }
    }
}

fn build_request(family: u8, states: u32, seq: u32) -> Vec<u8> {
    let ext: u8 = (1 << (INET_DIAG_INFO - 1))
        | (1 << (INET_DIAG_CONG - 1))
        | (1 << (INET_DIAG_SKMEMINFO - 1));
    build_request_ext(family, states, seq, ext)
}

fn build_request_ext(family: u8, states: u32, seq: u32, ext: u8) -> Vec<u8> {
    build_request_ports(family, states, seq, ext, Ports::Any)
}

/// Which port the kernel matches while it walks its tables (`inet_diag_sockid`'s
/// `idiag_sport` / `idiag_dport`: a zero matches any, and a non-zero `idiag_dport` skips the
/// listening table).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ports {
    Any,
    Local(u16),
    Remote(u16),
}

fn build_request_ports(family: u8, states: u32, seq: u32, ext: u8, ports: Ports) -> Vec<u8> {
    let mut m = Vec::with_capacity(56);
    // inet_diag_req_v2
    m.push(family);
    m.push(libc::IPPROTO_TCP as u8);
    m.push(ext);
    m.push(0);
    m.extend_from_slice(&states.to_ne_bytes());
    // inet_diag_sockid: sport, dport (big-endian), addresses, interface, cookie.
    let mut id = [0u8; 48];
    match ports {
        Ports::Any => {}
        Ports::Local(p) => id[0..2].copy_from_slice(&p.to_be_bytes()),
        Ports::Remote(p) => id[2..4].copy_from_slice(&p.to_be_bytes()),
    }
    m.extend_from_slice(&id);
    netlink::dump_request(SOCK_DIAG_BY_FAMILY, seq, &m)
}

fn addr(family: u8, raw: &[u8], port_be: &[u8]) -> SocketAddr {
    let port = u16::from_be_bytes([port_be[0], port_be[1]]);
    let ip = if family == libc::AF_INET as u8 {
        IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))
    } else {
        let a: [u8; 16] = raw[..16].try_into().expect("16 bytes");
        IpAddr::V6(Ipv6Addr::from(a))
    };
    SocketAddr::new(ip, port)
}

/// Parses one `inet_diag_msg` with its attributes. `None` if it is too short.
pub fn parse_diag_msg(b: &[u8]) -> Option<DiagSocket> {
    if b.len() < INET_DIAG_MSG_LEN {
        return None;
    }
    let family = b[0];
    let state = b[1];
    let id = &b[4..52];
    let local = addr(family, &id[4..20], &id[0..2]);
    let remote = addr(family, &id[20..36], &id[2..4]);
    let recv_q = u32_at(b, 56)?;
    let send_q = u32_at(b, 60)?;
    let uid = u32_at(b, 64)?;
    let inode = u64::from(u32_at(b, 68)?);
    let mut s = DiagSocket {
        state,
        local,
        remote,
        inode,
        uid,
        recv_q,
        send_q,
        tcp_info: None,
        congestion: None,
        skmem: None,
    };
    let mut off = INET_DIAG_MSG_LEN;
    while off + 4 <= b.len() {
        let alen = u16::from_ne_bytes([b[off], b[off + 1]]) as usize;
        let atype = u16::from_ne_bytes([b[off + 2], b[off + 3]]) & 0x3fff;
        if alen < 4 || off + alen > b.len() {
            break;
        }
        let payload = &b[off + 4..off + alen];
        match atype {
            INET_DIAG_INFO => s.tcp_info = Some(TcpInfo::parse(payload)),
            INET_DIAG_CONG => {
                let end = payload
                    .iter()
                    .position(|&c| c == 0)
                    .unwrap_or(payload.len());
                s.congestion = Some(String::from_utf8_lossy(&payload[..end]).into_owned());
            }
            INET_DIAG_SKMEMINFO if payload.len() >= 20 => {
                s.skmem = Some(SkMemInfo {
                    rmem_alloc: u32_at(payload, 0)?,
                    rcvbuf: u32_at(payload, 4)?,
                    wmem_alloc: u32_at(payload, 8)?,
                    sndbuf: u32_at(payload, 12)?,
                    wmem_queued: u32_at(payload, 20).unwrap_or(0),
                    drops: u32_at(payload, 32),
                })
            }
            _ => {}
        }
        off += (alen + 3) & !3;
    }
    Some(s)
}

/// Dumps every TCP socket of one address family in the calling thread's network namespace.
/// `states` is a bit mask of `1 << state`.
pub fn dump(family: u8, states: u32) -> io::Result<Vec<DiagSocket>> {
    let mut out = Vec::new();
    let req = build_request(family, states, 1);
    netlink::dump(NETLINK_SOCK_DIAG, &req, |b| parse_batch(b, &mut out))?;
    Ok(out)
}

/// Parses one datagram of a sock_diag dump into `out`. Returns whether the dump is over
/// (`NLMSG_DONE`, or an `NLMSG_ERROR` ack). A message whose length runs past the datagram
/// is an error; unknown message types are skipped.
pub fn parse_batch(buf: &[u8], out: &mut Vec<DiagSocket>) -> io::Result<bool> {
    let n = buf.len();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= n {
        let len = u32_at(buf, off).unwrap_or(0) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < NLMSG_HDRLEN || len > n - off {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "sock_diag: truncated netlink message",
            ));
        }
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = u32_at(buf, off + NLMSG_HDRLEN).unwrap_or(0) as i32;
                if code == 0 {
                    return Ok(true);
                }
                return Err(io::Error::from_raw_os_error(code.unsigned_abs() as i32));
            }
            SOCK_DIAG_BY_FAMILY => {
                if let Some(s) = parse_diag_msg(&buf[off + NLMSG_HDRLEN..off + len]) {
                    out.push(s);
                }
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok(false)
}

/// [`dump_tcp`] without the extensions (TCP_INFO, congestion, memory): addresses, state,
/// inode and queues only. The kernel then takes no socket lock per socket (TCP_INFO does),
/// so a frequent poll stays out of the sockets' way.
pub fn dump_tcp_addrs(states: u32) -> io::Result<Vec<DiagSocket>> {
    let mut out = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let req = build_request_ext(family, states, 1, 0);
        netlink::dump(NETLINK_SOCK_DIAG, &req, |b| parse_batch(b, &mut out))?;
    }
    Ok(dedup(out))
}

/// Every TCP socket (IPv4 then IPv6) in the calling thread's namespace, in `states`.
pub fn dump_tcp(states: u32) -> io::Result<Vec<DiagSocket>> {
    let mut v = dump(libc::AF_INET as u8, states)?;
    v.extend(dump(libc::AF_INET6 as u8, states)?);
    Ok(dedup(v))
}

/// [`dump_tcp`] of the sockets whose local or remote port is `port` only. The kernel
/// matches the port while it walks its tables, so the answer is a few messages instead of
/// every socket on the machine: one batch, no (bucket, position) resume between batches —
/// on a host with thousands of connections a full dump's resume can list a socket twice or
/// step over one that another moved — and far less work.
pub fn dump_tcp_port(states: u32, port: u16) -> io::Result<Vec<DiagSocket>> {
    let ext: u8 = (1 << (INET_DIAG_INFO - 1))
        | (1 << (INET_DIAG_CONG - 1))
        | (1 << (INET_DIAG_SKMEMINFO - 1));
    let mut out = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        for ports in [Ports::Local(port), Ports::Remote(port)] {
            let req = build_request_ports(family, states, 1, ext, ports);
            netlink::dump(NETLINK_SOCK_DIAG, &req, |b| parse_batch(b, &mut out))?;
        }
    }
    // A socket whose local and remote ports are both `port` is in both answers.
    Ok(dedup(out))
}

/// A dump is not a snapshot: the kernel resumes each batch at a (bucket, position) mark,
/// so a socket inserted ahead of the mark between two batches moves a listed one past it
/// and that one is listed twice. The same socket (4-tuple, inode, state) is kept once.
fn dedup(v: Vec<DiagSocket>) -> Vec<DiagSocket> {
    let mut seen = std::collections::HashSet::with_capacity(v.len());
    v.into_iter()
        .filter(|s| seen.insert((s.local, s.remote, s.inode, s.state)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel matches the port in its walk: a listener, a client and the accepted end
    /// on one port come back — three sockets, each once — the same three the full dump
    /// holds on that port, and a socket on another port does not.
    #[test]
    fn a_port_dump_is_the_full_dump_on_that_port() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (a, _) = l.accept().unwrap();
        let on_port = |v: &[DiagSocket]| {
            let mut k: Vec<_> = v
                .iter()
                .filter(|s| s.local.port() == port || s.remote.port() == port)
                .map(|s| (s.state, s.local, s.remote, s.inode))
                .collect();
            k.sort_unstable();
            k
        };
        let all = 0xfff & !(1 << 6);
        let narrow = dump_tcp_port(all, port).unwrap();
        assert_eq!(narrow.len(), 3, "{narrow:?}");
        assert!(
            narrow
                .iter()
                .all(|s| s.local.port() == port || s.remote.port() == port)
        );
        assert!(narrow.iter().all(|s| s.tcp_info.is_some()));
        assert_eq!(on_port(&narrow), on_port(&dump_tcp(all).unwrap()));
        let oport = other.local_addr().unwrap().port();
        assert!(!narrow.iter().any(|s| s.local.port() == oport));
        drop((c, a));
    }

    #[test]
    fn the_port_is_asked_for_in_network_order() {
        let local = build_request_ports(2, 1, 1, 0, Ports::Local(0x1f90));
        let remote = build_request_ports(2, 1, 1, 0, Ports::Remote(0x1f90));
        // nlmsghdr (16), then family, protocol, ext, pad, states (8), then the sockid.
        assert_eq!(&local[24..28], &[0x1f, 0x90, 0, 0]);
        assert_eq!(&remote[24..28], &[0, 0, 0x1f, 0x90]);
    }

    #[test]
    fn short_tcp_info_leaves_later_fields_empty() {
        let mut b = vec![0u8; 104];
        b[68..72].copy_from_slice(&1234u32.to_ne_bytes());
        b[100..104].copy_from_slice(&7u32.to_ne_bytes());
        let t = TcpInfo::parse(&b);
        assert_eq!(t.rtt_us, Some(1234));
        assert_eq!(t.total_retrans, Some(7));
        assert_eq!(t.delivery_rate, None);
        assert_eq!(t.busy_time_us, None);
        let t = TcpInfo::parse(&b[..70]);
        assert_eq!(t.rtt_us, None);
        assert_eq!(t.rto_us, Some(0));
        assert_eq!(TcpInfo::parse(&[]).rto_us, None);
    }

    #[test]
    fn truncated_diag_msg_is_rejected_and_bad_attrs_are_skipped() {
        assert!(parse_diag_msg(&[0u8; 71]).is_none());
        let mut b = vec![0u8; 72];
        b[0] = libc::AF_INET as u8;
        b[1] = 10;
        b[4..6].copy_from_slice(&8080u16.to_be_bytes());
        b[8..12].copy_from_slice(&[127, 0, 0, 1]);
        b[68..72].copy_from_slice(&99u32.to_ne_bytes());
        // an attribute claiming more bytes than there are
        b.extend_from_slice(&200u16.to_ne_bytes());
        b.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
        let s = parse_diag_msg(&b).unwrap();
        assert_eq!(s.local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(s.inode, 99);
        assert_eq!(s.state, 10);
        assert!(s.tcp_info.is_none());
    }

    /// A deterministic byte stream (xorshift) for garbage inputs.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn tcp_info_of_every_length_parses_the_fields_that_fit() {
        // A real-sized struct with each u32 slot numbered: every field present in a prefix
        // must read its own slot, every field beyond it must be None.
        let full: Vec<u8> = (0u32..75).flat_map(|i| i.to_ne_bytes()).collect();
        for len in 0..=300usize {
            let b: Vec<u8> = full.iter().copied().cycle().take(len).collect();
            let t = TcpInfo::parse(&b);
            assert_eq!(t.struct_len, len);
            assert_eq!(t.rto_us, (len >= 12).then_some(2), "len {len}");
            assert_eq!(t.rtt_us, (len >= 72).then_some(17), "len {len}");
            assert_eq!(t.total_retrans, (len >= 104).then_some(25), "len {len}");
            assert_eq!(t.min_rtt_us, (len >= 152).then_some(37), "len {len}");
            assert_eq!(t.delivery_rate.is_some(), len >= 168, "len {len}");
            assert_eq!(t.snd_wnd, (len >= 232).then_some(57), "len {len}");
            assert_eq!(
                t.last_data_sent_us,
                (len >= 48).then_some(11_000),
                "len {len}"
            );
        }
    }

    #[test]
    fn garbage_and_truncated_netlink_never_panics() {
        // One well-formed SOCK_DIAG_BY_FAMILY message with an INET_DIAG_INFO attribute
        // of 232 bytes, then NLMSG_DONE.
        let mut msg = vec![0u8; INET_DIAG_MSG_LEN];
        msg[0] = libc::AF_INET6 as u8;
        msg[1] = 1;
        msg.extend_from_slice(&(4u16 + 232).to_ne_bytes());
        msg.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
        msg.extend_from_slice(&noise(7, 232));
        let mut dgram = Vec::new();
        dgram.extend_from_slice(&((NLMSG_HDRLEN + msg.len()) as u32).to_ne_bytes());
        dgram.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        dgram.extend_from_slice(&[0u8; 10]);
        dgram.extend_from_slice(&msg);
        dgram.extend_from_slice(&(NLMSG_HDRLEN as u32).to_ne_bytes());
        dgram.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        dgram.extend_from_slice(&[0u8; 10]);
        let mut out = Vec::new();
        assert!(parse_batch(&dgram, &mut out).unwrap());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tcp_info.as_ref().map(|t| t.struct_len), Some(232));
        // Every truncation of it: an error or a partial parse, never a panic.
        for cut in 0..dgram.len() {
            let mut out = Vec::new();
            let _ = parse_batch(&dgram[..cut], &mut out);
            assert!(out.len() <= 1);
            let _ = parse_diag_msg(&msg[..cut.min(msg.len())]);
        }
        // Random bytes, and random bytes behind a valid header.
        for seed in 0..2000u64 {
            let len = (seed as usize * 7) % 600;
            let g = noise(seed, len);
            let _ = parse_batch(&g, &mut Vec::new());
            let _ = parse_diag_msg(&g);
            let mut h = dgram[..NLMSG_HDRLEN + INET_DIAG_MSG_LEN].to_vec();
            h.extend_from_slice(&g);
            let total = h.len() as u32;
            h[..4].copy_from_slice(&total.to_ne_bytes());
            let _ = parse_batch(&h, &mut Vec::new());
        }
        // An error message with errno i32::MIN, and one cut before its errno.
        let mut e = ((NLMSG_HDRLEN + 4) as u32).to_ne_bytes().to_vec();
        e.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        e.extend_from_slice(&[0u8; 10]);
        e.extend_from_slice(&i32::MIN.to_ne_bytes());
        assert!(parse_batch(&e, &mut Vec::new()).is_err());
        e[..4].copy_from_slice(&(NLMSG_HDRLEN as u32).to_ne_bytes());
        assert!(parse_batch(&e[..NLMSG_HDRLEN], &mut Vec::new()).unwrap());
    }

    #[test]
    fn a_socket_listed_twice_by_a_resumed_dump_is_kept_once() {
        let sock = |port: u16, inode: u64, state: u8| DiagSocket {
            state,
            local: SocketAddr::from(([127, 0, 0, 1], port)),
            remote: SocketAddr::from(([0, 0, 0, 0], 0)),
            inode,
            uid: 0,
            recv_q: 0,
            send_q: 128,
            tcp_info: None,
            congestion: None,
            skmem: None,
        };
        // Two SO_REUSEPORT listeners share the address (two inodes): both stay.
        let v = vec![
            sock(80, 1, 10),
            sock(80, 2, 10),
            sock(80, 1, 10),
            sock(81, 3, 1),
        ];
        let d = dedup(v);
        assert_eq!(d.iter().map(|s| s.inode).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn state_names() {
        assert_eq!(state_number("established"), Some(1));
        assert_eq!(state_number("time_wait"), Some(6));
        assert_eq!(state_number("listen"), Some(10));
        assert_eq!(state_number("bogus"), None);
    }
}
