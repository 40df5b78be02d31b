//! The request ⋈ packets join on real traffic (needs root): a Python server in a namespace
//! made here, slow on every Nth request of a connection, loaded through a veth with
//! per-request records while tcpdump captures the client side. Every request is matched to
//! its transaction, the clock offset comes out near zero (the same machine) although the
//! join does not assume it, and the slow requests' wait is server time — the same server
//! time tshark's `http.time` measures for the same responses; the tail split names server
//! time, on every Nth request of a connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use lagtrace_diagnose::join::tail::{Component, split};
use lagtrace_diagnose::join::{Join, join};
use lagtrace_load::{LoadOptions, RecordOptions};
use lagtrace_model::RequestRecords;
use lagtrace_packet::{AnalyzeOptions, analyze_file};
use lagtrace_testkit::net::VethNs;
use lagtrace_testkit::pyserver::every_nth;
use lagtrace_testkit::tcpdump::{stop_tcpdump, tcpdump_on};
use lagtrace_testkit::tshark_fields_first;

/// One load at a time: two on 2 cores would measure each other.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A namespace behind a veth, the server started in it (owned by the guard); its pid.
fn lab(every: u32, slow_ms: u32) -> (VethNs, SocketAddr, u32) {
    let pid = std::process::id();
    let net = format!("10.{}.{}", 180 + pid % 40, (pid / 40) % 250 + 1);
    let mut g = VethNs::up("join", &format!("{net}.1/30"), &format!("{net}.2/30"), true);
    let port: u16 = 20_000 + (pid % 5000) as u16;
    let addr: SocketAddr = format!("{net}.2:{port}").parse().unwrap();
    let pid = every_nth(&mut g, addr, every, slow_ms);
    (g, addr, pid)
}

/// A load of `c` connections for `ms` with records, captured on the host's veth: the
/// records, the capture's analysis with timings, and their join.
fn load_and_join(g: &VethNs, addr: SocketAddr, c: usize, ms: u64) -> (RequestRecords, Join) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("join.pcap");
    let td = tcpdump_on(None, &g.veth, &file, addr.port());
    let mut o = LoadOptions::new(&format!("http://{addr}/"));
    o.connections = c;
    o.threads = 2;
    o.duration = Some(Duration::from_millis(ms));
    o.records = Some(RecordOptions::default());
    let report = lagtrace_load::run(&o, None, &AtomicBool::new(false)).expect("load runs");
    std::thread::sleep(Duration::from_millis(300));
    stop_tcpdump(td);
    let recs = report.records.expect("records");
    let opts = AnalyzeOptions {
        timings: true,
        ..AnalyzeOptions::default()
    };
    let an = analyze_file(&file, &opts).unwrap();
    let j = join(&recs, an.first_ts_ns, &an.timings);
    (recs, j)
}

#[test]
#[ignore = "needs root"]
fn every_request_joins_its_packets_and_the_slow_ones_are_server_time() {
    const EVERY: u32 = 7;
    const SLOW_MS: u32 = 30;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (g, addr, _) = lab(EVERY, SLOW_MS);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("join.pcap");
    let td = tcpdump_on(None, &g.veth, &file, addr.port());
    let mut o = LoadOptions::new(&format!("http://{addr}/"));
    o.connections = 4;
    o.threads = 2;
    o.duration = Some(Duration::from_millis(1500));
    o.records = Some(RecordOptions::default());
    let report = lagtrace_load::run(&o, None, &AtomicBool::new(false)).expect("load runs");
    std::thread::sleep(Duration::from_millis(300));
    stop_tcpdump(td);
    let recs = report.records.expect("records");
    assert!(report.requests > 100, "{} requests", report.requests);
    assert_eq!(
        recs.seen,
        recs.records.len() as u64,
        "all kept at this size"
    );

    let an = analyze_file(
        &file,
        &AnalyzeOptions {
            timings: true,
            ..AnalyzeOptions::default()
        },
    )
    .unwrap();
    let j = join(&recs, an.first_ts_ns, &an.timings);

    // Every completed request matched; the offset is bounded and near zero on one machine.
    let done: Vec<usize> = (0..recs.records.len())
        .filter(|&k| recs.records[k].last_byte_us.is_some())
        .collect();
    let unmatched = done
        .iter()
        .filter(|&&k| j.requests[k].timing.is_none())
        .count();
    assert_eq!(unmatched, 0, "of {}", done.len());
    let off = j.offset.expect("an offset");
    assert!(off.consistent, "{off:?}");
    assert!(off.theta_us.abs() < 2_000, "{off:?}");
    assert!(off.uncertainty_us < 1_000, "{off:?}");

    // tshark's http.time of each response, by client port, in order on the connection.
    let rows = tshark_fields_first(&file, Some("http.response"), &["tcp.dstport", "http.time"]);
    let mut by_port: HashMap<u16, Vec<f64>> = HashMap::new();
    for r in &rows {
        by_port
            .entry(r[0].parse().unwrap())
            .or_default()
            .push(r[1].parse().unwrap());
    }
    let slow_us = u64::from(SLOW_MS) * 1000;
    let mut slow = 0;
    for &k in &done {
        let r = &recs.records[k];
        let p = j.requests[k].parts;
        let is_slow = (r.index + 1).is_multiple_of(EVERY);
        if is_slow {
            slow += 1;
            assert!(p.server_us >= slow_us, "{r:?} {p:?}");
            // Most of the wait (the client's own scheduling on a busy machine adds to the
            // transfer, up to a few ms).
            assert!(p.server_us * 10 >= r.wait_us * 7, "{r:?} {p:?}");
        } else {
            assert!(p.server_us < slow_us, "{r:?} {p:?}");
        }
        assert!(
            p.unexplained_us.unsigned_abs() * 10 < r.wait_us.max(10_000),
            "{r:?} {p:?}"
        );
        let port = r.local.unwrap().port();
        let ts = by_port[&port][r.index as usize];
        let diff = (ts * 1e6 - p.server_us as f64).abs();
        assert!(diff <= 2.0, "tshark http.time {ts} vs {p:?} for {r:?}");
    }
    eprintln!(
        "{} requests, {} matched, offset {off:?}, {slow} slow",
        done.len(),
        j.matched
    );
    assert!(slow >= 10, "{slow} slow requests");

    // The tail: server time, on every EVERY-th request of a connection; no pause.
    let t = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).expect("a split");
    eprintln!("{t:?}");
    assert_eq!(t.parts[0].component, Component::Server, "{t:?}");
    assert!(t.parts[0].share > 0.9, "{t:?}");
    assert!(t.excess_us >= slow_us * 9 / 10, "{t:?}");
    let e = t.every_nth.expect("every-nth");
    assert_eq!((e.n, e.residue), (EVERY, EVERY - 1), "{e:?}");
    assert!(t.pause.is_none(), "{t:?}");
}

/// The server process stopped (SIGSTOP) for `STOP_MS` every `PERIOD_MS` by this test, as a
/// GC or a global lock would: the tail is server time in process-wide pauses, on that
/// period, released on every connection at once; not every-nth.
#[test]
#[ignore = "needs root"]
fn a_server_stopped_periodically_is_server_time_in_periodic_pauses() {
    const PERIOD_MS: u64 = 250;
    const STOP_MS: u64 = 40;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (g, addr, pid) = lab(1_000_000_000, 0);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let pauser = std::thread::spawn(move || {
        let pid = pid as libc::pid_t;
        while !s2.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(PERIOD_MS - STOP_MS));
            // SAFETY: signalling the server process this test started (owned by its guard).
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(STOP_MS));
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    });
    let (recs, j) = load_and_join(&g, addr, 6, 2_000);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    pauser.join().unwrap();
    let t = split(&recs.records, &j.parts(), &j.seen(), 99.0, None).expect("a split");
    eprintln!("{t:?}");
    // At the p99 the pause's requests (one per connection per pause, ~0.2 % here) share the
    // tail with the loaded machine's scheduling of the client; server time still names it.
    assert_eq!(t.parts[0].component, Component::Server, "{t:?}");
    assert!(t.parts[0].share >= 0.5, "{t:?}");
    assert!(t.every_nth.is_none(), "{t:?}");
    let p = t.pause.expect("a pause");
    let period = PERIOD_MS as i64 * 1000;
    assert!((p.period_us as i64 - period).abs() <= period / 10, "{p:?}");
    assert!(p.connections >= 3, "{p:?}");
}
