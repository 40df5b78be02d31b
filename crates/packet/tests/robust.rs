//! Hostile input never panics or hangs: random bytes, every truncation of a real capture,
//! bytes flipped in it, huge timestamps, empty files, pcapng with unknown block types.
//! (The `cargo fuzz` targets under fuzz/ need nightly; this runs on stable in CI.)

use lagtrace_packet::{AnalyzeOptions, analyze_reader};

fn case(name: &str) -> Vec<u8> {
    let p = lagtrace_testkit::case_pcap(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// xorshift64*: deterministic, so a failure can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn run(bytes: &[u8]) -> Option<lagtrace_packet::Analysis> {
    analyze_reader(bytes, &AnalyzeOptions::default()).ok()
}

#[test]
fn empty_and_tiny_files_are_errors_not_panics() {
    assert!(run(b"").is_none());
    assert!(run(b"\xd4\xc3").is_none());
    // A valid pcap header and nothing else: an empty analysis.
    let full = case("nagle-delayed-ack.pcap");
    let a = run(&full[..24]).expect("header only");
    assert_eq!(a.frames, 0);
}

#[test]
fn every_truncation_of_a_real_capture_is_analyzed_up_to_the_cut() {
    let full = case("nagle-delayed-ack.pcap");
    let whole = run(&full).unwrap();
    let mut last = 0;
    let step = (full.len() / 400).max(1);
    for cut in (24..full.len()).step_by(step) {
        let a = run(&full[..cut]).expect("valid header");
        assert!(a.frames >= last && a.frames <= whole.frames);
        last = a.frames;
    }
}

#[test]
fn random_damage_never_panics() {
    let full = case("nagle-delayed-ack.pcap");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..300 {
        let mut b = full.clone();
        // Flip a few bytes anywhere after the file header (record headers included).
        for _ in 0..(1 + round % 8) {
            let i = 24 + (rng.next() as usize) % (b.len() - 24);
            b[i] = rng.next() as u8;
        }
        let _ = run(&b);
    }
    // Pure noise behind valid pcap and pcapng headers.
    for round in 0..200 {
        let mut b = if round % 2 == 0 {
            full[..24].to_vec()
        } else {
            pcapng_head()
        };
        let n = (rng.next() % 4096) as usize;
        b.extend((0..n).map(|_| rng.next() as u8));
        let _ = run(&b);
    }
}

#[test]
fn huge_timestamps_are_clamped() {
    let full = case("nagle-delayed-ack.pcap");
    let mut b = full.clone();
    // First record's ts_sec to u32::MAX, the second's to 0: time runs backwards by 136 years.
    b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    let a = run(&b).unwrap();
    assert_eq!(a.frames, run(&full).unwrap().frames);
    assert!(
        a.warnings.iter().any(|w| w.contains("earlier")),
        "{:?}",
        a.warnings
    );
}

fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut body = body.to_vec();
    while !body.len().is_multiple_of(4) {
        body.push(0);
    }
    let len = (12 + body.len()) as u32;
    let mut v = kind.to_le_bytes().to_vec();
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&body);
    v.extend_from_slice(&len.to_le_bytes());
    v
}

/// Section header + one Ethernet interface (µs timestamps).
fn pcapng_head() -> Vec<u8> {
    let mut shb = 0x1A2B_3C4Du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    let mut v = block(0x0A0D_0D0A, &shb);
    let mut idb = 1u16.to_le_bytes().to_vec();
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&65535u32.to_le_bytes());
    v.extend(block(1, &idb));
    v
}

fn epb(ts: u64, frame: &[u8]) -> Vec<u8> {
    let mut b = 0u32.to_le_bytes().to_vec();
    b.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
    b.extend_from_slice(&(ts as u32).to_le_bytes());
    b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    b.extend_from_slice(frame);
    block(6, &b)
}

/// The frames of the reference pcap (Ethernet) as (ts µs, bytes).
fn frames() -> Vec<(u64, Vec<u8>)> {
    let full = case("nagle-delayed-ack.pcap");
    let mut out = Vec::new();
    let mut i = 24;
    while i + 16 <= full.len() {
        let sec = u64::from(u32::from_le_bytes(full[i..i + 4].try_into().unwrap()));
        let usec = u64::from(u32::from_le_bytes(full[i + 4..i + 8].try_into().unwrap()));
        let cap = u32::from_le_bytes(full[i + 8..i + 12].try_into().unwrap()) as usize;
        out.push((sec * 1_000_000 + usec, full[i + 16..i + 16 + cap].to_vec()));
        i += 16 + cap;
    }
    out
}

#[test]
fn pcapng_unknown_blocks_are_skipped_and_huge_timestamps_survive() {
    let fr = frames();
    let mut b = pcapng_head();
    for (k, (ts, f)) in fr.iter().enumerate() {
        if k % 7 == 0 {
            // A block type no one defined, and a custom block: skipped.
            b.extend(block(0x0000_0BAD, b"whatever this is"));
            b.extend(block(0x0000_0BAD | 0x4000_0000, &[1, 2, 3]));
        }
        b.extend(epb(*ts, f));
    }
    let a = run(&b).unwrap();
    let reference = run(&case("nagle-delayed-ack.pcap")).unwrap();
    assert_eq!(a.frames, reference.frames);
    assert_eq!(a.streams.len(), reference.streams.len());
    assert_eq!(
        a.kind("nagle-delayed-ack").map(|k| k.findings),
        reference.kind("nagle-delayed-ack").map(|k| k.findings)
    );
    // The largest 64-bit timestamp: clamped, no overflow.
    let mut b = pcapng_head();
    b.extend(epb(u64::MAX, &fr[0].1));
    b.extend(epb(0, &fr[1].1));
    b.extend(epb(u64::MAX - 1, &fr[2].1));
    let a = run(&b).unwrap();
    assert_eq!(a.frames, 3);
}
