//! `lagtrace diagnose` where connection setup waits (needs root): a real Python server whose
//! listen backlog overflows at c=32, and a real nftables rule dropping a share of the SYNs,
//! are `syn-drop` from the load's per-request records (the 1 s connects are in the tail),
//! the same on repeated runs; a c=1 connect that waits or never completes while the SYN
//! probes are answered makes the verdict neither `syn-drop` nor `unreachable`; a healthy
//! nginx that closes every connection stays healthy. Labs, servers and nft tables go with
//! their guards (the tables live in the lab's namespace), also when a test fails.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use lagtrace_lab::{Lab, LabOptions, ServerKind};
use lagtrace_testkit::net::nft_load;
use lagtrace_testkit::nginx::{Nginx, free_port};
use serde_json::Value;

use common::Foreground;

/// HTTP/1.0 (a new connection per request), one thread that accepts, answers and closes,
/// with the listen backlog (`request_queue_size`) the test gives: a short backlog overflows
/// when more clients connect at once than it holds and the one thread accepts.
const SERVER: &str = r#"
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(HTTPServer):
    request_queue_size = int(sys.argv[2])
S(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"#;

fn name(test: &str) -> String {
    format!("cn{test}{}", std::process::id())
}

/// Starts the Python server in the lab's namespace with `backlog` and waits until it answers.
fn python_in_lab(lab: &Lab, port: u16, backlog: u32) -> Foreground {
    let (port_s, backlog_s) = (port.to_string(), backlog.to_string());
    let cmd = ["python3", "-c", SERVER, &port_s, &backlog_s];
    common::start_in_lab(lab, Path::new("/"), &cmd, port)
}

/// Loads `rules` into the lab's namespace (removed with it).
fn nft_in_lab(lab: &Lab, rules: &str) {
    nft_load(Some(&lagtrace_lab::netns_name(lab.name())), rules);
}

/// Runs `lagtrace diagnose URL ARGS --json`; returns the JSON, stderr and the wall time.
fn diagnose(url: &str, args: &[&str]) -> (Value, String, Duration) {
    // Our turn first (re-entrant), so the wall time is the diagnose's, not the wait for it.
    let _turn = lagtrace_testkit::measuring();
    let t = Instant::now();
    let (_, j, stderr) = common::diagnose_json(url, args);
    let wall = t.elapsed();
    eprintln!("diagnose {url} {args:?}: {:.1} s", wall.as_secs_f64());
    (j, stderr, wall)
}

fn show(j: &Value) -> String {
    let ev = common::evidence_lines(j);
    let connects = |r: &str| j["layers"]["app"]["data"][r]["connects"].to_string();
    let waits = |r: &str| j["layers"]["app"]["data"][r]["waits"].to_string();
    // Who held the CPUs and where the server's threads were, for a pause nothing named
    // (suite run: a healthy nginx paused every ~223 ms at the p99.9).
    let host = &j["layers"]["host"]["data"];
    format!(
        "{}\n{ev}c1 connects {} waits {}\ncn connects {} waits {}\nhost cpu {}\noffcpu classes \
         {}\noncpu modules {}",
        serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default(),
        connects("c1"),
        waits("c1"),
        connects("cn"),
        waits("cn"),
        host["cpu"],
        host["offcpu"]["data"]["classes"],
        host["oncpu"]["data"]["modules"]
    )
}

fn cause(j: &Value) -> &str {
    j["verdict"]["cause"].as_str().unwrap_or("")
}

/// Connects of run `r` that waited for a SYN retransmission.
fn syn_waits(j: &Value, r: &str) -> u64 {
    j["layers"]["app"]["data"][r]["connects"]["syn_retransmitted"]
        .as_u64()
        .unwrap_or(0)
}

/// A single-threaded server with a listen backlog of 3 at c=32: the accept queue overflows,
/// SYNs are dropped and connects wait 1 s for their retransmission. syn-drop from the
/// records, three runs out of three, with the connects' wait as the cost and no mechanism
/// (nothing read the server's overflow counter).
#[test]
#[ignore = "needs root"]
fn python_listen_backlog_overflow_at_c32_is_syn_drop_on_three_runs() {
    let lab = Lab::up(&LabOptions::new(&name("bl")).server(ServerKind::Builtin)).expect("lab");
    let _py = python_in_lab(&lab, 9011, 3);
    let url = format!("http://{}:9011/", lab.server_addr());
    for run in 0..3 {
        let (j, err, wall) = diagnose(&url, &["-d", "3s"]);
        assert_eq!(cause(&j), "syn-drop", "run {run}: {err}\n{}", show(&j));
        assert!(syn_waits(&j, "cn") >= 2, "run {run}: {}", show(&j));
        // Where the waits sit in the tail (issue 28 item 2): their share past the p99.9.
        let ev = common::evidence_lines(&j);
        assert!(
            ev.contains("at and beyond the p99.9") && ev.contains("requests waited for one"),
            "run {run}: {}",
            show(&j)
        );
        let added = j["verdict"]["cost"]["added_us"].as_u64().unwrap_or(0);
        assert!(added >= 900_000, "run {run}: {}", show(&j));
        // The mechanism needs the host layer's direct evidence (the listener's own drops);
        // without that layer there is none to name.
        let host = j["layers"]["host"]["status"].as_str().unwrap_or("");
        if host == "ok" || host == "finding" {
            assert_eq!(
                j["verdict"]["mechanism"],
                "accept-queue-overflow",
                "{}",
                show(&j)
            );
        } else {
            assert!(j["verdict"].get("mechanism").is_none(), "{}", show(&j));
        }
        let fix = j["verdict"]["fix"][0]["change"].as_str().unwrap_or("");
        assert!(fix.contains("listen backlog"), "{}", show(&j));
        assert!(wall < Duration::from_secs(20), "run {run}: {wall:?}");
    }
}

/// nftables drops 25 % of the SYNs to a server with room in its backlog (128): a quarter of
/// the connects wait 1 s (or 2 s) for a retransmission, the slowest requests are those
/// connects, and the verdict says so: syn-drop, the tail made of connection setup, and
/// `dropped-by-netfilter` from the host layer's count of the namespace's drops.
#[test]
#[ignore = "needs root"]
fn nft_dropping_a_share_of_syns_is_syn_drop_with_the_connects_in_the_tail() {
    let lab = Lab::up(&LabOptions::new(&name("nf")).server(ServerKind::Builtin)).expect("lab");
    let _py = python_in_lab(&lab, 9012, 128);
    nft_in_lab(
        &lab,
        "table inet ltsyndrop {\n  chain input {\n    type filter hook input priority 0; \
         policy accept;\n    tcp dport 9012 tcp flags & (syn | ack) == syn numgen random mod \
         100 < 25 drop\n  }\n}\n",
    );
    let url = format!("http://{}:9012/", lab.server_addr());
    for run in 0..3 {
        let (j, err, wall) = diagnose(&url, &["-d", "3s"]);
        assert_eq!(cause(&j), "syn-drop", "run {run}: {err}\n{}", show(&j));
        let tail = &j["verdict"]["tail"];
        assert_eq!(
            tail["parts"][0]["cause"],
            "syn-drop",
            "run {run}: {}",
            show(&j)
        );
        assert!(
            tail["parts"][0]["added_us"].as_u64().unwrap_or(0) >= 900_000,
            "run {run}: {}",
            show(&j)
        );
        assert!(
            tail["text"]
                .as_str()
                .unwrap_or("")
                .contains("connection setup"),
            "{}",
            show(&j)
        );
        // With the namespace's own drop count (the host layer's BPF counter), the rule that
        // drops them is named: dropped-by-netfilter, the fix pointing at the ruleset.
        let scope = &j["layers"]["host"]["data"]["drops"]["data"]["scope"];
        if scope == "namespace" {
            assert_eq!(
                j["verdict"]["mechanism"],
                "dropped-by-netfilter",
                "run {run}: {}",
                show(&j)
            );
            let fix = j["verdict"]["fix"][0]["change"].as_str().unwrap_or("");
            assert!(fix.contains("nft list ruleset"), "run {run}: {}", show(&j));
        } else {
            eprintln!("run {run}: host drops scope {scope}: no mechanism asserted");
        }
        assert!(wall < Duration::from_secs(20), "run {run}: {wall:?}");
    }
}

/// The server answers every SYN, and a quarter of its SYN-ACKs are lost on the way back (an
/// nftables `netdev` rule at the ingress of the client side's veth, past the server's
/// capture point, as a path or a firewall in front of the clients would lose them): the
/// clients send their SYNs again and connect a second later. `syn-drop` three runs out of
/// three — and the packets show the SYNs answered, so the evidence says the SYN-ACKs were
/// lost, not the SYNs, and the fix is on the path back, not the server's backlog.
#[test]
#[ignore = "needs root"]
fn syn_acks_lost_on_the_way_back_are_syn_drop_with_the_fix_on_the_path() {
    let lab = Lab::up(&LabOptions::new(&name("sa")).server(ServerKind::Builtin)).expect("lab");
    let _py = python_in_lab(&lab, 9013, 128);
    lab.drop_syn_acks_percent(25).expect("nft netdev rule");
    let url = format!("http://{}:9013/", lab.server_addr());
    for run in 0..3 {
        let (j, err, wall) = diagnose(&url, &["-d", "3s"]);
        assert_eq!(cause(&j), "syn-drop", "run {run}: {err}\n{}", show(&j));
        assert!(syn_waits(&j, "cn") >= 2, "run {run}: {}", show(&j));
        let lost = &j["layers"]["packets"]["data"]["syn_acks_lost"];
        let (count, of) = (lost["count"].as_u64(), lost["of"].as_u64());
        eprintln!(
            "run {run}: {} / {:?} of {:?} SYNs sent again were answered; fix {}",
            cause(&j),
            count,
            of,
            j["verdict"]["fix"][0]["change"]
        );
        assert!(
            count.is_some_and(|c| c >= 2 && 2 * c >= of.unwrap_or(0)),
            "run {run}: {}",
            show(&j)
        );
        assert!(
            common::evidence_lines(&j).contains("the SYNs were answered"),
            "run {run}: {}",
            show(&j)
        );
        assert_eq!(
            j["verdict"]["fix"][0]["side"],
            "path",
            "run {run}: {}",
            show(&j)
        );
        assert!(wall < Duration::from_secs(20), "run {run}: {wall:?}");
    }
}

/// The lab's healthy nginx (keep-alive) with nftables dropping SYNs number `from..=to` to
/// it, counted from the rule's load: the idle SYN probes are the first five, so the c=1
/// connect's SYN is the sixth. One dropped SYN (the connect waits 1 s) and a c=1 connect
/// that never completes in its phase (its SYN and retransmissions dropped) do not make the
/// verdict `syn-drop` or `unreachable`: the probes were answered and c=N connects.
#[test]
#[ignore = "needs root"]
fn a_c1_connect_that_waits_or_never_completes_is_neither_syn_drop_nor_unreachable() {
    for (k, (from, to)) in [(5, 5), (5, 8)].into_iter().enumerate() {
        let lab = Lab::up(&LabOptions::new(&name(&format!("c1{k}")))).expect("lab");
        nft_in_lab(
            &lab,
            &format!(
                "table inet ltc1syn {{\n  chain input {{\n    type filter hook input priority \
                 0; policy accept;\n    tcp dport 80 tcp flags & (syn | ack) == syn numgen \
                 inc mod 100000 {from}-{to} drop\n  }}\n}}\n"
            ),
        );
        let (j, err, wall) = diagnose(&lab.good_url(), &["-d", "4s"]);
        // What the verdict would be without the drop depends on the machine (a shared,
        // busy one gives nginx a scheduling tail at c=32); the one waiting connect must not
        // be it, nor make it `unreachable`.
        assert!(
            !["unreachable", "syn-drop"].contains(&cause(&j)),
            "SYNs {from}-{to}: {err}\n{}",
            show(&j)
        );
        let parts = j["verdict"]["tail"]["parts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            parts.iter().all(|p| p["cause"] != "syn-drop"),
            "SYNs {from}-{to}: {}",
            show(&j)
        );
        assert_eq!(
            j["layers"]["path"]["data"]["port_open"],
            true,
            "{}",
            show(&j)
        );
        assert!(
            syn_waits(&j, "c1") >= 1,
            "SYNs {from}-{to}: the c=1 connect should have waited: {}",
            show(&j)
        );
        assert!(wall < Duration::from_secs(20), "{wall:?}");
    }
}

/// nginx closing every connection after one response (`keepalive_timeout 0`) at c=32: every
/// request connects, nothing waits for a SYN retransmission, it stays healthy.
#[test]
#[ignore = "needs root"]
fn healthy_nginx_with_a_new_connection_per_request_stays_healthy() {
    let port = free_port();
    let _ngx = Nginx::start("    keepalive_timeout 0;\n", port, None);
    let (j, err, wall) = diagnose(&format!("http://127.0.0.1:{port}/"), &["-d", "4s"]);
    assert_eq!(cause(&j), "healthy", "{err}\n{}", show(&j));
    let attempts = j["layers"]["app"]["data"]["cn"]["connects"]["attempts"]
        .as_u64()
        .unwrap_or(0);
    let requests = j["layers"]["app"]["data"]["cn"]["requests"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        attempts + 64 >= requests,
        "a connect per request: {attempts} connects, {requests} requests"
    );
    assert_eq!(syn_waits(&j, "cn"), 0, "{}", show(&j));
    assert!(wall < Duration::from_secs(12), "{wall:?}");
}

/// A server slow to start serving each new connection: keep-alive hides it from the p99 of
/// both runs (one first request per connection), so no cause is claimed — but the evidence
/// says that every new connection's first request waits, from both runs (c=1's connection
/// and c=32's), and `healthy` is then not sure. Twice, the same.
#[test]
#[ignore = "needs root"]
fn a_server_slow_to_start_each_connection_is_said_so_and_never_healthy_high() {
    let lab = Lab::up(&LabOptions::new(&name("ss")).server(ServerKind::Builtin)).expect("lab");
    // Sleeps 80–160 ms after the accept, before it reads (per-connection setup: a backend
    // connection, authentication): every new connection's first request waits.
    let server = common::python_server("", "time.sleep(random.uniform(0.08, 0.16))", "pass");
    let cmd = ["python3", "-c", &server, "9013"];
    let _py = common::start_in_lab(&lab, Path::new("/"), &cmd, 9013);
    let url = format!("http://{}:9013/", lab.server_addr());
    for run in 0..2 {
        let (j, err, _) = diagnose(&url, &["-d", "3s"]);
        eprintln!("run {run}: {}", show(&j));
        let first = |r: &str| j["layers"]["app"]["data"][r]["first_request"]["p50_us"].as_u64();
        assert!(
            first("c1").unwrap_or(0) >= 80_000 && first("cn").unwrap_or(0) >= 80_000,
            "run {run}: the measured first requests wait the server's sleep: {}",
            show(&j)
        );
        let line = j["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["text"].as_str())
            .find(|t| t.starts_with("the first request on each connection waited"));
        assert!(line.is_some(), "run {run}: {err}\n{}", show(&j));
        assert!(
            cause(&j) != "healthy" || j["verdict"]["confidence"] != "high",
            "run {run}: {}",
            show(&j)
        );
    }
}
