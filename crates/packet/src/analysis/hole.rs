//! A PMTU black hole: a sender's segments above some size are never acknowledged however
//! often it resends them, while its smaller ones pass after them. A link on the path
//! carries less than the sender's MSS, and the router's ICMP "fragmentation needed" (IPv6
//! "packet too big") that would teach the sender the path's MTU never comes back — a
//! firewall drops it — so the sender keeps resending the same full-size segment until the
//! connection dies. The capture must see the sender's side of the hole (near the server for
//! responses); near the receiver only the small segments ever arrive.
//!
//! The evidence, per path (sender and receiver addresses: a hole lies on some clients'
//! paths, and the others' large segments pass): segments sent [`MIN_COPIES`] times or more and never
//! acknowledged by the time their stream ended, on [`MIN_STREAMS`] streams or more; every
//! such segment larger than any of the sender's segments acknowledged after the first of
//! them was sent; and some were acknowledged then (a path that carries nothing is down, not
//! a hole). One lost segment on one stream, or a resend that got through, names nothing.

use std::collections::VecDeque;
use std::net::IpAddr;

use lagtrace_model::analyze::BlackHole;

use super::event::{RetransKind, Seg};
use super::tcp::{seq_le, seq_lt};

/// Times a segment is sent (the original and its resends) before it counts as lost, when
/// its stream ends without its acknowledgement.
pub const MIN_COPIES: u32 = 3;
/// Streams with a lost segment a sender needs.
pub const MIN_STREAMS: usize = 2;
/// Fresh segments remembered per direction until acknowledged (older ones are forgotten).
const PENDING: usize = 256;
/// Resent segments remembered per direction.
const RESENT: usize = 16;
/// Lost segments remembered per sender.
const LOST: usize = 1024;
/// Time buckets of passes kept per direction of a stream.
const PASSED_BUCKETS: usize = 64;
/// Passes are kept as the largest per this much time (ns).
const BUCKET_NS: i64 = 100_000_000;

/// A segment sent again, and how often.
#[derive(Debug, Clone)]
struct Resent {
    seq: u32,
    /// The smallest copy's payload (capped at the MSS: a super-segment is MSS-sized
    /// packets on the wire).
    len: u32,
    /// Times sent, the original counted.
    copies: u32,
    first_ts: i64,
    /// The original's frame (when known) and the resends'.
    frames: Vec<u64>,
}

/// One direction of a stream.
#[derive(Debug, Default)]
struct Dir {
    /// Fresh segments not yet acknowledged: (sequence after it, length, when sent).
    pending: VecDeque<(u32, u32, i64)>,
    resent: Vec<Resent>,
    /// The peer's highest acknowledgement.
    acked: Option<u32>,
    /// Segments acknowledged: (time bucket sent in, the largest, how many), in order.
    passed: Vec<(i64, u32, u64)>,
}

/// A stream's state.
#[derive(Debug, Default)]
pub(super) struct Stream {
    dirs: [Dir; 2],
}

/// One lost segment.
#[derive(Debug, Clone)]
struct Lost {
    stream: u32,
    len: u32,
    copies: u32,
    first_ts: i64,
    frames: Vec<u64>,
}

/// Per path: what was lost, and the largest segment acknowledged per time bucket.
#[derive(Debug, Default)]
struct Path {
    lost: Vec<Lost>,
    /// Per time bucket: the largest segment acknowledged of those sent in it, how many.
    passed: super::tracker::FxMap<i64, (u32, u64)>,
}

/// Every path's account, by (sender, receiver).
#[derive(Debug, Default)]
pub(super) struct Holes {
    paths: super::tracker::FxMap<(IpAddr, IpAddr), Path>,
}

impl Stream {
    /// Segment `ev` of a stream whose direction `d` is sent by `senders[d]`.
    pub fn on_segment(&mut self, ev: &Seg<'_>) {
        let d = ev.dir;
        // An acknowledgement of the peer's data: its segments below it passed.
        if ev.flags & crate::wire::flags::ACK != 0 {
            let peer = &mut self.dirs[1 - d];
            if peer.acked.is_none_or(|a| seq_lt(a, ev.ack)) {
                peer.acked = Some(ev.ack);
            }
            while let Some(&(end, len, ts)) = peer.pending.front() {
                if !seq_le(end, ev.ack) {
                    break;
                }
                peer.pending.pop_front();
                let b = ts.div_euclid(BUCKET_NS);
                match peer.passed.last_mut() {
                    Some(last) if last.0 == b => {
                        last.1 = last.1.max(len);
                        last.2 += 1;
                    }
                    _ => {
                        // Bounded: the oldest two buckets merge into the later one (an
                        // early pass moved later can only widen what passed after a loss).
                        if peer.passed.len() >= PASSED_BUCKETS {
                            let (_, l0, n0) = peer.passed.remove(0);
                            let next = &mut peer.passed[0];
                            next.1 = next.1.max(l0);
                            next.2 += n0;
                        }
                        peer.passed.push((b, len, 1));
                    }
                }
            }
        }
        if ev.len == 0 {
            return;
        }
        let mss = ev.data.map_or(ev.len, |x| x.mss.max(1));
        let len = ev.len.min(mss);
        let me = &mut self.dirs[d];
        match ev.retrans {
            Some(r) if r.kind != RetransKind::Spurious => {
                if let Some(x) = me.resent.iter_mut().find(|x| x.seq == ev.seq) {
                    x.copies += 1;
                    x.len = x.len.min(len);
                    if x.frames.len() < 8 {
                        x.frames.push(ev.frame);
                    }
                } else if me.resent.len() < RESENT {
                    me.resent.push(Resent {
                        seq: ev.seq,
                        len,
                        copies: 2,
                        first_ts: r.orig_ts,
                        frames: r.orig_frame.into_iter().chain([ev.frame]).collect(),
                    });
                }
            }
            Some(_) => {}
            None => {
                if me.pending.len() >= PENDING {
                    me.pending.pop_front();
                }
                me.pending
                    .push_back((ev.seq.wrapping_add(ev.len), len, ev.ts));
            }
        }
    }

    /// The stream `stream` ended (or the capture did): its segments resent
    /// [`MIN_COPIES`] times and never acknowledged are lost.
    pub fn finish(self, stream: u32, senders: [IpAddr; 2], holes: &mut Holes) {
        for (d, dir) in self.dirs.into_iter().enumerate() {
            if dir.passed.is_empty() && dir.resent.is_empty() {
                continue;
            }
            let s = holes.paths.entry((senders[d], senders[1 - d])).or_default();
            for (b, len, n) in dir.passed {
                let p = s.passed.entry(b).or_default();
                p.0 = p.0.max(len);
                p.1 += n;
            }
            for r in dir.resent {
                let acked = dir.acked.is_some_and(|a| seq_lt(r.seq, a));
                if acked || r.copies < MIN_COPIES {
                    continue;
                }
                if s.lost.len() < LOST {
                    s.lost.push(Lost {
                        stream,
                        len: r.len,
                        copies: r.copies,
                        first_ts: r.first_ts,
                        frames: r.frames,
                    });
                }
            }
        }
    }
}

impl Holes {
    /// The black hole the evidence shows, if any (the path with the most lost segments).
    /// `first_ts`: the capture's first timestamp (frames' times are relative to it).
    pub fn finish(self, first_ts: i64) -> Option<BlackHole> {
        self.paths
            .into_iter()
            .filter_map(|(ends, s)| judge(ends, s, first_ts))
            .max_by_key(|h| (h.lost, h.sender.clone()))
    }
}

/// A path's black hole, when its evidence holds (see the module docs).
fn judge((ip, to): (IpAddr, IpAddr), s: Path, first_ts: i64) -> Option<BlackHole> {
    let mut streams: Vec<u32> = s.lost.iter().map(|l| l.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    if streams.len() < MIN_STREAMS {
        return None;
    }
    let from = s.lost.iter().map(|l| l.first_ts).min()?;
    let lost_min = s.lost.iter().map(|l| l.len).min()?;
    let from_b = from.div_euclid(BUCKET_NS);
    let (passed_max, passed) = s
        .passed
        .iter()
        .filter(|p| *p.0 >= from_b)
        .fold((0u32, 0u64), |(m, n), (_, p)| (m.max(p.0), n + p.1));
    if passed == 0 || passed_max >= lost_min {
        return None;
    }
    let ex = s
        .lost
        .iter()
        .max_by_key(|l| (l.copies, std::cmp::Reverse(l.stream)))?;
    Some(BlackHole {
        sender: ip.to_string(),
        receiver: to.to_string(),
        lost: s.lost.len() as u64,
        streams: streams.len() as u64,
        lost_min_len: lost_min,
        passed_max_len: passed_max,
        passed,
        max_copies: s.lost.iter().map(|l| l.copies).max().unwrap_or(0),
        stream: ex.stream,
        frames: ex.frames.clone(),
        first_us: u64::try_from((from - first_ts) / 1000).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::Script;

    /// One connection on client port `port` from `t0` µs: handshake, a GET, the server's
    /// 200 B head (acknowledged when `head_acked`), then a 1448 B segment sent `copies`
    /// times 200 ms apart, acknowledged at the end when `acked`.
    fn conn(s: &mut Script, port: u16, t0: u64, copies: u64, head_acked: bool, acked: bool) {
        s.connect(t0, port);
        s.client_data(t0 + 200, 40);
        s.server_data(t0 + 1_000, 200);
        if head_acked {
            s.client_ack_at(t0 + 1_100, 5_200);
        }
        s.server_data(t0 + 1_200, 1448);
        for k in 1..copies {
            s.server_resend(t0 + 1_200 + k * 200_000, 1448, 1448);
        }
        if acked {
            s.client_ack(t0 + 1_300 + copies * 200_000);
        }
    }

    fn hole(conns: &[(u64, bool, bool)]) -> Option<lagtrace_model::analyze::BlackHole> {
        let mut s = Script::empty();
        for (k, &(copies, head_acked, acked)) in conns.iter().enumerate() {
            conn(
                &mut s,
                40_000 + k as u16,
                k as u64 * 1_000_000,
                copies,
                head_acked,
                acked,
            );
        }
        s.finish().black_hole
    }

    #[test]
    fn full_size_segments_never_acknowledged_while_small_ones_pass_are_a_black_hole() {
        let h = hole(&[(3, true, false), (4, true, false), (3, true, false)]).expect("a hole");
        assert_eq!((h.lost, h.streams), (3, 3), "{h:?}");
        assert_eq!(
            (h.sender.as_str(), h.receiver.as_str()),
            ("10.0.0.2", "10.0.0.1")
        );
        assert_eq!((h.lost_min_len, h.passed_max_len), (1448, 200), "{h:?}");
        assert_eq!(h.max_copies, 4, "{h:?}");
        // The example is the most-sent segment: stream 1, its original and three resends.
        assert_eq!((h.stream, h.frames.len()), (1, 4), "{h:?}");
        // The first loss at 1.2 ms; the later connections' heads passed after it.
        assert_eq!(h.first_us, 1_200, "{h:?}");
        assert!(h.passed >= 2, "{h:?}");
    }

    #[test]
    fn a_resend_that_gets_through_one_connection_or_a_dead_path_is_no_black_hole() {
        // Random loss: the resends are acknowledged in the end.
        assert_eq!(
            hole(&[(3, true, true), (3, true, true), (3, true, true)]),
            None
        );
        // Resent twice only (the original and one resend): not yet lost.
        assert_eq!(hole(&[(2, true, false), (2, true, false)]), None);
        // One connection's loss.
        assert_eq!(
            hole(&[(4, true, false), (1, true, true), (1, true, true)]),
            None
        );
        // Nothing passes after the first loss: the path is down, not a size limit.
        assert_eq!(hole(&[(3, false, false), (3, false, false)]), None);
    }
}
