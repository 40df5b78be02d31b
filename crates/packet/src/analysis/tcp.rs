//! One connection's sequence and ACK state, as Wireshark's `tcp.analysis` keeps it: relative
//! numbers, the handshake, unacknowledged segments, duplicate ACKs, retransmission kinds and
//! ACK RTTs. [`Conn::update`] turns a segment into the [`Seg`] the detectors read.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::net::IpAddr;

use lagtrace_model::analyze::{StreamSummary, SynOptions, WindowScale};

use super::copies::{Copies, Seen, id_older};
use super::event::{AckAdvance, DataInfo, DataSeg, Retrans, RetransKind, Seg};
use super::us;
use crate::wire::{TcpSegment, flags};

/// Wireshark keeps at most this many unacknowledged segments per direction.
const MAX_UNACKED: usize = 10_000;

/// A receiver that holds received data this long without acknowledging it, when that data
/// is two full segments or more, is not following the delayed-ACK rule (Linux acknowledges
/// every second full segment at once while its application reads): it is busy or not
/// reading. Half of the delayed-ACK threshold, far above a scheduling hiccup.
pub(super) const RECEIVER_HELD_US: u64 = super::nagle::DELAYED_ACK_MIN_US / 2;

pub(super) fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

pub(super) fn seq_le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}

#[derive(Clone, Copy)]
struct Unacked {
    seq: u32,
    nextseq: u32,
    frame: u64,
    ts: i64,
}

/// One direction of a connection.
/// A jump in a sender's IPv4 identifications larger than this is not counted as packets
/// missing from the capture.
const MAX_ID_GAP: u16 = 4096;
/// Gaps in a sender's identifications remembered for late packets to fill.
const MAX_GAPS: usize = 32;

#[derive(Default)]
struct Dir {
    isn: Option<u32>,
    base: Option<u32>,
    syn_opts: Option<SynOptions>,
    syn_ts: Option<i64>,
    next_seq: Option<u32>,
    next_seq_time: i64,
    /// IPv4 identification of the segment that last advanced `next_seq`, when this sender
    /// numbers its segments (0 is then one of its numbers).
    next_seq_id: Option<u16>,
    /// This sender's identifications have not followed its sequence numbers (random or
    /// rewritten): they cannot order its writes.
    ids_unordered: bool,
    /// The identification the sender's next packet carries if the capture sees them all,
    /// and how many more it may be (a super-segment's pieces are counted with an MSS that
    /// may be a little off).
    next_id: Option<(u16, u16)>,
    /// Recent gaps in the identifications (first missing, how many): a late packet that
    /// falls in one was reordered, not lost.
    gaps: Vec<(u16, u16)>,
    last_ack: Option<u32>,
    last_ack_time: i64,
    dupacks: u32,
    /// The raw window field of this side's last segment.
    window: Option<u32>,
    /// That segment was a SYN (its window is never scaled).
    window_in_syn: bool,
    /// This side's SYN was a SYN-ACK (a peer's SYN offered scaling if it carries the option).
    syn_ack: bool,
    /// The smallest window scale shift the peer's bytes in flight allow for this side's
    /// windows, when no handshake was seen.
    shift_floor: u8,
    /// This sender's segments carry timestamps (12 bytes of each full segment).
    timestamps: bool,
    /// A segment length seen twice in a row within one flight: the sender's MSS, when no
    /// SYN told it.
    mss_seen: Option<u32>,
    /// The MSS this side last handed to the table for other streams.
    mss_shared: Option<u32>,
    unacked: VecDeque<Unacked>,
    /// Largest payload seen, as a lower bound of the MSS.
    max_len: u32,
    /// Last data segment that was not a retransmission.
    last_data: Option<DataSeg>,
    /// Frame of the last segment with payload, a retransmission or not.
    last_payload_frame: Option<u64>,
}

impl Dir {
    /// Removes `pieces` numbers from `id` on from the gap holding them; returns how many
    /// were in one.
    fn fill_gap(&mut self, id: u16, pieces: u16) -> u16 {
        let Some(k) = self
            .gaps
            .iter()
            .position(|&(first, n)| id.wrapping_sub(first) < n)
        else {
            return 0;
        };
        let (first, n) = self.gaps[k];
        let off = id.wrapping_sub(first);
        let filled = pieces.min(n - off);
        self.gaps.remove(k);
        if off > 0 {
            self.gaps.push((first, off));
        }
        let rest = n - off - filled;
        if rest > 0 {
            self.gaps.push((id.wrapping_add(filled), rest));
        }
        filled
    }

    /// The MSS this side sends with. `link_mss` is what the capture's link carries when no
    /// SYN announced it: 65 495 on loopback, 1460 elsewhere.
    fn mss(&self, peer: &Dir, link_mss: u32) -> u32 {
        // The sender uses the smaller of the peer's MSS option and its own (a TCP_MAXSEG
        // clamp shows in its own SYN's option, not in the peer's).
        let announced = match (
            peer.syn_opts.and_then(|o| o.mss),
            self.syn_opts.and_then(|o| o.mss),
        ) {
            (Some(a), Some(b)) => Some(u32::from(a.min(b))),
            (a, b) => a.or(b).map(u32::from),
        };
        // With timestamps agreed by both SYNs every segment carries 12 bytes of them, so a
        // full segment holds 12 bytes less than announced (1448 of 1460): without this,
        // every full segment of a bulk flow would count as small, and Nagle would be named
        // where it cannot hold anything.
        let both_ts = matches!((self.syn_opts, peer.syn_opts), (Some(a), Some(b)) if a.timestamps && b.timestamps);
        let announced = announced.map(|m| {
            if both_ts {
                m.saturating_sub(12).max(1)
            } else {
                m
            }
        });
        match announced {
            // The path may carry less than announced (e.g. IP options, timestamps take 12).
            Some(m) => m.min(self.max_len.max(1).max(m.saturating_sub(40))),
            // No SYN seen (the capture started mid-connection): a run of equal segments
            // is the MSS; else the link's, less the timestamps. Never the largest segment
            // alone: keep-alive responses repeat one size that is far below the MSS (a
            // 612 B body Nagle held would read as full), and a capture on the sending host
            // sees super-segments far above it.
            None => self
                .mss_seen
                .unwrap_or_else(|| link_mss.saturating_sub(if self.timestamps { 12 } else { 0 })),
        }
    }
}

/// The tracking state of one connection.
pub(super) struct Conn {
    dirs: [Dir; 2],
    /// The MSS of the link the capture saw, for a side whose SYN it did not see.
    link_mss: u32,
    /// Direction of the client, once known.
    pub client: Option<usize>,
    syn_time: Option<i64>,
    synack_time: Option<i64>,
    rtt_us: Option<u64>,
    min_ack_rtt_us: [Option<u64>; 2],
    /// Per side sending the ACKs: the smoothed RTT of the other side's data as its kernel
    /// keeps it (`srtt`: 1/8 of each new sample), the peer's ACK delays included.
    srtt_ack_us: [Option<u64>; 2],
    last_ts: i64,
    /// When RST or the second FIN was seen.
    pub closed_at: Option<i64>,
    /// Recent segments, to recognise a second capture of one.
    copies: Copies,
    /// The segment just checked by [`Conn::is_copy`] repeats bytes its sender already
    /// wrote under another IPv4 identification.
    rewrite: bool,
}

impl Conn {
    /// A connection whose first packet is seen at `ts`.
    /// `loopback`: the capture saw it on a loopback device (64 KiB MTU).
    pub fn new(ts: i64, loopback: bool) -> Conn {
        Conn {
            dirs: [Dir::default(), Dir::default()],
            link_mss: if loopback { 65_495 } else { 1460 },
            client: None,
            syn_time: None,
            synack_time: None,
            rtt_us: None,
            min_ack_rtt_us: [None, None],
            srtt_ack_us: [None, None],
            last_ts: ts,
            closed_at: None,
            copies: Copies::default(),
            rewrite: false,
        }
    }

    /// Whether `seg` of direction `d` is a second capture of a segment already seen (then
    /// it is not analyzed again).
    pub fn is_copy(&mut self, d: usize, ts: i64, seg: &TcpSegment<'_>) -> bool {
        let mss = self.dirs[d].mss(&self.dirs[1 - d], self.link_mss);
        let seen = self.copies.is_copy(d, ts, seg, mss);
        self.rewrite = seen == Seen::Rewrite;
        seen == Seen::Copy
    }

    /// Either side's SYN was captured: the MSS is announced.
    fn syn_seen(&self) -> bool {
        self.dirs[0].syn_opts.is_some() || self.dirs[1].syn_opts.is_some()
    }

    /// The MSS direction `d` sends with, when this stream told it: its SYNs, or a run of
    /// equal full segments.
    fn own_mss(&self, d: usize) -> Option<u32> {
        (self.syn_seen() || self.dirs[d].mss_seen.is_some())
            .then(|| self.dirs[d].mss(&self.dirs[1 - d], self.link_mss))
    }

    /// After [`Conn::update`]: hands direction `d`'s MSS, once this stream knows it (and
    /// again when it changes: an estimate from the SYNs settles with the first full
    /// segment), to the other streams between the same sender and receiver (`paths`, by
    /// (source, destination)), which count their super-segments with it.
    pub fn share_mss(
        &mut self,
        d: usize,
        seg: &TcpSegment<'_>,
        paths: &mut HashMap<(IpAddr, IpAddr), u32, impl BuildHasher>,
    ) {
        if seg.payload_len == 0 {
            return;
        }
        if let Some(m) = self.own_mss(d)
            && self.dirs[d].mss_shared != Some(m)
        {
            paths.insert((seg.src, seg.dst), m);
            self.dirs[d].mss_shared = Some(m);
        }
    }

    /// Whether a pure SYN with this sequence number from direction `d` belongs to this
    /// connection (Wireshark: a SYN with another ISN starts a new conversation).
    pub fn same_syn(&self, d: usize, seq: u32) -> bool {
        let dir = &self.dirs[d];
        dir.base
            .is_none_or(|b| dir.isn.map_or(b.wrapping_add(1), |x| x) == seq)
    }

    /// Takes in one segment of direction `d`, updating the stream's summary. `paths`: the MSS
    /// other streams showed per (source, destination), see [`Conn::share_mss`].
    pub fn update<'a>(
        &mut self,
        st: &mut StreamSummary,
        d: usize,
        ts: i64,
        frame: u64,
        seg: &TcpSegment<'a>,
        paths: &HashMap<(IpAddr, IpAddr), u32, impl BuildHasher>,
    ) -> Seg<'a> {
        let r = 1 - d;
        let f = seg.flags;
        let gap_ns = (ts - self.last_ts).max(0);
        let prev_stream_ts = self.last_ts;
        self.last_ts = ts;
        self.handshake(st, d, ts, seg);
        let scale_raised = self.bound_scale(st, d, seg);
        let win = self.scaled_window(d, seg);
        let rel_seq = seg.seq.wrapping_sub(self.dirs[d].base.unwrap_or(seg.seq));
        let rel_ack = if f & flags::ACK != 0 {
            seg.ack.wrapping_sub(self.dirs[r].base.unwrap_or(seg.ack))
        } else {
            0
        };
        let prev_ack = self.dirs[d].last_ack;
        let (unseen, refound) = self.unseen(d, seg, paths);
        let retrans = self.sequence(d, ts, frame, seg);
        let far_rtt_us = self.far_rtt_us(d);
        // Data the receiver held for longer than half the delayed-ACK threshold.
        let held_before = ts - i64::try_from(far_rtt_us + RECEIVER_HELD_US).unwrap_or(0) * 1000;
        let (ack_rtt_ns, newly_acked_oldest, [bytes, held_bytes]) =
            self.acks(d, ts, seg, prev_ack, held_before);
        if let Some(rtt) = ack_rtt_ns {
            let v = us(rtt);
            let m = &mut self.min_ack_rtt_us[d];
            *m = Some(m.map_or(v, |x| x.min(v)));
            let s = &mut self.srtt_ack_us[d];
            *s = Some(s.map_or(v, |x| x - x / 8 + v / 8));
        }
        let acked = newly_acked_oldest.map(|oldest| AckAdvance {
            frame,
            ts,
            delay_us: us(ts - oldest).saturating_sub(far_rtt_us),
            ack: seg.ack,
            bytes,
            held_bytes,
            no_data: seg.payload_len == 0 && f & (flags::SYN | flags::RST) == 0,
        });
        let retrans = retrans.map(|kind| self.origin(d, kind, ts, frame, seg));
        let data = (seg.payload_len > 0)
            .then(|| self.data(d, ts, frame, seg, retrans.is_none(), unseen > 0));
        Seg {
            stream: st.stream,
            dir: d,
            client: self.client.unwrap_or(0),
            frame,
            ts,
            flags: f,
            seq: seg.seq,
            ack: seg.ack,
            len: seg.payload_len,
            payload: seg.payload,
            win,
            rel_seq,
            rel_ack,
            gap_ns,
            prev_stream_ts,
            rtt_est_us: self.rtt_est_us(),
            sender_srtt_us: self.srtt_ack_us[r].unwrap_or(0),
            server_far_rtt_us: self.server_far_rtt_us(),
            retrans,
            ack_rtt_ns,
            acked,
            data,
            peer_window: self.adv_window(r),
            peer_scale: self.adv_scale(r),
            peer_scale_raised: scale_raised,
            peer_last_ack: self.dirs[r].last_ack,
            unseen,
            refound,
        }
    }

    /// Packets the sender of direction `d` sent since its previous captured one that the
    /// capture never saw, by its IPv4 identifications (Linux numbers every packet a
    /// connected socket sends, a super-segment one number per wire segment): dropped before
    /// the capture point (netfilter, a qdisc) or by the capture. SYNs and RSTs are numbered
    /// elsewhere (the listener, the kernel's control socket) and are left out. Returns (new
    /// gap before this packet, numbers of an earlier gap this packet filled: it came late,
    /// reordered on the way).
    fn unseen(
        &mut self,
        d: usize,
        seg: &TcpSegment<'_>,
        paths: &HashMap<(IpAddr, IpAddr), u32, impl BuildHasher>,
    ) -> (u16, u16) {
        if !self.copies.numbered(d) || seg.flags & (flags::SYN | flags::RST) != 0 {
            return (0, 0);
        }
        let known_mss = self.syn_seen();
        // The MSS estimate is low by up to 40 B before full segments are seen: a segment
        // within that of it is one wire segment.
        let mss = self.dirs[d].mss(&self.dirs[1 - d], self.link_mss).max(1);
        let len = seg.payload_len.max(1);
        // How many numbers it took: a range, as the estimate of the MSS may be up to 40 B
        // low (one number for a single wire segment).
        let (fewest, most) = if known_mss || seg.payload_len <= mss {
            (len.div_ceil(mss + 40) as u16, len.div_ceil(mss) as u16)
        } else {
            // A super-segment of a connection whose SYNs were not captured: counted only
            // with an MSS that divides it (GSO cuts full segments; a write's partial tail
            // may ride along, and then it is not counted) — from a run of equal full
            // segments of this stream, or from another stream between the same two hosts
            // (`paths`, see [`Conn::share_mss`]).
            // An MSS that does not divide it (the stream's own is another) is not used.
            // Without this every super-segment of a bulk flow restarted the count, and the
            // numbers a shaper dropped between two went unseen (1m-c8-tbf, the veth capture
            // cut in half: a timeout's lone resend after 26 dropped packets, its ACK delayed
            // 44 ms, read as `delayed-ack` on 5 of 45 transactions where the whole capture,
            // with its SYNs, named none).
            match [
                self.dirs[d].mss_seen,
                paths.get(&(seg.src, seg.dst)).copied(),
            ]
            .into_iter()
            .flatten()
            .find(|&h| h > 0 && seg.payload_len.is_multiple_of(h))
            {
                Some(h) => {
                    let n = (seg.payload_len / h) as u16;
                    (n, n)
                }
                None => {
                    // How many numbers it took cannot be told: start again after it.
                    self.dirs[d].next_id = None;
                    return (0, 0);
                }
            }
        };
        let dir = &mut self.dirs[d];
        let Some((want, slack)) = dir.next_id else {
            dir.next_id = Some((seg.ip_id.wrapping_add(fewest), most - fewest));
            return (0, 0);
        };
        let ahead = seg.ip_id.wrapping_sub(want) as i16;
        if ahead < 0 {
            // An earlier packet seen late (reordered): it fills a gap counted before.
            return (0, dir.fill_gap(seg.ip_id, fewest));
        }
        dir.next_id = Some((seg.ip_id.wrapping_add(fewest), most - fewest));
        if ahead as u16 > MAX_ID_GAP {
            // Not a gap a drop makes (the capture resumed, or the numbering is not per
            // connection): start again.
            return (0, 0);
        }
        let gap = (ahead as u16).saturating_sub(slack);
        if gap > 0 {
            if dir.gaps.len() >= MAX_GAPS {
                dir.gaps.remove(0);
            }
            dir.gaps.push((want.wrapping_add(slack), gap));
        }
        (gap, 0)
    }

    /// SYN options, sequence bases, the handshake RTT and which side is the client.
    fn handshake(&mut self, st: &mut StreamSummary, d: usize, ts: i64, seg: &TcpSegment<'_>) {
        let r = 1 - d;
        let f = seg.flags;
        if f & flags::SYN != 0 {
            let opts = SynOptions::from(seg.options);
            let dir = &mut self.dirs[d];
            if dir.isn.is_none() {
                dir.isn = Some(seg.seq);
                dir.base = Some(seg.seq);
                dir.syn_opts = Some(opts);
                dir.syn_ts = Some(ts);
                dir.syn_ack = f & flags::ACK != 0;
            }
            if d == 0 {
                st.syn_a = Some(opts);
            } else {
                st.syn_b = Some(opts);
            }
            if f & flags::ACK == 0 {
                self.client.get_or_insert(d);
                // Wireshark's iRTT counts from the most recent SYN (ts_mru_syn).
                self.syn_time = Some(ts);
            } else {
                self.client.get_or_insert(r);
                if self.synack_time.is_none()
                    && let Some(syn) = self.syn_time
                {
                    st.syn_synack_us = Some(us(ts - syn));
                }
                self.synack_time.get_or_insert(ts);
            }
        }
        if self.dirs[d].base.is_none() {
            self.dirs[d].base = Some(seg.seq.wrapping_sub(1));
        }
        if f & flags::ACK != 0 && self.dirs[r].base.is_none() {
            self.dirs[r].base = Some(seg.ack.wrapping_sub(1));
        }
        if self.rtt_us.is_none()
            && f & flags::ACK != 0
            && f & flags::SYN == 0
            && self.client == Some(d)
            && let (Some(s), Some(_)) = (self.syn_time, self.synack_time)
        {
            let rtt = us(ts - s);
            self.rtt_us = Some(rtt);
            st.handshake_rtt_us = Some(rtt);
        }
        if self.client.is_none() && seg.payload_len > 0 {
            // No SYN seen: the side that speaks first with the higher port is the client;
            // otherwise the one with the higher port.
            let (sp, dp) = (seg.sport, seg.dport);
            self.client = Some(if sp >= dp { d } else { r });
        }
        st.a_is_client = self.client != Some(1);
        if f & flags::SYN != 0 {
            st.scale_a = self.scale(0);
            st.scale_b = self.scale(1);
        }
        if seg.options.timestamps {
            self.dirs[d].timestamps = true;
        }
    }

    /// What is known of the window scale of direction `d`'s advertised windows.
    fn scale(&self, d: usize) -> WindowScale {
        let (me, peer) = (&self.dirs[d], &self.dirs[1 - d]);
        match (me.syn_opts, peer.syn_opts) {
            // Scaling is in use only when both SYNs carried the option.
            (Some(a), Some(b)) => WindowScale::Known {
                shift: if b.wscale.is_some() {
                    a.wscale.unwrap_or(0)
                } else {
                    0
                },
            },
            // A side that did not offer it uses none; a SYN-ACK carries the option only
            // when the SYN offered it too (RFC 7323 §2.2).
            (Some(a), None) if a.wscale.is_none() || me.syn_ack => WindowScale::Known {
                shift: a.wscale.unwrap_or(0),
            },
            // The peer did not offer it: no side scales.
            (_, Some(b)) if b.wscale.is_none() => WindowScale::Known { shift: 0 },
            _ if me.shift_floor > 0 => WindowScale::Bounded {
                at_least: me.shift_floor,
            },
            _ => WindowScale::Unknown,
        }
    }

    /// The scale of the window direction `d` last advertised: a SYN's is never scaled.
    fn adv_scale(&self, d: usize) -> WindowScale {
        if self.dirs[d].window_in_syn {
            WindowScale::Known { shift: 0 }
        } else {
            self.scale(d)
        }
    }

    /// The window direction `d` last advertised, scaled by its known shift or by the
    /// shift's lower bound (then the window is at least this).
    fn adv_window(&self, d: usize) -> Option<u32> {
        let shift = self.adv_scale(d).shift();
        self.dirs[d].window.map(|w| w << shift)
    }

    /// A data segment of direction `d` with no handshake seen: the receiver's window must
    /// have held all the bytes in flight (a sender never sends past the window's right
    /// edge, and Linux never moves that edge left), which bounds the receiver's shift from
    /// below. The bound is exact once the sender fills the window: tshark says "unknown"
    /// for the same stream. Returns whether this segment raised the bound.
    fn bound_scale(&mut self, st: &mut StreamSummary, d: usize, seg: &TcpSegment<'_>) -> bool {
        let r = 1 - d;
        if seg.payload_len == 0 || self.scale(r).is_known() {
            return false;
        }
        let rv = &self.dirs[r];
        let (Some(w), Some(ack)) = (rv.window, rv.last_ack) else {
            return false;
        };
        if w == 0 || rv.window_in_syn {
            return false;
        }
        let in_flight = seg.seq.wrapping_add(seg.payload_len).wrapping_sub(ack);
        if in_flight >= 1 << 30 {
            return false;
        }
        let mut shift = rv.shift_floor;
        while shift < 14 && w << shift < in_flight {
            shift += 1;
        }
        if shift > rv.shift_floor {
            self.dirs[r].shift_floor = shift;
            let scale = self.scale(r);
            if r == 0 {
                st.scale_a = scale;
            } else {
                st.scale_b = scale;
            }
            return true;
        }
        false
    }

    /// The window `seg` (of direction `d`) advertises, read as [`Self::adv_window`] reads it.
    fn scaled_window(&self, d: usize, seg: &TcpSegment<'_>) -> u32 {
        if seg.flags & flags::SYN != 0 {
            u32::from(seg.window)
        } else {
            u32::from(seg.window) << self.scale(d).shift()
        }
    }

    /// Wireshark-style sequence analysis of the sender's side: keep-alives, retransmission
    /// kinds, the segment remembered as unacknowledged, duplicate ACKs.
    fn sequence(
        &mut self,
        d: usize,
        ts: i64,
        frame: u64,
        seg: &TcpSegment<'_>,
    ) -> Option<RetransKind> {
        let (f, len, seq) = (seg.flags, seg.payload_len, seg.seq);
        // Raw windows: a duplicate ACK repeats the field whatever its scale.
        let win = u32::from(seg.window);
        let syn_fin = f & (flags::SYN | flags::FIN) != 0;
        let rtt_us = self.rtt_us;
        let rewrite = std::mem::take(&mut self.rewrite);
        let id = self.copies.numbered(d).then_some(seg.ip_id);
        let [a, b] = &mut self.dirs;
        let (fw, rv) = if d == 0 { (a, b) } else { (b, a) };
        let keep_alive = len <= 1
            && f & (flags::SYN | flags::FIN | flags::RST) == 0
            && fw.next_seq.is_some_and(|n| n.wrapping_sub(1) == seq);
        let zwp = len == 1 && fw.next_seq == Some(seq) && rv.window == Some(0);
        let mut retrans = None;
        if !keep_alive
            && !zwp
            && (len > 0 || syn_fin)
            && fw.next_seq.is_some_and(|n| seq_lt(seq, n))
        {
            let n = fw.next_seq.unwrap_or(seq);
            let since_dupack = ts - rv.last_ack_time;
            let ooo_thres: i64 = rtt_us.map_or(3_000_000, |r| (r as i64) * 1000);
            let ooo_thres = if ooo_thres == 0 { 3_000_000 } else { ooo_thres };
            // The sender's own numbering orders its writes, where it has one: a segment
            // behind the newest data, written before it and repeating nothing seen, is that
            // data's predecessor arriving late (a reordering path), not a resend.
            let newest_id = fw.next_seq_id.filter(|_| !fw.ids_unordered);
            let by_id = id.is_some() && newest_id.is_some();
            let first_write = !rewrite
                && id
                    .zip(newest_id)
                    .is_some_and(|(id, newest)| id_older(id, newest));
            let soon = ts - fw.next_seq_time < ooo_thres && n != seq.wrapping_add(len);
            let already_acked = len > 0
                && rv
                    .last_ack
                    .is_some_and(|a| seq_le(seq.wrapping_add(len), a));
            if first_write {
                // out of order: written once, reordered before the capture point
            } else if already_acked {
                // Data the receiver had already acknowledged, sent again: a spurious
                // resend however soon after the newest data — the receiver cannot have
                // acknowledged an original still on its way. Wireshark checks this first
                // too: within one RTT of the newest data it was read as out of order,
                // and a resend 32 µs after it (an iRTT of 35 µs) went uncounted where
                // tshark counted it (IPv6 loss test, flake-check suite run 2).
                retrans = Some(RetransKind::Spurious);
            } else if rv.dupacks >= 2 && rv.last_ack == Some(seq) && since_dupack < 20_000_000 {
                retrans = Some(RetransKind::Fast);
            } else if soon && !by_id {
                // Out of order, not a retransmission (Wireshark's rule: within one RTT of
                // the sender's newest data). Only without identifications: with them, a
                // segment written after the newest data is a resend however soon (a path
                // that reorders — a veth fed from several CPUs — makes the receiver SACK
                // around a late segment and the sender resend it at once), and Linux counts
                // it (`TcpRetransSegs`) like any other.
            } else if soon {
                // Written again within one RTT of the newest data: no timer ran out, the
                // peer's SACKs drove it (Linux's RACK recovery).
                retrans = Some(RetransKind::Fast);
            } else {
                retrans = Some(RetransKind::Rto);
            }
        }
        // Remember the segment as unacknowledged.
        let mut nextseq = seq.wrapping_add(len);
        if syn_fin {
            nextseq = nextseq.wrapping_add(1);
        }
        if (len > 0 || syn_fin) && fw.unacked.len() < MAX_UNACKED {
            fw.unacked.push_back(Unacked {
                seq,
                nextseq,
                frame,
                ts,
            });
        }
        // Duplicate ACK bookkeeping (Wireshark: same window, seq, ack; no payload).
        let same_ack = len == 0
            && f & flags::ACK != 0
            && win != 0
            && fw.next_seq == Some(seq)
            && fw.last_ack == Some(seg.ack)
            && f & (flags::SYN | flags::FIN | flags::RST) == 0;
        let is_dupack = same_ack && fw.window == Some(win);
        // Wireshark keeps counting across a pure window update (same seq and ack).
        let window_update = same_ack && fw.window != Some(win);
        if is_dupack {
            fw.dupacks += 1;
        } else if !window_update {
            fw.dupacks = 0;
        }
        if !zwp && fw.next_seq.is_none_or(|n| seq_lt(n, nextseq)) {
            fw.next_seq = Some(nextseq);
            fw.next_seq_time = ts;
            if let (Some(newest), Some(id)) = (fw.next_seq_id, id)
                && !id_older(newest, id)
            {
                fw.ids_unordered = true;
            }
            fw.next_seq_id = id;
        }
        if f & flags::ACK != 0 {
            fw.last_ack = Some(seg.ack);
            fw.last_ack_time = ts;
        }
        fw.window = Some(win);
        fw.window_in_syn = f & flags::SYN != 0;
        retrans
    }

    /// The ACK's effect on the peer's unacknowledged segments: Wireshark's ack_rtt (exact
    /// match only), the time of the oldest segment it newly covered, and the bytes it newly
    /// covered: all, and of segments seen before `held_before`. Bytes between this side's
    /// previous ACK (`prev_ack`) and the first segment covered that the capture never saw
    /// (tcpdump dropped them on a loaded machine) were written before that segment: they
    /// count as covered, and as held when it was.
    fn acks(
        &mut self,
        d: usize,
        ts: i64,
        seg: &TcpSegment<'_>,
        prev_ack: Option<u32>,
        held_before: i64,
    ) -> (Option<i64>, Option<i64>, [u64; 2]) {
        if seg.flags & flags::ACK == 0 {
            return (None, None, [0, 0]);
        }
        let ack = seg.ack;
        let mut oldest_exact: Option<i64> = None;
        let mut newly: Option<i64> = None;
        let (mut all, mut held) = (0u64, 0u64);
        // The covered segment lowest in sequence: (seq, ts).
        let mut first: Option<(u32, i64)> = None;
        let mut covered = |u: &Unacked, upto: u32| {
            if first.is_none_or(|(s, _)| seq_lt(u.seq, s)) {
                first = Some((u.seq, u.ts));
            }
            newly = Some(newly.map_or(u.ts, |t: i64| t.min(u.ts)));
            let n = u64::from(upto.wrapping_sub(u.seq));
            all += n;
            if u.ts <= held_before {
                held += n;
            }
        };
        self.dirs[1 - d].unacked.retain_mut(|u| {
            if u.nextseq == ack {
                if oldest_exact.is_none_or(|t| u.ts < t) {
                    oldest_exact = Some(u.ts);
                }
                covered(u, u.nextseq);
                false
            } else if seq_lt(u.seq, ack) && seq_le(ack, u.nextseq) {
                covered(u, ack);
                u.seq = ack;
                true
            } else if seq_lt(ack, u.nextseq) {
                true
            } else {
                covered(u, u.nextseq);
                false
            }
        });
        if let (Some(prev), Some((s, t))) = (prev_ack, first)
            && seq_lt(prev, s)
            && seq_le(s, ack)
        {
            let unseen = u64::from(s.wrapping_sub(prev));
            all += unseen;
            if t <= held_before {
                held += unseen;
            }
        }
        (oldest_exact.map(|t0| ts - t0), newly, [all, held])
    }

    /// Where a retransmission's original was, and when.
    fn origin(
        &self,
        d: usize,
        kind: RetransKind,
        ts: i64,
        frame: u64,
        seg: &TcpSegment<'_>,
    ) -> Retrans {
        let dir = &self.dirs[d];
        let (orig_frame, orig_ts) = if seg.flags & flags::SYN != 0 {
            (None, dir.syn_ts.unwrap_or(ts))
        } else {
            match dir
                .unacked
                .iter()
                .find(|u| u.seq == seg.seq && u.frame != frame)
            {
                Some(u) => (Some(u.frame), u.ts),
                None => (None, dir.next_seq_time.min(ts)),
            }
        };
        Retrans {
            kind,
            orig_frame,
            orig_ts,
        }
    }

    /// The payload history the detectors compare against, then this segment added to it.
    fn data(
        &mut self,
        d: usize,
        ts: i64,
        frame: u64,
        seg: &TcpSegment<'_>,
        fresh: bool,
        after_unseen: bool,
    ) -> DataInfo {
        // The sender's previous fresh data continues into this segment only when the peer
        // sent no payload since: a peer's data in between (a response, a request) ends the
        // run even when this sender re-sent something after it. A client whose request
        // timer fired just as the late response crossed it re-sends that request after the
        // response; its next request is a new write after the response, not data held
        // behind the old request (which would read as a ~200 ms Nagle stall).
        let peer_payload = self.dirs[1 - d].last_payload_frame;
        let info = DataInfo {
            mss: self.dirs[d].mss(&self.dirs[1 - d], self.link_mss),
            prev_same_run: self.dirs[d]
                .last_data
                .filter(|p| peer_payload.is_none_or(|f| f < p.frame)),
            peer_last: self.dirs[1 - d].last_data,
        };
        let len = seg.payload_len;
        let flight_ns = i64::try_from(self.rtt_est_us()).unwrap_or(i64::MAX) * 1000;
        let link_mss = self.link_mss;
        let dir = &mut self.dirs[d];
        if fresh {
            // Two equal segments back to back in one flight: the sender cut a write at its
            // MSS (a write's own size repeats across requests, not within one flight).
            let next_in_flight = info
                .prev_same_run
                .is_some_and(|p| p.end == seg.seq && p.len == len && ts - p.ts <= flight_ns);
            if next_in_flight && (536..=link_mss).contains(&len) {
                dir.mss_seen = Some(dir.mss_seen.map_or(len, |m| m.max(len)));
            }
            dir.last_data = Some(DataSeg {
                frame,
                ts,
                len,
                end: seg.seq.wrapping_add(len),
                after_unseen,
            });
        }
        dir.max_len = dir.max_len.max(len);
        dir.last_payload_frame = Some(frame);
        info
    }

    /// Path RTT estimate for thresholds, µs: the handshake's, else the sum of both sides'
    /// smallest ACK RTTs; 1 ms when nothing is known, at least 50 µs.
    fn rtt_est_us(&self) -> u64 {
        self.rtt_us
            .or(match self.min_ack_rtt_us {
                [Some(a), Some(b)] => Some(a + b),
                [Some(a), None] | [None, Some(a)] => Some(a),
                _ => None,
            })
            .unwrap_or(1_000)
            .max(50)
    }

    /// For an ACK from `side`: the path RTT when that side is far from the capture point
    /// (what we see then includes the path, not only its delay), else 0.
    fn far_rtt_us(&self, side: usize) -> u64 {
        match (self.syn_time, self.synack_time, self.rtt_us, self.client) {
            (Some(s), Some(sa), Some(total), Some(c)) => {
                let leg1 = us(sa - s); // client->server->client (seen near the client)
                let leg2 = total.saturating_sub(leg1);
                let near_client = leg1 >= leg2;
                if (side == c) != near_client { total } else { 0 }
            }
            _ => 0,
        }
    }

    /// [`Self::far_rtt_us`] of the server's side.
    pub fn server_far_rtt_us(&self) -> u64 {
        match self.client {
            Some(c) => self.far_rtt_us(1 - c),
            None => 0,
        }
    }
}

impl From<crate::wire::TcpOptions> for SynOptions {
    fn from(o: crate::wire::TcpOptions) -> Self {
        SynOptions {
            mss: o.mss,
            wscale: o.wscale,
            sack_permitted: o.sack_permitted,
            timestamps: o.timestamps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_compare_wraps() {
        assert!(seq_lt(u32::MAX - 5, 3));
        assert!(!seq_lt(3, u32::MAX - 5));
        assert!(seq_le(7, 7));
        assert!(!seq_lt(7, 7));
    }

    #[test]
    fn mss_is_the_smaller_announced_or_without_a_syn_the_links() {
        let mut a = Dir::default();
        let mut b = Dir::default();
        assert_eq!(a.mss(&b, 1460), 1460, "nothing known: the link's");
        assert_eq!(a.mss(&b, 65_495), 65_495, "nothing known on loopback");
        a.max_len = 612;
        assert_eq!(
            a.mss(&b, 1460),
            1460,
            "the largest segment alone says nothing"
        );
        a.timestamps = true;
        assert_eq!(a.mss(&b, 1460), 1448, "timestamps take 12 bytes");
        a.mss_seen = Some(1388);
        assert_eq!(a.mss(&b, 1460), 1388, "a run of equal segments is the MSS");
        a.max_len = 1448;
        let opts = |mss| SynOptions {
            mss: Some(mss),
            ..SynOptions::default()
        };
        a.syn_opts = Some(opts(65_483));
        b.syn_opts = Some(opts(1460));
        // Timestamps take 12 bytes: 1448 seen is within 40 of the 1460 announced.
        assert_eq!(a.mss(&b, 1460), 1448);
        a.max_len = 100;
        assert_eq!(a.mss(&b, 1460), 1420, "at most 40 below the announced MSS");
    }

    #[test]
    fn timestamps_on_both_syns_take_12_bytes_of_each_segment() {
        let (mut a, mut b) = (Dir::default(), Dir::default());
        let opts = |mss, timestamps| SynOptions {
            mss: Some(mss),
            timestamps,
            ..SynOptions::default()
        };
        // A GSO super-segment seen on the sender's side is far above the MSS: the
        // announced value, less the timestamps, is what one wire segment holds.
        a.max_len = 65_160;
        a.syn_opts = Some(opts(1460, true));
        b.syn_opts = Some(opts(1460, true));
        assert_eq!(a.mss(&b, 1460), 1448);
        // Only one side offered timestamps: none are used.
        b.syn_opts = Some(opts(1460, false));
        assert_eq!(a.mss(&b, 1460), 1460);
    }
}
