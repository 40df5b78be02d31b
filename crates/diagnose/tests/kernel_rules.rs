//! The `kernel-stack` rule on constructed evidence: the kernel's receive cost per packet
//! names the cause only when it is far above a normal stack's *and* a material share of the
//! typical request; the rule walk names the mechanism only beside that measured cost.

use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::{Mechanism, judge};
use lagtrace_model::Cause;
use lagtrace_model::host::HostReport;
use lagtrace_testkit::layers::{Synth, target};
use serde_json::{Value, json};

/// A host report whose receive softirq took `per_packet_ns` a packet on 10 000 packets of
/// the server's namespace (20 000 machine-wide at `machine_ns` each), the busiest CPU
/// `busiest` of the window, and whose netfilter walk for :80 is `walks` (`None`: not read).
fn host(per_packet_ns: u64, machine_ns: u64, busiest: f64, walks: Option<Value>) -> HostReport {
    let netfilter = match walks {
        Some(w) => json!({"status": "ok", "data": {
            "rules": 20_001, "port": 80, "walks": w, "source": "nft -j list ruleset"}}),
        None => json!({"status": "skipped", "reason": "not read"}),
    };
    let rx_us = 20_000 * machine_ns / 1000;
    serde_json::from_value(json!({
        "scope": {"netns": "lt-lab", "pid": 4242, "comm": "nginx", "netns_inode": 1},
        "window_us": 3_000_000,
        "counters": {"status": "ok", "data": []},
        "listeners": {"status": "ok", "data": []},
        "cgroup": {"status": "skipped", "reason": "x"},
        "threads": {"status": "skipped", "reason": "x"},
        "qdiscs": {"status": "ok", "data": []},
        "sockstat": {"status": "skipped", "reason": "x"},
        "drops": {"status": "skipped", "reason": "x"},
        "softirq": {"status": "ok", "data": {
            "timed": true,
            "cpus": [{"cpu": 0, "rx_us": rx_us, "tx_us": 0, "rx_packets": 20_000,
                      "rx_share": busiest, "backlog_drops": 0, "time_squeeze": 0}],
            "rx_us": rx_us, "tx_us": 0, "rx_packets": 20_000,
            "rx_ns_per_packet": machine_ns,
            "netns_packets": 10_000, "netns_rx_us": 10_000 * per_packet_ns / 1000,
            "netns_ns_per_packet": per_packet_ns,
            "busiest_rx_share": busiest, "backlog_drops": 0, "time_squeeze": 0,
            "ksoftirqd_us": 0, "window_us": 3_000_000}},
        "netfilter": netfilter,
        "cost": {"cpu_us": 0, "cpu_share": 0.0}
    }))
    .expect("host report")
}

/// The verdict is `kernel-stack` with `mechanism`.
fn kernel_stack(j: &lagtrace_diagnose::Judgement, mechanism: Option<Mechanism>) {
    assert_eq!(j.verdict.cause, Cause::KernelStack, "{j:#?}");
    assert_eq!(j.verdict.mechanism, mechanism, "{j:#?}");
}

fn walk(walked: u64, verdict: &str) -> Value {
    json!([{"family": "inet", "table": "filter", "chain": "input", "hook": "input",
            "priority": 0, "rules": 20_000, "walked": walked, "verdict": verdict,
            "decided_by": null, "walked_new": walked, "verdict_new": verdict}])
}

/// Healthy layers (c=1 p50 110 µs, SYN RTT 60 µs on a direct path) with `h` as the host.
fn layers(h: HostReport) -> Layers {
    let mut l = Synth::RULES.healthy_layers();
    l.host = Layer::ran(h);
    l
}

#[test]
fn a_long_rule_walk_with_a_costly_packet_is_kernel_stack_netfilter_rules() {
    let l = layers(host(
        300_000,
        150_000,
        0.6,
        Some(walk(20_000, "policy accept")),
    ));
    let j = judge(&target(), &l);
    kernel_stack(&j, Some(Mechanism::NetfilterRules));
    assert_eq!(j.verdict.cost.added_us, 300, "{j:#?}");
    let f = &j.verdict.fix[0];
    assert_eq!(
        f.location.as_deref(),
        Some("nft list chain inet filter input")
    );
    assert!(f.change.contains("walks 20000 rules"), "{f:?}");
    assert!(f.change.contains("tcp dport 80 accept"), "{f:?}");
    // The server namespace's own figure, not the machine's.
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("300µs per packet") && e.text.contains("server's namespace")),
        "{j:#?}"
    );
}

#[test]
fn a_costly_packet_without_a_long_walk_on_a_busy_softirq_cpu_is_softirq_saturated() {
    let l = layers(host(60_000, 60_000, 0.8, Some(walk(1, "accept"))));
    let j = judge(&target(), &l);
    kernel_stack(&j, Some(Mechanism::SoftirqSaturated));
}

#[test]
fn a_costly_packet_the_host_cannot_explain_is_kernel_stack_without_a_mechanism() {
    let l = layers(host(60_000, 60_000, 0.2, None));
    let j = judge(&target(), &l);
    kernel_stack(&j, None);
    assert!(j.verdict.fix[0].change.contains("perf"), "{j:#?}");
}

#[test]
fn a_normal_stack_beside_a_long_chain_it_does_not_walk_is_healthy() {
    // 20 000 rules in the ruleset, the port accepted by the first: 4 µs a packet.
    let l = layers(host(4_000, 6_000, 0.1, Some(walk(1, "accept"))));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("4µs per packet") && e.text.contains("normal stack")),
        "{j:#?}"
    );
    assert!(
        j.evidence.iter().any(|e| e.text.contains("20001 rules")),
        "the rules that are there are noted: {j:#?}"
    );
}

#[test]
fn a_costly_packet_small_next_to_the_request_is_not_the_cause() {
    // 30 µs a packet against a 5 ms request at c=1: under a tenth.
    let mut l = layers(host(
        30_000,
        30_000,
        0.3,
        Some(walk(2_000, "policy accept")),
    ));
    let app = l.app.data.as_mut().unwrap();
    app.c1 = Some(Synth::RULES.run(1, 5_000, 6_000, 190.0));
    let j = judge(&target(), &l);
    assert_ne!(j.verdict.cause, Cause::KernelStack, "{j:#?}");
}

#[test]
fn too_few_packets_of_the_namespace_fall_back_to_the_machines_cost() {
    let mut h = host(300_000, 3_000, 0.1, Some(walk(20_000, "policy accept")));
    let k = h.softirq.data.as_mut().unwrap();
    k.netns_packets = 40;
    let j = judge(&target(), &layers(h));
    // 3 µs machine-wide: a normal stack; 40 packets say nothing on their own.
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
}

#[test]
fn an_untimed_softirq_names_nothing() {
    let mut h = host(300_000, 300_000, 0.9, Some(walk(20_000, "policy accept")));
    h.softirq.data.as_mut().unwrap().timed = false;
    let j = judge(&target(), &layers(h));
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
}

#[test]
fn a_long_walk_of_new_connections_only_is_named_for_their_syn() {
    // `ct state established,related accept` first: only a connection's SYN walks the rest.
    let w = json!([{"family": "inet", "table": "filter", "chain": "input", "hook": "input",
        "priority": 0, "rules": 20_001, "walked": 1, "verdict": "accept", "decided_by": 2,
        "walked_new": 20_001, "verdict_new": "policy accept"}]);
    let l = layers(host(300_000, 150_000, 0.6, Some(w)));
    let j = judge(&target(), &l);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::NetfilterRules),
        "{j:#?}"
    );
    assert!(
        j.verdict.fix[0].change.contains("walks 20001 rules"),
        "{j:#?}"
    );
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("a new connection's SYN 20001 of its 20001 rules")),
        "{j:#?}"
    );
}

#[test]
fn a_walk_too_short_for_the_cost_does_not_name_the_rules() {
    // 300 rules (a container host's nat chains) cannot account for 60 µs a packet.
    let l = layers(host(60_000, 60_000, 0.8, Some(walk(300, "policy accept"))));
    let j = judge(&target(), &l);
    kernel_stack(&j, Some(Mechanism::SoftirqSaturated));
}

#[test]
fn the_path_line_needs_the_kernel_to_be_most_of_the_rtt() {
    let syn_line = |j: &lagtrace_diagnose::Judgement| {
        j.evidence
            .iter()
            .any(|e| e.text.contains("on a direct (one-hop) path"))
    };
    // SYN RTT 60 µs in the healthy layers against 300 µs a packet: not the RTT's part.
    let l = layers(host(
        300_000,
        150_000,
        0.6,
        Some(walk(20_000, "policy accept")),
    ));
    assert!(!syn_line(&judge(&target(), &l)));
    // SYN RTT 600 µs: most of it is the kernel's.
    let mut l = layers(host(
        300_000,
        150_000,
        0.6,
        Some(walk(20_000, "policy accept")),
    ));
    let p = l.path.data.as_mut().unwrap();
    p.idle = Some(lagtrace_testkit::layers::rtt(600));
    let j = judge(&target(), &l);
    assert!(syn_line(&j), "{j:#?}");
}

#[test]
fn an_untimed_softirq_says_so() {
    let mut h = host(300_000, 300_000, 0.9, None);
    h.softirq.data.as_mut().unwrap().timed = false;
    h.softirq.reason = Some("needs CAP_BPF".into());
    let j = judge(&target(), &layers(h));
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("was not measured (needs CAP_BPF)")),
        "{j:#?}"
    );
}

/// The server's capture times the kernel's answer to each SYN (SYN in → SYN-ACK out): beside
/// a costly receive path it supports the cause; with a normal one it is a note, not a cause.
#[test]
fn the_handshake_gap_at_the_servers_capture_supports_the_measured_cost() {
    let gap = |p50: u64| Percentiles {
        count: 40,
        min_us: p50 / 2,
        mean_us: p50,
        p50_us: p50,
        p90_us: p50 * 2,
        p99_us: p50 * 3,
        p999_us: p50 * 3,
        max_us: p50 * 3,
    };
    let mut l = layers(host(
        300_000,
        150_000,
        0.6,
        Some(walk(20_000, "policy accept")),
    ));
    l.packets.data.as_mut().unwrap().server_syn_synack = Some(gap(560));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::KernelStack, "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e.layer == LayerName::Packets
            && e.stance == lagtrace_diagnose::Stance::Supports
            && e.text.contains("SYN in → its SYN-ACK out took p50 560µs")),
        "{:#?}",
        j.evidence
    );
    let mut l = layers(host(3_000, 3_000, 0.1, None));
    l.packets.data.as_mut().unwrap().server_syn_synack = Some(gap(18));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
    assert!(
        j.evidence.iter().any(
            |e| e.stance == lagtrace_diagnose::Stance::Note && e.text.contains("took p50 18µs")
        ),
        "{:#?}",
        j.evidence
    );
}

/// `host(...)` with the server's TCP packets' waits in a backlog queue: median `p50_us` over
/// `packets` packets.
fn queued(busiest: f64, p50_us: u64, packets: u64) -> HostReport {
    let mut h = host(2_000, 2_000, busiest, Some(walk(1, "accept")));
    if let Some(k) = h.softirq.data.as_mut() {
        k.netns_backlog_wait = Some(lagtrace_model::host::BacklogWait {
            packets,
            mean_us: p50_us,
            p50_us,
            p99_us: p50_us * 3,
            max_us: p50_us * 10,
        });
        k.ksoftirqd_us = 1_500_000;
    }
    h
}

#[test]
fn cheap_packets_that_keep_a_cpu_busy_and_queue_the_servers_are_softirq_saturated() {
    // A flood: 2 µs a packet (a normal stack's), CPU 0 93 % in the receive softirq, the
    // server's packets ~240 µs in its backlog against a 110 µs request.
    let j = judge(&target(), &layers(queued(0.93, 240, 50_000)));
    kernel_stack(&j, Some(Mechanism::SoftirqSaturated));
    assert_eq!(j.verdict.cost.added_us, 240, "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e.text.contains("backlog queue")
            && e.text.contains("p50 240µs")
            && e.text.contains("CPU 0")),
        "{j:#?}"
    );
    assert_eq!(
        j.verdict.fix[0].location.as_deref(),
        Some("CPU 0: /proc/net/softnet_stat, mpstat -P 0 1"),
        "{j:#?}"
    );
}

#[test]
fn a_busy_softirq_cpu_whose_queue_the_server_does_not_wait_in_is_not_named() {
    // The CPU busy, the server's packets through at once (another CPU's traffic).
    let j = judge(&target(), &layers(queued(0.93, 8, 50_000)));
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
    // The server's packets queued, no CPU busy with the receive work: not this (a hand-off
    // delayed by something else, e.g. the CPU's own scheduling).
    let j = judge(&target(), &layers(queued(0.3, 240, 50_000)));
    assert_ne!(
        j.verdict.mechanism,
        Some(Mechanism::SoftirqSaturated),
        "{j:#?}"
    );
    // Too few packets timed to speak for the server's.
    let j = judge(&target(), &layers(queued(0.93, 240, 20)));
    assert_ne!(
        j.verdict.mechanism,
        Some(Mechanism::SoftirqSaturated),
        "{j:#?}"
    );
    // A queue small next to the typical request (110 µs): 10 µs is not its source.
    let j = judge(&target(), &layers(queued(0.93, 10, 50_000)));
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
}
