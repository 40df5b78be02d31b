//! annotate::write_annotated cross-checked with tshark: comments land on the right frames
//! as `frame.comment`, and nothing else changes (times, lengths, interfaces, bytes).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use lagtrace_packet::annotate::{PcapngWriter, write_annotated};
use lagtrace_testkit::case_pcap as case_file;
use lagtrace_testkit::tshark_fields_first as tshark_fields;

const SAME: &[&str] = &[
    "frame.number",
    "frame.time_epoch",
    "frame.len",
    "frame.cap_len",
    "frame.protocols",
    "tcp.seq_raw",
    "tcp.ack_raw",
    "tcp.flags",
    "tcp.len",
];

fn assert_same_frames(before: &[Vec<String>], after: &[Vec<String>]) {
    assert_eq!(
        before.len(),
        after.len(),
        "frame count changed by annotating"
    );
    for (b, a) in before.iter().zip(after) {
        assert_eq!(b, a, "frame changed by annotating");
    }
}

fn comments_of(file: &Path) -> Vec<(u64, String)> {
    tshark_fields(
        file,
        Some("frame.comment"),
        &["frame.number", "frame.comment"],
    )
    .into_iter()
    .map(|r| (r[0].parse().unwrap(), r[1].clone()))
    .collect()
}

fn assert_annotated(input: &Path, comments: &BTreeMap<u64, String>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.pcapng");
    let st = write_annotated(input, &out, comments).unwrap();
    assert!(st.warnings.is_empty(), "{st:?}");
    let before = tshark_fields(input, None, SAME);
    let after = tshark_fields(&out, None, SAME);
    assert_eq!(before.len() as u64, st.frames);
    assert_same_frames(&before, &after);
    let want: Vec<(u64, String)> = comments
        .iter()
        .filter(|(k, _)| **k >= 1 && **k <= st.frames)
        .map(|(k, v)| (*k, v.clone()))
        .collect();
    assert_eq!(comments_of(&out), want);
    assert_eq!(st.commented as usize, want.len());
}

#[test]
fn comments_on_the_reference_case_land_on_their_frames() {
    let input = case_file("nagle-delayed-ack.pcap");
    let n = tshark_fields(&input, None, &["frame.number"]).len() as u64;
    assert!(n > 10);
    let mut c = BTreeMap::new();
    c.insert(1, "first frame".to_string());
    c.insert(
        5,
        "nagle-delayed-ack: ACK held 40 ms (stream 0)".to_string(),
    );
    c.insert(6, "ünïcödé, commas, and \"quotes\"".to_string());
    c.insert(n, "last frame".to_string());
    assert_annotated(&input, &c);

    // Frames past the end are reported, not invented.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.pcapng");
    let mut c2 = BTreeMap::new();
    c2.insert(n + 1, "beyond".to_string());
    c2.insert(2, "two".to_string());
    let st = write_annotated(&input, &out, &c2).unwrap();
    assert_eq!(st.missing_frames, vec![n + 1]);
    assert_eq!(st.input_format, "pcap");
    assert_eq!(comments_of(&out), vec![(2, "two".to_string())]);
}

#[test]
fn nanosecond_pcap_keeps_nanoseconds() {
    let dir = tempfile::tempdir().unwrap();
    let ns = dir.path().join("ns.pcap");
    let ok = Command::new("editcap")
        .args(["-F", "nsecpcap"])
        .arg(case_file("healthy.pcap"))
        .arg(&ns)
        .status()
        .unwrap();
    assert!(ok.success());
    // Give the frames distinct sub-microsecond parts so a µs round trip would show.
    let shifted = dir.path().join("shifted.pcap");
    let ok = Command::new("editcap")
        .args(["-F", "nsecpcap", "-t", "0.000000321"])
        .arg(&ns)
        .arg(&shifted)
        .status()
        .unwrap();
    assert!(ok.success());
    let t = tshark_fields(&shifted, None, &["frame.time_epoch"]);
    assert!(t[0][0].ends_with("321"), "{:?}", t[0]);
    let mut c = BTreeMap::new();
    c.insert(3, "three".to_string());
    assert_annotated(&shifted, &c);
}

#[test]
fn pcapng_with_two_interfaces_and_existing_comments() {
    // Build the input from the reference case: iface 0 Ethernet at ns resolution, iface 1
    // raw IP at µs resolution, one packet already carrying a comment.
    let frames = read_pcap_frames(&case_file("healthy.pcap"));
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcapng");
    {
        let f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        let mut w = PcapngWriter::new(f).unwrap();
        assert_eq!(w.add_interface(1, 65535, 9, Some("eth-a")).unwrap(), 0);
        assert_eq!(w.add_interface(101, 65535, 6, Some("raw-b")).unwrap(), 1);
        for (i, (ts_us, orig, data)) in frames.iter().take(40).enumerate() {
            if i % 2 == 0 {
                let c = (i == 4).then_some("already here");
                w.write_packet(0, ts_us * 1000 + 7, *orig, data, c).unwrap();
            } else {
                w.write_packet(1, *ts_us, orig - 14, &data[14..], None)
                    .unwrap();
            }
        }
        w.finish().unwrap();
    }
    let ids = tshark_fields(&input, None, &["frame.interface_id", "frame.time_epoch"]);
    assert_eq!(ids.len(), 40);
    assert_eq!(ids[1][0], "1");
    assert!(ids[0][1].ends_with('7'), "{:?}", ids[0]);
    let out = dir.path().join("out.pcapng");
    let mut c = BTreeMap::new();
    c.insert(1, "on iface 0".to_string());
    c.insert(2, "on iface 1".to_string());
    c.insert(5, "second comment on frame 5".to_string());
    let st = write_annotated(&input, &out, &c).unwrap();
    assert_eq!((st.frames, st.commented), (40, 3));
    assert_eq!(st.input_format, "pcapng");
    assert_same_frames(
        &tshark_fields(&input, None, SAME),
        &tshark_fields(&out, None, SAME),
    );
    let fields = &[
        "frame.interface_id",
        "frame.interface_name",
        "frame.encap_type",
    ];
    assert_same_frames(
        &tshark_fields(&input, None, fields),
        &tshark_fields(&out, None, fields),
    );
    // tshark lists both comments of frame 5 (separated by a comma with occurrence=a).
    let five = Command::new("tshark")
        .arg("-r")
        .arg(&out)
        .args([
            "-Y",
            "frame.number == 5",
            "-T",
            "fields",
            "-e",
            "frame.comment",
        ])
        .output()
        .unwrap();
    let five = String::from_utf8_lossy(&five.stdout);
    assert!(
        five.contains("already here") && five.contains("second comment on frame 5"),
        "{five}"
    );
    let got = comments_of(&out);
    assert_eq!(got[0], (1, "on iface 0".to_string()));
    assert_eq!(got[1], (2, "on iface 1".to_string()));
}

#[test]
fn a_cut_last_record_is_a_warning_and_the_rest_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cut.pcap");
    let mut bytes = std::fs::read(case_file("healthy.pcap")).unwrap();
    let n = tshark_fields(&case_file("healthy.pcap"), None, &["frame.number"]).len() as u64;
    bytes.truncate(bytes.len() - 10);
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.path().join("out.pcapng");
    let mut c = BTreeMap::new();
    c.insert(n - 1, "last whole frame".to_string());
    c.insert(n, "the cut one".to_string());
    let st = write_annotated(&input, &out, &c).unwrap();
    assert_eq!(st.frames, n - 1);
    assert_eq!(st.warnings.len(), 1, "{st:?}");
    assert!(st.warnings[0].contains(&format!("frame {n}")), "{st:?}");
    assert_eq!(st.missing_frames, vec![n]);
    assert_eq!(
        comments_of(&out),
        vec![(n - 1, "last whole frame".to_string())]
    );
    assert_eq!(
        tshark_fields(&out, None, &["frame.number"]).len() as u64,
        n - 1
    );
}

#[test]
fn junk_and_overwriting_the_input_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture file at all").unwrap();
    let out = dir.path().join("o.pcapng");
    let e = write_annotated(&junk, &out, &BTreeMap::new()).unwrap_err();
    assert!(format!("{e:#}").contains("not a pcap or pcapng"), "{e:#}");
    assert!(!out.exists(), "no output is left behind for a junk input");
    let empty = dir.path().join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    assert!(write_annotated(&empty, &out, &BTreeMap::new()).is_err());
    let copy = dir.path().join("c.pcap");
    std::fs::copy(case_file("healthy.pcap"), &copy).unwrap();
    let e = write_annotated(&copy, &copy, &BTreeMap::new()).unwrap_err();
    assert!(format!("{e:#}").contains("is the input"), "{e:#}");
    // The input was not touched.
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(case_file("healthy.pcap")).unwrap()
    );
}

/// (timestamp µs, orig len, bytes) of each record of a little-endian µs pcap.
fn read_pcap_frames(p: &Path) -> Vec<(u64, u32, Vec<u8>)> {
    let b = std::fs::read(p).unwrap();
    assert_eq!(&b[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "fixture is LE µs pcap");
    let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut i = 24;
    let mut v = Vec::new();
    while i + 16 <= b.len() {
        let (s, us, incl, orig) = (u(i) as u64, u(i + 4) as u64, u(i + 8) as usize, u(i + 12));
        v.push((s * 1_000_000 + us, orig, b[i + 16..i + 16 + incl].to_vec()));
        i += 16 + incl;
    }
    v
}

/// Rewrites a little-endian pcapng made of SHB/IDB/EPB blocks with byte-string options
/// (as `PcapngWriter` makes them) in big-endian byte order.
fn to_big_endian(le: &[u8]) -> Vec<u8> {
    let u16le = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32le = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut out = Vec::with_capacity(le.len());
    let mut i = 0;
    while i < le.len() {
        let btype = u32le(le, i);
        let len = u32le(le, i + 4) as usize;
        let b = &le[i..i + len];
        out.extend_from_slice(&btype.to_be_bytes());
        out.extend_from_slice(&(len as u32).to_be_bytes());
        let opts_at = match btype {
            0x0A0D0D0A => {
                out.extend_from_slice(&u32le(b, 8).to_be_bytes());
                out.extend_from_slice(&u16le(b, 12).to_be_bytes());
                out.extend_from_slice(&u16le(b, 14).to_be_bytes());
                out.extend_from_slice(&(-1i64).to_be_bytes());
                24
            }
            1 => {
                out.extend_from_slice(&u16le(b, 8).to_be_bytes());
                out.extend_from_slice(&0u16.to_be_bytes());
                out.extend_from_slice(&u32le(b, 12).to_be_bytes());
                16
            }
            6 => {
                for k in 0..5 {
                    out.extend_from_slice(&u32le(b, 8 + 4 * k).to_be_bytes());
                }
                let cap = u32le(b, 20) as usize;
                let padded = (cap + 3) & !3;
                out.extend_from_slice(&b[28..28 + padded]);
                28 + padded
            }
            t => panic!("unexpected block type {t:#x}"),
        };
        let mut j = opts_at;
        while j + 4 <= len - 4 {
            let code = u16le(b, j);
            let olen = u16le(b, j + 2) as usize;
            out.extend_from_slice(&code.to_be_bytes());
            out.extend_from_slice(&(olen as u16).to_be_bytes());
            let padded = (olen + 3) & !3;
            out.extend_from_slice(&b[j + 4..j + 4 + padded]);
            j += 4 + padded;
        }
        out.extend_from_slice(&(len as u32).to_be_bytes());
        i += len;
    }
    out
}

#[test]
fn big_endian_pcapng_is_annotated_in_its_own_byte_order() {
    let frames = read_pcap_frames(&case_file("nagle-delayed-ack.pcap"));
    let dir = tempfile::tempdir().unwrap();
    let le = dir.path().join("le.pcapng");
    {
        let f = std::fs::File::create(&le).unwrap();
        let mut w = PcapngWriter::new(f).unwrap();
        w.add_interface(1, 262144, 9, Some("veth-x")).unwrap();
        for (i, (ts_us, orig, data)) in frames.iter().take(30).enumerate() {
            let c = (i == 2).then_some("in the input");
            w.write_packet(0, ts_us * 1000 + 123, *orig, data, c)
                .unwrap();
        }
        w.finish().unwrap();
    }
    let be = dir.path().join("be.pcapng");
    std::fs::write(&be, to_big_endian(&std::fs::read(&le).unwrap())).unwrap();
    // tshark reads our big-endian copy exactly like the original.
    assert_same_frames(
        &tshark_fields(&le, None, SAME),
        &tshark_fields(&be, None, SAME),
    );
    let mut c = BTreeMap::new();
    c.insert(1, "one".to_string());
    c.insert(30, "thirty".to_string());
    let out = dir.path().join("be-out.pcapng");
    let st = write_annotated(&be, &out, &c).unwrap();
    assert_eq!((st.frames, st.commented), (30, 2), "{st:?}");
    assert!(st.warnings.is_empty(), "{st:?}");
    assert_same_frames(
        &tshark_fields(&be, None, SAME),
        &tshark_fields(&out, None, SAME),
    );
    // Still big-endian: the section header's byte-order magic is 1A2B3C4D as written.
    assert_eq!(
        &std::fs::read(&out).unwrap()[8..12],
        &[0x1a, 0x2b, 0x3c, 0x4d]
    );
    assert_eq!(
        comments_of(&out),
        vec![
            (1, "one".to_string()),
            (3, "in the input".to_string()),
            (30, "thirty".to_string())
        ]
    );
}

#[test]
fn a_damaged_section_header_is_an_error_not_an_empty_file() {
    // Found by the fuzz target: a pcapng whose only section header fails its length check
    // used to give an "annotated" file with no bytes at all.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.pcapng");
    {
        let f = std::fs::File::create(&good).unwrap();
        let mut w = PcapngWriter::new(f).unwrap();
        w.add_interface(1, 65535, 6, None).unwrap();
        w.write_packet(0, 1, 60, &[0u8; 60], None).unwrap();
        w.finish().unwrap();
    }
    let mut bytes = std::fs::read(&good).unwrap();
    bytes[4] = bytes[4].wrapping_add(4); // SHB length no longer matches its trailer
    let bad = dir.path().join("bad.pcapng");
    std::fs::write(&bad, &bytes).unwrap();
    let out = dir.path().join("out.pcapng");
    let e = write_annotated(&bad, &out, &BTreeMap::new()).unwrap_err();
    assert!(
        format!("{e:#}").contains("section header is damaged"),
        "{e:#}"
    );
    assert!(!out.exists());
    // The undamaged file annotates fine.
    let st = write_annotated(&good, &out, &BTreeMap::new()).unwrap();
    assert_eq!(st.frames, 1);
}
