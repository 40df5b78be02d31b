//! `lagtrace route` on a namespace chain client → r1 → r2 → server, cross-checked against
//! `traceroute`. Needs root; namespaces are deleted by the chain guard.

use std::net::IpAddr;
use std::process::{Command, Output};

use lagtrace_testkit::chain::Chain;
use lagtrace_testkit::in_ns;

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn run_in(ns: &str, args: &[&str]) -> Output {
    lagtrace_testkit::output_in_ns(ns, BIN, args)
}

/// The first address on each numbered hop line.
fn hop_addrs(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|t| t.parse::<u8>().is_ok())
        })
        .map(|l| {
            l.split_whitespace()
                .find(|t| t.parse::<IpAddr>().is_ok())
                .unwrap_or("*")
                .to_string()
        })
        .collect()
}

#[test]
#[ignore = "needs root"]
fn route_matches_traceroute_for_tcp_udp_and_icmp() {
    let c = Chain::up("cliroute");
    let want = vec![
        c.r1().to_string(),
        c.r2().to_string(),
        c.server().to_string(),
    ];
    let server = c.server().to_string();
    for (ours, theirs) in [
        (
            vec!["route", &server, "-n"],
            vec!["traceroute", "-n", "-T", "-p", "80", "-q", "1", &server],
        ),
        (
            vec!["route", &server, "--udp"],
            vec!["traceroute", "-n", "-U", "-q", "1", &server],
        ),
        (
            vec!["route", &server, "--icmp"],
            vec!["traceroute", "-n", "-I", "-q", "1", &server],
        ),
    ] {
        let o = run_in(c.client_ns(), &ours);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{ours:?}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(hop_addrs(&out), want, "{ours:?}: {out}");
        // Three probes per hop, µs precision.
        let first = out
            .lines()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap();
        assert_eq!(first.matches(" ms").count(), 3, "{first}");
        // Our trace's probes past the server use up the server's ICMP error budget (global
        // limit: burst 50, 1000/s); traceroute sends its first 16 probes within a few ms, so
        // give the budget time to refill before the peer runs.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let peer = in_ns(c.client_ns(), &theirs);
        assert_eq!(hop_addrs(&peer), want, "peer {theirs:?}: {peer}");
    }
}

#[test]
#[ignore = "needs root"]
fn dropped_time_exceeded_shows_stars_and_report_mode_counts_loss() {
    let c = Chain::up("clistar");
    in_ns(
        &c.ns[2],
        &[
            "nft",
            "add table inet d; add chain inet d out { type filter hook output priority 0; }; \
             add rule inet d out icmp type time-exceeded drop",
        ],
    );
    let server = c.server().to_string();
    let o = run_in(c.client_ns(), &["route", &server]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let hop2 = out
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap();
    assert_eq!(
        hop2.split_whitespace().collect::<Vec<_>>(),
        ["2", "*", "*", "*"],
        "{out}"
    );
    assert_eq!(hop_addrs(&out).last().unwrap(), &server);

    let o = run_in(
        c.client_ns(),
        &["route", &server, "--report", "3", "--interval", "200ms"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert_eq!(rows[0][1], c.r1().to_string());
    assert_eq!(&rows[0][2..4], ["0.0%", "3"]);
    assert_eq!(&rows[1][1..4], ["???", "100.0%", "3"]);
    assert_eq!(rows[2][1], server);
    assert_eq!(&rows[2][2..4], ["0.0%", "3"]);
    // Last Avg Best Wrst StDev, in ms.
    assert_eq!(rows[2].len(), 9, "{out}");

    let o = run_in(c.client_ns(), &["route", &server, "--json", "-m", "5"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["reached"], true);
    assert_eq!(v["hops"].as_array().unwrap().len(), 3);
    assert_eq!(v["hops"][1]["stats"]["received"], 0);

    // --report's StDev is mtr's: the sample standard deviation (n - 1) of the hop's RTTs.
    let o = run_in(
        c.client_ns(),
        &[
            "route",
            &server,
            "--report",
            "4",
            "--interval",
            "50ms",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let hop = &v["hops"][2];
    let rtts: Vec<f64> = hop["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["rtt_us"].as_f64())
        .collect();
    assert!(rtts.len() >= 2, "{hop}");
    let n = rtts.len() as f64;
    let mean = rtts.iter().sum::<f64>() / n;
    let sd = (rtts.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let got = hop["stats"]["rtt"]["stdev_us"].as_f64().unwrap();
    assert!((got - sd).abs() < 1e-6 * sd.max(1.0), "{got} vs {sd}");
}

#[test]
#[ignore = "needs root"]
fn unreachable_target_and_bad_input() {
    let c = Chain::up("clirtbad");
    // Nothing beyond the server answers: drop everything the server would send back.
    in_ns(
        c.server_ns(),
        &[
            "nft",
            "add table inet d; add chain inet d out { type filter hook output priority 0; policy drop; }",
        ],
    );
    let t0 = std::time::Instant::now();
    let o = run_in(
        c.client_ns(),
        &["route", &c.server().to_string(), "-m", "6", "-W", "500ms"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(3),
        "one timeout, not six"
    );
    assert_eq!(
        hop_addrs(&out),
        [
            c.r1().to_string(),
            c.r2().to_string(),
            "*".into(),
            "*".into(),
            "*".into(),
            "*".into()
        ]
    );
    assert!(out.contains("did not answer"), "{out}");

    for (args, want) in [
        (vec!["route", "127.0.0.1", "-m", "0"], "invalid max hops 0"),
        (
            vec!["route", "127.0.0.1", "-m", "300"],
            "invalid max hops 300",
        ),
        (vec!["route", "127.0.0.1", "-p", "0"], "invalid port 0"),
        (
            vec!["route", "127.0.0.1", "-q", "0"],
            "invalid number of queries 0",
        ),
        // Every probe is kept: a round count that would exhaust memory is refused.
        (
            vec![
                "route",
                "127.0.0.1",
                "--report",
                "4294967295",
                "--interval",
                "0",
            ],
            "invalid --report 4294967295",
        ),
    ] {
        let o = run_in(c.client_ns(), &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            c.client_ns(),
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            BIN,
        ])
        .args(["route", &c.server().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty(), "no header before the refusal");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("CAP_NET_RAW"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn net_unreachable_is_marked_like_traceroute() {
    let c = Chain::up("clirtnet");
    // 10.A.(B+3).0/24 belongs to this chain's block but no router has a route to it: r1
    // answers "network unreachable", which traceroute shows as `!N`.
    let o = c.server().octets();
    let dst = format!("{}.{}.{}.9", o[0], o[1], o[2] + 1);
    let out = run_in(
        c.client_ns(),
        &["route", "-n", &dst, "-m", "5", "-W", "500ms"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(hop_addrs(&text), [c.r1().to_string()], "{text}");
    let hop = text.lines().find(|l| l.starts_with(" 1 ")).unwrap_or("");
    assert!(hop.contains("!N"), "{text}");
    let tr = in_ns(
        c.client_ns(),
        &[
            "traceroute",
            "-T",
            "-n",
            "-p",
            "80",
            "-w",
            "1",
            "-m",
            "5",
            &dst,
        ],
    );
    assert!(tr.contains("!N"), "traceroute agrees: {tr}");
}
