//! Streaming reader for pcap (both byte orders, µs and ns) and pcapng (SHB, IDB, EPB, SPB,
//! the obsolete PB; several interfaces with their own link types and timestamp resolutions).
//!
//! One large buffer, records returned as borrowed slices: nothing is allocated per packet.
//! A damaged file yields what is valid and then a [`ReadEvent::Warning`] saying where and why
//! it stopped; nothing here panics on hostile input.

use std::io::Read;

/// Maximum record size accepted (larger lengths mean a corrupt header).
const MAX_RECORD: usize = 256 * 1024 * 1024;
/// Largest timestamp (ns) handed out: year 2116; keeps all time arithmetic in range.
pub const MAX_TS_NS: i64 = 1 << 62;
/// Maximum captured frame length we believe.
const MAX_FRAME: u32 = 16 * 1024 * 1024;

/// One captured frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Timestamp in nanoseconds since the Unix epoch.
    pub ts_ns: i64,
    /// Original length on the wire.
    pub len: u32,
    /// Link type of the interface it was captured on.
    pub linktype: u32,
    /// Captured bytes (`data.len()` is the caplen).
    pub data: &'a [u8],
}

/// What the reader produced next.
#[derive(Debug)]
pub enum ReadEvent<'a> {
    /// A frame.
    Frame(Frame<'a>),
    /// Something was skipped or the file ended badly; reading may continue.
    Warning(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Pcap {
        swapped: bool,
        nanos: bool,
        linktype: u32,
    },
    Pcapng,
}

#[derive(Debug, Clone, Copy)]
struct Iface {
    linktype: u32,
    /// Units per second of timestamps.
    units_per_sec: u64,
    offset_s: i64,
}

/// Streaming capture-file reader over any `Read`.
pub struct CaptureReader<R> {
    src: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    format: Format,
    /// pcapng: current section is big-endian.
    big: bool,
    ifaces: Vec<Iface>,
    /// Offset in the file of `buf[start]`.
    pos: u64,
    done: bool,
}

impl<R: Read> CaptureReader<R> {
    /// Opens a reader: reads and checks the file header.
    pub fn new(src: R) -> crate::Result<Self> {
        let mut r = CaptureReader {
            src,
            buf: vec![0; 256 << 10],
            start: 0,
            end: 0,
            eof: false,
            format: Format::Pcapng,
            big: false,
            ifaces: Vec::new(),
            pos: 0,
            done: false,
        };
        r.fill(24)
            .map_err(|e| crate::Error::io("reading the file header", e))?;
        if r.end - r.start < 4 {
            return Err(crate::Error::Format(
                "not a capture file: shorter than a file header".into(),
            ));
        }
        let magic = [r.buf[0], r.buf[1], r.buf[2], r.buf[3]];
        let m_le = u32::from_le_bytes(magic);
        let (swapped, nanos) = match m_le {
            0xa1b2c3d4 => (false, false),
            0xa1b23c4d => (false, true),
            0xd4c3b2a1 => (true, false),
            0x4d3cb2a1 => (true, true),
            0x0a0d0d0a => {
                r.format = Format::Pcapng;
                return Ok(r);
            }
            _ => {
                return Err(crate::Error::Format(format!(
                    "not a pcap or pcapng file (magic {:02x}{:02x}{:02x}{:02x})",
                    magic[0], magic[1], magic[2], magic[3]
                )));
            }
        };
        if r.end - r.start < 24 {
            return Err(crate::Error::Format(format!(
                "pcap file header cut short ({} bytes)",
                r.end - r.start
            )));
        }
        let linktype = read_u32(&r.buf, 20, swapped) & 0x0fff_ffff;
        r.format = Format::Pcap {
            swapped,
            nanos,
            linktype,
        };
        r.start = 24;
        r.pos = 24;
        Ok(r)
    }

    /// Makes at least `n` bytes available from `start` unless at EOF. Returns available.
    fn fill(&mut self, n: usize) -> std::io::Result<usize> {
        if self.end - self.start >= n || self.eof {
            return Ok(self.end - self.start);
        }
        if n > self.buf.len() {
            // Compact, then grow.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            self.buf.resize(n.next_power_of_two(), 0);
        } else if self.start + n > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < n {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.end - self.start)
    }

    fn advance(&mut self, n: usize) {
        self.start += n;
        self.pos += n as u64;
    }

    fn stop(&mut self, msg: String) -> Option<ReadEvent<'_>> {
        self.done = true;
        Some(ReadEvent::Warning(msg))
    }

    /// The next frame or warning; `None` at the end.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<ReadEvent<'_>> {
        if self.done {
            return None;
        }
        match self.format {
            Format::Pcap {
                swapped,
                nanos,
                linktype,
            } => self.next_pcap(swapped, nanos, linktype),
            Format::Pcapng => self.next_pcapng(),
        }
    }

    fn next_pcap(&mut self, swapped: bool, nanos: bool, linktype: u32) -> Option<ReadEvent<'_>> {
        let avail = match self.fill(16) {
            Ok(a) => a,
            Err(e) => return self.stop(format!("read error: {e}")),
        };
        if avail == 0 {
            self.done = true;
            return None;
        }
        if avail < 16 {
            let pos = self.pos;
            return self.stop(format!(
                "file truncated: last record header cut at byte {pos} ({avail} of 16 bytes)"
            ));
        }
        let h = &self.buf[self.start..self.start + 16];
        let rd = |i: usize| read_u32(h, i, swapped);
        let (sec, frac, caplen, len) = (rd(0), rd(4), rd(8), rd(12));
        if caplen > MAX_FRAME {
            let pos = self.pos;
            return self.stop(format!(
                "corrupt record header at byte {pos}: captured length {caplen}; stopping"
            ));
        }
        let need = 16 + caplen as usize;
        let avail = match self.fill(need) {
            Ok(a) => a,
            Err(e) => return self.stop(format!("read error: {e}")),
        };
        if avail < need {
            let pos = self.pos;
            return self.stop(format!(
                "file truncated: last record cut at byte {pos} ({} of {need} bytes)",
                avail
            ));
        }
        let frac_ns = if nanos {
            i64::from(frac)
        } else {
            i64::from(frac) * 1000
        };
        let ts_ns = i64::from(sec) * 1_000_000_000 + frac_ns;
        let s = self.start + 16;
        self.advance(need);
        Some(ReadEvent::Frame(Frame {
            ts_ns,
            len: len.max(caplen),
            linktype,
            data: &self.buf[s..s + caplen as usize],
        }))
    }

    fn next_pcapng(&mut self) -> Option<ReadEvent<'_>> {
        loop {
            let (btype, blen) = match self.pcapng_block_header() {
                Ok(Some(h)) => h,
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(msg) => return self.stop(msg),
            };
            let body = self.start + 8..self.start + blen - 4;
            match btype {
                // Interface description.
                1 => {
                    let iface = interface_block(&self.buf[body], self.big);
                    self.advance(blen);
                    match iface {
                        Some(iface) => self.ifaces.push(iface),
                        None => return Some(ReadEvent::Warning("short interface block".into())),
                    }
                }
                // Enhanced packet / obsolete packet.
                6 | 2 => return Some(self.packet_block(btype, body, blen)),
                // Simple packet: interface 0, no timestamp.
                3 if body.len() >= 4 => return Some(self.simple_packet_block(body, blen)),
                _ => self.advance(blen),
            }
        }
    }

    /// Reads the next block's type and total length, with the whole block made available;
    /// a section header sets the byte order and forgets the interfaces. `None` at a clean end,
    /// `Err` with the reason reading must stop.
    fn pcapng_block_header(&mut self) -> Result<Option<(u32, usize)>, String> {
        let avail = self.fill(12).map_err(|e| format!("read error: {e}"))?;
        let pos = self.pos;
        if avail == 0 {
            return Ok(None);
        }
        if avail < 12 {
            return Err(format!("file truncated: block header cut at byte {pos}"));
        }
        let b = &self.buf[self.start..];
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == 0x0a0d0d0a {
            // Section header: byte order from its magic.
            self.big = match u32::from_le_bytes([b[8], b[9], b[10], b[11]]) {
                0x1a2b3c4d => false,
                0x4d3c2b1a => true,
                _ => return Err(format!("corrupt pcapng section header at byte {pos}")),
            };
            self.ifaces.clear();
        }
        let btype = read_u32(b, 0, self.big);
        let blen = read_u32(b, 4, self.big) as usize;
        if blen < 12 || !blen.is_multiple_of(4) || blen > MAX_RECORD {
            return Err(format!(
                "corrupt pcapng block at byte {pos}: length {blen}; stopping"
            ));
        }
        let avail = self.fill(blen).map_err(|e| format!("read error: {e}"))?;
        if avail < blen {
            return Err(format!(
                "file truncated: last block cut at byte {pos} ({avail} of {blen} bytes)"
            ));
        }
        Ok(Some((btype, blen)))
    }

    /// An enhanced (type 6) or obsolete (type 2) packet block: its frame, or a warning when
    /// the block is short, names an unknown interface or claims more bytes than it holds.
    fn packet_block(
        &mut self,
        btype: u32,
        body: std::ops::Range<usize>,
        blen: usize,
    ) -> ReadEvent<'_> {
        let pos = self.pos;
        self.advance(blen);
        let big = self.big;
        let b = &self.buf[body.clone()];
        if b.len() < 20 {
            return ReadEvent::Warning(format!("short packet block at byte {pos}; skipped"));
        }
        let ifid = if btype == 6 {
            read_u32(b, 0, big) as usize
        } else {
            usize::from(read_u16(b, 0, big))
        };
        let (hi, lo, caplen, len) = (
            read_u32(b, 4, big),
            read_u32(b, 8, big),
            read_u32(b, 12, big),
            read_u32(b, 16, big),
        );
        let Some(iface) = self.ifaces.get(ifid).copied() else {
            return ReadEvent::Warning(format!(
                "packet block at byte {pos} names interface {ifid} that was never described; skipped"
            ));
        };
        if caplen as usize > b.len() - 20 {
            return ReadEvent::Warning(format!(
                "packet block at byte {pos}: captured length {caplen} exceeds the block; skipped"
            ));
        }
        let d = body.start + 20;
        ReadEvent::Frame(Frame {
            ts_ns: ts_to_ns((u64::from(hi) << 32) | u64::from(lo), iface),
            len: len.max(caplen),
            linktype: iface.linktype,
            data: &self.buf[d..d + caplen as usize],
        })
    }

    /// A simple packet block (at least 4 body bytes): interface 0, no timestamp.
    fn simple_packet_block(&mut self, body: std::ops::Range<usize>, blen: usize) -> ReadEvent<'_> {
        self.advance(blen);
        let len = read_u32(&self.buf[body.clone()], 0, self.big);
        let caplen = (len as usize).min(body.len() - 4);
        let Some(iface) = self.ifaces.first().copied() else {
            return ReadEvent::Warning("simple packet block before any interface; skipped".into());
        };
        let d = body.start + 4;
        ReadEvent::Frame(Frame {
            ts_ns: 0,
            len,
            linktype: iface.linktype,
            data: &self.buf[d..d + caplen],
        })
    }
}

/// A 32-bit field at `i`, big-endian when `big` (a pcapng section's or a swapped pcap's order).
pub(crate) fn read_u32(b: &[u8], i: usize, big: bool) -> u32 {
    let v = [b[i], b[i + 1], b[i + 2], b[i + 3]];
    if big {
        u32::from_be_bytes(v)
    } else {
        u32::from_le_bytes(v)
    }
}

/// A 16-bit field at `i`, big-endian when `big`.
pub(crate) fn read_u16(b: &[u8], i: usize, big: bool) -> u16 {
    let v = [b[i], b[i + 1]];
    if big {
        u16::from_be_bytes(v)
    } else {
        u16::from_le_bytes(v)
    }
}

/// An interface description block's body: link type and the timestamp options
/// (`if_tsresol`, `if_tsoffset`); `None` when shorter than its fixed part.
fn interface_block(body: &[u8], big: bool) -> Option<Iface> {
    if body.len() < 8 {
        return None;
    }
    let mut iface = Iface {
        linktype: u32::from(read_u16(body, 0, big)),
        units_per_sec: 1_000_000,
        offset_s: 0,
    };
    let mut o = &body[8..];
    while o.len() >= 4 {
        let (code, len) = (read_u16(o, 0, big), usize::from(read_u16(o, 2, big)));
        if code == 0 || o.len() < 4 + len {
            break;
        }
        let v = &o[4..4 + len];
        match (code, len) {
            // if_tsresol: a power of ten, or of two with the high bit set.
            (9, 1) => {
                let r = v[0];
                let p = u32::from(r & 0x7f);
                iface.units_per_sec = if r & 0x80 != 0 {
                    1u64.checked_shl(p).unwrap_or(1_000_000)
                } else {
                    10u64.checked_pow(p).unwrap_or(1_000_000)
                };
            }
            // if_tsoffset: seconds added to every timestamp.
            (14, 8) => {
                let a: [u8; 8] = v.try_into().unwrap_or([0; 8]);
                iface.offset_s = if big {
                    i64::from_be_bytes(a)
                } else {
                    i64::from_le_bytes(a)
                };
            }
            _ => {}
        }
        o = &o[4 + len.div_ceil(4) * 4..];
    }
    Some(iface)
}

fn ts_to_ns(ts: u64, iface: Iface) -> i64 {
    let ups = u128::from(iface.units_per_sec.max(1));
    let ns = u128::from(ts) * 1_000_000_000 / ups;
    // Clamped so that differences of two timestamps can never overflow.
    i64::try_from(ns)
        .unwrap_or(i64::MAX)
        .saturating_add(iface.offset_s.saturating_mul(1_000_000_000))
        .clamp(0, MAX_TS_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap_le(nanos: bool, records: &[(u32, u32, &[u8], u32)]) -> Vec<u8> {
        let mut f = Vec::new();
        let magic: u32 = if nanos { 0xa1b23c4d } else { 0xa1b2c3d4 };
        f.extend_from_slice(&magic.to_le_bytes());
        f.extend_from_slice(&2u16.to_le_bytes());
        f.extend_from_slice(&4u16.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        for (s, frac, data, len) in records {
            for v in [*s, *frac, data.len() as u32, *len] {
                f.extend_from_slice(&v.to_le_bytes());
            }
            f.extend_from_slice(data);
        }
        f
    }

    type Frames = Vec<(i64, u32, Vec<u8>)>;

    fn frames(bytes: &[u8]) -> (Frames, Vec<String>) {
        let mut r = CaptureReader::new(bytes).unwrap();
        let (mut fs, mut ws) = (Vec::new(), Vec::new());
        while let Some(ev) = r.next() {
            match ev {
                ReadEvent::Frame(f) => fs.push((f.ts_ns, f.len, f.data.to_vec())),
                ReadEvent::Warning(w) => ws.push(w),
            }
        }
        (fs, ws)
    }

    #[test]
    fn pcap_micro_and_nano() {
        let f = pcap_le(false, &[(10, 5, b"abc", 3), (11, 0, b"de", 100)]);
        let (fs, ws) = frames(&f);
        assert!(ws.is_empty());
        assert_eq!(fs[0].0, 10_000_005_000);
        assert_eq!(fs[1].1, 100);
        assert_eq!(fs[1].2, b"de");
        let f = pcap_le(true, &[(10, 5, b"abc", 3)]);
        assert_eq!(frames(&f).0[0].0, 10_000_000_005);
    }

    #[test]
    fn records_larger_than_the_buffer() {
        let big = vec![7u8; 600 << 10];
        let f = pcap_le(
            false,
            &[(1, 0, b"a", 1), (2, 0, &big, 600 << 10), (3, 0, b"z", 1)],
        );
        let (fs, ws) = frames(&f);
        assert!(ws.is_empty());
        assert_eq!(fs.len(), 3);
        assert_eq!(fs[1].2, big);
        assert_eq!(fs[2].2, b"z");
    }

    #[test]
    fn pcap_big_endian() {
        let mut f = Vec::new();
        f.extend_from_slice(&0xa1b2c3d4u32.to_be_bytes());
        f.extend_from_slice(&[
            0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 1,
        ]);
        for v in [7u32, 1, 2, 2] {
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(b"xy");
        let (fs, ws) = frames(&f);
        assert!(ws.is_empty());
        assert_eq!(fs[0].0, 7_000_001_000);
        assert_eq!(fs[0].2, b"xy");
    }

    #[test]
    fn every_cut_of_a_file_is_handled() {
        let f = pcap_le(false, &[(1, 0, b"abcd", 4), (2, 0, b"efgh", 4)]);
        for n in 0..f.len() {
            match CaptureReader::new(&f[..n]) {
                Err(_) => assert!(n < 24),
                Ok(mut r) => {
                    let mut count = 0;
                    let mut warned = false;
                    while let Some(ev) = r.next() {
                        match ev {
                            ReadEvent::Frame(_) => count += 1,
                            ReadEvent::Warning(_) => warned = true,
                        }
                    }
                    let complete = [24, 24 + 20, 24 + 40].contains(&n);
                    assert_eq!(warned, !complete, "cut at {n}");
                    assert!(count <= 2);
                }
            }
        }
    }

    #[test]
    fn corrupt_record_length_stops_with_warning() {
        let mut f = pcap_le(false, &[(1, 0, b"abcd", 4)]);
        f[24 + 8..24 + 12].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let (fs, ws) = frames(&f);
        assert!(fs.is_empty());
        assert_eq!(ws.len(), 1);
    }

    fn block(t: u32, body: &[u8]) -> Vec<u8> {
        let len = 12 + body.len().div_ceil(4) * 4;
        let mut b = Vec::new();
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(body);
        b.resize(len - 4, 0);
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b
    }

    #[test]
    fn pcapng_two_interfaces_with_resolutions() {
        let mut f = block(
            0x0a0d0d0a,
            &[
                0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
        );
        // if 0: ethernet, default µs
        f.extend(block(1, &[1, 0, 0, 0, 0, 0, 0, 0]));
        // if 1: raw ip, ns (if_tsresol = 9)
        f.extend(block(
            1,
            &[101, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0],
        ));
        let epb = |ifid: u32, ts: u64, data: &[u8]| {
            let mut b = Vec::new();
            b.extend_from_slice(&ifid.to_le_bytes());
            b.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
            b.extend_from_slice(&(ts as u32).to_le_bytes());
            b.extend_from_slice(&(data.len() as u32).to_le_bytes());
            b.extend_from_slice(&(data.len() as u32).to_le_bytes());
            b.extend_from_slice(data);
            block(6, &b)
        };
        f.extend(epb(0, 1_500_000, b"abc"));
        f.extend(epb(1, 2_000_000_001, b"de"));
        f.extend(epb(7, 1, b"zz")); // unknown interface: warning
        f.extend(block(3, &[2, 0, 0, 0, b'q', b'r']));
        let (fs, ws) = frames(&f);
        assert_eq!(fs.len(), 3, "{ws:?}");
        assert_eq!(fs[0].0, 1_500_000_000);
        assert_eq!(fs[0].2, b"abc");
        assert_eq!(fs[1].0, 2_000_000_001);
        assert_eq!(fs[2].2, b"qr");
        assert_eq!(ws.len(), 1);
        // Every cut: no panic.
        for n in 0..f.len() {
            if let Ok(mut r) = CaptureReader::new(&f[..n]) {
                while r.next().is_some() {}
            }
        }
    }
}
