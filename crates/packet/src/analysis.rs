//! TCP stream tracking, transactions and latency findings.
//!
//! [`Analyzer`] takes frames one at a time (from a file or a live capture) and keeps state
//! only for the streams it has seen: a few counters, the unacknowledged segments of each
//! direction and the current transaction. [`Analyzer::finish`] returns the [`Analysis`].

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::wire::{self, Skip, TcpOptions, TcpSegment, flags};

/// Finding kinds, stable strings.
pub mod kind {
    /// An ACK ≥ 30 ms after the data it acknowledges, with no data to carry it, that the
    /// sender's next data waited for.
    pub const DELAYED_ACK: &str = "delayed-ack";
    /// A sender held a small segment until its previous small segment was acknowledged.
    pub const NAGLE_STALL: &str = "nagle-stall";
    /// A Nagle hold released only by the peer's delayed ACK: the reference 40 ms case.
    pub const NAGLE_DELAYED_ACK: &str = "nagle-delayed-ack";
    /// A retransmitted segment (detail: rto, fast or spurious).
    pub const RETRANSMISSION: &str = "retransmission";
    /// A retransmitted SYN or SYN-ACK: connection setup waited for a timer.
    pub const SYN_RETRANSMIT: &str = "syn-retransmit";
    /// A receiver advertised a zero window.
    pub const ZERO_WINDOW: &str = "zero-window";
    /// The sender filled the receiver's window and waited for it to open.
    pub const WINDOW_FULL: &str = "window-full";
    /// A partial segment released at the ~200 ms TCP_CORK ceiling with nothing to explain it.
    pub const TCP_CORK: &str = "tcp-cork";
    /// The server's time from request to first response byte dominates the transaction.
    pub const SLOW_SERVER: &str = "slow-server";
    /// All kinds, in report order.
    pub const ALL: [&str; 9] = [
        NAGLE_DELAYED_ACK,
        NAGLE_STALL,
        DELAYED_ACK,
        RETRANSMISSION,
        SYN_RETRANSMIT,
        ZERO_WINDOW,
        WINDOW_FULL,
        TCP_CORK,
        SLOW_SERVER,
    ];
}

/// Delayed-ACK threshold: Linux's minimum is 40 ms (`TCP_DELACK_MIN`); 30 ms leaves room
/// for timer granularity and capture jitter while staying far above a quick ACK.
pub const DELAYED_ACK_MIN_US: u64 = 30_000;
/// How long after the releasing ACK (beyond twice the path RTT) held data may still leave
/// to count as released by it: softirq and timestamping jitter on a busy machine.
pub const RELEASE_SLACK_US: u64 = 2_000;
/// TCP_CORK ceiling (Linux: 200 ms).
pub const CORK_CEILING_US: u64 = 200_000;
/// Minimum server time, before `slow-server` is considered at all.
pub const SLOW_SERVER_MIN_US: u64 = 10_000;
/// A server time this long is reported even when it is an exception: below it, a slow
/// transaction is reported only when at least half of the same server's transactions took
/// [`SLOW_SERVER_MIN_US`] or more. A loaded machine deschedules a fast server now and then
/// for a few to a few tens of ms; that is noise, not the server's think time.
pub const SLOW_SERVER_ALONE_US: u64 = 100_000;
/// How long a closed stream keeps its state for late packets (retransmitted FINs, final
/// ACKs): twice Linux's TIME_WAIT.
pub const CLOSED_LINGER_NS: i64 = 120_000_000_000;
/// Wireshark keeps at most this many unacknowledged segments per direction.
const MAX_UNACKED: usize = 10_000;

/// What to keep besides the summaries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnalyzeOptions {
    /// Keep every packet (and its captured payload) of this stream, for `--flow`/`--follow`.
    pub keep_stream: Option<u32>,
    /// Keep at most this many transactions in detail (all are counted).
    pub max_transactions: usize,
    /// Keep at most this many findings in detail (all are counted in the summary).
    pub max_findings: usize,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            keep_stream: None,
            max_transactions: 100_000,
            max_findings: 100_000,
        }
    }
}

/// SYN options one side announced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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

impl From<TcpOptions> for SynOptions {
    fn from(o: TcpOptions) -> Self {
        SynOptions {
            mss: o.mss,
            wscale: o.wscale,
            sack_permitted: o.sack_permitted,
            timestamps: o.timestamps,
        }
    }
}

/// One TCP stream (Wireshark's `tcp.stream`), like a row of `tshark -q -z conv,tcp`.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    /// Kind ([`kind`]).
    pub kind: String,
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindSummary {
    /// Kind.
    pub kind: String,
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Window, scaled when the scale is known.
    pub window: u64,
    /// µs since the stream's previous packet.
    pub gap_us: u64,
    /// Captured payload bytes.
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Finding kinds this packet is part of.
    pub marks: Vec<String>,
}

/// Latency of the transactions kept in detail.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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

/// Everything `analyze` found.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// `(frame, ack_rtt_us)` of ACKs with an RTT (Wireshark's `tcp.analysis.ack_rtt`), for the
    /// kept stream only.
    pub ack_rtts: Vec<(u64, f64)>,
    /// Packets of the kept stream.
    pub stream_packets: Vec<PacketRecord>,
    /// Warnings: what was skipped and why.
    pub warnings: Vec<String>,
}

impl Analysis {
    /// The summary row for a kind, if it occurred.
    pub fn kind(&self, k: &str) -> Option<&KindSummary> {
        self.summary.iter().find(|s| s.kind == k)
    }
}

// ---------------------------------------------------------------------------------------
// State

/// FxHash: the hot path hashes one small key per packet.
#[derive(Default, Clone, Copy)]
struct Fx(u64);
impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Canonical (lower endpoint first) connection key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    lo: [u8; 16],
    hi: [u8; 16],
    lo_port: u16,
    hi_port: u16,
}

fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

#[derive(Clone, Copy)]
struct Unacked {
    seq: u32,
    nextseq: u32,
    frame: u64,
    ts: i64,
}

#[derive(Clone, Copy)]
struct DataSeg {
    frame: u64,
    ts: i64,
    len: u32,
    end: u32,
}

#[derive(Clone, Copy)]
struct AckEv {
    frame: u64,
    ts: i64,
    /// Time since the oldest data segment this ACK newly covered was seen.
    delay_us: u64,
    /// No payload, no SYN, no RST (a FIN may carry it).
    no_data: bool,
}

#[derive(Default)]
struct Dir {
    isn: Option<u32>,
    base: Option<u32>,
    syn_opts: Option<SynOptions>,
    syn_ts: Option<i64>,
    next_seq: Option<u32>,
    next_seq_time: i64,
    last_ack: Option<u32>,
    last_ack_time: i64,
    dupacks: u32,
    window: Option<u32>,
    unacked: VecDeque<Unacked>,
    /// Largest payload seen, as a lower bound of the MSS.
    max_len: u32,
    /// Last data segment (not retransmitted) and the transaction it belonged to.
    last_data: Option<DataSeg>,
    /// Last sub-MSS data segment, and whether it is still unacknowledged.
    last_small: Option<DataSeg>,
    small_unacked: bool,
    /// The ACK (from the peer) that first covered `last_small`.
    small_release: Option<AckEv>,
    /// Latest ACK this side sent that newly acknowledged data.
    last_new_ack: Option<AckEv>,
    /// Data this side sent that filled the peer's window: (frame, ts).
    window_full: Option<(u64, i64)>,
    /// Zero window advertised by this side: (frame, ts).
    zero_window: Option<(u64, i64)>,
    last_ts: i64,
}

impl Dir {
    fn mss(&self, peer: &Dir) -> u32 {
        // The sender uses the smaller of the peer's MSS option and its own (a TCP_MAXSEG
        // clamp shows in its own SYN's option, not in the peer's).
        let announced = match (
            peer.syn_opts.and_then(|o| o.mss),
            self.syn_opts.and_then(|o| o.mss),
        ) {
            (Some(a), Some(b)) => Some(u32::from(a.min(b))),
            (a, b) => a.or(b).map(u32::from),
        };
        match announced {
            // The path may carry less than announced (e.g. IP options, timestamps take 12).
            Some(m) => m.min(self.max_len.max(1).max(m.saturating_sub(40))),
            None => self.max_len.max(536),
        }
    }
}

struct Txn {
    t: Transaction,
    req_first_ts: i64,
    req_last_ts: i64,
    resp_first_ts: Option<i64>,
    resp_last_ts: i64,
    kinds: u16,
}

struct Live {
    dirs: [Dir; 2],
    client: Option<usize>,
    syn_time: Option<i64>,
    synack_time: Option<i64>,
    rtt_us: Option<u64>,
    min_ack_rtt_us: [Option<u64>; 2],
    last_ts: i64,
    txn: Option<Txn>,
    txn_count: u32,
    /// Data direction of the last payload packet, to split transactions.
    last_data_dir: Option<usize>,
    /// When RST or the second FIN was seen.
    closed_at: Option<i64>,
}

fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}
fn seq_le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}
fn us(ns: i64) -> u64 {
    u64::try_from(ns / 1000).unwrap_or(0)
}

/// Streaming TCP analyzer.
pub struct Analyzer {
    opts: AnalyzeOptions,
    frames: u64,
    tcp_frames: u64,
    first_ts: Option<i64>,
    last_ts: i64,
    max_ts: i64,
    map: HashMap<Key, u32, BuildHasherDefault<Fx>>,
    streams: Vec<StreamSummary>,
    /// Per-stream state; `None` once a closed stream has been quiet for [`CLOSED_LINGER_NS`].
    lives: Vec<Option<Box<Live>>>,
    /// Streams in the order they closed, with the time: freed after [`CLOSED_LINGER_NS`].
    closed: VecDeque<(i64, usize)>,
    transactions: Vec<Transaction>,
    transactions_total: u64,
    findings: Vec<Finding>,
    costs: Vec<Vec<u64>>,
    counts: Vec<u64>,
    affected: Vec<u64>,
    retrans_frames: Vec<u64>,
    ack_rtts: Vec<(u64, f64)>,
    stream_packets: Vec<PacketRecord>,
    skipped_not_ip: u64,
    skipped_not_tcp: u64,
    malformed: HashMap<&'static str, u64>,
    unknown_linktypes: HashMap<u32, u64>,
    backwards: u64,
    warnings: Vec<String>,
    /// Per server endpoint: (transactions with a server time, those ≥ SLOW_SERVER_MIN_US).
    server_times: HashMap<SocketAddr, (u64, u64)>,
    /// slow-server candidates, decided in [`Analyzer::finish`] once the server's usual time
    /// is known (kept up to `max_findings`).
    slow_pending: Vec<(usize, Finding)>,
    slow_pending_dropped: u64,
    /// Set while `finish` records the decided slow-server findings.
    deciding: bool,
    /// Per sender: Nagle/delayed-ACK stalls released within about one RTT of their ACK.
    prompt_releases: HashMap<SocketAddr, u64>,
    /// Such stalls released later, decided in `finish` (kept up to `max_findings`).
    late_pending: Vec<(usize, SocketAddr, Finding)>,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self::new(AnalyzeOptions::default())
    }
}

impl Analyzer {
    /// A fresh analyzer.
    pub fn new(opts: AnalyzeOptions) -> Self {
        Analyzer {
            opts,
            frames: 0,
            tcp_frames: 0,
            first_ts: None,
            last_ts: 0,
            max_ts: 0,
            map: HashMap::default(),
            streams: Vec::new(),
            lives: Vec::new(),
            closed: VecDeque::new(),
            transactions: Vec::new(),
            transactions_total: 0,
            findings: Vec::new(),
            costs: vec![Vec::new(); kind::ALL.len()],
            counts: vec![0; kind::ALL.len()],
            affected: vec![0; kind::ALL.len()],
            retrans_frames: Vec::new(),
            ack_rtts: Vec::new(),
            stream_packets: Vec::new(),
            skipped_not_ip: 0,
            skipped_not_tcp: 0,
            malformed: HashMap::new(),
            unknown_linktypes: HashMap::new(),
            backwards: 0,
            warnings: Vec::new(),
            server_times: HashMap::new(),
            slow_pending: Vec::new(),
            slow_pending_dropped: 0,
            deciding: false,
            prompt_releases: HashMap::new(),
            late_pending: Vec::new(),
        }
    }

    /// Streams whose tracking state is held now (open, or closed less than
    /// [`CLOSED_LINGER_NS`] ago).
    pub fn live_streams(&self) -> usize {
        self.lives.iter().filter(|l| l.is_some()).count()
    }

    /// Feeds one frame from a [`crate::CaptureReader`].
    pub fn push_frame(&mut self, f: &crate::Frame<'_>) {
        self.push(f.ts_ns, f.len, f.linktype, f.data);
    }

    /// Records a reader warning.
    pub fn warn(&mut self, w: String) {
        if self.warnings.len() < 1000 {
            self.warnings.push(w);
        }
    }

    /// Feeds one captured frame: timestamp (ns since epoch), original length, link type and
    /// captured bytes. Frames are numbered 1, 2, ... in the order fed.
    pub fn push(&mut self, ts_ns: i64, len: u32, linktype: u32, data: &[u8]) {
        let ts_ns = ts_ns.clamp(0, crate::reader::MAX_TS_NS);
        self.frames += 1;
        let first = *self.first_ts.get_or_insert(ts_ns);
        let _ = first;
        if self.frames > 1 && ts_ns < self.last_ts {
            self.backwards += 1;
        }
        self.last_ts = ts_ns;
        self.max_ts = self.max_ts.max(ts_ns);
        if self
            .closed
            .front()
            .is_some_and(|&(at, _)| self.max_ts - at >= CLOSED_LINGER_NS)
        {
            self.sweep(self.max_ts);
        }
        match wire::decode(linktype, data) {
            Ok(seg) => {
                self.tcp_frames += 1;
                self.track(ts_ns, len, &seg);
            }
            Err(Skip::NotIp) => self.skipped_not_ip += 1,
            Err(Skip::NotTcp) => self.skipped_not_tcp += 1,
            Err(Skip::UnknownLinkType(l)) => *self.unknown_linktypes.entry(l).or_default() += 1,
            Err(Skip::Malformed(why)) => *self.malformed.entry(why).or_default() += 1,
        }
    }

    fn rel_us(&self, ts: i64) -> i64 {
        (ts - self.first_ts.unwrap_or(ts)) / 1000
    }

    fn track(&mut self, ts: i64, frame_len: u32, seg: &TcpSegment<'_>) {
        let frame = self.frames;
        let (s16, d16) = (ip16(seg.src), ip16(seg.dst));
        let src_lo = (s16, seg.sport) <= (d16, seg.dport);
        let key = if src_lo {
            Key {
                lo: s16,
                hi: d16,
                lo_port: seg.sport,
                hi_port: seg.dport,
            }
        } else {
            Key {
                lo: d16,
                hi: s16,
                lo_port: seg.dport,
                hi_port: seg.sport,
            }
        };
        let pure_syn = seg.flags & (flags::SYN | flags::ACK) == flags::SYN;
        let mut idx = self.map.get(&key).copied();
        if let Some(i) = idx {
            // Wireshark: a SYN whose sequence number differs from the one this side used
            // before starts a new conversation on the same ports.
            if pure_syn {
                let st = &self.streams[i as usize];
                let d = usize::from(!(st.a.ip() == seg.src && st.a.port() == seg.sport));
                match self.lives[i as usize].as_deref() {
                    Some(live) => {
                        let dir = &live.dirs[d];
                        if dir
                            .base
                            .is_some_and(|b| dir.isn.map_or(b.wrapping_add(1), |x| x) != seg.seq)
                        {
                            idx = None;
                        }
                    }
                    // Closed long ago and freed: a SYN starts a new stream.
                    None => idx = None,
                }
            }
        }
        let i = match idx {
            Some(i) => i as usize,
            None => {
                let i = self.streams.len();
                let id = u32::try_from(i).unwrap_or(u32::MAX);
                self.map.insert(key, id);
                self.streams.push(StreamSummary {
                    stream: id,
                    a: SocketAddr::new(seg.src, seg.sport),
                    b: SocketAddr::new(seg.dst, seg.dport),
                    a_is_client: true,
                    frames_ab: 0,
                    bytes_ab: 0,
                    frames_ba: 0,
                    bytes_ba: 0,
                    payload_ab: 0,
                    payload_ba: 0,
                    start_us: self.rel_us(ts),
                    duration_us: 0,
                    first_frame: frame,
                    last_frame: frame,
                    syn_a: None,
                    syn_b: None,
                    handshake_rtt_us: None,
                    fin_a: false,
                    fin_b: false,
                    rst_frame: None,
                    retransmissions: 0,
                    transactions: 0,
                });
                self.lives.push(Some(Box::new(Live {
                    dirs: [Dir::default(), Dir::default()],
                    client: None,
                    syn_time: None,
                    synack_time: None,
                    rtt_us: None,
                    min_ack_rtt_us: [None, None],
                    last_ts: ts,
                    txn: None,
                    txn_count: 0,
                    last_data_dir: None,
                    closed_at: None,
                })));
                i
            }
        };
        self.segment(i, ts, frame, frame_len, seg);
    }

    #[allow(clippy::too_many_lines)]
    fn segment(&mut self, i: usize, ts: i64, frame: u64, frame_len: u32, seg: &TcpSegment<'_>) {
        let first_ts = self.first_ts.unwrap_or(ts);
        let st = &mut self.streams[i];
        let d = usize::from(!(st.a.ip() == seg.src && st.a.port() == seg.sport));
        let r = 1 - d;
        let f = seg.flags;
        let len = seg.payload_len;
        if d == 0 {
            st.frames_ab += 1;
            st.bytes_ab += u64::from(frame_len);
            st.payload_ab += u64::from(len);
        } else {
            st.frames_ba += 1;
            st.bytes_ba += u64::from(frame_len);
            st.payload_ba += u64::from(len);
        }
        st.last_frame = frame;
        st.duration_us = u64::try_from((ts - first_ts) / 1000 - st.start_us).unwrap_or(0);
        if f & flags::RST != 0 && st.rst_frame.is_none() {
            st.rst_frame = Some(frame);
        }
        if f & flags::FIN != 0 {
            if d == 0 {
                st.fin_a = true;
            } else {
                st.fin_b = true;
            }
        }
        let both_fin = st.fin_a && st.fin_b;
        let Some(live) = self.lives[i].as_deref_mut() else {
            // A stream closed and freed long ago: counted above, nothing more to analyze.
            return;
        };
        if live.closed_at.is_none() && (f & flags::RST != 0 || both_fin) {
            live.closed_at = Some(ts);
            self.closed.push_back((ts, i));
        }
        let gap_ns = (ts - live.last_ts).max(0);
        let prev_stream_ts = live.last_ts;
        live.last_ts = ts;

        // --- handshake, bases, options
        if f & flags::SYN != 0 {
            let opts = SynOptions::from(seg.options);
            if live.dirs[d].isn.is_none() {
                live.dirs[d].isn = Some(seg.seq);
                live.dirs[d].base = Some(seg.seq);
                live.dirs[d].syn_opts = Some(opts);
                live.dirs[d].syn_ts = Some(ts);
            }
            if d == 0 {
                st.syn_a = Some(opts);
            } else {
                st.syn_b = Some(opts);
            }
            if f & flags::ACK == 0 {
                live.client.get_or_insert(d);
                // Wireshark's iRTT counts from the most recent SYN (ts_mru_syn).
                live.syn_time = Some(ts);
            } else {
                live.client.get_or_insert(r);
                live.synack_time.get_or_insert(ts);
            }
        }
        if live.dirs[d].base.is_none() {
            live.dirs[d].base = Some(seg.seq.wrapping_sub(1));
        }
        if f & flags::ACK != 0 && live.dirs[r].base.is_none() {
            live.dirs[r].base = Some(seg.ack.wrapping_sub(1));
        }
        if live.rtt_us.is_none()
            && f & flags::ACK != 0
            && f & flags::SYN == 0
            && live.client == Some(d)
            && let (Some(s), Some(_)) = (live.syn_time, live.synack_time)
        {
            let rtt = us(ts - s);
            live.rtt_us = Some(rtt);
            st.handshake_rtt_us = Some(rtt);
        }
        if live.client.is_none() && len > 0 {
            // No SYN seen: the side that speaks first with the higher port is the client;
            // otherwise the one with the higher port.
            let (sp, dp) = (seg.sport, seg.dport);
            live.client = Some(if sp >= dp { d } else { r });
        }
        st.a_is_client = live.client != Some(1);
        let wscale = |dir: &Dir, peer: &Dir| match (dir.syn_opts, peer.syn_opts) {
            (Some(a), Some(b)) if a.wscale.is_some() && b.wscale.is_some() => a.wscale.unwrap_or(0),
            _ => 0,
        };
        let win = if f & flags::SYN != 0 {
            u32::from(seg.window)
        } else {
            u32::from(seg.window) << wscale(&live.dirs[d], &live.dirs[r])
        };

        let rel_seq = seg.seq.wrapping_sub(live.dirs[d].base.unwrap_or(seg.seq));
        let rel_ack = if f & flags::ACK != 0 {
            seg.ack.wrapping_sub(live.dirs[r].base.unwrap_or(seg.ack))
        } else {
            0
        };

        // --- Wireshark-style sequence analysis (keep-alive, retransmission kinds)
        let syn_fin = f & (flags::SYN | flags::FIN) != 0;
        let seq = seg.seq;
        let mut retrans: Option<&'static str> = None;
        {
            let (fw, rv) = {
                let (a, b) = live.dirs.split_at_mut(1);
                if d == 0 {
                    (&mut a[0], &mut b[0])
                } else {
                    (&mut b[0], &mut a[0])
                }
            };
            let keep_alive = len <= 1
                && f & (flags::SYN | flags::FIN | flags::RST) == 0
                && fw.next_seq.is_some_and(|n| n.wrapping_sub(1) == seq);
            let zwp = len == 1 && fw.next_seq == Some(seq) && rv.window == Some(0);
            if !keep_alive
                && !zwp
                && (len > 0 || syn_fin)
                && fw.next_seq.is_some_and(|n| seq_lt(seq, n))
            {
                let n = fw.next_seq.unwrap_or(seq);
                let since_dupack = ts - rv.last_ack_time;
                let ooo_thres: i64 = live.rtt_us.map_or(3_000_000, |r| (r as i64) * 1000);
                let ooo_thres = if ooo_thres == 0 { 3_000_000 } else { ooo_thres };
                if rv.dupacks >= 2 && rv.last_ack == Some(seq) && since_dupack < 20_000_000 {
                    retrans = Some("fast");
                } else if ts - fw.next_seq_time < ooo_thres && n != seq.wrapping_add(len) {
                    // out of order, not a retransmission
                } else if len > 0
                    && rv
                        .last_ack
                        .is_some_and(|a| seq_le(seq.wrapping_add(len), a))
                {
                    retrans = Some("spurious");
                } else {
                    retrans = Some("rto");
                }
            }
            // Remember the segment as unacknowledged.
            let mut nextseq = seq.wrapping_add(len);
            if syn_fin {
                nextseq = nextseq.wrapping_add(1);
            }
            if (len > 0 || syn_fin) && fw.unacked.len() < MAX_UNACKED {
                fw.unacked.push_back(Unacked {
                    seq,
                    nextseq,
                    frame,
                    ts,
                });
            }
            // Duplicate ACK bookkeeping (Wireshark: same window, seq, ack; no payload).
            let is_dupack = len == 0
                && f & flags::ACK != 0
                && win != 0
                && fw.window == Some(win)
                && fw.next_seq == Some(seq)
                && fw.last_ack == Some(seg.ack)
                && f & (flags::SYN | flags::FIN | flags::RST) == 0;
            // Wireshark keeps counting across a pure window update (same seq and ack).
            let window_update = len == 0
                && f & flags::ACK != 0
                && win != 0
                && fw.window != Some(win)
                && fw.next_seq == Some(seq)
                && fw.last_ack == Some(seg.ack)
                && f & (flags::SYN | flags::FIN | flags::RST) == 0;
            if is_dupack {
                fw.dupacks += 1;
            } else if !window_update {
                fw.dupacks = 0;
            }
            if !zwp && fw.next_seq.is_none_or(|n| seq_lt(n, nextseq)) {
                fw.next_seq = Some(nextseq);
                fw.next_seq_time = ts;
            }
            if f & flags::ACK != 0 {
                fw.last_ack = Some(seg.ack);
                fw.last_ack_time = ts;
            }
            fw.window = Some(win);
            fw.last_ts = ts;
        }

        // --- ACK processing: ack_rtt (Wireshark's exact-match rule), release events
        let mut ack_rtt_ns: Option<i64> = None;
        let mut newly_acked_oldest: Option<i64> = None;
        if f & flags::ACK != 0 {
            let ack = seg.ack;
            let peer = &mut live.dirs[r];
            let mut oldest_exact: Option<i64> = None;
            peer.unacked.retain_mut(|u| {
                if u.nextseq == ack {
                    if oldest_exact.is_none_or(|t| u.ts < t) {
                        oldest_exact = Some(u.ts);
                    }
                    newly_acked_oldest =
                        Some(newly_acked_oldest.map_or(u.ts, |t: i64| t.min(u.ts)));
                    false
                } else if seq_lt(u.seq, ack) && seq_le(ack, u.nextseq) {
                    u.seq = ack;
                    newly_acked_oldest =
                        Some(newly_acked_oldest.map_or(u.ts, |t: i64| t.min(u.ts)));
                    true
                } else if seq_lt(ack, u.nextseq) {
                    true
                } else {
                    newly_acked_oldest =
                        Some(newly_acked_oldest.map_or(u.ts, |t: i64| t.min(u.ts)));
                    false
                }
            });
            if let Some(t0) = oldest_exact {
                ack_rtt_ns = Some(ts - t0);
            }
        }
        if let Some(rtt) = ack_rtt_ns {
            let v = us(rtt);
            let m = &mut live.min_ack_rtt_us[d];
            *m = Some(m.map_or(v, |x| x.min(v)));
            if self.opts.keep_stream == Some(st.stream) {
                self.ack_rtts.push((frame, rtt as f64 / 1e9));
            }
        }
        // Path RTT estimate for thresholds.
        let rtt_est_us = live
            .rtt_us
            .or_else(|| match live.min_ack_rtt_us {
                [Some(a), Some(b)] => Some(a + b),
                [Some(a), None] | [None, Some(a)] => Some(a),
                _ => None,
            })
            .unwrap_or(1_000)
            .max(50);
        // Which side is far from the capture point, and by how much: for an ACK from a far
        // side, the path RTT is part of what we see and not part of its delay.
        let far_rtt_us = |side: usize| -> u64 {
            match (live.syn_time, live.synack_time, live.rtt_us, live.client) {
                (Some(s), Some(sa), Some(total), Some(c)) => {
                    let leg1 = us(sa - s); // client->server->client (seen near the client)
                    let leg2 = total.saturating_sub(leg1);
                    let near_client = leg1 >= leg2;
                    if (side == c) != near_client { total } else { 0 }
                }
                _ => 0,
            }
        };
        let stream_id = st.stream;
        let mut new_findings: Vec<Finding> = Vec::new();
        // The stall finding pushed last was released later than about one RTT after its ACK.
        let mut late_release = false;
        let txn_index = live.txn.as_ref().map(|t| t.t.index);

        if f & flags::ACK != 0
            && let Some(oldest) = newly_acked_oldest
        {
            let far = far_rtt_us(d);
            let delay = us(ts - oldest).saturating_sub(far);
            let ev = AckEv {
                frame,
                ts,
                delay_us: delay,
                no_data: len == 0 && f & (flags::SYN | flags::RST) == 0,
            };
            live.dirs[d].last_new_ack = Some(ev);
            let peer = &mut live.dirs[r];
            if peer.small_unacked
                && let Some(sm) = peer.last_small
                && seq_le(sm.end, seg.ack)
            {
                peer.small_unacked = false;
                peer.small_release = Some(ev);
            }
        }

        // --- zero window / window full
        if f & (flags::SYN | flags::RST) == 0 {
            if win == 0 && f & flags::ACK != 0 {
                if live.dirs[d].zero_window.is_none() {
                    live.dirs[d].zero_window = Some((frame, ts));
                }
            } else if let Some((zf, zts)) = live.dirs[d].zero_window.take()
                && us(ts - zts) >= (2 * rtt_est_us).max(1_000)
            {
                // A window closed for less than a couple of RTTs costs nothing measurable.
                new_findings.push(Finding {
                    kind: kind::ZERO_WINDOW.into(),
                    detail: None,
                    stream: stream_id,
                    transaction: txn_index,
                    frames: vec![zf, frame],
                    start_us: (zts - first_ts) / 1000,
                    end_us: (ts - first_ts) / 1000,
                    cost_us: us(ts - zts),
                    explanation: format!(
                        "receiver advertised a zero window for {:.1} ms (frames {zf}..{frame})",
                        (ts - zts) as f64 / 1e6
                    ),
                });
            }
        }

        // --- data segments: stalls
        if len > 0 {
            let mss = live.dirs[d].mss(&live.dirs[r]);
            if retrans.is_none() {
                let small = len < mss;
                let prev = live.dirs[d].last_data;
                let same_run = live.last_data_dir == Some(d);
                // Window full: data in flight had reached the peer's window.
                // A sender that was limited by the receiver's window is not held by Nagle.
                let window_limited = live.dirs[d].window_full.is_some();
                if let Some((wf, wts)) = live.dirs[d].window_full.take() {
                    let gap = us(ts - wts);
                    if gap >= (2 * rtt_est_us).max(1_000) {
                        new_findings.push(Finding {
                            kind: kind::WINDOW_FULL.into(),
                            detail: None,
                            stream: stream_id,
                            transaction: txn_index,
                            frames: vec![wf, frame],
                            start_us: (wts - first_ts) / 1000,
                            end_us: (ts - first_ts) / 1000,
                            cost_us: gap,
                            explanation: format!(
                                "sender filled the receiver's window at frame {wf} and waited {:.1} ms",
                                gap as f64 / 1000.0
                            ),
                        });
                    }
                }
                if let Some(p) = prev.filter(|_| same_run) {
                    let gap = us(ts - p.ts);
                    let stall_min = (2 * rtt_est_us).max(1_000);
                    let release_tol = (2 * rtt_est_us).max(10_000);
                    // Data waiting for an ACK leaves while the kernel processes that ACK (no
                    // scheduling of the application in between): at the capture point it
                    // follows within about one path RTT. A later release may be a server's
                    // own pause that ended near a delayed ACK by chance (seen: a loaded nginx
                    // with tcp_nodelay on paused 44 ms between two writes and resumed 4 ms
                    // after the client's delayed ACK, RTT 50 µs) — or a real Nagle hold whose
                    // sender was slow to run (the reference capture has one released 4.1 ms
                    // late among 65 released at once). Such a stall is kept only when the
                    // same sender has stalls released at once (decided in `finish`).
                    let tight_tol = 2 * rtt_est_us + RELEASE_SLACK_US;
                    let since_other = us(ts - prev_stream_ts);
                    // The peer's pure ACKs may come in the gap: a corked tail's ceiling
                    // timer (the probe timer, RTO ≥ 200 ms) starts when the head is ACKed.
                    let peer_data_in_gap = live.dirs[r].last_data.is_some_and(|x| x.ts > p.ts);
                    let nagle = small
                        && !window_limited
                        && gap >= stall_min
                        && live.dirs[d].small_release.is_some_and(|a| {
                            a.ts >= p.ts && us(ts - a.ts) <= release_tol && us(ts - a.ts) * 2 <= gap
                        });
                    if nagle {
                        let a = live.dirs[d].small_release.unwrap_or(AckEv {
                            frame,
                            ts,
                            delay_us: 0,
                            no_data: false,
                        });
                        let sm = live.dirs[d].last_small.unwrap_or(p);
                        let delayed = a.no_data && a.delay_us >= DELAYED_ACK_MIN_US;
                        let (k, why) = if delayed {
                            (
                                kind::NAGLE_DELAYED_ACK,
                                format!(
                                    "{} B held by Nagle behind the unacknowledged {} B segment (frame {}) until the peer's ACK {:.1} ms later (frame {}, delayed ACK); sent {:.1} ms after it",
                                    len,
                                    sm.len,
                                    sm.frame,
                                    a.delay_us as f64 / 1000.0,
                                    a.frame,
                                    us(ts - a.ts) as f64 / 1000.0
                                ),
                            )
                        } else {
                            (
                                kind::NAGLE_STALL,
                                format!(
                                    "{} B held by Nagle behind the unacknowledged {} B segment (frame {}) until the peer's ACK (frame {}, {:.1} ms)",
                                    len,
                                    sm.len,
                                    sm.frame,
                                    a.frame,
                                    a.delay_us as f64 / 1000.0
                                ),
                            )
                        };
                        let mut frames = vec![sm.frame, a.frame, frame];
                        if p.frame != sm.frame {
                            frames.insert(1, p.frame);
                        }
                        frames.sort_unstable();
                        frames.dedup();
                        late_release = us(ts - a.ts) > tight_tol;
                        new_findings.push(Finding {
                            kind: k.into(),
                            detail: None,
                            stream: stream_id,
                            transaction: txn_index,
                            frames,
                            start_us: (p.ts - first_ts) / 1000,
                            end_us: (ts - first_ts) / 1000,
                            cost_us: gap,
                            explanation: why,
                        });
                    } else if gap >= stall_min
                        // A sender that had filled the window waited for the reader to
                        // make room: the late ACK is a window update (window-full), not a
                        // delayed ACK.
                        && !window_limited
                        && let Some(a) = live.dirs[r].last_new_ack
                        && a.ts >= p.ts
                        && a.no_data
                        && a.delay_us >= DELAYED_ACK_MIN_US
                        && us(ts - a.ts) <= release_tol
                        && us(ts - a.ts) * 2 <= gap
                    {
                        late_release = us(ts - a.ts) > tight_tol;
                        new_findings.push(Finding {
                            kind: kind::DELAYED_ACK.into(),
                            detail: None,
                            stream: stream_id,
                            transaction: txn_index,
                            frames: vec![p.frame, a.frame, frame],
                            start_us: (p.ts - first_ts) / 1000,
                            end_us: (ts - first_ts) / 1000,
                            cost_us: gap,
                            explanation: format!(
                                "the peer's ACK came {:.1} ms late (frame {}) and the sender's next data waited for it",
                                a.delay_us as f64 / 1000.0,
                                a.frame
                            ),
                        });
                    } else if small && !peer_data_in_gap && is_cork_gap(since_other, rtt_est_us) {
                        new_findings.push(cork_finding(
                            stream_id, txn_index, p.frame, frame, p.ts, ts, first_ts, len, false,
                        ));
                    }
                } else if small
                    && txn_index.is_some()
                    && live.txn.as_ref().is_some_and(|t| t.resp_first_ts.is_none())
                    && is_cork_gap(us(gap_ns), rtt_est_us)
                {
                    // A response's first partial segment released at the cork ceiling.
                    let pf = live
                        .txn
                        .as_ref()
                        .and_then(|t| t.t.request_last_frame)
                        .unwrap_or(frame);
                    if let Some(t) = live.txn.as_mut() {
                        t.kinds |= kind_bit(kind::TCP_CORK);
                    }
                    new_findings.push(cork_finding(
                        stream_id,
                        txn_index,
                        pf,
                        frame,
                        prev_stream_ts,
                        ts,
                        first_ts,
                        len,
                        true,
                    ));
                }
                let end = seq.wrapping_add(len);
                let dd = &mut live.dirs[d];
                dd.last_data = Some(DataSeg {
                    frame,
                    ts,
                    len,
                    end,
                });
                if small {
                    dd.last_small = Some(DataSeg {
                        frame,
                        ts,
                        len,
                        end,
                    });
                    dd.small_unacked = true;
                    dd.small_release = None;
                }
                dd.max_len = dd.max_len.max(len);
                // Did this fill the peer's window?
                let peer = &live.dirs[r];
                if let (Some(w), Some(a)) = (peer.window, peer.last_ack)
                    && w > 0
                    && f & flags::SYN == 0
                    && end.wrapping_sub(a) >= w
                    && end.wrapping_sub(a) < 1 << 30
                {
                    live.dirs[d].window_full = Some((frame, ts));
                }
            } else {
                live.dirs[d].max_len = live.dirs[d].max_len.max(len);
            }
            live.last_data_dir = Some(d);
            // Transactions.
            let client = live.client.unwrap_or(0);
            if d == client {
                let new_txn = live.txn.as_ref().is_none_or(|t| t.resp_first_ts.is_some());
                if new_txn && retrans.is_none() {
                    if let Some(t) = live.txn.take() {
                        self.transactions_total += 1;
                        let (done, think) =
                            finish_txn(t, far_rtt_us(1 - client), &mut new_findings);
                        let sv = &self.streams[i];
                        note_server_time(
                            &mut self.server_times,
                            if client == 0 { sv.b } else { sv.a },
                            think,
                        );
                        self.streams[i].transactions += 1;
                        if self.transactions.len() < self.opts.max_transactions {
                            self.transactions.push(done);
                        }
                    }
                    let line = request_line(seg.payload);
                    live.txn = Some(Txn {
                        t: Transaction {
                            stream: stream_id,
                            index: live.txn_count,
                            request_line: line,
                            status: None,
                            request_bytes: 0,
                            response_bytes: 0,
                            request_first_frame: Some(frame),
                            request_last_frame: Some(frame),
                            response_first_frame: None,
                            response_last_frame: None,
                            start_us: (ts - first_ts) / 1000,
                            time_to_first_byte_us: None,
                            time_to_last_byte_us: None,
                            server_time_us: None,
                        },
                        req_first_ts: ts,
                        req_last_ts: ts,
                        resp_first_ts: None,
                        resp_last_ts: ts,
                        kinds: 0,
                    });
                    live.txn_count += 1;
                }
                if let Some(t) = live.txn.as_mut()
                    && t.resp_first_ts.is_none()
                {
                    if retrans.is_none() {
                        t.t.request_bytes += u64::from(len);
                    }
                    // A retransmitted request reaches the server only now: the server's
                    // time starts here, the wait before it belongs to the retransmission.
                    t.t.request_last_frame = Some(frame);
                    t.req_last_ts = ts;
                }
            } else {
                if live.txn.is_none() {
                    live.txn = Some(Txn {
                        t: Transaction {
                            stream: stream_id,
                            index: live.txn_count,
                            request_line: None,
                            status: None,
                            request_bytes: 0,
                            response_bytes: 0,
                            request_first_frame: None,
                            request_last_frame: None,
                            response_first_frame: None,
                            response_last_frame: None,
                            start_us: (ts - first_ts) / 1000,
                            time_to_first_byte_us: None,
                            time_to_last_byte_us: None,
                            server_time_us: None,
                        },
                        req_first_ts: ts,
                        req_last_ts: ts,
                        resp_first_ts: None,
                        resp_last_ts: ts,
                        kinds: 0,
                    });
                    live.txn_count += 1;
                }
                if let Some(t) = live.txn.as_mut() {
                    if t.resp_first_ts.is_none() {
                        t.resp_first_ts = Some(ts);
                        t.t.response_first_frame = Some(frame);
                        t.t.status = status_code(seg.payload);
                    }
                    t.t.response_bytes += u64::from(len);
                    t.t.response_last_frame = Some(frame);
                    t.resp_last_ts = ts;
                }
            }
        }

        // --- SYN retransmission and retransmission findings
        if let Some(kind_detail) = retrans {
            self.streams[i].retransmissions += 1;
            if self.retrans_frames.len() < self.opts.max_findings {
                self.retrans_frames.push(frame);
            }
            let Some(live) = self.lives[i].as_deref() else {
                return;
            };
            let orig = live.dirs[d]
                .unacked
                .iter()
                .find(|u| u.seq == seq && u.frame != frame)
                .map(|u| (u.frame, u.ts));
            let (of, ots) = if f & flags::SYN != 0 {
                (None, live.dirs[d].syn_ts.unwrap_or(ts))
            } else {
                match orig {
                    Some((of, ots)) => (Some(of), ots),
                    None => (None, live.dirs[d].next_seq_time.min(ts)),
                }
            };
            let cost = us(ts - ots);
            let mut frames: Vec<u64> = of.into_iter().collect();
            frames.push(frame);
            let (k, detail, why) = if f & flags::SYN != 0 {
                (
                    kind::SYN_RETRANSMIT,
                    None,
                    format!(
                        "{} retransmitted {:.0} ms after the first: setup waited for the SYN timer",
                        if f & flags::ACK != 0 {
                            "SYN-ACK"
                        } else {
                            "SYN"
                        },
                        cost as f64 / 1000.0
                    ),
                )
            } else {
                (
                    kind::RETRANSMISSION,
                    Some(kind_detail.to_string()),
                    format!(
                        "{kind_detail} retransmission of {len} B at relative seq {rel_seq}, {:.1} ms after it was first sent",
                        cost as f64 / 1000.0
                    ),
                )
            };
            new_findings.push(Finding {
                kind: k.into(),
                detail,
                stream: stream_id,
                transaction: txn_index,
                frames,
                start_us: (ots - first_ts) / 1000,
                end_us: (ts - first_ts) / 1000,
                cost_us: if kind_detail == "spurious" { 0 } else { cost },
                explanation: why,
            });
        }

        // --- kept stream packets
        if self.opts.keep_stream == Some(stream_id) {
            self.stream_packets.push(PacketRecord {
                frame,
                time_us: (ts - first_ts) / 1000,
                a_to_b: d == 0,
                flags: f,
                seq: rel_seq,
                ack: rel_ack,
                len,
                window: u64::from(win),
                gap_us: if self.stream_packets.is_empty() {
                    0
                } else {
                    us(gap_ns)
                },
                payload: seg.payload.to_vec(),
                marks: Vec::new(),
            });
        }

        let sender = if d == 0 {
            self.streams[i].a
        } else {
            self.streams[i].b
        };
        for fnd in new_findings {
            let stall = [
                kind::NAGLE_DELAYED_ACK,
                kind::NAGLE_STALL,
                kind::DELAYED_ACK,
            ]
            .contains(&fnd.kind.as_str());
            if stall && late_release {
                if self.late_pending.len() < self.opts.max_findings {
                    self.late_pending.push((i, sender, fnd));
                }
                continue;
            }
            if stall {
                *self.prompt_releases.entry(sender).or_default() += 1;
            }
            self.record(i, fnd);
        }
    }

    fn record(&mut self, i: usize, f: Finding) {
        let Some(k) = kind::ALL.iter().position(|k| *k == f.kind) else {
            return;
        };
        if f.kind == kind::SLOW_SERVER && !self.deciding {
            if self.slow_pending.len() < self.opts.max_findings {
                self.slow_pending.push((i, f));
            } else {
                self.slow_pending_dropped += 1;
            }
            return;
        }
        self.counts[k] += 1;
        if self.costs[k].len() < 1_000_000 {
            self.costs[k].push(f.cost_us);
        }
        let bit = 1u16 << k;
        if let Some(t) = self.lives[i].as_deref_mut().and_then(|l| l.txn.as_mut())
            && Some(t.t.index) == f.transaction
        {
            if t.kinds & bit == 0 {
                self.affected[k] += 1;
            }
            t.kinds |= bit;
        } else if f.transaction.is_some() || f.kind == kind::SLOW_SERVER {
            // Finished transaction (slow-server is decided at its end).
            self.affected[k] += 1;
        }
        if self.findings.len() < self.opts.max_findings {
            self.findings.push(f);
        }
    }

    /// Finishes the open transaction of stream `i`, if any.
    fn close_txn(&mut self, i: usize) {
        let Some(live) = self.lives[i].as_deref_mut() else {
            return;
        };
        let Some(t) = live.txn.take() else {
            return;
        };
        let far = match (live.syn_time, live.synack_time, live.rtt_us, live.client) {
            (Some(s), Some(sa), Some(total), Some(_)) => {
                let leg1 = us(sa - s);
                if leg1 >= total.saturating_sub(leg1) {
                    total
                } else {
                    0
                }
            }
            _ => 0,
        };
        let mut fs = Vec::new();
        let (done, think) = finish_txn(t, far, &mut fs);
        let client = live.client.unwrap_or(0);
        let sv = &self.streams[i];
        note_server_time(
            &mut self.server_times,
            if client == 0 { sv.b } else { sv.a },
            think,
        );
        self.transactions_total += 1;
        self.streams[i].transactions += 1;
        if self.transactions.len() < self.opts.max_transactions {
            self.transactions.push(done);
        }
        for f in fs {
            self.record(i, f);
        }
    }

    /// Frees the state of streams that closed more than [`CLOSED_LINGER_NS`] before `now`:
    /// memory follows the connections alive in the capture, not its length.
    fn sweep(&mut self, now: i64) {
        while let Some(&(at, i)) = self.closed.front() {
            if now - at < CLOSED_LINGER_NS {
                break;
            }
            self.closed.pop_front();
            self.close_txn(i);
            self.lives[i] = None;
        }
    }

    /// Ends the analysis and returns the result.
    pub fn finish(mut self) -> Analysis {
        // Close open transactions.
        for i in 0..self.lives.len() {
            self.close_txn(i);
        }
        // Stalls released late: kept when their sender is seen to stall for the same cause.
        for (i, sender, mut f) in std::mem::take(&mut self.late_pending) {
            let prompt = self.prompt_releases.get(&sender).copied().unwrap_or(0);
            if prompt > 0 {
                f.explanation.push_str(&format!(
                    "; released later than one RTT after the ACK, kept because this sender has {prompt} such stalls released at once"
                ));
                self.record(i, f);
            }
        }
        // slow-server: now that each server's usual time is known.
        self.deciding = true;
        for (i, f) in std::mem::take(&mut self.slow_pending) {
            let st = &self.streams[i];
            let server = if st.a_is_client { st.b } else { st.a };
            let (n, slow) = self.server_times.get(&server).copied().unwrap_or((1, 1));
            let usual = slow * 2 >= n;
            if usual || f.cost_us >= SLOW_SERVER_ALONE_US {
                let mut f = f;
                f.explanation.push_str(&if usual {
                    format!(
                        "; {slow} of this server's {n} transactions took ≥ {} ms",
                        SLOW_SERVER_MIN_US / 1000
                    )
                } else {
                    format!(
                        "; an exception: {slow} of this server's {n} transactions took ≥ {} ms",
                        SLOW_SERVER_MIN_US / 1000
                    )
                });
                self.record(i, f);
            }
        }
        if self.slow_pending_dropped > 0 {
            self.warnings.push(format!(
                "{} slow-server candidates beyond --max-findings were not evaluated",
                self.slow_pending_dropped
            ));
        }
        self.transactions.sort_by_key(|t| (t.stream, t.index));
        // Marks on kept packets.
        if let Some(ks) = self.opts.keep_stream {
            let mut marks: HashMap<u64, Vec<String>> = HashMap::new();
            for f in self.findings.iter().filter(|f| f.stream == ks) {
                for fr in &f.frames {
                    let m = marks.entry(*fr).or_default();
                    if !m.contains(&f.kind) {
                        m.push(f.kind.clone());
                    }
                }
            }
            for p in &mut self.stream_packets {
                if let Some(m) = marks.remove(&p.frame) {
                    p.marks = m;
                }
            }
        }
        let total_tx = self.transactions_total.max(1);
        let mut summary = Vec::new();
        for (k, name) in kind::ALL.iter().enumerate() {
            if self.counts[k] == 0 {
                continue;
            }
            let v = &mut self.costs[k];
            v.sort_unstable();
            summary.push(KindSummary {
                kind: (*name).to_string(),
                findings: self.counts[k],
                transactions_affected: self.affected[k],
                share: self.affected[k] as f64 / total_tx as f64,
                median_us: percentile(v, 0.5),
                p99_us: percentile(v, 0.99),
                total_us: v.iter().sum(),
            });
        }
        let mut warnings = std::mem::take(&mut self.warnings);
        if self.skipped_not_ip > 0 {
            warnings.push(format!(
                "{} frames are not IP; skipped",
                self.skipped_not_ip
            ));
        }
        if self.skipped_not_tcp > 0 {
            warnings.push(format!(
                "{} IP frames are not TCP (or are non-first fragments); skipped",
                self.skipped_not_tcp
            ));
        }
        let mut lts: Vec<_> = self.unknown_linktypes.iter().collect();
        lts.sort();
        for (lt, n) in lts {
            warnings.push(format!("{n} frames of unknown link type {lt}; skipped"));
        }
        let mut mal: Vec<_> = self.malformed.iter().collect();
        mal.sort();
        for (why, n) in mal {
            warnings.push(format!(
                "{n} frames with malformed headers ({why}); skipped"
            ));
        }
        if self.backwards > 0 {
            warnings.push(format!(
                "{} frames have timestamps earlier than the frame before; gaps around them are clamped to 0",
                self.backwards
            ));
        }
        let first = self.first_ts.unwrap_or(0);
        let mut total: Vec<u64> = self
            .transactions
            .iter()
            .filter_map(|t| t.time_to_last_byte_us)
            .collect();
        let mut server: Vec<u64> = self
            .transactions
            .iter()
            .filter_map(|t| t.server_time_us)
            .collect();
        total.sort_unstable();
        server.sort_unstable();
        let transaction_stats = TransactionStats {
            complete: total.len() as u64,
            median_us: percentile(&total, 0.5),
            p99_us: percentile(&total, 0.99),
            max_us: total.last().copied().unwrap_or(0),
            median_server_us: percentile(&server, 0.5),
        };
        Analysis {
            frames: self.frames,
            tcp_frames: self.tcp_frames,
            first_ts_ns: first,
            duration_us: us(self.max_ts - first),
            streams: self.streams,
            transactions_total: self.transactions_total,
            transactions: self.transactions,
            transaction_stats,
            findings: self.findings,
            summary,
            retransmitted_frames: self.retrans_frames,
            ack_rtts: self.ack_rtts,
            stream_packets: self.stream_packets,
            warnings,
        }
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let idx = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[idx]
}

fn kind_bit(k: &str) -> u16 {
    kind::ALL
        .iter()
        .position(|x| *x == k)
        .map_or(0, |p| 1u16 << p)
}

fn is_cork_gap(gap_us: u64, rtt_us: u64) -> bool {
    // Released at the 200 ms ceiling: allow timer slack and the path RTT after it.
    gap_us >= CORK_CEILING_US - 5_000 && gap_us <= CORK_CEILING_US + 30_000 + 2 * rtt_us
}

#[allow(clippy::too_many_arguments)]
fn cork_finding(
    stream: u32,
    txn: Option<u32>,
    prev_frame: u64,
    frame: u64,
    prev_ts: i64,
    ts: i64,
    first_ts: i64,
    len: u32,
    whole_response: bool,
) -> Finding {
    let why = if whole_response {
        format!(
            "the whole response ({len} B, one partial segment) left {:.1} ms after the request, at the 200 ms TCP_CORK ceiling, with no ACK or new data to explain it; a server that thinks ~200 ms before writing looks the same on the wire (check the server's TCP_CORK with `lagtrace sockets`)",
            (ts - prev_ts) as f64 / 1e6
        )
    } else {
        format!(
            "partial {len} B tail sent {:.1} ms after the head of the response, at the 200 ms TCP_CORK ceiling after the stream's last packet, with no new data to explain it",
            (ts - prev_ts) as f64 / 1e6
        )
    };
    Finding {
        kind: kind::TCP_CORK.into(),
        detail: None,
        stream,
        transaction: txn,
        frames: vec![prev_frame, frame],
        start_us: (prev_ts - first_ts) / 1000,
        end_us: (ts - first_ts) / 1000,
        cost_us: us(ts - prev_ts),
        explanation: why,
    }
}

fn note_server_time(
    map: &mut HashMap<SocketAddr, (u64, u64)>,
    server: SocketAddr,
    think: Option<u64>,
) {
    if let Some(th) = think {
        let e = map.entry(server).or_default();
        e.0 += 1;
        e.1 += u64::from(th >= SLOW_SERVER_MIN_US);
    }
}

/// Closes a transaction; returns it with the server's think time (server time less the
/// path RTT seen in it) when it has both a request and a response. A slow-server candidate
/// goes to `out`; [`Analyzer::finish`] decides it against the server's usual time.
fn finish_txn(
    t: Txn,
    server_far_rtt_us: u64,
    out: &mut Vec<Finding>,
) -> (Transaction, Option<u64>) {
    let mut tx = t.t;
    let mut think_out = None;
    if let Some(rf) = t.resp_first_ts {
        if tx.request_first_frame.is_some() {
            tx.time_to_first_byte_us = Some(us(rf - t.req_first_ts));
            tx.time_to_last_byte_us = Some(us(t.resp_last_ts - t.req_first_ts));
            let server = us(rf - t.req_last_ts);
            tx.server_time_us = Some(server);
            let think = server.saturating_sub(server_far_rtt_us);
            think_out = Some(think);
            let total = us(t.resp_last_ts - t.req_first_ts).max(1);
            let corked = t.kinds & kind_bit(kind::TCP_CORK) != 0;
            if !corked && think >= SLOW_SERVER_MIN_US && think * 2 >= total {
                out.push(Finding {
                    kind: kind::SLOW_SERVER.into(),
                    detail: None,
                    stream: tx.stream,
                    transaction: Some(tx.index),
                    frames: [tx.request_last_frame, tx.response_first_frame]
                        .into_iter()
                        .flatten()
                        .collect(),
                    start_us: tx.start_us + i64::try_from(us(t.req_last_ts - t.req_first_ts)).unwrap_or(0),
                    end_us: tx.start_us + i64::try_from(us(rf - t.req_first_ts)).unwrap_or(0),
                    cost_us: think,
                    explanation: format!(
                        "server took {:.1} ms from the request's last byte to the response's first byte, {:.0}% of the {:.1} ms exchange",
                        think as f64 / 1000.0,
                        100.0 * think as f64 / total as f64,
                        total as f64 / 1000.0
                    ),
                });
            }
        }
    }
    (tx, think_out)
}

fn request_line(p: &[u8]) -> Option<String> {
    const METHODS: [&[u8]; 9] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"HEAD ",
        b"DELETE ",
        b"OPTIONS ",
        b"PATCH ",
        b"CONNECT ",
        b"TRACE ",
    ];
    if !METHODS.iter().any(|m| p.starts_with(m)) {
        return None;
    }
    let end = p
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(p.len());
    let line = &p[..end.min(200)];
    let s = std::str::from_utf8(line).ok()?;
    if end < p.len() && !s.contains(" HTTP/1.") {
        return None;
    }
    Some(s.to_string())
}

fn status_code(p: &[u8]) -> Option<u16> {
    if p.len() >= 12 && p.starts_with(b"HTTP/1.") && p[8] == b' ' {
        std::str::from_utf8(&p[9..12]).ok()?.parse().ok()
    } else {
        None
    }
}

/// Wireshark-style flag string (`ACK PSH`, ...).
pub fn flags_str(f: u8) -> String {
    let names = [
        (flags::SYN, "SYN"),
        (flags::FIN, "FIN"),
        (flags::RST, "RST"),
        (flags::PSH, "PSH"),
        (flags::ACK, "ACK"),
        (flags::URG, "URG"),
        (flags::ECE, "ECE"),
        (flags::CWR, "CWR"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| f & b != 0)
        .map(|(_, n)| *n)
        .collect();
    v.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_lines() {
        assert_eq!(
            request_line(b"GET / HTTP/1.1\r\nHost: x\r\n").as_deref(),
            Some("GET / HTTP/1.1")
        );
        assert_eq!(request_line(b"\x16\x03\x01"), None);
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_code(b"HTTP/1.1 20"), None);
    }

    #[test]
    fn seq_compare_wraps() {
        assert!(seq_lt(u32::MAX - 5, 3));
        assert!(!seq_lt(3, u32::MAX - 5));
        assert!(seq_le(7, 7));
    }
}
