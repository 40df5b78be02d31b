//! The verdict rules on constructed evidence: evidence in, verdict out. One case per cause,
//! and the cases that must NOT raise an alarm.

use lagtrace_diagnose::Assemble;
use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::rules::tail;
use lagtrace_diagnose::{Confidence, Diagnosis, FixSide, Settings, Stance, judge};
use lagtrace_model::Cause;
use lagtrace_testkit::layers::{Synth, finding, rtt, target};

fn pct(count: u64, p50: u64, p99: u64) -> Percentiles {
    Synth::RULES.pct(count, p50, p99)
}

fn run(c: u32, p50: u64, p99: u64, rps: f64) -> AppRun {
    Synth::RULES.run(c, p50, p99, rps)
}

/// A healthy lab: veth RTT, fast server, nothing in the packets, NODELAY on.
fn healthy_layers() -> Layers {
    Synth::RULES.healthy_layers()
}

fn nagle_layers() -> Layers {
    let mut l = healthy_layers();
    let mut c1 = run(1, 41_200, 42_000, 24.0);
    c1.first_request = Some(pct(1, 350, 350));
    c1.later_requests = Some(pct(120, 41_200, 42_000));
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: Some(run(32, 43_900, 48_000, 730.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 3_650;
    p.server_time = Some(pct(3_650, 150, 2_000));
    p.findings = vec![
        finding("nagle-delayed-ack", 3_540, 3_650, 40_800),
        finding("delayed-ack", 3_540, 3_650, 40_800),
    ];
    let s = l.sockets.data.as_mut().unwrap();
    s.nodelay = OptionCount {
        on: 0,
        off: 32,
        unknown: 0,
    };
    s.config = vec![
        ConfigDirective {
            name: "tcp_nodelay".into(),
            value: "off".into(),
            file: "/run/lagtrace/lab/nginx-latency.conf".into(),
            line: 12,
            default: false,
        },
        ConfigDirective {
            name: "sendfile".into(),
            value: "on".into(),
            file: "/run/lagtrace/lab/nginx-latency.conf".into(),
            line: 10,
            default: false,
        },
    ];
    l
}

fn texts(j: &lagtrace_diagnose::Judgement) -> String {
    j.evidence
        .iter()
        .map(|e| format!("{:?} {:?} {}\n", e.layer, e.stance, e.text))
        .collect()
}

#[test]
fn healthy_server_is_healthy_with_high_confidence_and_rule_outs() {
    let j = judge(&target(), &healthy_layers());
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    assert!(j.verdict.secondary.is_empty());
    assert_eq!(j.verdict.confidence, Confidence::High);
    assert!(j.verdict.fix.is_empty());
    assert!(
        j.verdict.cost.text.starts_with("none"),
        "{}",
        j.verdict.cost.text
    );
    let t = texts(&j);
    assert!(t.contains("no queue on the path"), "{t}");
    assert!(t.contains("no retransmissions"), "{t}");
    assert!(t.contains("not the application"), "{t}");
    assert!(j.finding_layers.is_empty());
}

#[test]
fn small_or_rare_findings_are_no_alarm() {
    let mut l = healthy_layers();
    let p = l.packets.data.as_mut().unwrap();
    // The final ACK of a few connections delayed; a 4 ms stall on 2%.
    p.findings = vec![
        finding("delayed-ack", 30, 100_000, 40_000),
        finding("nagle-stall", 2_000, 100_000, 4_000),
        // Tail-loss probes ~5 ms apart on 2% (as in ../shared/case/healthy.pcap).
        finding("retransmission", 2_000, 100_000, 5_400),
    ];
    // A loaded 2-core machine: c=N p50 several ms, SYN RTT a little higher under load.
    l.app.data.as_mut().unwrap().cn = Some(run(32, 6_000, 25_000, 5_000.0));
    l.path.data.as_mut().unwrap().under_load = Some(rtt(2_500));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    assert!(j.verdict.secondary.is_empty(), "{:?}", j.verdict.secondary);
}

#[test]
fn healthy_remote_target_says_sockets_skipped_and_lowers_confidence() {
    let mut l = healthy_layers();
    l.sockets = Layer::skipped("the server is not on this machine");
    l.packets = Layer::unavailable("packet engine not built");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy);
    assert_eq!(j.verdict.confidence, Confidence::Medium);
    let t = texts(&j);
    assert!(
        t.contains("sockets layer skipped: the server is not on this machine"),
        "{t}"
    );
    assert!(t.contains("packets layer unavailable"), "{t}");
}

#[test]
fn reference_case_is_nagle_delayed_ack_with_the_config_line() {
    let j = judge(&target(), &nagle_layers());
    let v = &j.verdict;
    assert_eq!(v.cause, Cause::NagleDelayedAck, "{}", texts(&j));
    assert_eq!(v.confidence, Confidence::High);
    assert!(v.secondary.is_empty(), "{:?}", v.secondary);
    // The cost in the user's terms.
    assert!(v.cost.text.contains("97%"), "{}", v.cost.text);
    assert!(v.cost.text.contains("40.80ms"), "{}", v.cost.text);
    assert!(v.cost.text.contains("after the first"), "{}", v.cost.text);
    assert!(v.cost.text.contains("350µs"), "{}", v.cost.text); // first request's latency
    // The fix names the file and line.
    let f = &v.fix[0];
    assert_eq!(f.side, FixSide::Server);
    assert_eq!(
        f.location.as_deref(),
        Some("/run/lagtrace/lab/nginx-latency.conf:12")
    );
    assert!(f.change.contains("tcp_nodelay off; → tcp_nodelay on;"));
    // Client-side alternatives with trade-offs.
    assert!(v.fix.iter().any(|f| f.side == FixSide::Client
        && f.change.contains("TCP_QUICKACK")
        && f.tradeoff.is_some()));
    assert!(v.fix.iter().any(|f| f.change.contains("quickack 1")));
    let t = texts(&j);
    assert!(t.contains("stream 2 frames #41 #44 #45"), "{t}");
    assert!(t.contains("TCP_NODELAY off on 32/32"), "{t}");
    assert!(t.contains("nginx-latency.conf:12: tcp_nodelay off;"), "{t}");
    assert!(t.contains("no queue on the path"), "{t}");
    assert!(t.contains("not the application"), "{t}");
    assert!(t.contains("TCP_NODELAY on, delayed ACK on"), "{t}");
    for l in [LayerName::Packets, LayerName::Sockets, LayerName::App] {
        assert!(j.finding_layers.contains(&l), "{l:?}");
    }
    assert!(!j.finding_layers.contains(&LayerName::Path));
}

#[test]
fn nagle_without_config_lens_tells_to_set_nodelay_or_write_once() {
    let mut l = nagle_layers();
    let s = l.sockets.data.as_mut().unwrap();
    s.config.clear();
    s.server = Some(ServerProcess {
        pid: 99,
        comm: "lagtrace".into(),
        netns: "lab".into(),
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck);
    let f = &j.verdict.fix[0];
    assert!(
        f.change.contains("lagtrace (pid 99) sets no TCP_NODELAY"),
        "{}",
        f.change
    );
    assert!(f.change.contains("one call"), "{}", f.change);
}

#[test]
fn nagle_is_found_from_packets_alone_when_the_server_is_remote() {
    let mut l = nagle_layers();
    l.sockets = Layer::skipped("the server is not on this machine");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck);
    // Packets + app's 40 ms shape: still corroborated.
    assert_eq!(j.verdict.confidence, Confidence::High);
}

#[test]
fn nagle_without_packets_needs_sockets_and_the_40ms_shape() {
    let mut l = nagle_layers();
    l.packets = Layer::unavailable("not built");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck, "{}", texts(&j));
    // Without packets and sockets, the application's shape alone (first request on a
    // connection fast, later ones ~40 ms) still points at it, at low confidence.
    l.sockets = Layer::skipped("remote");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::Low);
    assert!(texts(&j).contains("run as root"), "{}", texts(&j));
    assert!(
        texts(&j).contains("packets layer unavailable"),
        "{}",
        texts(&j)
    );
    // A server that takes 41 ms on every request, the first included, is slow, not Nagle.
    let c1 = l.app.data.as_mut().unwrap().c1.as_mut().unwrap();
    c1.first_request = Some(pct(1, 41_000, 41_000));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{}", texts(&j));
    assert!(j.verdict.confidence < Confidence::High);
}

#[test]
fn think_time_is_slow_server_not_a_network_cause() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 25_300, 31_000, 39.0)),
        cn: Some(run(32, 25_600, 33_000, 1_240.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 6_000;
    p.server_time = Some(pct(6_000, 25_100, 30_500));
    p.findings = vec![finding("slow-server", 6_000, 6_000, 25_000)];
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{}", texts(&j));
    assert!(j.verdict.cost.text.contains("25.30ms") || j.verdict.cost.text.contains("25.10ms"));
    assert!(j.verdict.fix[0].change.contains("profile"));
    let t = texts(&j);
    assert!(t.contains("no queue on the path"), "{t}");
    assert!(t.contains("no retransmissions"), "{t}");
}

#[test]
fn server_time_dominating_keeps_network_causes_secondary() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 80_000, 90_000, 12.0)),
        cn: Some(run(32, 95_000, 300_000, 330.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 1_650;
    p.server_time = Some(pct(1_650, 80_000, 90_000));
    // Some retransmissions (2% × 210 ms ≈ 4 ms per request) and a small RTT rise.
    p.findings = vec![finding("retransmission", 33, 1_650, 210_000)];
    l.path.data.as_mut().unwrap().under_load = Some(rtt(14_000));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{}", texts(&j));
    assert!(j.verdict.secondary.contains(&Cause::PacketLoss));
    assert!(j.verdict.secondary.contains(&Cause::PathQueueing));
}

#[test]
fn cork_held_responses_are_tcp_cork_not_slow_server() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 200_900, 202_000, 5.0)),
        cn: Some(run(32, 201_000, 204_000, 159.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 800;
    p.server_time = Some(pct(800, 200_500, 201_500));
    p.findings = vec![
        finding("tcp-cork", 790, 800, 200_300),
        finding("slow-server", 800, 800, 200_500),
    ];
    let s = l.sockets.data.as_mut().unwrap();
    s.server = Some(ServerProcess {
        pid: 7,
        comm: "lagtrace".into(),
        netns: "lab".into(),
    });
    s.cork = OptionCount {
        on: 32,
        off: 0,
        unknown: 0,
    };
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::TcpCork, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::High);
    assert!(!j.verdict.secondary.contains(&Cause::SlowServer));
    assert!(j.verdict.fix[0].change.contains("TCP_CORK"));
    assert!(texts(&j).contains("TCP_CORK set on 32/32"));
    assert!(
        texts(&j).contains("is the tcp-cork hold, not the server's own work"),
        "{}",
        texts(&j)
    );
    assert!(!texts(&j).contains("not the application"), "{}", texts(&j));
}

#[test]
fn responses_at_the_cork_ceiling_are_tcp_cork_without_socket_evidence() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 208_000, 208_300, 4.8)),
        cn: Some(run(32, 211_000, 213_000, 150.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 450;
    p.server_time = Some(pct(450, 207_000, 209_000));
    // The analyzer flagged the cork release on a couple of transactions only.
    p.findings = vec![
        finding("tcp-cork", 2, 450, 207_000),
        finding("slow-server", 32, 450, 55_000),
    ];
    l.sockets = Layer::skipped("the server is not on this machine");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::TcpCork, "{}", texts(&j));
    assert!(texts(&j).contains("200 ms TCP_CORK ceiling"));
    // A server that really thinks 120 ms stays a slow server.
    let p = l.packets.data.as_mut().unwrap();
    p.server_time = Some(pct(450, 120_000, 125_000));
    l.app.data.as_mut().unwrap().c1 = Some(run(1, 120_300, 125_000, 8.0));
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::SlowServer);
}

/// A c=32 run whose p99 is the retransmission wait: 3.5 % of 75 000 transactions wait
/// ~208 ms for a retransmission.
fn loss_layers() -> Layers {
    let mut l = healthy_layers();
    let mut cn = run(32, 1_100, 215_000, 15_000.0);
    cn.errors.timeout = 0;
    l.app.data.as_mut().unwrap().cn = Some(cn);
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 75_000;
    p.findings = vec![finding("retransmission", 2_600, 75_000, 208_000)];
    l
}

#[test]
fn retransmissions_are_packet_loss() {
    let j = judge(&target(), &loss_layers());
    assert_eq!(j.verdict.cause, Cause::PacketLoss, "{}", texts(&j));
    // The packets show it; the application's tail corroborates it.
    assert_eq!(j.verdict.confidence, Confidence::High, "{}", texts(&j));
    assert!(texts(&j).contains("the tail is the retransmission wait"));
    assert!(
        j.verdict.cost.text.contains("3.5%"),
        "{}",
        j.verdict.cost.text
    );
    assert!(
        j.verdict.cost.text.contains("p99 215.00ms"),
        "{}",
        j.verdict.cost.text
    );
    assert_eq!(j.verdict.fix[0].side, FixSide::Path);
    assert_eq!(j.verdict.mechanism, None, "{}", texts(&j));
    assert!(!texts(&j).contains("black hole"), "{}", texts(&j));
}

/// The same loss with the packets' black hole (full-size segments lost on many
/// connections, small ones passing after them): packet-loss / pmtu-black-hole, its line
/// with the frames, and the path MTU's fixes instead of "find where packets drop".
#[test]
fn a_black_hole_in_the_packets_is_pmtu_black_hole_with_its_fixes() {
    let mut l = loss_layers();
    l.packets.data.as_mut().unwrap().black_hole = Some(lagtrace_model::analyze::BlackHole {
        sender: "10.0.0.2".into(),
        receiver: "10.0.0.1".into(),
        lost: 23,
        streams: 23,
        lost_min_len: 1448,
        passed_max_len: 203,
        passed: 40,
        max_copies: 4,
        stream: 0,
        frames: vec![47, 113, 128, 395],
        first_us: 884,
    });
    let j = judge(&target(), &l);
    let v = &j.verdict;
    assert_eq!(v.cause, Cause::PacketLoss, "{}", texts(&j));
    assert_eq!(
        v.mechanism,
        Some(lagtrace_diagnose::verdict::Mechanism::PmtuBlackHole),
        "{}",
        texts(&j)
    );
    let t = texts(&j);
    assert!(
        t.contains("PMTU black hole: 23 segments of 1448 B or more")
            && t.contains("frames 47, 113, 128, 395"),
        "{t}"
    );
    let fixes: Vec<&str> = v.fix.iter().map(|f| f.change.as_str()).collect();
    assert_eq!(fixes.len(), 3, "{fixes:?}");
    assert!(fixes[0].contains("fragmentation needed"), "{fixes:?}");
    assert!(fixes[1].contains("maxseg size set rt mtu"), "{fixes:?}");
    assert!(fixes[2].contains("tcp_mtu_probing=1"), "{fixes:?}");
    // Sentences, not source indentation.
    for t in j.evidence.iter().map(|e| e.text.as_str()).chain(fixes) {
        assert!(!t.contains("  ") && !t.contains('\n'), "{t:?}");
    }
}

#[test]
fn syn_retransmits_alongside_data_loss_are_the_same_packet_loss() {
    let mut l = healthy_layers();
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 14_588;
    p.findings = vec![
        finding("syn-retransmit", 3, 14_588, 1_010_000),
        finding("retransmission", 396, 14_588, 205_000),
    ];
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::PacketLoss, "{}", texts(&j));
    assert!(j.verdict.secondary.is_empty(), "{:?}", j.verdict.secondary);
    assert!(texts(&j).contains("connection setup loses packets too"));
}

#[test]
fn rtt_rising_under_load_is_path_queueing_even_if_packets_see_late_responses() {
    let mut l = healthy_layers();
    l.path.data.as_mut().unwrap().under_load = Some(rtt(120_000));
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 5_400, 7_000, 180.0)),
        cn: Some(run(32, 130_000, 180_000, 240.0)),
    });
    // Captured after the queue: the first response byte is late too.
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 1_200;
    p.server_time = Some(pct(1_200, 110_000, 150_000));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::PathQueueing, "{}", texts(&j));
    assert!(!j.verdict.secondary.contains(&Cause::SlowServer));
    assert!(
        j.verdict.cost.text.contains("119."),
        "{}",
        j.verdict.cost.text
    );
    assert!(texts(&j).contains("SYN RTT p50 60µs idle → 120.00ms under load"));
    assert!(j.finding_layers.contains(&LayerName::Path));
}

#[test]
fn a_syn_rtt_rise_the_application_does_not_feel_is_no_queue() {
    let mut l = healthy_layers();
    // A probe delayed 8 ms on a busy CPU while c=N p50 stays at 1.4 ms.
    l.path.data.as_mut().unwrap().under_load = Some(rtt(8_000));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
}

#[test]
fn closed_port_is_unreachable_with_the_rst() {
    let mut l = healthy_layers();
    let mut idle = RttStats::from_samples(3, 3, &[55, 60, 58]);
    idle.rst = 3;
    l.path = Layer::ran(PathEvidence {
        method: "tcp-syn".into(),
        idle: Some(idle),
        under_load: None,
        hops: vec![],
        reached: true,
        port_open: false,
        notes: vec![],
        route: None,
    });
    let mut c1 = run(1, 0, 0, 0.0);
    c1.requests = 0;
    c1.errors.connect = 1;
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: None,
    });
    l.packets = Layer::skipped("no connection to capture");
    l.sockets = Layer::skipped("nothing listens on the port");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Unreachable, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::High);
    assert!(texts(&j).contains("3 RST to 3 SYN probes"), "{}", texts(&j));
    assert!(texts(&j).contains("nothing listens on port 8080"));
}

#[test]
fn silent_address_is_unreachable_with_path_evidence() {
    let mut l = healthy_layers();
    l.path = Layer::ran(PathEvidence {
        method: "tcp-syn".into(),
        idle: Some(RttStats::from_samples(3, 0, &[])),
        under_load: None,
        hops: vec![],
        reached: false,
        port_open: false,
        notes: vec![],
        route: None,
    });
    l.app = Layer::skipped("the path layer found no way to the target");
    l.packets = Layer::skipped("no connection to capture");
    l.sockets = Layer::skipped("no server");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Unreachable);
    assert!(
        texts(&j).contains("no reply to 3 SYN probes"),
        "{}",
        texts(&j)
    );
    assert!(j.verdict.summary.contains("does not answer"));
}

#[test]
fn syn_retransmits_are_syn_drop_and_zero_window_is_receive_window() {
    let mut l = healthy_layers();
    l.packets.data.as_mut().unwrap().findings =
        vec![finding("syn-retransmit", 12, 100_000, 1_000_000)];
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::SynDrop);
    let mut l = healthy_layers();
    l.packets.data.as_mut().unwrap().findings =
        vec![finding("zero-window", 20_000, 100_000, 15_000)];
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::ReceiveWindow);
}

/// SYNs sent again after their SYN-ACK passed the capture point: the SYN-ACKs were lost, not
/// the SYNs; the evidence and the fix say so (the path back to the client, not the backlog).
/// SYNs never answered keep the backlog fix.
#[test]
fn answered_syns_sent_again_say_the_syn_acks_were_lost() {
    let lost = |count: u64, of: u64| {
        let mut l = healthy_layers();
        let p = l.packets.data.as_mut().unwrap();
        p.findings = vec![finding("syn-retransmit", 12, 100_000, 1_000_000)];
        p.syn_acks_lost = Some(SynAcksLost {
            count,
            of,
            example: FindingExample {
                stream: 4,
                frames: vec![17, 18, 52],
                time_us: 1_000,
                added_us: 1_000_000,
                note: String::new(),
            },
        });
        judge(&target(), &l)
    };
    let j = lost(12, 12);
    assert_eq!(j.verdict.cause, Cause::SynDrop);
    assert_eq!(j.verdict.fix[0].side, FixSide::Path, "{:?}", j.verdict.fix);
    assert!(j.verdict.fix[0].change.contains("SYN-ACKs are lost"));
    assert!(
        texts(&j).contains("12 of the 12 SYNs sent again came after")
            && texts(&j).contains("frames #17 #18 #52"),
        "{}",
        texts(&j)
    );
    // One answered among twelve: the SYNs were dropped; the backlog fix stays.
    let j = lost(1, 12);
    assert_eq!(j.verdict.cause, Cause::SynDrop);
    assert_eq!(j.verdict.fix[0].side, FixSide::Server);
    assert!(!texts(&j).contains("were answered"), "{}", texts(&j));
}

#[test]
fn diagnosis_json_has_the_stable_schema_and_finding_statuses() {
    let d = Diagnosis::assemble(
        target(),
        Settings {
            concurrency: 32,
            duration_us: 10_000_000,
        },
        nagle_layers(),
        9_800_000,
    );
    let v: serde_json::Value = serde_json::to_value(&d).unwrap();
    assert_eq!(v["verdict"]["cause"], "nagle-delayed-ack");
    assert_eq!(v["verdict"]["confidence"], "high");
    assert!(v["verdict"]["secondary"].is_array());
    assert!(
        v["verdict"]["cost"]["text"]
            .as_str()
            .unwrap()
            .contains("97%")
    );
    assert!(v["verdict"]["fix"][0]["change"].is_string());
    assert_eq!(v["layers"]["packets"]["status"], "finding");
    assert_eq!(v["layers"]["path"]["status"], "ok");
    assert_eq!(v["layers"]["sockets"]["status"], "finding");
    assert!(v["layers"]["app"]["data"]["cn"]["latency"]["p50_us"].is_u64());
    assert!(
        v["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["stance"] == "rules-out")
    );
    // Round trip: a saved diagnosis is a baseline.
    let back: Diagnosis = serde_json::from_value(v).unwrap();
    assert_eq!(back, d);
}

#[test]
fn verify_compares_p50_p99_and_rate() {
    let before = Diagnosis::assemble(target(), Settings::default(), nagle_layers(), 1);
    let after = Diagnosis::assemble(target(), Settings::default(), healthy_layers(), 1);
    let v = after.compare_with(&before, "saved.json");
    assert_eq!(v.before_cause, Cause::NagleDelayedAck);
    assert_eq!(v.after_cause, Cause::Healthy);
    let p50 = v
        .rows
        .iter()
        .find(|r| r.run == "c=32" && r.metric == "p50")
        .unwrap();
    assert!(p50.improvement > 10.0, "{p50:?}");
    let rps = v
        .rows
        .iter()
        .find(|r| r.run == "c=32" && r.metric == "req/s")
        .unwrap();
    assert!(rps.improvement > 10.0);
    assert!(after.evidence.iter().all(|e| e.stance != Stance::Supports));
    assert_eq!(v.baseline, "saved.json");
    // A baseline saved against another server (here another port) is flagged.
    let mut other = target();
    other.port = 9011;
    other.url = "http://10.77.0.2:9011/".into();
    let before = Diagnosis::assemble(other, Settings::default(), nagle_layers(), 1);
    let v = after.compare_with(&before, "saved.json");
    assert!(v.baseline.contains("a different target"), "{}", v.baseline);
    assert!(
        v.baseline.contains("http://10.77.0.2:9011/"),
        "{}",
        v.baseline
    );
}

/// nginx `echo_sleep 0.005` on a veth: 5 ms of the 5.1 ms the user waits is the server's.
#[test]
fn short_think_time_that_dominates_is_slow_server_at_medium_confidence() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 5_110, 7_700, 189.0)),
        cn: Some(run(32, 5_670, 8_200, 5_595.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 11_796;
    p.server_time = Some(pct(11_796, 5_460, 7_900));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::Medium);
    assert!(
        j.verdict.cost.text.contains("5.05ms"),
        "{}",
        j.verdict.cost.text
    );
    assert!(
        j.verdict.cost.text.contains("of the c=1 p50 5.11ms"),
        "{}",
        j.verdict.cost.text
    );
    assert!(!texts(&j).contains("not the application"), "{}", texts(&j));
}

/// The same 5 ms handler behind a 40 ms path is not where the latency comes from, and a
/// 1 ms handler is not worth naming at all.
#[test]
fn short_think_time_that_does_not_dominate_stays_healthy() {
    let mut l = healthy_layers();
    if let Some(p) = l.path.data.as_mut() {
        p.idle = Some(rtt(40_000));
        p.under_load = Some(rtt(40_100));
    }
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 45_100, 47_000, 22.0)),
        cn: Some(run(32, 45_600, 48_000, 700.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.server_time = Some(pct(3_000, 5_050, 6_000));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));

    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 1_100, 1_500, 900.0)),
        cn: Some(run(32, 1_400, 6_000, 22_000.0)),
    });
    l.packets.data.as_mut().unwrap().server_time = Some(pct(3_000, 1_050, 1_400));
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::Healthy);
}

/// `python3 -m http.server`: quick at c=1, saturated at c=32 where the packets see the
/// server hold requests. Healthy, but the evidence says the server queues under load.
#[test]
fn server_saturated_only_under_load_is_healthy_with_a_note() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 328, 5_880, 1_167.0)),
        cn: Some(run(32, 4_570, 16_500, 1_066.0)),
    });
    l.packets.data.as_mut().unwrap().server_time = Some(pct(2_246, 4_080, 15_000));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    assert!(
        texts(&j).contains("under load the server queues requests itself"),
        "{}",
        texts(&j)
    );
}

/// https:// to a port that speaks plain HTTP: the SYN probes are answered, the TLS handshake
/// fails. Unreachable, but the verdict must not say no connection could be made.
#[test]
fn tls_handshake_failure_on_an_open_port_says_tls_not_no_connection() {
    let mut l = healthy_layers();
    l.path.data.as_mut().unwrap().under_load = None;
    let mut c1 = run(1, 0, 0, 0.0);
    c1.requests = 0;
    c1.errors.connect = 1;
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: None,
    });
    l.app.reason = Some(
        "TLS handshake with 10.77.0.2:8080 failed: received corrupt message of type \
         InvalidContentType"
            .into(),
    );
    l.packets = Layer::skipped("no request completed at c=1");
    l.sockets = Layer::skipped("no request completed at c=1");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Unreachable, "{}", texts(&j));
    assert!(
        j.verdict.summary.contains("TLS handshake fails"),
        "{}",
        j.verdict.summary
    );
    assert!(
        !j.verdict.summary.contains("no connection"),
        "{}",
        j.verdict.summary
    );
    assert!(j.verdict.fix[0].change.contains("http://"));
}

/// nginx `tcp_nodelay off` serving 100 KB: the response's tail waits for an ACK on a fifth of
/// the transactions, but only ~2 ms (one round trip under load, no delayed-ACK timer).
/// Healthy, and the evidence names the short hold instead of saying there is none.
#[test]
fn short_nagle_hold_at_the_tail_of_large_responses_is_named_but_not_the_cause() {
    let mut l = healthy_layers();
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 8_593;
    p.findings = vec![finding("nagle-stall", 1_840, 8_593, 2_100)];
    let s = l.sockets.data.as_mut().unwrap();
    s.nodelay = OptionCount {
        on: 0,
        off: 32,
        unknown: 0,
    };
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    let t = texts(&j);
    assert!(
        t.contains("nagle-stall on 21% of 8593 transactions adds only ~2.10ms"),
        "{t}"
    );
    assert!(!t.contains("no Nagle/delayed-ACK stall"), "{t}");
}

/// On 127.0.0.1 the route is the local table's: the route fix is the exact command.
#[test]
fn loopback_target_gets_the_exact_local_route_quickack_command() {
    let mut t = target();
    t.addr = "127.0.0.1".into();
    t.host = "127.0.0.1".into();
    let j = judge(&t, &nagle_layers());
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck);
    assert!(
        j.verdict
            .fix
            .iter()
            .any(|f| f.change.contains("table local") && f.change.contains("quickack 1")),
        "{:?}",
        j.verdict.fix
    );
    let j = judge(&target(), &nagle_layers());
    assert!(
        j.verdict
            .fix
            .iter()
            .any(|f| f.change.contains("ip route get 10.77.0.2")),
        "{:?}",
        j.verdict.fix
    );
}

/// nginx `limit_rate 400k` serving 100 KB: the server answers in ~2 ms but each response
/// takes ~240 ms to arrive on a 50 µs path with no queue, loss or window limit. That is the
/// server pacing its sends, not "no latency problem"; the same response arriving in 2 ms is.
#[test]
fn paced_response_on_a_clean_path_is_slow_server_not_healthy() {
    let mut l = healthy_layers();
    let mut c1 = run(1, 241_000, 241_500, 4.0);
    c1.bytes = c1.requests * 102_640;
    let mut cn = run(8, 241_300, 244_000, 30.0);
    cn.bytes = cn.requests * 102_640;
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: Some(cn),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 72;
    p.server_time = Some(pct(72, 1_880, 2_500));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::Medium);
    assert!(
        j.verdict.cost.text.contains("100136 B"),
        "{}",
        j.verdict.cost.text
    );
    assert!(
        j.verdict.cost.text.contains("3.4 Mbit/s"),
        "{}",
        j.verdict.cost.text
    );
    assert!(
        j.verdict.fix[0].change.contains("limit_rate"),
        "{:?}",
        j.verdict.fix
    );

    // The same response size at veth speed is healthy.
    let a = l.app.data.as_mut().unwrap();
    for r in [a.c1.as_mut().unwrap(), a.cn.as_mut().unwrap()] {
        r.latency = pct(r.requests, 2_100, 3_000);
    }
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::Healthy);
}

/// `python3 -m http.server` (listen backlog 5, a new connection per request) at c=32: 52 of
/// 2943 connection attempts get no SYN-ACK within the 1 s connect timeout (the accept queue
/// overflows), while c=1 connects every time. Not healthy: syn-drop, from the app layer.
#[test]
fn connect_failures_only_under_load_are_syn_drop() {
    let mut l = healthy_layers();
    let mut cn = run(32, 4_570, 7_400, 1_066.0);
    cn.requests = 2_891;
    cn.errors.connect = 52;
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 328, 5_880, 1_167.0)),
        cn: Some(cn),
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{}", texts(&j));
    assert!(
        j.verdict.cost.text.contains("fail"),
        "{}",
        j.verdict.cost.text
    );
    assert!(j.verdict.fix[0].change.contains("listen backlog"));
    assert!(
        texts(&j).contains("52 of 2943 connection attempts"),
        "{}",
        texts(&j)
    );
    assert!(!texts(&j).contains("SYN probes got no SYN-ACK"));
    // The SYN probes lost under load while idle ones were answered: the same drops, from
    // the path (issue 28 item 5), said as support.
    l.path.data.as_mut().unwrap().under_load = Some(RttStats::from_samples(5, 0, &[30, 31, 29]));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{}", texts(&j));
    assert!(
        texts(&j).contains("under load 2 of 5 SYN probes got no SYN-ACK (idle: 5 of 5) while the load's connects went through: consistent with"),
        "{}",
        texts(&j)
    );

    // One stray failure in thousands is not a cause.
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.errors.connect = 1;
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::Healthy);
}

/// tbf 10 Mbit/s with a shallow queue in front of nginx serving 100 KB at c=4: c=1 takes
/// 86 ms (the transfer at 10 Mbit/s), the capture sees the first response byte after the
/// queue (server time 22 ms), the SYN RTT rises by 16 ms. The path, not the server: once the
/// transfer at the c=N throughput is taken out of the c=1 time, nothing is left for the server.
#[test]
fn bandwidth_limited_path_is_path_queueing_not_slow_server() {
    let mut l = healthy_layers();
    l.path.data.as_mut().unwrap().under_load = Some(rtt(16_220));
    let mut c1 = run(1, 85_890, 86_020, 11.0);
    c1.bytes = c1.requests * 102_640;
    let mut cn = run(4, 164_610, 1_860_000, 11.0);
    cn.bytes = cn.requests * 102_640;
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: Some(cn),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 27;
    p.server_time = Some(pct(27, 21_740, 204_330));
    p.findings = vec![finding("retransmission", 2, 27, 33_720)];
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::PathQueueing, "{}", texts(&j));
    assert!(
        !j.verdict.secondary.contains(&Cause::SlowServer),
        "{:?}",
        j.verdict
    );
}

// --- The tail: never healthy over a p99 far beyond the p50 ---

/// The acceptance floor holds for every path: a p99 ≥ 10× the p50 and ≥ 10 ms above it is a
/// finding, whatever the RTT (the p50 is at least one RTT).
#[test]
fn a_tail_at_the_acceptance_floor_is_always_a_finding() {
    use lagtrace_diagnose::rules::tail::is_finding;
    for rtt in [0, 40, 500, 1_000, 1_100, 1_333, 2_000, 20_000, 100_000] {
        for p50 in [
            1, 30, 100, 1_000, 1_111, 1_500, 5_000, 20_000, 100_000, 400_000,
        ] {
            let p50: u64 = p50.max(rtt);
            let p99 = (10 * p50).max(p50 + 10_000);
            assert!(is_finding(p50, p99, rtt), "rtt {rtt} p50 {p50} p99 {p99}");
            let mut l = healthy_layers();
            l.path.data.as_mut().unwrap().idle = Some(rtt_exact(rtt));
            l.app = Layer::ran(AppEvidence {
                c1: Some(run(1, p50, p99, 100.0)),
                cn: Some(run(32, 1_400, 6_000, 22_000.0)),
            });
            let v = judge(&target(), &l).verdict;
            assert!(
                !(v.cause == Cause::Healthy && v.confidence == Confidence::High),
                "rtt {rtt} p50 {p50} p99 {p99}: {v:?}"
            );
            assert!(v.tail.is_some(), "rtt {rtt} p50 {p50} p99 {p99}");
        }
    }
}

fn rtt_exact(p50: u64) -> RttStats {
    RttStats::from_samples(5, 0, &[p50; 5])
}

/// The recorded healthy lab runs' spreads (nginx on 2 shared cores: c=1 p99 64× the p50 but
/// 4 ms above it; c=32 p99 6.8× the p50) are contention and scheduling, not a finding.
#[test]
fn a_busy_healthy_servers_spread_stays_healthy() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 66, 4_247, 6_000.0)),
        cn: Some(run(32, 4_779, 32_303, 4_800.0)),
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::High);
    assert!(j.verdict.tail.is_none());
}

/// Every 20th request takes a 150 ms slow path: the p50 is untouched, the packets' server
/// time reaches the tail → slow-server, from the tail, at medium confidence.
#[test]
fn a_tail_of_server_time_is_slow_server() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 110, 150_300, 120.0)),
        cn: Some(run(32, 1_400, 152_000, 2_000.0)),
    });
    l.packets.data.as_mut().unwrap().server_time = Some(pct(10_000, 90, 150_100));
    let j = judge(&target(), &l);
    let v = &j.verdict;
    assert_eq!(v.cause, Cause::SlowServer, "{}", texts(&j));
    assert_eq!(v.confidence, Confidence::Medium);
    assert!(
        v.mechanism.is_none(),
        "no mechanism without per-request records"
    );
    let t = v.tail.as_ref().expect("tail");
    assert_eq!((t.percentile, t.latency_us), (99.0, 152_000));
    assert_eq!(t.excess_us, 152_000 - 1_400);
    assert_eq!(t.parts[0].cause, Cause::SlowServer);
    assert!(t.parts[0].share > 0.95, "{t:?}");
    assert!(t.text.contains("server time"), "{}", t.text);
    assert!(
        t.text.starts_with("the slowest 1.0% wait +150.60ms"),
        "{}",
        t.text
    );
    assert_eq!(v.cost.share, 0.01);
    assert!(!v.fix.is_empty());
}

/// Nagle on 2 % of transactions: below the Nagle rule's 5 %, but its p99 added latency
/// reaches the tail → nagle-delayed-ack.
#[test]
fn a_rare_nagle_hold_that_makes_the_tail_is_named() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 110, 300, 8000.0)),
        cn: Some(run(32, 1_400, 43_000, 20_000.0)),
    });
    l.packets.data.as_mut().unwrap().findings =
        vec![finding("nagle-delayed-ack", 2_000, 100_000, 40_000)];
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck, "{}", texts(&j));
    let t = j.verdict.tail.as_ref().expect("tail");
    assert_eq!(t.parts[0].cause, Cause::NagleDelayedAck);
    // ... and at 0.2 % it cannot set the p99: nothing explains the tail.
    l.packets.data.as_mut().unwrap().findings =
        vec![finding("nagle-delayed-ack", 200, 100_000, 40_000)];
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::UnexplainedTail);
}

/// Slow handshakes (a SYN retransmission at 1 s) reach the c=N tail → syn-drop.
#[test]
fn a_tail_of_slow_handshakes_is_syn_drop() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 110, 300, 8000.0)),
        cn: Some(run(32, 1_400, 1_002_000, 2_000.0)),
    });
    l.packets.data.as_mut().unwrap().handshake_rtt = Some(pct(64, 70, 1_000_100));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{}", texts(&j));
    assert_eq!(
        j.verdict.tail.as_ref().unwrap().parts[0].cause,
        Cause::SynDrop
    );
}

/// A tail no layer explains is said so: unexplained-tail, medium with packets (the network
/// causes were looked for), low without; never healthy.
#[test]
fn a_tail_nothing_explains_is_unexplained_never_healthy() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 110, 80_000, 200.0)),
        cn: Some(run(32, 1_400, 6_000, 22_000.0)),
    });
    let j = judge(&target(), &l);
    let v = &j.verdict;
    assert_eq!(v.cause, Cause::UnexplainedTail, "{}", texts(&j));
    assert_eq!(v.cause.code(), "unexplained-tail");
    assert_eq!(v.confidence, Confidence::Medium);
    let t = v.tail.as_ref().expect("tail");
    assert!(t.text.contains("no layer shows"), "{}", t.text);
    assert!(texts(&j).contains("p99 80.00ms"), "{}", texts(&j));
    assert_eq!(j.finding_layers, vec![LayerName::App]);
    l.packets = Layer::unavailable("no capture privilege");
    let v = judge(&target(), &l).verdict;
    assert_eq!(
        (v.cause, v.confidence),
        (Cause::UnexplainedTail, Confidence::Low)
    );
}

/// The load generator's host measured CPU-busy: `k` runnable tasks per CPU on 2 CPUs.
fn busy(k: u32) -> ClientCpu {
    ClientCpu {
        cpus: 2,
        samples: 100,
        runnable_p50: 2 * k,
        // The sampler itself is one of them.
        runnable_p90: 2 * k + 1,
        psi_some_us: Some(1_500_000),
        run_delay_us: Some(90_000),
        span_us: 2_000_000,
    }
}

/// A c=1 tail of +9 ms (13× the p50) on a host with 5 runnable tasks per CPU: a woken
/// thread may wait 4 slices on the client and 4 on the server, +24 ms. The verdict does
/// not blame the server: healthy at medium, the client's contention and the tail said.
/// The same tail without the measurement is unexplained; beyond the measured contention
/// it is unexplained too; an idle host's measurement changes nothing.
#[test]
fn a_tail_within_the_clients_measured_cpu_contention_is_not_the_servers() {
    let layers = |cpu: Option<ClientCpu>, p99: u64| {
        let mut l = healthy_layers();
        let mut c1 = run(1, 700, p99, 1_000.0);
        c1.client_cpu = cpu;
        l.app = Layer::ran(AppEvidence {
            c1: Some(c1),
            cn: Some(run(32, 1_400, 6_000, 22_000.0)),
        });
        l
    };
    let j = judge(&target(), &layers(Some(busy(5)), 9_700));
    let v = &j.verdict;
    assert_eq!(
        (v.cause, v.confidence),
        (Cause::Healthy, Confidence::Medium),
        "{}",
        texts(&j)
    );
    assert!(v.tail.is_some());
    let t = texts(&j);
    assert!(t.contains("CPU-busy") && t.contains("within it"), "{t}");
    assert!(t.contains("up to +24."), "{t}");
    // Not measured: nothing explains it.
    let v = judge(&target(), &layers(None, 9_700)).verdict;
    assert_eq!(v.cause, Cause::UnexplainedTail);
    // Far beyond what 5 tasks per CPU explain.
    let v = judge(&target(), &layers(Some(busy(5)), 80_000)).verdict;
    assert_eq!(v.cause, Cause::UnexplainedTail);
    // One task per CPU: the host was not busy.
    let v = judge(&target(), &layers(Some(busy(1)), 9_700)).verdict;
    assert_eq!(v.cause, Cause::UnexplainedTail);
    // Busy by the run queue but PSI saw (almost) no waiting: not busy.
    let mut quiet = busy(5);
    quiet.psi_some_us = Some(10_000);
    let v = judge(&target(), &layers(Some(quiet), 9_700)).verdict;
    assert_eq!(v.cause, Cause::UnexplainedTail);
}

/// A cause the other rules name keeps its verdict; the tail is added to it.
#[test]
fn a_named_cause_keeps_its_verdict_and_gains_the_tail() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 40, 210_000, 120.0)),
        cn: Some(run(32, 80, 208_000, 20_000.0)),
    });
    l.packets.data.as_mut().unwrap().findings =
        vec![finding("retransmission", 3_000, 100_000, 200_000)];
    let v = judge(&target(), &l).verdict;
    assert_eq!(v.cause, Cause::PacketLoss);
    let t = v.tail.expect("tail");
    assert_eq!(t.parts[0].cause, Cause::PacketLoss);
    assert!(t.text.contains("loss recovery"), "{}", t.text);
}

/// A connect record of the load: connect `connect_us` long, with `syn` SYN retransmissions.
fn connect_record(
    conn: u64,
    start_us: u64,
    connect_us: u64,
    syn: u32,
) -> lagtrace_model::RequestRecord {
    lagtrace_model::RequestRecord {
        conn,
        local: Some(format!("10.0.0.1:{}", 40_000 + conn).parse().unwrap()),
        remote: "10.0.0.2:80".parse().unwrap(),
        index: 0,
        start_us,
        wait_us: connect_us + 300,
        connect_start_us: start_us,
        connect_end_us: Some(start_us + connect_us),
        syn_retransmits: Some(syn),
        intended_us: None,
        sent_first_us: Some(start_us + connect_us),
        sent_last_us: Some(start_us + connect_us),
        first_byte_us: Some(start_us + connect_us + 250),
        last_byte_us: Some(start_us + connect_us + 300),
        bytes: 100,
        status: Some(200),
        error: None,
        pending: false,
        slow: true,
        weight: 1.0,
    }
}

/// A run of `requests` connection-per-request requests at c=`c`, `syn` of whose connects
/// waited 1 s for a SYN retransmission, with the records and summaries the adapter makes.
fn connect_run(c: u32, requests: u64, syn: u64) -> AppRun {
    let mut r = run(c, 400, 2_000, requests as f64 / 10.0);
    let mut recs: Vec<_> = (0..requests)
        .map(|i| {
            let slow = i < syn;
            connect_record(
                i,
                i * 500,
                if slow { 1_000_300 } else { 120 },
                u32::from(slow),
            )
        })
        .collect();
    recs.sort_by_key(|r| r.start_us);
    let all = lagtrace_model::RequestRecords {
        seen: requests,
        records: recs,
        ..Default::default()
    };
    let waits = lagtrace_diagnose::adapters::app::waits(&all.records);
    r.connects = Some(lagtrace_diagnose::adapters::app::connects(&all.records));
    r.records = Some(lagtrace_diagnose::adapters::app::trim(&all, waits.p99_us));
    r.waits = Some(waits);
    r
}

/// Responses that were mostly errors (a wrong URL's 404): the latency measured is the error
/// path's. Healthy stays healthy but never sure, and the evidence says which status; a few
/// errors among good responses change nothing.
#[test]
fn error_statuses_make_healthy_unsure_and_are_named_with_their_status() {
    let mut l = healthy_layers();
    let app = l.app.data.as_mut().unwrap();
    let cn = app.cn.as_mut().unwrap();
    cn.errors.status = cn.requests;
    let mut rec = connect_record(0, 0, 100, 0);
    rec.status = Some(404);
    cn.records = Some(lagtrace_model::RequestRecords {
        seen: cn.requests,
        records: vec![rec],
        ..Default::default()
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::Low, "{}", texts(&j));
    let t = texts(&j);
    assert!(t.contains("(100%) had an error status, mostly 404"), "{t}");
    // A tenth of the responses: named, and healthy at medium at most.
    let mut l = healthy_layers();
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.errors.status = cn.requests / 10;
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.confidence, Confidence::Medium, "{}", texts(&j));
    assert!(
        texts(&j).contains("(10%) had an error status"),
        "{}",
        texts(&j)
    );
    // One error in a hundred: not material, nothing said.
    let mut l = healthy_layers();
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.errors.status = cn.requests / 100;
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.confidence, Confidence::High, "{}", texts(&j));
    assert!(!texts(&j).contains("error status"), "{}", texts(&j));
}

/// Requests the server closed before answering under load only (a connection limit): a
/// note with the kinds and the c=1 contrast, and healthy no longer sure; a handful is not
/// material.
#[test]
fn requests_failing_under_load_are_named_and_make_healthy_unsure() {
    let mut l = healthy_layers();
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.errors.read = cn.requests / 12;
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    assert_eq!(j.verdict.confidence, Confidence::Medium, "{}", texts(&j));
    let t = texts(&j);
    assert!(t.contains("failed after connecting"), "{t}");
    assert!(t.contains("none of c=1's"), "{t}");
    let mut l = healthy_layers();
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.errors.read = cn.requests / 500;
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.confidence, Confidence::High, "{}", texts(&j));
    assert!(
        !texts(&j).contains("failed after connecting"),
        "{}",
        texts(&j)
    );
}

#[test]
fn connects_waiting_for_syn_retransmissions_in_the_records_are_syn_drop_with_their_cost() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(connect_run(1, 2_000, 0)),
        cn: Some(connect_run(32, 3_000, 90)),
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{}", texts(&j));
    assert_eq!(j.verdict.cost.affected, Some(90));
    assert!(j.verdict.cost.added_us >= 1_000_000, "{:?}", j.verdict.cost);
    assert!(
        j.verdict.cost.text.contains("to connect"),
        "{}",
        j.verdict.cost.text
    );
    assert!(texts(&j).contains("90 of 3000 connects"), "{}", texts(&j));
    assert!(j.verdict.mechanism.is_none());
    // The tail is the connects: its connection-setup part is measured per slow request.
    let tail = j.verdict.tail.expect("a 1 s tail over a 400 µs p50");
    assert_eq!(tail.parts[0].cause, Cause::SynDrop, "{tail:?}");
    assert!(tail.parts[0].share > 0.9, "{tail:?}");
}

#[test]
fn one_connect_that_waited_at_c1_is_not_syn_drop() {
    let mut l = healthy_layers();
    l.app = Layer::ran(AppEvidence {
        c1: Some(connect_run(1, 2_000, 1)),
        cn: Some(connect_run(32, 3_000, 0)),
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
}

#[test]
fn connects_that_never_complete_while_the_probes_are_answered_are_not_unreachable() {
    let mut l = healthy_layers();
    let mut c1 = connect_run(1, 3, 3);
    c1.requests = 0;
    c1.errors.connect = 1;
    let mut cn = connect_run(32, 40, 40);
    cn.requests = 0;
    cn.errors.connect = 8;
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: Some(cn),
    });
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{}", texts(&j));
    // The same with the probes unanswered is unreachable.
    let p = l.path.data.as_mut().unwrap();
    p.reached = false;
    p.port_open = false;
    assert_eq!(judge(&target(), &l).verdict.cause, Cause::Unreachable);
}

#[test]
fn syn_retransmissions_outnumbering_data_loss_stay_syn_drop() {
    // A full accept queue: many connects wait for a SYN retransmission, and a few first
    // requests are retransmitted (sent before the server accepted their connection).
    let mut l = healthy_layers();
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 1_474;
    p.findings = vec![
        finding("syn-retransmit", 35, 1_474, 1_000_400),
        finding("retransmission", 19, 1_474, 415_000),
    ];
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{}", texts(&j));
    assert!(j.verdict.secondary.contains(&Cause::PacketLoss));
}

/// issue 14: the packets' timing looks like Nagle (a healthy nginx serving large files at
/// c=32 did this), but every server socket was read with TCP_NODELAY on: direct evidence
/// wins, and no text claims the sockets were not read.
#[test]
fn nodelay_read_on_every_server_socket_rules_nagle_out() {
    let mut l = nagle_layers();
    let s = l.sockets.data.as_mut().unwrap();
    s.nodelay = OptionCount {
        on: 32,
        off: 0,
        unknown: 0,
    };
    s.config.clear();
    let j = judge(&target(), &l);
    let t = texts(&j);
    assert_ne!(j.verdict.cause, Cause::NagleDelayedAck, "{t}");
    assert!(
        !j.verdict.secondary.contains(&Cause::NagleDelayedAck),
        "{t}"
    );
    assert!(t.contains("TCP_NODELAY set on 32/32"), "{t}");
    assert!(t.contains("Nagle holds nothing there"), "{t}");
    assert!(!t.contains("were not read"), "{t}");
}

/// Every request timed out on connections that were made (a PMTU black hole: the router
/// cannot forward the full-size segments and its ICMP is filtered), while the capture shows
/// the responses' first segments resent on the retransmission timer, never acknowledged:
/// packet-loss, never healthy; the cost says no request completes.
#[test]
fn responses_that_never_arrive_with_their_segments_resent_are_packet_loss() {
    let mut l = healthy_layers();
    let app = l.app.data.as_mut().unwrap();
    for (r, c, timeouts) in [(&mut app.c1, 1, 1), (&mut app.cn, 32, 64)] {
        let mut none = run(c, 0, 0, 0.0);
        none.latency = Percentiles::default();
        none.errors.timeout = timeouts;
        *r = Some(none);
    }
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 99;
    p.server_time = None;
    p.findings = vec![finding("retransmission", 98, 99, 632_000)];
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::PacketLoss, "{}", texts(&j));
    assert!(
        texts(&j).contains("no request completed; 64 timed out"),
        "{}",
        texts(&j)
    );
    let cost = &j.verdict.cost.text;
    assert!(cost.contains("no request completes"), "{cost}");
    assert!(cost.contains("all 64 requests at c=32 timed out"), "{cost}");
}

/// The capture stopped at its packet limit a fifth of the way into the c=N run (64 KB
/// responses at c=32): the evidence says its findings and join cover only those requests.
#[test]
fn a_capture_cut_at_its_packet_limit_says_how_much_of_the_run_it_holds() {
    let mut l = healthy_layers();
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.requests = 20_110;
    let p = l.packets.data.as_mut().unwrap();
    p.packets = lagtrace_diagnose::run::MAX_CAPTURE_PACKETS;
    p.transactions = 3_754;
    let j = judge(&target(), &l);
    assert!(
        texts(&j).contains(
            "the capture stopped at its 200000-packet limit: its 3754 transactions are about \
             the first 19% of the 20110 requests of the c=32 run"
        ),
        "{}",
        texts(&j)
    );
    // A capture that holds the whole run says nothing of the kind.
    let mut l = healthy_layers();
    l.packets.data.as_mut().unwrap().packets = lagtrace_diagnose::run::MAX_CAPTURE_PACKETS;
    assert!(!texts(&judge(&target(), &l)).contains("packet limit"));
}

/// A fast server whose p99 is healthy but whose slowest 0.1 % wait 150 ms (a pause once a
/// second meets one request per connection): a deep tail, never `healthy` (issue 28). Without
/// the records and their join nothing names it: `unexplained-tail`, with the percentile the
/// line is about. Controls: a p99.9 within 20× the p50 and under 100 ms, and a deep tail of
/// fewer than ten requests, are not named.
#[test]
fn a_deep_tail_past_a_healthy_p99_is_never_healthy() {
    let deep = |count_rps: f64, p999: u64| {
        let mut l = healthy_layers();
        let mut cn = run(32, 1_000, 2_500, count_rps);
        cn.latency.p999_us = p999;
        cn.latency.max_us = p999 + 2_000;
        l.app = Layer::ran(AppEvidence {
            c1: Some(run(1, 110, 300, 8000.0)),
            cn: Some(cn),
        });
        judge(&target(), &l)
    };
    let j = deep(20_000.0, 150_000);
    let v = &j.verdict;
    assert_eq!(v.cause, Cause::UnexplainedTail, "{}", texts(&j));
    let t = v.tail.as_ref().expect("tail");
    assert_eq!(t.percentile, 99.9);
    assert!(
        t.text
            .contains("(the p99.9 and up) wait 150.00ms to 152.00ms"),
        "{}",
        t.text
    );
    assert!(
        texts(&j).contains("past the p99, where a client's timeout"),
        "{}",
        texts(&j)
    );
    // 15 ms at the p99.9: 15× the p50, no deep tail.
    let j = deep(20_000.0, 15_000);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    // 1 000 requests in the run: its p99.9 is one request.
    let j = deep(200.0, 150_000);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
}

/// A c=32 keep-alive run of 40 000 requests over 4 s from the load's own records (waits ~1 ms),
/// with `deep` requests of the given waits released at the given times (µs), and the
/// summaries and trimmed records the adapter makes of it; `sampled`: one more slow record
/// that stands for 200 (a sampled record, not one of the slow set).
fn records_run(deep: &[(u64, u64)], sampled: Option<u64>) -> AppRun {
    records_run_of(40_000, deep, sampled)
}

/// [`records_run`] with `n` requests over the 4 s.
fn records_run_of(n: u64, deep: &[(u64, u64)], sampled: Option<u64>) -> AppRun {
    let mut r = run(32, 1_000, 2_500, n as f64 / 4.0);
    let mut recs: Vec<_> = Vec::new();
    for k in 0..n {
        let mut rec = connect_record(k % 32, k * 4_000_000 / n, 0, 0);
        rec.index = (k / 32) as u32;
        rec.wait_us = 900 + (k * 7919) % 400;
        rec.last_byte_us = Some(rec.start_us + rec.wait_us);
        recs.push(rec);
    }
    for (i, &(end_us, wait_us)) in deep.iter().enumerate() {
        let mut rec = connect_record(i as u64 % 32, end_us - wait_us, 0, 0);
        rec.wait_us = wait_us;
        rec.last_byte_us = Some(end_us);
        recs.push(rec);
    }
    if let Some(wait_us) = sampled {
        let mut rec = connect_record(0, 2_000_000, 0, 0);
        rec.wait_us = wait_us;
        rec.slow = false;
        rec.weight = 200.0;
        recs.push(rec);
    }
    recs.sort_by_key(|r| r.start_us);
    let all = lagtrace_model::RequestRecords {
        seen: recs.iter().map(|r| r.weight).sum::<f64>() as u64,
        records: recs,
        ..Default::default()
    };
    let waits = lagtrace_diagnose::adapters::app::waits(&all.records);
    r.records = Some(lagtrace_diagnose::adapters::app::trim(&all, waits.p99_us));
    r.requests = waits.count;
    r.waits = Some(waits);
    r
}

/// The deep tail counts stall moments, not requests: one hiccup of the host releasing all
/// 32 requests in flight at once is one event (healthy stays healthy, though 32 requests
/// are 0.08 % of the run), three are a tail.
/// A sampled record standing for 200 requests is one request, never a deep tail of 200.
#[test]
fn a_deep_tail_is_several_moments_of_requests_that_stand_for_themselves() {
    let judged = |cn: AppRun| {
        let mut l = healthy_layers();
        l.app = Layer::ran(AppEvidence {
            c1: Some(run(1, 110, 300, 8000.0)),
            cn: Some(cn),
        });
        judge(&target(), &l)
    };
    let hiccup = |end_us: u64| (0..32).map(move |i| (end_us + i * 20, 150_000 + i * 500));
    let once: Vec<_> = hiccup(2_000_000).collect();
    let cn = records_run(&once, None);
    assert!(cn.waited().p99_us < 10_000, "{:?}", cn.waited());
    assert!(tail::deep_tail(&cn, tail::DEEP_MIN_US).is_none());
    let j = judged(cn);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{}", texts(&j));
    let thrice: Vec<_> = [500_000, 2_000_000, 3_500_000]
        .into_iter()
        .flat_map(hiccup)
        .collect();
    let cn = records_run(&thrice, None);
    let d = tail::deep_tail(&cn, tail::DEEP_MIN_US).expect("a deep tail");
    assert_eq!(d.moments, 3, "{d:?}");
    assert_eq!(d.from_us, 150_000, "{d:?}");
    assert!(d.from_us > cn.waited().p99_us);
    let j = judged(cn);
    assert_eq!(j.verdict.cause, Cause::UnexplainedTail, "{}", texts(&j));
    // Its fix states the mean and the least of the slow requests' waits over the p50.
    let fix = &j.verdict.fix[0].change;
    assert!(fix.contains("on average, at least +"), "{fix}");
    // One sampled record of 150 ms (weight 200) among three moments of one request each.
    let few = [
        (500_000, 150_000),
        (2_000_000, 150_000),
        (3_500_000, 150_000),
    ];
    let cn = records_run(&few, Some(150_000));
    assert!(tail::deep_tail(&cn, tail::DEEP_MIN_US).is_none());
    assert_eq!(judged(cn).verdict.cause, Cause::Healthy);
}

/// A closed-loop load holds one request per connection in a stall, however long the stall:
/// at a high rate the stalls' requests are a tiny share of the run while the clients spent a
/// large share of their time in them. Five 80 ms stalls releasing all 32 connections in a
/// 4 s run of 400 000 requests: 0.04 % of the requests (under the 0.05 %), 10 % of the
/// clients' time — a deep tail past the noise floor (the caller names it only with a
/// mechanism). The same stalls in 40 000 requests were one already; a single stall, or waits
/// under 20 × the p50, are not.
#[test]
fn stalls_that_hold_the_clients_time_are_a_deep_tail_at_any_request_rate() {
    let stall = |end_us: u64, wait_us: u64| (0..32).map(move |i| (end_us + i * 20, wait_us));
    let five = |wait_us: u64| -> Vec<(u64, u64)> {
        [400_000, 1_100_000, 1_800_000, 2_500_000, 3_200_000]
            .into_iter()
            .flat_map(|e| stall(e, wait_us))
            .collect()
    };
    let floor = 10_000;
    let fast = records_run_of(400_000, &five(80_000), None);
    assert!(fast.waited().p999_us < 50_000, "{:?}", fast.waited());
    let d = tail::deep_tail(&fast, floor).expect("a deep tail at 100 000 req/s");
    assert_eq!(d.moments, 5, "{d:?}");
    assert!(d.share < tail::DEEP_MIN_SHARE, "{d:?}");
    // Not past the 100 ms floor: a deep tail only with a mechanism.
    assert!(tail::deep_tail(&fast, tail::DEEP_MIN_US).is_none());
    let slow = records_run_of(40_000, &five(80_000), None);
    assert!(tail::deep_tail(&slow, floor).is_some());

    assert!(tail::deep_tail(&records_run_of(400_000, &five(20_000), None), floor).is_none());
    let once: Vec<_> = stall(2_000_000, 80_000).collect();
    assert!(tail::deep_tail(&records_run_of(400_000, &once, None), floor).is_none());
    // 15 ms is under 20 × the ~1 ms p50.
    assert!(tail::deep_tail(&records_run_of(400_000, &five(15_000), None), floor).is_none());
}
