//! Issue 34 item 8: the client-side fix of a Nagle verdict, "quick ACKs on the client's route
//! to the server", is a command to paste, built from the route `ip route get` showed where
//! the load ran — not a placeholder. Each test runs the command exactly as printed (through
//! `sh -c`, as a paste would), checks the route now carries `quickack 1`, and removes the
//! route with a guard, also when the test fails (needs root).

mod common;

use std::process::{Command, Output, Stdio};

use lagtrace_lab::{Lab, LabOptions};
use serde_json::Value;

use common::{BIN, Foreground};

/// Deletes the host route `dst` (in namespace `ns`, else here) when dropped.
struct RouteGuard {
    dst: String,
    ns: Option<String>,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let mut c = Command::new("ip");
        if let Some(ns) = &self.ns {
            c.args(["-n", ns]);
        }
        let _ = c
            .args(["route", "del", &self.dst])
            .stderr(Stdio::null())
            .status();
    }
}

/// `ip [-n NS] ARGS`'s stdout (panics with its stderr when it fails).
fn ip(ns: Option<&str>, args: &[&str]) -> String {
    let mut c = Command::new("ip");
    if let Some(ns) = ns {
        c.args(["-n", ns]);
    }
    let out = c.args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The verdict's fix on the client host's route: its `change`.
fn route_fix(j: &Value) -> String {
    j["verdict"]["fix"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| {
            f["location"]
                .as_str()
                .is_some_and(|l| l.starts_with("the client host's route to"))
        })
        .and_then(|f| f["change"].as_str())
        .unwrap_or_else(|| panic!("no route fix: {:#}", j["verdict"]))
        .to_string()
}

/// Runs `cmd` as pasted into a shell (in namespace `ns`, else here).
fn paste(ns: Option<&str>, cmd: &str) -> Output {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "sh", "-c", cmd]);
            c
        }
        None => {
            let mut c = Command::new("sh");
            c.args(["-c", cmd]);
            c
        }
    };
    c.output().expect("sh")
}

fn check_pasted(ns: Option<&str>, cmd: &str) {
    // Twice: `replace` makes it safe to run again.
    for run in 1..=2 {
        let o = paste(ns, cmd);
        assert!(
            o.status.success(),
            "run {run}: `{cmd}` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
#[ignore = "needs root"]
fn the_route_fix_against_the_lab_nagle_nginx_is_a_command_that_sets_quickack() {
    let lab = Lab::up(&LabOptions::new(&format!("dgqa{}", std::process::id()))).expect("lab up");
    let server = lab.server_addr().to_string();
    let dst = format!("{server}/32");
    assert!(!ip(None, &["route", "get", &server]).contains("quickack"));
    let (code, j, err) = common::diagnose_json(&lab.latency_url(), &["-d", "3s"]);
    assert_eq!(
        j["verdict"]["cause"], "nagle-delayed-ack",
        "exit {code}: {err}\n{:#}",
        j["verdict"]
    );
    assert_eq!(
        j["layers"]["path"]["data"]["route"]["dev"],
        lab.client_iface()
    );
    let cmd = route_fix(&j);
    eprintln!("route fix: {cmd}");
    // The lab's server is on the veth's link: no gateway.
    assert_eq!(
        cmd,
        format!(
            "ip route replace {dst} dev {} src {} quickack 1",
            lab.client_iface(),
            lab.client_addr()
        )
    );
    let _route = RouteGuard {
        dst: dst.clone(),
        ns: None,
    };
    check_pasted(None, &cmd);
    let got = ip(None, &["route", "get", &server]);
    let shown = ip(None, &["route", "show", &dst]);
    eprintln!("ip route get {server}: {got}ip route show {dst}: {shown}");
    assert!(got.contains("quickack 1"), "{got}");
    assert!(shown.contains("quickack 1"), "{shown}");
    // The fix does what it says: with the client's quick ACKs, no response waits for a
    // delayed ACK any more.
    let (code, j, err) = common::diagnose_json(&lab.latency_url(), &["-d", "3s"]);
    eprintln!(
        "after the fix: {} (c=1 p50 {} µs)",
        j["verdict"]["cause"], j["layers"]["app"]["data"]["c1"]["latency"]["p50_us"]
    );
    assert_ne!(
        j["verdict"]["cause"], "nagle-delayed-ack",
        "exit {code}: {err}\n{:#}",
        j["verdict"]
    );
}

/// Through two routers over IPv6: the printed command keeps the gateway and uses `ip -6` and
/// a /128 host route (run in the client's namespace, where the load ran).
#[test]
#[ignore = "needs root"]
fn the_route_fix_two_routers_away_over_ipv6_keeps_the_gateway() {
    let chain = lagtrace_testkit::chain::Chain::up("dgqa6");
    let server = chain.addr6(2, 2).to_string();
    let listen = format!("[{server}]:8080");
    let _server = Foreground(
        Command::new("ip")
            .args(["netns", "exec", chain.server_ns(), BIN, "serve"])
            .args(["--listen", &listen, "--nodelay", "off", "--split-writes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve"),
    );
    chain.wait_reachable_from_client(&server, 8080);
    let client_ns = Some(chain.client_ns());
    let (code, j, err) = common::diagnose_json_via(
        &["ip", "netns", "exec", chain.client_ns()],
        &format!("http://{listen}/"),
        &["-d", "3s"],
    );
    assert_eq!(
        j["verdict"]["cause"], "nagle-delayed-ack",
        "exit {code}: {err}\n{:#}",
        j["verdict"]
    );
    let cmd = route_fix(&j);
    eprintln!("route fix: {cmd}");
    let dst = format!("{server}/128");
    assert_eq!(
        cmd,
        format!(
            "ip -6 route replace {dst} via {} dev v0l src {} quickack 1",
            chain.addr6(0, 2),
            chain.addr6(0, 1)
        )
    );
    let _route = RouteGuard {
        dst: dst.clone(),
        ns: client_ns.map(str::to_string),
    };
    check_pasted(client_ns, &cmd);
    let shown = ip(client_ns, &["-6", "route", "show", &dst]);
    let got = ip(client_ns, &["-6", "route", "get", &server]);
    eprintln!("ip -6 route show {dst}: {shown}ip -6 route get {server}: {got}");
    assert!(shown.contains("quickack 1"), "{shown}");
    assert!(got.contains(&format!("via {}", chain.addr6(0, 2))), "{got}");
}
