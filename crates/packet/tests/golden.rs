//! Golden outputs: `lagtrace analyze --json` of the repository's captures must not change
//! unless a change means to. The captures are `testdata/case/*.pcap` (the reference case) and
//! `testdata/golden/*.pcap` (real kernel traffic recorded by `testdata/golden/record.sh`: Nagle
//! meeting delayed ACK, think time, TCP_CORK, loss with a dropped SYN, a slow reader).
//!
//! For each capture the expected JSON is `testdata/golden/NAME.analyze.json` (what
//! `lagtrace analyze --json NAME.pcap` prints: the same options and the same serializer), and
//! for a few also `NAME.streamN.analyze.json` with stream N kept (what `--flow`/`--follow`
//! read: its packets, marks and ACK RTTs).
//!
//! To accept a deliberate change, regenerate and review the diff:
//! `LAGTRACE_BLESS=1 cargo test --release -p lagtrace-packet --test golden`

use std::path::{Path, PathBuf};

use lagtrace_packet::{AnalyzeOptions, analyze_file};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// The captures, with the streams kept in detail for some of them.
fn cases() -> Vec<(PathBuf, Option<u32>)> {
    let mut v = Vec::new();
    for dir in ["case", "golden"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(testdata().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
            .collect();
        files.sort();
        v.extend(files.into_iter().map(|p| (p, None)));
    }
    v.push((testdata().join("case/nagle-delayed-ack.pcap"), Some(1)));
    v.push((testdata().join("golden/slow-reader.pcap"), Some(0)));
    v.push((testdata().join("golden/loss.pcap"), Some(2)));
    v
}

/// As `lagtrace analyze --json` prints it.
fn analyze_json(pcap: &Path, keep_stream: Option<u32>) -> String {
    let opts = AnalyzeOptions {
        keep_stream,
        ..AnalyzeOptions::default()
    };
    let an = analyze_file(pcap, &opts).unwrap();
    let mut s = serde_json::to_string_pretty(&an).unwrap();
    s.push('\n');
    s
}

#[test]
fn analyze_json_is_unchanged() {
    let bless = std::env::var_os("LAGTRACE_BLESS").is_some_and(|v| v == "1");
    let cases = cases();
    assert!(cases.len() >= 7 + 3, "captures missing: {cases:?}");
    let mut changed = Vec::new();
    for (pcap, keep) in cases {
        let stem = pcap.file_stem().unwrap().to_string_lossy().into_owned();
        let name = match keep {
            Some(n) => format!("{stem}.stream{n}.analyze.json"),
            None => format!("{stem}.analyze.json"),
        };
        let golden = testdata().join("golden").join(&name);
        let got = analyze_json(&pcap, keep);
        if bless {
            std::fs::write(&golden, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (LAGTRACE_BLESS=1 writes it)", golden.display()));
        if got != want {
            let line = got
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            changed.push(format!(
                "{name}: first difference at line {}: got {:?}, want {:?}",
                line + 1,
                got.lines().nth(line),
                want.lines().nth(line)
            ));
        }
    }
    assert!(
        changed.is_empty(),
        "golden outputs changed:\n{}",
        changed.join("\n")
    );
}

/// The goldens are not empty shells: each recorded capture shows the kind it was made for.
#[test]
fn golden_captures_show_their_kinds() {
    let want = [
        ("case/nagle-delayed-ack.pcap", "nagle-delayed-ack"),
        ("golden/nagle-split.pcap", "nagle-delayed-ack"),
        ("golden/think-time.pcap", "slow-server"),
        ("golden/cork.pcap", "tcp-cork"),
        ("golden/loss.pcap", "retransmission"),
        ("golden/loss.pcap", "syn-retransmit"),
        ("golden/slow-reader.pcap", "window-full"),
        ("golden/slow-reader.pcap", "zero-window"),
    ];
    for (file, kind) in want {
        let an = analyze_file(&testdata().join(file), &AnalyzeOptions::default()).unwrap();
        assert!(
            an.summary.iter().any(|s| s.kind == kind && s.findings > 0),
            "{file}: no {kind}: {:?}",
            an.summary
        );
    }
}

/// `copy-id-zero.pcap`: 91 frames cut from a real `any` capture of a 4 MB download at c=64
/// through a bridge (snaplen 96): every segment seen twice, and one 64 KB super-segment whose
/// IPv4 identification came round to 0 was captured again after two of the client's ACKs,
/// written by another CPU between its copies. It is one send, not a resend (the kernel's
/// TcpRetransSegs and the capture on the veth alone agreed; tshark marks the copy as a
/// retransmission).
#[test]
fn a_copy_numbered_zero_is_not_a_resend() {
    let an = analyze_file(
        &testdata().join("golden/copy-id-zero.pcap"),
        &AnalyzeOptions::default(),
    )
    .unwrap();
    assert!(an.findings.is_empty(), "{:?}", an.findings);
    assert!(
        an.warnings
            .iter()
            .any(|w| w.starts_with("45 frames were a second capture")),
        "{:?}",
        an.warnings
    );
}
