//! Lab acceptance tests on real traffic (need root: namespaces, veth, nginx).

use std::time::Duration;

use lagtrace_lab::probe_client::{get_sequence, millis};
use lagtrace_lab::{Lab, LabOptions, ServerKind, netns_name};

const N: usize = 12;
const TIMEOUT: Duration = Duration::from_secs(5);

fn name(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// Medians are robust to one slow request on a loaded machine; the stall floor is each
/// request after the first.
fn after_first(ms: &[f64]) -> (f64, f64) {
    let rest = &ms[1..];
    let min = rest.iter().copied().fold(f64::INFINITY, f64::min);
    let mut s = rest.to_vec();
    s.sort_by(f64::total_cmp);
    (min, s[s.len() / 2])
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
fn nginx_latency_server_stalls_and_fix_flips_it() {
    let lab = Lab::up(&LabOptions::new(&name("nginx-stall"))).expect("lab up");
    let page = nginx_page();
    let good = get_sequence(lab.good_addr(), N, TIMEOUT).expect("good server");
    let slow = get_sequence(lab.latency_addr(), N, TIMEOUT).expect("latency server");
    for r in good.iter().chain(&slow) {
        assert_eq!(r.status, 200);
        assert_eq!(r.body, page, "both servers serve the stock nginx page");
    }
    let (gmin, gmed) = after_first(&millis(&good));
    let (smin, smed) = after_first(&millis(&slow));
    eprintln!("good {:?}\nlatency {:?}", millis(&good), millis(&slow));
    assert!(
        gmed < 5.0,
        "good server median {gmed:.2} ms (min {gmin:.2})"
    );
    assert!(
        smin >= 30.0,
        "latency server: every request after the first >= 30 ms, min {smin:.2} ms (median {smed:.2})"
    );

    lab.fix().expect("fix");
    let fixed = millis(&get_sequence(lab.latency_addr(), N, TIMEOUT).expect("fixed server"));
    let (_, fmed) = after_first(&fixed);
    eprintln!("fixed {fixed:?}");
    assert!(fmed < 5.0, "after fix: median {fmed:.2} ms");

    lab.unfix().expect("unfix");
    let again = millis(&get_sequence(lab.latency_addr(), N, TIMEOUT).expect("unfixed server"));
    let (amin, _) = after_first(&again);
    eprintln!("unfixed {again:?}");
    assert!(amin >= 30.0, "after unfix: min {amin:.2} ms");

    let st = lab.state();
    let pids: Vec<u32> = st.servers.iter().filter_map(|s| s.pid).collect();
    drop(lab);
    assert_gone(&st.name, &st.client_iface, &pids);
    // Idempotent.
    Lab::down(&st.name).expect("second down");
}

#[test]
fn builtin_in_process_stalls_with_nagle_and_split_writes() {
    let lab =
        Lab::up(&LabOptions::new(&name("builtin")).server(ServerKind::Builtin)).expect("lab up");
    let good = millis(&get_sequence(lab.good_addr(), N, TIMEOUT).expect("good"));
    let slow = millis(&get_sequence(lab.latency_addr(), N, TIMEOUT).expect("latency"));
    eprintln!("builtin good {good:?}\nbuiltin latency {slow:?}");
    assert!(after_first(&good).1 < 5.0, "nodelay on: {good:?}");
    assert!(
        after_first(&slow).0 >= 30.0,
        "nodelay off + split writes: {slow:?}"
    );
    assert_eq!(lab.inproc_requests("latency"), Some(N as u64));
    lab.fix().expect("fix");
    let fixed = millis(&get_sequence(lab.latency_addr(), N, TIMEOUT).expect("fixed"));
    assert!(after_first(&fixed).1 < 5.0, "fixed: {fixed:?}");
}

#[test]
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
