//! `lagtrace ping --json` and `lagtrace route --json`.
//!
//! Probe RTTs keep the kernel clocks' nanosecond resolution: they are fractional `*_us`
//! numbers, the one exception to the contract's integer microseconds.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ProbeMode, Target};

/// Summary of a set of probe RTTs, fractional µs. All zero when there are none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RttStats {
    /// Number of RTT samples.
    pub n: usize,
    /// Smallest.
    pub min_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Largest.
    pub max_us: f64,
    /// Standard deviation (ping's "mdev").
    pub mdev_us: f64,
    /// Sample standard deviation (n − 1; mtr's "StDev").
    pub stdev_us: f64,
    /// 10th percentile (nearest rank).
    pub p10_us: f64,
    /// Median (nearest rank).
    pub p50_us: f64,
    /// 90th percentile (nearest rank).
    pub p90_us: f64,
    /// Most recent sample.
    pub last_us: f64,
}

/// What answered a probe (or that nothing did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    /// An ICMP error from elsewhere: not a target reply.
    IcmpError,
    /// No reply within the timeout.
    Lost,
}

/// What kind of ICMP error came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum IcmpError {
    /// Time exceeded in transit (a router on the path).
    TimeExceeded,
    /// Destination unreachable, port.
    PortUnreachable,
    /// Any other destination unreachable.
    Unreachable,
}

/// One ping probe and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sample {
    /// Probe number, from 0.
    pub seq: u32,
    /// Outcome.
    pub kind: SampleKind,
    /// Round-trip time (fractional µs), absent when lost.
    pub rtt_us: Option<f64>,
    /// When the probe was sent, µs since the first probe (fractional).
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
    /// Which ICMP error, for ICMP error and port-unreachable samples.
    pub icmp_error: Option<IcmpError>,
    /// Whether the send time is the kernel's TX timestamp.
    pub tx_kernel_ts: Option<bool>,
    /// Whether the receive time is the kernel's RX timestamp.
    pub rx_kernel_ts: Option<bool>,
}

/// Totals of a ping run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PingStats {
    /// Probes sent.
    pub sent: u64,
    /// Replies from the target.
    pub received: u64,
    /// Share of probes without a reply, 0–1.
    pub loss_share: f64,
    /// RTT summary of the replies.
    pub rtt: RttStats,
}

/// What `lagtrace ping --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PingReport {
    /// Target.
    pub target: Target,
    /// Our source address and port (`addr:port`).
    pub source: String,
    /// The mode actually used.
    pub mode: ProbeMode,
    /// Where send and receive times come from.
    pub timestamp_source: String,
    /// Why the mode differs from the one asked for, if it does.
    pub note: Option<String>,
    /// Every probe, in send order.
    pub samples: Vec<Sample>,
    /// Totals.
    pub stats: PingStats,
}

/// What came back for a route probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum HopReply {
    /// ICMP time exceeded: a router.
    TimeExceeded,
    /// The target's own answer.
    Target,
    /// Another ICMP destination unreachable: the path stops here.
    Unreachable,
    /// Nothing within the timeout.
    Silent,
}

/// One probe at one hop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HopProbe {
    /// Round, from 0.
    pub round: u32,
    /// What came back.
    pub reply: HopReply,
    /// Who answered.
    pub from: Option<IpAddr>,
    /// RTT (fractional µs).
    pub rtt_us: Option<f64>,
    /// ICMP code for unreachables, TCP flags byte for target TCP answers.
    pub code: Option<u8>,
}

/// Per-hop totals (mtr's columns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HopStats {
    /// Probes sent.
    pub sent: u64,
    /// Probes answered.
    pub received: u64,
    /// Share of probes without an answer, 0–1.
    pub loss_share: f64,
    /// RTTs.
    pub rtt: RttStats,
}

/// One TTL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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

/// What `lagtrace route --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RouteReport {
    /// Target (`port` 0 for ICMP).
    pub target: Target,
    /// Our source address.
    pub source: IpAddr,
    /// Probe mode.
    pub mode: ProbeMode,
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
