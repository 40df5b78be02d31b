//! What the tracker tells the detectors about one segment.

/// A data segment as the detectors remember it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DataSeg {
    /// Frame number.
    pub frame: u64,
    /// Capture time, ns since the epoch.
    pub ts: i64,
    /// Payload length.
    pub len: u32,
    /// Sequence number after the payload (absolute).
    pub end: u32,
    /// Packets of its sender the capture never saw came just before it (its IPv4
    /// identifications skip them): it is the resend of data dropped before the capture.
    pub after_unseen: bool,
}

/// An ACK that newly acknowledged data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AckAdvance {
    /// Frame of the ACK.
    pub frame: u64,
    /// When it was seen, ns since the epoch.
    pub ts: i64,
    /// Time since the oldest data segment this ACK newly covered was seen, less the path RTT
    /// when the ACK comes from the side far from the capture point.
    pub delay_us: u64,
    /// Its acknowledgement number.
    pub ack: u32,
    /// Bytes it newly acknowledged.
    pub bytes: u64,
    /// Bytes it newly acknowledged of data seen [`super::tcp::RECEIVER_HELD_US`] or more
    /// before it (less the path RTT, as `delay_us`): what the receiver sat on.
    pub held_bytes: u64,
    /// No payload, no SYN, no RST (a FIN may carry it).
    pub no_data: bool,
}

/// How Wireshark would classify a retransmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RetransKind {
    /// After three duplicate ACKs (`tcp.analysis.fast_retransmission`).
    Fast,
    /// Of data the peer had already acknowledged.
    Spurious,
    /// After a timeout (`tcp.analysis.retransmission`).
    Rto,
}

impl RetransKind {
    /// The finding's `detail` string.
    pub fn as_str(self) -> &'static str {
        match self {
            RetransKind::Fast => "fast",
            RetransKind::Spurious => "spurious",
            RetransKind::Rto => "rto",
        }
    }
}

/// A retransmitted segment and the original it repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retrans {
    /// Wireshark's kind.
    pub kind: RetransKind,
    /// Frame of the original, when it is still among the unacknowledged segments.
    pub orig_frame: Option<u64>,
    /// When the original was sent (for a SYN: the first SYN; without an original: when the
    /// sender's highest sequence number last advanced).
    pub orig_ts: i64,
}

/// A segment with payload, seen from its direction's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DataInfo {
    /// The sender's MSS as far as it is known (before this segment counts).
    pub mss: u32,
    /// The sender's previous fresh data segment, when the stream's previous payload went
    /// the same way (a run of data in one direction).
    pub prev_same_run: Option<DataSeg>,
    /// The peer's latest fresh data segment.
    pub peer_last: Option<DataSeg>,
}

/// One TCP segment after the tracker has updated its connection: the input of every detector.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seg<'a> {
    /// Stream index.
    pub stream: u32,
    /// Direction: 0 from A (the stream's first source) to B, 1 back.
    pub dir: usize,
    /// The client's direction (0 when not known yet).
    pub client: usize,
    /// Frame number.
    pub frame: u64,
    /// Capture time, ns since the epoch.
    pub ts: i64,
    /// TCP flags.
    pub flags: u8,
    /// Absolute sequence number.
    pub seq: u32,
    /// Absolute acknowledgement number (meaningful with ACK).
    pub ack: u32,
    /// Payload length.
    pub len: u32,
    /// Captured payload.
    pub payload: &'a [u8],
    /// Window, scaled by the known shift or by the shift's lower bound (no handshake seen).
    pub win: u32,
    /// Relative sequence number.
    pub rel_seq: u32,
    /// Relative acknowledgement number (0 without ACK).
    pub rel_ack: u32,
    /// Time since the stream's previous packet, ns (0 for the first).
    pub gap_ns: i64,
    /// When the stream's previous packet was seen.
    pub prev_stream_ts: i64,
    /// Path RTT estimate for thresholds, µs.
    pub rtt_est_us: u64,
    /// The sender's smoothed RTT as its kernel would keep it, µs (0 before any ACK of its
    /// data): its ACK RTTs as the capture saw them, the peer's ACK delays included. Its
    /// retransmission and probe timers run that much past their 200 ms floor.
    pub sender_srtt_us: u64,
    /// The part of the server time that is the path, for a capture near the client, µs.
    pub server_far_rtt_us: u64,
    /// Retransmission, if this segment repeats data.
    pub retrans: Option<Retrans>,
    /// Wireshark's `tcp.analysis.ack_rtt` of this ACK, ns.
    pub ack_rtt_ns: Option<i64>,
    /// This ACK newly acknowledged data.
    pub acked: Option<AckAdvance>,
    /// Payload history (segments with payload only).
    pub data: Option<DataInfo>,
    /// The peer's last advertised window, scaled by its known shift or by the shift's
    /// lower bound (then the window is at least this: see `peer_scale`).
    pub peer_window: Option<u32>,
    /// What is known of the peer's window scale (`Known` for a SYN's unscaled window too).
    pub peer_scale: lagtrace_model::analyze::WindowScale,
    /// This segment's flight raised the lower bound of the peer's shift (no handshake
    /// seen): it fits the window read with that bound by construction.
    pub peer_scale_raised: bool,
    /// The peer's last acknowledgement number.
    pub peer_last_ack: Option<u32>,
    /// Packets of this sender since its previous captured one that the capture never saw
    /// (by IPv4 identification; 0 without).
    pub unseen: u16,
    /// Numbers of an earlier such gap this packet filled (it came late, reordered).
    pub refound: u16,
}
