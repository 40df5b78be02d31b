//! Test support: a scripted conversation between a client (10.0.0.1:40000) and a server
//! (10.0.0.2:80), fed to an [`Analyzer`] as raw IPv4 frames. Times are µs from the SYN.

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::Analysis;

use super::{AnalyzeOptions, Analyzer};
use crate::wire::{flags, linktype};

const T0_NS: i64 = 1_700_000_000_000_000_000;

/// A conversation being written.
pub struct Script {
    an: Analyzer,
    /// Next sequence number of the client and the server.
    next: [u32; 2],
    /// Window each side advertises (unscaled).
    pub window: [u16; 2],
    /// IPv4 identification of the next frame (0: none; otherwise counts up per frame).
    pub ip_id: u16,
    /// The last frame written.
    last: Option<Last>,
    /// The client's port (40000): another makes another stream between the same hosts.
    pub client_port: u16,
}

/// A frame as written: (time, client, flags, seq, ack, payload, identification).
type Last = (u64, bool, u8, u32, u32, Vec<u8>, u16);

impl Script {
    /// Nothing captured yet (the client's first byte will be 1000, the server's 5000).
    pub fn empty() -> Script {
        Script {
            an: Analyzer::new(AnalyzeOptions::default()),
            next: [1_000, 5_000],
            window: [65_535, 65_535],
            ip_id: 0,
            last: None,
            client_port: 40_000,
        }
    }

    /// SYN at 0, SYN-ACK at `rtt_us`, ACK 10 µs later (captured next to the client).
    pub fn handshake(rtt_us: u64) -> Script {
        let mut s = Script::empty();
        s.raw(0, true, flags::SYN, 999, 0, &[]);
        s.raw(rtt_us, false, flags::SYN | flags::ACK, 4_999, 1_000, &[]);
        s.raw(rtt_us + 10, true, flags::ACK, 1_000, 5_000, &[]);
        s
    }

    /// The same conversation, with per-transaction timings kept.
    pub fn with_timings(mut self) -> Script {
        self.an.opts.timings = true;
        self
    }

    /// Another connection on client port `port`: its SYN, SYN-ACK and ACK at `t_us` (as
    /// [`Script::handshake`], 100 µs RTT), its sequence numbers starting over.
    pub fn connect(&mut self, t_us: u64, port: u16) {
        self.client_port = port;
        self.next = [1_000, 5_000];
        self.raw(t_us, true, flags::SYN, 999, 0, &[]);
        self.raw(
            t_us + 100,
            false,
            flags::SYN | flags::ACK,
            4_999,
            1_000,
            &[],
        );
        self.raw(t_us + 110, true, flags::ACK, 1_000, 5_000, &[]);
    }

    /// One segment; `client`: sent by the client.
    pub fn raw(&mut self, t_us: u64, client: bool, fl: u8, seq: u32, ack: u32, payload: &[u8]) {
        let id = self.ip_id;
        if id != 0 {
            self.ip_id = id.wrapping_add(1);
        }
        self.last = Some((t_us, client, fl, seq, ack, payload.to_vec(), id));
        self.frame(t_us, client, fl, (seq, ack), payload, id);
    }

    /// The last segment captured again at `t_us` (a second interface).
    pub fn copy_last(&mut self, t_us: u64) {
        let (_, client, fl, seq, ack, payload, id) = self.last.clone().expect("a last frame");
        self.frame(t_us, client, fl, (seq, ack), &payload, id);
    }

    /// The last segment captured again at `t_us` as the wire segments of `mss` bytes GSO
    /// cuts it into (identifications counting up from its own).
    pub fn pieces_of_last(&mut self, t_us: u64, mss: usize) {
        let (_, client, fl, seq, ack, payload, id) = self.last.clone().expect("a last frame");
        for (k, piece) in payload.chunks(mss).enumerate() {
            let off = (k * mss) as u32;
            let id = if id == 0 {
                0
            } else {
                id.wrapping_add(k as u16)
            };
            self.frame(t_us, client, fl, (seq.wrapping_add(off), ack), piece, id);
        }
    }

    fn frame(
        &mut self,
        t_us: u64,
        client: bool,
        fl: u8,
        (seq, ack): (u32, u32),
        payload: &[u8],
        id: u16,
    ) {
        let (src, dst, sport, dport) = if client {
            ([10, 0, 0, 1], [10, 0, 0, 2], self.client_port, 80u16)
        } else {
            ([10, 0, 0, 2], [10, 0, 0, 1], 80, self.client_port)
        };
        // MSS 1460 on SYNs.
        let opts: &[u8] = if fl & flags::SYN != 0 {
            &[2, 4, 0x05, 0xb4]
        } else {
            &[]
        };
        let tcp_len = 20 + opts.len();
        let total = 20 + tcp_len + payload.len();
        let mut f = Vec::with_capacity(total);
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&(total as u16).to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(&[0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&ack.to_be_bytes());
        f.push(((tcp_len / 4) as u8) << 4);
        f.push(fl);
        f.extend_from_slice(&self.window[usize::from(!client)].to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0]);
        f.extend_from_slice(opts);
        f.extend_from_slice(payload);
        let ts = T0_NS + i64::try_from(t_us).unwrap() * 1000;
        self.an.push(ts, total as u32, linktype::RAW, &f);
    }

    fn send(&mut self, t_us: u64, client: bool, payload: &[u8]) {
        let (me, peer) = (usize::from(!client), usize::from(client));
        let (seq, ack) = (self.next[me], self.next[peer]);
        self.raw(t_us, client, flags::PSH | flags::ACK, seq, ack, payload);
        self.next[me] = seq.wrapping_add(payload.len() as u32);
    }

    /// `len` bytes of a request (a GET line when `len` ≥ 16).
    fn request(len: usize) -> Vec<u8> {
        let mut p = vec![b'x'; len];
        if len >= 16 {
            p[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
        }
        p
    }

    /// The client sends `len` bytes (a GET line when `len` ≥ 16).
    pub fn client_data(&mut self, t_us: u64, len: usize) {
        self.send(t_us, true, &Self::request(len));
    }

    /// The client sends its last `len` bytes again (a GET line when `len` ≥ 16), with an ACK
    /// of everything the server sent.
    pub fn client_resend(&mut self, t_us: u64, len: usize) {
        let seq = self.next[0].wrapping_sub(len as u32);
        let ack = self.next[1];
        self.raw(
            t_us,
            true,
            flags::PSH | flags::ACK,
            seq,
            ack,
            &Self::request(len),
        );
    }

    /// The server sends `len` bytes (a status line when `len` ≥ 17).
    pub fn server_data(&mut self, t_us: u64, len: usize) {
        let mut p = vec![b'y'; len];
        if len >= 17 {
            p[..17].copy_from_slice(b"HTTP/1.1 200 OK\r\n");
        }
        self.send(t_us, false, &p);
    }

    /// The server sends `len` bytes again from sequence offset `back` before its next.
    pub fn server_resend(&mut self, t_us: u64, back: u32, len: usize) {
        let seq = self.next[1].wrapping_sub(back);
        let ack = self.next[0];
        self.raw(
            t_us,
            false,
            flags::PSH | flags::ACK,
            seq,
            ack,
            &vec![b'y'; len],
        );
    }

    /// A pure ACK from the client of everything the server sent.
    pub fn client_ack(&mut self, t_us: u64) {
        let (seq, ack) = (self.next[0], self.next[1]);
        self.raw(t_us, true, flags::ACK, seq, ack, &[]);
    }

    /// A pure ACK from the client of the server's data up to `ack`.
    pub fn client_ack_at(&mut self, t_us: u64, ack: u32) {
        let seq = self.next[0];
        self.raw(t_us, true, flags::ACK, seq, ack, &[]);
    }

    /// A pure ACK from the server of everything the client sent.
    pub fn server_ack(&mut self, t_us: u64) {
        let (seq, ack) = (self.next[1], self.next[0]);
        self.raw(t_us, false, flags::ACK, seq, ack, &[]);
    }

    /// The analysis.
    pub fn finish(self) -> Analysis {
        self.an.finish()
    }
}

/// The kinds of an analysis' findings, in order.
pub fn kinds(an: &Analysis) -> Vec<FindingKind> {
    an.findings.iter().map(|f| f.kind).collect()
}
