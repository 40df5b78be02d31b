//! `lagtrace lab`, `serve` and `demo` as a user runs them (need root for the lab).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lagtrace_lab::probe_client::{
    Response, fast, get_sequence, millis, no_stall, sample_until, stalls,
};

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

/// The stall floor (the client's delayed ACK is >= 40 ms) and the fast ceiling.
const STALL_MS: f64 = 30.0;
const FAST_MS: f64 = 5.0;
/// Samples per measurement: one sample can be disturbed by a loaded machine.
const ATTEMPTS: usize = 3;

fn slow_sample(addr: SocketAddr) -> Vec<Response> {
    sample_until(addr, N, TIMEOUT, ATTEMPTS, |r| stalls(r, STALL_MS)).expect("requests")
}

/// Median under 5 ms and not one request near the stall.
fn is_fast(r: &[Response]) -> bool {
    fast(r, FAST_MS) && no_stall(r, STALL_MS)
}

fn fast_sample(addr: SocketAddr) -> Vec<Response> {
    sample_until(addr, N, TIMEOUT, ATTEMPTS, is_fast).expect("requests")
}

#[test]
fn serve_nagle_split_writes_stalls_nodelay_does_not() {
    let slow = serve(&["--nodelay", "off", "--split-writes"]);
    let quick = serve(&["--nodelay", "on", "--split-writes"]);
    let s = slow_sample(slow.1);
    let f = fast_sample(quick.1);
    eprintln!(
        "serve nodelay off: {:?}\nserve nodelay on: {:?}",
        millis(&s),
        millis(&f)
    );
    assert!(
        stalls(&s, STALL_MS),
        "nodelay off + split writes should stall: {:?}",
        millis(&s)
    );
    assert!(is_fast(&f), "nodelay on should not: {:?}", millis(&f));
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
#[ignore = "needs root"]
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
    let slow = slow_sample(latency);
    assert!(stalls(&slow, STALL_MS), "{:?}", millis(&slow));

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
    // --name shows that lab alone, like the other lab subcommands take it.
    let (code, out, err) = lagtrace(&["lab", "status", "--name", &n]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(&format!("lab {n}:")), "{out}");
    assert_eq!(out.matches("lab ").count(), 1, "{out}");

    assert_eq!(lagtrace(&["lab", "fix", "--name", &n]).0, 0);
    let fixed = fast_sample(latency);
    assert!(is_fast(&fixed), "fixed: {:?}", millis(&fixed));
    assert_eq!(lagtrace(&["lab", "unfix", "--name", &n]).0, 0);
    let again = slow_sample(latency);
    assert!(stalls(&again, STALL_MS), "unfixed: {:?}", millis(&again));

    assert_eq!(lagtrace(&["lab", "down", "--name", &n]).0, 0);
    assert!(!Path::new("/run/netns").join(&ns).exists());
    assert!(!Path::new("/sys/class/net").join(&iface).exists());
    for p in pids {
        assert!(!running(p), "pid {p} remains");
    }
    // Idempotent.
    assert_eq!(lagtrace(&["lab", "down", "--name", &n]).0, 0);
    let (code, out, _) = lagtrace(&["lab", "status", "--name", &n]);
    assert_eq!(code, 1, "a lab that is not up: {out}");
    assert!(out.contains("is not up"), "{out}");
}

#[test]
#[ignore = "needs root"]
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
    let good = fast_sample(SocketAddr::from((server, 80)));
    let slow = slow_sample(SocketAddr::from((server, 8080)));
    eprintln!(
        "builtin process good {:?}\nlatency {:?}",
        millis(&good),
        millis(&slow)
    );
    assert!(is_fast(&good), "{:?}", millis(&good));
    assert!(stalls(&slow, STALL_MS), "{:?}", millis(&slow));
    assert_eq!(lagtrace(&["lab", "fix", "--name", &n]).0, 0);
    let fixed = fast_sample(SocketAddr::from((server, 8080)));
    assert!(is_fast(&fixed), "{:?}", millis(&fixed));
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
#[ignore = "needs root"]
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

#[test]
fn lab_without_capabilities_names_them() {
    // Root, but with CAP_NET_ADMIN and CAP_SYS_ADMIN removed from the bounding set.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set",
            "-net_admin,-sys_admin",
            BIN,
            "lab",
            "up",
            "--name",
        ])
        .arg(name("nocap"))
        .output()
        .expect("setpriv (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CAP_NET_ADMIN"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn lab_down_and_fix_unprivileged_name_the_capability_and_touch_nothing() {
    // They failed half-way with an `ip netns del` / log file error, or (down of a lab that
    // is not up) claimed "lab X is down".
    let n = name("nopriv");
    let _down = Down(n.clone());
    let (code, _, err) = lagtrace(&["lab", "up", "--name", &n, "--server", "builtin"]);
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = {
        let (_, out, _) = lagtrace(&["lab", "status", "--name", &n, "--json"]);
        serde_json::from_str(&out).expect("status json")
    };
    let pids: Vec<u64> = st["labs"][0]["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .filter_map(|s| s["pid"].as_u64())
        .collect();
    assert_eq!(pids.len(), 2, "{st}");
    for cmd in ["down", "fix", "unfix"] {
        let out = Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                BIN,
                "lab",
                cmd,
                "--name",
                &n,
            ])
            .output()
            .expect("setpriv");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{cmd}: {err}");
        assert!(err.contains("CAP_NET_ADMIN"), "{cmd}: {err}");
    }
    for p in pids {
        assert!(running(p), "server pid {p} still runs");
    }
    let (code, out, _) = lagtrace(&["lab", "status", "--name", &n]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("answers").count(), 2, "{out}");
}

#[test]
#[ignore = "needs root"]
fn demo_interrupted_leaves_nothing() {
    let n = name("demo-int");
    let child = Command::new(BIN)
        .args(["demo", "--name", &n, "--requests", "500"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn demo");
    // Wait until the lab is up and the slow measurement runs (500 x ~40 ms), then Ctrl-C.
    let state = lagtrace_lab::state_dir(&n).join("state.json");
    let t0 = std::time::Instant::now();
    while !(state.exists() && std::fs::read_to_string(&state).is_ok_and(|s| s.contains("8080"))) {
        assert!(t0.elapsed() < Duration::from_secs(20), "lab never came up");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().expect("demo exits");
    let err = String::from_utf8_lossy(&out.stderr);
    // An interrupted run exits 130, like every command (README, "Exit status").
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "demo took {:?} to stop",
        t0.elapsed()
    );
    assert!(
        !Path::new("/run/netns")
            .join(lagtrace_lab::netns_name(&n))
            .exists()
    );
    assert!(!lagtrace_lab::state_dir(&n).exists());
}

#[test]
fn serve_cork_left_on_holds_each_response_until_the_cork_timer() {
    let s = serve(&["--cork"]);
    // The kernel flushes a corked partial segment after 200 ms.
    let r = get_sequence(s.1, 3, TIMEOUT).expect("corked serve");
    assert!(
        r.iter().all(|x| x.elapsed >= Duration::from_millis(150)),
        "{:?}",
        millis(&r)
    );
    // Cross-check with curl (a new connection).
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{time_total}"])
        .arg(format!("http://{}/", s.1))
        .output()
        .expect("curl");
    let secs: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("time");
    assert!(secs >= 0.15, "curl: {secs} s");
}

/// Runs lagtrace with stdout a pipe whose reader is gone (as under `| head -1` once head
/// has exited): returns exit code and stderr.
fn lagtrace_into_closed_pipe(args: &[&str]) -> (i32, String) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two fds that we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds are fresh from pipe2 and owned by nothing else.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    let out = Command::new(BIN)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run lagtrace");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs root"]
fn closed_stdout_is_a_silent_exit_0_and_demo_still_cleans_up() {
    // `println!` panicked on the broken pipe (exit 101 with a backtrace).
    let n = name("pipe");
    let (code, err) = lagtrace_into_closed_pipe(&["lab", "down", "--name", &n]);
    assert_eq!((code, err.as_str()), (0, ""));
    let (code, err) = lagtrace_into_closed_pipe(&["lab", "status"]);
    assert_eq!((code, err.as_str()), (0, ""));
    let n = name("demo-pipe");
    let _down = Down(n.clone());
    let (code, err) = lagtrace_into_closed_pipe(&["demo", "--name", &n, "--requests", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !Path::new("/run/netns")
            .join(lagtrace_lab::netns_name(&n))
            .exists()
    );
    assert!(!lagtrace_lab::state_dir(&n).exists());
}

#[test]
#[ignore = "needs root"]
fn lab_up_interrupted_half_way_leaves_nothing() {
    // SIGINT's default action killed `lab up` between two steps: namespace, veth and state
    // stayed, and the next `lab up` said "already up".
    let n = name("up-int");
    let _down = Down(n.clone());
    let state = lagtrace_lab::state_dir(&n);
    let ns = Path::new("/run/netns").join(lagtrace_lab::netns_name(&n));
    for attempt in 0..3 {
        let child = Command::new(BIN)
            .args(["lab", "up", "--name", &n])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lab up");
        // The state directory appears early, before the servers start: interrupt then.
        let t0 = std::time::Instant::now();
        while !state.exists() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        let out = child.wait_with_output().expect("lab up exits");
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(0) && attempt < 2 {
            // The lab was complete before the signal landed (a loaded machine): again.
            let _ = lagtrace(&["lab", "down", "--name", &n]);
            continue;
        }
        assert_eq!(
            out.status.code(),
            Some(130),
            "interrupted: 130, the one rule: {err}"
        );
        assert!(err.contains("interrupted"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!ns.exists(), "namespace left behind");
        assert!(!state.exists(), "state left behind");
        let (code, _, err) = lagtrace(&["lab", "up", "--name", &n]);
        assert_eq!(code, 0, "a new lab up works: {err}");
        return;
    }
}
