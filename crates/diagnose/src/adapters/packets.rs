//! Layer 3: a `lagtrace_packet` analysis → [`PacketEvidence`], and the flow of one stream.

use lagtrace_packet::{Analysis, FindingKind, PacketRecord};

use super::percentiles_of;
use crate::evidence::{
    Direction, FindingExample, FindingSummary, Flow, FlowPacket, PacketEvidence, Stall,
};

/// Finding kinds, most telling first (the example flow shows the first one present).
const PRIORITY: [FindingKind; 11] = [
    FindingKind::NagleDelayedAck,
    FindingKind::TcpCork,
    FindingKind::Retransmission,
    FindingKind::HeldUntilAck,
    FindingKind::DroppedBeforeCapture,
    FindingKind::SynRetransmit,
    FindingKind::NagleStall,
    FindingKind::DelayedAck,
    FindingKind::ZeroWindow,
    FindingKind::WindowFull,
    FindingKind::SlowServer,
];

/// Summaries, handshake RTTs and server times of the analysis (no flow yet);
/// `server_side`: the capture is known to be next to the server ([`syn_synack`]).
pub fn evidence(
    a: &Analysis,
    capture_point: String,
    dropped: u64,
    server_side: bool,
) -> PacketEvidence {
    let mut hs: Vec<u64> = a
        .streams
        .iter()
        .filter_map(|s| s.handshake_rtt_us)
        .collect();
    let mut st: Vec<u64> = a
        .transactions
        .iter()
        .filter_map(|t| t.server_time_us)
        .collect();
    let mut ex: Vec<u64> = a
        .transactions
        .iter()
        .filter_map(|t| t.time_to_last_byte_us)
        .collect();
    let findings = a
        .summary
        .iter()
        .filter(|k| k.findings > 0)
        .map(|k| FindingSummary {
            kind: k.kind,
            count: k.findings,
            transactions: k.transactions_affected,
            share: k.share,
            median_added_us: k.median_us,
            p99_added_us: k.p99_us,
            // The ones that cost something first: a D-SACKed retransmission (0 µs) shows
            // only that the original arrived.
            examples: {
                let of = || a.findings.iter().filter(|f| f.kind == k.kind);
                of().filter(|f| f.cost_us > 0)
                    .chain(of().filter(|f| f.cost_us == 0))
                    .take(3)
                    .map(example)
                    .collect()
            },
        })
        .collect();
    PacketEvidence {
        capture_point,
        packets: a.frames,
        dropped,
        streams: a.streams.len() as u64,
        transactions: a.transactions_total,
        handshake_rtt: percentiles_of(&mut hs),
        server_time: percentiles_of(&mut st),
        exchange_time: percentiles_of(&mut ex),
        findings,
        example_flow: None,
        joins: Vec::new(),
        black_hole: a.black_hole.clone(),
        server_syn_synack: percentiles_of(&mut syn_synack(a, server_side)),
        syn_acks_lost: syn_acks_lost(a),
        inbound_lost: inbound_lost(a, server_side),
        limits: limits(a),
    }
}

/// SYN → SYN-ACK of each stream captured next to the server: all of them when the caller
/// knows the capture is the server's (`server_side`), else those whose leg is at most half
/// the handshake (the rest, SYN-ACK → ACK, the path's round trip) — which misses a kernel
/// slower than the path, so a caller that knows says so.
fn syn_synack(a: &Analysis, server_side: bool) -> Vec<u64> {
    a.streams
        .iter()
        .filter_map(|s| {
            let gap = s.syn_synack_us?;
            let rtt = s.handshake_rtt_us?;
            (server_side || gap.saturating_mul(2) <= rtt).then_some(gap)
        })
        .collect()
}

/// The SYNs sent again after their SYN-ACK had passed the capture point.
fn syn_acks_lost(a: &Analysis) -> Option<lagtrace_model::diagnosis::evidence::SynAcksLost> {
    use lagtrace_packet::analysis::{SYN_ACK, SYN_ACK_LOST};
    let syns: Vec<_> = a
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::SynRetransmit && f.detail.as_deref() != Some(SYN_ACK))
        .collect();
    let mut lost = syns
        .iter()
        .filter(|f| f.detail.as_deref() == Some(SYN_ACK_LOST));
    let f = lost.next()?;
    Some(lagtrace_model::diagnosis::evidence::SynAcksLost {
        count: 1 + lost.count() as u64,
        of: syns.len() as u64,
        example: example(f),
    })
}

/// The clients' segments resent and not D-SACKed, from a capture known to be the server's.
fn inbound_lost(
    a: &Analysis,
    server_side: bool,
) -> Option<lagtrace_model::diagnosis::evidence::InboundLost> {
    let r = a.resent_to_server.as_ref().filter(|_| server_side)?;
    (r.not_dsacked() > 0).then(|| lagtrace_model::diagnosis::evidence::InboundLost {
        count: r.not_dsacked(),
        of: r.segments,
        example: r.example.as_ref().map(example),
    })
}

/// A finding as an example of its kind: stream, frames, time, cost, what happened.
fn example(f: &lagtrace_packet::Finding) -> FindingExample {
    FindingExample {
        stream: f.stream,
        frames: f.frames.clone(),
        time_us: u64::try_from(f.start_us).unwrap_or(0),
        added_us: f.cost_us,
        note: f.explanation.clone(),
    }
}

/// What the analysed capture could not show: the reader's own warnings of a file cut short
/// or corrupt, and frames whose headers were cut (the snap length, a damaged record).
pub fn limits(a: &Analysis) -> Vec<String> {
    a.warnings
        .iter()
        .filter(|w| {
            w.starts_with("file truncated")
                || w.starts_with("corrupt")
                || w.starts_with("read error")
                || w.contains("malformed headers")
        })
        .map(|w| format!("the capture is incomplete: {w}"))
        .collect()
}

/// The stream worth drawing: the one with the most telling finding, else the busiest —
/// among what the first `frames` frames hold (the file the flow is read from).
pub fn example_stream(a: &Analysis, frames: u64) -> Option<u32> {
    for k in PRIORITY {
        // Prefer a finding after the stream's first transaction (a steady-state example).
        let mut of_kind = a
            .findings
            .iter()
            .filter(|f| f.kind == k && f.frames.last().is_some_and(|&l| l <= frames));
        if let Some(f) = of_kind
            .clone()
            .find(|f| f.transaction.is_some_and(|t| t >= 1))
            .or_else(|| of_kind.next())
        {
            return Some(f.stream);
        }
    }
    a.streams
        .iter()
        .filter(|s| s.first_frame <= frames)
        .max_by_key(|s| s.transactions)
        .map(|s| s.stream)
}

/// Up to `max` packets of the kept stream around its first finding, as a ladder.
pub fn flow(a: &Analysis, stream: u32, max: usize) -> Option<Flow> {
    let s = a.streams.iter().find(|s| s.stream == stream)?;
    let pk = &a.stream_packets;
    if pk.is_empty() {
        return None;
    }
    let (client, server) = if s.a_is_client {
        (s.a, s.b)
    } else {
        (s.b, s.a)
    };
    let mut finds: Vec<_> = a
        .findings
        .iter()
        .filter(|f| f.stream == stream && PRIORITY[..8].contains(&f.kind))
        .collect();
    finds.sort_by_key(|f| PRIORITY.iter().position(|k| *k == f.kind));
    // Window: a few packets before the first frame of the best finding, through its end.
    let (lo, hi) = match finds.first() {
        Some(f) => {
            let first = *f.frames.first()?;
            let last = *f.frames.last()?;
            let i0 = pk.iter().position(|p| p.frame >= first).unwrap_or(0);
            let i1 = pk
                .iter()
                .position(|p| p.frame >= last)
                .unwrap_or(pk.len() - 1);
            let lo = i0.saturating_sub(max.saturating_sub(i1 - i0 + 3));
            (lo, (i1 + 2).min(pk.len()))
        }
        None => (0, max.min(pk.len())),
    };
    let lo = lo.max(hi.saturating_sub(max));
    let win = &pk[lo..hi];
    // The connection's opening, when the window starts later: the SYNs and the ACK after them.
    let hs_len = handshake_len(pk);
    let hs = if lo >= hs_len { &pk[..hs_len] } else { &[][..] };
    let t0 = hs.first().or(win.first())?.time_us;
    let as_flow = |p: &PacketRecord| flow_packet(p, s.a_is_client, t0);
    let handshake: Vec<FlowPacket> = hs.iter().map(as_flow).collect();
    let packets = win.iter().map(as_flow).collect::<Vec<_>>();
    let in_win = |fr: u64| packets.iter().any(|p| p.frame == fr);
    let stalls = finds
        .iter()
        .filter_map(|f| {
            let (a0, b0) = (*f.frames.first()?, *f.frames.last()?);
            (in_win(a0) && in_win(b0) && a0 != b0).then(|| Stall {
                from_frame: a0,
                to_frame: b0,
                gap_us: f.cost_us,
                label: stall_label(f.kind),
            })
        })
        .take(3)
        .collect();
    Some(Flow {
        stream,
        client: client.to_string(),
        server: server.to_string(),
        handshake,
        packets,
        stalls,
    })
}

/// How many packets open the stream: its SYNs (retransmissions included) and the ACK that
/// completes the handshake; 0 when the capture began after the SYN.
fn handshake_len(pk: &[PacketRecord]) -> usize {
    use lagtrace_packet::wire::flags::{ACK, SYN};
    let syns = pk.iter().take_while(|p| p.flags & SYN != 0).count();
    let completes = pk
        .get(syns)
        .is_some_and(|p| p.flags & ACK != 0 && p.len == 0 && syns > 0);
    syns + usize::from(completes)
}

/// One captured packet as a ladder row: direction, flags, length, and a note (the HTTP line
/// it starts, the findings it is part of).
fn flow_packet(p: &PacketRecord, a_is_client: bool, t0: i64) -> FlowPacket {
    let to_server = p.a_to_b == a_is_client;
    let mut note = if p.len > 0 && to_server {
        http_line(&p.payload).unwrap_or_default()
    } else if p.len > 0 {
        http_line(&p.payload)
            .filter(|l| l.starts_with("HTTP/"))
            .unwrap_or_default()
    } else {
        String::new()
    };
    if !p.marks.is_empty() {
        if !note.is_empty() {
            note.push_str(" · ");
        }
        let marks: Vec<&str> = p.marks.iter().map(|k| k.as_str()).collect();
        note.push_str(&marks.join(", "));
    }
    FlowPacket {
        frame: p.frame,
        t_us: (p.time_us - t0).max(0) as u64,
        dir: if to_server {
            Direction::ToServer
        } else {
            Direction::ToClient
        },
        flags: lagtrace_packet::analysis::flags_str(p.flags),
        len: p.len,
        note,
    }
}

fn stall_label(k: FindingKind) -> String {
    match k {
        FindingKind::NagleDelayedAck => "Nagle holds the segment until the client's delayed ACK",
        FindingKind::NagleStall => "Nagle holds the segment until the ACK",
        FindingKind::DelayedAck => "waiting for a delayed ACK",
        FindingKind::HeldUntilAck => "held before the wire until the ACK (TCP_NODELAY on)",
        FindingKind::DroppedBeforeCapture => "dropped before the capture point, sent again",
        FindingKind::TcpCork => "TCP_CORK holds the partial frame until its 200 ms ceiling",
        FindingKind::Retransmission => "lost: waiting for the retransmission",
        FindingKind::SynRetransmit => "SYN lost: waiting for its retransmission",
        FindingKind::ZeroWindow | FindingKind::WindowFull => "waiting for the receiver's window",
        FindingKind::SlowServer => "stall",
    }
    .into()
}

/// The first line of an HTTP message in a payload, if it looks like one.
fn http_line(payload: &[u8]) -> Option<String> {
    let end = payload
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(payload.len())
        .min(60);
    let s = std::str::from_utf8(&payload[..end]).ok()?;
    let looks = s.starts_with("HTTP/")
        || [
            "GET ", "POST ", "HEAD ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ",
        ]
        .iter()
        .any(|m| s.starts_with(m));
    looks.then(|| {
        s.trim_end_matches(" HTTP/1.1")
            .trim_end_matches(" HTTP/1.0")
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lagtrace_packet::wire::flags::{ACK, PSH, SYN};

    fn rec(frame: u64, flags: u8, len: u32) -> PacketRecord {
        PacketRecord {
            frame,
            time_us: frame as i64 * 10,
            a_to_b: frame % 2 == 1,
            flags,
            seq: 0,
            ack: 0,
            len,
            window: 0,
            gap_us: 0,
            payload: Vec::new(),
            marks: Vec::new(),
        }
    }

    #[test]
    fn the_handshake_is_the_syns_and_the_ack_that_completes_them() {
        let open = [
            rec(1, SYN, 0),
            rec(3, SYN, 0), // retransmitted
            rec(4, SYN | ACK, 0),
            rec(5, ACK, 0),
            rec(7, PSH | ACK, 40),
        ];
        assert_eq!(handshake_len(&open), 4);
        // The ACK carries the request already: the SYNs alone.
        let piggy = [rec(1, SYN, 0), rec(2, SYN | ACK, 0), rec(3, PSH | ACK, 40)];
        assert_eq!(handshake_len(&piggy), 2);
        // Capture began mid-stream: no handshake.
        assert_eq!(handshake_len(&open[4..]), 0);
        assert_eq!(handshake_len(&[]), 0);
    }
}
