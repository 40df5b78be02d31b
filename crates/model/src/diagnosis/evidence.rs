//! The evidence model: what each layer found, in the diagnose crate's own terms.
//!
//! Each layer's engine (probe, load, packet, sockets) has its own detailed report type; an
//! adapter per layer (see `adapters`) converts it into these plain structs, which is all the
//! verdict rules and the renderers ever see. Durations are whole microseconds (`*_us`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::finding::FindingKind;

/// The four layers of the method, in order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum LayerName {
    /// Layer 1: SYN RTT idle and under load, hops.
    Path,
    /// Layer 2: HTTP latency at c=1 and c=N.
    App,
    /// Layer 3: the TCP streams captured during the c=N run.
    Packets,
    /// Layer 4: the server's sockets and configuration; the client's own options.
    Sockets,
    /// Layer 5: the server host's kernel evidence during the c=N run (listen queues, cgroup
    /// CPU throttling, run-queue delay, counters, qdiscs).
    Host,
}

impl LayerName {
    /// All layers in the order the method runs them.
    pub const ALL: [LayerName; 5] = [
        LayerName::Path,
        LayerName::App,
        LayerName::Packets,
        LayerName::Sockets,
        LayerName::Host,
    ];
    /// The stable lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            LayerName::Path => "path",
            LayerName::App => "app",
            LayerName::Packets => "packets",
            LayerName::Sockets => "sockets",
            LayerName::Host => "host",
        }
    }
}

/// How a layer's run went. `ok` and `finding` carry data; the others say why in `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LayerStatus {
    /// Ran, nothing abnormal.
    Ok,
    /// Ran and found something the verdict uses (in a `partial` run, which claims no cause:
    /// what its data shows so far).
    Finding,
    /// Not run on purpose (e.g. the server is not on this machine).
    Skipped,
    /// The engine is not available (not built, missing privilege).
    Unavailable,
    /// The engine ran and failed.
    Error,
}

impl LayerStatus {
    /// The stable string.
    pub fn name(self) -> &'static str {
        match self {
            LayerStatus::Ok => "ok",
            LayerStatus::Finding => "finding",
            LayerStatus::Skipped => "skipped",
            LayerStatus::Unavailable => "unavailable",
            LayerStatus::Error => "error",
        }
    }
}

/// One layer's outcome: its status, why (when not `ok`), and its data when it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
// `data`'s `default` is `None`: no `T: Default` bound (the host report has no default).
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct Layer<T> {
    /// `ok`, `finding`, `skipped`, `unavailable` or `error`.
    pub status: LayerStatus,
    /// Why the layer was skipped, unavailable or failed; or a short note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the layer measured (absent when it did not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
}

impl<T> Layer<T> {
    /// A layer that ran; `status` is set later by the rules (`ok` until then).
    pub fn ran(data: T) -> Self {
        Layer {
            status: LayerStatus::Ok,
            reason: None,
            data: Some(data),
        }
    }
    /// A layer whose engine is not available, with the reason.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Layer {
            status: LayerStatus::Unavailable,
            reason: Some(reason.into()),
            data: None,
        }
    }
    /// A layer skipped on purpose, with the reason.
    pub fn skipped(reason: impl Into<String>) -> Self {
        Layer {
            status: LayerStatus::Skipped,
            reason: Some(reason.into()),
            data: None,
        }
    }
    /// A layer whose engine failed, with the error.
    pub fn error(reason: impl Into<String>) -> Self {
        Layer {
            status: LayerStatus::Error,
            reason: Some(reason.into()),
            data: None,
        }
    }
    /// The data, when the layer ran.
    pub fn get(&self) -> Option<&T> {
        self.data.as_ref()
    }
}

/// What was diagnosed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Target {
    /// The URL as given.
    pub url: String,
    /// Host part of the URL.
    pub host: String,
    /// The address it resolved to.
    pub addr: String,
    /// TCP port.
    pub port: u16,
}

/// RTT statistics of a series of probes (SYN ping).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct RttStats {
    /// Probes sent.
    pub sent: u32,
    /// Replies received (SYN-ACK or RST).
    pub received: u32,
    /// Replies that were RST (nothing listens on the port, but the host answers).
    #[serde(default)]
    pub rst: u32,
    /// Smallest RTT.
    pub min_us: u64,
    /// Median RTT.
    pub p50_us: u64,
    /// Mean RTT.
    pub avg_us: u64,
    /// 90th percentile RTT.
    pub p90_us: u64,
    /// Largest RTT.
    pub max_us: u64,
}

impl RttStats {
    /// Builds the statistics from samples (µs) and the number of probes sent.
    pub fn from_samples(sent: u32, rst: u32, samples: &[u64]) -> RttStats {
        let mut s = samples.to_vec();
        s.sort_unstable();
        let pick = |q: f64| -> u64 {
            if s.is_empty() {
                0
            } else {
                let i = ((s.len() - 1) as f64 * q).round() as usize;
                s[i.min(s.len() - 1)]
            }
        };
        RttStats {
            sent,
            received: s.len() as u32,
            rst,
            min_us: s.first().copied().unwrap_or(0),
            p50_us: pick(0.5),
            avg_us: if s.is_empty() {
                0
            } else {
                s.iter().sum::<u64>() / s.len() as u64
            },
            p90_us: pick(0.9),
            max_us: s.last().copied().unwrap_or(0),
        }
    }
    /// Share of probes that got no reply.
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            1.0 - f64::from(self.received) / f64::from(self.sent)
        }
    }
}

/// One hop of a route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hop {
    /// TTL of the probe.
    pub ttl: u8,
    /// Who answered (`None`: silence).
    pub addr: Option<String>,
    /// Median RTT of the answers.
    pub rtt_us: Option<u64>,
}

/// Layer 1: the path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct PathEvidence {
    /// Probe kind: `tcp-syn` (raw socket) or `connect` (no privilege).
    pub method: String,
    /// SYN RTT with no load.
    pub idle: Option<RttStats>,
    /// SYN RTT while the c=N load ran.
    pub under_load: Option<RttStats>,
    /// Hops, when the target is more than one hop away (empty: direct or not traced).
    #[serde(default)]
    pub hops: Vec<Hop>,
    /// Whether the target host answered at all (SYN-ACK or RST).
    pub reached: bool,
    /// Whether the port accepts connections (SYN-ACK seen or a connect succeeded).
    pub port_open: bool,
    /// Notes (e.g. a fallback to connect mode and why).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The client host's route to the server, as `ip route get ADDR` showed it where the load
    /// ran (absent: not looked up, as for real clients' traffic, or no route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
}

/// A route as `ip route get ADDR` shows it: what a fix on that route must repeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Route {
    /// Route type: `unicast`, or `local` (an address of this host), `broadcast`, ...
    pub kind: String,
    /// The device the route leaves by.
    pub dev: String,
    /// The gateway (next hop), when the destination is not on a directly attached link; an
    /// IPv6 next hop of an IPv4 route keeps its family word (`inet6 fe80::1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The source address the host picks for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    /// The routing table, when not `main`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
}

/// A latency distribution in µs: the contract's one [`LatencySummary`](crate::LatencySummary).
pub type Percentiles = crate::LatencySummary;

/// One point of a percentile distribution (for the HdrHistogram-style chart).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PercentilePoint {
    /// Percentile, 0..=100.
    pub percentile: f64,
    /// Latency at that percentile.
    pub latency_us: u64,
}

/// Failed requests by kind (wrk's socket errors plus HTTP status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Errors {
    /// Could not connect (refused, unreachable, connect timeout).
    pub connect: u64,
    /// Read errors (reset, closed mid-response).
    pub read: u64,
    /// Write errors.
    pub write: u64,
    /// Requests abandoned at the timeout.
    pub timeout: u64,
    /// Responses with a status other than 2xx/3xx.
    pub status: u64,
}

impl Errors {
    /// All errors together.
    pub fn total(&self) -> u64 {
        self.connect + self.read + self.write + self.timeout + self.status
    }
}

/// One load run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct AppRun {
    /// Connections.
    pub concurrency: u32,
    /// Completed requests.
    pub requests: u64,
    /// Wall time of the run.
    pub duration_us: u64,
    /// Completed requests per second.
    pub requests_per_sec: f64,
    /// Latency of completed requests.
    pub latency: Percentiles,
    /// The whole distribution, for charts (may be empty).
    #[serde(default)]
    pub distribution: Vec<PercentilePoint>,
    /// Failed requests by kind.
    pub errors: Errors,
    /// Latency of the first request on each connection, when the engine reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_request: Option<Percentiles>,
    /// Bytes read (response heads and bodies); 0 when not measured.
    #[serde(default)]
    pub bytes: u64,
    /// Latency of the later requests on each connection, when the engine reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub later_requests: Option<Percentiles>,
    /// What every request of the run waited, from its per-request records: a connection's
    /// first request from its connect start, a failed request or connect until it failed,
    /// one still pending at the run's end as its age (a lower bound). `latency` counts only
    /// completed requests from their first write (as wrk does); this leaves nothing out, so
    /// slow and failed connects are in the distribution. Estimated over the whole run from
    /// the load's records (every slow one kept, the rest sampled with weights). Absent
    /// without records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits: Option<Percentiles>,
    /// Connection setup in the run, from its per-request records. Absent without records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connects: Option<ConnectStats>,
    /// Per-request records of the run, trimmed to a bounded set so the JSON stays small:
    /// the slowest requests at or above the run's p99 of `waits` (at most 200: every request
    /// above the p99 in runs of up to 20 000), and a weighted systematic sample of at most
    /// 50 of the others over time (their weights rescaled so that `Σ weight` is still
    /// `seen`). The rules read exactly these, so a saved diagnosis judges the same again.
    /// Absent without records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<crate::RequestRecords>,
    /// How CPU-busy the load generator's own host was during the run (sampled while it
    /// ran). Absent when not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cpu: Option<ClientCpu>,
    /// Set when the run is real clients' traffic seen in a capture (`diagnose --passive`,
    /// `--pcap`), not lagtrace's own load: every figure then comes from the capture's
    /// transactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive: Option<PassiveRun>,
}

impl AppRun {
    /// How the run is named in text: `c=32` for lagtrace's own load (its connections,
    /// each with one request at a time); for real clients' traffic (`passive`), the
    /// connections the capture saw — not a concurrency: `152 client connections`.
    pub fn label(&self) -> String {
        match &self.passive {
            Some(_) => format!("{} client connections", self.concurrency),
            None => format!("c={}", self.concurrency),
        }
    }

    /// The run as a noun: `the c=32 run`, or `the clients' traffic (152 connections)`.
    pub fn run_name(&self) -> String {
        match &self.passive {
            Some(_) => format!("the clients' traffic ({} connections)", self.concurrency),
            None => format!("the c={} run", self.concurrency),
        }
    }
}

/// Where a passive run's requests came from and how much of them the capture saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct PassiveRun {
    /// The capture: `veth0 in namespace lab-x`, or the file read.
    pub source: String,
    /// The server's `addr:port` with the most requests in the capture.
    pub server: String,
    /// Distinct client addresses seen.
    pub clients: u64,
    /// Client connections with at least one request.
    pub connections: u64,
    /// Requests seen without a complete response (the window ended, or the connection
    /// closed, before it); not in `requests` nor in the latency figures.
    pub incomplete: u64,
    /// Connections already open when the capture started (their handshake was not seen):
    /// their first request's wait starts at its first byte.
    pub joined_open: u64,
    /// Per client address, when there are several (the 16 with the most requests): what
    /// each one waited, estimated from the kept records (every slow one, a weighted sample
    /// of the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_client: Vec<ClientWaits>,
}

/// What one client address waited in a passive run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct ClientWaits {
    /// The client's address.
    pub addr: String,
    /// Its requests (weighted estimate).
    pub requests: u64,
    /// Median wait.
    pub p50_us: u64,
    /// 99th percentile wait.
    pub p99_us: u64,
}

/// The load generator's host CPU contention during one load run: what its threads waited
/// for a CPU, and how many tasks were runnable. A measurement, read by the tail rule to
/// bound how much of the tail the client's own scheduling explains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct ClientCpu {
    /// CPUs online.
    pub cpus: u32,
    /// Samples of `procs_running` (`/proc/stat`) taken during the run.
    pub samples: u32,
    /// Runnable tasks on the host (`procs_running`, the sampler included): median sample.
    pub runnable_p50: u32,
    /// Runnable tasks on the host: 90th percentile sample.
    pub runnable_p90: u32,
    /// Time at least one task waited for a CPU (`/proc/pressure/cpu` `some` total, µs)
    /// during the run; absent without PSI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi_some_us: Option<u64>,
    /// Run-queue delay of the load process's threads during the run (`schedstat` field 2
    /// summed over its threads, µs); absent without schedstats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_delay_us: Option<u64>,
    /// Length of the sampled interval, µs.
    pub span_us: u64,
}

impl ClientCpu {
    /// Runnable tasks per CPU at the 90th percentile sample, rounded up (at least 1).
    pub fn per_cpu(&self) -> u64 {
        u64::from(self.runnable_p90)
            .div_ceil(u64::from(self.cpus.max(1)))
            .max(1)
    }

    /// Share of the run during which some task waited for a CPU (PSI `some`), 0–1.
    pub fn pressure(&self) -> Option<f64> {
        self.psi_some_us
            .map(|p| (p as f64 / self.span_us.max(1) as f64).min(1.0))
    }
}

/// Connection setup in one load run, counted over every record the load made (weighted
/// estimates where the load sampled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct ConnectStats {
    /// Connect attempts: each connection's first request, failed connects, and connects
    /// still pending at the run's end.
    pub attempts: u64,
    /// Attempts whose handshake needed a SYN retransmission: `TCP_INFO` counted one, or the
    /// connect waited at least [`ConnectStats::SYN_RTO_US`] (the initial retransmission
    /// timeout: a SYN or SYN-ACK was lost). Failed and pending ones included.
    pub syn_retransmitted: u64,
    /// Attempts that failed: refused, timed out, or another error.
    pub failed: u64,
    /// Attempts still pending at the run's end (waited at least their age).
    pub pending: u64,
    /// Connect time of the attempts: handshake complete, failure, or the run's end.
    pub time: Percentiles,
}

impl ConnectStats {
    /// The initial SYN retransmission timeout (RFC 6298's 1 s, Linux `TCP_TIMEOUT_INIT`): a
    /// connect that waited this long waited for a retransmission.
    pub const SYN_RTO_US: u64 = 1_000_000;
}

impl AppRun {
    /// The distribution the verdict reads: `waits` when records were kept (nothing left
    /// out), else the completed requests' `latency`.
    pub fn waited(&self) -> &Percentiles {
        self.waits.as_ref().unwrap_or(&self.latency)
    }
}

/// Layer 2: the application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct AppEvidence {
    /// Sequential keep-alive requests on one connection.
    pub c1: Option<AppRun>,
    /// N concurrent keep-alive connections.
    pub cn: Option<AppRun>,
}

/// One example of a packet finding, enough to open the pcap at the right packet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct FindingExample {
    /// TCP stream index (as Wireshark's `tcp.stream`).
    pub stream: u32,
    /// Frame numbers involved (1-based, as Wireshark).
    pub frames: Vec<u64>,
    /// Time of the first involved frame, µs since the capture start.
    pub time_us: u64,
    /// Latency this instance added.
    pub added_us: u64,
    /// What happened, in a short phrase.
    #[serde(default)]
    pub note: String,
}

/// Answered SYNs sent again ([`PacketEvidence::syn_acks_lost`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SynAcksLost {
    /// How many (of the findings the capture kept in detail).
    pub count: u64,
    /// SYNs (not SYN-ACKs) sent again in all, answered or not.
    pub of: u64,
    /// The first one.
    pub example: FindingExample,
}

/// The clients' segments lost inside the server's host ([`PacketEvidence::inbound_lost`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InboundLost {
    /// Segments the clients sent again whose second copy the server acknowledged as new
    /// data (no D-SACK).
    pub count: u64,
    /// The clients' retransmissions in all (D-SACKed or not).
    pub of: u64,
    /// The first one, when the capture kept it in detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example: Option<FindingExample>,
}

/// All findings of one kind over the capture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FindingSummary {
    /// Finding kind (`nagle-delayed-ack`, `delayed-ack`, `nagle-stall`, `retransmission`,
    /// `syn-retransmit`, `zero-window`, `window-full`, `tcp-cork`, `slow-server`).
    pub kind: FindingKind,
    /// Instances.
    pub count: u64,
    /// Transactions affected.
    pub transactions: u64,
    /// Share of all transactions affected, 0..=1.
    pub share: f64,
    /// Median added latency per affected transaction.
    pub median_added_us: u64,
    /// 99th percentile added latency.
    pub p99_added_us: u64,
    /// A few examples.
    #[serde(default)]
    pub examples: Vec<FindingExample>,
}

/// Direction of a packet in a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Client to server.
    ToServer,
    /// Server to client.
    ToClient,
}

/// One packet of a flow graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FlowPacket {
    /// Frame number in the capture.
    pub frame: u64,
    /// Time since the first packet of the flow.
    pub t_us: u64,
    /// Direction.
    pub dir: Direction,
    /// TCP flags, e.g. `PSH,ACK`.
    pub flags: String,
    /// Payload length.
    pub len: u32,
    /// A label (e.g. `GET /`, `delayed ACK`), may be empty.
    #[serde(default)]
    pub note: String,
}

/// A stall in a flow: the gap between two packets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stall {
    /// Frame where the wait starts.
    pub from_frame: u64,
    /// Frame that ends it.
    pub to_frame: u64,
    /// Length of the gap.
    pub gap_us: u64,
    /// What it is (`Nagle holds the body until the delayed ACK`).
    pub label: String,
}

/// The flow graph of one representative connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Flow {
    /// Stream index.
    pub stream: u32,
    /// Client `addr:port`.
    pub client: String,
    /// Server `addr:port`.
    pub server: String,
    /// The connection's opening (SYN, SYN-ACK, ACK) when `packets` starts later in the
    /// stream; empty when `packets` begins with it. Times on the same clock as `packets`
    /// (µs from the first SYN).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handshake: Vec<FlowPacket>,
    /// Packets in order.
    pub packets: Vec<FlowPacket>,
    /// The stalls in these packets.
    #[serde(default)]
    pub stalls: Vec<Stall>,
}

/// Packets an agent's capture of a c=N run keeps at most (it stops there; the load goes
/// on), so a capture of this many packets was cut: the requests after it have no packets.
/// A local run's capture has [`RUN_CAPTURE_PACKETS`].
pub const ACTIVE_CAPTURE_PACKETS: u64 = 200_000;

/// The most packets a local c=N run's capture takes (a disk bound, ~0.7 GB at its 160-byte
/// snap length: a 40 s run at 100 000 packets/s); the whole run, analysed after it.
pub const RUN_CAPTURE_PACKETS: u64 = 4_000_000;

/// Layer 3: packets captured during the c=N run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct PacketEvidence {
    /// Where the capture ran (`veth-x in namespace lab-y`).
    pub capture_point: String,
    /// Packets analysed.
    pub packets: u64,
    /// Packets the kernel dropped from the capture.
    #[serde(default)]
    pub dropped: u64,
    /// TCP streams.
    pub streams: u64,
    /// Request/response transactions.
    pub transactions: u64,
    /// Handshake RTT (SYN to SYN-ACK seen at the capture point), when handshakes were seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake_rtt: Option<Percentiles>,
    /// Server time: a request's last byte to its response's first byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_time: Option<Percentiles>,
    /// Exchange time: a request's first byte to its response's last byte (what the
    /// connecting side waited for each answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange_time: Option<Percentiles>,
    /// Findings by kind (kinds with no instance are omitted).
    #[serde(default)]
    pub findings: Vec<FindingSummary>,
    /// A representative connection, preferably one with the main finding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example_flow: Option<Flow>,
    /// The app layer's kept per-request records of each run, joined with these packets
    /// (empty without records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joins: Vec<RequestJoin>,
    /// A PMTU black hole the segments show (`analyze`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub black_hole: Option<crate::analyze::BlackHole>,
    /// The server host's kernel answering a SYN: SYN in → SYN-ACK out at a capture next to
    /// the server — every stream's when the capture is known to be there (`diagnose`'s own,
    /// in the server's namespace or on its host), else the streams whose SYN → SYN-ACK leg
    /// is the shorter of the handshake's two (the other, SYN-ACK → ACK, is the path's).
    /// Absent for a capture next to the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_syn_synack: Option<Percentiles>,
    /// SYNs sent again after the other side's SYN-ACK had passed the capture point
    /// (`syn-retransmit` findings of detail `syn-ack-lost`): the SYN was answered and the
    /// SYN-ACK lost beyond the capture point. The first is the example.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_acks_lost: Option<SynAcksLost>,
    /// The clients' data segments sent again after their first copy passed a capture next
    /// to the server, and not reported received twice (no D-SACK): the first copies were
    /// dropped inside the server's host, after the capture point (its input path), not on
    /// the path. Only for a capture known to be the server's (`diagnose`'s own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_lost: Option<InboundLost>,
    /// What this capture cannot show, one line each: a file cut short, records the reader
    /// could not read, headers cut by the snap length. A `healthy` verdict read from such a
    /// capture is never above low confidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

/// One load run's kept per-request records, each joined with its packets and its wait
/// decomposed from timestamps (`lagtrace_diagnose::join`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct RequestJoin {
    /// The run (by its connections) whose `records` these follow, one for one, in order.
    pub concurrency: u32,
    /// The capture's clock less the records' clock, µs, estimated from the matches (none
    /// when nothing matched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_us: Option<i64>,
    /// How far the offset may be off, µs (half the interval every match allows).
    pub offset_uncertainty_us: u64,
    /// Whether every match's bounds on the offset agreed (a capture on the client's path).
    pub offset_consistent: bool,
    /// Records matched to a transaction.
    pub matched: u64,
    /// The capture's last packet on the records' clock (µs from their start), when an
    /// offset was estimated: a request that started after it has no packets because the
    /// capture had stopped (its packet limit), not because something hid them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured_until_us: Option<u64>,
    /// One per record.
    pub requests: Vec<RequestParts>,
}

/// Where one request's wait went, µs; each component from two timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub struct RequestParts {
    /// The capture's stream, when the request was matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<u32>,
    /// Connection setup in this request's wait.
    pub connect_us: u64,
    /// SYN retransmissions of the connect it waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_retransmits: Option<u32>,
    /// Request delivery to the capture point.
    pub delivery_us: u64,
    /// The server's time: request's last byte to response's first byte, at the capture.
    pub server_us: u64,
    /// Data held before the wire (Nagle, delayed ACK, cork, window).
    pub hold_us: u64,
    /// Which hold, when there was one: a finding kind (`nagle-delayed-ack`, `tcp-cork`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_kind: Option<crate::FindingKind>,
    /// Loss recovery.
    pub loss_us: u64,
    /// Response transfer: the response's first byte to its last byte on the wire.
    pub transfer_us: u64,
    /// The client's read: the response's last byte on the wire to the last byte read (the
    /// whole response had reached the client, which had not read it yet).
    #[serde(default)]
    pub client_read_us: u64,
    /// The wait outside every component (negative within the clock offset's uncertainty).
    pub unexplained_us: i64,
    /// Of `server_us`, the wait on the server's upstreams: the exchanges this request caused
    /// on the first hops (`layers.hops[]` at depth 1), their spans inside its server time
    /// (`lagtrace_diagnose::join::upstream`). The server's own time is the rest.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub upstream_us: u64,
    /// The first upstream exchange the request caused, when the hops were captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamRef>,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// An upstream exchange a request caused: where to find it in the hop's capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpstreamRef {
    /// Index of the hop in `layers.hops`.
    pub hop: u32,
    /// The server's local port of the upstream connection (its client side).
    pub local_port: u16,
    /// The hop capture's stream.
    pub stream: u32,
    /// The exchange's index on that stream (0-based, as the capture saw it: a connection
    /// opened before the capture began counts from its first exchange captured).
    pub index: u32,
}

/// How a hop's exchanges were matched to the transactions in front of it (the server's
/// client-facing ones at depth 1, the hop it is behind deeper), by timestamps alone
/// (`lagtrace_diagnose::join::upstream`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HopJoin {
    /// The hop's complete exchanges (a start and a response) in its capture, within the
    /// time the capture in front of it covers (the first request's first byte to the last
    /// response's last byte there).
    pub exchanges: u64,
    /// Of them, matched to the transaction that caused them.
    pub joined: u64,
    /// Transactions in front of the hop that caused at least one of its exchanges.
    pub downstream: u64,
    /// Their wait on this hop, inside their server time (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Percentiles>,
    /// Their server time less their wait on every hop: what the process in front of the
    /// hop spent itself (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<Percentiles>,
}

impl PacketEvidence {
    /// The summary of one finding kind, if any instance was found:
    /// `p.finding(FindingKind::TcpCork)` or `p.finding("tcp-cork")`.
    pub fn finding<K>(&self, kind: K) -> Option<&FindingSummary>
    where
        FindingKind: PartialEq<K>,
    {
        self.findings.iter().find(|f| f.kind == kind && f.count > 0)
    }
}

/// The server process owning the listening socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct ServerProcess {
    /// Process id; 0 when the evidence cannot name the process (a hop found in a saved
    /// capture, `diagnose --pcap`).
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Network namespace it was found in (`current` or a name).
    pub netns: String,
}

/// Counts of one boolean socket option over the server's established sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub struct OptionCount {
    /// Sockets with the option on.
    pub on: u32,
    /// Sockets with the option off.
    pub off: u32,
    /// Sockets that could not be read.
    pub unknown: u32,
}

/// One configuration directive, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConfigDirective {
    /// Directive name (`tcp_nodelay`).
    pub name: String,
    /// Its value (`off`).
    pub value: String,
    /// File it is in.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// Whether it is the server's default (not written in the file).
    #[serde(default)]
    pub default: bool,
}

/// The client side: lagtrace's own load sockets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClientSide {
    /// TCP_NODELAY on the client's sockets.
    pub nodelay: bool,
    /// Whether TCP_QUICKACK is set by the client.
    pub quickack: bool,
    /// One sentence.
    pub note: String,
}

impl Default for ClientSide {
    fn default() -> Self {
        ClientSide {
            nodelay: true,
            quickack: false,
            note: "lagtrace's load client behaves like a typical client (wrk, browsers): \
                   TCP_NODELAY on, delayed ACK on (no TCP_QUICKACK)"
                .into(),
        }
    }
}

/// Layer 4: sockets and configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct SocketEvidence {
    /// The client side (always known: it is lagtrace).
    pub client: ClientSide,
    /// The server process, when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerProcess>,
    /// Established server sockets inspected.
    pub established: u32,
    /// TCP_NODELAY over those sockets.
    pub nodelay: OptionCount,
    /// TCP_CORK over those sockets.
    pub cork: OptionCount,
    /// Configuration directives that matter for latency (nginx lens).
    #[serde(default)]
    pub config: Vec<ConfigDirective>,
    /// What could not be read and why.
    #[serde(default)]
    pub notes: Vec<String>,
}

impl SocketEvidence {
    /// The directive `name`, if the config lens reported it.
    pub fn directive(&self, name: &str) -> Option<&ConfigDirective> {
        self.config.iter().find(|d| d.name == name)
    }
}

/// All evidence, one layer each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Layers {
    /// Layer 1.
    pub path: Layer<PathEvidence>,
    /// Layer 2.
    pub app: Layer<AppEvidence>,
    /// Layer 3.
    pub packets: Layer<PacketEvidence>,
    /// Layer 4.
    pub sockets: Layer<SocketEvidence>,
    /// Layer 5: `lagtrace host`'s report on the server's process and namespace over the c=N
    /// run. Absent in diagnoses recorded before it existed (then `skipped`).
    #[serde(default = "host_not_recorded")]
    pub host: Layer<crate::host::HostReport>,
    /// The hops behind the server: the upstreams its processes connected to during the c=N
    /// run, each with its own packets and sockets. Empty when none was seen (or not looked
    /// for: a remote server, a saved capture).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hops: Vec<HopEvidence>,
}

/// One hop behind the server: the TCP connections a process on the request's way opened to
/// one peer (address:port) during the c=N run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HopEvidence {
    /// 1 for the server's own upstreams, 2 for theirs, …
    pub depth: u32,
    /// Below depth 1: the peer address of the hop whose listener's processes opened these
    /// connections (the hop in front of this one on the request's way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The process that opened the connections.
    pub from: ServerProcess,
    /// The peer as the connecting process sees it (`127.0.0.1:9000`).
    pub peer: String,
    /// The process listening there, when it is on this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<ServerProcess>,
    /// The service the peer's port is known for (`redis`, `postgresql`), a hint only: the
    /// hop is found from the connecting process's sockets, never from a port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Distinct connections seen (by local port) while polling the process's sockets.
    pub connections: u32,
    /// The hop's packets, captured in the connecting process's namespace on the interface
    /// toward the peer (loopback included).
    pub packets: Layer<PacketEvidence>,
    /// The peer's sockets and configuration (the owner of its listener), when on this host.
    pub sockets: Layer<SocketEvidence>,
    /// The peer's listener over the run — its accept queue against its limit and its own
    /// drop count (`sk_drops`) — when it listens in the namespace the hop was captured in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<crate::host::ListenerQueue>,
    /// Its exchanges matched to the transactions in front of it, when both were captured
    /// with their timings (an active run's c=N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<HopJoin>,
}

fn host_not_recorded() -> Layer<crate::host::HostReport> {
    Layer::skipped("not recorded (a diagnosis from before the host layer)")
}

impl Layers {
    /// The status of one layer.
    pub fn status(&self, l: LayerName) -> LayerStatus {
        match l {
            LayerName::Path => self.path.status,
            LayerName::App => self.app.status,
            LayerName::Packets => self.packets.status,
            LayerName::Sockets => self.sockets.status,
            LayerName::Host => self.host.status,
        }
    }
    /// The reason of one layer (when not ok).
    pub fn reason(&self, l: LayerName) -> Option<&str> {
        match l {
            LayerName::Path => self.path.reason.as_deref(),
            LayerName::App => self.app.reason.as_deref(),
            LayerName::Packets => self.packets.reason.as_deref(),
            LayerName::Sockets => self.sockets.reason.as_deref(),
            LayerName::Host => self.host.reason.as_deref(),
        }
    }
}
