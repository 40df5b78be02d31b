//! Segments dropped on the server host before they reach the wire (issue 12's
//! dropped-before-wire class, issue 13's egress drop rule), on real kernel mechanisms in the
//! lab's namespace (needs root): real nginx (tcp_nodelay on) with an nftables rule on its
//! output path dropping a small share of its data segments: `packet-loss` with mechanism
//! `dropped-before-wire`, the place named in the fix and a tail line. (A tbf qdisc whose
//! queue is too short is named the same way, "by the tbf qdisc on DEV", but not tested
//! here: at a rate near what the machine serves its drops reach the p99 in some runs only,
//! and below it the SYN-ACKs drop too and the connects' waits take over.) Negative control: the same nftables drops on
//! another port and process in the same namespace are not blamed on the target.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lagtrace_lab::{Lab, LabOptions};
use serde_json::Value;

use common::Foreground;

fn name(test: &str) -> String {
    format!("wd{test}{}", std::process::id())
}

/// Loads an nftables ruleset into the lab's namespace (the namespace goes with the lab).
fn nft(lab: &Lab, rules: &str) {
    let ns = lagtrace_lab::netns_name(lab.name());
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(rules.as_bytes())
        .expect("write rules");
    assert!(child.wait().expect("nft").success(), "nft -f: {rules}");
}

/// Drops `pct` % of the data segments (IP length over a bare ACK's) leaving `sport` on the
/// lab namespace's output path.
fn drop_output(lab: &Lab, sport: u16, pct: u8) {
    nft(lab, "flush ruleset\n");
    nft(
        lab,
        &format!(
            "table inet ltwd {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  tcp sport {sport} ip length > 80 numgen random mod 100 < {pct} counter drop\n }}\n}}\n"
        ),
    );
}

/// Packets the lab's `ltwd` rule dropped so far.
fn nft_dropped(lab: &Lab) -> u64 {
    let ns = lagtrace_lab::netns_name(lab.name());
    let out = Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "list", "table", "inet", "ltwd"])
        .output()
        .expect("nft list");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("counter packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn diagnose(url: &str, args: &[&str]) -> (Value, String) {
    let (_, j, stderr) = common::diagnose_json(url, args);
    (j, stderr)
}

fn show(j: &Value) -> String {
    let ev: String = j["evidence"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| format!("{} {} {}\n", e["stance"], e["layer"], e["text"]))
                .collect()
        })
        .unwrap_or_default();
    let h = &j["layers"]["host"]["data"];
    serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default()
        + "\n"
        + &ev
        + "drops: "
        + &serde_json::to_string(&h["drops"]).unwrap_or_default()
        + "\nqdiscs: "
        + &serde_json::to_string(&h["qdiscs"]).unwrap_or_default()
}

/// The verdict is packet-loss, dropped-before-wire, with a tail line and the fix `where`.
fn assert_dropped_before_wire(j: &Value, err: &str, fix: &str) {
    assert_eq!(
        j["layers"]["host"]["status"],
        "finding",
        "{err}\n{}",
        show(j)
    );
    assert_eq!(j["verdict"]["cause"], "packet-loss", "{err}\n{}", show(j));
    assert_eq!(
        j["verdict"]["mechanism"],
        "dropped-before-wire",
        "{}",
        show(j)
    );
    assert!(
        j["verdict"]["fix"][0]["change"]
            .as_str()
            .is_some_and(|c| c.contains(fix)),
        "{}",
        show(j)
    );
    let host_line = j["evidence"].as_array().and_then(|a| {
        a.iter()
            .find(|e| e["layer"] == "host" && e["stance"] == "supports")
    });
    assert!(host_line.is_some(), "{}", show(j));
    // The held segments, with their stream and frames.
    assert!(
        j["evidence"].as_array().is_some_and(|a| a.iter().any(|e| {
            e["layer"] == "packets"
                && e["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("dropped before the wire") && t.contains("stream"))
        })),
        "{}",
        show(j)
    );
    // A tail line when the drops reach the p99: more than 1 % of the requests waited.
    let cost = &j["verdict"]["cost"];
    let hit = cost["affected"].as_f64().unwrap_or(0.0) / cost["of"].as_f64().unwrap_or(1.0);
    if hit > 0.015 {
        assert!(j["verdict"]["tail"]["text"].is_string(), "{}", show(j));
    }
}

#[test]
#[ignore = "needs root"]
fn nginx_with_an_nft_drop_on_its_output_is_packet_loss_dropped_before_wire() {
    let lab = Lab::up(&LabOptions::new(&name("nft"))).expect("lab up");
    // Three runs, the share varied: the same cause each time.
    for pct in [2u8, 4, 3] {
        drop_output(&lab, 80, pct);
        let (j, err) = diagnose(&lab.good_url(), &["-d", "3s"]);
        eprintln!(
            "{pct}%: {} / {} / tail: {} (nft dropped {})",
            j["verdict"]["cause"],
            j["verdict"]["mechanism"],
            j["verdict"]["tail"]["text"],
            nft_dropped(&lab)
        );
        assert_dropped_before_wire(&j, &err, "nft list ruleset");
    }
}

/// HTTP/1.1 keep-alive server on argv[1], TCP_NODELAY on, one write per header and body.
const OTHER: &str = r#"
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        body = b"x" * 600
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"#;

#[test]
#[ignore = "needs root"]
fn drops_on_another_port_and_process_are_not_blamed_on_the_target() {
    let lab = Lab::up(&LabOptions::new(&name("oth"))).expect("lab up");
    let other = common::start_in_lab(
        &lab,
        Path::new("/"),
        &["python3", "-c", OTHER, "9093"],
        9093,
    );
    drop_output(&lab, 9093, 5);
    // Traffic to the other server through the whole diagnosis (bounded).
    let url = format!("http://{}:9093/", lab.server_addr());
    let _bg = Foreground(
        Command::new(common::BIN)
            .args(["load", &url, "-c", "4", "-d", "15s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("background load"),
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = nft_dropped(&lab);
    let (j, err) = diagnose(&lab.good_url(), &["-d", "3s"]);
    let during = nft_dropped(&lab) - before;
    assert!(during > 0, "the other port's drops happened: {}", show(&j));
    assert_eq!(j["layers"]["host"]["status"], "ok", "{err}\n{}", show(&j));
    assert!(j["verdict"].get("mechanism").is_none(), "{}", show(&j));
    assert_ne!(j["verdict"]["cause"], "packet-loss", "{}", show(&j));
    drop(other);
}
