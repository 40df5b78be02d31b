//! `lagtrace analyze` on the reference captures, checked against tshark, and on bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};

use lagtrace_testkit::case_pcap as case_file;

fn lagtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(args)
        .output()
        .expect("run lagtrace")
}

fn json(file: &Path) -> serde_json::Value {
    let out = lagtrace(&["analyze", "--json", file.to_str().unwrap()]);
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

fn tshark(args: &[&str]) -> String {
    let out = Command::new("tshark")
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Rows of `tshark -q -z conv,tcp`: (A, B, frames B->A, frames A->B, bytes text each way, start).
fn conv_rows(file: &Path) -> Vec<(String, String, u64, String, u64, String, String)> {
    let text = tshark(&["-r", file.to_str().unwrap(), "-q", "-z", "conv,tcp"]);
    let mut rows = Vec::new();
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 12 || t[1] != "<->" {
            continue;
        }
        // A <-> B  fr_in bytes unit  fr_out bytes unit  fr_tot bytes unit  start dur
        rows.push((
            t[0].to_string(),
            t[2].to_string(),
            t[3].parse().unwrap(),
            format!("{} {}", t[4], t[5]),
            t[6].parse().unwrap(),
            format!("{} {}", t[7], t[8]),
            t[12].to_string(),
        ));
    }
    rows
}

fn check_conv(file: &Path) {
    let an = json(file);
    let rows = conv_rows(file);
    let streams = an["streams"].as_array().unwrap();
    assert_eq!(streams.len(), rows.len(), "stream count vs conv,tcp");
    let out = lagtrace(&["analyze", file.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    for r in &rows {
        let s = streams
            .iter()
            .find(|s| s["a"] == r.0.as_str() && s["b"] == r.1.as_str())
            .unwrap_or_else(|| panic!("conv row {} <-> {} not found", r.0, r.1));
        assert_eq!(s["frames_ba"].as_u64().unwrap(), r.2, "{r:?}");
        assert_eq!(s["frames_ab"].as_u64().unwrap(), r.4, "{r:?}");
        let start = s["start_us"].as_i64().unwrap() as f64 / 1e6;
        assert!((start - r.6.parse::<f64>().unwrap()).abs() < 1e-6, "{r:?}");
        // The human-readable byte columns appear in our table the same way.
        let line = table
            .lines()
            .find(|l| l.contains(&r.0) && l.contains(&r.1))
            .expect("row in table");
        assert!(
            line.contains(&r.3) && line.contains(&r.5),
            "{line} vs {r:?}"
        );
    }
}

#[test]
fn stream_table_matches_tshark_conv_tcp() {
    check_conv(&case_file("nagle-delayed-ack.pcap"));
    check_conv(&case_file("healthy.pcap"));
}

/// HTTP requests per stream as tshark dissects them.
fn tshark_requests(file: &Path) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for l in tshark(&[
        "-r",
        file.to_str().unwrap(),
        "-Y",
        "http.request",
        "-T",
        "fields",
        "-e",
        "tcp.stream",
    ])
    .lines()
    {
        *m.entry(l.trim().parse().unwrap()).or_insert(0) += 1;
    }
    m
}

#[test]
fn names_nagle_delayed_ack_on_every_keepalive_request_after_the_first() {
    let file = case_file("nagle-delayed-ack.pcap");
    let an = json(&file);
    let reqs = tshark_requests(&file);
    let expected: u64 = reqs.values().map(|n| n.saturating_sub(1)).sum();
    assert!(expected > 0);
    let findings = an["findings"].as_array().unwrap();
    let nda: Vec<_> = findings
        .iter()
        .filter(|f| f["kind"] == "nagle-delayed-ack")
        .collect();
    // One per request after the first on each stream, none on a first request.
    let mut per_stream: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for f in &nda {
        let txn = f["transaction"]
            .as_u64()
            .expect("finding names its transaction");
        assert!(txn >= 1, "first request on a connection flagged: {f}");
        assert!(
            per_stream
                .entry(f["stream"].as_u64().unwrap())
                .or_default()
                .insert(txn),
            "transaction counted twice: {f}"
        );
        // Evidence: the stall is the delayed-ACK order of magnitude (40 ms), not noise.
        let cost = f["cost_us"].as_u64().unwrap();
        assert!((30_000..250_000).contains(&cost), "{f}");
        assert!(f["frames"].as_array().unwrap().len() >= 3);
    }
    for (s, n) in &reqs {
        assert_eq!(
            per_stream.get(s).map_or(0, |t| t.len() as u64),
            n - 1,
            "stream {s}: {n} requests"
        );
    }
    assert_eq!(nda.len() as u64, expected);
    let summary = an["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "nagle-delayed-ack")
        .expect("summary row");
    assert_eq!(summary["transactions_affected"].as_u64(), Some(expected));
    let median = summary["median_us"].as_u64().unwrap();
    assert!((35_000..60_000).contains(&median), "median {median}");
    // Text output names it too, and the exit status says a problem was found.
    let out = lagtrace(&["analyze", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nagle-delayed-ack"), "{text}");
}

#[test]
fn healthy_capture_has_no_nagle_or_delayed_ack() {
    let an = json(&case_file("healthy.pcap"));
    for f in an["findings"].as_array().unwrap() {
        let k = f["kind"].as_str().unwrap();
        assert!(
            ![
                "nagle-delayed-ack",
                "nagle-stall",
                "delayed-ack",
                "slow-server",
                "tcp-cork"
            ]
            .contains(&k),
            "unexpected {f}"
        );
    }
    // Its transactions are all complete and quick (the good server answers in well under 10 ms).
    let txns = an["transactions"].as_array().unwrap();
    assert_eq!(
        an["transactions_total"].as_u64().unwrap() as usize,
        txns.len()
    );
    let reqs: u64 = tshark_requests(&case_file("healthy.pcap")).values().sum();
    assert_eq!(txns.len() as u64, reqs);
    assert!(txns.iter().all(|t| {
        t["request_line"]
            .as_str()
            .is_some_and(|l| l.starts_with("GET / HTTP/1.1"))
    }));
}

#[test]
fn flow_and_follow_show_the_stall() {
    let f = case_file("nagle-delayed-ack.pcap");
    let out = lagtrace(&["analyze", f.to_str().unwrap(), "--stream", "1", "--flow"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("A = 10.200.0.1:40792"), "{text}");
    // The delayed ACK line: ~40+ ms gap, marked.
    let marked: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("<< gap") && l.contains("nagle-delayed-ack"))
        .collect();
    assert!(marked.len() >= 20, "{text}");
    let out = lagtrace(&["analyze", f.to_str().unwrap(), "--follow", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("GET / HTTP/1.1").count(), 22);
    assert!(text.contains("HTTP/1.1 200 OK"));
    assert!(
        text.contains("bytes not captured"),
        "snaplen 200 cut the responses"
    );
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture file at all").unwrap();
    let empty = dir.path().join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    for p in [
        junk.to_str().unwrap(),
        empty.to_str().unwrap(),
        "/nonexistent/x.pcap",
    ] {
        let out = lagtrace(&["analyze", p]);
        assert_eq!(out.status.code(), Some(2), "{p}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("lagtrace: error: "), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let out = lagtrace(&[
        "analyze",
        case_file("healthy.pcap").to_str().unwrap(),
        "--follow",
        "99",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn damaged_files_are_analyzed_up_to_the_damage() {
    let src = std::fs::read(case_file("nagle-delayed-ack.pcap")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Cut in the middle of the last record.
    let cut = dir.path().join("cut.pcap");
    std::fs::write(&cut, &src[..src.len() - 30]).unwrap();
    let out = lagtrace(&["analyze", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: file truncated"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("nagle-delayed-ack"));
    // Unknown link type in the file header: every frame skipped with a warning, no panic.
    let mut lt = src.clone();
    lt[20..24].copy_from_slice(&147u32.to_le_bytes());
    let ltf = dir.path().join("lt.pcap");
    std::fs::write(&ltf, &lt).unwrap();
    let out = lagtrace(&["analyze", ltf.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown link type 147"));
    // Corrupt record header in the middle: what came before is analyzed.
    let mut bad = src.clone();
    let mid = 24 + 16 + 74; // second record header
    bad[mid + 8..mid + 12].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let badf = dir.path().join("bad.pcap");
    std::fs::write(&badf, &bad).unwrap();
    let out = lagtrace(&["analyze", badf.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupt record header"));
    // Every prefix of the file: never a panic (exit 0, 1 or 2 only).
    for n in (0..src.len()).step_by(997) {
        let p = dir.path().join("prefix.pcap");
        std::fs::write(&p, &src[..n]).unwrap();
        let out = lagtrace(&["analyze", p.to_str().unwrap()]);
        assert!(matches!(out.status.code(), Some(0..=2)), "prefix {n}");
    }
}

#[test]
fn annotate_comments_every_finding_frame_for_wireshark() {
    let f = case_file("nagle-delayed-ack.pcap");
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("annotated.pcapng");
    let out = lagtrace(&[
        "analyze",
        f.to_str().unwrap(),
        "--annotate",
        out_file.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let an = json(&f);
    let expected: BTreeSet<u64> = an["findings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| {
            f["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
        })
        .collect();
    let text = tshark(&[
        "-r",
        out_file.to_str().unwrap(),
        "-Y",
        "frame.comment",
        "-T",
        "fields",
        "-e",
        "frame.number",
        "-e",
        "frame.comment",
    ]);
    let mut got = BTreeSet::new();
    for l in text.lines() {
        let (n, c) = l.split_once('\t').unwrap();
        assert!(c.starts_with("lagtrace: nagle-delayed-ack"), "{c}");
        got.insert(n.parse::<u64>().unwrap());
    }
    assert_eq!(got, expected);
    // The annotated copy holds the same packets: same analysis.
    let again = json(&out_file);
    assert_eq!(again["findings"], an["findings"]);
}

/// Each stream's SYN → SYN-ACK at the capture point (`streams[].syn_synack_us`: the most
/// recent SYN before the first SYN-ACK) equals the same difference of tshark's frame times,
/// on every reference capture with handshakes.
#[test]
fn syn_to_syn_ack_gaps_match_tshark_frame_times() {
    let mut compared = 0;
    for name in ["healthy.pcap", "nagle-delayed-ack.pcap"] {
        let file = case_file(name);
        // (stream, epoch µs) of SYNs and of SYN-ACKs, in frame order.
        let rows = lagtrace_testkit::tshark_fields_first(
            &file,
            Some("tcp.flags.syn == 1"),
            &["tcp.stream", "frame.time_epoch", "tcp.flags.ack"],
        );
        let mut syn: BTreeMap<u64, f64> = BTreeMap::new();
        let mut want: BTreeMap<u64, u64> = BTreeMap::new();
        for r in &rows {
            let (stream, t) = (r[0].parse::<u64>().unwrap(), r[1].parse::<f64>().unwrap());
            let ack = r[2] == "1" || r[2] == "True";
            match (ack, syn.get(&stream)) {
                (false, _) if !want.contains_key(&stream) => {
                    syn.insert(stream, t);
                }
                (true, Some(s)) if !want.contains_key(&stream) => {
                    want.insert(stream, ((t - s) * 1e6).round() as u64);
                }
                _ => {}
            }
        }
        let j = json(&file);
        for s in j["streams"].as_array().unwrap() {
            let stream = s["stream"].as_u64().unwrap();
            assert_eq!(
                s["syn_synack_us"].as_u64(),
                want.get(&stream).copied(),
                "{name} stream {stream}"
            );
        }
        compared += want.len();
    }
    assert!(compared >= 2, "no handshakes compared");
}
