//! The report of a capture analysis (`lagtrace analyze --json`): TCP streams as Wireshark's
//! `tcp.stream`, request/response transactions, latency findings and their summary.
//!
//! Times are integer microseconds (`*_us`) relative to the capture's first packet unless a
//! field says otherwise; frame numbers are 1-based as in Wireshark.

use std::net::SocketAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::finding::FindingKind;

/// SYN options one side announced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SynOptions {
    /// MSS option.
    pub mss: Option<u16>,
    /// Window scale shift.
    pub wscale: Option<u8>,
    /// SACK permitted.
    pub sack_permitted: bool,
    /// Timestamps.
    pub timestamps: bool,
}

/// What a capture tells of one side's window scale (RFC 7323): the shift that side's
/// advertised windows are multiplied by. Only the SYN and SYN-ACK carry it, so a capture that
/// started mid-connection (a tcpdump started during an incident, a passive attach to
/// keep-alive clients) does not know it: tshark shows "-1 (unknown)". The raw window field is
/// then a lower bound of the window, never the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum WindowScale {
    /// Both SYNs seen (or one that settles it): windows are the raw field times 2^`shift`
    /// (0 when scaling was not agreed).
    Known {
        /// The shift.
        shift: u8,
    },
    /// No handshake seen, but the peer had more bytes in flight than the raw window allows
    /// at a smaller shift (a sender never sends past the window): the shift is at least
    /// this, and windows at least the raw field times 2^`at_least`.
    Bounded {
        /// The smallest shift the bytes in flight allow.
        at_least: u8,
    },
    /// Nothing seen tells it: windows are at least the raw field.
    #[default]
    Unknown,
}

impl WindowScale {
    /// The shift windows are read with: the known one, or the lower bound (0 when unknown).
    pub fn shift(self) -> u8 {
        match self {
            WindowScale::Known { shift } => shift,
            WindowScale::Bounded { at_least } => at_least,
            WindowScale::Unknown => 0,
        }
    }

    /// Whether a window read with [`Self::shift`] is the window itself (not a lower bound).
    pub fn is_known(self) -> bool {
        matches!(self, WindowScale::Known { .. })
    }
}

/// One TCP stream (Wireshark's `tcp.stream`), like a row of `tshark -q -z conv,tcp`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct StreamSummary {
    /// Stream index, in order of first packet (0-based, as `tcp.stream`).
    pub stream: u32,
    /// Endpoint A: the source of the stream's first packet.
    pub a: SocketAddr,
    /// Endpoint B.
    pub b: SocketAddr,
    /// Whether A is the client (sent the SYN, or the first request if no SYN was seen).
    pub a_is_client: bool,
    /// Frames A→B.
    pub frames_ab: u64,
    /// Bytes A→B (frame lengths, as conv,tcp counts them).
    pub bytes_ab: u64,
    /// Frames B→A.
    pub frames_ba: u64,
    /// Bytes B→A.
    pub bytes_ba: u64,
    /// TCP payload bytes A→B.
    pub payload_ab: u64,
    /// TCP payload bytes B→A.
    pub payload_ba: u64,
    /// First packet, µs since the capture's first packet.
    pub start_us: i64,
    /// Last packet minus first packet, µs.
    pub duration_us: u64,
    /// Frame number of the first packet (1-based).
    pub first_frame: u64,
    /// Frame number of the last packet.
    pub last_frame: u64,
    /// SYN options of A.
    pub syn_a: Option<SynOptions>,
    /// SYN options of B.
    pub syn_b: Option<SynOptions>,
    /// Handshake RTT: SYN to the ACK of the SYN-ACK (Wireshark's `tcp.analysis.initial_rtt`).
    pub handshake_rtt_us: Option<u64>,
    /// The most recent SYN to the first SYN-ACK, at the capture point. Next to the server
    /// (this leg the shorter of the two) it is the server host's kernel answering the SYN:
    /// its receive path, netfilter, the listener, its send path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_synack_us: Option<u64>,
    /// Window scale of A's advertised windows, as far as the capture tells.
    #[serde(default)]
    pub scale_a: WindowScale,
    /// Window scale of B's advertised windows.
    #[serde(default)]
    pub scale_b: WindowScale,
    /// A sent FIN.
    pub fin_a: bool,
    /// B sent FIN.
    pub fin_b: bool,
    /// Frame of the first RST, if any.
    pub rst_frame: Option<u64>,
    /// Retransmitted frames (Wireshark's retransmission or fast_retransmission).
    pub retransmissions: u64,
    /// Transactions seen.
    pub transactions: u64,
}

/// One request/response exchange on a stream.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Transaction {
    /// Stream index.
    pub stream: u32,
    /// Index within the stream (0-based).
    pub index: u32,
    /// HTTP/1.x request line, when the request starts with one.
    pub request_line: Option<String>,
    /// HTTP status code, when the response starts with a status line.
    pub status: Option<u16>,
    /// Request payload bytes.
    pub request_bytes: u64,
    /// Response payload bytes.
    pub response_bytes: u64,
    /// First request frame.
    pub request_first_frame: Option<u64>,
    /// Last request frame.
    pub request_last_frame: Option<u64>,
    /// First response frame.
    pub response_first_frame: Option<u64>,
    /// Last response frame.
    pub response_last_frame: Option<u64>,
    /// Request's first byte, µs since capture start.
    pub start_us: i64,
    /// Request's first byte to the response's first byte.
    pub time_to_first_byte_us: Option<u64>,
    /// Request's first byte to the response's last byte.
    pub time_to_last_byte_us: Option<u64>,
    /// Request's last byte to the response's first byte (server time, as seen here).
    pub server_time_us: Option<u64>,
}

/// A latency finding with its evidence.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Finding {
    /// Kind.
    pub kind: FindingKind,
    /// Sub-kind: `rto`, `fast`, `spurious` for retransmissions.
    pub detail: Option<String>,
    /// Stream index.
    pub stream: u32,
    /// Transaction index within the stream, when one was open.
    pub transaction: Option<u32>,
    /// Frames involved (1-based), in time order.
    pub frames: Vec<u64>,
    /// Start of the stall, µs since capture start.
    pub start_us: i64,
    /// End of the stall, µs since capture start.
    pub end_us: i64,
    /// Latency added, µs.
    pub cost_us: u64,
    /// One-line explanation with the numbers.
    pub explanation: String,
}

/// Per-kind summary.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct KindSummary {
    /// Kind.
    pub kind: FindingKind,
    /// Findings of this kind.
    pub findings: u64,
    /// Distinct transactions with at least one finding of this kind.
    pub transactions_affected: u64,
    /// `transactions_affected` / all transactions.
    pub share: f64,
    /// Median added latency, µs.
    pub median_us: u64,
    /// 99th percentile added latency, µs.
    pub p99_us: u64,
    /// Total added latency, µs.
    pub total_us: u64,
}

/// One packet of the kept stream (for the flow graph and follow).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PacketRecord {
    /// Frame number.
    pub frame: u64,
    /// µs since capture start.
    pub time_us: i64,
    /// From A to B.
    pub a_to_b: bool,
    /// Flag bits.
    pub flags: u8,
    /// Relative sequence number.
    pub seq: u32,
    /// Relative acknowledgement number (0 without ACK).
    pub ack: u32,
    /// TCP payload length.
    pub len: u32,
    /// Window: the raw field scaled by the sender's window scale when known, else by its
    /// lower bound (see the stream's `scale_a`/`scale_b`; then the window is at least this).
    pub window: u64,
    /// µs since the stream's previous packet.
    pub gap_us: u64,
    /// Captured payload bytes.
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Finding kinds this packet is part of.
    pub marks: Vec<FindingKind>,
}

/// When one transaction's packets went by, and the waits the detectors measured inside it:
/// the packet half of the per-request join (`lagtrace diagnose` matches each load request to
/// one of these by 4-tuple and index on the connection). Only with
/// `AnalyzeOptions::timings`; `analyze` does not print them.
///
/// Times (`*_at_us`) are µs since the capture's first packet ([`Analysis::first_ts_ns`]
/// on the capture's clock). Every wait is measured from packet timestamps: a hold or a
/// loss wait is the union of the intervals of the findings recorded against the
/// transaction, on the side (request or response) where it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TxnTiming {
    /// Stream index.
    pub stream: u32,
    /// Index within the stream (0-based), as [`Transaction::index`].
    pub index: u32,
    /// The client's endpoint (it sent the SYN, or the first request).
    pub client: SocketAddr,
    /// The server's endpoint.
    pub server: SocketAddr,
    /// The stream's first SYN, when the capture saw it.
    pub syn_at_us: Option<i64>,
    /// SYNs sent again before the handshake completed.
    pub syn_retransmits: u32,
    /// The stream's first SYN-ACK.
    pub synack_at_us: Option<i64>,
    /// The request's first byte.
    pub request_first_at_us: Option<i64>,
    /// The request's last byte (a retransmitted request: when the copy that arrived left).
    pub request_last_at_us: Option<i64>,
    /// The response's first byte.
    pub response_first_at_us: Option<i64>,
    /// The response's last byte.
    pub response_last_at_us: Option<i64>,
    /// The part of the server time that is the path (capture near the client), µs.
    pub server_path_us: u64,
    /// Request data held before the wire (Nagle, delayed ACK, cork, window), µs.
    pub hold_request_us: u64,
    /// Response data held before the wire, µs.
    pub hold_response_us: u64,
    /// Waiting for retransmissions of request data (RTO, TLP, fast), µs.
    pub loss_request_us: u64,
    /// Waiting for retransmissions of response data, µs.
    pub loss_response_us: u64,
    /// Kinds of the findings recorded against it, in report order.
    pub kinds: Vec<FindingKind>,
    /// How many of the capture's transactions this one stands for: 1 unless the timings
    /// were sampled ([`TimingKeep`]: every slow one kept, a uniform sample of the rest,
    /// each standing for `others / kept`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

fn is_one(w: &f64) -> bool {
    *w == 1.0
}

/// How the timings of a long capture were kept in bounded memory (`AnalyzeOptions::
/// timing_keep`): every transaction's wait went into HdrHistograms; the `slow_cap` slowest
/// timings were kept exactly and a uniform sample of `sample_cap` of the others.
///
/// A transaction's wait is what its client waited as the capture saw it: from the request's
/// first byte (the connection's SYN for the first request on a connection whose handshake
/// was captured) to the response's last byte.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TimingKeep {
    /// Slowest timings kept at most.
    pub slow_cap: u32,
    /// Sampled timings kept at most.
    pub sample_cap: u32,
    /// Transactions offered (every one closed in the capture).
    pub seen: u64,
    /// Of `seen`, those with no complete response (the capture ended, or the connection
    /// closed, before it).
    pub incomplete: u64,
    /// Waits of the complete transactions (HdrHistogram, 3 significant digits).
    pub waits: crate::LatencySummary,
    /// The same, for the first transaction on each connection whose handshake was seen
    /// (the wait includes the connection setup).
    pub first: crate::LatencySummary,
    /// The same, for the later transactions on a connection.
    pub later: crate::LatencySummary,
    /// The waits' distribution at fixed percentiles (`(percentile 0–100, µs)`).
    pub distribution: Vec<(f64, u64)>,
}

/// Latency of the transactions kept in detail.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct TransactionStats {
    /// Transactions with both a request and a response.
    pub complete: u64,
    /// Median request-first-byte to response-last-byte, µs.
    pub median_us: u64,
    /// 99th percentile of the same, µs.
    pub p99_us: u64,
    /// Largest, µs.
    pub max_us: u64,
    /// Median server time (request's last byte to response's first byte), µs.
    pub median_server_us: u64,
}

/// A PMTU black hole: one sender's segments to one receiver above a size never acknowledged
/// however often resent, while its smaller segments pass after them (a link on the path carries less than
/// its MSS, and the ICMP "fragmentation needed" that would say so does not come back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BlackHole {
    /// The sender's address.
    pub sender: String,
    /// The receiver's: the hole lies on the path between them (other receivers' paths may
    /// carry the large segments).
    pub receiver: String,
    /// Its segments lost: sent three times or more, never acknowledged before their stream
    /// ended.
    pub lost: u64,
    /// Streams they were on.
    pub streams: u64,
    /// The smallest lost segment's payload, bytes (a super-segment counts as its MSS-sized
    /// packets).
    pub lost_min_len: u32,
    /// The largest segment of the same sender acknowledged after the first loss, bytes.
    pub passed_max_len: u32,
    /// Its segments acknowledged after the first loss.
    pub passed: u64,
    /// Times the most-sent lost segment was sent (its original and resends).
    pub max_copies: u32,
    /// An example: the stream of the most-sent lost segment...
    pub stream: u32,
    /// ... its frames (the original when seen, then the resends; up to 8).
    pub frames: Vec<u64>,
    /// When the first lost segment was first sent, µs from the capture's start.
    pub first_us: u64,
}

impl BlackHole {
    /// What the segments show, in one clause: "23 segments of 1448 B or more from A to B
    /// were resent (up to 4 times) and never acknowledged on 23 connections, while 40 of its
    /// segments up to 203 B were acknowledged after the first of them".
    pub fn what(&self) -> String {
        format!(
            "{} segments of {} B or more from {} to {} were resent (up to {} times) and never \
             acknowledged on {} connections, while {} of its segments up to {} B were \
             acknowledged after the first of them",
            self.lost,
            self.lost_min_len,
            self.sender,
            self.receiver,
            self.max_copies,
            self.streams,
            self.passed,
            self.passed_max_len
        )
    }
}

/// Everything `analyze` found.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Analysis {
    /// Frames read.
    pub frames: u64,
    /// Frames decoded as TCP.
    pub tcp_frames: u64,
    /// Timestamp of the first frame, ns since the epoch.
    pub first_ts_ns: i64,
    /// Last minus first timestamp, µs.
    pub duration_us: u64,
    /// Streams in index order.
    pub streams: Vec<StreamSummary>,
    /// Streams whose handshake the capture did not see (neither SYN): they started before
    /// it. Their window scale is bounded or unknown, their MSS inferred, their initial RTT
    /// unknown.
    #[serde(default)]
    pub mid_connection_streams: u64,
    /// Transactions seen (all counted).
    pub transactions_total: u64,
    /// Transactions kept in detail (up to `max_transactions`).
    pub transactions: Vec<Transaction>,
    /// Latency over the transactions kept in detail.
    pub transaction_stats: TransactionStats,
    /// Findings kept in detail (up to `max_findings`), in time order of detection.
    pub findings: Vec<Finding>,
    /// Findings summary per kind (only kinds that occurred).
    pub summary: Vec<KindSummary>,
    /// Frames Wireshark would flag as retransmission or fast retransmission (kept up to
    /// `max_findings`).
    pub retransmitted_frames: Vec<u64>,
    /// `(frame, ack_rtt_us)` of ACKs with an RTT (Wireshark's `tcp.analysis.ack_rtt`, in
    /// whole µs, rounded), for the kept stream only.
    pub ack_rtts_us: Vec<(u64, u64)>,
    /// Packets of the kept stream.
    pub stream_packets: Vec<PacketRecord>,
    /// Warnings: what was skipped and why.
    pub warnings: Vec<String>,
    /// Per-transaction timings (only with `AnalyzeOptions::timings`, up to
    /// `max_transactions`), ordered by stream and index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings: Vec<TxnTiming>,
    /// How the timings were kept, when `AnalyzeOptions::timing_keep` bounded them (then
    /// `timings` holds the kept ones, each with its weight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_keep: Option<TimingKeep>,
    /// A PMTU black hole, when the segments show one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub black_hole: Option<BlackHole>,
    /// The connecting sides' data segments sent again after their first copy passed the
    /// capture point, and how many of those the server reported receiving twice (D-SACK);
    /// absent when there were none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resent_to_server: Option<ResentToServer>,
}

/// Data the connecting side (the client) sent again after its first copy had passed the
/// capture point ([`Analysis::resent_to_server`]). Where the capture sits next to the
/// server, a copy the server did not report receiving twice (no D-SACK, RFC 2883: its ACK
/// of the second copy was an ordinary one) never reached the server's TCP: it was dropped
/// inside the server's host, after the capture point (its input path: a netfilter rule,
/// a full socket backlog or receive buffer). A D-SACKed copy had arrived: only its ACK was
/// late.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ResentToServer {
    /// Retransmissions of the client's data (a wait: fast or after a timeout, not of data
    /// already acknowledged).
    pub segments: u64,
    /// Of them, reported received twice (D-SACK): their first copy had arrived.
    pub dsacked: u64,
    /// The first one not D-SACKed, when the findings kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example: Option<Finding>,
}

impl ResentToServer {
    /// The resent segments whose first copy the server never reported: lost after the
    /// capture point.
    pub fn not_dsacked(&self) -> u64 {
        self.segments.saturating_sub(self.dsacked)
    }
}

impl Analysis {
    /// The summary row for a kind, if it occurred: `an.kind(FindingKind::TcpCork)` or
    /// `an.kind("tcp-cork")`.
    pub fn kind<K>(&self, k: K) -> Option<&KindSummary>
    where
        FindingKind: PartialEq<K>,
    {
        self.summary.iter().find(|s| s.kind == k)
    }
}
