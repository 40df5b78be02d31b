//! The receiver's window holding the sender back.
//!
//! - `zero-window`: a receiver advertised a zero window, for more than a couple of RTTs.
//! - `window-full`: the sender's data reached the edge of the peer's window and the next
//!   data left only after a wait of more than a couple of RTTs.

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::Finding;

use super::event::Seg;
use super::us;
use crate::wire::flags;

#[derive(Default)]
struct Dir {
    /// Data this side sent that filled the peer's window: (frame, ts, the shift's lower
    /// bound when the window scale was not seen).
    window_full: Option<(u64, i64, Option<u8>)>,
    /// Zero window advertised by this side: (frame, ts).
    zero_window: Option<(u64, i64)>,
}

/// Per-stream state of the detector.
#[derive(Default)]
pub(super) struct Window {
    dirs: [Dir; 2],
}

impl Window {
    /// Every segment: a zero window opening or closing.
    pub fn zero_window(
        &mut self,
        ev: &Seg<'_>,
        txn: Option<u32>,
        first_ts: i64,
    ) -> Option<Finding> {
        if ev.flags & (flags::SYN | flags::RST) != 0 {
            return None;
        }
        let me = &mut self.dirs[ev.dir];
        if ev.win == 0 && ev.flags & flags::ACK != 0 {
            me.zero_window.get_or_insert((ev.frame, ev.ts));
            return None;
        }
        let (zf, zts) = me.zero_window.take()?;
        // A window closed for less than a couple of RTTs costs nothing measurable.
        if us(ev.ts - zts) < (2 * ev.rtt_est_us).max(1_000) {
            return None;
        }
        Some(Finding {
            kind: FindingKind::ZeroWindow,
            detail: None,
            stream: ev.stream,
            transaction: txn,
            frames: vec![zf, ev.frame],
            start_us: (zts - first_ts) / 1000,
            end_us: (ev.ts - first_ts) / 1000,
            cost_us: us(ev.ts - zts),
            explanation: format!(
                "receiver advertised a zero window for {:.1} ms (frames {zf}..{})",
                (ev.ts - zts) as f64 / 1e6,
                ev.frame
            ),
        })
    }

    /// A fresh data segment: did the sender wait at a full window before it? Returns
    /// whether the sender was window-limited, and the finding when the wait was long.
    pub fn window_full(
        &mut self,
        ev: &Seg<'_>,
        txn: Option<u32>,
        first_ts: i64,
    ) -> (bool, Option<Finding>) {
        let Some((wf, wts, bound)) = self.dirs[ev.dir].window_full.take() else {
            return (false, None);
        };
        let gap = us(ev.ts - wts);
        if gap < (2 * ev.rtt_est_us).max(1_000) {
            return (true, None);
        }
        let f = Finding {
            kind: FindingKind::WindowFull,
            detail: None,
            stream: ev.stream,
            transaction: txn,
            frames: vec![wf, ev.frame],
            start_us: (wts - first_ts) / 1000,
            end_us: (ev.ts - first_ts) / 1000,
            cost_us: gap,
            explanation: format!(
                "sender filled the receiver's window at frame {wf} and waited {:.1} ms{}",
                gap as f64 / 1000.0,
                bound
                    .map(|s| format!(
                        " (window scale not captured: the bytes in flight reached exactly the raw window × 2^{s}, the least shift they allow)"
                    ))
                    .unwrap_or_default()
            ),
        };
        (true, Some(f))
    }

    /// A fresh data segment, after the checks: did it fill the peer's window?
    ///
    /// With the window scale known, data reaching the window's edge fills it. Without it
    /// (no handshake captured) the window read is a lower bound, raised by every flight
    /// larger than it: the data fills it only when it ends exactly at that bound's edge —
    /// which a sender stopped by the window does (the bound is then its true shift), and a
    /// sender stopped by anything else does not, byte for byte. Not when this flight itself
    /// raised the bound (the least shift that fits a flight can meet it exactly by chance),
    /// nor with one segment in flight (a sender its congestion window holds to one segment
    /// after a timeout meets the same bound again and again). Seen: 1448 B in flight after a
    /// timeout against a raw window of 362 (shift 10): the least shift that fits is 2, and
    /// 362 × 4 is 1448 — a 213 ms `window-full` on a window of 370 KB (1m-c8-tbf, the capture
    /// cut in half). A sender the window truly stops fills it again with a flight of more.
    pub fn after_data(&mut self, ev: &Seg<'_>) {
        let end = ev.seq.wrapping_add(ev.len);
        let mss = ev.data.map_or(0, |d| d.mss);
        if let (Some(w), Some(a)) = (ev.peer_window, ev.peer_last_ack)
            && w > 0
            && ev.flags & flags::SYN == 0
            && end.wrapping_sub(a) < 1 << 30
        {
            let fill = end.wrapping_sub(a);
            let bound = (!ev.peer_scale.is_known()).then(|| ev.peer_scale.shift());
            if (bound.is_none() && fill >= w)
                || (bound.is_some() && fill == w && fill > mss && !ev.peer_scale_raised)
            {
                self.dirs[ev.dir].window_full = Some((ev.frame, ev.ts, bound));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Script, kinds};
    use lagtrace_model::FindingKind;

    #[test]
    fn a_zero_window_held_for_long_is_found() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.window[0] = 0;
        s.client_ack(1_300);
        s.window[0] = 65_535;
        s.client_ack(301_300);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::ZeroWindow]);
        assert_eq!(an.findings[0].frames, [6, 7]);
        assert_eq!(an.findings[0].cost_us, 300_000);
    }

    #[test]
    fn a_zero_window_reopened_at_once_costs_nothing() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.window[0] = 0;
        s.client_ack(1_300);
        s.window[0] = 65_535;
        s.client_ack(1_400);
        assert!(s.finish().findings.is_empty());
    }

    #[test]
    fn a_flight_that_raised_the_least_shift_is_not_a_full_window_by_itself() {
        // No handshake captured; the client advertises a raw 362 (its shift is 10 in
        // truth). The server's one segment of 1448 B needs a shift of at least 2, and
        // 362 × 4 is 1448: it fits that bound by construction, not because the window
        // stopped the sender; nor do the same one-segment flights after later timeouts. A
        // flight of two segments to the edge of the bound (the window read with it) is a
        // full window.
        let run = |refill: bool| {
            let mut s = Script::empty();
            s.window[0] = 362;
            // A first exchange gives the RTT (50 µs each way): small, it raises nothing.
            s.client_data(1_000, 41);
            s.server_ack(1_050);
            s.server_data(1_100, 100);
            s.client_ack(1_150);
            s.server_data(1_200, 1448);
            if refill {
                s.window[0] = 724;
                s.client_ack(1_400);
                s.server_data(1_500, 1448);
                s.server_data(1_510, 1448);
            }
            s.client_ack(60_000);
            s.server_data(60_100, 1448);
            // Again one segment after a timeout, the raw window unchanged.
            s.client_ack(61_000);
            s.server_data(261_000, 1448);
            s.finish()
        };
        let an = run(false);
        assert!(
            !kinds(&an).contains(&FindingKind::WindowFull),
            "{:?}",
            an.findings
        );
        let an = run(true);
        assert_eq!(kinds(&an), [FindingKind::WindowFull], "{:?}", an.findings);
        assert!(
            an.findings[0]
                .explanation
                .contains("window scale not captured")
        );
    }

    #[test]
    fn data_waiting_at_the_edge_of_the_window_is_window_full() {
        let mut s = Script::handshake(100);
        s.window[0] = 2_000;
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.server_data(1_210, 1000); // fills the client's 2000 B window
        s.client_ack(50_000);
        s.server_data(50_100, 1000);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::WindowFull]);
        let f = &an.findings[0];
        assert_eq!(f.frames, [6, 8]);
        assert_eq!(f.cost_us, 48_890);
    }
}
