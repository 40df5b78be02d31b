//! `ping`: one probe per interval to HOST:PORT, RTT per reply, timeouts as lost samples.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

use crate::net::{self, Network};
use crate::stats::{RttStats, loss_pct};
use crate::wire::{self, Answer, Flow, IcmpError, MAX_ID};

/// How `ping` probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PingMode {
    /// TCP SYN from a raw socket; the kernel resets the SYN-ACK (needs CAP_NET_RAW).
    Syn,
    /// Timed `connect()`: unprivileged, completes the handshake, then closes.
    Connect,
    /// UDP to a closed port; the ICMP port unreachable is the reply (needs CAP_NET_RAW).
    Udp,
    /// ICMP echo (needs CAP_NET_RAW).
    Icmp,
}

/// What `ping` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingOptions {
    /// Target address and port (the port is unused for ICMP).
    pub target: SocketAddr,
    /// Probe kind.
    pub mode: PingMode,
    /// Number of probes.
    pub count: u32,
    /// Time between probe sends.
    pub interval: Duration,
    /// How long each probe waits for its reply before it counts as lost.
    pub timeout: Duration,
    /// TTL / hop limit of the probes.
    pub ttl: u8,
    /// If the mode needs CAP_NET_RAW and it is missing, fall back to `Connect` (for TCP modes)
    /// instead of failing.
    pub fallback_to_connect: bool,
}

impl PingOptions {
    /// Defaults: SYN, 4 probes 1 s apart, 1 s timeout, TTL 64, fallback on.
    pub fn new(target: SocketAddr) -> PingOptions {
        PingOptions {
            target,
            mode: PingMode::Syn,
            count: 4,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            ttl: 64,
            fallback_to_connect: true,
        }
    }
}

/// What answered a probe (or that nothing did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SampleKind {
    /// SYN-ACK: the port is open.
    SynAck,
    /// RST: the port is closed; still a full path round trip.
    Rst,
    /// ICMP echo reply.
    EchoReply,
    /// ICMP port unreachable from the target (the reply to a UDP probe).
    PortUnreachable,
    /// connect() completed.
    Connected,
    /// connect() refused (RST).
    Refused,
    /// An ICMP error from elsewhere (TTL exceeded, host/net unreachable): not a target reply.
    IcmpError,
    /// No reply within the timeout.
    Lost,
}

impl SampleKind {
    /// Whether this is a reply from the target (counts as received, carries an RTT sample).
    pub fn is_reply(self) -> bool {
        !matches!(self, SampleKind::Lost | SampleKind::IcmpError)
    }
}

/// One probe and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Probe number, from 0.
    pub seq: u32,
    /// Outcome.
    pub kind: SampleKind,
    /// Round-trip time in µs (ns resolution), absent when lost.
    pub rtt_us: Option<f64>,
    /// When the probe was sent, µs since the first probe.
    pub sent_at_us: f64,
    /// Who answered.
    pub from: Option<IpAddr>,
    /// TTL / hop limit of the reply.
    pub ttl: Option<u8>,
    /// IP length of the reply.
    pub len: Option<usize>,
    /// IPv4 id of the reply.
    pub ip_id: Option<u16>,
    /// DF bit of the reply.
    pub df: Option<bool>,
    /// Source port of a TCP reply (the target's port).
    pub sport: Option<u16>,
    /// TCP flags of the reply (`SA`, `RA`).
    pub flags: Option<String>,
    /// TCP window of the reply.
    pub window: Option<u16>,
    /// ICMP code, for ICMP errors.
    pub icmp_code: Option<u8>,
    /// Which ICMP error, for `IcmpError` and `PortUnreachable` samples.
    pub icmp_error: Option<IcmpError>,
    /// Whether the send time is the kernel's TX timestamp (else CLOCK_MONOTONIC before the
    /// send call; absent in connect mode, which times connect() in user space).
    pub tx_kernel_ts: Option<bool>,
    /// Whether the receive time is the kernel's RX timestamp (absent when lost).
    pub rx_kernel_ts: Option<bool>,
}

impl Sample {
    fn lost(seq: u32, sent_at_us: f64) -> Sample {
        Sample {
            seq,
            kind: SampleKind::Lost,
            rtt_us: None,
            sent_at_us,
            from: None,
            ttl: None,
            len: None,
            ip_id: None,
            df: None,
            sport: None,
            flags: None,
            window: None,
            icmp_code: None,
            icmp_error: None,
            tx_kernel_ts: None,
            rx_kernel_ts: None,
        }
    }
}

/// Totals of a ping run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingStats {
    /// Probes sent.
    pub sent: u64,
    /// Replies from the target.
    pub received: u64,
    /// Loss, percent.
    pub loss_pct: f64,
    /// RTT summary of the replies.
    pub rtt: RttStats,
}

impl PingStats {
    /// Totals of `samples`.
    pub fn of(samples: &[Sample]) -> PingStats {
        let rtts: Vec<f64> = samples
            .iter()
            .filter(|s| s.kind.is_reply())
            .filter_map(|s| s.rtt_us)
            .collect();
        let sent = samples.len() as u64;
        let received = rtts.len() as u64;
        PingStats {
            sent,
            received,
            loss_pct: loss_pct(sent, received),
            rtt: RttStats::of(&rtts),
        }
    }
}

/// The result of a ping run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingReport {
    /// Target.
    pub target: SocketAddr,
    /// Our source address and port.
    pub source: SocketAddr,
    /// The mode actually used.
    pub mode: PingMode,
    /// Where send and receive times come from.
    pub timestamp_source: String,
    /// Why the mode differs from the one asked for, if it does.
    pub note: Option<String>,
    /// Every probe, in send order.
    pub samples: Vec<Sample>,
    /// Totals.
    pub stats: PingStats,
}

/// Maps sequence numbers to probe ids (1..=MAX_ID, wrapping).
pub(crate) fn probe_id(n: u64) -> u16 {
    (n % u64::from(MAX_ID)) as u16 + 1
}

/// The raw-socket ping engine, generic over the network so it is testable with a simulation.
/// Calls `on_sample` as each probe resolves (reply or timeout), returns all samples in order.
pub fn run_probes<N: Network>(
    net: &mut N,
    flow: &Flow,
    opts: &PingOptions,
    stop: &AtomicBool,
    on_sample: &mut dyn FnMut(&Sample),
) -> io::Result<Vec<Sample>> {
    let interval = opts.interval.as_nanos() as u64;
    let timeout = opts.timeout.as_nanos() as u64;
    let mut out: Vec<Option<Sample>> = Vec::new();
    // id -> (seq, sent_ns)
    let mut outstanding: BTreeMap<u16, (u32, u64)> = BTreeMap::new();
    let mut tx_kernel: Vec<bool> = Vec::new();
    let mut seq: u32 = 0;
    let mut first_sent: Option<u64> = None;
    let mut next_send = net.now_ns();
    let rel = |t: u64, first: Option<u64>| (t - first.unwrap_or(t)) as f64 / 1000.0;
    loop {
        let now = net.now_ns();
        let stopping = stop.load(Ordering::Relaxed);
        // Ids wrap after MAX_ID probes: never reuse one still in flight (its sample would be
        // overwritten and vanish from the report); wait until it resolves instead.
        let id_free = !outstanding.contains_key(&probe_id(u64::from(seq)));
        if !stopping && seq < opts.count && now >= next_send && id_free {
            let id = probe_id(u64::from(seq));
            let pkt = wire::build_probe(flow, id);
            let t = net.send(opts.ttl, &pkt)?;
            first_sent.get_or_insert(t);
            outstanding.insert(id, (seq, t));
            tx_kernel.push(net.last_send_kernel_ts());
            out.push(None);
            seq += 1;
            next_send += interval;
            // No `continue`: when sends fall behind (-i 0 or shorter than a send), read
            // between sends anyway so replies are timestamped now, not after the burst, and
            // do not overflow the receive buffer into false losses.
        }
        // Expire probes whose time is up (or all of them when stopping).
        let expired: Vec<u16> = outstanding
            .iter()
            .filter(|(_, (_, t))| stopping || now >= t + timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let (s, t) = outstanding.remove(&id).expect("present");
            let mut sample = Sample::lost(s, rel(t, first_sent));
            sample.tx_kernel_ts = Some(tx_kernel[s as usize]);
            on_sample(&sample);
            out[s as usize] = Some(sample);
        }
        if outstanding.is_empty() && (seq >= opts.count || stopping) {
            break;
        }
        let mut deadline = outstanding
            .values()
            .map(|(_, t)| t + timeout)
            .min()
            .unwrap_or(u64::MAX);
        if seq < opts.count && id_free {
            deadline = deadline.min(next_send);
        }
        // Look at the stop flag at least every 100 ms.
        deadline = deadline.min(now + 100_000_000);
        let Some(rx) = net.recv(deadline)? else {
            continue;
        };
        let Some((id, answer)) = wire::match_reply(flow, &rx.reply) else {
            continue;
        };
        let Some(&(s, t)) = outstanding.get(&id) else {
            continue;
        };
        let rtt_ns = rx.at_ns.saturating_sub(t);
        if rtt_ns > timeout {
            continue; // late: expired on the next turn
        }
        let r = &rx.reply;
        let icmp_error = match answer {
            Answer::Error(e, _) => Some(e),
            _ => None,
        };
        let (kind, flags, window, code) = match answer {
            Answer::Tcp { flags, window } => {
                let k = if flags & wire::tcp_flags::RST != 0 {
                    SampleKind::Rst
                } else {
                    SampleKind::SynAck
                };
                (k, Some(wire::flags_str(flags)), Some(window), None)
            }
            Answer::Echo => (SampleKind::EchoReply, None, None, None),
            Answer::Error(IcmpError::PortUnreachable, c) if r.from == flow.dst => {
                (SampleKind::PortUnreachable, None, None, Some(c))
            }
            Answer::Error(_, c) => (SampleKind::IcmpError, None, None, Some(c)),
        };
        outstanding.remove(&id);
        let sample = Sample {
            seq: s,
            kind,
            rtt_us: Some(rtt_ns as f64 / 1000.0),
            sent_at_us: rel(t, first_sent),
            from: Some(r.from),
            ttl: Some(r.ttl),
            len: Some(r.len),
            ip_id: (!r.from.is_ipv6()).then_some(r.ip_id),
            df: (!r.from.is_ipv6()).then_some(r.df),
            sport: matches!(answer, Answer::Tcp { .. }).then_some(flow.dport),
            flags,
            window,
            icmp_code: code,
            icmp_error,
            tx_kernel_ts: Some(tx_kernel[s as usize]),
            rx_kernel_ts: Some(rx.kernel_ts),
        };
        on_sample(&sample);
        out[s as usize] = Some(sample);
    }
    Ok(out.into_iter().flatten().collect())
}

/// Timed `connect()` probes: no privilege needed. Each probe completes a handshake (the
/// target's application sees a connection) and is closed at once.
pub fn run_connect(
    opts: &PingOptions,
    stop: &AtomicBool,
    on_sample: &mut dyn FnMut(&Sample),
) -> io::Result<(Vec<Sample>, SocketAddr)> {
    let mut out = Vec::new();
    let mut source = SocketAddr::new(net::unspecified_like(opts.target.ip()), 0);
    let start = net::mono_ns();
    let interval = opts.interval.as_nanos() as u64;
    for seq in 0..opts.count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let due = start + u64::from(seq) * interval;
        let now = net::mono_ns();
        if due > now {
            // Sleep in slices so that `stop` is honoured.
            let mut left = due - now;
            while left > 0 && !stop.load(Ordering::Relaxed) {
                let step = left.min(100_000_000);
                std::thread::sleep(Duration::from_nanos(step));
                left -= step;
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let dom = if opts.target.is_ipv6() {
            Domain::IPV6
        } else {
            Domain::IPV4
        };
        let sock = Socket::new(dom, Type::STREAM, Some(Protocol::TCP))?;
        sock.set_tcp_nodelay(true)?;
        if opts.ttl != 64 {
            if opts.target.is_ipv6() {
                sock.set_unicast_hops_v6(u32::from(opts.ttl))?;
            } else {
                sock.set_ttl_v4(u32::from(opts.ttl))?;
            }
        }
        let t0 = net::mono_ns();
        let res = connect_until(&sock, opts.target, opts.timeout, stop, &mut source);
        let t1 = net::mono_ns();
        let sent_at_us = (t0 - start) as f64 / 1000.0;
        let mut s = Sample::lost(seq, sent_at_us);
        match res {
            Ok(()) => {
                s.kind = SampleKind::Connected;
                s.rtt_us = Some((t1 - t0) as f64 / 1000.0);
                s.from = Some(opts.target.ip());
                // Close with RST (linger 0): no TIME_WAIT piles up on our side.
                let _ = sock.set_linger(Some(Duration::ZERO));
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                s.kind = SampleKind::Refused;
                s.rtt_us = Some((t1 - t0) as f64 / 1000.0);
                s.from = Some(opts.target.ip());
            }
            Err(e)
                if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock => {
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("connect to {}: {e}", opts.target),
                ));
            }
        }
        drop(sock);
        on_sample(&s);
        out.push(s);
    }
    Ok((out, source))
}

/// `connect()` with a timeout that also returns (as `TimedOut`) soon after `stop` is set, so
/// Ctrl-C does not wait out a long `--timeout` on a silent target.
fn connect_until(
    sock: &Socket,
    target: SocketAddr,
    timeout: Duration,
    stop: &AtomicBool,
    source: &mut SocketAddr,
) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    let started = sock.connect(&target.into());
    // The kernel has picked our address and port now; a refused or silent probe still
    // reports where it came from.
    if let Some(a) = sock.local_addr().ok().and_then(|a| a.as_socket())
        && a.port() != 0
    {
        *source = a;
    }
    match started {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let deadline = net::mono_ns() + timeout.as_nanos() as u64;
    loop {
        let now = net::mono_ns();
        if now >= deadline || stop.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let slice_ms = ((deadline - now).div_ceil(1_000_000)).min(100) as i32;
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(sock),
            events: libc::POLLOUT,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, slice_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if rc > 0 {
            return match sock.take_error()? {
                Some(e) => Err(e),
                None => Ok(()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Behaviour, SimNet};

    fn opts(count: u32) -> PingOptions {
        let mut o = PingOptions::new("10.9.0.2:80".parse().unwrap());
        o.count = count;
        o.interval = Duration::from_millis(10);
        o.timeout = Duration::from_millis(100);
        o
    }

    #[test]
    fn replies_become_samples_with_rtts_and_losses() {
        let o = opts(5);
        let mut net = SimNet::new(
            &o,
            Behaviour::Target {
                rtt_us: 250,
                rst: false,
                drop_every: 2,
            },
        );
        let flow = net.flow;
        let mut seen = Vec::new();
        let samples = run_probes(&mut net, &flow, &o, &AtomicBool::new(false), &mut |s| {
            seen.push(s.seq)
        })
        .unwrap();
        assert_eq!(samples.len(), 5);
        let kinds: Vec<_> = samples.iter().map(|s| s.kind).collect();
        // Probes 1 and 3 (every 2nd) are dropped by the simulation.
        assert_eq!(
            kinds,
            [
                SampleKind::SynAck,
                SampleKind::Lost,
                SampleKind::SynAck,
                SampleKind::Lost,
                SampleKind::SynAck
            ]
        );
        assert_eq!(samples[0].rtt_us, Some(250.0));
        assert_eq!(samples[0].flags.as_deref(), Some("SA"));
        assert_eq!(samples[2].sent_at_us, 20_000.0);
        let st = PingStats::of(&samples);
        assert_eq!((st.sent, st.received), (5, 3));
        assert!((st.loss_pct - 40.0).abs() < 1e-9);
        assert_eq!(st.rtt.avg_us, 250.0);
        // Timeouts surface after their timeout, replies as they come: order differs from seq.
        assert_eq!(seen.len(), 5);
        assert_eq!(seen[0], 0);
    }

    #[test]
    fn rst_is_a_sample_and_silence_is_all_lost_within_the_timeout() {
        let o = opts(3);
        let mut net = SimNet::new(
            &o,
            Behaviour::Target {
                rtt_us: 90,
                rst: true,
                drop_every: 0,
            },
        );
        let flow = net.flow;
        let s = run_probes(&mut net, &flow, &o, &AtomicBool::new(false), &mut |_| {}).unwrap();
        assert!(
            s.iter()
                .all(|s| s.kind == SampleKind::Rst && s.flags.as_deref() == Some("RA"))
        );

        let mut net = SimNet::new(&o, Behaviour::Silent);
        let s = run_probes(&mut net, &flow, &o, &AtomicBool::new(false), &mut |_| {}).unwrap();
        assert_eq!(PingStats::of(&s).loss_pct, 100.0);
        // Last probe at 20 ms + 100 ms timeout: the run ends then, not later.
        assert!(
            net.now <= 1_000_000_000 + 121_000_000,
            "ended at {} ns",
            net.now
        );
    }

    #[test]
    fn more_probes_than_ids_in_flight_lose_no_sample() {
        // A short interval with a long timeout: more probes than there are ids are in flight.
        let mut o = opts(u32::from(MAX_ID) + 100);
        o.interval = Duration::ZERO;
        o.timeout = Duration::from_millis(100);
        let mut net = SimNet::new(&o, Behaviour::Silent);
        let flow = net.flow;
        let mut seen = 0u32;
        let s = run_probes(&mut net, &flow, &o, &AtomicBool::new(false), &mut |_| {
            seen += 1
        })
        .unwrap();
        assert_eq!(s.len() as u32, o.count, "every probe has a sample");
        assert_eq!(seen, o.count);
        assert!(s.iter().enumerate().all(|(i, s)| s.seq as usize == i));
        assert_eq!(PingStats::of(&s).sent, u64::from(o.count));
    }

    #[test]
    fn stop_flag_ends_the_run() {
        let o = opts(1000);
        let mut net = SimNet::new(
            &o,
            Behaviour::Target {
                rtt_us: 100,
                rst: false,
                drop_every: 0,
            },
        );
        let flow = net.flow;
        let stop = AtomicBool::new(false);
        let mut n = 0;
        let s = run_probes(&mut net, &flow, &o, &stop, &mut |_| {
            n += 1;
            if n == 3 {
                stop.store(true, Ordering::Relaxed);
            }
        })
        .unwrap();
        assert!(s.len() <= 4, "{}", s.len());
    }

    #[test]
    fn connect_mode_stops_soon_after_the_stop_flag_during_a_long_timeout() {
        // A listener whose backlog is full and that never accepts: further SYNs go
        // unanswered, so connect() waits out its timeout.
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        l.listen(0).unwrap();
        let addr = l.local_addr().unwrap().as_socket().unwrap();
        let mut fill = Vec::new();
        for _ in 0..4 {
            let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            s.set_nonblocking(true).unwrap();
            let _ = s.connect(&addr.into());
            fill.push(s);
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut o = PingOptions::new(addr);
        o.mode = PingMode::Connect;
        o.count = 3;
        o.timeout = Duration::from_secs(60);
        let stop = AtomicBool::new(false);
        let t0 = std::time::Instant::now();
        let (s, _) = std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                stop.store(true, Ordering::Relaxed);
            });
            run_connect(&o, &stop, &mut |_| {}).unwrap()
        });
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "took {:?} with a 60 s timeout",
            t0.elapsed()
        );
        // As in SYN mode, the probe in flight at the stop counts as sent and lost.
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].kind, SampleKind::Lost);
    }

    #[test]
    fn connect_mode_times_a_real_loopback_handshake_and_a_refusal() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut o = PingOptions::new(l.local_addr().unwrap());
        o.mode = PingMode::Connect;
        o.count = 2;
        o.interval = Duration::from_millis(5);
        let (s, src) = run_connect(&o, &AtomicBool::new(false), &mut |_| {}).unwrap();
        assert!(
            s.iter()
                .all(|s| s.kind == SampleKind::Connected && s.rtt_us.unwrap() > 0.0)
        );
        assert!(src.ip().is_loopback());
        let port = l.local_addr().unwrap().port();
        drop(l);
        o.target.set_port(port);
        let (s, src) = run_connect(&o, &AtomicBool::new(false), &mut |_| {}).unwrap();
        assert!(s.iter().all(|s| s.kind == SampleKind::Refused), "{s:?}");
        // Refused probes still say where they came from (it read 0.0.0.0:0).
        assert!(src.ip().is_loopback() && src.port() != 0, "{src}");
    }
}
