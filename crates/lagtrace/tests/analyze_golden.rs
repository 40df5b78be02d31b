//! Golden text outputs of `lagtrace analyze` (the table and every finding with `-v`, a flow
//! graph, a followed stream) over the repository's captures, byte for byte. The JSON goldens
//! are checked in `crates/packet/tests/golden.rs`; this covers the renderers on top.
//!
//! To accept a deliberate change, regenerate and review the diff:
//! `LAGTRACE_BLESS=1 cargo test --release -p lagtrace --test analyze_golden`

use std::path::{Path, PathBuf};
use std::process::Command;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// (golden file name, arguments after `analyze`, capture relative to testdata/)
const CASES: [(&str, &[&str], &str); 10] = [
    (
        "nagle-delayed-ack.v.txt",
        &["-v"],
        "case/nagle-delayed-ack.pcap",
    ),
    ("healthy.v.txt", &["-v"], "case/healthy.pcap"),
    ("nagle-split.v.txt", &["-v"], "golden/nagle-split.pcap"),
    ("think-time.v.txt", &["-v"], "golden/think-time.pcap"),
    ("cork.v.txt", &["-v"], "golden/cork.pcap"),
    ("loss.v.txt", &["-v"], "golden/loss.pcap"),
    ("slow-reader.v.txt", &["-v"], "golden/slow-reader.pcap"),
    (
        "nagle-delayed-ack.flow1.txt",
        &["--flow", "--stream", "1"],
        "case/nagle-delayed-ack.pcap",
    ),
    (
        "slow-reader.flow0.txt",
        &["--flow", "--stream", "0"],
        "golden/slow-reader.pcap",
    ),
    (
        "nagle-split.follow1.txt",
        &["--follow", "1"],
        "golden/nagle-split.pcap",
    ),
];

#[test]
fn analyze_text_is_unchanged() {
    let bless = std::env::var_os("LAGTRACE_BLESS").is_some_and(|v| v == "1");
    let mut changed = Vec::new();
    for (name, args, pcap) in CASES {
        let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .arg("analyze")
            .args(args)
            .arg(testdata().join(pcap))
            .output()
            .unwrap();
        // Exit status 1 means findings; 2 would be an error.
        assert!(out.status.code().is_some_and(|c| c < 2), "{name}: {out:?}");
        let got = String::from_utf8(out.stdout).unwrap();
        assert!(!got.is_empty(), "{name}: no output");
        let golden = testdata().join("golden/text").join(name);
        if bless {
            std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
            std::fs::write(&golden, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (LAGTRACE_BLESS=1 writes it)", golden.display()));
        if got != want {
            let line = got.lines().zip(want.lines()).position(|(a, b)| a != b);
            changed.push(format!("{name}: first difference at line {line:?}"));
        }
    }
    assert!(
        changed.is_empty(),
        "golden text outputs changed:\n{}",
        changed.join("\n")
    );
}
