//! `lagtrace ping` as a user runs it: output, JSON, exit codes, privilege fallback, bad input.
//! Needs root; namespaces are deleted by guards.

use std::process::{Command, Output};

use lagtrace_testkit::chain::Chain;
use lagtrace_testkit::in_ns;
use lagtrace_testkit::net::NetGuard;

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn run_in(ns: &str, args: &[&str]) -> Output {
    lagtrace_testkit::output_in_ns(ns, BIN, args)
}

fn run_as_nobody_in(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            BIN,
        ])
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A listener in the server namespace, alive while the guard lives.
struct Listener(std::net::TcpListener);

fn listen(c: &Chain) -> Listener {
    Listener(
        lagtrace_netns::NetNs::Named(c.server_ns().to_string())
            .run(|| std::net::TcpListener::bind("0.0.0.0:0"))
            .unwrap()
            .unwrap(),
    )
}

#[test]
#[ignore = "needs root"]
fn syn_ping_prints_hping_style_lines_and_statistics() {
    let c = Chain::up("clisyn");
    let l = listen(&c);
    let port = l.0.local_addr().unwrap().port();
    let target = format!("{}:{port}", c.server());
    let o = run_in(c.client_ns(), &["ping", &target, "-c", "3", "-i", "10ms"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("len=")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with(&format!("len=44 ip={} ttl=62 DF id=", c.server())),
            "{l}"
        );
        assert!(
            l.contains(&format!(" sport={port} flags=SA seq={i} win=")),
            "{l}"
        );
        let rtt = l.split("rtt=").nth(1).unwrap();
        assert!(rtt.ends_with(" ms"), "{l}");
        // µs precision: three decimals of ms.
        assert_eq!(
            rtt.trim_end_matches(" ms").split('.').nth(1).unwrap().len(),
            3,
            "{l}"
        );
    }
    assert!(
        out.contains("3 packets transmitted, 3 received, 0% packet loss"),
        "{out}"
    );
    assert!(out.contains("round-trip min/avg/max/mdev = "), "{out}");

    // Closed port: RST replies are samples too.
    let o = run_in(
        c.client_ns(),
        &[
            "ping",
            &c.server().to_string(),
            "-p",
            "1",
            "-c",
            "2",
            "-i",
            "10ms",
        ],
    );
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        out.lines().filter(|l| l.contains("flags=RA")).count(),
        2,
        "{out}"
    );
}

#[test]
#[ignore = "needs root"]
fn json_report_states_samples_stats_and_timestamp_source() {
    let c = Chain::up("clijson");
    let l = listen(&c);
    let port = l.0.local_addr().unwrap().port().to_string();
    let o = run_in(
        c.client_ns(),
        &[
            "ping",
            &c.server().to_string(),
            "-p",
            &port,
            "-c",
            "4",
            "-i",
            "10ms",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "tcp-syn");
    assert_eq!(v["stats"]["sent"], 4);
    assert_eq!(v["stats"]["received"], 4);
    assert_eq!(v["samples"].as_array().unwrap().len(), 4);
    assert_eq!(v["samples"][0]["kind"], "syn-ack");
    assert!(v["samples"][0]["rtt_us"].as_f64().unwrap() > 0.0);
    assert_eq!(v["samples"][0]["tx_kernel_ts"], true);
    assert_eq!(v["samples"][0]["rx_kernel_ts"], true);
    assert!(v["stats"]["rtt"]["p50_us"].as_f64().unwrap() > 0.0);
    assert!(
        v["timestamp_source"]
            .as_str()
            .unwrap()
            .contains("SO_TIMESTAMPNS")
    );
}

#[test]
#[ignore = "needs root"]
fn silent_port_is_a_clear_all_timeout_report_with_exit_1() {
    let c = Chain::up("clisilent");
    in_ns(
        c.server_ns(),
        &[
            "nft",
            "add table inet d; add chain inet d in { type filter hook input priority 0; }; add rule inet d in tcp dport 7 drop",
        ],
    );
    let t0 = std::time::Instant::now();
    let o = run_in(
        c.client_ns(),
        &[
            "ping",
            &format!("{}:7", c.server()),
            "-c",
            "2",
            "-i",
            "10ms",
            "-W",
            "300ms",
        ],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(3));
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("timeout: no reply in 300 ms"))
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains("2 packets transmitted, 0 received, 100% packet loss"),
        "{out}"
    );
}

#[test]
#[ignore = "needs root"]
fn connect_mode_works_unprivileged_and_syn_mode_falls_back_saying_so() {
    let c = Chain::up("clinobody");
    let l = listen(&c);
    let target = format!("{}:{}", c.server(), l.0.local_addr().unwrap().port());
    let o = run_as_nobody_in(
        c.client_ns(),
        &["ping", &target, "--connect", "-c", "2", "-i", "10ms"],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.contains(" connected rtt="))
            .count(),
        2,
        "{out}"
    );
    assert!(out.contains("completes handshakes"), "{out}");

    let o = run_as_nobody_in(c.client_ns(), &["ping", &target, "-c", "1"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        err.contains("no CAP_NET_RAW") && err.contains("--connect"),
        "{err}"
    );
    assert!(out.contains(" connected rtt="), "{out}");
    // The header names the mode that runs, not the raw SYN mode it fell back from.
    let header = out.lines().next().unwrap_or("");
    assert!(
        header.contains("tcp connect()") && !header.contains("raw socket"),
        "{header}"
    );

    // Modes that only exist with raw sockets: one line naming the capability, exit 2.
    let o = run_as_nobody_in(c.client_ns(), &["ping", &target, "--udp", "-c", "1"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(out.is_empty(), "no header before the refusal: {out}");
    assert!(
        err.starts_with("lagtrace: error:") && err.contains("CAP_NET_RAW"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
#[ignore = "needs root"]
fn bad_input_is_one_line_and_exit_2() {
    // An empty namespace (loopback only): no route anywhere, no DNS server reachable.
    let mut guard = NetGuard::new();
    let ns = guard.add_ns("cliempty");
    let cases: &[(&[&str], &str)] = &[
        (&["ping", "127.0.0.1:0"], "invalid port 0"),
        (&["ping", "127.0.0.1:70000"], "invalid port 70000"),
        (&["ping", "127.0.0.1", "-p", "65536"], "invalid port 65536"),
        (&["ping", "127.0.0.1:80", "--ttl", "0"], "invalid TTL 0"),
        (&["ping", "127.0.0.1:80", "--ttl", "256"], "invalid TTL 256"),
        (&["ping", "10.1.2.3:80"], "no route to 10.1.2.3"),
        (&["ping", "no-such-host.invalid:80"], "cannot resolve host"),
        (&["ping", "[::1:80"], "missing ']'"),
        (&["ping", "127.0.0.1:80", "-i", "fast"], "invalid duration"),
        (&["ping", "127.0.0.1:80", "-c", "0"], "invalid count 0"),
        (&["ping", "0.0.0.0:80"], "not one host"),
        (&["ping", "[ff02::1]:80"], "not one host"),
        (&["ping", "fe80::1%lo"], "scoped addresses"),
        // Every sample is kept: a count that would exhaust memory is refused up front.
        (
            &["ping", "127.0.0.1:80", "-c", "4294967295", "-i", "0"],
            "invalid count 4294967295",
        ),
    ];
    for (args, want) in cases {
        let o = run_in(&ns, args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            out.is_empty(),
            "{args:?}: nothing on stdout before an error: {out}"
        );
        if !err.contains("For more information") {
            // Our own errors are one line; clap's usage errors add a hint line.
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("lagtrace: error: "), "{err}");
        }
    }
}

/// The fields of a reply line, without the probe number and the RTT (which differ by tool).
fn reply_fields(line: &str) -> Vec<String> {
    line.split_whitespace()
        .filter(|f| !f.starts_with("seq=") && !f.starts_with("rtt=") && *f != "ms")
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs root"]
fn reply_lines_agree_with_hping3_on_the_same_target() {
    let c = Chain::up("clihping");
    let l = listen(&c);
    let port = l.0.local_addr().unwrap().port().to_string();
    let server = c.server().to_string();
    for p in [port.as_str(), "1"] {
        let ours = run_in(
            c.client_ns(),
            &["ping", &server, "-p", p, "-c", "2", "-i", "10ms"],
        );
        let ours = String::from_utf8_lossy(&ours.stdout).into_owned();
        let peer = in_ns(
            c.client_ns(),
            &["hping3", "-S", "-p", p, "-c", "2", "-i", "u10000", &server],
        );
        let a: Vec<_> = ours
            .lines()
            .filter(|l| l.starts_with("len="))
            .map(reply_fields)
            .collect();
        let b: Vec<_> = peer
            .lines()
            .filter(|l| l.starts_with("len="))
            .map(reply_fields)
            .collect();
        assert_eq!(a.len(), 2, "{ours}");
        assert_eq!(b.len(), 2, "{peer}");
        // len, ip, ttl, DF, id, sport, flags, win: the same packets seen the same way.
        assert_eq!(a[0], b[0], "port {p}\nours: {ours}\nhping3: {peer}");
    }
}
