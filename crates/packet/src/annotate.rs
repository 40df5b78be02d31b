//! pcapng writing: a plain writer (used by `lagtrace capture --pcapng`) and
//! [`write_annotated`], which copies a pcap or pcapng capture to pcapng with a comment
//! (`opt_comment`, shown by Wireshark/tshark as `frame.comment`) on chosen frames.
//!
//! Written by hand rather than with pcap-file: annotating copies every pcapng block
//! byte for byte (interfaces, their `if_tsresol`, name resolution, statistics, raw
//! timestamps) and only rewrites the packet blocks that get a comment, so nothing but the
//! comment can change. A pcap input becomes one interface with the file's link type,
//! snaplen and timestamp resolution (µs, or ns for the nanosecond magic).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::reader::{read_u16, read_u32};
use crate::{Error, Result};
use serde::Serialize;

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const PB_OBSOLETE: u32 = 0x0000_0002;
const SPB: u32 = 0x0000_0003;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const OPT_ENDOFOPT: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
/// Larger blocks than this are taken as corruption, not as data (16 MiB: well above any
/// snaplen libpcap or Wireshark writes for network link types).
const MAX_BLOCK: u32 = 16 << 20;

/// Writes a pcapng file: one section (little-endian), interfaces, Enhanced Packet Blocks.
pub struct PcapngWriter<W: Write> {
    out: W,
    interfaces: u32,
}

impl<W: Write> PcapngWriter<W> {
    /// Starts a section (writes the Section Header Block).
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut opts = Vec::new();
        push_opt(
            &mut opts,
            SHB_USERAPPL,
            concat!("lagtrace ", env!("CARGO_PKG_VERSION")).as_bytes(),
        );
        push_opt(&mut opts, OPT_ENDOFOPT, &[]);
        let mut body = Vec::with_capacity(16 + opts.len());
        body.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&(-1i64).to_le_bytes());
        body.extend_from_slice(&opts);
        write_block(&mut out, SHB, &body)?;
        Ok(PcapngWriter { out, interfaces: 0 })
    }

    /// Adds an Interface Description Block and returns its interface id.
    /// `tsresol_exp` is the decimal exponent of the timestamp unit: 6 for µs, 9 for ns.
    pub fn add_interface(
        &mut self,
        linktype: u16,
        snaplen: u32,
        tsresol_exp: u8,
        name: Option<&str>,
    ) -> io::Result<u32> {
        let mut body = Vec::with_capacity(32);
        body.extend_from_slice(&linktype.to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&snaplen.to_le_bytes());
        if let Some(n) = name {
            push_opt(&mut body, IF_NAME, n.as_bytes());
        }
        if tsresol_exp != 6 {
            push_opt(&mut body, IF_TSRESOL, &[tsresol_exp]);
        }
        push_opt(&mut body, OPT_ENDOFOPT, &[]);
        write_block(&mut self.out, IDB, &body)?;
        self.interfaces += 1;
        Ok(self.interfaces - 1)
    }

    /// Writes one Enhanced Packet Block. `ts_units` counts the interface's timestamp unit
    /// since the epoch; `comment`, if any, becomes the packet's `opt_comment`.
    pub fn write_packet(
        &mut self,
        interface_id: u32,
        ts_units: u64,
        orig_len: u32,
        data: &[u8],
        comment: Option<&str>,
    ) -> io::Result<()> {
        if interface_id >= self.interfaces {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pcapng: packet on interface {interface_id} which was never described"),
            ));
        }
        let mut body = Vec::with_capacity(32 + data.len());
        body.extend_from_slice(&interface_id.to_le_bytes());
        body.extend_from_slice(&((ts_units >> 32) as u32).to_le_bytes());
        body.extend_from_slice(&(ts_units as u32).to_le_bytes());
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(&orig_len.max(data.len() as u32).to_le_bytes());
        body.extend_from_slice(data);
        pad4(&mut body);
        if let Some(c) = comment {
            push_opt(&mut body, OPT_COMMENT, c.as_bytes());
            push_opt(&mut body, OPT_ENDOFOPT, &[]);
        }
        write_block(&mut self.out, EPB, &body)
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

fn pad4(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
}

fn push_opt(v: &mut Vec<u8>, code: u16, value: &[u8]) {
    v.extend_from_slice(&code.to_le_bytes());
    v.extend_from_slice(&(value.len() as u16).to_le_bytes());
    v.extend_from_slice(value);
    pad4(v);
}

fn write_block<W: Write>(out: &mut W, btype: u32, body: &[u8]) -> io::Result<()> {
    let total = (12 + body.len()) as u32;
    out.write_all(&btype.to_le_bytes())?;
    out.write_all(&total.to_le_bytes())?;
    out.write_all(body)?;
    out.write_all(&total.to_le_bytes())
}

/// What [`write_annotated`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AnnotateStats {
    /// Input format: "pcap" or "pcapng".
    pub input_format: String,
    /// Frames (packet records) copied, numbered from 1 as Wireshark does.
    pub frames: u64,
    /// Frames that received a comment.
    pub commented: u64,
    /// Requested frame numbers beyond the end of the capture.
    pub missing_frames: Vec<u64>,
    /// Requested frames stored as Simple Packet Blocks, which cannot carry options.
    pub uncommentable_frames: Vec<u64>,
    /// What was not valid in the input (for example a cut last record); the valid part
    /// before it was written.
    pub warnings: Vec<String>,
}

/// Copies `input` (pcap or pcapng) to `output` as pcapng, adding `comments[n]` as the
/// `opt_comment` of frame `n` (1-based, as Wireshark numbers frames). Timestamps, link
/// types, interfaces and every other block are kept exactly; existing comments are kept.
///
/// Errors only when the input cannot be read as pcap/pcapng at all or the output cannot
/// be written; a damaged tail is reported in [`AnnotateStats::warnings`].
pub fn write_annotated(
    input: &Path,
    output: &Path,
    comments: &BTreeMap<u64, String>,
) -> Result<AnnotateStats> {
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize())
        && a == b
    {
        return Err(Error::Usage(format!(
            "annotate: output {} is the input file",
            output.display()
        )));
    }
    let f = File::open(input).map_err(|e| Error::io(format!("opening {}", input.display()), e))?;
    let rd = BufReader::with_capacity(1 << 20, f);
    let out =
        File::create(output).map_err(|e| Error::io(format!("creating {}", output.display()), e))?;
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let done = annotate_stream(rd, &mut out, comments)
        .map_err(|e| Error::Annotate {
            input: input.to_path_buf(),
            output: output.to_path_buf(),
            err: Box::new(e),
        })
        .and_then(|st| {
            out.flush()
                .map_err(|e| Error::io(format!("writing {}", output.display()), e))?;
            Ok(st)
        });
    if done.is_err() {
        // Leave no half-written file behind.
        drop(out);
        let _ = std::fs::remove_file(output);
    }
    done
}

/// [`write_annotated`] on a reader and a writer (the writer is not flushed).
pub fn annotate_stream<R: Read, W: Write>(
    mut rd: R,
    mut out: W,
    comments: &BTreeMap<u64, String>,
) -> Result<AnnotateStats> {
    let mut magic = [0u8; 4];
    if read_full(&mut rd, &mut magic)? < 4 {
        return Err(Error::Format("too short for a capture file".into()));
    }
    let mut stats = AnnotateStats::default();
    let m = u32::from_le_bytes(magic);
    match m {
        SHB => {
            stats.input_format = "pcapng".into();
            copy_pcapng(&mut rd, magic, &mut out, comments, &mut stats)?;
        }
        0xA1B2_C3D4 | 0xD4C3_B2A1 | 0xA1B2_3C4D | 0x4D3C_B2A1 => {
            stats.input_format = "pcap".into();
            copy_pcap(&mut rd, magic, &mut out, comments, &mut stats)?;
        }
        _ => {
            return Err(Error::Format(format!(
                "not a pcap or pcapng file (magic {:02x}{:02x}{:02x}{:02x})",
                magic[0], magic[1], magic[2], magic[3]
            )));
        }
    }
    let last = stats.frames;
    stats.missing_frames = comments.range(last + 1..).map(|(k, _)| *k).collect();
    if comments.contains_key(&0) {
        stats.missing_frames.insert(0, 0);
    }
    Ok(stats)
}

/// Reads up to `buf.len()` bytes; returns how many (fewer only at end of file).
fn read_full<R: Read>(rd: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match rd.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn copy_pcap<R: Read, W: Write>(
    rd: &mut R,
    magic: [u8; 4],
    out: &mut W,
    comments: &BTreeMap<u64, String>,
    stats: &mut AnnotateStats,
) -> Result<()> {
    let le = matches!(u32::from_le_bytes(magic), 0xA1B2_C3D4 | 0xA1B2_3C4D);
    let u32_at = |b: &[u8], i: usize| read_u32(b, i, !le);
    let nano = matches!(
        if le {
            u32::from_le_bytes(magic)
        } else {
            u32::from_be_bytes(magic)
        },
        0xA1B2_3C4D
    );
    let mut hdr = [0u8; 20];
    if read_full(rd, &mut hdr)? < 20 {
        return Err(Error::Format("pcap file header is cut short".into()));
    }
    let snaplen = u32_at(&hdr, 12);
    let linktype = u32_at(&hdr, 16) & 0xFFFF;
    let (exp, unit) = if nano {
        (9u8, 1_000_000_000u64)
    } else {
        (6u8, 1_000_000u64)
    };
    let mut w = PcapngWriter::new(&mut *out)?;
    w.add_interface(linktype as u16, snaplen, exp, None)?;
    let mut rec = [0u8; 16];
    let mut data = Vec::new();
    loop {
        let n = read_full(rd, &mut rec)?;
        if n == 0 {
            break;
        }
        let frame = stats.frames + 1;
        if n < 16 {
            stats.warnings.push(format!(
                "frame {frame}: record header cut short ({n} of 16 bytes); stopped there"
            ));
            break;
        }
        let (sec, frac, incl, orig) = (
            u32_at(&rec, 0) as u64,
            u32_at(&rec, 4) as u64,
            u32_at(&rec, 8),
            u32_at(&rec, 12),
        );
        if incl > MAX_BLOCK {
            stats.warnings.push(format!(
                "frame {frame}: implausible captured length {incl}; stopped there"
            ));
            break;
        }
        data.clear();
        // Grows with the bytes really there: a corrupt length costs no huge allocation.
        let got = rd.by_ref().take(incl as u64).read_to_end(&mut data)?;
        if got < incl as usize {
            stats.warnings.push(format!(
                "frame {frame}: packet data cut short ({got} of {incl} bytes); stopped there"
            ));
            break;
        }
        let comment = comments.get(&frame).map(String::as_str);
        w.write_packet(0, sec * unit + frac, orig, &data, comment)?;
        stats.frames = frame;
        if comment.is_some() {
            stats.commented += 1;
        }
    }
    w.finish()?;
    Ok(())
}

fn copy_pcapng<R: Read, W: Write>(
    rd: &mut R,
    first: [u8; 4],
    out: &mut W,
    comments: &BTreeMap<u64, String>,
    stats: &mut AnnotateStats,
) -> Result<()> {
    let mut blocks = BlockReader {
        rd,
        first: Some(first),
        le: true,
        seen_shb: false,
        block: Vec::new(),
    };
    let mut shb_written = false;
    while let Some(btype) = blocks.next(stats)? {
        match btype {
            EPB | PB_OBSOLETE | SPB => {
                copy_packet_block(out, &blocks.block, btype, blocks.le, comments, stats)?
            }
            _ => {
                shb_written |= btype == SHB;
                out.write_all(&blocks.block)?;
            }
        }
    }
    if !shb_written {
        // Nothing valid at all: an empty "pcapng" would not be one.
        return Err(Error::Format(format!(
            "pcapng section header is damaged: {}",
            stats.warnings.join("; ")
        )));
    }
    Ok(())
}

/// Reads a pcapng file block by block, checking each block's framing.
struct BlockReader<'r, R> {
    rd: &'r mut R,
    /// The file's first four bytes, already read to tell the format.
    first: Option<[u8; 4]>,
    /// The current section is little-endian.
    le: bool,
    seen_shb: bool,
    /// The last block read, whole.
    block: Vec<u8>,
}

impl<R: Read> BlockReader<'_, R> {
    /// The next block's type, with its bytes in `self.block`. `None` at the end of the file,
    /// or where the file is damaged (a warning in `stats` says where); an error when the file
    /// is not pcapng at all.
    fn next(&mut self, stats: &mut AnnotateStats) -> Result<Option<u32>> {
        // type(4) + length(4) + (for the byte-order magic of an SHB) 4 more bytes.
        let mut head = [0u8; 12];
        let n = match self.first.take() {
            Some(f) => {
                head[..4].copy_from_slice(&f);
                4 + read_full(self.rd, &mut head[4..])?
            }
            None => read_full(self.rd, &mut head)?,
        };
        let after = stats.frames;
        if n == 0 {
            return Ok(None);
        }
        if n < 12 {
            let w =
                format!("block after frame {after}: header cut short ({n} bytes); stopped there");
            stats.warnings.push(w);
            return Ok(None);
        }
        self.section(&head)?;
        let btype = read_u32(&head, 0, !self.le);
        let len = read_u32(&head, 4, !self.le);
        if len < 12 || !len.is_multiple_of(4) || len > MAX_BLOCK {
            let w = format!("block after frame {after}: bad block length {len}; stopped there");
            stats.warnings.push(w);
            return Ok(None);
        }
        self.block.clear();
        self.block.extend_from_slice(&head);
        let got = self
            .rd
            .by_ref()
            .take(u64::from(len) - 12)
            .read_to_end(&mut self.block)?;
        if got < len as usize - 12 {
            stats.warnings.push(format!(
                "block after frame {after}: cut short ({} of {len} bytes); stopped there",
                got + 12
            ));
            return Ok(None);
        }
        if read_u32(&self.block, len as usize - 4, !self.le) != len {
            stats.warnings.push(format!(
                "block after frame {after}: trailing length does not match; stopped there"
            ));
            return Ok(None);
        }
        Ok(Some(btype))
    }

    /// A section header sets the byte order; anything before the first one is not pcapng.
    fn section(&mut self, head: &[u8; 12]) -> Result<()> {
        if u32::from_le_bytes([head[0], head[1], head[2], head[3]]) == SHB {
            self.le = match u32::from_le_bytes([head[8], head[9], head[10], head[11]]) {
                BYTE_ORDER_MAGIC => true,
                0x4D3C_2B1A => false,
                _ => {
                    return Err(Error::Format(
                        "pcapng section header has a bad byte-order magic".into(),
                    ));
                }
            };
            self.seen_shb = true;
        } else if !self.seen_shb {
            return Err(Error::Format(
                "pcapng file does not start with a section header".into(),
            ));
        }
        Ok(())
    }
}

/// Copies one packet block (the next frame), with its comment if one is asked for and the
/// block can carry it (a simple packet block has no options).
fn copy_packet_block<W: Write>(
    out: &mut W,
    block: &[u8],
    btype: u32,
    le: bool,
    comments: &BTreeMap<u64, String>,
    stats: &mut AnnotateStats,
) -> Result<()> {
    let frame = stats.frames + 1;
    stats.frames = frame;
    let Some(c) = comments.get(&frame) else {
        out.write_all(block)?;
        return Ok(());
    };
    if btype == SPB {
        stats.uncommentable_frames.push(frame);
        out.write_all(block)?;
        return Ok(());
    }
    match with_comment(block, le, c) {
        Some(b) => {
            out.write_all(&b)?;
            stats.commented += 1;
        }
        None => {
            stats.warnings.push(format!(
                "frame {frame}: packet block is malformed; copied without a comment"
            ));
            stats.uncommentable_frames.push(frame);
            out.write_all(block)?;
        }
    }
    Ok(())
}

/// Returns an EPB/PB `block` with `comment` appended to its options, in the section's byte
/// order; `None` if the block's lengths do not add up.
fn with_comment(block: &[u8], le: bool, comment: &str) -> Option<Vec<u8>> {
    let u32_at = |i: usize| read_u32(block, i, !le);
    let u16_at = |i: usize| read_u16(block, i, !le);
    let w16 = |v: &mut Vec<u8>, x: u16| {
        v.extend_from_slice(&if le { x.to_le_bytes() } else { x.to_be_bytes() })
    };
    if block.len() < 32 {
        return None;
    }
    let end = block.len() - 4;
    let caplen = u32_at(20) as usize;
    let opts_start = 28usize.checked_add(caplen.checked_add(3)? & !3)?;
    if opts_start > end {
        return None;
    }
    let mut out = Vec::with_capacity(block.len() + comment.len() + 16);
    out.extend_from_slice(&block[..opts_start]);
    // Keep existing options up to (not including) opt_endofopt.
    let mut i = opts_start;
    while i + 4 <= end {
        let code = u16_at(i);
        let olen = u16_at(i + 2) as usize;
        if code == OPT_ENDOFOPT {
            break;
        }
        let next = i + 4 + ((olen + 3) & !3);
        if next > end {
            return None;
        }
        out.extend_from_slice(&block[i..next]);
        i = next;
    }
    let c = comment.as_bytes();
    let c = &c[..c.len().min(u16::MAX as usize - 3)];
    w16(&mut out, OPT_COMMENT);
    w16(&mut out, c.len() as u16);
    out.extend_from_slice(c);
    pad4(&mut out);
    w16(&mut out, OPT_ENDOFOPT);
    w16(&mut out, 0);
    let total = (out.len() + 4) as u32;
    let tb = if le {
        total.to_le_bytes()
    } else {
        total.to_be_bytes()
    };
    out[4..8].copy_from_slice(&tb);
    out.extend_from_slice(&tb);
    Some(out)
}
