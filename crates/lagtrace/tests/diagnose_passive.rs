//! `lagtrace diagnose --passive` / `--pcap`: the verdict from real clients' traffic, no
//! request sent. `--pcap` on the case's captures (no root); live runs (root) watch wrk —
//! a client that is not lagtrace, bounded in rate and time — against lab servers, and
//! compare with wrk's own count, with tshark's view of the same traffic, and with the
//! active diagnosis of the same server.

mod common;

use std::process::Command;

use serde_json::Value;

use common::BIN;

/// `lagtrace diagnose ARGS --json -q`: exit code, JSON, stderr.
fn passive_json(args: &[&str]) -> (i32, Value, String) {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("diagnose")
        .args(args)
        .args(["--json", "-q"])
        .env("XDG_STATE_HOME", home.path())
        .output()
        .expect("run lagtrace");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let j = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "diagnose {args:?}: not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), j, stderr)
}

fn cause(j: &Value) -> &str {
    j["verdict"]["cause"].as_str().unwrap_or("")
}

/// tshark's count of requests to `port` in a capture: the clients' data segments that are
/// not retransmissions (each request is one segment; the captures' snaplen truncates HTTP
/// for tshark's own dissector).
fn tshark_requests(file: &std::path::Path, port: u16) -> usize {
    let f = format!("tcp.dstport=={port} && tcp.len>0 && !tcp.analysis.retransmission");
    lagtrace_testkit::tshark_fields(file, Some(&f), &["frame.number"]).len()
}

#[test]
fn the_reference_capture_is_nagle_delayed_ack_from_packets_alone() {
    let pcap = lagtrace_testkit::case_pcap("nagle-delayed-ack.pcap");
    let (code, j, err) = passive_json(&["--pcap", pcap.to_str().unwrap(), "--port", "8080"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        cause(&j),
        "nagle-delayed-ack",
        "{}",
        common::evidence_lines(&j)
    );
    let l = &j["layers"];
    // Packets only: the layers a file cannot have say so, and nothing was probed.
    for layer in ["path", "sockets", "host"] {
        assert_eq!(l[layer]["status"], "skipped", "{layer}: {}", l[layer]);
        assert!(l[layer]["reason"].as_str().is_some_and(|r| !r.is_empty()));
    }
    assert!(l["app"]["data"]["c1"].is_null());
    let run = &l["app"]["data"]["cn"];
    assert!(
        run["passive"]["source"]
            .as_str()
            .unwrap()
            .contains("nagle-delayed-ack.pcap")
    );
    assert_eq!(
        run["passive"]["server"]
            .as_str()
            .unwrap()
            .rsplit(':')
            .next(),
        Some("8080")
    );
    // Every response the peer sees is a passive request, the p50 carries the ~40 ms hold.
    let requests = run["requests"].as_u64().unwrap() as usize;
    assert_eq!(requests, tshark_requests(&pcap, 8080));
    let p50 = run["latency"]["p50_us"].as_u64().unwrap();
    assert!((40_000..60_000).contains(&p50), "{}", run["latency"]);
    // The records join their own transactions on one clock.
    let join = &l["packets"]["data"]["joins"][0];
    assert_eq!(join["offset_us"], 0, "{join}");
    assert_eq!(
        join["matched"].as_u64(),
        Some(run["records"]["records"].as_array().unwrap().len() as u64)
    );
}

#[test]
fn the_healthy_capture_is_healthy() {
    let pcap = lagtrace_testkit::case_pcap("healthy.pcap");
    let (code, j, err) = passive_json(&["--pcap", pcap.to_str().unwrap(), "--port", "80"]);
    assert_eq!(
        (code, cause(&j)),
        (0, "healthy"),
        "{err}\n{}",
        common::evidence_lines(&j)
    );
    let run = &j["layers"]["app"]["data"]["cn"];
    // The capture ends mid-exchange: its last request has no response (counted apart).
    let seen = run["requests"].as_u64().unwrap() + run["passive"]["incomplete"].as_u64().unwrap();
    assert_eq!(seen as usize, tshark_requests(&pcap, 80));
}

#[test]
fn bad_passive_arguments_are_one_line_errors() {
    let healthy = lagtrace_testkit::case_pcap("healthy.pcap");
    let healthy = healthy.to_str().unwrap();
    for args in [
        &["--pcap", "/nonexistent.pcap", "--port", "80"][..],
        &["--pcap", "/etc/hostname", "--port", "80"][..],
        &["--pcap", healthy][..],
        // The port selects the server: none on another port is no verdict (not healthy).
        &["--pcap", healthy, "--port", "81"][..],
        &["--passive", "--port", "80"][..],
        &["--passive", "--netns", "x"][..],
    ] {
        let out = Command::new(BIN)
            .arg("diagnose")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.trim().is_empty() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}
