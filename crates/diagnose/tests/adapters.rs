//! The packets adapter on the reference captures (testdata/case): the real analyzer's
//! output becomes evidence, the rules name the cause from it, and the example flow is the
//! ladder of the case's README (headers, delayed ACK, held body).

use lagtrace_diagnose::adapters::packets;
use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::judge;
use lagtrace_model::Cause;
use lagtrace_packet::{AnalyzeOptions, analyze_file};
use lagtrace_testkit::case_pcap as case_file;

fn packets_only(p: PacketEvidence) -> Layers {
    Layers {
        path: Layer::unavailable("not run: a capture file"),
        app: Layer::unavailable("not run: a capture file"),
        packets: Layer::ran(p),
        sockets: Layer::skipped("not run: a capture file"),
        host: Layer::skipped("not run: a capture file"),
        hops: Vec::new(),
    }
}

fn target() -> Target {
    Target {
        url: "http://10.0.0.2:8080/".into(),
        host: "10.0.0.2".into(),
        addr: "10.0.0.2".into(),
        port: 8080,
    }
}

#[test]
fn reference_capture_is_nagle_delayed_ack_with_a_ladder_showing_the_stall() {
    let f = case_file("nagle-delayed-ack.pcap");
    let a = analyze_file(&f, &AnalyzeOptions::default()).unwrap();
    let mut ev = packets::evidence(&a, "fixture".into(), 0, false);
    let nd = ev.finding("nagle-delayed-ack").expect("finding").clone();
    assert!(nd.share > 0.8, "{nd:?}");
    assert!((35_000..=50_000).contains(&nd.median_added_us), "{nd:?}");
    assert!(!nd.examples.is_empty() && nd.examples[0].frames.len() >= 3);
    // The flow of the example stream, from a second pass that keeps its packets.
    let s = packets::example_stream(&a, u64::MAX).expect("example stream");
    let a2 = analyze_file(
        &f,
        &AnalyzeOptions {
            keep_stream: Some(s),
            ..AnalyzeOptions::default()
        },
    )
    .unwrap();
    let flow = packets::flow(&a2, s, 14).expect("flow");
    assert!(
        flow.packets.len() <= 14 && flow.packets.len() >= 5,
        "{flow:?}"
    );
    assert!(flow.server.ends_with(":8080"), "{}", flow.server);
    let stall = flow.stalls.first().expect("a stall in the window");
    assert!(stall.gap_us > 35_000, "{stall:?}");
    // The stall ends with the held segment from the server, after the client's bare ACK.
    let end = flow
        .packets
        .iter()
        .find(|p| p.frame == stall.to_frame)
        .unwrap();
    assert_eq!(end.dir, Direction::ToClient);
    assert!(end.len > 0);
    assert!(
        flow.packets
            .iter()
            .any(|p| p.dir == Direction::ToServer && p.len == 0 && p.flags.contains("ACK")),
        "the delayed ACK is in the window: {flow:?}"
    );
    assert!(
        flow.packets.iter().any(|p| p.note.starts_with("GET /")),
        "request lines are labelled: {flow:?}"
    );
    ev.example_flow = Some(flow);
    let j = judge(&target(), &packets_only(ev));
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck);
    // Packets alone: direct but uncorroborated.
    assert_eq!(j.verdict.confidence, lagtrace_diagnose::Confidence::Medium);
    // No socket evidence: the fix says what to set rather than a config line.
    assert!(j.verdict.fix[0].change.contains("TCP_NODELAY"));
}

#[test]
fn healthy_capture_names_no_cause() {
    let a = analyze_file(&case_file("healthy.pcap"), &AnalyzeOptions::default()).unwrap();
    let ev = packets::evidence(&a, "fixture".into(), 0, false);
    assert!(ev.transactions > 10, "{ev:?}");
    assert!(ev.server_time.is_some());
    let j = judge(&target(), &packets_only(ev));
    assert_eq!(j.verdict.cause, Cause::Healthy, "{:?}", j.evidence);
}
