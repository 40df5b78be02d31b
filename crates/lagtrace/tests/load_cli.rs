//! `lagtrace load` through the binary, against in-test servers on 127.0.0.1: wrk's layout,
//! the JSON fields, errors counted by kind, bad input as one-line errors with exit 2.

use std::process::{Command, Output};
use std::time::Duration;

use lagtrace_testkit::server::{Mode, TestServer};

fn load(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .arg("load")
        .args(args)
        .output()
        .expect("run lagtrace")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn text_report_keeps_wrks_layout() {
    let srv = TestServer::spawn(Mode::ok());
    let o = load(&["-t2", "-c4", "-d1s", "--latency", &srv.url()]);
    assert!(o.status.success(), "{o:?}");
    let s = stdout(&o);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines[0], format!("Running 1s test @ {}", srv.url()));
    assert_eq!(lines[1], "  2 threads and 4 connections");
    assert_eq!(
        lines[2],
        "  Thread Stats   Avg      Stdev     Max   +/- Stdev"
    );
    assert!(lines[3].starts_with("    Latency   "), "{s}");
    assert!(lines[4].starts_with("    Req/Sec   "), "{s}");
    assert_eq!(lines[5], "  Latency Distribution");
    for (line, p) in lines[6..12]
        .iter()
        .zip(["50%", "75%", "90%", "99%", "99.9%", "99.99%"])
    {
        assert_eq!(line.split_whitespace().next(), Some(p), "{s}");
    }
    let total = lines
        .iter()
        .find(|l| l.contains(" requests in "))
        .expect("requests line");
    let n: u64 = total.split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        n > 0 && srv.count() >= n && srv.count() <= n + 4,
        "{n} vs {}",
        srv.count()
    );
    assert!(total.ends_with("B read"), "{total}");
    assert!(
        s.contains("Requests/sec: ") && s.contains("Transfer/sec: "),
        "{s}"
    );
    assert!(!s.contains("Socket errors"), "{s}");
    assert!(s.contains(&format!("Status codes: 200: {n}")), "{s}");
}

#[test]
fn json_carries_the_documented_fields() {
    let srv = TestServer::spawn(Mode::Answer {
        status: 404,
        body: 20,
        chunked: true,
        close_every: 0,
        delay: Duration::ZERO,
    });
    let o = load(&[
        "-c3",
        "-t1",
        "-n",
        "300",
        "--json",
        "-H",
        "X-Test: 1",
        &srv.url(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(v["requests"], 300);
    assert_eq!(srv.count(), 300);
    for k in ["duration_us", "requests_per_sec", "bytes"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
    }
    for k in [
        "min_us", "mean_us", "stdev_us", "max_us", "p50_us", "p75_us", "p90_us", "p99_us",
        "p999_us", "p9999_us",
    ] {
        assert!(v["latency"][k].is_number(), "latency.{k}");
    }
    for k in ["connect", "read", "write", "timeout"] {
        assert_eq!(v["errors"][k], 0, "errors.{k}");
    }
    assert_eq!(v["errors"]["status"], 300);
    assert_eq!(v["status_codes"]["404"], 300);
    assert_eq!(v["options"]["connections"], 3);
    assert_eq!(v["options"]["requests"], 300);
    assert_eq!(v["options"]["headers"][0], "X-Test: 1");
    assert!(v["percentiles"].as_array().unwrap().len() > 10);
}

#[test]
fn socket_errors_and_non_2xx_lines() {
    let silent = TestServer::spawn(Mode::Silent);
    let o = load(&["-c2", "-t1", "-d1s", "--timeout", "250ms", &silent.url()]);
    assert!(o.status.success(), "{o:?}");
    let s = stdout(&o);
    let line = s
        .lines()
        .find(|l| l.starts_with("  Socket errors:"))
        .expect(&s);
    let timeouts: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        line.starts_with("  Socket errors: connect 0, read 0, write 0, timeout "),
        "{line}"
    );
    assert!((3..=10).contains(&timeouts), "{line}");

    let bad = TestServer::spawn(Mode::Answer {
        status: 500,
        body: 0,
        chunked: false,
        close_every: 0,
        delay: Duration::ZERO,
    });
    let s = stdout(&load(&["-c1", "-t1", "-n", "25", &bad.url()]));
    assert!(s.contains("  Non-2xx or 3xx responses: 25\n"), "{s}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let closed = lagtrace_testkit::nginx::ClosedPort::new();
    let port = closed.port;
    let refused = format!("http://127.0.0.1:{port}/");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["ftp://127.0.0.1/"], "unknown scheme"),
        (vec!["not a url"], "malformed URL"),
        (vec!["http://no-such-host.invalid/"], "cannot resolve"),
        (vec![&refused], "Connection refused"),
        (vec!["-d", "10x", "http://127.0.0.1/"], "invalid duration"),
        (vec!["-H", "nocolon", &refused], "invalid header"),
        (vec!["-c1", "-t2", &refused], "must be >= threads"),
        (
            vec!["--body-file", "/nonexistent/x", &refused],
            "cannot read body file",
        ),
        // These panicked (Instant/Duration overflow) or ran a zero-length test.
        (vec!["-d", "10000000000000000000s", &refused], "too long"),
        (
            vec!["--timeout", "10000000000000000000s", &refused],
            "too long",
        ),
        (
            vec!["--connect-timeout", "10000000000000000000s", &refused],
            "too long",
        ),
        (vec!["--rate", "1e-20", &refused], "too low"),
        (
            vec!["-d", "0s", &refused],
            "is zero: give a positive duration",
        ),
        (
            vec!["--body", "hi", "-H", "Content-Length: 99", &refused],
            "does not match the body (2 bytes)",
        ),
    ];
    for (args, want) in cases {
        let o = load(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            o.stdout.is_empty(),
            "{args:?}: no report, no header: {}",
            stdout(&o)
        );
        if !want.contains("duration") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("lagtrace: error: "), "{err}");
        }
    }
}

#[test]
fn post_body_and_rate_with_uncorrected() {
    let srv = TestServer::spawn(Mode::ok());
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body");
    std::fs::write(&body, b"").unwrap();
    let o = load(&[
        "-c2",
        "-t1",
        "-d1s",
        "-m",
        "POST",
        "--body-file",
        body.to_str().unwrap(),
        "--rate",
        "100",
        "--latency",
        "--uncorrected",
        &srv.url(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let s = stdout(&o);
    assert!(s.contains("Latency Distribution (corrected"), "{s}");
    assert!(s.contains("Uncorrected Latency Distribution"), "{s}");
    let n: u64 = s
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect(&s);
    assert!((97..=103).contains(&n), "{n} requests at 100/s for 1 s");
}

#[test]
fn ctrl_c_prints_the_report_for_what_ran() {
    let srv = TestServer::spawn(Mode::ok());
    let child = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["load", "-c2", "-t1", "-d30s", &srv.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let t0 = std::time::Instant::now();
    // SAFETY: signals our own child process by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "stops promptly");
    // The one rule for an interrupted run: its report, then exit 130.
    assert_eq!(o.status.code(), Some(130), "{o:?}");
    let s = stdout(&o);
    assert!(
        s.contains("interrupted") && s.contains("Requests/sec:"),
        "{s}"
    );
    let n: u64 = s
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect(&s);
    assert!(n > 0 && srv.count() >= n, "{n}");
}
