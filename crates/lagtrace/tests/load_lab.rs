//! `lagtrace load` against the lab's real nginx (good :80, latency :8080 with
//! `tcp_nodelay off`), cross-checked with nginx's access log and with wrk.

use std::process::Command;

use lagtrace_lab::{Lab, LabOptions, state_dir};

fn lab(test: &str) -> Lab {
    Lab::up(&LabOptions::new(&format!("ld{test}{}", std::process::id()))).expect("lab up")
}

fn load_json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .arg("load")
        .arg("--json")
        .args(args)
        .output()
        .expect("run lagtrace");
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).expect("JSON report")
}

fn access_log_lines(lab: &Lab, role: &str) -> u64 {
    let f = state_dir(lab.name())
        .join(format!("nginx-{role}"))
        .join("access.log");
    std::fs::read_to_string(&f).map_or(0, |s| s.lines().count() as u64)
}

/// wrk's "Latency Distribution" value at `pct` ("50%"), in µs.
fn wrk_percentile(out: &str, pct: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pct))
        .unwrap_or_else(|| panic!("no {pct} in wrk output:\n{out}"));
    let v = line.split_whitespace().nth(1).unwrap();
    let (num, mult) = if let Some(n) = v.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else {
        (v.strip_suffix('s').unwrap(), 1e6)
    };
    num.parse::<f64>().unwrap() * mult
}

fn wrk(args: &[&str]) -> String {
    let o = Command::new("wrk").args(args).output().expect("run wrk");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
#[ignore = "needs root"]
fn request_counts_match_nginx_access_log_and_n_is_exact() {
    let lab = lab("cnt");
    let before = access_log_lines(&lab, "good");
    let v = load_json(&["-n", "3000", "-c", "20", "-t", "2", &lab.good_url()]);
    assert_eq!(v["requests"], 3000);
    assert_eq!(v["errors"]["timeout"], 0);
    assert_eq!(v["status_codes"]["200"], 3000);
    assert_eq!(
        access_log_lines(&lab, "good") - before,
        3000,
        "nginx logged every request"
    );

    // A timed run: what nginx logged is what completed, plus at most one in-flight request
    // per connection at the end — the same bound wrk meets.
    let before = access_log_lines(&lab, "good");
    let v = load_json(&["-d", "1s", "-c", "20", "-t", "2", &lab.good_url()]);
    let n = v["requests"].as_u64().unwrap();
    let logged = access_log_lines(&lab, "good") - before;
    assert!(
        n > 100 && logged >= n && logged <= n + 20,
        "client {n}, nginx {logged}"
    );
    let before = access_log_lines(&lab, "good");
    let out = wrk(&["-d", "1s", "-c", "20", "-t", "2", &lab.good_url()]);
    let wrk_n: u64 = out
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect(&out);
    let logged = access_log_lines(&lab, "good") - before;
    assert!(
        logged >= wrk_n && logged <= wrk_n + 20,
        "wrk {wrk_n}, nginx {logged}"
    );
}

#[test]
#[ignore = "needs root"]
fn latency_server_stalls_and_good_server_does_not_like_wrk_sees() {
    let lab = lab("lat");
    let slow = load_json(&["-d", "2s", "-c", "10", "-t", "1", &lab.latency_url()]);
    let good = load_json(&["-d", "1s", "-c", "10", "-t", "1", &lab.good_url()]);
    let slow_p50 = slow["latency"]["p50_us"].as_f64().unwrap();
    let good_p50 = good["latency"]["p50_us"].as_f64().unwrap();
    assert!(slow_p50 >= 30_000.0, "latency server p50 {slow_p50} µs");
    assert!(good_p50 < 30_000.0, "good server p50 {good_p50} µs");
    // The first request on a connection is answered while the client is still in quick-ACK
    // mode: no stall. One connection, so no batch of first requests queues at the
    // single-worker nginx.
    let one = load_json(&["-n", "10", "-c", "1", "-t", "1", &lab.latency_url()]);
    let first = one["first_request_latency"]["max_us"].as_f64().unwrap();
    let later = one["later_request_latency"]["p50_us"].as_f64().unwrap();
    assert_eq!(one["first_request_latency"]["count"], 1);
    assert!(
        first < 25_000.0 && later >= 30_000.0,
        "first {first} µs, later p50 {later} µs"
    );
    // wrk sees the same stall (both clients: NODELAY on, delayed ACK on).
    let out = wrk(&[
        "-d",
        "2s",
        "-c",
        "10",
        "-t",
        "1",
        "--latency",
        &lab.latency_url(),
    ]);
    let wrk_p50 = wrk_percentile(&out, "50%");
    assert!(
        (slow_p50 - wrk_p50).abs() <= 0.25 * wrk_p50,
        "lagtrace p50 {slow_p50} µs vs wrk {wrk_p50} µs"
    );
}

#[test]
#[ignore = "needs root"]
fn quickack_removes_the_stall_and_rate_holds_within_two_percent() {
    let lab = lab("qr");
    let v = load_json(&[
        "-d",
        "1s",
        "-c",
        "5",
        "-t",
        "1",
        "--quickack",
        &lab.latency_url(),
    ]);
    let p50 = v["latency"]["p50_us"].as_f64().unwrap();
    assert!(
        p50 < 30_000.0,
        "with TCP_QUICKACK the client ACKs at once: p50 {p50} µs"
    );

    let v = load_json(&[
        "-d",
        "3s",
        "-c",
        "20",
        "-t",
        "2",
        "--rate",
        "1000",
        &lab.good_url(),
    ]);
    let n = v["requests"].as_f64().unwrap();
    assert!(
        (n / 3.0 - 1000.0).abs() <= 20.0,
        "{n} requests in 3 s at --rate 1000"
    );
    assert!(v["uncorrected_latency"]["p50_us"].is_number());
}
