//! Cross-checks of the library against tshark on the reference captures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use lagtrace_packet::{AnalyzeOptions, analyze_file};
use lagtrace_testkit::{case_pcap as case_file, tshark_fields, tshark_frames};

/// Per-stream frames and bytes each way, from tshark's per-packet view.
fn tshark_streams(file: &Path) -> BTreeMap<u32, (String, u64, u64, u64, u64)> {
    let mut m: BTreeMap<u32, (String, u64, u64, u64, u64)> = BTreeMap::new();
    for r in tshark_fields(
        file,
        Some("tcp"),
        &[
            "tcp.stream",
            "frame.len",
            "ip.src",
            "ipv6.src",
            "tcp.srcport",
        ],
    ) {
        let s: u32 = r[0].parse().unwrap();
        let len: u64 = r[1].parse().unwrap();
        let src = format!("{}{}:{}", r[2], r[3], r[4]);
        let e = m.entry(s).or_insert_with(|| (src.clone(), 0, 0, 0, 0));
        if e.0 == src {
            e.1 += 1;
            e.2 += len;
        } else {
            e.3 += 1;
            e.4 += len;
        }
    }
    m
}

fn check_streams(file: &Path) {
    let an = analyze_file(file, &AnalyzeOptions::default()).unwrap();
    let ts = tshark_streams(file);
    assert_eq!(an.streams.len(), ts.len(), "stream count");
    for s in &an.streams {
        let t = &ts[&s.stream];
        assert_eq!(t.0, s.a.to_string(), "stream {} endpoint A", s.stream);
        assert_eq!(
            (t.1, t.2, t.3, t.4),
            (s.frames_ab, s.bytes_ab, s.frames_ba, s.bytes_ba),
            "stream {} frames/bytes each way",
            s.stream
        );
    }
}

#[test]
fn streams_match_tshark_on_reference_captures() {
    check_streams(&case_file("nagle-delayed-ack.pcap"));
    check_streams(&case_file("healthy.pcap"));
}

fn check_ack_rtt(file: &Path) {
    let all = analyze_file(file, &AnalyzeOptions::default()).unwrap();
    let mut ours: BTreeMap<u64, u64> = BTreeMap::new();
    for s in &all.streams {
        let an = analyze_file(
            file,
            &AnalyzeOptions {
                keep_stream: Some(s.stream),
                ..AnalyzeOptions::default()
            },
        )
        .unwrap();
        ours.extend(an.ack_rtts_us.iter().copied());
    }
    let theirs: BTreeMap<u64, f64> = tshark_fields(
        file,
        Some("tcp.analysis.ack_rtt"),
        &["frame.number", "tcp.analysis.ack_rtt"],
    )
    .into_iter()
    .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
    .collect();
    assert!(!theirs.is_empty());
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "frames with an ACK RTT"
    );
    for (f, t) in &theirs {
        // Both in whole µs (the JSON contract's `*_us`), rounded alike.
        let (o, t) = (ours[f], (t * 1e6).round() as u64);
        assert_eq!(o, t, "frame {f}: ack_rtt {o} µs vs tshark {t} µs");
    }
}

#[test]
fn ack_rtt_matches_tshark() {
    check_ack_rtt(&case_file("nagle-delayed-ack.pcap"));
    check_ack_rtt(&case_file("healthy.pcap"));
}

#[test]
fn retransmissions_match_tshark_on_healthy_capture() {
    // healthy.pcap happens to hold three real retransmissions (one spurious).
    let file = case_file("healthy.pcap");
    let an = analyze_file(&file, &AnalyzeOptions::default()).unwrap();
    let ours: BTreeSet<u64> = an.retransmitted_frames.iter().copied().collect();
    let theirs: BTreeSet<u64> = tshark_frames(
        &file,
        "tcp.analysis.retransmission || tcp.analysis.fast_retransmission",
    );
    assert!(!theirs.is_empty());
    assert_eq!(ours, theirs);
    let spurious: BTreeSet<u64> = tshark_frames(&file, "tcp.analysis.spurious_retransmission");
    let ours_spurious: BTreeSet<u64> = an
        .findings
        .iter()
        .filter(|f| f.detail.as_deref() == Some("spurious"))
        .filter_map(|f| f.frames.last().copied())
        .collect();
    assert_eq!(ours_spurious, spurious);
}

/// The same packets as pcapng (editcap) and with nanosecond timestamps give the same analysis.
#[test]
fn pcapng_and_nanosecond_copies_agree() {
    let src = case_file("nagle-delayed-ack.pcap");
    let dir = tempfile::tempdir().unwrap();
    let base = analyze_file(&src, &AnalyzeOptions::default()).unwrap();
    for (name, args) in [
        ("ng.pcapng", vec!["-F", "pcapng"]),
        ("ns.pcap", vec!["-F", "nsecpcap"]),
    ] {
        let out = dir.path().join(name);
        let st = Command::new("editcap")
            .args(&args)
            .arg(&src)
            .arg(&out)
            .status()
            .expect("run editcap");
        assert!(st.success());
        let an = analyze_file(&out, &AnalyzeOptions::default()).unwrap();
        assert_eq!(an.frames, base.frames, "{name}");
        assert_eq!(an.streams.len(), base.streams.len());
        for (a, b) in an.streams.iter().zip(&base.streams) {
            assert_eq!(
                (a.frames_ab, a.bytes_ab, a.frames_ba, a.bytes_ba, a.start_us),
                (b.frames_ab, b.bytes_ab, b.frames_ba, b.bytes_ba, b.start_us)
            );
        }
        assert_eq!(an.summary.len(), base.summary.len());
        assert_eq!(an.findings.len(), base.findings.len());
        assert!(an.warnings.is_empty(), "{:?}", an.warnings);
    }
}

/// pcapng with two interfaces of different link types: the Ethernet capture merged with a
/// raw-IP copy of itself (editcap strips the Ethernet header), frames interleaved by time.
#[test]
fn pcapng_with_two_interfaces_and_link_types() {
    let src = case_file("healthy.pcap");
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw.pcap");
    // Strip 14 bytes of Ethernet and relabel as raw IP.
    let st = Command::new("editcap")
        .args(["-C", "14", "-T", "rawip"])
        .arg(&src)
        .arg(&raw)
        .status()
        .expect("run editcap");
    assert!(st.success());
    let merged = dir.path().join("merged.pcapng");
    let st = Command::new("mergecap")
        .args(["-F", "pcapng", "-w"])
        .arg(&merged)
        .arg(&src)
        .arg(&raw)
        .status()
        .expect("run mergecap");
    assert!(st.success());
    let an = analyze_file(&merged, &AnalyzeOptions::default()).unwrap();
    let base = analyze_file(&src, &AnalyzeOptions::default()).unwrap();
    assert_eq!(an.frames, 2 * base.frames);
    assert_eq!(an.tcp_frames, 2 * base.tcp_frames, "{:?}", an.warnings);
    // Each packet is in the file twice, once per interface: the copies are capture
    // artifacts, not traffic (issue 14). The streams are tshark's (it counts the copies as
    // packets and flags them as retransmissions, so its counts are no reference here) and
    // each is analyzed once, exactly as in the single capture.
    assert_eq!(
        an.streams.len(),
        tshark_streams(&merged).len(),
        "stream count"
    );
    assert_eq!(an.streams.len(), base.streams.len());
    for (m, b) in an.streams.iter().zip(&base.streams) {
        assert_eq!(
            (m.a, m.frames_ab, m.frames_ba, m.payload_ab, m.payload_ba),
            (b.a, b.frames_ab, b.frames_ba, b.payload_ab, b.payload_ba),
            "stream {}",
            m.stream
        );
        assert_eq!(m.retransmissions, b.retransmissions, "stream {}", m.stream);
    }
    let kinds =
        |a: &lagtrace_packet::Analysis| a.findings.iter().map(|f| f.kind).collect::<Vec<_>>();
    assert_eq!(kinds(&an), kinds(&base));
    assert_eq!(an.transactions_total, base.transactions_total);
    let copies = format!("{} frames were a second capture", base.tcp_frames);
    assert!(
        an.warnings.iter().any(|w| w.starts_with(&copies)),
        "{:?}",
        an.warnings
    );
}

/// Per-transaction timings on the reference case: every time is the tshark time of the
/// transaction's frame, the handshake is tshark's SYN, and every request after the first on
/// a connection holds its response's body until the delayed ACK, the first none.
#[test]
fn timings_are_the_frames_times_and_the_nagle_hold_on_the_reference_case() {
    let file = case_file("nagle-delayed-ack.pcap");
    let opts = AnalyzeOptions {
        timings: true,
        ..AnalyzeOptions::default()
    };
    let an = analyze_file(&file, &opts).unwrap();
    assert_eq!(an.timings.len(), an.transactions.len());
    // tshark's relative time of every frame, µs.
    let times: Vec<i64> = tshark_fields(&file, None, &["frame.time_relative"])
        .iter()
        .map(|r| (r[0].parse::<f64>().unwrap() * 1e6).round() as i64)
        .collect();
    let at = |f: Option<u64>| f.map(|f| times[f as usize - 1]);
    let syns: BTreeMap<u32, i64> = tshark_fields(
        &file,
        Some("tcp.flags.syn == 1 && tcp.flags.ack == 0"),
        &["tcp.stream", "frame.time_relative"],
    )
    .iter()
    .map(|r| {
        (
            r[0].parse().unwrap(),
            (r[1].parse::<f64>().unwrap() * 1e6).round() as i64,
        )
    })
    .collect();
    let mut held = 0;
    for (t, tx) in an.timings.iter().zip(&an.transactions) {
        assert_eq!((t.stream, t.index), (tx.stream, tx.index));
        let close = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() <= 1,
            (a, b) => a == b,
        };
        for (mine, frame) in [
            (t.request_first_at_us, tx.request_first_frame),
            (t.request_last_at_us, tx.request_last_frame),
            (t.response_first_at_us, tx.response_first_frame),
            (t.response_last_at_us, tx.response_last_frame),
        ] {
            assert!(close(mine, at(frame)), "{t:?} frame {frame:?}");
        }
        assert!(close(t.syn_at_us, syns.get(&t.stream).copied()), "{t:?}");
        assert_eq!(t.syn_retransmits, 0);
        if t.index == 0 || tx.response_first_frame.is_none() {
            assert_eq!(t.hold_response_us, 0, "{t:?}");
        } else if t.response_last_at_us > t.response_first_at_us {
            // Held from the headers until the body left: all of the response's time on the
            // wire but the path's.
            let span = t.response_last_at_us.unwrap() - t.response_first_at_us.unwrap();
            let hold = t.hold_response_us as i64;
            assert!(
                hold >= 20_000 && hold <= span && hold >= span - 1_000,
                "{t:?}"
            );
            held += 1;
        }
        assert_eq!((t.loss_request_us, t.loss_response_us), (0, 0), "{t:?}");
    }
    assert!(held >= 20, "{held} held responses");
}
