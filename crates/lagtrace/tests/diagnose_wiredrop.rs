//! Segments dropped on the server host before they reach the wire (issue 12's
//! dropped-before-wire class, issue 13's egress drop rule), on real kernel mechanisms in the
//! lab's namespace (needs root), each `packet-loss` with mechanism `dropped-before-wire`,
//! the place named in the fix and a tail line:
//! - real nginx (tcp_nodelay on) with an nftables rule on its output path dropping a small
//!   share of its data segments;
//! - real nginx behind a tbf qdisc that drops: an htb root whose u32 filter sends a share of
//!   nginx's data segments to a class holding a tbf whose rate that share exceeds, and
//!   everything else (SYN-ACKs, pure ACKs, the other data segments) to a plain class. The
//!   tbf is a child qdisc: the one named must be it, not the htb above it that counts its
//!   drops too.
//!
//! Negative control: the same nftables drops on another port and process in the same
//! namespace are not blamed on the target.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lagtrace_lab::{Lab, LabOptions};
use serde_json::Value;

use common::{Foreground, drop_output_in_lab, nft_dropped_in_lab};

fn name(test: &str) -> String {
    format!("wd{test}{}", std::process::id())
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

/// Whether an evidence line of `layer` has a text that `text` accepts.
fn has_line(j: &Value, layer: &str, text: impl Fn(&str) -> bool) -> bool {
    j["evidence"].as_array().is_some_and(|a| {
        a.iter()
            .any(|e| e["layer"] == layer && e["text"].as_str().is_some_and(&text))
    })
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
        has_line(j, "packets", |t| t.contains("dropped before the wire")
            && t.contains("stream")),
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
        drop_output_in_lab(&lab, 80, pct);
        let (j, err) = diagnose(&lab.good_url(), &["-d", "3s"]);
        eprintln!(
            "{pct}%: {} / {} / tail: {} (nft dropped {})",
            j["verdict"]["cause"],
            j["verdict"]["mechanism"],
            j["verdict"]["tail"]["text"],
            nft_dropped_in_lab(&lab)
        );
        assert_dropped_before_wire(&j, &err, "nft list ruleset");
    }
}

/// The other direction (issue 28 item 3): an nftables rule on the server host's *input*
/// hook drops a share of the clients' requests. They pass the server's capture point and
/// are lost after it; each is sent again at the client's retransmission timer and the
/// server acknowledges the second copy as new data (no D-SACK) — unlike an output drop,
/// where the segment never reaches the capture. The lost request also carried the client's
/// ACK of the previous response, which the server sends again first: the capture must not
/// take that old data for the start of the next response (it once did, and the wait read
/// as the server's time on the probe timer: `dropped-before-wire`).
#[test]
#[ignore = "needs root"]
fn nginx_with_an_nft_drop_on_its_input_is_packet_loss_dropped_by_netfilter() {
    let lab = Lab::up(&LabOptions::new(&name("in"))).expect("lab up");
    for pct in [2u8, 4, 3] {
        common::nft_in_lab(&lab, "flush ruleset\n");
        common::nft_in_lab(
            &lab,
            &format!(
                "table inet ltwd {{\n chain inp {{\n  type filter hook input priority 0; policy accept;\n  tcp dport 80 ip length > 80 numgen random mod 100 < {pct} counter drop\n }}\n}}\n"
            ),
        );
        let (j, err) = diagnose(&lab.good_url(), &["-d", "3s"]);
        eprintln!(
            "{pct}%: {} / {} / tail: {} (nft dropped {})",
            j["verdict"]["cause"],
            j["verdict"]["mechanism"],
            j["verdict"]["tail"]["text"],
            nft_dropped_in_lab(&lab)
        );
        assert_eq!(j["verdict"]["cause"], "packet-loss", "{err}\n{}", show(&j));
        assert_eq!(
            j["verdict"]["mechanism"],
            "dropped-by-netfilter",
            "{}",
            show(&j)
        );
        let lost = &j["layers"]["packets"]["data"]["inbound_lost"];
        assert!(
            lost["count"].as_u64().unwrap_or(0) >= 3
                && lost["count"].as_u64() <= lost["of"].as_u64(),
            "{}",
            show(&j)
        );
        let fix = j["verdict"]["fix"][0]["change"].as_str().unwrap_or("");
        assert!(fix.contains("input"), "{fix}\n{}", show(&j));
        // The drops placed in time (~100 ms intervals), and the slow requests joined to
        // them by time: each waited through an interval with netfilter drops.
        let timeline = j["layers"]["host"]["data"]["drops"]["data"]["timeline"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            timeline.len() >= 2
                && timeline
                    .iter()
                    .all(|t| t["start_unix_us"].as_u64() < t["end_unix_us"].as_u64()),
            "{}",
            show(&j)
        );
        assert!(
            has_line(&j, "host", |t| t.starts_with("joined by time")),
            "{}",
            show(&j)
        );
        assert!(
            has_line(&j, "packets", |t| t.contains("no D-SACK")
                && t.contains("stream")),
            "{}",
            show(&j)
        );
    }
}

/// Runs `tc ARGS` in the lab's namespace; its output.
fn tc(lab: &Lab, args: &[&str]) -> String {
    common::tc_in_lab(lab, args)
}

/// A tbf qdisc (handle 10:) below an htb root (1:) on the server's device, fed a share of
/// the data segments leaving `sport`. Filters (u32, the classifier this kernel has):
/// segments from `sport` under 128 bytes of IP length (SYN-ACKs, pure ACKs, FINs) go to the
/// plain class 1:2, as does everything else by default; data segments from `sport` whose
/// IP ID has bits 1–5 clear go to 1:1, the tbf. The IP ID counts up per packet of a
/// socket, so that is about one data segment in 32 — a retransmission gets a new ID — on
/// a quiet or a busy machine alike. Their rate far exceeds the tbf's 100 kbit/s and its
/// queue holds one segment: nearly all of them drop (QDISC_DROP).
fn tbf_on_data_segments(lab: &Lab, sport: u16) {
    let dev = lab.server_iface();
    let _ = Command::new("tc")
        .args(["-n", &lagtrace_lab::netns_name(lab.name())])
        .args(["qdisc", "del", "dev", dev, "root"])
        .output();
    let port = sport.to_string();
    let qdisc = |rest: &[&str]| {
        let mut a = vec!["qdisc", "add", "dev", dev];
        a.extend_from_slice(rest);
        tc(lab, &a);
    };
    qdisc(&[
        "root", "handle", "1:", "htb", "default", "2", "r2q", "100000",
    ]);
    for class in ["1:1", "1:2"] {
        tc(
            lab,
            &[
                "class", "add", "dev", dev, "parent", "1:", "classid", class, "htb", "rate",
                "10gbit",
            ],
        );
    }
    qdisc(&[
        "parent", "1:1", "handle", "10:", "tbf", "rate", "100kbit", "burst", "1600", "limit",
        "1600",
    ]);
    let filter = |prio: &str, last: [&str; 6], flow: &str| {
        let mut a = vec![
            "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", prio, "u32",
            "match", "ip", "protocol", "6", "0xff", "match", "ip", "sport", &port, "0xffff",
        ];
        a.extend_from_slice(&last);
        a.extend_from_slice(&["flowid", flow]);
        tc(lab, &a);
    };
    filter("1", ["match", "u16", "0", "0xff80", "at", "2"], "1:2");
    filter("2", ["match", "u16", "0", "0x003e", "at", "4"], "1:1");
}

/// The tbf's drops so far, as `tc -s qdisc` prints them.
fn tc_tbf_dropped(lab: &Lab) -> u64 {
    let out = tc(lab, &["-s", "qdisc", "show", "dev", lab.server_iface()]);
    out.split("qdisc tbf 10:")
        .nth(1)
        .and_then(|s| s.split("dropped ").nth(1))
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tbf 10: in {out}"))
}

#[test]
#[ignore = "needs root"]
fn nginx_behind_a_tbf_child_qdisc_that_drops_is_packet_loss_dropped_before_wire() {
    let lab = Lab::up(&LabOptions::new(&name("tbf"))).expect("lab up");
    let port: u16 = lab
        .good_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("port");
    tbf_on_data_segments(&lab, port);
    let dev = lab.server_iface().to_string();
    for run in 0..3 {
        let before = tc_tbf_dropped(&lab);
        let (j, err) = diagnose(&lab.good_url(), &["-d", "3s"]);
        let after = tc_tbf_dropped(&lab);
        eprintln!(
            "tbf run {run}: {} / {} / tail: {} / fix at {} (tc: {} dropped during the diagnosis)",
            j["verdict"]["cause"],
            j["verdict"]["mechanism"],
            j["verdict"]["tail"]["text"],
            j["verdict"]["fix"][0]["location"],
            after - before
        );
        assert_dropped_before_wire(&j, &err, &format!("tc -s qdisc show dev {dev}"));
        // The child tbf is named, with its handle, parent and device — not the htb root.
        let at = format!("tbf qdisc 10: (parent 1:1) on {dev}");
        assert_eq!(
            j["verdict"]["fix"][0]["location"],
            at.as_str(),
            "{}",
            show(&j)
        );
        assert!(
            j["verdict"]["tail"]["text"]
                .as_str()
                .is_none_or(|t| t.contains(&format!("by the {at}"))),
            "{}",
            show(&j)
        );
        // rtnetlink against the tool: the window's tbf counts lie within what `tc -s qdisc`
        // counted around the diagnosis, and the tracepoint saw the same drops on the device.
        let h = &j["layers"]["host"]["data"];
        let tbf = h["qdiscs"]["data"]
            .as_array()
            .and_then(|a| a.iter().find(|q| q["kind"] == "tbf"))
            .unwrap_or_else(|| panic!("{}", show(&j)));
        let (window, total) = (
            tbf["drops"].as_u64().unwrap_or(0),
            tbf["drops_total"].as_u64().unwrap_or(0),
        );
        assert!(
            window <= after - before && (before..=after).contains(&total),
            "netlink {window} ({total} in all) vs tc {before}..{after}"
        );
        let traced: u64 = h["drops"]["data"]["devices"]
            .as_array()
            .and_then(|a| a.iter().find(|d| d["device"] == dev.as_str()))
            .and_then(|d| d["reasons"].as_array())
            .and_then(|r| r.iter().find(|r| r["reason"] == "QDISC_DROP"))
            .and_then(|r| r["count"].as_u64())
            .unwrap_or(0);
        assert!(
            traced.abs_diff(window) <= 2 + window / 50,
            "tracepoint {traced} vs qdisc {window}: {}",
            show(&j)
        );
        // Drops on a material share: at least 2 % of the c=N run's requests.
        let requests = j["verdict"]["cost"]["of"].as_u64().unwrap_or(u64::MAX);
        assert!(
            window * 50 >= requests,
            "{window} of {requests}: {}",
            show(&j)
        );
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
    drop_output_in_lab(&lab, 9093, 5);
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
    let before = nft_dropped_in_lab(&lab);
    let (j, err) = diagnose(&lab.good_url(), &["-d", "3s"]);
    let during = nft_dropped_in_lab(&lab) - before;
    assert!(during > 0, "the other port's drops happened: {}", show(&j));
    assert_eq!(j["layers"]["host"]["status"], "ok", "{err}\n{}", show(&j));
    assert!(j["verdict"].get("mechanism").is_none(), "{}", show(&j));
    assert_ne!(j["verdict"]["cause"], "packet-loss", "{}", show(&j));
    drop(other);
}

/// Tail loss in the middle of big responses (issue 28 item 4): nginx serving a 64 KB page at
/// c=32 while 5 % of its full-size data segments (GSO bursts on the veth) are lost on the
/// way to the client (an nftables `netdev` rule at the client side's ingress, past the
/// server's capture point, as a lossy link would lose them). Most losses are repaired by
/// fast retransmission within a 30 µs round trip and cost nothing (at 1 % the verdict is
/// rightly `healthy`, p99 5.8 ms); a lost retransmission or a response's lost last segment
/// waits for a probe or the retransmission timer: the p99, a tail. Such a run moves hundreds of thousands of packets; the capture
/// once stopped at 200 000 (part of the run), and a loss after that had no packets. The
/// whole run is captured now: the loss is named (`packet-loss`) three runs out of three,
/// the capture covers the run to its end without losing a packet, and every kept record
/// finds its transaction.
#[test]
#[ignore = "needs root"]
fn tail_loss_mid_response_on_64kb_pages_at_c32_is_packet_loss_over_the_whole_run() {
    let lab = Lab::up(&LabOptions::new(&name("big"))).expect("lab up");
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::write(root.path().join("index.html"), vec![b'x'; 64 << 10]).expect("page");
    let port = 8090;
    let (_nginx, _dir) = common::nginx_in_lab(
        &lab,
        port,
        "sendfile on; tcp_nodelay on;",
        "",
        &format!("root {};", root.path().display()),
    );
    lab.drop_percent_of(5, "ip length > 1000")
        .expect("nft netdev rule");
    let url = format!("http://{}:{port}/", lab.server_addr());
    for run in 1..=3 {
        let (j, err) = diagnose(&url, &["-d", "4s"]);
        let p = &j["layers"]["packets"]["data"];
        let cn = &j["layers"]["app"]["data"]["cn"];
        eprintln!(
            "run {run}: {} / {} / tail: {} ({} packets, {} lost by the capture, {} requests)",
            j["verdict"]["cause"],
            j["verdict"]["mechanism"],
            j["verdict"]["tail"]["text"],
            p["packets"],
            p["dropped"],
            cn["requests"]
        );
        assert_eq!(j["verdict"]["cause"], "packet-loss", "{err}\n{}", show(&j));
        assert!(
            j["verdict"]["tail"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("loss recovery")),
            "{}",
            show(&j)
        );
        // The whole run: the capture's last packet is at the run's end, nothing was left
        // out of the split for want of packets, and the capture lost none.
        let join = &p["joins"][p["joins"]
            .as_array()
            .map_or(0, |a| a.len().saturating_sub(1))];
        let until = join["captured_until_us"].as_u64().unwrap_or(0);
        let run_us = cn["duration_us"].as_u64().unwrap_or(u64::MAX);
        assert!(
            until + 200_000 >= run_us,
            "captured until {until} µs of a {run_us} µs run: {}",
            show(&j)
        );
        assert!(
            !common::evidence_lines(&j).contains("after the capture stopped"),
            "{}",
            show(&j)
        );
        assert_eq!(p["dropped"], 0, "{}", show(&j));
        // Every kept record found its transaction.
        assert_eq!(
            join["matched"].as_u64(),
            join["requests"].as_array().map(|a| a.len() as u64),
            "{}",
            show(&j)
        );
    }
}
