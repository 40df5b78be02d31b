//! `route`: every TTL in flight at once, replies matched by probe identity.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::net::Network;
use crate::ping::probe_id;
use crate::stats::{RttStats, loss_pct};
use crate::wire::{self, Answer, Flow, IcmpError, Proto};

/// What `route` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteOptions {
    /// Target address.
    pub target: IpAddr,
    /// Probe protocol.
    pub proto: Proto,
    /// Destination port (TCP, UDP).
    pub port: u16,
    /// Probes per hop per round.
    pub queries: u8,
    /// Highest TTL.
    pub max_ttl: u8,
    /// How long to wait for replies after the last probe of a round.
    pub timeout: Duration,
    /// Rounds (1 for a plain trace; N for `--report N`).
    pub rounds: u32,
    /// Time between the starts of rounds (report mode).
    pub round_interval: Duration,
}

impl RouteOptions {
    /// Defaults: TCP SYN to port 80, 3 queries, 30 hops, 1 s timeout, 1 round.
    pub fn new(target: IpAddr) -> RouteOptions {
        RouteOptions {
            target,
            proto: Proto::Tcp,
            port: 80,
            queries: 3,
            max_ttl: 30,
            timeout: Duration::from_secs(1),
            rounds: 1,
            round_interval: Duration::from_secs(1),
        }
    }
}

/// How a hop answered one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HopReply {
    /// ICMP time exceeded: a router.
    TimeExceeded,
    /// The target's own answer (SYN-ACK, RST, echo reply, port unreachable).
    Target,
    /// Another ICMP destination unreachable (code in `code`): the path stops here.
    Unreachable,
    /// Nothing within the timeout.
    Silent,
}

/// One probe at one hop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HopProbe {
    /// Round, from 0.
    pub round: u32,
    /// What came back.
    pub reply: HopReply,
    /// Who answered.
    pub from: Option<IpAddr>,
    /// RTT in µs.
    pub rtt_us: Option<f64>,
    /// ICMP code for unreachables, TCP flags byte for target TCP answers.
    pub code: Option<u8>,
}

/// Per-hop totals (mtr's columns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HopStats {
    /// Probes sent.
    pub sent: u64,
    /// Probes answered.
    pub received: u64,
    /// Loss, percent.
    pub loss_pct: f64,
    /// RTTs (last, avg, best = min, worst = max, stdev = mdev).
    pub rtt: RttStats,
}

/// One TTL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// TTL of the probes.
    pub ttl: u8,
    /// Distinct responders, in order of first reply.
    pub addrs: Vec<IpAddr>,
    /// Every probe at this TTL, in send order.
    pub probes: Vec<HopProbe>,
    /// Totals.
    pub stats: HopStats,
}

/// The result of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteReport {
    /// Target.
    pub target: IpAddr,
    /// Our source address.
    pub source: IpAddr,
    /// Probe protocol.
    pub proto: Proto,
    /// Destination port (TCP/UDP).
    pub port: u16,
    /// Our source port (constant for the whole trace: one flow, Paris style).
    pub source_port: u16,
    /// Rounds run.
    pub rounds: u32,
    /// Where times come from.
    pub timestamp_source: String,
    /// Hops 1..=N, stopping at the target when it answered.
    pub hops: Vec<Hop>,
    /// Whether the target answered.
    pub reached: bool,
}

struct Pending {
    ttl: u8,
    round: u32,
    sent_ns: u64,
    slot: usize,
}

/// How long a wait for replies runs before it looks at the stop flag again.
const STOP_CHECK_NS: u64 = 50_000_000;

/// [`Network::recv`] until `deadline_ns`, in slices that look at `stop` in between: `None`
/// at the deadline or once `stop` is set.
fn recv_or_stop<N: Network>(
    net: &mut N,
    deadline_ns: u64,
    stop: &AtomicBool,
) -> io::Result<Option<crate::net::Received>> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let slice = deadline_ns.min(net.now_ns().saturating_add(STOP_CHECK_NS));
        match net.recv(slice)? {
            Some(rx) => return Ok(Some(rx)),
            None if slice >= deadline_ns => return Ok(None),
            None => {}
        }
    }
}

/// The trace engine over any [`Network`]. Returns hops 1..=last (the target's TTL if reached).
/// Once `stop` is set (Ctrl-C) it stops within [`STOP_CHECK_NS`] and returns what it has:
/// probes still unanswered stay silent.
pub fn run_trace<N: Network>(
    net: &mut N,
    flow: &Flow,
    opts: &RouteOptions,
    stop: &AtomicBool,
) -> io::Result<(Vec<Hop>, bool)> {
    let timeout = opts.timeout.as_nanos() as u64;
    let mut probes: Vec<Vec<HopProbe>> = vec![Vec::new(); usize::from(opts.max_ttl)];
    let mut target_ttl: Option<u8> = None;
    let mut n: u64 = 0;
    let start = net.now_ns();
    for round in 0..opts.rounds {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if round > 0 {
            let due = start + u64::from(round) * opts.round_interval.as_nanos() as u64;
            while net.now_ns() < due && !stop.load(Ordering::Relaxed) {
                // Drain late replies while waiting; they do not count any more.
                let _ = recv_or_stop(net, due, stop)?;
            }
        }
        let max = target_ttl.unwrap_or(opts.max_ttl);
        let mut pending: HashMap<u16, Pending> = HashMap::new();
        let mut last_sent = 0;
        // All queries of a TTL back to back, TTLs ascending: the target's own answers (and
        // its ICMP rate limit tokens) go to the lowest TTLs that reach it first.
        for ttl in 1..=max {
            // On a short path the target may already have answered a lower TTL: probes
            // beyond it would only spend its ICMP error budget (and others' traces' share).
            while let Some(rx) = net.recv(0)? {
                take_reply(
                    flow,
                    &rx,
                    timeout,
                    &mut pending,
                    &mut probes,
                    &mut target_ttl,
                );
            }
            if target_ttl.is_some_and(|t| ttl > t) {
                break;
            }
            for _ in 0..opts.queries {
                let id = probe_id(n);
                n += 1;
                let pkt = wire::build_probe(flow, id);
                let t = net.send(ttl, &pkt)?;
                last_sent = t;
                let list = &mut probes[usize::from(ttl) - 1];
                list.push(HopProbe {
                    round,
                    reply: HopReply::Silent,
                    from: None,
                    rtt_us: None,
                    code: None,
                });
                pending.insert(
                    id,
                    Pending {
                        ttl,
                        round,
                        sent_ns: t,
                        slot: list.len() - 1,
                    },
                );
            }
        }
        let deadline = last_sent + timeout;
        loop {
            // Done when every probe up to the target's TTL has an answer.
            if let Some(tt) = target_ttl
                && !pending.values().any(|p| p.ttl <= tt)
            {
                break;
            }
            if pending.is_empty() {
                break;
            }
            let Some(rx) = recv_or_stop(net, deadline, stop)? else {
                break;
            };
            take_reply(
                flow,
                &rx,
                timeout,
                &mut pending,
                &mut probes,
                &mut target_ttl,
            );
        }
    }
    let reached = probes.iter().flatten().any(|p| p.reply == HopReply::Target);
    let last = target_ttl.unwrap_or(opts.max_ttl);
    let hops = probes
        .into_iter()
        .take(usize::from(last))
        .enumerate()
        .map(|(i, probes)| hop_of(i as u8 + 1, probes))
        .collect();
    Ok((hops, reached))
}

/// Files a received packet under the probe it answers (if any); notes the target's TTL.
fn take_reply(
    flow: &Flow,
    rx: &crate::net::Received,
    timeout: u64,
    pending: &mut HashMap<u16, Pending>,
    probes: &mut [Vec<HopProbe>],
    target_ttl: &mut Option<u8>,
) {
    let Some((id, answer)) = wire::match_reply(flow, &rx.reply) else {
        return;
    };
    let Some(p) = pending.remove(&id) else {
        return;
    };
    let rtt_ns = rx.at_ns.saturating_sub(p.sent_ns);
    if rtt_ns > timeout {
        return;
    }
    let from = rx.reply.from;
    let (reply, code) = match answer {
        Answer::Tcp { flags, .. } => (HopReply::Target, Some(flags)),
        Answer::Echo => (HopReply::Target, None),
        Answer::Error(IcmpError::TimeExceeded, _) => (HopReply::TimeExceeded, None),
        Answer::Error(IcmpError::PortUnreachable, c) if from == flow.dst => {
            (HopReply::Target, Some(c))
        }
        Answer::Error(_, c) => (HopReply::Unreachable, Some(c)),
    };
    if matches!(reply, HopReply::Target | HopReply::Unreachable) {
        *target_ttl = Some(target_ttl.map_or(p.ttl, |t| t.min(p.ttl)));
    }
    let slot = &mut probes[usize::from(p.ttl) - 1][p.slot];
    debug_assert_eq!(slot.round, p.round);
    *slot = HopProbe {
        round: p.round,
        reply,
        from: Some(from),
        rtt_us: Some(rtt_ns as f64 / 1000.0),
        code,
    };
}

fn hop_of(ttl: u8, probes: Vec<HopProbe>) -> Hop {
    let mut addrs: Vec<IpAddr> = Vec::new();
    for a in probes.iter().filter_map(|p| p.from) {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    let rtts: Vec<f64> = probes.iter().filter_map(|p| p.rtt_us).collect();
    let sent = probes.len() as u64;
    let received = rtts.len() as u64;
    Hop {
        ttl,
        addrs,
        stats: HopStats {
            sent,
            received,
            loss_pct: loss_pct(sent, received),
            rtt: RttStats::of(&rtts),
        },
        probes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Behaviour, SimNet};

    fn flow(proto: Proto) -> Flow {
        Flow {
            proto,
            src: "10.9.0.1".parse().unwrap(),
            dst: "10.9.3.2".parse().unwrap(),
            sport: 40000,
            dport: 80,
            seq_base: 0x5000_0000,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn all_hops_in_one_timeout_with_a_silent_router() {
        for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
            let f = flow(proto);
            let mut net = SimNet::with_flow(
                f,
                Behaviour::Path {
                    routers: vec![Some(ip("10.9.1.1")), None],
                },
            );
            let mut o = RouteOptions::new(f.dst);
            o.proto = proto;
            let (hops, reached) = run_trace(&mut net, &f, &o, &AtomicBool::new(false)).unwrap();
            assert!(reached, "{proto:?}");
            assert_eq!(hops.len(), 3);
            assert_eq!(hops[0].addrs, [ip("10.9.1.1")]);
            assert!(hops[1].addrs.is_empty());
            assert_eq!(hops[1].stats.loss_pct, 100.0);
            assert_eq!(hops[2].addrs, [f.dst]);
            assert_eq!(hops[2].probes.len(), 3);
            assert_eq!(hops[2].stats.rtt.avg_us, 300.0);
            // 90 probes sent back to back, one flow: same ports, ids differ.
            assert_eq!(net.sent.len(), 90);
            let ports: Vec<_> = net.sent.iter().map(|(_, p)| p[..4].to_vec()).collect();
            if proto != Proto::Icmp {
                assert!(ports.iter().all(|p| *p == ports[0]));
            }
            // Waited for hop 2 once: about one timeout in all.
            assert!(net.now < 1_000_000_000 + 1_010_000_000, "{}", net.now);
        }
    }

    #[test]
    fn report_rounds_only_probe_up_to_the_target() {
        let f = flow(Proto::Tcp);
        let mut net = SimNet::with_flow(
            f,
            Behaviour::Path {
                routers: vec![Some(ip("10.9.1.1"))],
            },
        );
        let mut o = RouteOptions::new(f.dst);
        o.queries = 1;
        o.rounds = 4;
        let (hops, reached) = run_trace(&mut net, &f, &o, &AtomicBool::new(false)).unwrap();
        assert!(reached);
        assert_eq!(hops.len(), 2);
        assert_eq!(hops[0].stats.sent, 4);
        assert_eq!(hops[0].stats.received, 4);
        assert_eq!(hops[1].stats.rtt.min_us, 200.0);
        // Round 1: 30 probes; rounds 2-4: 2 each.
        assert_eq!(net.sent.len(), 36);
    }

    #[test]
    fn sending_stops_past_a_target_that_already_answered() {
        let f = flow(Proto::Udp);
        let mut net = SimNet::with_flow(
            f,
            Behaviour::Path {
                routers: vec![Some(ip("10.9.1.1"))],
            },
        );
        // 50 µs per send: the target (hop 2, 200 µs away) answers while TTL 2-3 go out.
        net.send_cost_ns = 50_000;
        let (hops, reached) = run_trace(
            &mut net,
            &f,
            &RouteOptions::new(f.dst),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert!(reached);
        assert_eq!(hops.len(), 2);
        assert!(hops.iter().all(|h| h.stats.received == 3));
        assert!(
            net.sent.len() < 15,
            "sent {} probes for a 2-hop path",
            net.sent.len()
        );
    }

    #[test]
    fn unreachable_target_lists_all_ttls_silent() {
        let f = flow(Proto::Tcp);
        let mut net = SimNet::with_flow(f, Behaviour::Silent);
        let mut o = RouteOptions::new(f.dst);
        o.max_ttl = 5;
        o.timeout = Duration::from_millis(200);
        let (hops, reached) = run_trace(&mut net, &f, &o, &AtomicBool::new(false)).unwrap();
        assert!(!reached);
        assert_eq!(hops.len(), 5);
        assert!(hops.iter().all(|h| h.stats.received == 0));
    }

    /// A network whose clock sets the stop flag (a Ctrl-C) once it passes `at_ns`.
    struct StopAt<'a> {
        net: SimNet,
        at_ns: u64,
        stop: &'a AtomicBool,
    }

    impl Network for StopAt<'_> {
        fn send(&mut self, ttl: u8, probe: &[u8]) -> io::Result<u64> {
            self.net.send(ttl, probe)
        }
        fn recv(&mut self, deadline_ns: u64) -> io::Result<Option<crate::net::Received>> {
            let r = self.net.recv(deadline_ns);
            if self.net.now_ns() >= self.at_ns {
                self.stop.store(true, Ordering::Relaxed);
            }
            r
        }
        fn now_ns(&self) -> u64 {
            self.net.now_ns()
        }
    }

    #[test]
    fn a_stop_ends_the_wait_for_silent_hops_within_one_check() {
        let f = flow(Proto::Tcp);
        let stop = AtomicBool::new(false);
        let net = SimNet::with_flow(f, Behaviour::Silent);
        let t0 = net.now_ns();
        let mut net = StopAt {
            net,
            at_ns: t0 + 100_000_000,
            stop: &stop,
        };
        let mut o = RouteOptions::new(f.dst);
        o.max_ttl = 5;
        o.rounds = 3;
        let (hops, reached) = run_trace(&mut net, &f, &o, &stop).unwrap();
        assert!(!reached);
        assert!(hops.iter().all(|h| h.stats.received == 0));
        // Stopped 100 ms in, not after the 1 s timeout and two more rounds.
        let waited = net.now_ns() - t0;
        assert!(waited <= 100_000_000 + STOP_CHECK_NS, "{waited}");
        assert_eq!(net.net.sent.len(), 15, "one round only");
        // Set before the start: nothing is sent.
        let mut net = SimNet::with_flow(f, Behaviour::Silent);
        let (hops, _) = run_trace(&mut net, &f, &o, &AtomicBool::new(true)).unwrap();
        assert!(net.sent.is_empty());
        assert_eq!(hops.len(), 5);
    }
}
