//! `lagtrace lab`, `serve` and `demo` as a user runs them (need root for the lab).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lagtrace_lab::probe_client::{get_sequence, millis};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");
const N: usize = 10;
const TIMEOUT: Duration = Duration::from_secs(5);

fn name(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

fn lagtrace(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run lagtrace");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `lab down` on drop so a failing test leaves nothing behind.
struct Down(String);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["lab", "down", "--name", &self.0])
            .output();
    }
}

/// Kills a `lagtrace serve` child on drop.
struct Serve(Child, SocketAddr);
impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(args: &[&str]) -> Serve {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().expect("stderr"))
        .read_line(&mut line)
        .expect("first log line");
    // "lagtrace serve: listening on 127.0.0.1:PORT (pid ..."
    let addr = line
        .split_whitespace()
        .nth(4)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    Serve(child, addr)
}

/// Whether a process still runs. An exited process whose parent (init, after the lab's
/// daemons were reparented) has not reaped it yet is a zombie: it counts as gone.
fn running(pid: impl std::fmt::Display) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

/// (min, median) of the requests after the first (the first has the client in quick-ACK
/// mode and never stalls).
fn after_first(ms: &[f64]) -> (f64, f64) {
    let mut s = ms[1..].to_vec();
    s.sort_by(f64::total_cmp);
    (s[0], s[s.len() / 2])
}

#[test]
fn serve_nagle_split_writes_stalls_nodelay_does_not() {
    let slow = serve(&["--nodelay", "off", "--split-writes"]);
    let fast = serve(&["--nodelay", "on", "--split-writes"]);
    let s = millis(&get_sequence(slow.1, N, TIMEOUT).expect("slow serve"));
    let f = millis(&get_sequence(fast.1, N, TIMEOUT).expect("fast serve"));
    eprintln!("serve nodelay off: {s:?}\nserve nodelay on: {f:?}");
    assert!(
        after_first(&s).0 >= 30.0,
        "nodelay off + split writes should stall: {s:?}"
    );
    assert!(after_first(&f).1 < 5.0, "nodelay on should not: {f:?}");
}

#[test]
fn serve_options_shape_the_response() {
    let s = serve(&["--body-size", "1234", "--think", "50"]);
    let r = get_sequence(s.1, 3, TIMEOUT).expect("serve");
    for x in &r {
        assert_eq!(x.status, 200);
        assert_eq!(x.body.len(), 1234);
        assert!(
            x.elapsed >= Duration::from_millis(50),
            "think time: {:?}",
            x.elapsed
        );
    }
    // Connection: close is honoured: the server closes after the response.
    let mut c = TcpStream::connect(s.1).expect("connect");
    c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut all = Vec::new();
    c.read_to_end(&mut all).expect("server closes");
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("Connection: close"));
    // Garbage gets a 400 and a closed connection.
    let mut g = TcpStream::connect(s.1).expect("connect");
    g.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    g.write_all(b"\x00\x01 not http at all\r\n\r\n")
        .expect("write");
    let mut all = Vec::new();
    g.read_to_end(&mut all).expect("server closes");
    assert!(
        String::from_utf8_lossy(&all).starts_with("HTTP/1.1 400"),
        "{all:?}"
    );
}

#[test]
fn serve_bad_flags_are_one_line_errors() {
    for args in [
        &["serve", "--nodelay", "maybe"][..],
        &["serve", "--listen", "nonsense"],
        &["serve", "--netns", "no-such-ns-lagtrace"],
    ] {
        let (code, _, err) = lagtrace(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn lab_cli_up_fix_unfix_down() {
    let n = name("cli-nginx");
    let _guard = Down(n.clone());
    let (code, out, err) = lagtrace(&["lab", "up", "--name", &n, "--json"]);
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out).expect("json");
    let server: std::net::Ipv4Addr = st["server_addr"]
        .as_str()
        .expect("addr")
        .parse()
        .expect("ip");
    let iface = st["client_iface"].as_str().expect("iface").to_string();
    let ns = st["netns"].as_str().expect("netns").to_string();
    let servers = st["servers"].as_array().expect("servers");
    let pids: Vec<u64> = servers.iter().filter_map(|s| s["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 2);
    for s in servers {
        assert!(Path::new(s["config"].as_str().expect("config")).exists());
    }
    let latency = SocketAddr::from((server, 8080));
    let slow = millis(&get_sequence(latency, N, TIMEOUT).expect("latency"));
    assert!(after_first(&slow).0 >= 30.0, "{slow:?}");

    // A second `up` with the same name is refused with a clear message.
    let (code, _, err) = lagtrace(&["lab", "up", "--name", &n]);
    assert_eq!(code, 2);
    assert!(
        err.contains("already up") && err.contains("lab down"),
        "{err}"
    );

    let (code, out, _) = lagtrace(&["lab", "status"]);
    assert_eq!(code, 0);
    assert!(out.contains(&n) && out.contains("answers"), "{out}");

    assert_eq!(lagtrace(&["lab", "fix", "--name", &n]).0, 0);
    let fixed = millis(&get_sequence(latency, N, TIMEOUT).expect("fixed"));
    assert!(after_first(&fixed).1 < 5.0, "fixed: {fixed:?}");
    assert_eq!(lagtrace(&["lab", "unfix", "--name", &n]).0, 0);
    let again = millis(&get_sequence(latency, N, TIMEOUT).expect("unfixed"));
    assert!(after_first(&again).0 >= 30.0, "unfixed: {again:?}");

    assert_eq!(lagtrace(&["lab", "down", "--name", &n]).0, 0);
    assert!(!Path::new("/run/netns").join(&ns).exists());
    assert!(!Path::new("/sys/class/net").join(&iface).exists());
    for p in pids {
        assert!(!running(p), "pid {p} remains");
    }
    // Idempotent.
    assert_eq!(lagtrace(&["lab", "down", "--name", &n]).0, 0);
}

#[test]
fn lab_cli_builtin_servers() {
    let n = name("cli-builtin");
    let _guard = Down(n.clone());
    let (code, out, err) = lagtrace(&["lab", "up", "--name", &n, "--server", "builtin", "--json"]);
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out).expect("json");
    let server: std::net::Ipv4Addr = st["server_addr"]
        .as_str()
        .expect("addr")
        .parse()
        .expect("ip");
    let good = millis(&get_sequence(SocketAddr::from((server, 80)), N, TIMEOUT).expect("good"));
    let slow = millis(&get_sequence(SocketAddr::from((server, 8080)), N, TIMEOUT).expect("slow"));
    eprintln!("builtin process good {good:?}\nlatency {slow:?}");
    assert!(after_first(&good).1 < 5.0, "{good:?}");
    assert!(after_first(&slow).0 >= 30.0, "{slow:?}");
    assert_eq!(lagtrace(&["lab", "fix", "--name", &n]).0, 0);
    let fixed = millis(&get_sequence(SocketAddr::from((server, 8080)), N, TIMEOUT).expect("fixed"));
    assert!(after_first(&fixed).1 < 5.0, "{fixed:?}");
    let pids: Vec<u32> = lagtrace_lab::Lab::open(&n)
        .expect("open")
        .state()
        .servers
        .iter()
        .filter_map(|s| s.pid)
        .collect();
    assert_eq!(pids.len(), 2);
    assert_eq!(lagtrace(&["lab", "down", "--name", &n]).0, 0);
    for p in pids {
        assert!(!running(p), "serve pid {p} remains");
    }
}

#[test]
fn lab_cli_bad_input() {
    let (code, _, err) = lagtrace(&["lab", "up", "--name", "bad name"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("lagtrace: error: lab name"), "{err}");
    let (code, _, err) = lagtrace(&["lab", "fix", "--name", &name("never-up")]);
    assert_eq!(code, 2);
    assert!(err.contains("is not up"), "{err}");
}

#[test]
fn demo_runs_and_leaves_nothing() {
    let n = name("demo");
    let (code, out, err) = lagtrace(&["demo", "--name", &n, "--requests", "8"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("latency :8080") && out.contains("lab down"),
        "{out}"
    );
    assert!(
        !Path::new("/run/netns")
            .join(lagtrace_lab::netns_name(&n))
            .exists()
    );
    assert!(!lagtrace_lab::state_dir(&n).exists());
}
