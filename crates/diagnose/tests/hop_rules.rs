//! The hop rule on constructed evidence: a cause on the hop behind the server becomes the
//! verdict, with `verdict.hop`, only when the server's own packets leave its time unexplained.

use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::{FixSide, judge};
use lagtrace_model::Cause;
use lagtrace_model::diagnosis::evidence::{HopEvidence, HopJoin, ServerProcess};
use lagtrace_testkit::layers::{Synth, finding, options};

fn pct(count: u64, p50: u64, p99: u64) -> Percentiles {
    Synth::RULES.pct(count, p50, p99)
}

fn proc(pid: u32, comm: &str) -> ServerProcess {
    ServerProcess {
        pid,
        comm: comm.into(),
        netns: "lt-x".into(),
    }
}

/// Every request waits ~44 ms in the server (nginx, TCP_NODELAY on); the packets to the
/// client show no stall, only server time.
fn front_slow() -> Layers {
    let mut l = Synth::RULES.healthy_layers();
    let mut c1 = Synth::RULES.run(1, 44_000, 48_000, 22.0);
    c1.first_request = Some(pct(1, 4_000, 4_000));
    c1.later_requests = Some(pct(100, 44_000, 48_000));
    l.app = Layer::ran(AppEvidence {
        c1: Some(c1),
        cn: Some(Synth::RULES.run(32, 44_000, 49_000, 700.0)),
    });
    let p = l.packets.data.as_mut().unwrap();
    p.transactions = 3_000;
    p.server_time = Some(pct(3_000, 43_900, 48_000));
    p.findings = vec![finding("slow-server", 2_900, 3_000, 43_900)];
    let s = l.sockets.data.as_mut().unwrap();
    s.server = Some(proc(100, "nginx"));
    s.nodelay = options(32, 0);
    l
}

/// nginx (pid 101) → python3 (pid 200) at 127.0.0.1:9000: `findings` in the hop's packets,
/// the backend's sockets with TCP_NODELAY off.
fn hop(findings: Vec<FindingSummary>) -> HopEvidence {
    let mut packets = Synth::RULES.healthy_layers().packets;
    let p = packets.data.as_mut().unwrap();
    p.transactions = 3_000;
    p.server_time = Some(pct(3_000, 300, 1_000));
    p.findings = findings;
    let mut sockets = Synth::RULES.healthy_layers().sockets;
    let s = sockets.data.as_mut().unwrap();
    s.server = Some(proc(200, "python3"));
    s.nodelay = options(0, 8);
    s.config.clear();
    HopEvidence {
        depth: 1,
        via: None,
        from: proc(101, "nginx"),
        peer: "127.0.0.1:9000".into(),
        to: Some(proc(200, "python3")),
        service: None,
        connections: 32,
        packets,
        sockets,
        listener: None,
        join: None,
    }
}

/// The verdict's server-side fix names `at` (the hop's process and address).
fn assert_server_fix_at(j: &lagtrace_diagnose::Judgement, at: &str) {
    let fix = j
        .verdict
        .fix
        .iter()
        .find(|f| f.side == FixSide::Server)
        .unwrap_or_else(|| panic!("no server-side fix: {:?}", j.verdict.fix));
    assert!(
        fix.location.as_deref().is_some_and(|l| l.contains(at)),
        "{fix:?}"
    );
}

#[test]
fn nagle_on_the_hop_is_the_verdict_at_the_hop() {
    let mut l = front_slow();
    assert_eq!(
        judge(&lagtrace_testkit::layers::target(), &l).verdict.cause,
        Cause::SlowServer
    );
    l.hops = vec![hop(vec![finding(
        "nagle-delayed-ack",
        2_900,
        3_000,
        43_500,
    )])];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck, "{:#?}", j.evidence);
    let h = j.verdict.hop.as_ref().expect("hop");
    assert_eq!(h.at, 2);
    assert_eq!(h.chain[2].pid, Some(200));
    assert_eq!(h.chain[1].pid, Some(101));
    assert!(h.text.starts_with("client → nginx (pid 101)"), "{}", h.text);
    assert_server_fix_at(&j, "python3 (pid 200) 127.0.0.1:9000");
    // Client-side fixes on the hop are the connecting process's, not lagtrace's.
    for f in j.verdict.fix.iter().filter(|f| f.side == FixSide::Client) {
        assert!(
            f.location
                .as_deref()
                .unwrap()
                .starts_with("nginx (pid 101)"),
            "{f:?}"
        );
    }
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.starts_with("hop 127.0.0.1:9000: "))
    );
}

/// With the hop's exchanges matched to the requests that caused them, the server's own time
/// is the p50 of each request's own (its server time less its wait on the hop), not the
/// difference of two p50s, and the evidence says how many were matched.
#[test]
fn the_servers_own_time_comes_from_the_per_request_join_when_there_is_one() {
    let mut l = front_slow();
    let mut h = hop(vec![finding("nagle-delayed-ack", 2_900, 3_000, 43_500)]);
    h.packets.data.as_mut().unwrap().exchange_time = Some(pct(3_000, 43_000, 47_000));
    l.hops = vec![h.clone()];
    let before = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(
        before.verdict.hop.as_ref().unwrap().server_own_us,
        Some(900)
    );
    h.join = Some(HopJoin {
        exchanges: 3_000,
        joined: 2_990,
        downstream: 2_990,
        wait: Some(pct(2_990, 43_600, 47_500)),
        own: Some(pct(2_990, 180, 700)),
    });
    l.hops = vec![h];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck);
    assert_eq!(j.verdict.hop.as_ref().unwrap().server_own_us, Some(180));
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("2990 of the hop's 3000 exchanges matched")),
        "{:#?}",
        j.evidence
    );
}

#[test]
fn a_hop_without_a_cause_in_its_packets_leaves_the_verdict_at_the_server() {
    let mut l = front_slow();
    l.hops = vec![hop(vec![])];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer);
    assert!(j.verdict.hop.is_none());
}

#[test]
fn a_cause_the_servers_own_packets_show_stays_the_servers() {
    // The server's own Nagle (its packets show the stalls) is named there, whatever a hop shows.
    let mut l = front_slow();
    let p = l.packets.data.as_mut().unwrap();
    p.server_time = Some(pct(3_000, 150, 2_000));
    p.findings = vec![finding("nagle-delayed-ack", 2_900, 3_000, 40_800)];
    l.sockets.data.as_mut().unwrap().nodelay = options(0, 32);
    l.hops = vec![hop(vec![finding(
        "nagle-delayed-ack",
        2_900,
        3_000,
        43_500,
    )])];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck);
    assert!(j.verdict.hop.is_none(), "{:?}", j.verdict.hop);
}

#[test]
fn a_hop_whose_cause_is_fixed_at_the_connecting_server_leaves_the_verdict_at_the_server() {
    // The server reads its upstream's responses too slowly (its own CPU is busy): the hop
    // shows its receive window full, which is the server's own time, not the backend's.
    let mut l = front_slow();
    let mut h = hop(vec![
        finding("window-full", 2_900, 3_000, 43_500),
        finding("zero-window", 2_900, 3_000, 43_500),
    ]);
    h.sockets.data.as_mut().unwrap().nodelay = options(8, 0);
    l.hops = vec![h];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_ne!(j.verdict.cause, Cause::ReceiveWindow, "{:#?}", j.verdict);
    assert!(j.verdict.hop.is_none(), "{:?}", j.verdict.hop);
}

/// Two hops: nginx (pid 101) → nginx (pid 200) at 127.0.0.1:9000, whose worker (pid 201)
/// → python3 (pid 300) at 127.0.0.1:9001. The first hop shows only the second nginx's
/// time (slow-server); the second shows Nagle. The verdict is at the last hop, with the
/// whole way in the chain; with the second hop healthy, it stays slow-server at the first.
#[test]
fn a_cause_two_hops_behind_is_named_at_the_last_hop() {
    let mut middle = hop(vec![finding("slow-server", 2_900, 3_000, 43_700)]);
    middle.to = Some(proc(200, "nginx"));
    middle.packets.data.as_mut().unwrap().server_time = Some(pct(3_000, 43_700, 48_000));
    middle.sockets.data.as_mut().unwrap().server = Some(proc(200, "nginx"));
    middle.sockets.data.as_mut().unwrap().nodelay = options(8, 0);
    let mut last = hop(vec![finding("nagle-delayed-ack", 2_900, 3_000, 43_500)]);
    last.depth = 2;
    last.via = Some("127.0.0.1:9000".into());
    last.from = proc(201, "nginx");
    last.peer = "127.0.0.1:9001".into();
    last.to = Some(proc(300, "python3"));
    last.sockets.data.as_mut().unwrap().server = Some(proc(300, "python3"));

    let mut l = front_slow();
    l.hops = vec![middle.clone(), last.clone()];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::NagleDelayedAck, "{:#?}", j.evidence);
    let h = j.verdict.hop.as_ref().expect("hop");
    assert_eq!(h.chain.len(), 4, "{}", h.text);
    assert_eq!(h.at, 3);
    let pids: Vec<_> = h.chain.iter().map(|n| n.pid).collect();
    assert_eq!(pids, [None, Some(101), Some(200), Some(300)]);
    assert!(
        h.text
            .ends_with("→ nginx (pid 200) 127.0.0.1:9000 → python3 (pid 300) 127.0.0.1:9001"),
        "{}",
        h.text
    );
    assert_server_fix_at(&j, "python3 (pid 300) 127.0.0.1:9001");

    // The last hop healthy: the middle nginx's own time is the verdict, at the middle.
    last.packets.data.as_mut().unwrap().findings.clear();
    l.hops = vec![middle, last];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{:#?}", j.evidence);
    let h = j.verdict.hop.as_ref().expect("hop");
    assert_eq!((h.chain.len(), h.at), (3, 2), "{}", h.text);
    assert_eq!(h.chain[2].pid, Some(200));
}

/// Evidence whose hops point at each other (a corrupt or hand-made file) ends: the walk
/// goes one depth at a time.
#[test]
fn hops_that_point_at_each_other_end() {
    let mut a = hop(vec![finding("slow-server", 2_900, 3_000, 43_700)]);
    a.packets.data.as_mut().unwrap().server_time = Some(pct(3_000, 43_700, 48_000));
    let mut b = a.clone();
    b.depth = 2;
    b.via = Some(a.peer.clone());
    b.peer = "127.0.0.1:9001".into();
    a.via = Some(b.peer.clone());
    let mut l = front_slow();
    l.hops = vec![a, b];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer);
}

/// The peer's listener at 127.0.0.1:9000 (backlog 5) with its own drop count over the run.
fn listener(drops: u64) -> lagtrace_model::host::ListenerQueue {
    lagtrace_model::host::ListenerQueue {
        local: "127.0.0.1:9000".into(),
        inode: 7,
        owners: vec!["200/python3".into()],
        max: 5,
        current: 0,
        peak: 6,
        samples: 40,
        full_samples: 3,
        drops: Some(drops),
        half_open_peak: None,
        half_open_sources: None,
    }
}

/// A proxy opening a connection per request to a backend whose accept queue overflows: the
/// hop's SYNs and SYN-ACKs are resent and some first requests too (the handshake's last ACK
/// dropped with the queue full). With the peer's listener counting at least half as many
/// drops, that is `syn-drop` / `accept-queue-overflow` at the hop, the backlog and the
/// proxy's connection reuse in the fix; with a drop or two beside 60 resends (a lossy
/// path), it is not the listener's.
#[test]
fn a_hop_whose_peer_listener_overflows_is_syn_drop_at_the_hop() {
    let resends = || {
        vec![
            finding("syn-retransmit", 40, 40, 1_000_000),
            finding("retransmission", 20, 20, 200_000),
        ]
    };
    let mut l = front_slow();
    let mut h = hop(resends());
    h.connections = 900;
    h.listener = Some(listener(55));
    l.hops = vec![h];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::SynDrop, "{:#?}", j.evidence);
    assert_eq!(
        j.verdict.mechanism,
        Some(lagtrace_diagnose::Mechanism::AcceptQueueOverflow),
        "{:#?}",
        j.verdict
    );
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("dropped 55 connection attempts")),
        "{:#?}",
        j.evidence
    );
    let changes: Vec<&str> = j.verdict.fix.iter().map(|f| f.change.as_str()).collect();
    assert!(changes[0].contains("keepalive"), "{changes:?}");
    assert!(
        changes.iter().any(|c| c.contains("listen backlog")),
        "{changes:?}"
    );
    assert_eq!(j.verdict.hop.as_ref().expect("hop").chain[2].pid, Some(200));

    let mut l = front_slow();
    let mut h = hop(resends());
    h.listener = Some(listener(2));
    l.hops = vec![h];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_ne!(
        j.verdict.mechanism,
        Some(lagtrace_diagnose::Mechanism::AcceptQueueOverflow),
        "{:#?}",
        j.verdict
    );
}

/// nginx (pid 101) → 10.9.0.2:9000, an upstream on another host (no process here listens
/// there, so its sockets could not be read) that takes ~43 ms per request: `slow-server`
/// at the remote hop with mechanism `upstream-wait`, its fix pointing at an agent there —
/// never "profile the handler" as if lagtrace had looked inside it. The same slow upstream
/// on this host is `slow-server` at its process, with no such mechanism.
#[test]
fn a_slow_upstream_on_another_host_is_upstream_wait_at_that_hop() {
    let slow_hop = || {
        let mut h = hop(vec![finding("slow-server", 2_900, 3_000, 43_700)]);
        h.packets.data.as_mut().unwrap().server_time = Some(pct(3_000, 43_700, 48_000));
        h
    };
    let mut remote = slow_hop();
    remote.peer = "10.9.0.2:9000".into();
    remote.to = None;
    remote.sockets = Layer::skipped("the peer is not on this host");
    // Every request waits for the upstream, a connection's first one too (no Nagle shape).
    let front = || {
        let mut l = front_slow();
        let c1 = l.app.data.as_mut().unwrap().c1.as_mut().unwrap();
        c1.first_request = Some(pct(1, 44_000, 44_000));
        l
    };
    let mut l = front();
    l.hops = vec![remote];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{:#?}", j.evidence);
    assert_eq!(
        j.verdict.mechanism,
        Some(lagtrace_diagnose::Mechanism::UpstreamWait),
        "{:#?}",
        j.verdict
    );
    let h = j.verdict.hop.as_ref().expect("hop");
    assert_eq!(
        (h.at, h.chain[2].name.as_str()),
        (2, "remote"),
        "{}",
        h.text
    );
    let fix = &j.verdict.fix[0];
    assert_eq!(fix.location.as_deref(), Some("remote 10.9.0.2:9000"));
    assert!(
        fix.change.contains("nginx (pid 101) waits ~43.70ms")
            && fix.change.contains("lagtrace agent"),
        "{fix:?}"
    );
    assert!(
        !j.verdict
            .fix
            .iter()
            .any(|f| f.change.contains("profile the handler")),
        "{:?}",
        j.verdict.fix
    );

    let mut local = slow_hop();
    local.sockets.data.as_mut().unwrap().nodelay = options(8, 0);
    let mut l = front();
    l.hops = vec![local];
    let j = judge(&lagtrace_testkit::layers::target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{:#?}", j.evidence);
    assert_eq!(j.verdict.mechanism, None, "{:#?}", j.verdict);
    assert_eq!(j.verdict.hop.as_ref().expect("hop").chain[2].pid, Some(200));
}
