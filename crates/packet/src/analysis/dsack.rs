//! D-SACK (RFC 2883): the receiver reports, in the first SACK block below its cumulative
//! ACK, data it received twice. A retransmission it reports so was spurious: the original
//! arrived and only its ACK was late (a receiver busy on a saturated CPU, a tail-loss probe
//! or RACK timer that fired before the ACK came back), so it cost the transfer nothing. The
//! sender's own `TcpExtTCPDSACKRecvSegs` counts the same reports.

use std::collections::VecDeque;

use super::tcp::{seq_le, seq_lt};

/// Retransmissions remembered per stream and direction while their D-SACK may come.
const KEEP: usize = 256;

/// A retransmitted segment and where its finding went in the recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Resent {
    seq: u32,
    end: u32,
    /// The finding's index among the kept findings, and its cost's index.
    pub slots: (Option<usize>, Option<usize>),
}

/// The retransmissions of each (stream, sender direction) not yet reported.
#[derive(Default)]
pub(super) struct Dsack {
    pending: super::tracker::FxMap<(usize, usize), VecDeque<Resent>>,
}

impl Dsack {
    /// Stream `i`'s sender `dir` resent `[seq, seq + len)`.
    pub fn resent(&mut self, i: usize, dir: usize, seq: u32, len: u32, slots: Resent) {
        let q = self.pending.entry((i, dir)).or_default();
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back(Resent {
            seq,
            end: seq.wrapping_add(len),
            ..slots
        });
    }

    /// The receiver of `dir`'s data sent an ACK of `ack` whose first SACK block is `block`:
    /// when that block lies at or below the ACK it is a D-SACK; the resent segments it
    /// covers are returned (and forgotten).
    pub fn reported(&mut self, i: usize, dir: usize, block: (u32, u32), ack: u32) -> Vec<Resent> {
        let (l, r) = block;
        if !seq_lt(l, r) || !seq_le(r, ack) {
            return Vec::new();
        }
        let Some(q) = self.pending.get_mut(&(i, dir)) else {
            return Vec::new();
        };
        let mut hit = Vec::new();
        q.retain(|s| {
            let overlaps = seq_lt(s.seq, r) && seq_lt(l, s.end);
            if overlaps {
                hit.push(*s);
            }
            !overlaps
        });
        hit
    }

    /// Slots for a retransmission recorded at `slots`.
    pub fn slots(finding: Option<usize>, cost: Option<usize>) -> Resent {
        Resent {
            seq: 0,
            end: 0,
            slots: (finding, cost),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_below_the_ack_reports_the_resent_segment_it_covers() {
        let mut d = Dsack::default();
        d.resent(0, 1, 1000, 100, Dsack::slots(Some(3), Some(4)));
        d.resent(0, 1, 5000, 100, Dsack::slots(Some(5), Some(6)));
        // A SACK block above the ACK is an ordinary SACK, not a D-SACK.
        assert!(d.reported(0, 1, (1000, 1100), 900).is_empty());
        // Another direction or stream reports nothing of these.
        assert!(d.reported(0, 0, (1000, 1100), 2000).is_empty());
        let hit = d.reported(0, 1, (1000, 1100), 2000);
        assert_eq!(hit.len(), 1);
        assert_eq!(hit[0].slots, (Some(3), Some(4)));
        // Reported once.
        assert!(d.reported(0, 1, (1000, 1100), 2000).is_empty());
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut d = Dsack::default();
        d.resent(2, 0, u32::MAX - 50, 100, Dsack::slots(None, Some(0)));
        let hit = d.reported(2, 0, (u32::MAX - 50, 49), 60);
        assert_eq!(hit.len(), 1);
    }
}
