//! `lagtrace diagnose` end to end with the per-request join (needs root), on servers and
//! faults lagtrace did not write, while this test keeps the client's host CPU-busy with
//! shell busy loops it starts (bounded: each stops itself after 90 s, and the namespace
//! guard kills it): a Python server slow on every Nth request of a connection is
//! slow-server / every-nth; the same server SIGSTOPped periodically is slow-server /
//! periodic-pause; a healthy server is not blamed for the client's own scheduling (healthy,
//! never `high` over a tail). Three runs each, the same cause every time.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lagtrace_testkit::net::VethNs;
use lagtrace_testkit::pyserver::every_nth;
use serde_json::Value;

mod common;

/// Busy loops on the client's side (this namespace), as many as the machine has CPUs and
/// two more: each stops itself after 90 s.
const BURNERS: usize = 4;
const BURN: &str = "while [ $SECONDS -lt 90 ]; do :; done";

/// A namespace behind a veth with the server started in it and `BURNERS` busy loops here,
/// all owned by the guard; the server's address and pid.
fn lab(tag: &str, every: u32, slow_ms: u32) -> (VethNs, SocketAddr, u32) {
    lab_pinned(tag, every, slow_ms, false)
}

/// [`lab`]; `apart`: the server's threads on CPU 0 and the burners on the others (the
/// diagnosis then runs there too, through [`diagnose_via`]): the client's host busy, not the
/// server's CPU — on two CPUs shared by all, the server's own waits for a CPU behind the
/// burners are real contention, and a verdict may rightly name them.
fn lab_pinned(tag: &str, every: u32, slow_ms: u32, apart: bool) -> (VethNs, SocketAddr, u32) {
    let pid = std::process::id();
    let k = lagtrace_testkit::unique();
    let net = format!("10.{}.{}", 140 + pid % 40, (pid / 40 + k) % 250 + 1);
    let mut g = VethNs::up(tag, &format!("{net}.1/30"), &format!("{net}.2/30"), true);
    let port: u16 = 20_000 + ((pid + k) % 5000) as u16;
    let addr: SocketAddr = format!("{net}.2:{port}").parse().unwrap();
    let spid = every_nth(&mut g, addr, every, slow_ms);
    if apart {
        pin(spid, "0");
    }
    for _ in 0..BURNERS {
        let b = Command::new("bash")
            .args(["-c", BURN])
            .stdout(Stdio::null())
            .spawn()
            .expect("bash");
        if apart {
            pin(b.id(), &client_cpus());
        }
        g.guard.own_child(b);
    }
    (g, addr, spid)
}

/// The CPUs but CPU 0, as a `taskset` list.
fn client_cpus() -> String {
    let n = std::thread::available_parallelism().map_or(2, |n| n.get());
    format!("1-{}", n.max(2) - 1)
}

/// Pins every thread of `pid` (a process this test started) to `cpus`.
fn pin(pid: u32, cpus: &str) {
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "taskset -a -p -c {cpus} {pid}");
}

/// `lagtrace diagnose URL -d 2s -c 4 --json`.
fn diagnose(addr: SocketAddr) -> Value {
    diagnose_via(&[], addr)
}

/// [`diagnose`] run through `via` (`taskset` for [`lab_pinned`]'s `apart`).
fn diagnose_via(via: &[&str], addr: SocketAddr) -> Value {
    common::diagnose_json_via(via, &format!("http://{addr}/"), &["-d", "2s", "-c", "4"]).1
}

fn show(j: &Value) -> String {
    let ev = common::evidence_lines(j);
    let cpu = &j["layers"]["app"]["data"]["cn"]["client_cpu"];
    serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default()
        + "\n"
        + &ev
        + &format!("client_cpu {cpu}\n")
}

/// The c=N run was measured CPU-busy on the client's side, and its records were joined.
fn check_measured(j: &Value) {
    let cn = &j["layers"]["app"]["data"]["cn"];
    let cpu = &cn["client_cpu"];
    assert!(cpu["samples"].as_u64().unwrap_or(0) >= 10, "{}", show(j));
    // The burners and the load: more runnable tasks than CPUs.
    assert!(
        cpu["runnable_p90"].as_u64().unwrap_or(0) > cpu["cpus"].as_u64().unwrap_or(99),
        "{}",
        show(j)
    );
    let joins = &j["layers"]["packets"]["data"]["joins"];
    let recs = cn["records"]["records"].as_array().map_or(0, Vec::len);
    assert_eq!(
        joins[0]["requests"].as_array().map_or(0, Vec::len),
        recs,
        "{}",
        show(j)
    );
    assert!(joins[0]["matched"].as_u64().unwrap_or(0) > 0, "{}", show(j));
}

/// Every 7th request of a connection takes 60 ms: slow-server, every-nth with n = 7.
#[test]
#[ignore = "needs root"]
fn every_nth_request_slow_is_slow_server_every_nth_with_a_busy_client() {
    // One diagnosis at a time across test binaries: two on 2 cores would measure each other.
    let _turn = lagtrace_testkit::measuring();
    let (_g, addr, _) = lab("jnth", 7, 60);
    for run in 0..3 {
        let j = diagnose(addr);
        check_measured(&j);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "slow-server", "run {run}: {}", show(&j));
        assert_eq!(v["mechanism"], "every-nth", "run {run}: {}", show(&j));
        let ev = show(&j);
        // The p99 set is a few of the 1-in-7 slow requests: their indices can line up on a
        // multiple of 7 ("index 6 of every 14"), never on anything else.
        let nth = ev.contains("every 7th request of a connection")
            || (2..=6).any(|m| ev.contains(&format!(" of every {} on a connection", 7 * m)));
        assert!(nth, "{ev}");
        eprintln!(
            "run {run}: {} / {}: {}",
            v["cause"], v["mechanism"], v["tail"]["text"]
        );
    }
}

/// The server process SIGSTOPped 50 ms every 300 ms by this test (a GC, a global lock):
/// slow-server, periodic-pause with the period measured.
#[test]
#[ignore = "needs root"]
fn a_periodically_stopped_server_is_slow_server_periodic_pause_with_a_busy_client() {
    const PERIOD_MS: u64 = 300;
    const STOP_MS: u64 = 50;
    // One diagnosis at a time across test binaries: two on 2 cores would measure each other.
    let _turn = lagtrace_testkit::measuring();
    // The server on a CPU of its own: its stops are the fault, the client's busy CPUs the
    // noise (sharing the CPUs with the burners, the server's p99.9 was its own waits for a
    // CPU after each SIGCONT, and 1 diagnosis in 3 read cpu-contention, also before the
    // deep tail's time share).
    let (_g, addr, pid) = lab_pinned("jpause", 1_000_000_000, 0, true);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let pauser = std::thread::spawn(move || {
        let pid = pid as libc::pid_t;
        while !s2.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(PERIOD_MS - STOP_MS));
            // SAFETY: signalling the server process this test started (owned by its guard).
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(STOP_MS));
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    });
    let client = client_cpus();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(diagnose_via(&["taskset", "-c", &client], addr));
    }
    stop.store(true, Ordering::SeqCst);
    pauser.join().unwrap();
    for (run, j) in seen.iter().enumerate() {
        if let Ok(d) = std::env::var("LAGTRACE_TEST_DUMP") {
            let _ = std::fs::write(format!("{d}/pause{run}.json"), j.to_string());
        }
        check_measured(j);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "slow-server", "run {run}: {}", show(j));
        assert_eq!(v["mechanism"], "periodic-pause", "run {run}: {}", show(j));
        eprintln!(
            "run {run}: {} / {}: {}",
            v["cause"], v["mechanism"], v["tail"]["text"]
        );
    }
}

/// A server with nothing slow, the client's host CPU-busy: never the server's fault, never
/// `healthy, high` over a tail.
#[test]
#[ignore = "needs root"]
fn a_healthy_server_is_not_blamed_for_the_clients_busy_cpu() {
    // One diagnosis at a time across test binaries: two on 2 cores would measure each other.
    let _turn = lagtrace_testkit::measuring();
    let (_g, addr, _) = lab("jbusy", 1_000_000_000, 0);
    for run in 0..3 {
        let j = diagnose(addr);
        check_measured(&j);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "healthy", "run {run}: {}", show(&j));
        if v.get("tail").is_some() {
            assert_eq!(v["confidence"], "medium", "run {run}: {}", show(&j));
        }
        eprintln!(
            "run {run}: {} ({}): {}",
            v["cause"], v["confidence"], v["tail"]["text"]
        );
    }
}
