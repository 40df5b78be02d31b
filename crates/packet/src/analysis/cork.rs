//! `tcp-cork`: a partial segment released at the ~200 ms TCP_CORK ceiling with nothing else
//! (no ACK, no new data) to explain the wait — either a response's tail after its head, or
//! a whole one-segment response after the request.

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::Finding;

use super::event::{DataSeg, Seg};
use super::http::Txn;
use super::us;

/// TCP_CORK ceiling (Linux: 200 ms).
pub const CORK_CEILING_US: u64 = 200_000;

/// Released at the 200 ms ceiling: allow timer slack and the path RTT after it. The
/// ceiling is the sender's probe timer, its RTO: the smoothed RTT (`srtt_us`, the peer's
/// delayed ACKs included) over a 200 ms floor — a client that delays its ACKs 40 ms moves
/// the ceiling to ~240 ms (seen: three corked responses on one connection released after
/// 229, 208 and 240 ms).
pub(super) fn is_cork_gap(gap_us: u64, rtt_us: u64, srtt_us: u64) -> bool {
    gap_us >= CORK_CEILING_US - 5_000
        && gap_us <= CORK_CEILING_US + 30_000 + 2 * rtt_us + srtt_us.min(CORK_CEILING_US)
}

/// A small segment after `p` in the same run (and not a Nagle or delayed-ACK stall): its
/// tail held until the ceiling counted from the stream's last packet. The peer's pure ACKs
/// may come in the gap (a corked tail's ceiling timer, the probe timer, starts when the head
/// is ACKed), its data may not.
pub(super) fn tail(ev: &Seg<'_>, p: DataSeg, txn: Option<u32>, first_ts: i64) -> Option<Finding> {
    let peer_data_in_gap = ev
        .data
        .and_then(|d| d.peer_last)
        .is_some_and(|x| x.ts > p.ts);
    let since_other = us(ev.ts - ev.prev_stream_ts);
    // The peer's window left less than one MSS: Linux sends no segment into it (sender-side
    // silly-window avoidance) until the window opens or its probe timer (~200 ms as well)
    // sends what fits — the receiver's window held it (seen on a busy client of 32 × 16 MB
    // transfers: 1024 B sent 255 ms late, exactly the 1024 B window the client advertised).
    let mss = ev.data.map_or(u32::MAX, |d| d.mss);
    // Only a window read at its known scale can be short: without the handshake it is a
    // lower bound.
    let window_short = ev.peer_scale.is_known()
        && matches!(
            (ev.peer_window, ev.peer_last_ack),
            (Some(w), Some(a)) if w.saturating_sub(ev.seq.wrapping_sub(a)) < mss
        );
    if peer_data_in_gap
        || window_short
        || !is_cork_gap(since_other, ev.rtt_est_us, ev.sender_srtt_us)
    {
        return None;
    }
    Some(if ev.unseen > 0 {
        unseen_resend(ev, txn, (p.frame, p.ts), first_ts)
    } else {
        finding(ev, txn, p.frame, p.ts, first_ts, false)
    })
}

/// A segment that left at the cork ceiling, but with packets of its sender missing from the
/// capture just before it (its IPv4 identifications skip them): its earlier copies were
/// dropped before the capture point — the signature of a drop before the wire (netfilter, a
/// qdisc) or on the path to a capture far from the sender, which a cork never leaves. Not
/// counted as a retransmission: whether the sender counts it depends on where the copies
/// were lost (a send that failed locally leaves the data unsent; one lost on the path is
/// retransmitted).
fn unseen_resend(ev: &Seg<'_>, txn: Option<u32>, prev: (u64, i64), first_ts: i64) -> Finding {
    let (prev_frame, prev_ts) = prev;
    let cost = us(ev.ts - prev_ts);
    Finding {
        kind: FindingKind::DroppedBeforeCapture,
        detail: None,
        stream: ev.stream,
        transaction: txn,
        frames: vec![prev_frame, ev.frame],
        start_us: (prev_ts - first_ts) / 1000,
        end_us: (ev.ts - first_ts) / 1000,
        cost_us: cost,
        explanation: format!(
            "{} B at relative seq {} left {:.1} ms after the sender's previous packet, after {} packet{} it sent that never reached the capture (its IPv4 identifications skip them): dropped before the capture point (netfilter, a qdisc, or the capture itself) and sent again",
            ev.len,
            ev.rel_seq,
            cost as f64 / 1000.0,
            ev.unseen,
            if ev.unseen == 1 { "" } else { "s" }
        ),
    }
}

/// A small segment that starts the response of the open transaction `t`, released at the
/// ceiling after the stream's previous packet. The recorder marks the transaction as
/// corked when it records the finding (a slow-server candidate it would otherwise be is
/// this wait); marking it here already would hide it from the recorder's count of
/// transactions affected.
pub(super) fn first_response(ev: &Seg<'_>, t: &Txn, first_ts: i64) -> Option<Finding> {
    if t.resp_first_ts.is_some() || !is_cork_gap(us(ev.gap_ns), ev.rtt_est_us, ev.sender_srtt_us) {
        return None;
    }
    let prev_frame = t.t.request_last_frame.unwrap_or(ev.frame);
    if ev.unseen > 0 {
        return Some(unseen_resend(
            ev,
            Some(t.t.index),
            (prev_frame, ev.prev_stream_ts),
            first_ts,
        ));
    }
    Some(finding(
        ev,
        Some(t.t.index),
        prev_frame,
        ev.prev_stream_ts,
        first_ts,
        true,
    ))
}

fn finding(
    ev: &Seg<'_>,
    txn: Option<u32>,
    prev_frame: u64,
    prev_ts: i64,
    first_ts: i64,
    whole_response: bool,
) -> Finding {
    let (len, ts) = (ev.len, ev.ts);
    let explanation = if whole_response {
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
        kind: FindingKind::TcpCork,
        detail: None,
        stream: ev.stream,
        transaction: txn,
        frames: vec![prev_frame, ev.frame],
        start_us: (prev_ts - first_ts) / 1000,
        end_us: (ts - first_ts) / 1000,
        cost_us: us(ts - prev_ts),
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Script, kinds};
    use super::*;
    use crate::wire::flags;

    #[test]
    fn ceiling_window() {
        assert!(!is_cork_gap(194_999, 100, 0));
        assert!(is_cork_gap(195_000, 100, 0));
        assert!(is_cork_gap(230_200, 100, 0));
        assert!(!is_cork_gap(230_201, 100, 0));
        // A sender whose peer delays its ACKs 40 ms: its RTO, the ceiling, is ~240 ms.
        assert!(is_cork_gap(240_000, 100, 40_000));
        assert!(!is_cork_gap(240_000, 100, 0));
        // Never more than twice the floor.
        assert!(!is_cork_gap(500_000, 100, 400_000));
    }

    #[test]
    fn a_whole_response_at_a_ceiling_raised_by_the_clients_delayed_acks_is_tcp_cork() {
        // Twelve quick responses, each ACKed 40 ms late (the client's delayed ACK): the
        // server's smoothed RTT climbs to ~32 ms and its probe timer, the cork's ceiling,
        // to ~232 ms. A corked response released 255 ms after its request is the ceiling
        // plus timer slack, not a server that thought 255 ms.
        let mut s = Script::handshake(100);
        let mut t = 1_000;
        for _ in 0..12 {
            s.client_data(t, 41);
            s.server_data(t + 100, 700);
            s.client_ack(t + 40_100);
            t += 50_000;
        }
        s.client_data(t, 41);
        s.server_ack(t + 100);
        s.server_data(t + 255_000, 700);
        s.client_ack(t + 255_100);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::TcpCork], "{:?}", an.findings);
        assert_eq!(an.findings[0].cost_us, 254_900);
    }

    #[test]
    fn a_whole_response_at_the_ceiling_is_tcp_cork_not_slow_server() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_ack(1_100);
        s.server_data(201_100, 700);
        s.client_ack(201_200);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::TcpCork]);
        let f = &an.findings[0];
        assert_eq!(f.frames, [4, 6]);
        assert_eq!(f.cost_us, 200_000);
        assert!(f.explanation.contains("whole response"), "{f:?}");
        // The transaction it held is counted (it used to stay 0).
        assert_eq!(an.summary[0].kind, FindingKind::TcpCork);
        assert_eq!(an.summary[0].transactions_affected, 1);
        assert!((an.summary[0].share - 1.0).abs() < 1e-9, "{:?}", an.summary);
        assert!(
            an.transactions[0].server_time_us.is_some(),
            "the transaction is complete"
        );
    }

    #[test]
    fn a_tail_at_the_ceiling_is_tcp_cork() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_100, 1448);
        s.client_ack(1_200);
        s.server_data(201_300, 300);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::TcpCork]);
        assert_eq!(an.findings[0].frames, [5, 7]);
        assert!(an.findings[0].explanation.contains("tail"));
    }

    /// A tail at the ceiling after a 1000 B head whose IPv4 identification is `head_id`, the
    /// tail numbered `tail_id` (the client sends without identifications). (A head of a full
    /// 1448 B would leave one number in doubt before the MSS is known from full segments:
    /// counted as possibly two wire segments, the gap it leaves is one less.)
    fn numbered_tail(head_id: u16, tail_id: u16) -> lagtrace_model::analyze::Analysis {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = head_id;
        s.server_data(1_100, 1000);
        s.ip_id = 0;
        s.client_ack(1_200);
        s.ip_id = tail_id;
        s.server_data(201_300, 300);
        s.finish()
    }

    #[test]
    fn a_late_tail_after_packets_the_capture_never_saw_is_dropped_before_capture_not_cork() {
        // Recorded (nginx, an nft drop on its output): the header (id 0x4916), then the body
        // 253.6 ms later with id 0x4919 — two sends of the body were dropped before the
        // wire. Without the gap the same timing is a cork.
        let an = numbered_tail(500, 503);
        assert_eq!(
            kinds(&an),
            [FindingKind::DroppedBeforeCapture],
            "{:?}",
            an.findings
        );
        let f = &an.findings[0];
        assert_eq!(f.frames, [5, 7]);
        assert!(
            f.explanation
                .contains("after 2 packets it sent that never reached the capture"),
            "{f:?}"
        );
        assert!(
            an.retransmitted_frames.is_empty(),
            "not one Wireshark flags"
        );
        assert_eq!(kinds(&numbered_tail(500, 501)), [FindingKind::TcpCork]);
        // A whole response after the request, one packet unseen.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 500;
        s.server_ack(1_100);
        s.ip_id = 502;
        s.server_data(201_100, 700);
        s.ip_id = 0;
        s.client_ack(201_200);
        let an = s.finish();
        assert_eq!(
            kinds(&an),
            [FindingKind::DroppedBeforeCapture],
            "{:?}",
            an.findings
        );
        assert!(
            an.findings[0]
                .explanation
                .contains("after 1 packet it sent")
        );
    }

    /// Server segments of 1000 B: (offset from its first byte, identification), 10 µs apart.
    fn numbered_writes(writes: &[(u32, u16)]) -> lagtrace_model::analyze::Analysis {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        for (k, &(off, id)) in writes.iter().enumerate() {
            s.ip_id = id;
            let t = 1_100 + 10 * k as u64;
            s.raw(
                t,
                false,
                flags::PSH | flags::ACK,
                5_000 + off,
                1_041,
                &[b'y'; 1000],
            );
        }
        s.finish()
    }

    #[test]
    fn packets_the_capture_never_saw_are_counted_and_a_late_one_fills_its_gap() {
        let unseen = |an: &lagtrace_model::analyze::Analysis| {
            an.warnings
                .iter()
                .find(|w| w.contains("were sent but never captured"))
                .cloned()
        };
        // 501 passed 502 on the way: nothing missing.
        let an = numbered_writes(&[(0, 500), (2000, 502), (1000, 501)]);
        assert_eq!(unseen(&an), None, "{:?}", an.warnings);
        // 501 and 502 never came.
        let an = numbered_writes(&[(0, 500), (3000, 503)]);
        assert!(
            unseen(&an).is_some_and(|w| w.starts_with("2 packets on 1 streams")),
            "{:?}",
            an.warnings
        );
    }

    #[test]
    fn a_tail_held_by_a_window_below_one_mss_is_not_cork() {
        // The client's ACK leaves the server a 1000 B window (MSS 1460): the tail that
        // leaves 200 ms later is the probe timer's, sending what fits.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_100, 1448);
        s.window[0] = 1000;
        s.client_ack(1_200);
        s.server_data(201_300, 1000);
        let an = s.finish();
        assert!(
            !kinds(&an).contains(&FindingKind::TcpCork),
            "{:?}",
            an.findings
        );
        // The same tail with the window open is cork (the test above).
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_100, 1448);
        s.client_ack(1_200);
        s.server_data(201_300, 1000);
        assert_eq!(kinds(&s.finish()), [FindingKind::TcpCork]);
    }

    #[test]
    fn a_response_after_100_ms_is_not_cork() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(101_000, 700);
        assert!(!kinds(&s.finish()).contains(&FindingKind::TcpCork));
    }
}
