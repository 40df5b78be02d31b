//! The network behind a trait: the probe state machines in `ping`/`route` only send bytes and
//! receive parsed replies, so they are unit-tested with a simulated network; [`RawNetwork`]
//! is the real one (raw sockets, kernel receive timestamps).

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::wire::{self, Flow, Proto, Reply};

/// A received reply and when it arrived, in the monotonic-clock nanoseconds of [`mono_ns`].
#[derive(Debug, Clone)]
pub struct Received {
    /// Arrival time (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    /// The parsed packet.
    pub reply: Reply,
    /// Whether `at_ns` is the kernel's RX timestamp (else user-space time at read).
    pub kernel_ts: bool,
}

/// What the probe engines need from a network.
pub trait Network {
    /// Sends one probe (transport header + payload) with this TTL / hop limit and returns the
    /// CLOCK_MONOTONIC time taken right before the send.
    fn send(&mut self, ttl: u8, probe: &[u8]) -> io::Result<u64>;
    /// Waits until a reply arrives or the monotonic clock reaches `deadline_ns`; a deadline
    /// already past returns a reply that has arrived, or `None`, without waiting.
    fn recv(&mut self, deadline_ns: u64) -> io::Result<Option<Received>>;
    /// The current time on the same clock.
    fn now_ns(&self) -> u64;
    /// Whether the time the last `send` returned is a kernel TX timestamp.
    fn last_send_kernel_ts(&self) -> bool {
        false
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_REALTIME - CLOCK_MONOTONIC` in ns, from the tightest of 32 bracketed reads, and the
/// bracket width (the uncertainty of the conversion).
pub fn realtime_offset() -> (i128, u64) {
    let mut best = (0i128, u64::MAX);
    for _ in 0..32 {
        let a = clock_ns(libc::CLOCK_MONOTONIC);
        let r = clock_ns(libc::CLOCK_REALTIME);
        let b = clock_ns(libc::CLOCK_MONOTONIC);
        if b - a < best.1 {
            best = (i128::from(r) - i128::from(a + (b - a) / 2), b - a);
        }
    }
    best
}

/// Where send and receive times come from, stated in reports.
pub const TIMESTAMP_SOURCE_RAW: &str = "send: kernel software TX timestamp (SO_TIMESTAMPING, taken where the packet leaves for the device) when the kernel reports it during the send, else CLOCK_MONOTONIC right before sendto; receive: kernel software RX timestamp (SO_TIMESTAMPNS); kernel timestamps are CLOCK_REALTIME, converted to CLOCK_MONOTONIC with one offset measured at start (so a kernel-to-kernel RTT is exact)";

/// Whether this process may open raw sockets (CAP_NET_RAW in its network namespace).
pub fn have_cap_net_raw() -> bool {
    Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).is_ok()
}

/// The source address the kernel would use to reach `dst` (a route lookup via a connected UDP
/// socket; nothing is sent). Errors with "no route" when there is none.
pub fn source_for(dst: IpAddr) -> io::Result<IpAddr> {
    let dom = if dst.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(dom, Type::DGRAM, None)?;
    s.connect(&SocketAddr::new(dst, 9).into())?;
    let local = s
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("no local address"))?;
    Ok(local.ip())
}

/// A TCP socket bound to `src:0` and never connected or listening: it holds the port so
/// that no other process gets our replies, and the kernel answers a SYN-ACK to it with RST
/// (no half-open connection remains on the target).
pub fn hold_tcp_port(src: IpAddr) -> io::Result<(Socket, u16)> {
    let dom = if src.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(dom, Type::STREAM, Some(Protocol::TCP))?;
    s.bind(&SocketAddr::new(src, 0).into())?;
    let port = s.local_addr()?.as_socket().map(|a| a.port()).unwrap_or(0);
    Ok((s, port))
}

/// A UDP socket bound to `src:0`, holding the source port of UDP probes.
pub fn hold_udp_port(src: IpAddr) -> io::Result<(Socket, u16)> {
    let dom = if src.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(dom, Type::DGRAM, Some(Protocol::UDP))?;
    s.bind(&SocketAddr::new(src, 0).into())?;
    let port = s.local_addr()?.as_socket().map(|a| a.port()).unwrap_or(0);
    Ok((s, port))
}

/// Real raw-socket network for one flow.
pub struct RawNetwork {
    flow: Flow,
    send: Socket,
    /// Sockets we receive on, with their protocol number (the send socket is among them
    /// for TCP and ICMP probes).
    recv: Vec<(Socket, u8)>,
    dst: SockAddr,
    offset_ns: i128,
    offset_at: u64,
    last_ttl: u8,
    buf: Vec<u8>,
    /// Replies read without a kernel timestamp (user-space time used instead).
    pub untimestamped: u64,
    /// Probes whose send time is the kernel's TX timestamp.
    pub tx_kernel: u64,
    /// Probes whose send time is CLOCK_MONOTONIC before sendto (no TX timestamp in time).
    pub tx_user: u64,
    sends: u32,
    last_kernel: bool,
}

fn raw(v6: bool, proto: u8) -> io::Result<Socket> {
    let dom = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let s = Socket::new(dom, Type::RAW, Some(Protocol::from(i32::from(proto)))).map_err(|e| {
        if e.kind() == io::ErrorKind::PermissionDenied {
            io::Error::new(
                e.kind(),
                "raw sockets need CAP_NET_RAW (run as root or `setcap cap_net_raw+ep`)",
            )
        } else {
            e
        }
    })?;
    s.set_nonblocking(true)?;
    let _ = s.set_recv_buffer_size(1 << 22);
    setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
    if v6 {
        setsockopt_int(
            s.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVHOPLIMIT,
            1,
        )?;
        setsockopt_int(s.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
    }
    Ok(s)
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: passes a valid int pointer and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A classic BPF program accepting only TCP segments to `port` (so a raw TCP socket does not
/// copy every segment of a busy host). `ip_header`: the socket sees the IPv4 header first.
fn attach_tcp_port_filter(fd: RawFd, port: u16, ip_header: bool) -> io::Result<()> {
    let f = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    const LDX_MSH: u16 = (libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH) as u16;
    const LDH_IND: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_IND) as u16;
    const LDH_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let mut prog: Vec<libc::sock_filter> = if ip_header {
        vec![f(LDX_MSH, 0, 0, 0), f(LDH_IND, 0, 0, 2)]
    } else {
        vec![f(LDH_ABS, 0, 0, 2)]
    };
    prog.extend([
        f(JEQ, 0, 1, u32::from(port)),
        f(RET, 0, 0, 0xffff),
        f(RET, 0, 0, 0),
    ]);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: fprog points to `prog`, alive for the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl RawNetwork {
    /// Opens the sockets for `flow` (its `src` must be a local address). Needs CAP_NET_RAW.
    pub fn open(flow: Flow) -> io::Result<RawNetwork> {
        let v6 = flow.dst.is_ipv6();
        let send = raw(v6, flow.proto.ip_proto(v6))?;
        send.bind(&SocketAddr::new(flow.src, 0).into())?;
        let mut recv = Vec::new();
        match flow.proto {
            Proto::Tcp => {
                attach_tcp_port_filter(send.as_raw_fd(), flow.sport, !v6)?;
                recv.push((send.try_clone()?, 6));
                let icmp = raw(v6, Proto::Icmp.ip_proto(v6))?;
                recv.push((icmp, Proto::Icmp.ip_proto(v6)));
            }
            Proto::Udp => {
                let icmp = raw(v6, Proto::Icmp.ip_proto(v6))?;
                recv.push((icmp, Proto::Icmp.ip_proto(v6)));
            }
            Proto::Icmp => recv.push((send.try_clone()?, flow.proto.ip_proto(v6))),
        }
        // Segments queued before the filter was attached are simply not matched later.
        let (offset_ns, _) = realtime_offset();
        let mut n = RawNetwork {
            flow,
            send,
            recv,
            dst: SocketAddr::new(flow.dst, 0).into(),
            offset_ns,
            offset_at: mono_ns(),
            last_ttl: 0,
            buf: vec![0; 65536],
            untimestamped: 0,
            tx_kernel: 0,
            tx_user: 0,
            sends: 0,
            last_kernel: false,
        };
        let flags = libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        // Without TX timestamps we still work (user-space send times); not an error.
        let _ = setsockopt_int(
            n.send.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            flags as i32,
        );
        n.set_ttl(64)?;
        Ok(n)
    }

    fn set_ttl(&mut self, ttl: u8) -> io::Result<()> {
        if ttl != self.last_ttl {
            if self.flow.dst.is_ipv6() {
                self.send.set_unicast_hops_v6(u32::from(ttl))?;
            } else {
                self.send.set_ttl_v4(u32::from(ttl))?;
            }
            self.last_ttl = ttl;
        }
        Ok(())
    }

    /// The kernel's TX timestamp of send number `key`, if it is already on the error queue
    /// (it is when the device took the packet during the send call; a packet held in a
    /// qdisc gets its timestamp later, and then the user-space send time is used).
    fn tx_timestamp(&mut self, key: u32) -> Option<u64> {
        let fd = self.send.as_raw_fd();
        for _ in 0..8 {
            let mut ctrl = [0u64; 64];
            let mut dummy = [0u8; 64];
            let mut iov = libc::iovec {
                iov_base: dummy.as_mut_ptr().cast(),
                iov_len: dummy.len(),
            };
            // SAFETY: zeroed msghdr is valid; pointers refer to live local buffers.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = ctrl.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&ctrl) as _;
            // SAFETY: msg is initialised above.
            let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
            if n < 0 {
                return None;
            }
            let mut ts: Option<i128> = None;
            let mut id: Option<u32> = None;
            // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    let data = libc::CMSG_DATA(c);
                    match ((*c).cmsg_level, (*c).cmsg_type) {
                        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPING) => {
                            let t: libc::timespec = std::ptr::read_unaligned(data.cast());
                            ts = Some(i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec));
                        }
                        (libc::SOL_IP, libc::IP_RECVERR) | (libc::SOL_IPV6, libc::IPV6_RECVERR) => {
                            let e: libc::sock_extended_err = std::ptr::read_unaligned(data.cast());
                            if e.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING {
                                id = Some(e.ee_data);
                            }
                        }
                        _ => {}
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            // Older entries (sends whose timestamp came late) are skipped.
            if let (Some(t), Some(i)) = (ts, id)
                && i == key
                && t > 0
            {
                return Some((t - self.offset_ns).max(0) as u64);
            }
        }
        None
    }

    fn read_one(&mut self, idx: usize) -> io::Result<Option<Received>> {
        let fd = self.recv[idx].0.as_raw_fd();
        let proto = self.recv[idx].1;
        let v6 = self.flow.dst.is_ipv6();
        let mut name: MaybeUninit<libc::sockaddr_storage> = MaybeUninit::zeroed();
        let mut ctrl = [0u64; 64];
        let mut iov = libc::iovec {
            iov_base: self.buf.as_mut_ptr().cast(),
            iov_len: self.buf.len(),
        };
        // SAFETY: zeroed msghdr is valid; all pointers refer to live buffers sized as stated.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = name.as_mut_ptr().cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&ctrl) as _;
        // SAFETY: msg is fully initialised above.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(e);
        }
        let user_now = mono_ns();
        let mut kernel_ts: Option<u64> = None;
        let mut hop_limit = 0u8;
        let mut to6 = Ipv6Addr::UNSPECIFIED;
        // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                match ((*c).cmsg_level, (*c).cmsg_type) {
                    (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                        let ts: libc::timespec = std::ptr::read_unaligned(data.cast());
                        let real = i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec);
                        kernel_ts = Some((real - self.offset_ns).max(0) as u64);
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                        let h: i32 = std::ptr::read_unaligned(data.cast());
                        hop_limit = h.clamp(0, 255) as u8;
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                        let p: libc::in6_pktinfo = std::ptr::read_unaligned(data.cast());
                        to6 = Ipv6Addr::from(p.ipi6_addr.s6_addr);
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        let at_ns = match kernel_ts {
            Some(t) => t,
            None => {
                self.untimestamped += 1;
                user_now
            }
        };
        let pkt = &self.buf[..n as usize];
        let reply = if v6 {
            if (msg.msg_namelen as usize) < std::mem::size_of::<libc::sockaddr_in6>() {
                return Ok(None);
            }
            // SAFETY: the kernel wrote a sockaddr_in6 (checked length) into `name`.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read_unaligned(name.as_ptr().cast()) };
            let from = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            wire::parse_ipv6(pkt, proto, from, to6, hop_limit)
        } else {
            wire::parse_ipv4(pkt)
        };
        let kernel_ts = kernel_ts.is_some();
        Ok(reply.map(|reply| Received {
            at_ns,
            reply,
            kernel_ts,
        }))
    }
}

impl Network for RawNetwork {
    fn send(&mut self, ttl: u8, probe: &[u8]) -> io::Result<u64> {
        self.set_ttl(ttl)?;
        // NTP may slew CLOCK_REALTIME against CLOCK_MONOTONIC (≤ 500 ppm): re-measure the
        // offset every 10 s so that long runs keep kernel receive times in the right domain.
        if mono_ns().saturating_sub(self.offset_at) > 10_000_000_000 {
            self.offset_ns = realtime_offset().0;
            self.offset_at = mono_ns();
        }
        let t = mono_ns();
        loop {
            match self.send.send_to(probe, &self.dst) {
                Ok(_) => break,
                // A full socket or device queue: wait a little, as a blocking send would.
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::ENOBUFS) =>
                {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                Err(e) => return Err(e),
            }
        }
        let key = self.sends;
        self.sends = self.sends.wrapping_add(1);
        match self.tx_timestamp(key) {
            Some(k) => {
                self.tx_kernel += 1;
                self.last_kernel = true;
                Ok(k)
            }
            None => {
                self.tx_user += 1;
                self.last_kernel = false;
                Ok(t)
            }
        }
    }

    fn recv(&mut self, deadline_ns: u64) -> io::Result<Option<Received>> {
        loop {
            for i in 0..self.recv.len() {
                if let Some(r) = self.read_one(i)? {
                    return Ok(Some(r));
                }
            }
            let now = mono_ns();
            if now >= deadline_ns {
                return Ok(None);
            }
            let mut fds: Vec<libc::pollfd> = self
                .recv
                .iter()
                .map(|(s, _)| libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let wait_ns = deadline_ns - now;
            let ts = libc::timespec {
                tv_sec: (wait_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (wait_ns % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: fds is a live array of fds.len() pollfds; ts is a valid timespec.
            let rc = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }

    fn now_ns(&self) -> u64 {
        mono_ns()
    }

    fn last_send_kernel_ts(&self) -> bool {
        self.last_kernel
    }
}

/// An unspecified address of the same family.
pub fn unspecified_like(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realtime_offset_is_tight_and_consistent() {
        let (off, width) = realtime_offset();
        assert!(width < 1_000_000, "bracket {width} ns");
        let real = i128::from(clock_ns(libc::CLOCK_REALTIME));
        let mono = i128::from(mono_ns());
        assert!((real - mono - off).abs() < 5_000_000);
    }

    #[test]
    fn source_for_loopback_is_loopback() {
        assert_eq!(
            source_for("127.0.0.1".parse().unwrap()).unwrap(),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
