//! `retransmission` and `syn-retransmit`: a segment sent again (Wireshark's kinds: `rto`,
//! `fast`, `spurious`), costing the time since its original. A spurious retransmission
//! repeats data already acknowledged and costs nothing.

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::Finding;

use super::event::{Retrans, RetransKind, Seg};
use super::us;
use crate::wire::flags;

/// The detail of a `syn-retransmit` whose SYN was sent again after the other side's SYN-ACK
/// had passed the capture point: the SYN was answered, and the answer was lost beyond it.
pub const SYN_ACK_LOST: &str = "syn-ack-lost";

/// The detail of a `syn-retransmit` that is a SYN-ACK sent again.
pub const SYN_ACK: &str = "syn-ack";

/// The finding for retransmitted segment `ev`; `answered`: a SYN sent again after the other
/// side's SYN-ACK was captured.
pub(super) fn finding(
    ev: &Seg<'_>,
    r: Retrans,
    txn: Option<u32>,
    first_ts: i64,
    answered: bool,
) -> Finding {
    let cost = us(ev.ts - r.orig_ts);
    let mut frames: Vec<u64> = r.orig_frame.into_iter().collect();
    frames.push(ev.frame);
    let (kind, detail, explanation) = if ev.flags & flags::SYN != 0 {
        let what = if ev.flags & flags::ACK != 0 {
            "SYN-ACK"
        } else {
            "SYN"
        };
        let answered = answered && what == "SYN";
        let detail = if what == "SYN-ACK" {
            Some(SYN_ACK.to_string())
        } else {
            answered.then(|| SYN_ACK_LOST.to_string())
        };
        (
            FindingKind::SynRetransmit,
            detail,
            format!(
                "{what} retransmitted {:.0} ms after the first: setup waited for the SYN \
                 timer{}",
                cost as f64 / 1000.0,
                if answered {
                    " (the SYN had been answered: its SYN-ACK passed the capture point and \
                     was lost beyond it)"
                } else {
                    ""
                }
            ),
        )
    } else {
        let k = r.kind.as_str();
        (
            FindingKind::Retransmission,
            Some(k.to_string()),
            format!(
                "{k} retransmission of {} B at relative seq {}, {:.1} ms after it was first sent",
                ev.len,
                ev.rel_seq,
                cost as f64 / 1000.0
            ),
        )
    };
    Finding {
        kind,
        detail,
        stream: ev.stream,
        transaction: txn,
        frames,
        start_us: (r.orig_ts - first_ts) / 1000,
        end_us: (ev.ts - first_ts) / 1000,
        cost_us: if r.kind == RetransKind::Spurious {
            0
        } else {
            cost
        },
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Script, kinds};
    use crate::wire::flags;
    use lagtrace_model::FindingKind;

    #[test]
    fn a_segment_sent_again_after_a_timeout_is_an_rto_retransmission() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.server_resend(205_000, 1000, 1000);
        s.client_ack(205_100);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::Retransmission]);
        let f = &an.findings[0];
        assert_eq!(f.detail.as_deref(), Some("rto"));
        assert_eq!(f.frames, [5, 6]);
        assert_eq!(f.cost_us, 203_800);
        assert_eq!(an.retransmitted_frames, [6]);
        assert_eq!(an.streams[0].retransmissions, 1);
    }

    #[test]
    fn data_already_acknowledged_is_a_free_spurious_retransmission() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.client_ack(1_300);
        s.server_resend(5_000, 1000, 1000);
        let an = s.finish();
        assert_eq!(an.findings[0].detail.as_deref(), Some("spurious"));
        assert_eq!(an.findings[0].cost_us, 0);
    }

    /// A SYN sent again with no SYN-ACK captured was not answered; one sent again after the
    /// SYN-ACK passed the capture point was, and its answer was lost beyond it.
    #[test]
    fn a_syn_sent_again_after_its_syn_ack_passed_says_the_answer_was_lost() {
        let mut s = Script::empty();
        s.raw(0, true, flags::SYN, 999, 0, &[]);
        s.raw(1_000_000, true, flags::SYN, 999, 0, &[]);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::SynRetransmit]);
        assert_eq!(an.findings[0].detail, None);
        let mut s = Script::empty();
        s.raw(0, true, flags::SYN, 999, 0, &[]);
        s.raw(100, false, flags::SYN | flags::ACK, 4_999, 1_000, &[]);
        s.raw(1_000_000, true, flags::SYN, 999, 0, &[]);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::SynRetransmit]);
        assert_eq!(an.findings[0].detail.as_deref(), Some(super::SYN_ACK_LOST));
        assert!(an.findings[0].explanation.contains("answered"));
    }

    #[test]
    fn a_syn_sent_again_is_syn_retransmit() {
        let mut s = Script::handshake(100);
        // The same SYN a second later (a new stream would need another ISN).
        s.raw(1_000_000, true, flags::SYN, 999, 0, &[]);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::SynRetransmit]);
        assert_eq!(an.findings[0].cost_us, 1_000_000);
        assert_eq!(an.streams.len(), 1);
    }
}
