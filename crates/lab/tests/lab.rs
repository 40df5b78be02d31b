//! Lab acceptance tests on real traffic (need root: namespaces, veth, nginx).

use std::time::Duration;

use lagtrace_lab::probe_client::{
    Response, fast, get_sequence, millis, no_stall, sample_until, stalls,
};
use lagtrace_lab::{Lab, LabOptions, ServerKind, netns_name};

const N: usize = 12;
const TIMEOUT: Duration = Duration::from_secs(5);

fn name(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// The stall floor (the client's delayed ACK is >= 40 ms) and the fast ceiling.
const STALL_MS: f64 = 30.0;
const FAST_MS: f64 = 5.0;
/// Samples per measurement: one sample can be disturbed by a loaded machine.
const ATTEMPTS: usize = 3;

fn slow_sample(addr: std::net::SocketAddr) -> Vec<Response> {
    sample_until(addr, N, TIMEOUT, ATTEMPTS, |r| stalls(r, STALL_MS)).expect("requests")
}

/// Median under 5 ms and not one request near the stall.
fn is_fast(r: &[Response]) -> bool {
    fast(r, FAST_MS) && no_stall(r, STALL_MS)
}

fn fast_sample(addr: std::net::SocketAddr) -> Vec<Response> {
    sample_until(addr, N, TIMEOUT, ATTEMPTS, is_fast).expect("requests")
}

fn assert_gone(lab_name: &str, iface: &str, pids: &[u32]) {
    let ns = netns_name(lab_name);
    assert!(
        !std::path::Path::new("/run/netns").join(&ns).exists(),
        "namespace {ns} remains"
    );
    assert!(
        !std::path::Path::new("/sys/class/net").join(iface).exists(),
        "veth {iface} remains"
    );
    for p in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists() || is_zombie(*p),
            "process {p} remains"
        );
    }
    assert!(
        !lagtrace_lab::state_dir(lab_name).exists(),
        "state dir remains"
    );
}

fn is_zombie(p: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{p}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn nginx_page() -> Vec<u8> {
    std::fs::read("/usr/share/nginx/html/index.html").expect("Debian nginx page")
}

#[test]
#[ignore = "needs root"]
fn nginx_latency_server_stalls_and_fix_flips_it() {
    let lab = Lab::up(&LabOptions::new(&name("nginx-stall"))).expect("lab up");
    let page = nginx_page();
    let good = fast_sample(lab.good_addr());
    let slow = slow_sample(lab.latency_addr());
    for r in good.iter().chain(&slow) {
        assert_eq!(r.status, 200);
        assert_eq!(r.body, page, "both servers serve the stock nginx page");
    }
    eprintln!("good {:?}\nlatency {:?}", millis(&good), millis(&slow));
    assert!(is_fast(&good), "good server: {:?}", millis(&good));
    assert!(
        stalls(&slow, STALL_MS),
        "latency server: every request after the first >= 30 ms: {:?}",
        millis(&slow)
    );

    // The fix is exactly the line diagnose's fix names, and nothing else (issue 34: the
    // latency config was replaced by the good server's, with no tcp_nodelay line at all).
    let config = lab
        .state()
        .servers
        .iter()
        .find(|s| s.role == "latency")
        .and_then(|s| s.config.clone())
        .expect("the latency nginx's config");
    let before = std::fs::read_to_string(&config).expect("config");
    let edit = lab.fix().expect("fix").expect("nginx has a config to edit");
    let after = std::fs::read_to_string(&config).expect("config");
    let changed: Vec<(&str, &str)> = before
        .lines()
        .zip(after.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(
        changed,
        [("    tcp_nodelay off;", "    tcp_nodelay on;")],
        "before:\n{before}\nafter:\n{after}"
    );
    assert_eq!(before.lines().count(), after.lines().count());
    assert_eq!(
        edit.describe(),
        format!(
            "{}:{}: `tcp_nodelay off;` → `tcp_nodelay on;`",
            config.display(),
            edit.line
        )
    );
    let fixed = fast_sample(lab.latency_addr());
    eprintln!("fixed {:?}", millis(&fixed));
    assert!(is_fast(&fixed), "after fix: {:?}", millis(&fixed));

    lab.unfix().expect("unfix");
    assert_eq!(std::fs::read_to_string(&config).expect("config"), before);
    let again = slow_sample(lab.latency_addr());
    eprintln!("unfixed {:?}", millis(&again));
    assert!(
        stalls(&again, STALL_MS),
        "after unfix: {:?}",
        millis(&again)
    );

    // The latency server has one worker (worker_processes 1), a child of its master.
    let workers = lab.server_pids("latency");
    assert_eq!(workers.len(), 1, "{workers:?}");
    let stat = std::fs::read_to_string(format!("/proc/{}/cmdline", workers[0])).expect("worker");
    assert!(stat.contains("worker process"), "{stat}");

    let st = lab.state();
    let pids: Vec<u32> = st
        .servers
        .iter()
        .filter_map(|s| s.pid)
        .chain(workers)
        .collect();
    drop(lab);
    assert_gone(&st.name, &st.client_iface, &pids);
    // Idempotent.
    Lab::down(&st.name).expect("second down");
}

#[test]
#[ignore = "needs root"]
fn builtin_in_process_stalls_with_nagle_and_split_writes() {
    let lab =
        Lab::up(&LabOptions::new(&name("builtin")).server(ServerKind::Builtin)).expect("lab up");
    let before = lab
        .inproc_requests("latency")
        .expect("in-process latency server");
    let good = fast_sample(lab.good_addr());
    let first = get_sequence(lab.latency_addr(), N, TIMEOUT).expect("latency");
    // The in-process handle counts what the server answered.
    assert_eq!(lab.inproc_requests("latency"), Some(before + N as u64));
    let slow = if stalls(&first, STALL_MS) {
        first
    } else {
        slow_sample(lab.latency_addr())
    };
    eprintln!(
        "builtin good {:?}\nbuiltin latency {:?}",
        millis(&good),
        millis(&slow)
    );
    assert!(is_fast(&good), "nodelay on: {:?}", millis(&good));
    assert!(
        stalls(&slow, STALL_MS),
        "nodelay off + split writes: {:?}",
        millis(&slow)
    );
    lab.fix().expect("fix");
    let fixed = fast_sample(lab.latency_addr());
    assert!(is_fast(&fixed), "fixed: {:?}", millis(&fixed));
}

#[test]
#[ignore = "needs root"]
fn teardown_after_panic_leaves_nothing() {
    let n = name("panic");
    let mut seen = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lab = Lab::up(&LabOptions::new(&n)).expect("lab up");
        let st = lab.state();
        seen = Some((
            st.client_iface.clone(),
            st.servers.iter().filter_map(|s| s.pid).collect::<Vec<_>>(),
        ));
        assert!(
            std::path::Path::new("/run/netns")
                .join(netns_name(&n))
                .exists()
        );
        panic!("mid-test panic");
    }));
    assert!(r.is_err());
    let (iface, pids) = seen.expect("lab came up");
    assert!(!pids.is_empty());
    assert_gone(&n, &iface, &pids);
}

#[test]
#[ignore = "needs root"]
fn two_labs_side_by_side() {
    let a = Lab::up(&LabOptions::new(&name("side-a"))).expect("lab a");
    let b = Lab::up(&LabOptions::new(&name("side-b"))).expect("lab b");
    assert_ne!(a.server_addr(), b.server_addr());
    assert_ne!(a.client_iface(), b.client_iface());
    for lab in [&a, &b] {
        let r = get_sequence(lab.good_addr(), 2, TIMEOUT).expect("good");
        assert!(r.iter().all(|r| r.status == 200));
    }
    let dup = Lab::up(&LabOptions::new(a.name())).expect_err("same name twice");
    assert!(format!("{dup:#}").contains("already up"), "{dup:#}");
}

#[test]
fn bad_names_are_refused() {
    for bad in [
        "",
        "has space",
        "x/../y",
        "waaaaaaaaaaaaaaaaaaaaaaaaay-too-long",
    ] {
        let e = Lab::up(&LabOptions::new(bad)).expect_err(bad);
        assert!(format!("{e:#}").contains("lab name"), "{e:#}");
    }
}

#[test]
#[ignore = "needs root"]
fn missing_nginx_falls_back_to_the_builtin_server() {
    let opts = LabOptions::new(&name("no-nginx")).nginx(std::path::Path::new("/nonexistent/nginx"));
    let lab = Lab::up(&opts).expect("lab up without nginx");
    assert!(
        lab.notes().iter().any(|n| n.contains("nginx not found")),
        "{:?}",
        lab.notes()
    );
    let st = lab.state();
    assert!(st.servers.iter().all(|s| s.kind != "nginx"), "{st:?}");
    let slow = slow_sample(lab.latency_addr());
    assert!(
        stalls(&slow, STALL_MS),
        "the fallback reproduces the stall: {:?}",
        millis(&slow)
    );
}

#[test]
#[ignore = "needs root"]
fn nginx_failing_to_start_reports_its_error_log_and_cleans_up() {
    // Real nginx, made to fail by an unknown directive on its command line.
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = dir.path().join("nginx");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nexec /usr/sbin/nginx -g 'no_such_directive on;' \"$@\"\n",
    )
    .expect("write");
    let mut perm = std::fs::metadata(&wrapper).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&wrapper, perm).expect("chmod");
    let n = name("nginx-fails");
    let err = Lab::up(&LabOptions::new(&n).nginx(&wrapper)).expect_err("nginx must fail");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("failed to start") && msg.contains("no_such_directive"),
        "{msg}"
    );
    assert!(
        !std::path::Path::new("/run/netns")
            .join(netns_name(&n))
            .exists(),
        "namespace left after a failed up"
    );
    assert!(!lagtrace_lab::state_dir(&n).exists());
}

#[test]
#[ignore = "needs root"]
fn down_finds_the_servers_even_when_the_namespace_name_was_removed() {
    let lab = Lab::up(&LabOptions::new(&name("ns-gone"))).expect("lab up");
    let st = lab.state();
    let pids: Vec<u32> = st.servers.iter().filter_map(|s| s.pid).collect();
    assert_eq!(pids.len(), 2);
    // Someone runs `ip netns del` behind the lab's back: nginx keeps the namespace alive.
    let ok = std::process::Command::new("ip")
        .args(["netns", "del", &st.netns])
        .status()
        .expect("ip");
    assert!(ok.success());
    assert!(pids.iter().all(|&p| !is_zombie(p)), "nginx still runs");
    drop(lab);
    assert_gone(&st.name, &st.client_iface, &pids);
}
