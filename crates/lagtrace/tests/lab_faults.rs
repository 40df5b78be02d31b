//! The lab's fault knobs that `diagnose` tests use: an extra `lagtrace serve` process in the
//! namespace, tbf shaping, and nftables drops. Need root.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lagtrace_lab::probe_client::{after_first_ms, get_sequence, millis};
use lagtrace_lab::serve::ServeOptions;
use lagtrace_lab::{Lab, LabOptions, ServerKind};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");
const TIMEOUT: Duration = Duration::from_secs(10);

fn name(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

fn in_ns(lab: &Lab, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &lab.state().netns])
        .args(args)
        .output()
        .expect("ip netns exec");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// TCP RetransSegs of the lab namespace (/proc/net/snmp read from inside it).
fn retrans_segs(lab: &Lab) -> u64 {
    let snmp = in_ns(lab, &["cat", "/proc/net/snmp"]);
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (
        tcp.next().expect("Tcp header"),
        tcp.next().expect("Tcp values"),
    );
    let i = names
        .split_whitespace()
        .position(|w| w == "RetransSegs")
        .expect("RetransSegs");
    values
        .split_whitespace()
        .nth(i)
        .expect("value")
        .parse()
        .expect("number")
}

#[test]
#[ignore = "needs root"]
fn start_builtin_runs_an_extra_server_killed_by_teardown() {
    let lab = Lab::up(&LabOptions::new(&name("extra")).server(ServerKind::Builtin)).expect("lab");
    let opts = ServeOptions {
        think: Duration::from_millis(60),
        body_size: 2000,
        ..ServeOptions::default()
    };
    let pid = lab
        .start_builtin(Path::new(BIN), 9000, &opts)
        .expect("start_builtin");
    assert!(running(pid));
    let r = get_sequence(SocketAddr::from((lab.server_addr(), 9000)), 4, TIMEOUT)
        .expect("extra server");
    for x in &r {
        assert_eq!(x.status, 200);
        assert_eq!(x.body.len(), 2000);
        assert!(x.elapsed >= Duration::from_millis(60), "{:?}", x.elapsed);
    }
    drop(lab);
    assert!(!running(pid), "extra server {pid} survived teardown");
}

#[test]
#[ignore = "needs root"]
fn shape_limits_server_to_client_rate() {
    let lab = Lab::up(&LabOptions::new(&name("shape")).server(ServerKind::Builtin)).expect("lab");
    let opts = ServeOptions {
        body_size: 200_000,
        ..ServeOptions::default()
    };
    lab.start_builtin(Path::new(BIN), 9001, &opts)
        .expect("server");
    let addr = SocketAddr::from((lab.server_addr(), 9001));
    let free_r = get_sequence(addr, 5, TIMEOUT).expect("unshaped");
    let free = millis(&free_r);
    // 8 Mbit/s: 200 kB take >= 200 ms (minus the 16 kB burst).
    lab.shape(8_000_000, 16_000, 400_000).expect("shape");
    let shaped = millis(&get_sequence(addr, 3, TIMEOUT).expect("shaped"));
    let qdisc = in_ns(
        &lab,
        &["tc", "-s", "qdisc", "show", "dev", lab.server_iface()],
    );
    eprintln!("unshaped {free:?}\nshaped {shaped:?}\n{qdisc}");
    assert!(qdisc.contains("tbf"), "{qdisc}");
    for ms in &shaped {
        assert!(*ms >= 150.0, "shaped transfer took {ms:.1} ms: {shaped:?}");
    }
    assert!(after_first_ms(&free_r).1 < 50.0, "unshaped: {free:?}");
    lab.unshape().expect("unshape");
    let again_r = get_sequence(addr, 5, TIMEOUT).expect("unshaped again");
    let again = millis(&again_r);
    assert!(
        after_first_ms(&again_r).1 < 50.0,
        "after unshape: {again:?}"
    );
}

#[test]
#[ignore = "needs root"]
fn drop_percent_drops_and_tcp_retransmits() {
    let lab = Lab::up(&LabOptions::new(&name("drop")).server(ServerKind::Builtin)).expect("lab");
    let before = retrans_segs(&lab);
    lab.drop_percent(15).expect("drop");
    // Drops are measurements: the requests still complete, through retransmissions. 60
    // requests make a sample without a dropped data segment unlikely (0.85^61 ~ 5e-5),
    // and the 60 s bound leaves room for a few exponential backoffs in a row.
    let r = get_sequence(lab.good_addr(), 60, Duration::from_secs(60)).expect("requests");
    assert!(r.iter().all(|x| x.status == 200));
    let table_name = lagtrace_lab::drop_table(lab.name());
    let table = String::from_utf8_lossy(
        &Command::new("nft")
            .args(["list", "table", "netdev", &table_name])
            .output()
            .expect("nft")
            .stdout,
    )
    .into_owned();
    let dropped: u64 = table
        .split("counter packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("nft counter");
    let retrans = retrans_segs(&lab) - before;
    eprintln!("nft dropped {dropped} packets; the server retransmitted {retrans} segments");
    assert!(dropped >= 1, "{table}");
    // Every dropped server->client segment is one the server sends again.
    assert!(retrans >= 1, "no retransmissions for {dropped} drops");
    lab.drop_percent(0).expect("undrop");
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    assert!(!String::from_utf8_lossy(&tables.stdout).contains(&table_name));
    // Teardown removes the table too.
    lab.drop_percent(10).expect("drop again");
    drop(lab);
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    assert!(!String::from_utf8_lossy(&tables.stdout).contains(&table_name));
}

/// wrk's "50%" latency in ms from `--latency` output.
fn wrk_p50_ms(out: &str) -> f64 {
    let v = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("50%"))
        .unwrap_or_else(|| panic!("no 50% line in wrk output:\n{out}"))
        .trim();
    let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).expect("unit"));
    let n: f64 = num.parse().expect("number");
    match unit {
        "us" => n / 1e3,
        "ms" => n,
        "s" => n * 1e3,
        u => panic!("unit {u}"),
    }
}

fn wrk(url: &str) -> f64 {
    let out = Command::new("wrk")
        .args(["-t1", "-c1", "-d1s", "--latency", url])
        .output()
        .expect("wrk is installed");
    wrk_p50_ms(&String::from_utf8_lossy(&out.stdout))
}

#[test]
#[ignore = "needs root"]
fn wrk_sees_the_same_stall_as_the_probe_client() {
    let lab = Lab::up(&LabOptions::new(&name("wrk"))).expect("lab");
    let wrk_slow = wrk(&lab.latency_url());
    let wrk_good = wrk(&lab.good_url());
    let ours = get_sequence(lab.latency_addr(), 12, TIMEOUT).expect("probe");
    let mut ours_ms = millis(&ours[1..]);
    ours_ms.sort_by(f64::total_cmp);
    let ours_p50 = ours_ms[ours_ms.len() / 2];
    eprintln!(
        "wrk p50: latency {wrk_slow:.2} ms, good {wrk_good:.2} ms; probe client p50 {ours_p50:.2} ms"
    );
    assert!(wrk_slow >= 30.0, "wrk on :8080: p50 {wrk_slow} ms");
    assert!(wrk_good < 5.0, "wrk on :80: p50 {wrk_good} ms");
    assert!(
        (ours_p50 - wrk_slow).abs() < 10.0,
        "probe client p50 {ours_p50:.2} ms vs wrk {wrk_slow:.2} ms"
    );
}

#[test]
#[ignore = "needs root"]
fn serve_netns_flag_listens_inside_the_lab() {
    let lab =
        Lab::up(&LabOptions::new(&name("serve-ns")).server(ServerKind::Builtin)).expect("lab");
    let listen = SocketAddr::from((lab.server_addr(), 9100));
    /// Kills the serve process on drop: it runs in this namespace (only its socket is in
    /// the lab's), so the lab's teardown would not find it.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Command::new(BIN)
        .args([
            "serve",
            "--netns",
            &lab.state().netns,
            "--listen",
            &listen.to_string(),
        ])
        .args(["--nodelay", "off", "--split-writes"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve");
    let _kill = Kill(child);
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "serve --netns never answered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = lagtrace_lab::probe_client::sample_until(listen, 8, TIMEOUT, 3, |r| {
        lagtrace_lab::probe_client::stalls(r, 30.0)
    })
    .expect("requests");
    assert!(
        lagtrace_lab::probe_client::stalls(&r, 30.0),
        "{:?}",
        millis(&r)
    );
}

#[test]
fn lab_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Lab>();
}
