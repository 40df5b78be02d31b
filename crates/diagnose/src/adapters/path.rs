//! Layer 1: `lagtrace_probe` ping and route reports → `PathEvidence` parts.

use lagtrace_probe::{PingMode, PingReport, RouteReport, SampleKind};

use crate::evidence::{Hop, RttStats};

/// The RTT statistics of a ping run (RST replies count: they measure the path too).
pub fn rtt_stats(r: &PingReport) -> RttStats {
    let rtts: Vec<u64> = r
        .samples
        .iter()
        .filter(|s| s.kind.is_reply())
        .filter_map(|s| s.rtt_us)
        .map(|us| us.round().max(0.0) as u64)
        .collect();
    let rst = r
        .samples
        .iter()
        .filter(|s| matches!(s.kind, SampleKind::Rst | SampleKind::Refused))
        .count() as u32;
    RttStats::from_samples(r.samples.len() as u32, rst, &rtts)
}

/// Whether any probe found the port open (SYN-ACK, or a completed connect).
pub fn port_open(r: &PingReport) -> bool {
    r.samples
        .iter()
        .any(|s| matches!(s.kind, SampleKind::SynAck | SampleKind::Connected))
}

/// Whether the host answered at all.
pub fn reached(r: &PingReport) -> bool {
    r.samples.iter().any(|s| s.kind.is_reply())
}

/// The probe mode, in the contract's vocabulary (`tcp-syn`, `tcp-connect`, ...).
pub fn method(r: &PingReport) -> String {
    match r.mode {
        PingMode::Syn => "tcp-syn",
        PingMode::Connect => "tcp-connect",
        PingMode::Udp => "udp",
        PingMode::Icmp => "icmp",
    }
    .into()
}

/// Hops away, from the TTL of the target's replies (initial TTLs 64, 128, 255).
pub fn hops_away(r: &PingReport) -> Option<u8> {
    let ttl = r
        .samples
        .iter()
        .filter(|s| s.kind.is_reply())
        .find_map(|s| s.ttl)?;
    [64u8, 128, 255]
        .into_iter()
        .find(|i| *i >= ttl)
        .map(|i| i - ttl)
}

/// The hops of a trace.
pub fn hops(r: &RouteReport) -> Vec<Hop> {
    r.hops
        .iter()
        .map(|h| Hop {
            ttl: h.ttl,
            addr: h.addrs.first().map(|a| a.to_string()),
            rtt_us: (h.stats.received > 0).then(|| h.stats.rtt.p50_us.round() as u64),
        })
        .collect()
}
