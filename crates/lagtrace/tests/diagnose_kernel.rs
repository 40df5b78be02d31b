//! `lagtrace diagnose` on the case study's second cause, the kernel's packet processing
//! (needs root): netfilter rules in the server's namespace that every packet to nginx walks
//! one by one are `kernel-stack` / `netfilter-rules`, naming the chain and how many rules a
//! packet walks; the same ports matched by one set, or the same rules behind a rule that
//! accepts the server's port, are `healthy` — the cost is measured (the receive softirq's
//! time per packet of the server's namespace), never inferred from counting rules. A UDP
//! flood that keeps the server's receive CPU busy while nginx itself is quick is
//! `kernel-stack` / `softirq-saturated`: cheap packets, but the server's own wait in the
//! CPU's backlog queue behind them. Each fault is diagnosed three times: the verdict must
//! not change. Labs are removed by guards.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use lagtrace_lab::{Lab, LabOptions};
use serde_json::Value;

fn name(test: &str) -> String {
    format!("hk{test}{}", std::process::id())
}

/// Loads `rules` (nft syntax, or iptables-restore's with `iptables`) in the lab's namespace,
/// holding the measuring turn: loading 20 000 rules takes half a second of kernel CPU, which
/// paused another test's nginx three times in a row mid-diagnosis (`periodic-pause`).
fn load(lab: &Lab, tool: &[&str], rules: &str) {
    let _turn = lagtrace_testkit::measuring();
    let ns = lagtrace_lab::netns_name(lab.name());
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns])
        .args(tool)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ip netns exec");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(rules.as_bytes())
        .expect("write the rules");
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{tool:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The kernel finishes a large commit after the command returns (the set's hash table
    // grown by a worker, the old generation freed): let it, holding the turn, before any
    // diagnose — a healthy nginx measured right after the 20 000-element set was loaded
    // read slow-server, p99 6.7 ms (suite run).
    lagtrace_testkit::settle(std::time::Duration::from_secs(5));
}

/// Removes the lab and its rules while holding the measuring turn, then waits for the
/// kernel's cleanup to finish: freeing 20 000 rules and the namespace runs in kernel workers
/// after the commands return, and, outside the turn, paused another test's healthy nginx
/// every ~114 ms for ~14 ms (`periodic-pause` at its p99.9).
fn unload(lab: Lab) {
    let _turn = lagtrace_testkit::measuring();
    let ns = lagtrace_lab::netns_name(lab.name());
    // iptables' nf_tables backend keeps its rules in nf_tables too: one flush removes both.
    let _ = lagtrace_testkit::try_in_ns(&ns, &["nft", "flush", "ruleset"]);
    drop(lab);
    lagtrace_testkit::settle(std::time::Duration::from_secs(5));
}

/// One nft table `ltk` with an input chain of `lines` (policy accept).
fn nft_input(lines: &[String]) -> String {
    format!(
        "table inet ltk {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n{}\n }}\n}}\n",
        lines.join("\n")
    )
}

/// `n` rules dropping TCP ports the server does not listen on, one port per rule.
fn linear(n: u16) -> Vec<String> {
    (0..n)
        .map(|i| format!("  tcp dport {} drop", 20001 + i))
        .collect()
}

fn diagnose(lab: &Lab) -> Value {
    let (_, j, err) = common::diagnose_json(&lab.good_url(), &["-d", "2s"]);
    assert!(j["verdict"].is_object(), "{err}");
    j
}

fn show(j: &Value) -> String {
    let h = &j["layers"]["host"]["data"];
    format!(
        "{}\n{}softirq {}\nnetfilter {}",
        serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default(),
        common::evidence_lines(j),
        h["softirq"],
        h["netfilter"]
    )
}

/// The server namespace's receive cost per packet (ns), as the host layer timed it.
fn per_packet_ns(j: &Value) -> u64 {
    let k = &j["layers"]["host"]["data"]["softirq"]["data"];
    k["netns_ns_per_packet"]
        .as_u64()
        .unwrap_or_else(|| panic!("{k}"))
}

/// SYN in → SYN-ACK out at the server's capture, p50 µs (the packet layer's).
fn handshake_gap_us(j: &Value) -> u64 {
    let g = &j["layers"]["packets"]["data"]["server_syn_synack"];
    g["p50_us"].as_u64().unwrap_or_else(|| panic!("{g}"))
}

/// Three diagnoses of a linear chain: `kernel-stack` / `netfilter-rules` each time, naming
/// the chain and the rules a packet walks.
fn named_three_times(lab: &Lab, chain: &str, walked: u64) {
    let _turn = lagtrace_testkit::measuring();
    for _ in 0..3 {
        let j = diagnose(lab);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "kernel-stack", "{}", show(&j));
        assert_eq!(v["mechanism"], "netfilter-rules", "{}", show(&j));
        let fix = &v["fix"][0];
        assert!(
            fix["location"].as_str().is_some_and(|l| l.contains(chain)),
            "{}",
            show(&j)
        );
        assert!(
            fix["change"]
                .as_str()
                .is_some_and(|c| c.contains(&format!("walks {walked} rules"))),
            "{}",
            show(&j)
        );
        let w = &j["layers"]["host"]["data"]["netfilter"]["data"]["walks"];
        assert!(
            w.as_array()
                .is_some_and(|w| w.iter().any(|w| w["walked"] == walked)),
            "{w}"
        );
        // The measured cost names it: far above a normal stack's few µs per packet.
        assert!(per_packet_ns(&j) >= 20_000, "{}", show(&j));
        // And the server's capture shows the same cost from the packets' side: a SYN walks
        // the chain on its way in, so its SYN-ACK leaves at least about a packet's cost later.
        let gap = handshake_gap_us(&j);
        assert!(
            gap * 1000 >= per_packet_ns(&j) / 2,
            "SYN→SYN-ACK p50 {gap} µs against {} ns a packet: {}",
            per_packet_ns(&j),
            show(&j)
        );
        eprintln!(
            "{} / {}: {} ns per packet, SYN→SYN-ACK p50 {} µs; {}",
            v["cause"],
            v["mechanism"],
            per_packet_ns(&j),
            handshake_gap_us(&j),
            v["cost"]["text"]
        );
    }
}

fn healthy_three_times(lab: &Lab) {
    let _turn = lagtrace_testkit::measuring();
    for _ in 0..3 {
        let j = diagnose(lab);
        assert_eq!(j["verdict"]["cause"], "healthy", "{}", show(&j));
        assert!(per_packet_ns(&j) < 20_000, "{}", show(&j));
        eprintln!(
            "healthy: {} ns per packet, SYN→SYN-ACK p50 {} µs",
            per_packet_ns(&j),
            handshake_gap_us(&j)
        );
    }
}

#[test]
#[ignore = "needs root"]
fn twenty_thousand_rules_in_one_linear_input_chain_are_kernel_stack_netfilter_rules() {
    let lab = Lab::up(&LabOptions::new(&name("lin"))).expect("lab up");
    load(&lab, &["nft", "-f", "-"], &nft_input(&linear(20_000)));
    named_three_times(&lab, "inet ltk input", 20_000);
    unload(lab);
}

/// The control: the same 20 000 ports in one set, one rule — one hash lookup per packet.
#[test]
#[ignore = "needs root"]
fn the_same_ports_in_one_set_are_healthy() {
    let lab = Lab::up(&LabOptions::new(&name("set"))).expect("lab up");
    let ports: Vec<String> = (0..20_000u16).map(|i| (20001 + i).to_string()).collect();
    let rule = format!("  tcp dport {{ {} }} drop", ports.join(", "));
    load(&lab, &["nft", "-f", "-"], &nft_input(&[rule]));
    healthy_three_times(&lab);
    unload(lab);
}

/// 20 000 rules behind one that accepts the server's port: they are there, a packet to the
/// server never walks them.
#[test]
#[ignore = "needs root"]
fn twenty_thousand_rules_behind_an_accept_for_the_port_are_healthy() {
    let lab = Lab::up(&LabOptions::new(&name("acc"))).expect("lab up");
    let port = lab.good_addr().port();
    let mut lines = vec![format!("  tcp dport {port} accept")];
    lines.extend(linear(20_000));
    load(&lab, &["nft", "-f", "-"], &nft_input(&lines));
    healthy_three_times(&lab);
    unload(lab);
}

/// Ten times fewer rules, written with iptables (its nf_tables backend, Debian's default):
/// 2 000 rules still cost tens of µs per packet against a request of ~100 µs.
#[test]
#[ignore = "needs root"]
fn two_thousand_iptables_rules_are_named_too() {
    let lab = Lab::up(&LabOptions::new(&name("ipt"))).expect("lab up");
    let rules: Vec<String> = (0..2_000u16)
        .map(|i| format!("-A INPUT -p tcp --dport {} -j DROP", 20001 + i))
        .collect();
    let restore = format!(
        "*filter\n:INPUT ACCEPT [0:0]\n{}\nCOMMIT\n",
        rules.join("\n")
    );
    load(&lab, &["iptables-restore"], &restore);
    named_three_times(&lab, "ip filter INPUT", 2_000);
    unload(lab);
}

/// The flooder (`common/udp_flood.c`): Ethernet frames written to a device through an
/// AF_PACKET socket, 64 a call; it stops by itself after the seconds it is given.
const UDP_FLOOD_C: &str = include_str!("common/udp_flood.c");

/// The flooder while it runs: killed and reaped when dropped, even on a failed assertion.
struct Flood(std::process::Child);

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The server's TCP packets' median wait in a CPU's backlog queue (µs), as the host layer
/// timed it.
fn backlog_p50_us(j: &Value) -> u64 {
    let k = &j["layers"]["host"]["data"]["softirq"]["data"];
    k["netns_backlog_wait"]["p50_us"]
        .as_u64()
        .unwrap_or_else(|| panic!("no backlog wait timed: {k}"))
}

/// A UDP flood into the server's namespace, every packet of which one CPU's receive softirq
/// takes (RPS on the server's veth set to that CPU, as a single-queue NIC's interrupt would
/// be), sent from the other CPU: 2 µs a packet, a normal stack's, but so many that the CPU
/// is busy with them most of the window and nginx's requests wait behind them in its backlog
/// queue. `kernel-stack` / `softirq-saturated`, three times, naming the CPU; the same lab
/// without the flood is healthy, its packets through the backlog in a few µs.
///
/// The server's packets' queue comes and goes with the flood's bursts (the flooder shares the
/// other CPU with nginx and the load: 12 of 12 runs read a median wait of 175–415 µs on one
/// afternoon, 2 of 4 under 50 µs later, CPU 0 86–92 % busy either way). Where the queue is
/// short, the server's threads wait for a CPU the softirq holds: named from that wait.
///
/// Not in the suite unless `LAGTRACE_TEST_FLOOD=1`: on two CPUs the flood's sender shares the
/// load generator's CPU: of the last runs, 1 of 3 read `healthy` once (the tail the clients'
/// own reads: the sender delayed them), and with the sender at nice 19, 3 of 5 (the flood kept
/// CPU 0 only 43 % busy). A third CPU for the sender would make it a test of the kernel alone.
#[test]
#[ignore = "needs root"]
fn a_udp_flood_that_keeps_the_receive_cpu_busy_is_softirq_saturated() {
    if std::env::var_os("LAGTRACE_TEST_FLOOD").is_none() {
        eprintln!("skipped: set LAGTRACE_TEST_FLOOD=1 (unstable on two CPUs, see the doc)");
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("skipped: needs two CPUs, one to take the flood and one to send it");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = lagtrace_testkit::compile_c(dir.path(), "udp_flood", UDP_FLOOD_C, &["-O2"]);
    let lab = Lab::up(&LabOptions::new(&name("fld"))).expect("lab up");
    let ns = lagtrace_lab::netns_name(lab.name());
    let dev = lab.server_iface().to_string();
    lagtrace_testkit::in_ns(
        &ns,
        &[
            "sh",
            "-c",
            // Every receive queue (a veth has one per CPU: the senders' queue choice
            // would otherwise spread the requests over both CPUs).
            &format!("for q in /sys/class/net/{dev}/queues/rx-*; do echo 1 > $q/rps_cpus; done"),
        ],
    );
    let mac = lagtrace_testkit::in_ns(&ns, &["cat", &format!("/sys/class/net/{dev}/address")])
        .trim()
        .to_string();
    {
        let _turn = lagtrace_testkit::measuring();
        // The control first: the same lab and RPS, no flood. The wait is timed only once a
        // CPU is busy in the receive softirq: here it may not be at all.
        let j = diagnose(&lab);
        assert_eq!(j["verdict"]["cause"], "healthy", "{}", show(&j));
        let w = &j["layers"]["host"]["data"]["softirq"]["data"]["netns_backlog_wait"];
        assert!(
            w.is_null() || w["p50_us"].as_u64() < Some(50),
            "{}",
            show(&j)
        );
        eprintln!("no flood: backlog wait {w}");
        let _flood = Flood(
            Command::new("setpriv")
                .args([
                    "--pdeathsig",
                    "KILL",
                    "taskset",
                    "-c",
                    &(cpus - 1).to_string(),
                ])
                .arg(&bin)
                .args([
                    lab.client_iface(),
                    &mac,
                    &lab.client_addr().to_string(),
                    &lab.server_addr().to_string(),
                    "9",
                    "90",
                ])
                .stdout(Stdio::null())
                .spawn()
                .expect("start the flooder"),
        );
        std::thread::sleep(std::time::Duration::from_secs(1));
        for _ in 0..3 {
            let j = diagnose(&lab);
            let v = &j["verdict"];
            assert_eq!(v["cause"], "kernel-stack", "{}", show(&j));
            assert_eq!(v["mechanism"], "softirq-saturated", "{}", show(&j));
            assert_eq!(
                v["fix"][0]["location"],
                "CPU 0: /proc/net/softnet_stat, mpstat -P 0 1",
                "{}",
                show(&j)
            );
            let k = &j["layers"]["host"]["data"]["softirq"]["data"];
            assert!(per_packet_ns(&j) < 20_000, "cheap packets: {}", show(&j));
            // From the server's packets' wait in the backlog queue, or from its threads'
            // wait for a CPU the softirq holds (the queue comes and goes with the flood's
            // bursts): either way the evidence says which.
            let text = j["evidence"].to_string();
            assert!(
                backlog_p50_us(&j) >= 50 || text.contains("receive softirq held the CPUs"),
                "{}",
                show(&j)
            );
            eprintln!(
                "flood: backlog wait p50 {} µs, busiest CPU {:.2} in the receive softirq, {} ns a packet, timed over {:.0}% of the window",
                backlog_p50_us(&j),
                k["busiest_rx_share"].as_f64().unwrap_or(0.0),
                per_packet_ns(&j),
                k["timed_share"].as_f64().unwrap_or(0.0) * 100.0
            );
        }
    }
    unload(lab);
}
