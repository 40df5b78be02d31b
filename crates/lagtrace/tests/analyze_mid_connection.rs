//! Captures that start mid-connection (issue 36): a tcpdump started during an incident, a
//! passive attach to clients already connected, a ring buffer's last minutes. Their SYNs —
//! the only packets that carry the window scale and the MSS — are not in the file, so the
//! raw window field is a lower bound of the window, never the window (tshark: "window size
//! scaling factor: -1 (unknown)").
//!
//! The offline tests cut real captures (the case's and the goldens') at frames along their
//! length with tshark, so each cut is a capture that began at that moment, and compare
//! lagtrace's findings on the cut with tshark's view of the whole file: a full window is
//! named only on a frame tshark, knowing the scale, also calls full; the receiver's zero
//! window is still found; the stalls that are not the window stay found. The live test
//! (root) captures the reference case after wrk's keep-alive connections are up, and runs
//! `diagnose --passive` with the clients started before and after its window.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use common::{BIN, analyze_json};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden")
        .join(name)
}

/// `src` from frame `skip + 1` on, in `dir`.
fn cut(src: &Path, skip: u64, dir: &Path) -> PathBuf {
    let out = dir.join(format!(
        "{}-from{}.pcap",
        src.file_stem().unwrap().to_string_lossy(),
        skip + 1
    ));
    lagtrace_testkit::capture_from_frame(src, skip, &out);
    out
}

/// Frames of the findings of `kind` (their first frame: where it began).
fn finding_frames(an: &Value, kind: &str) -> Vec<u64> {
    an["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .map(|f| f["frames"][0].as_u64().unwrap())
        .collect()
}

fn count(an: &Value, kind: &str) -> usize {
    finding_frames(an, kind).len()
}

fn frames(file: &Path) -> u64 {
    analyze_json(file)["frames"].as_u64().unwrap()
}

/// The cut's mid-connection streams are counted and said once; their scales are not
/// claimed known.
fn says_mid_connection(an: &Value, what: &str) {
    let mid = an["mid_connection_streams"].as_u64().unwrap();
    assert!(mid >= 1, "{what}: no stream counted mid-connection");
    let lines: Vec<&str> = an["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("started before the capture"))
        .collect();
    assert_eq!(lines.len(), 1, "{what}: {:?}", an["warnings"]);
    assert!(lines[0].starts_with(&format!("{mid} of ")), "{}", lines[0]);
    for st in an["streams"].as_array().unwrap() {
        if st["syn_a"].is_null() && st["syn_b"].is_null() {
            for side in ["scale_a", "scale_b"] {
                assert_ne!(st[side]["state"], "known", "{what}: {st}");
            }
        }
    }
}

/// A slow reader (a client whose receive buffer fills: 104 frames tshark calls
/// window-full, two zero windows): cut anywhere, every full window lagtrace names is one
/// tshark names on the whole file (where the scale is known), the zero windows after the
/// cut are still found, and each bounded finding says the scale was not captured.
#[test]
fn a_slow_reader_cut_anywhere_names_only_full_windows_tshark_confirms() {
    let src = golden("slow-reader.pcap");
    let whole = analyze_json(&src);
    let tshark_full = lagtrace_testkit::tshark_frames(&src, "tcp.analysis.window_full");
    let tshark_zero = lagtrace_testkit::tshark_frames(&src, "tcp.analysis.zero_window");
    assert_eq!(tshark_full.len(), 104, "the golden capture changed");
    // The whole file: the scale is known, and every window-full lagtrace names is tshark's.
    let known: BTreeSet<u64> = finding_frames(&whole, "window-full").into_iter().collect();
    assert!(!known.is_empty());
    assert!(known.is_subset(&tshark_full), "{known:?}");
    assert_eq!(whole["mid_connection_streams"], 0);
    let n = frames(&src);
    let dir = tempfile::tempdir().unwrap();
    let mut bounded_found = 0;
    for skip in [3, 10, n / 4, n / 2, 3 * n / 4] {
        let file = cut(&src, skip, dir.path());
        let an = analyze_json(&file);
        says_mid_connection(&an, &format!("cut at {skip}"));
        for f in an["findings"].as_array().unwrap() {
            if f["kind"] != "window-full" {
                continue;
            }
            let orig = f["frames"][0].as_u64().unwrap() + skip;
            assert!(
                tshark_full.contains(&orig),
                "cut at {skip}: window-full at frame {orig} of the whole file, which tshark does not call full: {f}"
            );
            assert!(
                f["explanation"]
                    .as_str()
                    .unwrap()
                    .contains("window scale not captured"),
                "{f}"
            );
            bounded_found += 1;
        }
        // A zero window is zero at any scale: those after the cut are still found.
        let zero_after = tshark_zero.iter().filter(|&&z| z > skip + 1).count();
        if zero_after > 0 {
            assert!(
                count(&an, "zero-window") >= 1,
                "cut at {skip}: {zero_after} zero windows after it, none found"
            );
        }
    }
    // The bounded scale is exact once the reader's window fills: the cuts still name it.
    assert!(bounded_found > 0, "no full window named on any cut");
}

/// The reference case (Nagle meets delayed ACK, no window ever full): cut after its
/// handshakes, it is still Nagle on every stalled response and never window-full —
/// tshark, with the scale unknown, calls no window full either.
#[test]
fn the_reference_case_cut_after_its_handshakes_is_still_nagle_and_never_window_full() {
    let src = lagtrace_testkit::case_pcap("nagle-delayed-ack.pcap");
    let whole = analyze_json(&src);
    let stalls = count(&whole, "nagle-delayed-ack");
    assert!(stalls > 0);
    let dir = tempfile::tempdir().unwrap();
    // Past every handshake (4 streams: 12 frames), and further in.
    for skip in [12, 40, 100] {
        let file = cut(&src, skip, dir.path());
        let an = analyze_json(&file);
        says_mid_connection(&an, &format!("cut at {skip}"));
        assert_eq!(count(&an, "window-full"), 0, "cut at {skip}");
        let tshark = lagtrace_testkit::tshark_frames(&file, "tcp.analysis.window_full");
        assert!(tshark.is_empty(), "{tshark:?}");
        // Every stall whose whole exchange is after the cut is still found.
        let after = finding_frames(&whole, "nagle-delayed-ack")
            .into_iter()
            .filter(|&f| f > skip + 3)
            .count();
        let found = count(&an, "nagle-delayed-ack");
        assert!(
            found >= after && found > 0,
            "cut at {skip}: {found} Nagle stalls, {after} after the cut in the whole file"
        );
    }
    // And `diagnose --pcap` on the cut names the same cause.
    let file = cut(&src, 12, dir.path());
    let out = Command::new(BIN)
        .args(["diagnose", "--pcap"])
        .arg(&file)
        .args(["--port", "8080", "--json", "-q"])
        .output()
        .expect("lagtrace");
    let j: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        j["verdict"]["cause"],
        "nagle-delayed-ack",
        "{}",
        common::evidence_lines(&j)
    );
}

/// Every golden capture cut after its first frames: no window-full where tshark (on the
/// whole file, scale known) has none, and the findings that are not the window keep their
/// kinds (a capture that misses the handshake misses no stall after it).
#[test]
fn no_golden_capture_gets_a_full_window_from_a_missing_handshake() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "cork.pcap",
        "loss.pcap",
        "nagle-split.pcap",
        "think-time.pcap",
        "copy-id-zero.pcap",
    ] {
        let src = golden(name);
        let tshark_full = lagtrace_testkit::tshark_frames(&src, "tcp.analysis.window_full");
        let whole = analyze_json(&src);
        for skip in [3, 8] {
            let an = analyze_json(&cut(&src, skip, dir.path()));
            says_mid_connection(&an, &format!("{name} cut at {skip}"));
            for f in finding_frames(&an, "window-full") {
                assert!(
                    tshark_full.contains(&(f + skip)),
                    "{name} cut at {skip}: {f}"
                );
            }
            for kind in ["nagle-delayed-ack", "tcp-cork", "retransmission"] {
                let after = finding_frames(&whole, kind)
                    .into_iter()
                    .filter(|&f| f > skip + 3)
                    .count();
                if after > 0 {
                    assert!(
                        count(&an, kind) > 0,
                        "{name} cut at {skip}: {after} {kind} after the cut, none found"
                    );
                }
            }
        }
    }
}
