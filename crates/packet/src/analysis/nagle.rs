//! Nagle and delayed-ACK stalls: a sender's next data waited for the peer's ACK.
//!
//! - `nagle-delayed-ack` / `nagle-stall`: a small segment was held (Nagle: an earlier small
//!   segment was still unacknowledged) until the ACK of that earlier segment, which was
//!   itself delayed (the reference 40 ms case) or not.
//! - `delayed-ack`: the sender's next data waited for a late, data-less ACK.
//!
//! A stall released later than about one RTT after its ACK is handed back as "late"; the
//! recorder keeps it only when the same sender also has stalls released at once.

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::Finding;

use super::event::{AckAdvance, DataSeg, Seg};
use super::tcp::seq_le;
use super::us;
use crate::wire::flags;

/// Delayed-ACK threshold: Linux's minimum is 40 ms (`TCP_DELACK_MIN`); 30 ms leaves room
/// for timer granularity and capture jitter while staying far above a quick ACK.
pub const DELAYED_ACK_MIN_US: u64 = 30_000;
/// How long after the releasing ACK (beyond twice the path RTT) held data may still leave
/// to count as released by it: softirq and timestamping jitter on a busy machine.
pub const RELEASE_SLACK_US: u64 = 2_000;

/// What one direction's sender has outstanding, for Nagle.
#[derive(Default)]
struct Dir {
    /// Last sub-MSS data segment, and whether it is still unacknowledged.
    last_small: Option<DataSeg>,
    small_unacked: bool,
    /// The ACK (from the peer) that first covered `last_small`.
    small_release: Option<AckAdvance>,
    /// Latest ACK this side sent that newly acknowledged data.
    last_new_ack: Option<AckAdvance>,
}

/// What a fresh data segment showed about its sender's Nagle.
pub(super) struct Unheld {
    /// The small segment that left while an earlier one was unacknowledged.
    pub frame: u64,
    /// That earlier one.
    pub behind: u64,
}

/// Per-stream state of the detector.
#[derive(Default)]
pub(super) struct Nagle {
    dirs: [Dir; 2],
}

/// A stall found, and whether it was released late.
pub(super) struct Stall {
    pub finding: Finding,
    pub late: bool,
    /// When the releasing ACK was seen.
    pub ack_ts: i64,
    /// A Nagle-shaped hold (a small segment released by the ACK of the earlier small one),
    /// named Nagle only when its sender never shows small segments leaving unheld.
    pub nagle: bool,
    /// Two full segments or more were in flight: covered by the releasing ACK, or still
    /// unacknowledged after it (a receiver whose ACKs lag its data, on a busy CPU, releases
    /// the next write with an ACK of the small tail alone). The sender's congestion window
    /// or send buffer may have held the segment.
    pub bulk: bool,
}

impl Nagle {
    /// Notes an ACK that newly acknowledged data (every segment, before the data checks).
    pub fn on_ack(&mut self, ev: &Seg<'_>) {
        let Some(a) = ev.acked else {
            return;
        };
        self.dirs[ev.dir].last_new_ack = Some(a);
        let peer = &mut self.dirs[1 - ev.dir];
        if peer.small_unacked
            && let Some(sm) = peer.last_small
            && seq_le(sm.end, ev.ack)
        {
            peer.small_unacked = false;
            peer.small_release = Some(a);
        }
    }

    /// A fresh data segment that follows `p`, the sender's previous one in the same run:
    /// did it wait for an ACK? `window_limited`: the sender had filled the peer's window
    /// (then it was not Nagle holding it, and a late ACK is a window update).
    pub fn stall(
        &self,
        ev: &Seg<'_>,
        p: DataSeg,
        small: bool,
        window_limited: bool,
        txn: Option<u32>,
        first_ts: i64,
    ) -> Option<Stall> {
        let rtt = ev.rtt_est_us;
        let gap = us(ev.ts - p.ts);
        let stall_min = (2 * rtt).max(1_000);
        let release_tol = (2 * rtt).max(10_000);
        // Data waiting for an ACK leaves while the kernel processes that ACK (no
        // scheduling of the application in between): at the capture point it follows
        // within about one path RTT. A later release may be a server's own pause that
        // ended near a delayed ACK by chance (seen: a loaded nginx with tcp_nodelay on
        // paused 44 ms between two writes and resumed 4 ms after the client's delayed ACK,
        // RTT 50 µs) — or a real Nagle hold whose sender was slow to run (the reference
        // capture has one released 4.1 ms late among 65 released at once). Such a stall is
        // kept only when the same sender has stalls released at once (decided in `finish`).
        let tight_tol = 2 * rtt + RELEASE_SLACK_US;
        // An ACK that covers two full segments or more the receiver sat on is not held by
        // the delayed-ACK rule (Linux ACKs every second full segment at once): the receiver
        // was busy or not reading, and the sender was limited by it (its window or
        // congestion window full of unacknowledged data), not by Nagle.
        let mss = ev.data.map_or(u32::MAX, |d| d.mss);
        let receiver_held = |a: &AckAdvance| a.held_bytes >= 2 * u64::from(mss);
        let released_by = |a: &AckAdvance| {
            a.ts >= p.ts
                && us(ev.ts - a.ts) <= release_tol
                && us(ev.ts - a.ts) * 2 <= gap
                && !receiver_held(a)
        };
        // Packets the sender sent after `p` that never reached the capture (its IPv4
        // identifications skip them): its data did not wait for the ACK — it left and was
        // dropped before the capture point (a full qdisc), and what follows the ACK is its
        // resend. Seen: nginx behind a tbf whose queue overflowed sent a response's head,
        // then 121 packets of its body the shaper dropped; the capture after the shaper
        // showed the head, the client's delayed ACK 40 ms later, and the body — a
        // `delayed-ack` on 4 of 31 transactions of a healthy bulk run (suite at d99e3cb).
        if gap < stall_min || window_limited || ev.unseen > 0 {
            return None;
        }
        let me = &self.dirs[ev.dir];
        if small
            && let Some(a) = me.small_release
            && released_by(&a)
        {
            let sm = me.last_small.unwrap_or(p);
            return Some(Stall {
                finding: nagle_finding(ev, p, sm, a, txn, first_ts),
                late: us(ev.ts - a.ts) > tight_tol,
                ack_ts: a.ts,
                nagle: true,
                bulk: a.bytes >= 2 * u64::from(mss) || in_flight_after(p, &a) >= 2 * u64::from(mss),
            });
        }
        // Not when `p` was itself the resend of packets the capture never saw: the sender's
        // first flight after a timeout is one segment (its congestion window collapsed), and
        // the receiver's delayed ACK of a lone segment is part of that loss's recovery, not a
        // delayed-ACK problem (same run: a resend 212 ms after 14 unseen packets, then 44 ms
        // for its ACK).
        if !p.after_unseen
            && let Some(a) = self.dirs[1 - ev.dir].last_new_ack
            && a.no_data
            && a.delay_us >= DELAYED_ACK_MIN_US
            && released_by(&a)
        {
            return Some(Stall {
                finding: Finding {
                    kind: FindingKind::DelayedAck,
                    detail: None,
                    stream: ev.stream,
                    transaction: txn,
                    frames: vec![p.frame, a.frame, ev.frame],
                    start_us: (p.ts - first_ts) / 1000,
                    end_us: (ev.ts - first_ts) / 1000,
                    cost_us: gap,
                    explanation: format!(
                        "the peer's ACK came {:.1} ms late (frame {}) and the sender's next data waited for it",
                        a.delay_us as f64 / 1000.0,
                        a.frame
                    ),
                },
                late: us(ev.ts - a.ts) > tight_tol,
                ack_ts: a.ts,
                nagle: false,
                bulk: false,
            });
        }
        None
    }

    /// Remembers a fresh data segment (after the checks). Returns the Minshall signature
    /// broken: a small segment (not a FIN, which Nagle lets go) that left while an earlier
    /// small one was still unacknowledged — its sender's Nagle is off.
    pub fn after_data(&mut self, ev: &Seg<'_>, small: bool) -> Option<Unheld> {
        let mut unheld = None;
        if small {
            let dir = &mut self.dirs[ev.dir];
            if dir.small_unacked
                && ev.flags & flags::FIN == 0
                && let Some(sm) = dir.last_small
            {
                unheld = Some(Unheld {
                    frame: ev.frame,
                    behind: sm.frame,
                });
            }
            dir.last_small = Some(DataSeg {
                frame: ev.frame,
                ts: ev.ts,
                len: ev.len,
                end: ev.seq.wrapping_add(ev.len),
                after_unseen: ev.unseen > 0,
            });
            dir.small_unacked = true;
            dir.small_release = None;
        }
        unheld
    }
}

/// Bytes of the sender's data up to `p` that ACK `a` left unacknowledged.
fn in_flight_after(p: DataSeg, a: &AckAdvance) -> u64 {
    if seq_le(p.end, a.ack) {
        0
    } else {
        u64::from(p.end.wrapping_sub(a.ack))
    }
}

/// A Nagle-shaped stall of a sender that, in the same state, sent small segments unheld
/// (`u`): with TCP_NODELAY on, the segment was held before the wire until the ACK.
pub(super) fn held_until_ack(mut f: Finding, u: &Unheld) -> Finding {
    f.kind = FindingKind::HeldUntilAck;
    let len = f
        .explanation
        .split(" B held")
        .next()
        .unwrap_or("?")
        .to_string();
    f.explanation = format!(
        "{len} B left only with the peer's ACK (frame {}), {:.1} ms after the data before it; not Nagle: the same sender sent a small segment (frame {}) while an earlier one (frame {}) was unacknowledged, so its TCP_NODELAY is on: held before the wire (a local drop retransmitted on the ACK, or a queue)",
        f.frames
            .get(f.frames.len().saturating_sub(2))
            .copied()
            .unwrap_or(0),
        f.cost_us as f64 / 1000.0,
        u.frame,
        u.behind
    );
    f
}

/// What the packets cannot tell about a Nagle-shaped hold: a sender whose own pause ended
/// just after the ACK (a pause that met a late ACK: a receiver or a virtual CPU that ran late
/// fires the delayed-ACK timer and wakes the sender at the same moment) sends the same
/// packets at the same times. Only the sender's socket options (TCP_NODELAY) decide.
const AMBIGUOUS: &str = "; a sender whose own pause ended with this ACK looks the same on the wire: its TCP_NODELAY decides";

/// Segment `ev` was held behind the small `sm` until ACK `a`; `p` is the data before it.
fn nagle_finding(
    ev: &Seg<'_>,
    p: DataSeg,
    sm: DataSeg,
    a: AckAdvance,
    txn: Option<u32>,
    first_ts: i64,
) -> Finding {
    let delayed = a.no_data && a.delay_us >= DELAYED_ACK_MIN_US;
    let (kind, explanation) = if delayed {
        (
            FindingKind::NagleDelayedAck,
            format!(
                "{} B held by Nagle behind the unacknowledged {} B segment (frame {}) until the peer's ACK {:.1} ms later (frame {}, delayed ACK); sent {:.1} ms after it{AMBIGUOUS}",
                ev.len,
                sm.len,
                sm.frame,
                a.delay_us as f64 / 1000.0,
                a.frame,
                us(ev.ts - a.ts) as f64 / 1000.0
            ),
        )
    } else {
        (
            FindingKind::NagleStall,
            format!(
                "{} B held by Nagle behind the unacknowledged {} B segment (frame {}) until the peer's ACK (frame {}, {:.1} ms){AMBIGUOUS}",
                ev.len,
                sm.len,
                sm.frame,
                a.frame,
                a.delay_us as f64 / 1000.0
            ),
        )
    };
    let mut frames = vec![sm.frame, a.frame, ev.frame];
    if p.frame != sm.frame {
        frames.insert(1, p.frame);
    }
    frames.sort_unstable();
    frames.dedup();
    Finding {
        kind,
        detail: None,
        stream: ev.stream,
        transaction: txn,
        frames,
        start_us: (p.ts - first_ts) / 1000,
        end_us: (ev.ts - first_ts) / 1000,
        cost_us: us(ev.ts - p.ts),
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Script, kinds};
    use crate::wire::flags;
    use lagtrace_model::FindingKind;
    use lagtrace_model::analyze::Analysis;

    /// The reference pattern: a 238 B head, then a 615 B body held until the client's
    /// delayed ACK 40 ms later.
    fn nagle_script(ack_after_ms: u64) -> Script {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 238);
        s.client_ack(1_000 + ack_after_ms * 1000);
        s.server_data(1_100 + ack_after_ms * 1000, 615);
        s.client_ack(1_200 + ack_after_ms * 1000);
        s
    }

    #[test]
    fn held_until_a_delayed_ack_is_nagle_delayed_ack() {
        let an = nagle_script(40).finish();
        assert_eq!(kinds(&an), [FindingKind::NagleDelayedAck]);
        let f = &an.findings[0];
        assert_eq!(f.frames, [5, 6, 7], "{f:?}");
        assert!((39_000..41_000).contains(&f.cost_us), "{f:?}");
        assert_eq!(f.transaction, Some(0));
    }

    #[test]
    fn held_until_a_prompt_ack_is_nagle_stall() {
        // The ACK is prompt (5 ms after the head) but the stall is long enough to count.
        let an = nagle_script(5).finish();
        assert_eq!(kinds(&an), [FindingKind::NagleStall]);
    }

    #[test]
    fn full_sized_data_waiting_for_a_late_ack_is_delayed_ack() {
        // Not Nagle (nothing small), but the next data still waited for the late ACK.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 1448);
        s.client_ack(41_000);
        s.server_data(41_100, 1448);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::DelayedAck]);
        assert_eq!(an.findings[0].frames, [5, 6, 7]);
    }

    #[test]
    fn data_after_a_late_ack_with_packets_the_capture_never_saw_is_not_delayed_ack() {
        // The head, the client's late ACK, then the body — but the server's identifications
        // skip 121 numbers between the head and the body: it sent them, a qdisc dropped them,
        // and the body that follows the ACK is their resend, not data that waited.
        let run = |skipped: u16| {
            let mut s = Script::handshake(100);
            s.client_data(1_000, 41);
            s.ip_id = 700;
            s.server_data(1_500, 246);
            s.ip_id = 0;
            s.client_ack(41_000);
            s.ip_id = 701 + skipped;
            s.server_data(41_100, 1448);
            s.ip_id = 0;
            s.finish()
        };
        assert!(run(121).findings.is_empty(), "{:?}", run(121).findings);
        // Numbered without a skip: the body waited for the delayed ACK.
        assert_eq!(kinds(&run(0)), [FindingKind::DelayedAck]);
    }

    /// After the server's data (numbered up to `next_id`), the client's quick ACK; then, the
    /// numbers from `next_id` on skipped by `skipped`, the timeout's resend 212 ms later
    /// (cwnd one segment), its ACK 44 ms late, and more data.
    fn timeout_resend(mut s: Script, next_id: u16, skipped: u16) -> Analysis {
        s.client_ack(1_700);
        s.ip_id = next_id + skipped;
        s.server_data(213_000, 1448);
        s.ip_id = 0;
        s.client_ack(257_000);
        s.ip_id = next_id + skipped + 1;
        s.server_data(257_100, 1448);
        s.ip_id = 0;
        s.finish()
    }

    #[test]
    fn the_delayed_ack_of_a_lone_resend_after_unseen_packets_is_the_losss_recovery() {
        // A full segment, 14 numbers skipped, 212 ms later the next (the timeout's resend,
        // cwnd one segment), its ACK 44 ms late, then more data: the wait is the loss's.
        let run = |skipped: u16| {
            let mut s = Script::handshake(100);
            s.client_data(1_000, 41);
            s.ip_id = 900;
            s.server_data(1_500, 1448);
            s.ip_id = 0;
            timeout_resend(s, 901, skipped)
        };
        let k = kinds(&run(14));
        assert!(!k.contains(&FindingKind::DelayedAck), "{k:?}");
        assert!(kinds(&run(0)).contains(&FindingKind::DelayedAck));
    }

    #[test]
    fn mid_connection_the_lone_resend_after_unseen_packets_is_found_past_super_segments() {
        // The capture began mid-connection (no SYN: the MSS is not announced) and the sender
        // hands the capture super-segments. Two equal full segments back to back show the
        // MSS, so a super-segment's numbers can be counted, and the 14 the shaper dropped
        // after it are seen: the lone resend's delayed ACK is the loss's recovery.
        let run = |skipped: u16| {
            let mut s = Script::empty();
            s.client_data(1_000, 41);
            s.ip_id = 900;
            s.server_data(1_500, 1448);
            s.server_data(1_510, 1448);
            s.server_data(1_600, 12 * 1448);
            s.ip_id = 0;
            timeout_resend(s, 914, skipped)
        };
        let an = run(14);
        assert!(
            !kinds(&an).contains(&FindingKind::DelayedAck),
            "{:?}",
            an.findings
        );
        assert!(
            an.warnings
                .iter()
                .any(|w| w.starts_with("14 packets on 1 streams")),
            "{:?}",
            an.warnings
        );
        assert!(kinds(&run(0)).contains(&FindingKind::DelayedAck));
    }

    #[test]
    fn mid_connection_a_super_segment_is_counted_with_another_streams_mss() {
        // Stream 1 began before the capture and its sender shows only super-segments; a
        // stream between the same two hosts whose SYNs were seen tells the MSS (it divides
        // the super-segment), so the 14 numbers dropped after it are seen: the resend after
        // them is named as such.
        let run = |other: bool| {
            let mut s = Script::handshake(100);
            if other {
                s.client_data(1_000, 41);
                s.server_data(1_500, 1448);
            }
            s.client_port = 40_001;
            let (c, mut srv) = (70_000, 90_000);
            let y = vec![b'y'; 12 * 1448];
            let mut send = |s: &mut Script, t: u64, id: u16, len: usize| {
                s.ip_id = id;
                s.raw(t, false, flags::PSH | flags::ACK, srv, c, &y[..len]);
                s.ip_id = 0;
                srv += len as u32;
                s.raw(t + 40_000.min(t / 5), true, flags::ACK, c, srv, &[]);
            };
            send(&mut s, 2_000, 900, 12 * 1448);
            send(&mut s, 213_000, 926, 1448);
            send(&mut s, 257_100, 927, 1448);
            s.finish()
        };
        let an = run(true);
        assert_eq!(
            kinds(&an),
            [FindingKind::DroppedBeforeCapture],
            "{:?}",
            an.findings
        );
        assert!(
            an.findings[0]
                .explanation
                .contains("after 14 packets it sent"),
            "{:?}",
            an.findings
        );
        // Without it the gap is not seen, and the timeout's resend 211 ms after the
        // super-segment reads as a tail at the 200 ms cork ceiling.
        assert_eq!(kinds(&run(false)), [FindingKind::TcpCork]);
    }

    #[test]
    fn mid_connection_another_streams_mss_that_does_not_divide_is_not_used() {
        // Stream 1's own MSS is 1188 (a clamp the other stream does not have): its
        // super-segment of 12 × 1188 B took 12 numbers, which 1448 would count as 10 — two
        // packets "never captured" that were. 1448 does not divide it: not counted.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 1448);
        s.client_port = 40_001;
        let y = vec![b'y'; 12 * 1188];
        let fl = flags::PSH | flags::ACK;
        s.ip_id = 900;
        s.raw(2_000, false, fl, 90_000, 70_000, &y);
        s.ip_id = 0;
        s.raw(2_100, true, flags::ACK, 70_000, 90_000 + 14_256, &[]);
        s.ip_id = 912;
        s.raw(2_200, false, fl, 90_000 + 14_256, 70_000, &y[..1188]);
        s.ip_id = 0;
        let an = s.finish();
        assert!(
            !an.warnings.iter().any(|w| w.contains("never captured")),
            "{:?}",
            an.warnings
        );
    }

    #[test]
    fn a_late_ack_of_many_full_segments_is_the_receiver_not_delayed_ack() {
        // A bulk response: the client sat on 4 full segments for 40 ms (busy, not reading)
        // and then acknowledged them all; the server's next data waited for that ACK. Linux
        // ACKs every second full segment at once: this is not the delayed-ACK rule.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        for i in 0..4 {
            s.server_data(1_500 + i * 10, 1460);
        }
        s.client_ack(41_000);
        s.server_data(41_100, 1460);
        s.server_data(41_110, 300);
        assert!(s.finish().findings.is_empty());
    }

    #[test]
    fn a_late_ack_of_data_the_capture_missed_is_not_delayed_ack() {
        // Recorded (16 MB c=32 on a loaded machine): tcpdump on `any` dropped a burst of
        // the server's segments, so the client's late ACK seemed to cover one full segment
        // (a delayed ACK) where the veth capture shows it covering 1.3 MB the receiver sat
        // on. Bytes the ACK covers below the first segment seen were written before it.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        let hole = 10 * 1448;
        let y = [b'y'; 1448];
        s.raw(1_500, false, flags::ACK, 5_000 + hole, 1_041, &y);
        s.client_ack_at(41_000, 5_000 + hole + 1448);
        s.raw(41_100, false, flags::ACK, 5_000 + hole + 1448, 1_041, &y);
        assert!(s.finish().findings.is_empty());
        // The same without the hole is a delayed ACK.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.raw(1_500, false, flags::ACK, 5_000, 1_041, &y);
        s.client_ack_at(41_000, 5_000 + 1448);
        s.raw(41_100, false, flags::ACK, 5_000 + 1448, 1_041, &y);
        assert_eq!(kinds(&s.finish()), [FindingKind::DelayedAck]);
    }

    #[test]
    fn no_stall_is_measured_across_data_the_capture_missed() {
        // Recorded (16 MB c=32, `any`, tcpdump dropping 2.9 MB): a 376 B tail, then the
        // next one seen 18 ms later right after an ACK — with everything sent in between
        // missing from the capture. Looked like a small segment held until the ACK.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 200);
        s.server_data(1_510, 300);
        s.client_ack(1_600);
        s.client_data(2_000, 41);
        s.server_data(2_500, 376);
        let hole = 5_000 + 500 + 376 + 20 * 1448;
        s.client_ack_at(20_000, hole);
        s.raw(
            20_100,
            false,
            flags::PSH | flags::ACK,
            hole,
            1_082,
            &[b'y'; 376],
        );
        assert!(s.finish().findings.is_empty());
    }

    #[test]
    fn a_small_segment_after_a_late_ack_of_many_full_segments_is_not_nagle() {
        // The same with a small segment outstanding behind the full ones: the ACK that
        // releases the next small one also covers 4 full segments held 40 ms.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 200);
        for i in 0..4 {
            s.server_data(1_510 + i * 10, 1460);
        }
        s.client_ack(41_000);
        s.server_data(41_100, 300);
        assert!(s.finish().findings.is_empty());
    }

    /// A first exchange where the server sends two small segments back to back, the second
    /// while the first is unacknowledged: its Nagle is off.
    fn unheld_first(s: &mut Script) {
        s.client_data(1_000, 41);
        s.server_data(1_500, 200);
        s.server_data(1_510, 300);
        s.client_ack(1_600);
    }

    #[test]
    fn a_hold_by_a_sender_seen_sending_small_segments_unheld_is_not_nagle() {
        let mut s = Script::handshake(100);
        unheld_first(&mut s);
        s.client_data(2_000, 41);
        s.server_data(2_500, 238);
        s.client_ack(42_000);
        s.server_data(42_100, 615);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::HeldUntilAck]);
        let f = &an.findings[0];
        assert!(
            f.explanation.contains("(frame 6)") && f.explanation.contains("(frame 5)"),
            "{f:?}"
        );
        assert_eq!(f.frames, [9, 10, 11]);
        assert_eq!(an.summary[0].transactions_affected, 1);
        // The same hold with no such evidence is Nagle.
        let an = nagle_script(40).finish();
        assert_eq!(kinds(&an), [FindingKind::NagleDelayedAck]);
    }

    #[test]
    fn a_hold_with_full_segments_in_flight_on_a_nodelay_sender_is_its_window() {
        let mut s = Script::handshake(100);
        unheld_first(&mut s);
        s.client_data(2_000, 41);
        s.server_data(2_500, 238);
        s.server_data(2_510, 1460);
        s.server_data(2_520, 1460);
        s.client_ack(6_000);
        s.server_data(6_100, 615);
        assert!(s.finish().findings.is_empty());
    }

    #[test]
    fn a_hold_released_by_an_ack_of_the_small_tail_alone_with_full_segments_in_flight_is_its_window()
     {
        // Recorded (16 MB c=32 on a loaded machine, veth): a 376 B tail, then 64 KB, and the
        // next 376 B left 3.1 ms later with the client's ACK of the first tail alone (the
        // client's ACKs lagged its data): 45 full segments were still unacknowledged.
        let mut s = Script::handshake(100);
        unheld_first(&mut s);
        s.client_data(2_000, 41);
        s.server_data(2_500, 238);
        s.server_data(2_510, 1460);
        s.server_data(2_520, 1460);
        s.client_ack_at(6_000, 5_000 + 500 + 238);
        s.server_data(6_100, 615);
        assert!(s.finish().findings.is_empty());
        // With one full segment in flight the hold is still named.
        let mut s = Script::handshake(100);
        unheld_first(&mut s);
        s.client_data(2_000, 41);
        s.server_data(2_500, 238);
        s.server_data(2_510, 1460);
        s.client_ack_at(6_000, 5_000 + 500 + 238);
        s.server_data(6_100, 615);
        assert_eq!(kinds(&s.finish()), [FindingKind::HeldUntilAck]);
    }

    #[test]
    fn a_request_resent_after_its_late_response_does_not_hold_the_next_one() {
        // Recorded (nft drop on nginx's output, analyze_bulk): the response to a 50 B
        // request left only on the server's timer, 204 ms later; the client's own timer
        // re-sent the request just after the response crossed it, and its next request
        // followed the response at once. That request was written after the response (it
        // carries the ACK of it), not held by Nagle behind the first request.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 50);
        s.server_data(205_000, 853);
        s.raw(
            205_010,
            true,
            flags::PSH | flags::ACK,
            1_000,
            5_000,
            &[b'x'; 50],
        );
        s.server_ack(205_060);
        s.client_data(205_070, 50);
        s.server_ack(205_090);
        let an = s.finish();
        assert!(
            !kinds(&an)
                .iter()
                .any(|k| matches!(k, FindingKind::NagleStall | FindingKind::NagleDelayedAck)),
            "{:?}",
            an.findings
        );
        assert_eq!(an.retransmitted_frames, [6]);
    }

    #[test]
    fn no_ack_in_the_gap_is_no_stall() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 238);
        s.server_data(41_100, 615);
        assert!(s.finish().findings.is_empty());
    }

    #[test]
    fn a_release_long_after_the_ack_is_dropped_without_prompt_ones() {
        // Sent 8 ms after the delayed ACK (RTT 100 µs): not the ACK's doing, and the
        // sender has no stall released at once.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 238);
        s.client_ack(41_000);
        s.server_data(49_000, 615);
        assert!(s.finish().findings.is_empty());
    }
}
