//! Capture artifacts are not traffic: the same segment seen twice is analyzed once.
//!
//! A capture on `any` sees a packet on every interface it crosses (a bridge and its port, a
//! router's two sides), and a capture may see a GSO/TSO super-segment on one interface and
//! its pieces on another. Counted twice, each copy would look like a retransmission (and a
//! copied ACK like a duplicate ACK). A copy keeps everything the sender wrote: the ACK
//! number, the window, the option bytes (timestamps included), and the IPv4 identification
//! (the pieces of a super-segment number theirs on from the super-segment's). A real
//! retransmission is written again: Linux gives it a new IPv4 identification (and, a
//! millisecond or more later, a new timestamp); without an identification to compare, only
//! a repeat within [`COPY_WINDOW_NO_ID_NS`] — below the shortest retransmission timer — is
//! taken for a copy.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use super::tcp::{seq_le, seq_lt};
use super::tracker::Fx;
use crate::wire::{TcpSegment, flags};

/// How long after a segment a repeat without an IPv4 identification to compare counts as
/// its copy: below Linux's shortest retransmission timer (two jiffies); copies across a
/// bridge or a router come microseconds apart.
pub const COPY_WINDOW_NO_ID_NS: i64 = 1_000_000;
/// With IPv4 identifications to compare: a router's egress queue (shaping) may hold the
/// second copy this long.
const COPY_WINDOW_ID_NS: i64 = 2_000_000_000;
/// Segments remembered per direction.
const KEEP: usize = 64;

/// One segment as its sender wrote it.
struct Sent {
    seq: u32,
    end: u32,
    key: u64,
    id: u16,
    /// Whether `id` is the sender's numbering (0 included: it comes round every 65 536
    /// segments) rather than the absence of one.
    has_id: bool,
    ts: i64,
    /// Segments of the other direction seen before it.
    peer_seen: u64,
}

/// What a segment is to the segments its direction already sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// A second capture of a segment already seen: not traffic.
    Copy,
    /// Bytes already seen in a segment with an older IPv4 identification: the sender wrote
    /// them again (a retransmission).
    Rewrite,
    /// Neither (new data, or no identification to tell).
    New,
}

/// Per-connection state: the recent segments of each direction.
#[derive(Default)]
pub(super) struct Copies {
    dirs: [VecDeque<Sent>; 2],
    /// Segments seen per direction (copies not counted).
    seen: [u64; 2],
    /// Whether the direction's sender numbers its segments (a non-zero identification
    /// seen): then 0 is one of its numbers, not "none".
    numbered: [bool; 2],
    /// Whether this connection's capture has shown a copy.
    copied: bool,
    /// Whether it has shown a segment without a copy: one remembered more than
    /// [`COPY_WINDOW_NO_ID_NS`] before a later segment, with no copy seen since.
    single: bool,
    /// When the newest remembered segment was seen, and whether a copy came after it.
    last_new: Option<(i64, bool)>,
    /// Per direction, the furthest sequence number any remembered segment reached (its
    /// end; a segment without payload's own number): a segment starting there or beyond
    /// overlaps none of them, so neither repeats nor rewrites one — the common case, decided
    /// without a walk of the remembered segments.
    reach: [Option<u32>; 2],
    /// Per direction, how many remembered segments have a key in each of 32 buckets (the
    /// key's top five bits): a segment whose bucket is empty copies none of them.
    keys: [[u8; 32]; 2],
}

/// The bucket of `key` in [`Copies::keys`].
fn bucket(key: u64) -> usize {
    (key >> 59) as usize
}

/// What a copy keeps of its sender's writing besides the sequence range: the flags (but
/// PSH, FIN and CWR, which GSO puts on one piece only), ACK, window and option bytes; for a
/// segment without payload, also its sequence number and all flags.
fn key(seg: &TcpSegment<'_>) -> u64 {
    let mut h = Fx::default();
    let fl = if seg.payload_len == 0 {
        h.write_u32(seg.seq);
        seg.flags
    } else {
        seg.flags & !(flags::PSH | flags::FIN | flags::CWR)
    };
    (fl, seg.ack, seg.window, seg.option_bytes).hash(&mut h);
    h.finish()
}

impl Copies {
    /// Whether direction `d`'s sender numbers its segments (IPv4 identifications seen).
    pub fn numbered(&self, d: usize) -> bool {
        self.numbered[d]
    }

    /// Whether `seg`, of direction `d` seen at `ts`, repeats a segment this direction
    /// already sent (whole, or as a piece of a super-segment, or the pieces joined); if
    /// not, it is remembered. `mss`: the payload of one wire segment, to number pieces.
    pub fn is_copy(&mut self, d: usize, ts: i64, seg: &TcpSegment<'_>, mss: u32) -> Seen {
        if let Some((at, false)) = self.last_new
            && ts - at > COPY_WINDOW_NO_ID_NS
        {
            self.single = true;
        }
        // A capture that copies a connection's packets (two points on its path) copies
        // every one of them; one that has shown a segment without its copy, and no copy at
        // all, sees the connection once: a repeat without identifications is the sender's.
        // (CI: a server's SYN-ACK timer and the client's resent SYN, 1 s after the first
        // SYN-ACK was lost, made two identical SYN-ACKs 36 µs apart.)
        let copying = self.copied || !self.single;
        let q = &mut self.dirs[d];
        let keys = &mut self.keys[d];
        while let Some(s) = q.front().filter(|s| ts - s.ts > COPY_WINDOW_ID_NS) {
            keys[bucket(s.key)] -= 1;
            q.pop_front();
        }
        self.numbered[d] |= seg.ip_id != 0;
        let new = Sent {
            seq: seg.seq,
            end: seg.seq.wrapping_add(seg.payload_len),
            key: key(seg),
            id: seg.ip_id,
            has_id: self.numbered[d],
            ts,
            peer_seen: self.seen[1 - d],
        };
        // Past every remembered segment: no overlap (a copy of data starts inside one).
        let beyond = self.reach[d].is_none_or(|r| seq_le(r, new.seq));
        let copy = if keys[bucket(new.key)] == 0 {
            false
        } else if seg.payload_len == 0 {
            q.iter()
                .any(|s| s.key == new.key && s.id == new.id && recent(s, &new, copying))
        } else {
            !beyond && covered(q, &new, mss.max(1), copying)
        };
        if copy {
            self.copied = true;
            if let Some((_, after)) = &mut self.last_new {
                *after = true;
            }
            return Seen::Copy;
        }
        self.last_new = Some((ts, false));
        let rewrite = seg.payload_len > 0 && !beyond && rewritten(q, &new, mss.max(1));
        if q.len() >= KEEP
            && let Some(s) = q.pop_front()
        {
            keys[bucket(s.key)] -= 1;
        }
        keys[bucket(new.key)] += 1;
        self.reach[d] = Some(match self.reach[d] {
            Some(r) if seq_le(new.end, r) => r,
            _ => new.end,
        });
        q.push_back(new);
        self.seen[d] += 1;
        if rewrite { Seen::Rewrite } else { Seen::New }
    }
}

/// Whether some of the bytes of `new` were in a remembered segment written before it: Linux
/// numbers the segments a socket writes on (a super-segment takes one identification per
/// wire segment), so an overlapping segment with an older identification than `new`'s own
/// numbering (which a copy, or a piece of the same super-segment, would carry) means the
/// sender wrote those bytes twice. Only with identifications on both.
fn rewritten(q: &VecDeque<Sent>, new: &Sent, mss: u32) -> bool {
    new.has_id
        && q.iter().any(|s| {
            let overlap = seq_lt(s.seq, new.end) && seq_lt(new.seq, s.end);
            // What `new`'s identification would be as a piece of `s` (or `s` of `new`).
            let piece_id = if seq_le(s.seq, new.seq) {
                s.id.wrapping_add((new.seq.wrapping_sub(s.seq) / mss) as u16)
            } else {
                s.id.wrapping_sub((s.seq.wrapping_sub(new.seq) / mss) as u16)
            };
            overlap && s.has_id && id_older(piece_id, new.id)
        })
}

/// Whether identification `a` was given out before `b` (16-bit serial arithmetic: the two
/// are close in a sender's numbering).
pub(super) fn id_older(a: u16, b: u16) -> bool {
    (b.wrapping_sub(a) as i16) > 0
}

/// Whether `s` is recent enough for `new` to be its copy. With IPv4 identifications, the
/// identification decides (checked by the caller): an identification of 0 from a sender that
/// numbers its segments is one of its numbers (CI saw a 64 KB super-segment numbered 0 taken
/// for a resend of itself, its two captures on `any` 10 µs apart with the peer's ACK, written
/// by another CPU, between them). Without, only a repeat within
/// [`COPY_WINDOW_NO_ID_NS`] with nothing from the peer in between: a retransmission that
/// soon needs the peer's duplicate ACKs or SACKs, and those pass the capture point between
/// the original and the retransmission (seen: a retransmission 70 µs after a dropped
/// original, with the same timestamp) — and only in a capture that may be `copying` the
/// connection.
fn recent(s: &Sent, new: &Sent, copying: bool) -> bool {
    if s.has_id && new.has_id {
        new.ts - s.ts <= COPY_WINDOW_ID_NS
    } else {
        copying && new.ts - s.ts <= COPY_WINDOW_NO_ID_NS && new.peer_seen == s.peer_seen
    }
}

/// Whether every byte of `new` was in remembered segments written alike, the first of them
/// with the identification `new` must carry when it is a copy.
fn covered(q: &VecDeque<Sent>, new: &Sent, mss: u32, copying: bool) -> bool {
    let alike = |s: &Sent, pos: u32| {
        s.key == new.key && seq_le(s.seq, pos) && seq_lt(pos, s.end) && recent(s, new, copying)
    };
    // The k-th piece of a super-segment carries its identification + k.
    let same_id = |s: &Sent| {
        !s.has_id
            || !new.has_id
            || s.id
                .wrapping_add((new.seq.wrapping_sub(s.seq) / mss) as u16)
                == new.id
    };
    let Some(first) = q.iter().find(|s| alike(s, new.seq) && same_id(s)) else {
        return false;
    };
    let holding = |pos: u32| q.iter().find(|s| alike(s, pos));
    let mut pos = first.end;
    while seq_lt(pos, new.end) {
        match holding(pos) {
            Some(s) => pos = s.end,
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Script, kinds};
    use crate::wire::flags;
    use lagtrace_model::FindingKind;

    #[test]
    fn a_segment_captured_twice_is_one_segment() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 7;
        s.server_data(1_200, 1000);
        s.copy_last(1_205);
        s.client_ack(1_300);
        s.copy_last(1_302);
        let an = s.finish();
        assert!(an.findings.is_empty(), "{:?}", an.findings);
        assert_eq!(an.streams[0].retransmissions, 0);
        assert_eq!(an.streams[0].frames_ba, 2, "SYN-ACK and the data, once");
        assert!(
            an.warnings.iter().any(|w| w.contains("2 frames")),
            "{:?}",
            an.warnings
        );
    }

    #[test]
    fn identification_zero_is_a_number_when_the_sender_numbers_its_segments() {
        // The server's numbering comes round to 0; that segment's second capture comes after
        // the client's ACK (another CPU wrote it into the capture between the two copies).
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 65_534;
        s.server_data(1_200, 1000);
        s.server_data(1_210, 1000);
        s.server_data(1_220, 1000);
        s.client_ack(1_225);
        s.raw(
            1_230,
            false,
            flags::PSH | flags::ACK,
            7_000,
            1_041,
            &[b'y'; 1000],
        );
        let an = s.finish();
        assert!(an.findings.is_empty(), "{:?}", an.findings);
        assert_eq!(
            an.streams[0].frames_ba, 4,
            "SYN-ACK and three segments, once"
        );
        // Written again under a later number, it is a resend.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 65_535;
        s.server_data(1_200, 1000);
        s.server_data(1_210, 1000);
        s.client_ack(1_225);
        s.ip_id = 9;
        s.raw(
            1_230,
            false,
            flags::PSH | flags::ACK,
            6_000,
            1_041,
            &[b'y'; 1000],
        );
        assert_eq!(kinds(&s.finish()), [FindingKind::Retransmission]);
    }

    #[test]
    fn a_super_segment_and_its_pieces_are_one_send() {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 100;
        s.server_data(1_200, 3 * 1460);
        // The same bytes as three wire segments, identifications 100, 101, 102.
        s.pieces_of_last(1_210, 1460);
        s.client_ack(1_300);
        let an = s.finish();
        assert!(an.findings.is_empty(), "{:?}", an.findings);
        assert_eq!(an.streams[0].frames_ba, 2);
    }

    #[test]
    fn the_same_bytes_written_again_are_a_retransmission() {
        // A new identification: the sender wrote it again, even 50 µs later.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 7;
        s.server_data(1_200, 1000);
        s.ip_id = 8;
        s.server_resend(1_250, 1000, 1000);
        assert_eq!(kinds(&s.finish()), [FindingKind::Retransmission]);
        // Without identifications: a repeat 3 ms later is past any copy.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.server_resend(4_200, 1000, 1000);
        assert_eq!(kinds(&s.finish()), [FindingKind::Retransmission]);
    }

    #[test]
    fn a_retransmission_of_a_segment_lost_after_the_capture_point_is_not_a_copy() {
        // The original was captured and then dropped; the peer's SACK came back and the
        // sender wrote it again 190 µs later, same timestamp, new identification; then the
        // capture saw that retransmission a second time.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.ip_id = 7;
        s.server_data(1_200, 1000);
        s.server_data(1_210, 1000);
        s.client_ack(1_250);
        s.server_resend(1_400, 2000, 1000);
        s.copy_last(1_402);
        let an = s.finish();
        assert_eq!(kinds(&an), [FindingKind::Retransmission]);
        // Without identifications, the peer's packet in between tells it apart too.
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        s.server_data(1_200, 1000);
        s.server_data(1_210, 1000);
        s.client_ack(1_250);
        s.server_resend(1_400, 2000, 1000);
        s.copy_last(1_402);
        assert_eq!(kinds(&s.finish()), [FindingKind::Retransmission]);
    }

    /// Server segments of 1000 B at offsets `offs` (from its first byte) with the given
    /// identifications, 5 µs apart from 1.2 ms on (well within the 100 µs RTT of each other).
    fn server_writes(writes: &[(u32, u16)]) -> lagtrace_model::analyze::Analysis {
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        let ack = 1_041;
        for (k, &(off, id)) in writes.iter().enumerate() {
            s.ip_id = id;
            let fl = flags::PSH | flags::ACK;
            s.raw(
                1_200 + 5 * k as u64,
                false,
                fl,
                5_000 + off,
                ack,
                &[b'y'; 1000],
            );
        }
        s.finish()
    }

    #[test]
    fn bytes_written_twice_right_away_are_a_retransmission_not_reordering() {
        // A (id 50), B (id 51), A again (id 52) 5 µs after B: a reordering path made the
        // receiver SACK B and the sender resend A at once. Linux counts that resend; by
        // Wireshark's rule alone (within one RTT of B) it would be out of order.
        let an = server_writes(&[(0, 50), (1000, 51), (0, 52)]);
        assert_eq!(kinds(&an), [FindingKind::Retransmission]);
        assert_eq!(an.streams[0].retransmissions, 1);
        // The resend passed its original on the way: B, A again (52), then A (50): one
        // retransmission, the resend, written after B.
        let an = server_writes(&[(1000, 51), (0, 52), (0, 50)]);
        assert_eq!(kinds(&an), [FindingKind::Retransmission]);
        assert_eq!(an.findings[0].frames, [6], "{:?}", an.findings);
        // Reordering alone (B before A, each written once) is no retransmission, however
        // late A comes (past one RTT Wireshark's rule would call it one).
        let an = server_writes(&[(1000, 51), (0, 50)]);
        assert!(an.findings.is_empty(), "{:?}", an.findings);
        let mut s = Script::handshake(100);
        s.client_data(1_000, 41);
        for (t, off, id) in [(1_200, 1000, 51), (1_700, 0, 50)] {
            s.ip_id = id;
            s.raw(
                t,
                false,
                flags::PSH | flags::ACK,
                5_000 + off,
                1_041,
                &[b'y'; 1000],
            );
        }
        let an = s.finish();
        assert!(an.findings.is_empty(), "{:?}", an.findings);
        // Without identifications Wireshark's rule stands: out of order.
        let an = server_writes(&[(0, 0), (1000, 0), (0, 0)]);
        assert!(an.findings.is_empty(), "{:?}", an.findings);
    }

    /// The first SYN-ACK lost after the capture point: the client's SYN again 1 s later,
    /// and two identical SYN-ACKs 36 µs apart (one answering it, one from the server's own
    /// timer), no identification on either; `copied`: every frame captured twice.
    fn syn_ack_race(copied: bool) -> lagtrace_model::analyze::Analysis {
        let mut s = Script::empty();
        let frame = |s: &mut Script, t: u64, client: bool, fl: u8, seq: u32, ack: u32| {
            s.raw(t, client, fl, seq, ack, &[]);
            if copied {
                s.copy_last(t + 4);
            }
        };
        let syn_ack = flags::SYN | flags::ACK;
        frame(&mut s, 0, true, flags::SYN, 999, 0);
        frame(&mut s, 23, false, syn_ack, 4_999, 1_000);
        frame(&mut s, 1_015_575, true, flags::SYN, 999, 0);
        frame(&mut s, 1_015_610, false, syn_ack, 4_999, 1_000);
        frame(&mut s, 1_015_646, false, syn_ack, 4_999, 1_000);
        frame(&mut s, 1_015_671, true, flags::ACK, 1_000, 5_000);
        s.finish()
    }

    #[test]
    fn two_syn_acks_sent_together_are_two_sends_in_a_capture_that_copies_nothing() {
        // tshark: frames 3, 4 and 5 are retransmissions (CI saw ours miss 5).
        let an = syn_ack_race(false);
        assert_eq!(an.retransmitted_frames, [3, 4, 5]);
        assert_eq!(an.streams[0].frames_ba, 3);
        // The same sends captured twice each: the copies are copies — and, the limit, the
        // second SYN-ACK (frame 9) cannot be told from a third capture of the first.
        let an = syn_ack_race(true);
        assert_eq!(an.retransmitted_frames, [5, 7], "{:?}", an.warnings);
        assert_eq!(an.streams[0].frames_ba, 2);
    }

    #[test]
    fn a_copied_ack_is_one_ack() {
        let mut s = Script::handshake(100);
        s.raw(120, true, flags::ACK, 1_000, 5_000, &[]);
        let an = s.finish();
        assert!(an.findings.is_empty(), "{:?}", an.findings);
        assert_eq!(an.streams[0].frames_ab, 2);
    }
}
