//! The stream table: which connection (Wireshark's `tcp.stream`) a segment belongs to, the
//! per-stream summary, and the tracking state of the streams still alive.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, SocketAddr};

use lagtrace_model::analyze::{StreamSummary, WindowScale};

use super::event::Seg;
use super::tcp::Conn;
use crate::wire::{TcpSegment, flags};

/// How long a closed stream keeps its state for late packets (retransmitted FINs, final
/// ACKs): twice Linux's TIME_WAIT.
pub const CLOSED_LINGER_NS: i64 = 120_000_000_000;

/// A map on the per-packet path: [`Fx`]-hashed (no output depends on a map's order).
pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;
/// A set on the per-packet path, as [`FxMap`].
pub(crate) type FxSet<K> = std::collections::HashSet<K, BuildHasherDefault<Fx>>;

/// FxHash: the hot path hashes one small key per packet.
#[derive(Default, Clone, Copy)]
pub(super) struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Canonical (lower endpoint first) connection key. Addresses as IPv6 (IPv4-mapped) in one
/// integer each, big-endian: ordered as their bytes, compared and hashed in a step.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    lo: u128,
    hi: u128,
    lo_port: u16,
    hi_port: u16,
}

impl Key {
    fn of(seg: &TcpSegment<'_>) -> Key {
        let (s16, d16) = (ip16(seg.src), ip16(seg.dst));
        if (s16, seg.sport) <= (d16, seg.dport) {
            Key {
                lo: s16,
                hi: d16,
                lo_port: seg.sport,
                hi_port: seg.dport,
            }
        } else {
            Key {
                lo: d16,
                hi: s16,
                lo_port: seg.dport,
                hi_port: seg.sport,
            }
        }
    }
}

fn ip16(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().to_bits(),
        IpAddr::V6(v) => v.to_bits(),
    }
}

/// A stream still tracked: its connection state and the detectors' state `S`.
pub(super) struct Live<S> {
    /// Sequence and ACK state.
    pub conn: Conn,
    /// The detectors' per-stream state.
    pub det: S,
}

/// Every stream seen, and the state of those alive.
pub(super) struct Table<S> {
    map: FxMap<Key, u32>,
    /// The last key looked up and its stream (packets come in runs of one connection): the
    /// map's own entry for it, kept beside it.
    last: Option<(Key, u32)>,
    /// Summaries in index order.
    pub streams: Vec<StreamSummary>,
    /// Per-stream state; `None` once a closed stream has been quiet for [`CLOSED_LINGER_NS`].
    pub lives: Vec<Option<Box<Live<S>>>>,
    /// Streams in the order they closed, with the time: freed after [`CLOSED_LINGER_NS`].
    closed: VecDeque<(i64, usize)>,
    /// Frames that were a second capture of a segment already seen.
    pub copies: u64,
    /// Per (sender, receiver): the MSS a stream between them showed, for streams that do
    /// not show theirs (see [`Conn::share_mss`]).
    path_mss: FxMap<(IpAddr, IpAddr), u32>,
}

impl<S: Default> Table<S> {
    pub fn new() -> Self {
        Table {
            map: HashMap::default(),
            last: None,
            streams: Vec::new(),
            lives: Vec::new(),
            closed: VecDeque::new(),
            copies: 0,
            path_mss: HashMap::default(),
        }
    }

    /// Streams whose state is held now.
    pub fn live_streams(&self) -> usize {
        self.lives.iter().filter(|l| l.is_some()).count()
    }

    /// The stream of a segment, created when new. `start_us` is its time since the capture
    /// started.
    pub fn lookup(&mut self, seg: &TcpSegment<'_>, ts: i64, frame: u64, start_us: i64) -> usize {
        let key = Key::of(seg);
        let pure_syn = seg.flags & (flags::SYN | flags::ACK) == flags::SYN;
        let mut idx = match self.last {
            Some((k, i)) if k == key => Some(i),
            _ => self.map.get(&key).copied(),
        };
        if let Some(i) = idx
            && pure_syn
        {
            // Wireshark: a SYN whose sequence number differs from the one this side used
            // before starts a new conversation on the same ports.
            let d = self.dir(i as usize, seg);
            match self.lives[i as usize].as_deref() {
                Some(live) if live.conn.same_syn(d, seg.seq) => {}
                // Another ISN, or closed long ago and freed: a new stream.
                _ => idx = None,
            }
        }
        if let Some(i) = idx {
            self.last = Some((key, i));
            return i as usize;
        }
        let i = self.streams.len();
        let id = u32::try_from(i).unwrap_or(u32::MAX);
        self.map.insert(key, id);
        self.last = Some((key, id));
        self.streams.push(new_summary(id, seg, start_us, frame));
        self.lives.push(Some(Box::new(Live {
            conn: Conn::new(ts, seg.loopback),
            det: S::default(),
        })));
        i
    }

    fn dir(&self, i: usize, seg: &TcpSegment<'_>) -> usize {
        let st = &self.streams[i];
        usize::from(!(st.a.ip() == seg.src && st.a.port() == seg.sport))
    }

    /// Counts the segment in stream `i`'s summary and, while the stream is tracked, updates
    /// its connection state and returns what the segment means (nothing for a copy).
    pub fn segment<'a>(
        &mut self,
        i: usize,
        ts: i64,
        frame: u64,
        frame_len: u32,
        first_ts: i64,
        seg: &TcpSegment<'a>,
    ) -> Option<Seg<'a>> {
        let d = self.dir(i, seg);
        // A second capture of a segment (another interface, a super-segment's pieces) is
        // not traffic: neither counted nor analyzed.
        if let Some(live) = self.lives[i].as_deref_mut()
            && live.conn.is_copy(d, ts, seg)
        {
            self.copies += 1;
            return None;
        }
        let st = &mut self.streams[i];
        let len = seg.payload_len;
        if d == 0 {
            st.frames_ab += 1;
            st.bytes_ab += u64::from(frame_len);
            st.payload_ab += u64::from(len);
        } else {
            st.frames_ba += 1;
            st.bytes_ba += u64::from(frame_len);
            st.payload_ba += u64::from(len);
        }
        st.last_frame = frame;
        st.duration_us = u64::try_from((ts - first_ts) / 1000 - st.start_us).unwrap_or(0);
        let f = seg.flags;
        if f & flags::RST != 0 && st.rst_frame.is_none() {
            st.rst_frame = Some(frame);
        }
        if f & flags::FIN != 0 {
            if d == 0 {
                st.fin_a = true;
            } else {
                st.fin_b = true;
            }
        }
        let both_fin = st.fin_a && st.fin_b;
        // A stream closed and freed long ago: counted, nothing more to analyze.
        let live = self.lives[i].as_deref_mut()?;
        if live.conn.closed_at.is_none() && (f & flags::RST != 0 || both_fin) {
            live.conn.closed_at = Some(ts);
            self.closed.push_back((ts, i));
        }
        let ev = live.conn.update(st, d, ts, frame, seg, &self.path_mss);
        live.conn.share_mss(d, seg, &mut self.path_mss);
        if ev.retrans.is_some() {
            st.retransmissions += 1;
        }
        Some(ev)
    }

    /// The next stream closed at least [`CLOSED_LINGER_NS`] before `now`, taken off the
    /// closed list (the caller frees it).
    pub fn pop_expired(&mut self, now: i64) -> Option<usize> {
        let &(at, i) = self.closed.front()?;
        if now - at < CLOSED_LINGER_NS {
            return None;
        }
        self.closed.pop_front();
        Some(i)
    }

    /// The detectors' state of stream `i`, while it is tracked.
    pub fn det_mut(&mut self, i: usize) -> Option<&mut S> {
        self.lives[i].as_deref_mut().map(|l| &mut l.det)
    }

    /// The endpoint that sent direction `d` of stream `i`.
    pub fn sender(&self, i: usize, d: usize) -> SocketAddr {
        let st = &self.streams[i];
        if d == 0 { st.a } else { st.b }
    }
}

fn new_summary(id: u32, seg: &TcpSegment<'_>, start_us: i64, frame: u64) -> StreamSummary {
    StreamSummary {
        stream: id,
        a: SocketAddr::new(seg.src, seg.sport),
        b: SocketAddr::new(seg.dst, seg.dport),
        a_is_client: true,
        frames_ab: 0,
        bytes_ab: 0,
        frames_ba: 0,
        bytes_ba: 0,
        payload_ab: 0,
        payload_ba: 0,
        start_us,
        duration_us: 0,
        first_frame: frame,
        last_frame: frame,
        syn_a: None,
        syn_b: None,
        handshake_rtt_us: None,
        syn_synack_us: None,
        scale_a: WindowScale::Unknown,
        scale_b: WindowScale::Unknown,
        fin_a: false,
        fin_b: false,
        rst_frame: None,
        retransmissions: 0,
        transactions: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_the_same_both_ways() {
        let a = SocketAddr::from(([10, 0, 0, 1], 40_000));
        let b = SocketAddr::from(([10, 0, 0, 2], 80));
        let seg = |s: SocketAddr, d: SocketAddr| TcpSegment {
            src: s.ip(),
            dst: d.ip(),
            sport: s.port(),
            dport: d.port(),
            seq: 0,
            ack: 0,
            flags: 0,
            window: 0,
            payload_len: 0,
            payload: &[],
            options: crate::wire::TcpOptions::default(),
            option_bytes: &[],
            ip_id: 0,
            loopback: false,
        };
        assert!(Key::of(&seg(a, b)) == Key::of(&seg(b, a)));
        assert!(Key::of(&seg(a, b)) != Key::of(&seg(a, SocketAddr::from(([10, 0, 0, 2], 81)))));
    }

    #[test]
    fn v4_and_mapped_v6_hash_alike() {
        assert_eq!(
            ip16("10.1.2.3".parse().unwrap()),
            ip16("::ffff:10.1.2.3".parse().unwrap())
        );
    }
}
