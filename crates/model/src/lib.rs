//! Plain data at the centre of lagtrace: cause codes, small value types, and every type a
//! command outputs (its `--json` report), under one JSON contract ([`contract`]).
//!
//! Everything here is `serde`-serializable, documented, and free of I/O. Engines compute
//! their own state and turn it into these report types; renderers (`lagtrace-report`, the
//! CLI) read only these.
#![deny(missing_docs)]

pub mod analyze;
pub mod contract;
pub mod diagnosis;
pub mod finding;
pub mod host;
pub mod load;
pub mod probe;

pub use contract::{Envelope, LatencySummary, ProbeMode, SCHEMA_VERSION, Target};
pub use finding::FindingKind;

use serde::{Deserialize, Serialize};
use std::fmt;

mod privilege;
pub use privilege::{Capability, Privilege};
pub mod request;
pub use request::{RequestError, RequestRecord, RequestRecords};

/// The stable cause codes of `../shared/DESIGN.md`. JSON uses the kebab-case strings.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// No latency problem beyond the path RTT and a normal server time.
    Healthy,
    /// A sender's Nagle holds a small segment until the peer's delayed ACK (~40 ms).
    NagleDelayedAck,
    /// The server's own time between request and response dominates.
    SlowServer,
    /// Retransmissions (RTO or fast) inflate latency.
    PacketLoss,
    /// Output held by TCP_CORK until its 200 ms ceiling.
    TcpCork,
    /// RTT rises under load: a queue on the path (bufferbloat, shaping).
    PathQueueing,
    /// Connection setup waits for SYN retransmits (accept queue overflow, SYN drops).
    SynDrop,
    /// The receiver's window (zero or small) holds the sender back.
    ReceiveWindow,
    /// The kernel's own packet processing on the server's host costs the time: every
    /// packet walks a long netfilter chain, or the receive softirq is saturated.
    KernelStack,
    /// No connection can be made; the path evidence says where it stops.
    Unreachable,
    /// The slowest requests wait far longer than the path and scheduling explain, and no
    /// layer shows what for.
    UnexplainedTail,
    /// The run was interrupted before every layer measured: no cause is claimed; the
    /// layers show what was measured.
    Partial,
}

impl Cause {
    /// Every cause, in the order of DESIGN.md.
    pub const ALL: [Cause; 12] = [
        Cause::Healthy,
        Cause::NagleDelayedAck,
        Cause::SlowServer,
        Cause::PacketLoss,
        Cause::TcpCork,
        Cause::PathQueueing,
        Cause::SynDrop,
        Cause::ReceiveWindow,
        Cause::KernelStack,
        Cause::Unreachable,
        Cause::UnexplainedTail,
        Cause::Partial,
    ];

    /// The stable string code (`nagle-delayed-ack`, ...).
    pub fn code(self) -> &'static str {
        match self {
            Cause::Healthy => "healthy",
            Cause::NagleDelayedAck => "nagle-delayed-ack",
            Cause::SlowServer => "slow-server",
            Cause::PacketLoss => "packet-loss",
            Cause::TcpCork => "tcp-cork",
            Cause::PathQueueing => "path-queueing",
            Cause::SynDrop => "syn-drop",
            Cause::ReceiveWindow => "receive-window",
            Cause::KernelStack => "kernel-stack",
            Cause::Unreachable => "unreachable",
            Cause::UnexplainedTail => "unexplained-tail",
            Cause::Partial => "partial",
        }
    }

    /// Parses a stable code back into a cause.
    pub fn from_code(s: &str) -> Option<Cause> {
        Cause::ALL.into_iter().find(|c| c.code() == s)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A duration in whole microseconds, the unit every lagtrace engine reports in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Micros(pub u64);

impl Micros {
    /// Converts a `std::time::Duration`, saturating.
    pub fn from_duration(d: std::time::Duration) -> Micros {
        Micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
    /// As milliseconds, for rendering.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl fmt::Display for Micros {
    /// Human form with a unit chosen for the magnitude: `850µs`, `41.2ms`, `1.50s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = self.0;
        if us < 1_000 {
            write!(f, "{us}µs")
        } else if us < 999_995 {
            // From 999.995 ms the two decimals would read "1000.00ms": seconds.
            write!(f, "{:.2}ms", us as f64 / 1e3)
        } else {
            write!(f, "{:.2}s", us as f64 / 1e6)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_change_unit_where_the_rounding_would_reach_the_next() {
        let t = |us| Micros(us).to_string();
        assert_eq!(t(999), "999µs");
        assert_eq!(t(1_000), "1.00ms");
        assert_eq!(t(999_994), "999.99ms");
        assert_eq!(t(999_995), "1.00s");
        assert_eq!(t(1_500_000), "1.50s");
    }

    #[test]
    fn cause_codes_round_trip_through_json_and_strings() {
        for c in Cause::ALL {
            let j = serde_json::to_string(&c).unwrap();
            assert_eq!(j, format!("\"{}\"", c.code()));
            assert_eq!(serde_json::from_str::<Cause>(&j).unwrap(), c);
            assert_eq!(Cause::from_code(c.code()), Some(c));
        }
        assert_eq!(Cause::from_code("nagle"), None);
    }

    #[test]
    fn micros_render_with_a_fitting_unit() {
        assert_eq!(Micros(850).to_string(), "850µs");
        assert_eq!(Micros(41_230).to_string(), "41.23ms");
        assert_eq!(Micros(1_500_000).to_string(), "1.50s");
    }
}
