//! The engine's reports as the JSON reports of `lagtrace-model` (`ping --json`,
//! `route --json`).

use lagtrace_model::contract::share_of_percent;
use lagtrace_model::probe as m;
use lagtrace_model::{ProbeMode, Target};

use crate::wire::{IcmpError, Proto};
use crate::{HopReply, PingMode, PingReport, RouteReport, RttStats, SampleKind};

/// The contract's name for a ping mode.
pub fn ping_mode(mode: PingMode) -> ProbeMode {
    match mode {
        PingMode::Syn => ProbeMode::TcpSyn,
        PingMode::Connect => ProbeMode::TcpConnect,
        PingMode::Udp => ProbeMode::Udp,
        PingMode::Icmp => ProbeMode::Icmp,
    }
}

/// The contract's name for a route probe protocol (TCP probes are SYNs).
pub fn route_mode(proto: Proto) -> ProbeMode {
    match proto {
        Proto::Tcp => ProbeMode::TcpSyn,
        Proto::Udp => ProbeMode::Udp,
        Proto::Icmp => ProbeMode::Icmp,
    }
}

fn rtt(s: &RttStats) -> m::RttStats {
    m::RttStats {
        n: s.n,
        min_us: s.min_us,
        avg_us: s.avg_us,
        max_us: s.max_us,
        mdev_us: s.mdev_us,
        stdev_us: s.stdev_us,
        p10_us: s.p10_us,
        p50_us: s.p50_us,
        p90_us: s.p90_us,
        last_us: s.last_us,
    }
}

fn icmp_error(e: IcmpError) -> m::IcmpError {
    match e {
        IcmpError::TimeExceeded => m::IcmpError::TimeExceeded,
        IcmpError::PortUnreachable => m::IcmpError::PortUnreachable,
        IcmpError::Unreachable => m::IcmpError::Unreachable,
    }
}

fn sample_kind(k: SampleKind) -> m::SampleKind {
    match k {
        SampleKind::SynAck => m::SampleKind::SynAck,
        SampleKind::Rst => m::SampleKind::Rst,
        SampleKind::EchoReply => m::SampleKind::EchoReply,
        SampleKind::PortUnreachable => m::SampleKind::PortUnreachable,
        SampleKind::Connected => m::SampleKind::Connected,
        SampleKind::Refused => m::SampleKind::Refused,
        SampleKind::IcmpError => m::SampleKind::IcmpError,
        SampleKind::Lost => m::SampleKind::Lost,
    }
}

/// `ping --json`'s report; `host` is the target as the user typed it.
pub fn ping_report(r: &PingReport, host: &str) -> m::PingReport {
    m::PingReport {
        target: Target {
            url: None,
            host: host.to_owned(),
            addr: r.target.ip().to_string(),
            port: r.target.port(),
        },
        source: r.source.to_string(),
        mode: ping_mode(r.mode),
        timestamp_source: r.timestamp_source.clone(),
        note: r.note.clone(),
        samples: r
            .samples
            .iter()
            .map(|s| m::Sample {
                seq: s.seq,
                kind: sample_kind(s.kind),
                rtt_us: s.rtt_us,
                sent_at_us: s.sent_at_us,
                from: s.from,
                ttl: s.ttl,
                len: s.len,
                ip_id: s.ip_id,
                df: s.df,
                sport: s.sport,
                flags: s.flags.clone(),
                window: s.window,
                icmp_code: s.icmp_code,
                icmp_error: s.icmp_error.map(icmp_error),
                tx_kernel_ts: s.tx_kernel_ts,
                rx_kernel_ts: s.rx_kernel_ts,
            })
            .collect(),
        stats: m::PingStats {
            sent: r.stats.sent,
            received: r.stats.received,
            loss_share: share_of_percent(r.stats.loss_pct),
            rtt: rtt(&r.stats.rtt),
        },
    }
}

/// `route --json`'s report; `host` is the target as the user typed it.
pub fn route_report(r: &RouteReport, host: &str) -> m::RouteReport {
    m::RouteReport {
        target: Target {
            url: None,
            host: host.to_owned(),
            addr: r.target.to_string(),
            port: if r.proto == Proto::Icmp { 0 } else { r.port },
        },
        source: r.source,
        mode: route_mode(r.proto),
        source_port: r.source_port,
        rounds: r.rounds,
        timestamp_source: r.timestamp_source.clone(),
        hops: r
            .hops
            .iter()
            .map(|h| m::Hop {
                ttl: h.ttl,
                addrs: h.addrs.clone(),
                probes: h
                    .probes
                    .iter()
                    .map(|p| m::HopProbe {
                        round: p.round,
                        reply: match p.reply {
                            HopReply::TimeExceeded => m::HopReply::TimeExceeded,
                            HopReply::Target => m::HopReply::Target,
                            HopReply::Unreachable => m::HopReply::Unreachable,
                            HopReply::Silent => m::HopReply::Silent,
                        },
                        from: p.from,
                        rtt_us: p.rtt_us,
                        code: p.code,
                    })
                    .collect(),
                stats: m::HopStats {
                    sent: h.stats.sent,
                    received: h.stats.received,
                    loss_share: share_of_percent(h.stats.loss_pct),
                    rtt: rtt(&h.stats.rtt),
                },
            })
            .collect(),
        reached: r.reached,
    }
}
