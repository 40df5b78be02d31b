//! The one JSON contract every `--json` follows.
//!
//! - The top level carries [`SCHEMA_VERSION`] as `schema_version` and the subcommand's name as
//!   `command` ([`Envelope`]).
//! - Durations are whole microseconds in fields named `*_us` (unsigned integers); times
//!   relative to a start are `*_us` too. The one exception is the probe RTTs of `ping` and
//!   `route` (and the times derived from them), which keep the kernel clocks' nanosecond
//!   resolution as fractional `*_us` numbers.
//! - Shares are 0–1 floats named `*share`.
//! - A target is [`Target`]: `{url?, host, addr, port}`.
//! - Probe modes are [`ProbeMode`]: `tcp-syn`, `tcp-connect`, `udp`, `icmp`.
//! - A latency distribution is a [`LatencySummary`].
//!
//! Any change to a report's JSON bumps [`SCHEMA_VERSION`] and gets a `CHANGELOG.md` entry; the
//! committed `schemas/*.schema.json` files are generated from these types and checked by a test.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Version of the JSON contract of every command's `--json`; bumped on incompatible changes.
pub const SCHEMA_VERSION: u32 = 2;

/// A command's JSON document: `schema_version`, `command`, then the report's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope<T> {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The subcommand that wrote it (`ping`, `load`, ...).
    pub command: String,
    /// The report.
    #[serde(flatten)]
    pub report: T,
}

impl<T> Envelope<T> {
    /// Wraps `report` as the output of `command` at the current [`SCHEMA_VERSION`].
    pub fn new(command: &str, report: T) -> Envelope<T> {
        Envelope {
            schema_version: SCHEMA_VERSION,
            command: command.to_owned(),
            report,
        }
    }
}

/// What a command ran against.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Target {
    /// The URL as given, for commands that take one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The host as given (name or address).
    pub host: String,
    /// The address it resolved to.
    pub addr: String,
    /// The port (0 where the probe has none, e.g. ICMP).
    pub port: u16,
}

/// How a probe reaches its target: one vocabulary for `ping`, `route` and `diagnose`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeMode {
    /// A TCP SYN from a raw socket (the answer is a SYN-ACK or RST).
    TcpSyn,
    /// A timed `connect()` (unprivileged; completes the handshake).
    TcpConnect,
    /// A UDP datagram to a closed port (the answer is ICMP port unreachable).
    Udp,
    /// An ICMP echo request.
    Icmp,
}

impl ProbeMode {
    /// The stable string (`tcp-syn`, ...).
    pub fn code(self) -> &'static str {
        match self {
            ProbeMode::TcpSyn => "tcp-syn",
            ProbeMode::TcpConnect => "tcp-connect",
            ProbeMode::Udp => "udp",
            ProbeMode::Icmp => "icmp",
        }
    }
}

/// A latency distribution, whole microseconds. All zero when `count` is 0.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct LatencySummary {
    /// Number of values.
    pub count: u64,
    /// Smallest.
    pub min_us: u64,
    /// Mean.
    pub mean_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
}

/// A share in percent (0–100) as a 0–1 share.
pub fn share_of_percent(pct: f64) -> f64 {
    pct / 100.0
}
