//! Where a slow server's time goes, on constructed evidence: the host layer's off-CPU split
//! of the requests' server time names the mechanism of `slow-server` (sleep, lock-wait,
//! disk-io, on-cpu) only when one part holds most of it; a server quick alone but queueing
//! under load is `slow-server` when the host timed its threads; nothing changes without the
//! split or when another cause explains the wait.

use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::{Mechanism, judge};
use lagtrace_model::Cause;
use lagtrace_model::host::HostReport;
use lagtrace_testkit::layers::{Synth, finding, options, target};
use serde_json::{Value, json};

/// A host report whose off-CPU split over `requests` requests of `server_us` server time
/// each has `parts` (class, share); `cpu_us` CPU per request.
fn host(requests: u64, server_us: u64, parts: &[(&str, f64)], cpu_us: Option<u64>) -> HostReport {
    let parts: Vec<Value> = parts
        .iter()
        .map(|(c, sh)| {
            json!({"class": c, "us": (server_us as f64 * requests as f64 * sh) as u64,
                   "share": sh, "frames": [format!("{c}_frame")]})
        })
        .collect();
    let mut split = json!({"requests": requests, "attributed": requests,
        "server_us": server_us * requests, "parts": parts});
    if let Some(c) = cpu_us {
        split["cpu_per_request_us"] = json!(c);
    }
    serde_json::from_value(json!({
        "scope": {"pid": 4242, "comm": "python3", "netns_inode": 1},
        "window_us": 3_000_000,
        "counters": {"status": "ok", "data": []},
        "listeners": {"status": "ok", "data": []},
        "cgroup": {"status": "skipped", "reason": "x"},
        "threads": {"status": "skipped", "reason": "x"},
        "qdiscs": {"status": "ok", "data": []},
        "sockstat": {"status": "skipped", "reason": "x"},
        "drops": {"status": "skipped", "reason": "x"},
        "offcpu": {"status": "ok", "data": {"classes": [], "stacks": [], "min_block_us": 50,
            "missed": 0, "during_requests": split}},
        "cost": {"cpu_us": 0, "cpu_share": 0.0}
    }))
    .expect("host report")
}

/// A server that takes ~`own_us` per request itself at c=1 and at c=N (packets' server
/// time `cn_server_us`), with `host`.
fn slow(own_us: u64, cn_server_us: u64, host: HostReport) -> Layers {
    let s = Synth::RULES;
    let mut l = s.healthy_layers();
    let app = l.app.data.as_mut().unwrap();
    app.c1 = Some(s.run(1, own_us + 60, own_us + 500, 1e6 / own_us as f64));
    app.cn = Some(s.run(32, cn_server_us + 100, cn_server_us * 2, 300.0));
    let p = l.packets.data.as_mut().unwrap();
    p.server_time = Some(s.pct(900, cn_server_us, cn_server_us * 2));
    l.host = Layer::ran(host);
    l
}

#[test]
fn a_handler_that_sleeps_is_named_sleep_with_its_stack() {
    let l = slow(
        30_000,
        30_000,
        host(
            900,
            30_000,
            &[("sleep", 0.96), ("run-queue", 0.02)],
            Some(100),
        ),
    );
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::Sleep), "{j:#?}");
    assert!(j.verdict.fix[0].change.contains("sleeps ~"), "{j:#?}");
    assert!(j.verdict.fix[0].change.contains("sleep_frame"), "{j:#?}");
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("96% asleep") && e.text.contains("900 with their")),
        "{j:#?}"
    );
}

#[test]
fn futex_and_disk_waits_name_lock_wait_and_disk_io() {
    for (class, m, words) in [
        ("futex", Mechanism::LockWait, "on a futex"),
        ("disk", Mechanism::DiskIo, "on disk I/O"),
    ] {
        let l = slow(
            20_000,
            150_000,
            host(900, 150_000, &[(class, 0.9), ("sleep", 0.05)], Some(300)),
        );
        let j = judge(&target(), &l);
        assert_eq!(j.verdict.cause, Cause::SlowServer, "{class}: {j:#?}");
        assert_eq!(j.verdict.mechanism, Some(m), "{class}: {j:#?}");
        assert!(j.verdict.fix[0].change.contains(words), "{j:#?}");
    }
}

/// CPU per request at least half the server's own time comes first: a CPU-bound Python
/// server under load queues its threads on the interpreter lock, a futex.
#[test]
fn cpu_per_request_near_the_own_time_is_on_cpu_before_the_waits_it_queues_on() {
    let l = slow(
        20_000,
        600_000,
        host(200, 600_000, &[("futex", 0.9)], Some(22_000)),
    );
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, Some(Mechanism::OnCpu), "{j:#?}");
    assert!(
        j.verdict.fix[0].change.contains("computes ~22.00ms"),
        "{j:#?}"
    );
}

/// No part holds half the server time: the split is evidence, the mechanism stays unnamed.
#[test]
fn a_split_without_a_dominant_part_names_no_mechanism() {
    let l = slow(
        30_000,
        30_000,
        host(
            900,
            30_000,
            &[("sleep", 0.3), ("futex", 0.3), ("disk", 0.2)],
            Some(1_000),
        ),
    );
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e.text.contains("30% asleep")),
        "{j:#?}"
    );
    // Too few requests split: no line at all.
    let l = slow(30_000, 30_000, host(3, 30_000, &[("sleep", 1.0)], None));
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    assert!(
        !j.evidence.iter().any(|e| e.text.contains("asleep")),
        "{j:#?}"
    );
}

/// Quick alone (1 ms at c=1), 200 ms at c=32, the serving thread blocked on disk through
/// it: slow-server (it queues requests itself) with disk-io. Without the host's split, the
/// same packets stay what they were.
#[test]
fn a_server_quick_alone_that_queues_under_load_is_slow_server_with_what_it_waits_for() {
    let l = slow(
        1_000,
        200_000,
        host(100, 200_000, &[("disk", 0.95)], Some(300)),
    );
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::DiskIo), "{j:#?}");
    assert!(
        j.verdict.cost.text.contains("waits ~") && j.verdict.cost.text.contains("behind"),
        "{j:#?}"
    );
    assert!(
        j.verdict
            .fix
            .iter()
            .any(|f| f.change.contains("serves only")),
        "{j:#?}"
    );
    let mut l = slow(
        1_000,
        200_000,
        host(100, 200_000, &[("disk", 0.95)], Some(300)),
    );
    l.host = Layer::skipped("not measured");
    let j = judge(&target(), &l);
    assert_ne!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
}

/// The packets see most responses leave at the 200 ms ceiling, the sockets read all 32
/// uncorked: not a cork. With the host's split the queueing server is named; the cork's
/// rule-out says why.
#[test]
fn responses_at_the_cork_ceiling_on_uncorked_sockets_are_the_servers_own_wait() {
    let mut l = slow(
        1_000,
        200_000,
        host(100, 200_000, &[("disk", 0.95)], Some(300)),
    );
    let p = l.packets.data.as_mut().unwrap();
    p.findings = vec![finding("tcp-cork", 900, 1_000, 199_000)];
    l.sockets.data.as_mut().unwrap().cork = options(0, 4);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("yet TCP_CORK was off on 4/4")),
        "{j:#?}"
    );
    // Corked when read: the cork stands.
    l.sockets.data.as_mut().unwrap().cork = options(3, 1);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::TcpCork, "{j:#?}");
}

/// The same server whose c=1 run caught a few slow reads (~4 ms alone, which dominates its
/// c=1 time), at c=4: the queue under load is the wait, and the cork the packets infer from responses at ~200 ms yields to the split —
/// `disk-io`, not `tcp-cork` (a throttled disk, seen in a suite run).
#[test]
fn a_few_ms_alone_does_not_let_an_inferred_cork_explain_the_queue_away() {
    let mut l = slow(
        4_000,
        200_000,
        host(32, 200_000, &[("disk", 0.82)], Some(357)),
    );
    // Four clients at 20 req/s: four uncorked sockets still leave a 1.3 % chance of a cork.
    l.app.data.as_mut().unwrap().cn = Some(Synth::RULES.run(4, 200_100, 400_000, 20.0));
    let p = l.packets.data.as_mut().unwrap();
    p.findings = vec![finding("tcp-cork", 21, 32, 199_900)];
    l.sockets.data.as_mut().unwrap().cork = options(0, 4);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::DiskIo), "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e.text.contains("look corked")),
        "{j:#?}"
    );
}

/// A hold on a few requests does not explain a server time seen on every one.
#[test]
fn a_cork_on_few_responses_does_not_explain_the_servers_own_time() {
    let mut l = slow(20_000, 300_000, host(200, 300_000, &[], Some(21_000)));
    let p = l.packets.data.as_mut().unwrap();
    p.findings = vec![finding("tcp-cork", 66, 1_000, 212_000)];
    l.sockets = Layer::skipped("not read");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::OnCpu), "{j:#?}");
}

/// A cork inferred from packets alone whose cost outranks the server's own time (10% of
/// responses at ~212 ms against 15 ms on every request) yields once the split shows the
/// serving thread busy through the server time: those responses were written late.
#[test]
fn an_inferred_cork_yields_to_a_thread_busy_through_the_server_time() {
    let mut l = slow(
        15_000,
        120_000,
        host(100, 120_000, &[("futex", 0.8)], Some(15_500)),
    );
    let p = l.packets.data.as_mut().unwrap();
    p.findings = vec![finding("tcp-cork", 100, 1_000, 212_000)];
    l.sockets.data.as_mut().unwrap().cork = options(0, 0);
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::OnCpu), "{j:#?}");
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("look corked") && e.text.contains("(on-cpu)")),
        "{j:#?}"
    );
    // Without the split the cork outranks it, as before.
    l.host = Layer::skipped("not measured");
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::TcpCork, "{j:#?}");
}

/// Quick alone and queueing under load: its 0.7 ms of CPU per request is more than its own
/// time at c=1, but its serving thread waited on the disk: disk-io, never on-cpu. A queueing
/// server whose serving thread was busy on a CPU (nginx copying megabytes to 32 clients at
/// ~0.9 core) is no slow server for the split: only on-CPU stacks could say whether that
/// CPU is the load's own work.
#[test]
fn a_queueing_server_is_named_only_for_what_its_thread_waited_on() {
    let mut l = slow(
        300,
        200_000,
        host(100, 200_000, &[("disk", 0.8)], Some(700)),
    );
    l.app
        .data
        .as_mut()
        .unwrap()
        .cn
        .as_mut()
        .unwrap()
        .requests_per_sec = 21.0;
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.mechanism, Some(Mechanism::DiskIo), "{j:#?}");
    let mut l = slow(
        250,
        11_000,
        host(1_800, 11_000, &[("run-queue", 0.07)], Some(915)),
    );
    l.app
        .data
        .as_mut()
        .unwrap()
        .cn
        .as_mut()
        .unwrap()
        .requests_per_sec = 949.0;
    let j = judge(&target(), &l);
    assert_ne!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
}

/// The serving thread waited mostly for a CPU: no on-cpu (the host rules judge the
/// contention), and a server quick alone is no saturated server for it.
#[test]
fn a_serving_thread_mostly_in_the_run_queue_names_no_server_mechanism() {
    let l = slow(
        20_000,
        60_000,
        host(900, 60_000, &[("run-queue", 0.8)], Some(15_000)),
    );
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    let mut l = slow(
        100,
        40_000,
        host(900, 40_000, &[("run-queue", 0.82)], Some(2_000)),
    );
    l.app
        .data
        .as_mut()
        .unwrap()
        .cn
        .as_mut()
        .unwrap()
        .requests_per_sec = 459.0;
    let j = judge(&target(), &l);
    assert_ne!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
}

/// Sockets read uncorked rule a cork out only when a corked server would rarely read so:
/// responses held 200 ms on a connection that makes one request every 2.5 s are corked 8 %
/// of the time, and four sockets all read uncorked then mean nothing (0.92⁴); nor do two.
#[test]
fn an_uncorked_reading_rules_out_a_cork_only_when_it_would_be_unlikely() {
    let mk = |rps: f64, read: u32| {
        let mut l = slow(
            1_000,
            200_000,
            host(100, 200_000, &[("disk", 0.95)], Some(300)),
        );
        let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
        cn.concurrency = 4;
        cn.requests_per_sec = rps;
        let p = l.packets.data.as_mut().unwrap();
        p.findings = vec![finding("tcp-cork", 900, 1_000, 200_000)];
        l.sockets.data.as_mut().unwrap().cork = options(0, read);
        judge(&target(), &l)
    };
    let ruled_out = |j: &lagtrace_diagnose::Judgement| {
        j.evidence
            .iter()
            .any(|e| e.text.contains("yet TCP_CORK was off"))
    };
    // 4 connections at 20 req/s: 200 ms per request each, corked 90 % of the time.
    assert!(ruled_out(&mk(20.0, 4)));
    assert!(!ruled_out(&mk(1.6, 4)));
    assert!(!ruled_out(&mk(20.0, 2)));
}

/// The serving thread waited in epoll through most of the server time and one command's
/// processes woke it out of those waits (php-fpm's workers answering on a Unix socket, seen
/// by `sched:sched_waking`): the verdict names that process as where the time goes —
/// `verdict.hop` ends there and the fix is on its side. Woken by lagtrace itself (its
/// requests arrive on those sockets), by the server's own processes, by an unnamed waker
/// (an interrupt's), or for less than two thirds of the wait: no hop.
#[test]
fn a_server_waiting_on_a_process_that_wakes_it_names_that_process() {
    use lagtrace_model::host::WokenBy;
    let with = |wakers: Vec<WokenBy>| {
        let mut h = host(
            900,
            30_000,
            &[("poll", 0.95), ("run-queue", 0.02)],
            Some(300),
        );
        let s = h
            .offcpu
            .data
            .as_mut()
            .and_then(|o| o.during_requests.as_mut())
            .expect("a split");
        s.parts[0].woken_by = wakers;
        judge(&target(), &slow(30_000, 30_000, h))
    };
    let poll_us = (30_000f64 * 900.0 * 0.95) as u64;
    let by = |comm: &str, pid: u32, us: u64, processes: u32| WokenBy {
        pid,
        comm: comm.into(),
        us,
        processes,
    };
    // Another program with the server's name (the server's own processes are left out
    // where the wake-ups are counted) is named all the same.
    let j = with(vec![by("nginx", 4300, poll_us, 1)]);
    let hop = j.verdict.hop.as_ref().expect("a hop");
    assert_eq!(
        (hop.chain[2].name.as_str(), hop.chain[2].pid),
        ("nginx", Some(4300))
    );
    let j = with(vec![by("php-fpm8.2", 77, poll_us * 9 / 10, 4)]);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    let hop = j.verdict.hop.as_ref().expect("a hop");
    assert_eq!(hop.at, 2, "{hop:?}");
    assert_eq!(hop.chain[2].name, "php-fpm8.2");
    assert_eq!(hop.chain[2].pid, Some(77));
    assert_eq!(hop.chain[1].name, "nginx");
    let fix = &j.verdict.fix[0];
    assert!(
        fix.location
            .as_deref()
            .is_some_and(|l| l.starts_with("php-fpm8.2 (pid 77)")),
        "{fix:?}"
    );
    assert!(fix.change.contains("for php-fpm8.2 to answer"), "{fix:?}");
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("php-fpm8.2 (pid 77, one of 4 with that name) woke it")),
        "{j:#?}"
    );
    for wakers in [
        vec![by("lagtrace", 5, poll_us, 1)],
        vec![by("nginx", 4242, poll_us, 1)],
        vec![by("", 9, poll_us, 3)],
        vec![by("php-fpm8.2", 77, poll_us / 2, 4)],
    ] {
        let j = with(wakers.clone());
        assert_eq!(j.verdict.cause, Cause::SlowServer, "{wakers:?}: {j:#?}");
        assert!(j.verdict.hop.is_none(), "{wakers:?}: {j:#?}");
    }
}

/// The serving thread waits in epoll for most of the server time, no process of this host
/// woke it, and the server holds connections to an upstream on another host whose packets
/// were not captured: `upstream-wait`, at that upstream. Without such a hop (or with one on
/// this host) the wait is said, never named: an event loop's timer reads the same.
#[test]
fn a_poll_wait_no_local_process_ends_with_a_remote_upstream_is_upstream_wait() {
    use lagtrace_model::diagnosis::evidence::{HopEvidence, ServerProcess};
    let upstream = |peer: &str, to: Option<ServerProcess>| HopEvidence {
        depth: 1,
        via: None,
        from: ServerProcess {
            pid: 4243,
            comm: "python3".into(),
            netns: String::new(),
        },
        peer: peer.into(),
        to,
        service: None,
        connections: 8,
        packets: Layer::error("capture: no such device"),
        sockets: Layer::skipped("the peer is not on this host"),
        listener: None,
        join: None,
    };
    let layers = |hops: Vec<HopEvidence>| {
        let mut l = slow(
            30_000,
            30_000,
            host(
                900,
                30_000,
                &[("poll", 0.9), ("run-queue", 0.02)],
                Some(300),
            ),
        );
        l.hops = hops;
        l
    };
    let j = judge(&target(), &layers(vec![upstream("10.9.0.2:5432", None)]));
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::UpstreamWait), "{j:#?}");
    let hop = j.verdict.hop.as_ref().expect("a hop");
    assert_eq!(hop.chain[hop.at].addr.as_deref(), Some("10.9.0.2:5432"));
    assert!(
        j.verdict.fix[0].change.contains("lagtrace agent"),
        "{:?}",
        j.verdict.fix
    );
    let local = ServerProcess {
        pid: 77,
        comm: "postgres".into(),
        netns: String::new(),
    };
    for hops in [vec![], vec![upstream("127.0.0.1:5432", Some(local))]] {
        let j = judge(&target(), &layers(hops));
        assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
        assert_eq!(j.verdict.mechanism, None, "{j:#?}");
    }
}

/// A profile's module: (file, share of the samples, its hottest function).
type Module<'a> = (&'a str, f64, Option<&'a str>);

/// `host` with an on-CPU profile of `samples` at 199 Hz whose self time is in `modules`
/// (module, share, hottest function).
fn with_profile(mut h: HostReport, samples: u64, modules: &[Module<'_>]) -> HostReport {
    let ms: Vec<Value> = modules
        .iter()
        .map(
            |(m, sh, _)| json!({"module": m, "samples": (samples as f64 * sh) as u64, "share": sh}),
        )
        .collect();
    let fs: Vec<Value> = modules
        .iter()
        .map(|(m, sh, f)| {
            let mut v = json!({"module": m, "samples": (samples as f64 * sh) as u64, "share": sh});
            if let Some(f) = f {
                v["function"] = json!(f);
            }
            v
        })
        .collect();
    h.oncpu = serde_json::from_value(json!({"status": "ok", "data": {
        "hz": 199, "cpus": 2, "samples": samples, "modules": ms, "functions": fs,
        "folded": [], "folded_left_out": 0, "user_depth": 1, "missed": 0}}))
    .expect("profile");
    h
}

/// nginx quick alone (0.9 ms) that queues under load (17 ms at c=32) with a worker on a
/// CPU the whole window, most of it in libcrypto: a full TLS handshake per connection is
/// work a setting removes — on-cpu, the fix in nginx's terms.
#[test]
fn a_server_queueing_on_tls_handshakes_is_on_cpu_with_the_session_cache_fix() {
    let h = host(1_800, 17_000, &[("run-queue", 0.05)], Some(1_100));
    let h = with_profile(
        h,
        900,
        &[
            ("libcrypto.so.3", 0.62, None),
            ("[kernel]", 0.2, Some("copy_user_enhanced_fast_string")),
            ("nginx", 0.1, Some("ngx_http_parse_request_line")),
        ],
    );
    let mut l = slow(900, 17_000, h);
    l.app
        .data
        .as_mut()
        .unwrap()
        .cn
        .as_mut()
        .unwrap()
        .requests_per_sec = 1_700.0;
    let j = judge(&target(), &l);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::OnCpu), "{j:#?}");
    let fix = &j.verdict.fix[0].change;
    assert!(
        fix.contains("ssl_session_cache") && fix.contains("62%"),
        "{fix}"
    );
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("libcrypto.so.3 62%")),
        "{j:#?}"
    );
}

/// The same queue with the worker's samples in the kernel copying responses: the work the
/// load asks for — no server verdict (the profile names no avoidable work).
#[test]
fn a_server_queueing_on_copying_bytes_is_not_named_by_its_profile() {
    let h = host(1_800, 11_000, &[("run-queue", 0.07)], Some(915));
    let h = with_profile(
        h,
        900,
        &[
            ("[kernel]", 0.7, Some("copy_user_enhanced_fast_string")),
            ("nginx", 0.2, Some("ngx_http_write_filter")),
            ("libz.so.1", 0.05, None),
        ],
    );
    let mut l = slow(250, 11_000, h);
    l.app
        .data
        .as_mut()
        .unwrap()
        .cn
        .as_mut()
        .unwrap()
        .requests_per_sec = 949.0;
    let j = judge(&target(), &l);
    assert_ne!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
}

/// A server slow alone on a CPU: the fix names the hottest function, or the library and
/// how to get its symbols when it is stripped, or the flag an interpreter needs.
#[test]
fn an_on_cpu_fix_names_the_hot_function_or_what_would_name_it() {
    let cases: [(&[Module<'_>], &str); 3] = [
        (
            &[
                ("app", 0.7, Some("render_template")),
                ("[kernel]", 0.2, None),
            ],
            "render_template (app)",
        ),
        (
            &[("libfoo.so.1", 0.7, None), ("[kernel]", 0.2, None)],
            "libfoo.so.1, which has no symbol",
        ),
        (
            &[("libz.so.1", 0.8, None), ("[kernel]", 0.1, None)],
            "gzip_comp_level",
        ),
    ];
    for (modules, words) in cases {
        let h = with_profile(
            host(200, 600_000, &[("futex", 0.9)], Some(22_000)),
            2_000,
            modules,
        );
        let l = slow(20_000, 600_000, h);
        let j = judge(&target(), &l);
        assert_eq!(j.verdict.mechanism, Some(Mechanism::OnCpu), "{j:#?}");
        assert!(j.verdict.fix[0].change.contains(words), "{words}: {j:#?}");
    }
}

/// A disk wait names the device, and the cgroup limit that paced it when the server's
/// cgroup sets one on a device that did I/O in the window; a limit on an idle device is
/// not blamed.
#[test]
fn a_disk_wait_names_the_device_and_the_limit_that_paced_it() {
    let disks = |limit_dev: &str| {
        serde_json::from_value(json!({"status": "ok", "data": {
            "devices": [
                {"device": "loop3", "dev": "7:3", "reads": 40, "writes": 0,
                 "read_us": 4000, "write_us": 0, "busy_us": 4000},
                {"device": "nvme0n1", "dev": "259:0", "reads": 0, "writes": 2,
                 "read_us": 0, "write_us": 5000, "busy_us": 3000}],
            "limits": [{"dev": limit_dev, "limit": "read-iops", "value": 20,
                        "file": "/sys/fs/cgroup/blkio/x/blkio.throttle.read_iops_device"}]}}))
        .expect("disks")
    };
    let fix = |limit_dev: &str| {
        let mut h = host(100, 200_000, &[("disk", 0.9)], Some(300));
        h.disks = disks(limit_dev);
        let j = judge(&target(), &slow(20_000, 200_000, h));
        assert_eq!(j.verdict.mechanism, Some(Mechanism::DiskIo), "{j:#?}");
        j.verdict.fix[0].change.clone()
    };
    let f = fix("7:3");
    assert!(
        f.contains("limits its reads on loop3 (7:3) to 20 reads/s")
            && f.contains("blkio.throttle.read_iops_device")
            && f.contains("~100µs per read"),
        "{f}"
    );
    // The limit is on a device that did no I/O: the busiest device, no limit blamed.
    let f = fix("8:0");
    assert!(
        f.contains("most I/O over the window was loop3 (7:3: 40 reads") && !f.contains("limits"),
        "{f}"
    );
}

/// The slowest requests' split, when the host timed it apart, is said beside the whole
/// one: a tail that waits on the disk while the median request does not.
#[test]
fn the_slowest_requests_split_is_evidence_beside_the_whole() {
    let mut h = host(900, 30_000, &[("sleep", 0.96)], Some(100));
    let off = h.offcpu.data.as_mut().unwrap();
    off.during_slowest = Some(
        serde_json::from_value(json!({"percentile": 99.0, "from_us": 61_000, "split": {
            "requests": 9, "attributed": 9, "server_us": 600_000,
            "parts": [{"class": "disk", "us": 480_000, "share": 0.8,
                       "frames": ["io_schedule"]}]}}))
        .expect("slowest"),
    );
    let j = judge(&target(), &slow(30_000, 30_000, h));
    assert_eq!(j.verdict.mechanism, Some(Mechanism::Sleep), "{j:#?}");
    assert!(
        j.evidence.iter().any(|e| e
            .text
            .contains("in its slowest 9 requests (server time 61.00ms or more, the p99), 80%")),
        "{j:#?}"
    );
}

/// A server quick alone (0.9 ms) whose clients wait ~19 ms at c=32 in connection setup —
/// the packets' server time (request to response) stays ~1 ms — with its samples in
/// libcrypto and a new connection for each request: it queues TLS handshakes, on-cpu with
/// the session-cache fix. The same profile where the requests share kept-alive connections
/// is the bulk cipher the load asks for: not named.
#[test]
fn a_server_queueing_connections_on_tls_handshakes_is_on_cpu() {
    let judge_with = |attempts: u64| {
        let h = with_profile(
            host(2_000, 1_000, &[("run-queue", 0.05)], Some(600)),
            900,
            &[("libcrypto.so.3", 0.75, None), ("[kernel]", 0.16, None)],
        );
        let mut l = slow(900, 1_000, h);
        let cn = l.app.data.as_mut().unwrap().cn.as_mut().unwrap();
        cn.latency.p50_us = 19_000;
        cn.requests_per_sec = 1_600.0;
        cn.connects = Some(lagtrace_model::diagnosis::evidence::ConnectStats {
            attempts,
            ..Default::default()
        });
        let requests = cn.requests;
        (judge(&target(), &l), requests)
    };
    let (j, requests) = judge_with(0);
    assert_ne!(
        j.verdict.cause,
        Cause::SlowServer,
        "no connects counted: {j:#?}"
    );
    let (j, _) = judge_with(requests);
    assert_eq!(j.verdict.cause, Cause::SlowServer, "{j:#?}");
    assert_eq!(j.verdict.mechanism, Some(Mechanism::OnCpu), "{j:#?}");
    assert!(
        j.verdict.fix[0].change.contains("ssl_session_cache"),
        "{j:#?}"
    );
    assert!(
        j.evidence
            .iter()
            .any(|e| e.text.contains("the wait in connection setup")),
        "{j:#?}"
    );
    let (j, _) = judge_with(requests / 100);
    assert_ne!(j.verdict.cause, Cause::SlowServer, "kept-alive: {j:#?}");
}
