//! Per-transaction timings (opt-in, `AnalyzeOptions::timings`): when each transaction's
//! request and response went by, the connection's handshake, and the waits the detectors
//! measured inside it — the packet half of the request ⋈ packets join.
//!
//! The waits are attributed at the end, from the findings as finally recorded (stalls
//! released late and slow-server candidates are decided only then): a finding of a
//! transaction adds its interval `[end − cost, end]` to the request side when it ended by the
//! request's last byte, else to the response side; overlapping intervals of one side and
//! category count once.

use std::collections::HashMap;

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::{Finding, StreamSummary, TxnTiming};

use super::event::Seg;
use super::http::Txn;
use crate::wire::flags;

/// Per stream: the handshake as the capture saw it.
#[derive(Default)]
pub(super) struct ConnTimes {
    syn_ts: Option<i64>,
    syns: u32,
    synack_ts: Option<i64>,
}

impl ConnTimes {
    /// Notes a SYN or SYN-ACK.
    pub fn on_segment(&mut self, ev: &Seg<'_>) {
        if ev.flags & flags::SYN == 0 {
            return;
        }
        if ev.flags & flags::ACK == 0 {
            self.syn_ts.get_or_insert(ev.ts);
            // A SYN with another ISN starts another stream: these are the same SYN again.
            self.syns += 1;
        } else {
            self.synack_ts.get_or_insert(ev.ts);
        }
    }
}

/// The timing of a transaction about to close, on stream `st` (client direction `client`).
pub(super) fn of(
    st: &StreamSummary,
    client: usize,
    conn: &ConnTimes,
    t: &Txn,
    server_far_rtt_us: u64,
    first_ts: i64,
) -> TxnTiming {
    let rel = |ts: Option<i64>| ts.map(|v| (v - first_ts) / 1000);
    let [rf, rl, sf, sl] = t.times();
    let (c, s) = if client == 0 {
        (st.a, st.b)
    } else {
        (st.b, st.a)
    };
    TxnTiming {
        stream: st.stream,
        index: t.t.index,
        client: c,
        server: s,
        syn_at_us: rel(conn.syn_ts),
        syn_retransmits: conn.syns.saturating_sub(1),
        synack_at_us: rel(conn.synack_ts),
        request_first_at_us: rel(rf),
        request_last_at_us: rel(rl),
        response_first_at_us: rel(sf),
        response_last_at_us: rel(sl),
        server_path_us: server_far_rtt_us,
        hold_request_us: 0,
        hold_response_us: 0,
        loss_request_us: 0,
        loss_response_us: 0,
        kinds: Vec::new(),
        weight: 1.0,
    }
}

/// Whether a finding kind is data held before the wire (`Some(false)`), a loss wait
/// (`Some(true)`), or neither.
fn category(k: FindingKind) -> Option<bool> {
    match k {
        FindingKind::NagleDelayedAck
        | FindingKind::NagleStall
        | FindingKind::DelayedAck
        | FindingKind::ZeroWindow
        | FindingKind::WindowFull
        | FindingKind::TcpCork => Some(false),
        // A segment held until the peer's ACK with TCP_NODELAY on: a copy dropped before
        // the wire and sent again on the ACK (issue 12's dropped-before-wire) — a loss wait.
        FindingKind::Retransmission
        | FindingKind::HeldUntilAck
        | FindingKind::DroppedBeforeCapture => Some(true),
        FindingKind::SynRetransmit | FindingKind::SlowServer => None,
    }
}

/// Total length of the union of intervals.
fn union_len(mut v: Vec<(i64, i64)>) -> u64 {
    v.sort_unstable();
    let mut total = 0i64;
    let mut cur: Option<(i64, i64)> = None;
    for (a, b) in v {
        match cur {
            Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    if let Some((a, b)) = cur {
        total += b - a;
    }
    u64::try_from(total).unwrap_or(0)
}

/// Adds the findings' waits and kinds to the timings of their transactions.
pub(super) fn attribute(timings: &mut [TxnTiming], findings: &[Finding]) {
    let at: HashMap<(u32, u32), usize> = timings
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.stream, t.index), i))
        .collect();
    // (timing, response side, loss) → intervals.
    let mut spans: HashMap<(usize, bool, bool), Vec<(i64, i64)>> = HashMap::new();
    for f in findings {
        let Some(&i) = f.transaction.and_then(|x| at.get(&(f.stream, x))) else {
            continue;
        };
        let t = &mut timings[i];
        if !t.kinds.contains(&f.kind) {
            t.kinds.push(f.kind);
        }
        let Some(loss) = category(f.kind) else {
            continue;
        };
        let cost = i64::try_from(f.cost_us).unwrap_or(i64::MAX);
        if cost == 0 {
            continue;
        }
        let response = t.request_last_at_us.is_none_or(|rl| f.end_us > rl);
        spans
            .entry((i, response, loss))
            .or_default()
            .push((f.end_us.saturating_sub(cost), f.end_us));
    }
    for ((i, response, loss), v) in spans {
        let n = union_len(v);
        let t = &mut timings[i];
        let slot = match (response, loss) {
            (false, false) => &mut t.hold_request_us,
            (true, false) => &mut t.hold_response_us,
            (false, true) => &mut t.loss_request_us,
            (true, true) => &mut t.loss_response_us,
        };
        *slot = n;
    }
    for t in timings.iter_mut() {
        t.kinds.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Script;
    use super::*;

    #[test]
    fn overlapping_intervals_count_once() {
        assert_eq!(union_len(vec![(0, 10), (5, 20), (30, 35)]), 25);
        assert_eq!(union_len(vec![]), 0);
    }

    #[test]
    fn a_keep_alive_exchange_has_its_times_and_its_rto_wait() {
        let mut s = Script::handshake(100).with_timings();
        s.client_data(1_000, 41);
        s.server_data(1_500, 238);
        s.client_ack(1_600);
        s.client_data(3_000, 41);
        s.server_data(3_200, 1000);
        // The response's data again after a timeout: the client waited for it.
        s.server_resend(205_000, 1000, 1000);
        s.client_ack(205_100);
        let an = s.finish();
        assert_eq!(an.timings.len(), 2);
        let t = &an.timings[0];
        assert_eq!((t.stream, t.index), (0, 0));
        assert_eq!(t.client, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(t.server, "10.0.0.2:80".parse().unwrap());
        assert_eq!(
            (t.syn_at_us, t.synack_at_us, t.syn_retransmits),
            (Some(0), Some(100), 0)
        );
        assert_eq!(
            (t.request_first_at_us, t.request_last_at_us),
            (Some(1_000), Some(1_000))
        );
        assert_eq!(
            (t.response_first_at_us, t.response_last_at_us),
            (Some(1_500), Some(1_500))
        );
        assert_eq!((t.loss_response_us, t.hold_response_us), (0, 0));
        let t = &an.timings[1];
        assert_eq!(t.index, 1);
        assert_eq!(t.response_last_at_us, Some(205_000));
        assert_eq!(t.loss_response_us, 205_000 - 3_200);
        assert_eq!((t.loss_request_us, t.hold_request_us), (0, 0));
        assert_eq!(t.kinds, [FindingKind::Retransmission]);
    }

    #[test]
    fn a_nagle_hold_is_response_hold_and_syn_retransmits_are_counted() {
        let mut s = Script::handshake(100).with_timings();
        // The same SYN twice more, 1 s apart (the first was lost beyond the capture).
        s.raw(1_000_000, true, flags::SYN, 999, 0, &[]);
        s.raw(2_000_000, true, flags::SYN, 999, 0, &[]);
        s.client_data(2_001_000, 41);
        s.server_data(2_001_500, 238);
        s.client_data(2_003_000, 41);
        s.server_data(2_003_200, 238);
        // The body waits for the client's delayed ACK: a Nagle hold.
        s.client_ack(2_043_200);
        s.server_data(2_043_300, 615);
        let an = s.finish();
        let t = &an.timings[1];
        assert_eq!(t.syn_retransmits, 2);
        assert!(
            (39_000..=40_200).contains(&t.hold_response_us),
            "{t:?} {:?}",
            an.findings
        );
        assert_eq!(t.hold_request_us, 0);
        assert!(t.kinds.iter().all(|k| k.is_ack_stall()), "{t:?}");
    }

    #[test]
    fn without_the_option_there_are_none() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_500, 238);
        assert!(s.finish().timings.is_empty());
    }
}
