//! The host layer's rules on constructed evidence: a counter names a mechanism only when its
//! timing and volume account for the slow requests, never merely for being above zero.

use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::{Confidence, Mechanism, judge};
use lagtrace_model::host::HostReport;
use lagtrace_model::{Cause, RequestRecord, RequestRecords};
use lagtrace_testkit::layers::{Synth, finding, options, target};
use serde_json::json;

const T0: u64 = 1_700_000_000_000_000;

/// A request of the c=N run starting at `start_us` (run clock) that waited `wait_us`.
fn rec(conn: u64, start_us: u64, wait_us: u64) -> RequestRecord {
    RequestRecord {
        conn,
        local: None,
        remote: "10.77.0.2:8080".parse().unwrap(),
        index: 1,
        start_us,
        wait_us,
        connect_start_us: 0,
        connect_end_us: Some(100),
        syn_retransmits: Some(0),
        intended_us: None,
        sent_first_us: Some(start_us),
        sent_last_us: Some(start_us),
        first_byte_us: Some(start_us + wait_us),
        last_byte_us: Some(start_us + wait_us),
        bytes: 100,
        status: Some(200),
        error: None,
        pending: false,
        slow: true,
        weight: 1.0,
    }
}

/// A healthy lab whose c=N run (p50 1 ms, p99 60 ms) has its slowest 10 requests at the
/// given start times (µs into the run), each waiting 80 ms.
fn layers_with_tail(slow_starts: &[u64]) -> Layers {
    let mut l = Synth::RULES.healthy_layers();
    let app = l.app.data.as_mut().unwrap();
    let cn = app.cn.as_mut().unwrap();
    cn.latency = Synth::RULES.pct(10_000, 1_000, 60_000);
    cn.waits = Some(cn.latency.clone());
    cn.records = Some(RequestRecords {
        start_unix_us: T0,
        threads: 2,
        slow_cap: 4096,
        sample_cap: 4096,
        seen: 10_000,
        pending: 0,
        records: slow_starts
            .iter()
            .enumerate()
            .map(|(i, &s)| rec(i as u64, s, 80_000))
            .collect(),
    });
    l
}

/// A host report whose cgroup (quota 10 ms per 100 ms) was throttled in the 100 ms
/// sampling intervals starting at `throttled` (ms into the run), over 2 s.
fn host_throttled(throttled_ms: &[u64]) -> HostReport {
    let mut n = 0u64;
    let timeline: Vec<_> = (0..=20u64)
        .map(|i| {
            if i > 0 && throttled_ms.contains(&((i - 1) * 100)) {
                n += 1;
            }
            json!({"t_unix_us": T0 + i * 100_000, "throttled_periods": n, "throttled_us": n * 90_000})
        })
        .collect();
    serde_json::from_value(json!({
        "scope": {"pid": 4242, "comm": "python3", "netns_inode": 1},
        "window_us": 2_000_000,
        "counters": {"status": "ok", "data": []},
        "listeners": {"status": "ok", "data": []},
        "cgroup": {"status": "ok", "data": {
            "version": 1, "path": "/sys/fs/cgroup/cpu/svc", "quota_us": 10_000,
            "period_us": 100_000, "periods": 20, "throttled_periods": n,
            "throttled_us": n * 90_000, "throttled_share": n as f64 / 20.0,
            "timeline": timeline}},
        "threads": {"status": "skipped", "reason": "x"},
        "qdiscs": {"status": "ok", "data": []},
        "sockstat": {"status": "skipped", "reason": "x"},
        "drops": {"status": "skipped", "reason": "x"},
        "cost": {"cpu_us": 0, "cpu_share": 0.0}
    }))
    .expect("host report")
}

#[test]
fn throttled_periods_overlapping_the_slowest_requests_name_cpu_throttled() {
    let starts: Vec<u64> = (0..10).map(|i| 300_000 + i * 100_000 + 10_000).collect();
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(host_throttled(&[
        300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200,
    ]));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::CpuThrottled), "{j:#?}");
    assert!(
        j.verdict.fix[0].change.contains("cpu.cfs_quota_us"),
        "{j:#?}"
    );
    assert!(j.finding_layers.contains(&LayerName::Host), "{j:#?}");
}

#[test]
fn throttling_elsewhere_in_time_or_too_rare_names_nothing() {
    // The same amount of throttling, but in the second half while the slow requests were
    // in the first: not aligned.
    let starts: Vec<u64> = (0..10).map(|i| 10_000 + i * 90_000).collect();
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(host_throttled(&[
        1000, 1100, 1200, 1300, 1400, 1500, 1600, 1700, 1800, 1900,
    ]));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    assert_ne!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    // Aligned, but each throttled period held the cgroup 2 ms: no account of 80 ms waits.
    let mut l = layers_with_tail(&[310_000; 10]);
    let mut h = host_throttled(&[300, 400, 500]);
    let cg = h.cgroup.data.as_mut().unwrap();
    for s in &mut cg.timeline {
        s.throttled_us = s.throttled_periods * 2_000;
    }
    cg.throttled_us = 6_000;
    l.host = Layer::ran(h);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
}

/// Healthy layers whose c=N run made `attempts` connects, `waited` of them waiting for a
/// SYN retransmission (the connect times' p99 `connect_p99_us`).
fn waiting_connects(attempts: u64, waited: u64, connect_p99_us: u64) -> Layers {
    let mut l = Synth::RULES.healthy_layers();
    let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
    cn.waits = Some(cn.latency.clone());
    cn.connects = Some(ConnectStats {
        attempts,
        syn_retransmitted: waited,
        failed: 0,
        pending: 0,
        time: Synth::RULES.pct(attempts, 200, connect_p99_us),
    });
    l
}

#[test]
fn listener_drops_on_the_target_port_must_match_the_waiting_connects() {
    // `drops`: the listener's sk_drops; `ns_drops`: the namespace's TcpExt.ListenDrops.
    let mk = |port: u16, drops: u64, ns_drops: u64| {
        let mut l = waiting_connects(32, 20, 1_030_000);
        let mut h = host_throttled(&[]);
        h.counters = Layer::ran(
            serde_json::from_value(json!([{
                "name": "TcpExt.ListenDrops", "before": 0, "after": ns_drops, "delta": ns_drops}]))
            .unwrap(),
        );
        h.listeners = Layer::ran(
            serde_json::from_value(json!([{
                "local": format!("0.0.0.0:{port}"), "inode": 7, "owners": [], "max": 1,
                "current": 0, "peak": 2, "samples": 20, "full_samples": 5, "drops": drops}]))
            .unwrap(),
        );
        l.host = Layer::ran(h);
        judge(&target(), &l)
    };
    let j = mk(8080, 25, 25);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{j:#?}");
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::AcceptQueueOverflow),
        "{j:#?}"
    );
    assert!(j.verdict.fix[0].change.contains("somaxconn"), "{j:#?}");
    // Another port's listener, too few drops for the waiting connects, or a listener whose
    // sk_drops rose while the namespace dropped no connection at a listener (the RSTs that
    // answer SYN probes' SYN-ACKs count there): no mechanism.
    for (port, drops, ns_drops) in [(9090, 25, 25), (8080, 3, 3), (8080, 25, 0)] {
        let j = mk(port, drops, ns_drops);
        assert_eq!(
            j.verdict.mechanism, None,
            "{port} {drops} {ns_drops}: {j:#?}"
        );
    }
}

/// The slow requests aligned with throttling, and the packets' cork detector seeing the
/// late responses as held to the 200 ms ceiling (as on a real quota'd Python server).
fn throttled_with_cork_finding() -> Layers {
    let starts: Vec<u64> = (0..10).map(|i| 300_000 + i * 100_000 + 10_000).collect();
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(host_throttled(&[
        300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200,
    ]));
    let p = l.packets.data.as_mut().unwrap();
    p.findings = vec![finding("tcp-cork", 300, 1_000, 200_000)];
    l
}

#[test]
fn a_cork_seen_only_in_packets_yields_to_aligned_throttling() {
    // Sockets read, TCP_CORK off on all 32 of them while the packets saw 30% of the
    // responses held at the ceiling: a reading that unlikely (0.7^32) rules the cork out
    // before any candidate is made, and says so.
    let l = throttled_with_cork_finding();
    assert_eq!(l.sockets.data.as_ref().unwrap().cork.on, 0);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::CpuThrottled), "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("cork ceiling, yet TCP_CORK was off on 32/32")),
        "{j:#?}"
    );
    // Sockets not read at all: still only an inference, which yields to the throttling.
    let mut l = throttled_with_cork_finding();
    l.sockets = Layer::skipped("not root");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::CpuThrottled), "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e.text.contains("look corked")),
        "{j:#?}"
    );
    // Two sockets read uncorked: 0.7² is no unlikely reading; the cork stays a candidate
    // and yields to the throttling as before.
    let mut l = throttled_with_cork_finding();
    l.sockets.data.as_mut().unwrap().cork = options(0, 2);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, Some(Mechanism::CpuThrottled), "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e.text.contains("look corked")),
        "{j:#?}"
    );
}

#[test]
fn a_cork_read_on_the_sockets_is_not_overruled_by_throttling() {
    let mut l = throttled_with_cork_finding();
    l.sockets.data.as_mut().unwrap().cork = options(32, 0);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::TcpCork, "{j:#?}");
}

/// A host report with local drops: `nf` NETFILTER_DROP (counted `scope`) and a `tbf` qdisc
/// on `veth-s` that dropped `qdisc`.
fn host_drops(nf: u64, scope: &str, qdisc: u64) -> HostReport {
    let reasons = if nf > 0 {
        json!([{"reason": "NETFILTER_DROP", "count": nf}, {"reason": "NO_SOCKET", "count": 3}])
    } else {
        json!([{"reason": "NO_SOCKET", "count": 3}])
    };
    let qdiscs = if qdisc > 0 {
        json!([{"dev": "veth-s", "kind": "tbf", "handle": "8001:", "parent": "root",
                "packets": 9000, "bytes": 9_000_000, "drops": qdisc, "overlimits": 40,
                "requeues": 0, "drops_total": qdisc, "qlen": 0, "backlog_bytes": 0}])
    } else {
        json!([{"dev": "veth-s", "kind": "noqueue", "handle": "0:", "parent": "root",
                "packets": 0, "bytes": 0, "drops": 0, "overlimits": 0,
                "requeues": 0, "drops_total": 0, "qlen": 0, "backlog_bytes": 0}])
    };
    serde_json::from_value(json!({
        "scope": {"netns": "lt-lab", "pid": 4242, "comm": "nginx", "netns_inode": 1},
        "window_us": 3_000_000,
        "counters": {"status": "ok", "data": []},
        "listeners": {"status": "ok", "data": []},
        "cgroup": {"status": "skipped", "reason": "x"},
        "threads": {"status": "skipped", "reason": "x"},
        "qdiscs": {"status": "ok", "data": qdiscs},
        "sockstat": {"status": "skipped", "reason": "x"},
        "drops": {"status": "ok", "data": {"scope": scope, "reasons": reasons, "lost": 0}},
        "cost": {"cpu_us": 0, "cpu_share": 0.0}
    }))
    .expect("host report")
}

/// A healthy lab whose packets show `held` held-until-ack segments of 10 000 transactions,
/// each ~40 ms.
fn layers_held(held: u64) -> Layers {
    let mut l = Synth::RULES.healthy_layers();
    if held > 0 {
        l.packets.data.as_mut().unwrap().findings =
            vec![finding("held-until-ack", held, 10_000, 40_000)];
    }
    l
}

#[test]
fn held_segments_with_local_netfilter_drops_are_packet_loss_dropped_before_wire() {
    let mut l = layers_held(200);
    l.host = Layer::ran(host_drops(230, "machine", 0));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::PacketLoss, "{j:#?}");
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::DroppedBeforeWire),
        "{j:#?}"
    );
    let f = &j.verdict.fix[0];
    assert!(
        f.change.contains("ip netns exec lt-lab nft list ruleset"),
        "{f:?}"
    );
    let host = j
        .evidence
        .iter()
        .find(|e| e.layer == LayerName::Host)
        .expect("a host line");
    assert!(host.text.contains("NETFILTER_DROP"), "{}", host.text);
    assert!(host.text.contains("230 packets"), "{}", host.text);
    // The held segments with their stream and frames.
    assert!(
        j.evidence
            .iter()
            .any(|e| e.layer == LayerName::Packets && e.text.contains("frames #41 #44 #45")),
        "{j:#?}"
    );
    assert!(
        j.verdict.cost.text.contains("dropped before the wire"),
        "{j:#?}"
    );
    assert!(j.finding_layers.contains(&LayerName::Host), "{j:#?}");
}

#[test]
fn held_segments_with_qdisc_drops_name_the_qdisc() {
    let mut l = layers_held(200);
    l.host = Layer::ran(host_drops(0, "machine", 260));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::PacketLoss, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::DroppedBeforeWire));
    let f = &j.verdict.fix[0];
    assert!(
        f.change
            .contains("ip netns exec lt-lab tc -s qdisc show dev veth-s"),
        "{f:?}"
    );
    assert_eq!(f.location.as_deref(), Some("tbf qdisc 8001: on veth-s"));
}

#[test]
fn local_drops_name_nothing_without_the_targets_held_segments_or_enough_of_them() {
    // Drops elsewhere (machine-wide) while the target's packets show no holds.
    let mut l = layers_held(0);
    l.host = Layer::ran(host_drops(500, "machine", 0));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    assert_ne!(j.verdict.cause, Cause::PacketLoss, "{j:#?}");
    // Holds, but far fewer drops than held segments: the drops do not account for them.
    let mut l = layers_held(200);
    l.host = Layer::ran(host_drops(20, "machine", 0));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    // Holds and no local drops at all: no mechanism.
    let mut l = layers_held(200);
    l.host = Layer::ran(host_drops(0, "machine", 0));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
}

#[test]
fn the_namespaces_own_qdisc_drops_win_over_a_larger_machine_wide_netfilter_count() {
    // Another namespace's nftables rule dropped more (the tracepoint is machine-wide); the
    // server's own qdisc dropped enough for its held segments.
    let mut l = layers_held(200);
    l.host = Layer::ran(host_drops(900, "machine", 150));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, Some(Mechanism::DroppedBeforeWire));
    assert_eq!(
        j.verdict.fix[0].location.as_deref(),
        Some("tbf qdisc 8001: on veth-s"),
        "{j:#?}"
    );
}

/// A host report whose server threads (one worker) waited for a CPU `wait_ms` of each 100 ms
/// sampling interval starting at `busy` (ms into the run) and 1 ms of the others, over 2 s;
/// the host's CPU went to this lagtrace (`own_ms`) and to other tasks (`others_ms`).
fn host_contended(busy_ms: &[u64], wait_ms: u64, own_ms: u64, others_ms: u64) -> HostReport {
    let timeline: Vec<_> = (0..20u64)
        .map(|i| {
            let w = if busy_ms.contains(&(i * 100)) {
                wait_ms
            } else {
                1
            };
            json!({"start_unix_us": T0 + i * 100_000, "end_unix_us": T0 + (i + 1) * 100_000,
                   "run_us": 20_000, "wait_us": w * 1000, "active": 1})
        })
        .collect();
    let wait: u64 = timeline
        .iter()
        .map(|t| t["wait_us"].as_u64().unwrap())
        .sum();
    serde_json::from_value(json!({
        "scope": {"pid": 4242, "comm": "nginx", "netns_inode": 1},
        "window_us": 2_000_000,
        "counters": {"status": "ok", "data": []},
        "listeners": {"status": "ok", "data": []},
        "cgroup": {"status": "skipped", "reason": "x"},
        "threads": {"status": "ok", "data": {
            "threads": 1, "run_us": 400_000, "wait_us": wait,
            "wait_share": wait as f64 / (400_000 + wait) as f64, "timeslices": 4000,
            "timeline": timeline}},
        "cpu": {"status": "ok", "data": {
            "cpus": 2, "busy_us": (own_ms + others_ms) * 1000 + 400_000, "busy_share": 0.9,
            "own_us": own_ms * 1000, "watched_us": 400_000, "others_us": others_ms * 1000, "unattributed_us": 0,
            "top": [{"pid": 99, "comm": "batch-job", "cpu_us": others_ms * 1000}]}},
        "qdiscs": {"status": "ok", "data": []},
        "sockstat": {"status": "skipped", "reason": "x"},
        "drops": {"status": "skipped", "reason": "x"},
        "cost": {"cpu_us": 0, "cpu_share": 0.0}
    }))
    .expect("host report")
}

/// The slowest 10 requests (80 ms each) start 10 ms into the intervals 300…1200 ms.
fn contended_tail() -> (Vec<u64>, [u64; 10]) {
    let starts = (0..10).map(|i| 300_000 + i * 100_000 + 10_000).collect();
    (
        starts,
        [300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200],
    )
}

#[test]
fn run_queue_delay_through_the_slow_requests_on_a_host_busy_with_other_work_is_cpu_contention() {
    let (starts, busy) = contended_tail();
    let mut l = layers_with_tail(&starts);
    // 60 ms of each busy 100 ms waiting: ~48 ms within an 80 ms request (excess 79 ms).
    l.host = Layer::ran(host_contended(&busy, 60, 300, 2_500));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    assert!(j.verdict.fix[0].change.contains("batch-job"), "{j:#?}");
    assert_eq!(j.verdict.fix.len(), 1, "{j:#?}");
    assert!(j.finding_layers.contains(&LayerName::Host), "{j:#?}");
}

#[test]
fn run_queue_delay_caused_by_the_measurement_itself_is_healthy_at_medium_confidence() {
    let (starts, busy) = contended_tail();
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(host_contended(&busy, 60, 1_500, 200));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
    assert_eq!(j.verdict.confidence, Confidence::Medium, "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("CPU contention on the host the server shares")),
        "{j:#?}"
    );
}

/// `host_contended` with each busy 100 ms interval's waits spread over `busy_slices`
/// timeslices (and 10 in each quiet one).
fn with_slices(mut h: HostReport, busy_slices: u64) -> HostReport {
    let th = h.threads.data.as_mut().expect("threads");
    for t in &mut th.timeline {
        t.timeslices = if t.wait_us > 1_000 { busy_slices } else { 10 };
    }
    th.timeslices = th.timeline.iter().map(|t| t.timeslices).sum();
    h
}

/// The same waits through the same slow requests, but in a thousand ~60 µs waits per 100 ms
/// — a thread that gets a CPU ten thousand times a second while the host is busy: no 80 ms
/// request waited 40 ms of that, whoever held the CPUs. Not cpu-contention, and not the
/// measurement's own contention either (never healthy over that tail); waits of a
/// scheduler slice behind two CPU-bound neighbours (60 ms in 10 timeslices, 6 ms each, as
/// nginx pinned with two busy loops measured) are.
#[test]
fn many_short_waits_for_a_cpu_on_a_busy_host_do_not_explain_slow_requests() {
    let (starts, busy) = contended_tail();
    for (own, others) in [(300, 2_500), (1_500, 200)] {
        let mut l = layers_with_tail(&starts);
        l.host = Layer::ran(with_slices(host_contended(&busy, 60, own, others), 1_000));
        let j = judge(&target(), &l);
        assert_ne!(
            j.verdict.mechanism,
            Some(Mechanism::CpuContention),
            "{j:#?}"
        );
        assert_ne!(j.verdict.cause, Cause::Healthy, "{j:#?}");
        let mut l = layers_with_tail(&starts);
        l.host = Layer::ran(with_slices(host_contended(&busy, 60, own, others), 10));
        let j = judge(&target(), &l);
        let t: String = j.evidence.iter().map(|e| e.text.clone()).collect();
        if own == 300 {
            assert_eq!(
                j.verdict.mechanism,
                Some(Mechanism::CpuContention),
                "{j:#?}"
            );
        } else {
            assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
        }
        assert!(t.contains("each time"), "{t}");
    }
}

/// `h` with the off-CPU tracer's blocks timed one by one: in each slow request (80 ms,
/// starting at `starts`), `n` run-queue blocks of `each_us` of the serving thread.
fn with_blocks(mut h: HostReport, starts: &[u64], n: u64, each_us: u64) -> HostReport {
    let mut off: lagtrace_model::host::OffCpu = serde_json::from_value(json!({
        "classes": [], "stacks": [], "min_block_us": 50, "missed": 0}))
    .expect("offcpu");
    for &s in starts {
        for k in 0..n {
            let b = (T0 + s + 1_000 + k * (each_us + 200)) as i64;
            off.blocks.push(lagtrace_model::host::OffCpuBlock {
                tid: 4243,
                start_us: b,
                end_us: b + each_us as i64,
                class: lagtrace_model::host::WaitClass::RunQueue,
                stack: -1,
                waker: None,
                woken_us: None,
            });
        }
    }
    h.offcpu = Layer::ran(off);
    h
}

/// Where the tracer timed each wait, the waits themselves decide, not the samples' average
/// length: five 10 ms run-queue blocks in each 80 ms request hold it (among a thousand short
/// waits a sample, which alone would say no), eighty 500 µs ones — shorter than the typical
/// request, which sits through such waits too — do not (though the samples' ten slices a
/// sample alone would say yes).
#[test]
fn run_queue_blocks_timed_one_by_one_decide_over_the_samples_average() {
    let (starts, busy) = contended_tail();
    let mut l = layers_with_tail(&starts);
    let h = with_slices(host_contended(&busy, 60, 300, 2_500), 1_000);
    l.host = Layer::ran(with_blocks(h, &starts, 5, 10_000));
    let j = judge(&target(), &l);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    let mut l = layers_with_tail(&starts);
    let h = with_slices(host_contended(&busy, 60, 300, 2_500), 10);
    l.host = Layer::ran(with_blocks(h, &starts, 80, 500));
    let j = judge(&target(), &l);
    assert_ne!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    assert_ne!(j.verdict.cause, Cause::Healthy, "{j:#?}");
}

/// One long wait for a CPU per slow request, timed one by one, holds it even where the
/// samples' density does not show it: three threads shared the 100 ms intervals' 60 ms of
/// waiting, so spread over an interval it is ~16 ms of an 80 ms request — but one thread
/// waited 60 ms of it (an event loop descheduled through a stall of every connection).
#[test]
fn one_long_timed_wait_per_slow_request_is_not_diluted_by_the_samples() {
    let (starts, busy) = contended_tail();
    let mut h = host_contended(&busy, 60, 300, 2_500);
    for t in &mut h.threads.data.as_mut().expect("threads").timeline {
        t.active = 3;
    }
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(with_blocks(h, &starts, 1, 60_000));
    let j = judge(&target(), &l);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
}

/// A report read back (an agent's, a saved JSON) has no blocks timed one by one, only the
/// long run-queue waits it carries: they decide as the blocks did — five 10 ms waits in each
/// slow request hold it; with only 500 µs waits none is carried, and the samples' thousand
/// short waits say no (the mean of the samples alone would hide the long waits either way).
#[test]
fn long_run_queue_waits_carried_in_a_report_decide_like_the_blocks() {
    use lagtrace_model::host::OffCpu;
    let (starts, busy) = contended_tail();
    let read_back = |n: u64, each_us: u64| {
        let h = with_slices(host_contended(&busy, 60, 300, 2_500), 1_000);
        let mut h = with_blocks(h, &starts, n, each_us);
        let off = h.offcpu.data.as_mut().expect("offcpu");
        off.long_run_queue = Some(OffCpu::long_run_queue_of(&off.blocks));
        let back: HostReport =
            serde_json::from_str(&serde_json::to_string(&h).expect("json")).expect("read back");
        assert!(back.offcpu.get().expect("offcpu").blocks.is_empty());
        let mut l = layers_with_tail(&starts);
        l.host = Layer::ran(back);
        judge(&target(), &l)
    };
    let j = read_back(5, 10_000);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    let j = read_back(80, 500);
    assert_ne!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
}

/// A p99 of 9× the p50 is within what contention spreads at c=N — no tail — but a server
/// whose threads waited for a CPU longer than they ran, behind other processes that used
/// more CPU than it did, with its slowest requests held by those waits, is starved: named
/// `cpu-contention` (it was `healthy, high` on a suite's busy host). The same waits where
/// the server itself used most of the CPU (its own workers queued on one CPU) are not.
#[test]
fn a_server_starved_by_other_work_is_cpu_contention_without_a_tail() {
    let (starts, busy) = contended_tail();
    let starved = |others_ms: u64| {
        let mut l = layers_with_tail(&starts);
        let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
        cn.latency = Synth::RULES.pct(10_000, 1_000, 9_000);
        cn.waits = Some(cn.latency.clone());
        for r in &mut cn.records.as_mut().unwrap().records {
            r.wait_us = 9_500;
            r.first_byte_us = Some(r.start_us + 9_500);
            r.last_byte_us = r.first_byte_us;
        }
        let mut h = host_contended(&busy, 60, 300, others_ms);
        // Waited longer than it ran: 60 ms of each busy 100 ms.
        let th = h.threads.data.as_mut().unwrap();
        th.wait_share = 0.6;
        l.host = Layer::ran(with_blocks(h, &starts, 2, 3_000));
        judge(&target(), &l)
    };
    let j = starved(2_500);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    assert!(j.verdict.fix[0].change.contains("batch-job"), "{j:#?}");
    let j = starved(200);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
}

#[test]
fn run_queue_delay_elsewhere_in_time_or_too_short_is_no_contention() {
    let (starts, _) = contended_tail();
    // The waits in the second half, the slow requests in the first.
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(host_contended(
        &[1300, 1400, 1500, 1600, 1700, 1800, 1900],
        60,
        300,
        2_500,
    ));
    let j = judge(&target(), &l);
    assert_ne!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    assert_ne!(j.verdict.cause, Cause::Healthy, "{j:#?}");
    // Aligned, but 20 ms of each 100 ms: ~16 ms of an 80 ms request's 79 ms excess (a
    // handler that sleeps or waits on a backend is not runnable: its wait is not there).
    let (starts, busy) = contended_tail();
    let mut l = layers_with_tail(&starts);
    l.host = Layer::ran(host_contended(&busy, 20, 300, 2_500));
    let j = judge(&target(), &l);
    assert_ne!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    assert_ne!(j.verdict.cause, Cause::Healthy, "{j:#?}");
}

#[test]
fn drop_reasons_that_are_not_lost_traffic_are_no_evidence_of_loss() {
    // Our own capture's packet socket declining copies (SOCKET_FILTER), sockets closing with
    // data queued (QUEUE_PURGE), and the usual unattributed frees: thousands of them, while
    // the target's packets show held segments. None is a segment of the server's that the
    // host failed to send.
    let mut l = layers_held(200);
    let mut h = host_drops(0, "namespace", 0);
    h.drops.data.as_mut().expect("drops").reasons = serde_json::from_value(json!([
        {"reason": "SOCKET_FILTER", "count": 5000},
        {"reason": "QUEUE_PURGE", "count": 800},
        {"reason": "NOT_SPECIFIED", "count": 300},
        {"reason": "TCP_OLD_DATA", "count": 40}
    ]))
    .expect("reasons");
    l.host = Layer::ran(h);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    assert!(
        !j.evidence.iter().any(|e| e.layer == LayerName::Host
            && e.stance == lagtrace_diagnose::Stance::Supports
            && e.cause == Some(Cause::PacketLoss)),
        "{j:#?}"
    );
}

#[test]
fn a_child_qdisc_that_dropped_is_named_not_the_classful_parent_counting_its_drops() {
    let mut l = layers_held(200);
    let mut h = host_drops(0, "namespace", 0);
    h.qdiscs.data = serde_json::from_value(json!([
        {"dev": "veth-s", "kind": "htb", "handle": "1:", "parent": "root",
         "packets": 9000, "bytes": 9_000_000, "drops": 260, "overlimits": 0,
         "requeues": 0, "drops_total": 260, "qlen": 0, "backlog_bytes": 0},
        {"dev": "veth-s", "kind": "tbf", "handle": "10:", "parent": "1:1",
         "packets": 300, "bytes": 300_000, "drops": 260, "overlimits": 9000,
         "requeues": 0, "drops_total": 260, "qlen": 0, "backlog_bytes": 0}
    ]))
    .expect("qdiscs");
    l.host = Layer::ran(h);
    let j = judge(&target(), &l);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::DroppedBeforeWire),
        "{j:#?}"
    );
    let f = &j.verdict.fix[0];
    assert_eq!(
        f.location.as_deref(),
        Some("tbf qdisc 10: (parent 1:1) on veth-s")
    );
    let host = j
        .evidence
        .iter()
        .find(|e| e.layer == LayerName::Host)
        .expect("a host line");
    // Each drop once: the tbf's 260, not the htb's copy of them.
    assert!(!host.text.contains("htb"), "{}", host.text);
    assert!(host.text.contains("dropped 260 packets"), "{}", host.text);
}

/// A host report whose only root qdisc (an htb on `veth1`) sent `bytes` over 4.9 s and held
/// a median of `backlog` bytes over 49 samples, `end` bytes at the end.
fn host_qdisc(bytes: u64, backlog: u32, end: u32) -> HostReport {
    serde_json::from_value(json!({
        "scope": {"pid": 4242, "comm": "nginx", "netns_inode": 1},
        "window_us": 4_900_000,
        "counters": {"status": "ok", "data": []},
        "listeners": {"status": "ok", "data": []},
        "cgroup": {"status": "skipped", "reason": "x"},
        "threads": {"status": "skipped", "reason": "x"},
        "qdiscs": {"status": "ok", "data": [
            {"dev": "veth1", "kind": "htb", "handle": "1:", "parent": "root",
             "packets": 12_421, "bytes": bytes, "drops": 0, "overlimits": 11_606,
             "requeues": 0, "drops_total": 0, "qlen": 53, "backlog_bytes": end,
             "backlog_sampled": {"samples": 49, "p50_bytes": backlog, "max_bytes": end.max(backlog)}},
            {"dev": "veth1", "kind": "pfifo", "handle": "10:", "parent": "1:10",
             "packets": 12_421, "bytes": bytes, "drops": 0, "overlimits": 0,
             "requeues": 0, "drops_total": 0, "qlen": 53, "backlog_bytes": backlog}]},
        "sockstat": {"status": "skipped", "reason": "x"},
        "drops": {"status": "skipped", "reason": "x"},
        "cost": {"cpu_us": 0, "cpu_share": 0.0}
    }))
    .expect("host report")
}

/// Another flow keeps a shaper's deep FIFO on the server's egress full (the lab's htb at
/// 20 Mbit/s, 300 packets, and a bulk download): the SYN RTT is the queue's before the load
/// as after it (116 ms, then 14 ms), so it does not rise; every request waits ~14 ms.
fn standing_queue(syn_load_us: u64, backlog: u32, end: u32) -> Layers {
    let mut l = Synth::RULES.healthy_layers();
    let p = l.path.data.as_mut().unwrap();
    p.idle = Some(lagtrace_testkit::layers::rtt(115_000));
    p.under_load = Some(lagtrace_testkit::layers::rtt(syn_load_us));
    let app = l.app.data.as_mut().unwrap();
    app.c1.as_mut().unwrap().latency = Synth::RULES.pct(300, 16_000, 55_000);
    app.cn.as_mut().unwrap().latency = Synth::RULES.pct(10_000, 14_190, 26_000);
    l.packets.data.as_mut().unwrap().server_time = Some(Synth::RULES.pct(10_000, 14_160, 20_000));
    l.host = Layer::ran(host_qdisc(12_228_553, backlog, end));
    l
}

#[test]
fn a_standing_queue_in_the_servers_own_qdisc_is_path_queueing_from_the_host() {
    let j = judge(&target(), &standing_queue(14_300, 26_482, 900));
    assert_eq!(j.verdict.cause, Cause::PathQueueing, "{j:#?}");
    assert!(j.finding_layers.contains(&LayerName::Host), "{j:#?}");
    let host = j
        .evidence
        .iter()
        .find(|e| e.layer == LayerName::Host)
        .expect("a host line");
    // A median of 26482 B at 12228553 B / 4.9 s: 10.6 ms (900 B at the end).
    assert!(host.text.contains("htb 1: on veth1"), "{}", host.text);
    assert!(host.text.contains("median 26482 B"), "{}", host.text);
    assert!(host.text.contains("~10.61ms"), "{}", host.text);
    let fix = &j.verdict.fix[0];
    assert_eq!(
        fix.location.as_deref(),
        Some("veth1 qdisc htb 1:"),
        "{j:#?}"
    );
    // The packets' server time is the queue's too (the capture is past the qdisc): not
    // called the server queueing requests itself.
    let texts: Vec<&str> = j.evidence.iter().map(|e| e.text.as_str()).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("includes the wait in the server's egress queue")),
        "{texts:#?}"
    );
    assert!(
        !texts.iter().any(|t| t.contains("queues requests itself")),
        "{texts:#?}"
    );
}

#[test]
fn a_backlog_that_probes_and_requests_do_not_wait_behind_is_no_queue() {
    // The same backlog, but the SYN probes under load crossed in 60 µs: a burst caught at
    // the end of the window, not a queue everyone waits in.
    let j = judge(&target(), &standing_queue(60, 26_482, 26_482));
    assert_ne!(j.verdict.cause, Cause::PathQueueing, "{j:#?}");
    // A backlog short of QUEUE_RISE_US at the qdisc's rate names nothing.
    let j = judge(&target(), &standing_queue(14_300, 2_000, 2_000));
    assert_ne!(j.verdict.cause, Cause::PathQueueing, "{j:#?}");
    // Nor does a large backlog at the end when the median through the run is short.
    let j = judge(&target(), &standing_queue(14_300, 2_000, 60_000));
    assert_ne!(j.verdict.cause, Cause::PathQueueing, "{j:#?}");
}

/// Connection tracking that lost new connections' packets while connects waited for SYN
/// retransmissions: `kernel-stack` / `conntrack`, the syn-drop symptom folded into it, the
/// fix on the table's size and `notrack` for the port. Counters recorded from a full table:
/// `conntrack -S` drop +`lost` (`insert_failed` +0), `entries` at `nf_conntrack_max`.
/// Too few losses for the waits, none at all, or a listener that overflowed instead: not
/// conntrack.
#[test]
fn conntrack_drops_that_account_for_the_syn_waits_are_kernel_stack_conntrack() {
    let mk = |lost: u64, waited: u64| {
        let mut l = waiting_connects(64, waited, 1_030_000);
        // The capture's view of the same waits: SYNs sent again after ~1 s.
        l.packets.data.as_mut().unwrap().findings =
            vec![finding("syn-retransmit", waited, 64, 1_000_000)];
        let mut h = host_drops(0, "namespace", 0);
        h.conntrack = Layer::ran(
            serde_json::from_value(json!({
                "count": 65_536, "max": 65_536, "peak": 65_536,
                "drop": lost, "early_drop": 0, "insert_failed": 0, "invalid": 0}))
            .unwrap(),
        );
        l.host = Layer::ran(h);
        judge(&target(), &l)
    };
    let j = mk(22, 20);
    assert_eq!(j.verdict.cause, Cause::KernelStack, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::Conntrack), "{j:#?}");
    assert!(
        !j.verdict.secondary.contains(&Cause::SynDrop),
        "the SYN waits are the drops' symptom: {j:#?}"
    );
    let f = &j.verdict.fix[0];
    assert!(f.change.contains("nf_conntrack_max"), "{f:?}");
    assert!(f.change.contains("tcp dport 8080 notrack"), "{f:?}");
    assert!(
        j.verdict
            .cost
            .text
            .contains("connection tracking drops them"),
        "{}",
        j.verdict.cost.text
    );
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("65536 of its 65536 entries")),
        "{:#?}",
        j.evidence
    );
    // Sentences, not source indentation: no run of spaces in what the user reads.
    for t in j
        .evidence
        .iter()
        .map(|e| &e.text)
        .chain([&f.change, f.tradeoff.as_ref().unwrap_or(&String::new())])
    {
        assert!(!t.contains("  "), "{t:?}");
    }
    for (lost, waited) in [(4, 20), (0, 20)] {
        let j = mk(lost, waited);
        assert_ne!(
            j.verdict.mechanism,
            Some(Mechanism::Conntrack),
            "{lost} lost for {waited} waits: {j:#?}"
        );
        assert_eq!(j.verdict.cause, Cause::SynDrop, "{lost}: {j:#?}");
    }
}

/// A SYN flood from spoofed sources against a listener with syncookies off: its SYN queue
/// full of half-open connections from hundreds of sources, `TCPReqQFullDrop` enough for the
/// connects that waited → `syn-drop` / `syn-flood` with syncookies in the fix. Controls: the
/// same drops with the half-open connections from one source (the load's own burst), or
/// with too few drops, name no flood. With syncookies on (cookies sent, no connect waited)
/// the verdict stays healthy and a note says the flood was absorbed.
#[test]
fn a_full_syn_queue_of_many_sources_with_syncookies_off_is_syn_flood() {
    let mk = |waited: u64, counters: serde_json::Value, peak: u32, sources: u32| {
        let mut l = waiting_connects(64, waited, if waited > 0 { 1_030_000 } else { 300 });
        let mut h = host_throttled(&[]);
        h.counters = Layer::ran(serde_json::from_value(counters).unwrap());
        h.listeners = Layer::ran(
            serde_json::from_value(json!([{
                "local": "0.0.0.0:8080", "inode": 7, "owners": [], "max": 511,
                "current": 0, "peak": 0, "samples": 40, "full_samples": 0, "drops": 4000,
                "half_open_peak": peak, "half_open_sources": sources}]))
            .unwrap(),
        );
        l.host = Layer::ran(h);
        judge(&target(), &l)
    };
    let dropped = |n: u64| {
        json!([
            {"name": "TcpExt.TCPReqQFullDrop", "before": 0, "after": n, "delta": n},
            {"name": "TcpExt.ListenDrops", "before": 0, "after": n, "delta": n}
        ])
    };
    let j = mk(20, dropped(4000), 511, 498);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::SynFlood), "{j:#?}");
    let f = &j.verdict.fix[0];
    assert!(f.change.contains("net.ipv4.tcp_syncookies=1"), "{f:?}");
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("511 half-open connections (it holds 511) from 498")),
        "{:#?}",
        j.evidence
    );
    // None of this run's connects waited (they landed as the queue freed), but the flood
    // dropped thousands of SYNs: still the flood, its cost said as such.
    let j = mk(0, dropped(4000), 511, 498);
    assert_eq!(j.verdict.mechanism, Some(Mechanism::SynFlood), "{j:#?}");
    assert!(
        j.verdict
            .cost
            .text
            .contains("none of this run's 64 connects waited"),
        "{}",
        j.verdict.cost.text
    );
    for (why, waited, counters, peak, sources) in [
        ("one source", 20, dropped(4000), 511, 1),
        ("too few drops", 20, dropped(5), 511, 498),
        ("a few drops and no wait", 0, dropped(20), 511, 498),
        ("a queue far from full", 20, dropped(4000), 40, 40),
    ] {
        let j = mk(waited, counters, peak, sources);
        assert_ne!(
            j.verdict.mechanism,
            Some(Mechanism::SynFlood),
            "{why}: {j:#?}"
        );
    }
    // Syncookies on: the kernel answered the flood with cookies, no connect waited.
    let cookies = json!([{"name": "TcpExt.TCPReqQFullDoCookies", "before": 0,
                          "after": 90_000, "delta": 90_000}]);
    let j = mk(0, cookies, 511, 498);
    assert_eq!(j.verdict.cause, Cause::Healthy, "{j:#?}");
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("the cookies kept connection setup quick")),
        "{:#?}",
        j.evidence
    );
}

/// Connects waiting for SYN retransmissions while netfilter in the server's namespace
/// dropped at least half as many packets: `syn-drop` / `dropped-by-netfilter`, its line with
/// the count and a fix that says where to look. Controls: too few drops, or a machine-wide
/// count (another namespace's rule as likely): plain `syn-drop`.
#[test]
fn syn_waits_with_the_namespaces_netfilter_drops_are_dropped_by_netfilter() {
    let mk = |nf: u64, scope: &str| {
        let mut l = waiting_connects(64, 20, 1_030_000);
        l.packets.data.as_mut().unwrap().findings =
            vec![finding("syn-retransmit", 20, 64, 1_000_000)];
        l.host = Layer::ran(host_drops(nf, scope, 0));
        judge(&target(), &l)
    };
    let j = mk(22, "namespace");
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{j:#?}");
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::DroppedByNetfilter),
        "{j:#?}"
    );
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("netfilter dropped 22 packets in the server's namespace")),
        "{:#?}",
        j.evidence
    );
    let f = &j.verdict.fix[0];
    assert!(
        f.change.contains("nft list ruleset") && f.change.contains("port 8080"),
        "{f:?}"
    );
    for t in j.evidence.iter().map(|e| &e.text).chain([&f.change]) {
        assert!(!t.contains("  "), "{t:?}");
    }
    for (nf, scope) in [(9, "namespace"), (22, "machine"), (0, "namespace")] {
        let j = mk(nf, scope);
        assert_eq!(j.verdict.cause, Cause::SynDrop, "{nf} {scope}: {j:#?}");
        assert_eq!(j.verdict.mechanism, None, "{nf} {scope}: {j:#?}");
    }
}

/// Netfilter on the server's input drops the clients' segments (325 lost after the capture
/// point): a few segments held on the way out (one probe timer's worth of late responses in
/// the lab that found this) do not turn the verdict into `dropped-before-wire`.
#[test]
fn input_losses_outweighing_a_few_held_segments_are_dropped_by_netfilter() {
    let run = |held: u64, lost: u64| {
        let mut l = layers_held(held);
        let p = l.packets.data.as_mut().unwrap();
        p.findings
            .push(finding("retransmission", 330, 10_000, 200_000));
        p.inbound_lost = Some(InboundLost {
            count: lost,
            of: 330,
            example: None,
        });
        l.host = Layer::ran(host_drops(400, "namespace", 0));
        judge(&target(), &l)
    };
    for held in [0, 3] {
        let j = run(held, 325);
        assert_eq!(j.verdict.cause, Cause::PacketLoss, "{j:#?}");
        assert_eq!(
            j.verdict.mechanism,
            Some(Mechanism::DroppedByNetfilter),
            "held {held}: {j:#?}"
        );
    }
    // The other way round: many held on the way out, a few lost on the way in.
    let j = run(200, 20);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::DroppedBeforeWire),
        "{j:#?}"
    );
}

/// `host_contended` whose receive softirq kept CPU 0 `busiest` of the window busy, 1.8 s on
/// all CPUs (cheap packets, no queue of the server's packets timed).
fn with_softirq(mut h: HostReport, busiest: f64) -> HostReport {
    let rx_us = (busiest * 2_000_000.0) as u64;
    h.softirq = Layer::ran(
        serde_json::from_value(json!({
            "timed": true,
            "cpus": [{"cpu": 0, "rx_us": rx_us, "tx_us": 0, "rx_packets": 900_000,
                      "rx_share": busiest, "backlog_drops": 0, "time_squeeze": 0}],
            "rx_us": rx_us, "tx_us": 0, "rx_packets": 900_000, "rx_ns_per_packet": 2_000,
            "netns_packets": 880_000, "netns_rx_us": rx_us, "netns_ns_per_packet": 2_000,
            "busiest_rx_share": busiest, "backlog_drops": 0, "time_squeeze": 0,
            "ksoftirqd_us": 700_000, "window_us": 2_000_000}))
        .expect("softirq"),
    );
    h
}

/// The server's threads wait for a CPU through the slow requests, and what holds the CPUs is
/// the kernel's receive softirq (a flood's cheap packets), more than any process: the
/// kernel's packet processing, `kernel-stack` / `softirq-saturated`, not `cpu-contention` —
/// even when the server's own packets do not queue (the flood leaves the queue between its
/// bursts). With the softirq not the largest, or its CPU not busy, contention stays.
#[test]
fn run_queue_delay_behind_a_saturated_receive_softirq_is_softirq_saturated() {
    let (starts, busy) = contended_tail();
    // The slow requests' threads waiting 60 ms of each busy 100 ms; the largest other
    // process at `others_ms`, CPU 0 `busiest` of the window in the receive softirq.
    let judged = |others_ms: u64, busiest: f64| {
        let mut l = layers_with_tail(&starts);
        l.host = Layer::ran(with_softirq(
            host_contended(&busy, 60, 300, others_ms),
            busiest,
        ));
        judge(&target(), &l)
    };
    let j = judged(650, 0.9);
    assert_eq!(j.verdict.cause, Cause::KernelStack, "{j:#?}");
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::SoftirqSaturated),
        "{j:#?}"
    );
    assert_eq!(
        j.verdict.fix[0].location.as_deref(),
        Some("CPU 0: /proc/net/softnet_stat, mpstat -P 0 1"),
        "{j:#?}"
    );
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("receive softirq held the CPUs")),
        "{j:#?}"
    );
    assert!(
        j.verdict
            .cost
            .text
            .contains("wait for a CPU the kernel's receive softirq holds"),
        "{j:#?}"
    );
    // A batch job holding more CPU than the softirq: contention.
    let j = judged(2_500, 0.9);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
    // The receive softirq not busy (though more than the batch job's 400 ms): contention.
    let j = judged(400, 0.3);
    assert_eq!(
        j.verdict.mechanism,
        Some(Mechanism::CpuContention),
        "{j:#?}"
    );
}
