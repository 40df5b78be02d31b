//! `lagtrace sockets --record` on the BPF recorder: exactly the calls a program makes (its
//! own count is the truth), attached by pid or launching it, and the same setsockopt calls
//! as strace on equal runs of real wrk and real nginx. Run as root (CI does).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lagtrace_testkit::nginx::*;
use serde_json::Value;

/// Makes exactly N setsockopt(TCP_NOTSENT_LOWAT) calls with the values 1..=N on one socket,
/// as fast as it can, after a line on stdin when given `wait` (and a command name to take);
/// prints its own count and rate.
const N_CALLS: &str = "import socket, sys, time\n\
n = int(sys.argv[1])\n\
if len(sys.argv) > 3:\n    open('/proc/self/comm', 'w').write(sys.argv[3])\n\
if len(sys.argv) > 2:\n    sys.stdin.readline()\n\
s = socket.socket()\n\
t0 = time.monotonic()\n\
for i in range(n):\n    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, i + 1)\n\
dt = time.monotonic() - t0\n\
s.close()\n\
print(n, n / dt, flush=True)\n";

/// A child killed and reaped on drop, even on panic.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The JSON document on stdout (after whatever the recorded command printed itself).
fn json(o: &Output) -> Value {
    let text = String::from_utf8_lossy(&o.stdout);
    let start = if text.starts_with('{') {
        0
    } else {
        text.find("\n{\n").map(|i| i + 1).unwrap_or(0)
    };
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {} stderr {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The program's own report: (calls, calls per second).
fn own_count(line: &str) -> (u64, f64) {
    let mut w = line.split_whitespace();
    let n = w.next().and_then(|v| v.parse().ok()).expect(line);
    let rate = w.next().and_then(|v| v.parse().ok()).expect(line);
    (n, rate)
}

/// The hooks the BPF recorder takes here: `fentry` where the kernel lets a program attach
/// to a trampoline (asked for alone, on a program making no calls), else `tracepoint`.
fn hooks_here() -> &'static str {
    static HOOKS: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    HOOKS.get_or_init(|| {
        let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .args(["sockets", "--record", "--recorder", "fentry", "--json"])
            .args(["-o", "/dev/null", "--", "/bin/true"])
            .output()
            .unwrap();
        if out.status.success() {
            assert_eq!(json(&out)["hooks"], "fentry", "{out:?}");
            "fentry"
        } else {
            // Refused: exit 2 and one line that says so.
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains("fentry"), "{err}");
            "tracepoint"
        }
    })
}

/// Asserts the recording was made by BPF on the hooks this kernel allows (fentry, else
/// the syscall tracepoints with the reason), holds exactly `n` setsockopt events of `pid`,
/// with the values 1..=n in order, and nothing lost.
fn assert_exactly_n(rec: &Value, pid: u64, n: u64) {
    assert_eq!(rec["mechanism"], "bpf", "{}", rec["fallback"]);
    let want = hooks_here();
    assert_eq!(rec["hooks"], want, "{}", rec["fallback"]);
    if want == "tracepoint" {
        let why = rec["fallback"].as_str().unwrap_or("");
        assert!(why.contains("fentry"), "{}", rec["fallback"]);
    }
    assert_exactly_n_on(rec, pid, n);
}

/// The calls of [`assert_exactly_n`], whatever recorded them.
fn assert_exactly_n_on(rec: &Value, pid: u64, n: u64) {
    assert_eq!(rec["lost_events"], 0);
    let values: Vec<String> = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call"] == "setsockopt" && e["pid"] == pid)
        .map(|e| e["args"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        values.len() as u64,
        n,
        "calls recorded vs the program's own count"
    );
    for (i, a) in values.iter().enumerate() {
        let want = format!(", SOL_TCP, TCP_NOTSENT_LOWAT, [{}], 4", i + 1);
        assert!(a.ends_with(&want), "call {i}: {a} (want ...{want})");
    }
}

/// Attached by pid (and by command name) to a running program: every one of its N calls
/// at >= 10k calls/s is recorded with its value; the window ends when the program exits;
/// exit 0.
#[test]
#[ignore = "needs root"]
fn record_pid_gets_exactly_the_calls_the_program_made() {
    let _m = lagtrace_testkit::measuring();
    let n = 30_000u64;
    let name = format!("ltrec{}", std::process::id() % 100_000_000);
    for by in ["--pid", "--process"] {
        let prog = Command::new("python3")
            .args(["-c", N_CALLS, &n.to_string(), "wait", &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut prog = Owned(prog);
        let pid = prog.0.id();
        let comm = format!("/proc/{pid}/comm");
        let t0 = Instant::now();
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != name {
            assert!(t0.elapsed() < Duration::from_secs(10), "no comm {name}");
            std::thread::sleep(Duration::from_millis(10));
        }
        let target = if by == "--pid" {
            pid.to_string()
        } else {
            name.clone()
        };
        let rec = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .args([
                "sockets",
                "--record",
                "--json",
                "-o",
                "/dev/null",
                "-d",
                "60s",
                by,
            ])
            .arg(&target)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut rec = Owned(rec);
        // The recorder says when it is in place; only then may the program start.
        let mut err = BufReader::new(rec.0.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(
            line.contains(&format!("recording the socket calls of pid {pid}")),
            "{line}"
        );
        writeln!(prog.0.stdin.take().unwrap(), "go").unwrap();
        let mut own = String::new();
        BufReader::new(prog.0.stdout.take().unwrap())
            .read_line(&mut own)
            .unwrap();
        let (count, rate) = own_count(&own);
        assert_eq!(count, n);
        assert!(rate >= 10_000.0, "the program made only {rate:.0} calls/s");
        let t0 = Instant::now();
        let out = std::mem::replace(&mut rec.0, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the window did not end with the program"
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let rec = json(&out);
        assert_eq!(rec["attached"], serde_json::json!([pid]), "{by}");
        assert_exactly_n(&rec, u64::from(pid), n);
    }
}

/// `-- CMD` on BPF: the same exactness, the exit status passed through; and the ptrace
/// fallback (asked for) still records the same calls.
#[test]
#[ignore = "needs root"]
fn record_cmd_gets_exactly_the_calls_the_program_made() {
    let _m = lagtrace_testkit::measuring();
    let n = 30_000u64;
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args([
            "sockets",
            "--record",
            "--recorder",
            "bpf",
            "--json",
            "-o",
            "/dev/null",
        ])
        .args(["--", "python3", "-c", N_CALLS, &n.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (count, rate) = own_count(String::from_utf8_lossy(&out.stdout).lines().next().unwrap());
    assert_eq!(count, n);
    assert!(rate >= 10_000.0, "the program made only {rate:.0} calls/s");
    let rec = json(&out);
    let pid = rec["events"][0]["pid"].as_u64().unwrap();
    assert_exactly_n(&rec, pid, n);

    // The syscall tracepoints and the raw sys_exit tracepoint, asked for: the same calls,
    // no fallback to explain.
    for hooks in ["tracepoint", "raw"] {
        let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .args(["sockets", "--record", "--recorder", hooks, "--json"])
            .args([
                "-o",
                "/dev/null",
                "--",
                "python3",
                "-c",
                N_CALLS,
                &n.to_string(),
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let rec = json(&out);
        assert_eq!(
            (&rec["mechanism"], &rec["hooks"], &rec["fallback"]),
            (&"bpf".into(), &hooks.into(), &Value::Null)
        );
        let pid = rec["events"][0]["pid"].as_u64().unwrap();
        assert_exactly_n_on(&rec, pid, n);
    }

    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args([
            "sockets",
            "--record",
            "--recorder",
            "ptrace",
            "--json",
            "-o",
            "/dev/null",
        ])
        .args(["--", "python3", "-c", N_CALLS, "500"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rec = json(&out);
    assert_eq!(rec["mechanism"], "ptrace");
    let sets = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call"] == "setsockopt")
        .count();
    assert_eq!(sets, 500);
}

/// The setsockopt calls of a strace-like trace, without pid prefixes and descriptor
/// numbers (`setsockopt(FD, SOL_TCP, TCP_NODELAY, [1], 4) = 0`), sorted.
fn setsockopts(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter_map(|l| l.find("setsockopt(").map(|i| &l[i + "setsockopt(".len()..]))
        .filter_map(|rest| {
            rest.split_once(", ")
                .map(|(_, r)| format!("setsockopt(FD, {r}"))
        })
        .collect();
    v.sort();
    v
}

/// A real wrk (keep-alive, so an equal run makes equal calls) recorded with `-- CMD`
/// makes the same setsockopt calls as under `strace -f -e trace=setsockopt`.
#[test]
#[ignore = "needs root"]
fn record_wrk_agrees_with_strace() {
    let port = free_port();
    // Connections stay open for the whole run: the calls are per connection.
    let _n = Nginx::start("    keepalive_requests 100000000;\n", port, None);
    let url = format!("http://127.0.0.1:{port}/");
    let wrk = ["wrk", "-t2", "-c6", "-d1s", url.as_str()];
    // One file per thread (-ff): no "<unfinished ...>" splits of wrk's concurrent calls.
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new("strace")
        .args(["-f", "-ff", "-qq", "-e", "trace=setsockopt", "-o"])
        .arg(dir.path().join("st"))
        .args(wrk)
        .output()
        .unwrap();
    assert!(st.status.success(), "{st:?}");
    let mut text = String::new();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        text += &std::fs::read_to_string(f.unwrap().path()).unwrap();
    }
    let theirs = setsockopts(&text);
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["sockets", "--record", "--recorder", "bpf", "--"])
        .args(wrk)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ours = setsockopts(&String::from_utf8_lossy(&out.stderr));
    assert!(ours.len() >= 6, "one per connection at least: {ours:?}");
    assert_eq!(ours, theirs);
}

/// Starts `lagtrace sockets --record --pid PID` and waits until it is in place.
fn attach(pid: u32, window: &str) -> (Owned, BufReader<std::process::ChildStderr>) {
    let child = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["sockets", "--record", "-d", window, "--pid"])
        .arg(pid.to_string())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Owned(child);
    let mut err = BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("recording the socket calls of pid"), "{line}");
    (child, err)
}

/// The same client traffic: `n` keep-alive connections, two requests each, then closed.
fn traffic(port: u16, n: usize) {
    for _ in 0..n {
        drop(keepalive_client(port, 2));
    }
}

/// A real nginx attached by its master's pid (its worker followed as a child): the calls
/// recorded match `strace -f -p` of master and worker on an equal run of client traffic.
#[test]
#[ignore = "needs root"]
fn record_nginx_by_pid_agrees_with_strace() {
    let port = free_port();
    let nginx = Nginx::start("", port, None);
    traffic(port, 1); // the worker is up and serving
    let (mut rec, mut err) = attach(nginx.master, "3s");
    traffic(port, 5);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = rec.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(rest.contains("(bpf)"), "{rest}");
    assert!(rest.contains("attached to pid"), "{rest}");
    let ours = setsockopts(&rest);

    // strace attached to the master and every worker (-f follows only new children).
    let mut pids = vec![nginx.master];
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", nginx.master)).unwrap();
    pids.extend(
        children
            .split_whitespace()
            .map(|p| p.parse::<u32>().unwrap()),
    );
    let mut st = Command::new("strace");
    st.args(["-f", "-e", "trace=setsockopt"]);
    for p in &pids {
        st.args(["-p", &p.to_string()]);
    }
    let st = st.stderr(Stdio::piped()).spawn().unwrap();
    let mut st = Owned(st);
    let mut serr = BufReader::new(st.0.stderr.take().unwrap());
    let mut attached = 0;
    while attached < pids.len() {
        let mut line = String::new();
        assert!(serr.read_line(&mut line).unwrap() > 0, "strace ended");
        if line.contains("attached") {
            attached += 1;
        }
    }
    traffic(port, 5);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling the strace this test started; it detaches and exits.
    unsafe { libc::kill(st.0.id() as i32, libc::SIGINT) };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut serr, &mut text).unwrap();
    let theirs = setsockopts(&text);
    assert!(!theirs.is_empty(), "strace saw nginx set options: {text}");
    assert_eq!(ours, theirs);
}

/// Cannot trace: a process that does not exist, and no CAP_BPF/CAP_PERFMON: exit 2 with
/// one line that says why.
#[test]
#[ignore = "needs root"]
fn record_pid_that_cannot_be_traced_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["sockets", "--record", "-d", "1s", "--pid", "4194303"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let me = std::process::id().to_string();
    let out = Command::new("setpriv")
        .args([
            "--inh-caps=-bpf,-perfmon,-sys_admin",
            "--bounding-set=-bpf,-perfmon,-sys_admin",
            env!("CARGO_BIN_EXE_lagtrace"),
            "sockets",
            "--record",
            "-d",
            "1s",
            "--pid",
            &me,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CAP_BPF"), "{err}");
}

/// A socket's duplicated descriptors (dup2, fcntl F_DUPFD_CLOEXEC) are the same
/// socket: the options set through them land on it (also after the others were closed),
/// and no "inherited" socket appears.
#[test]
#[ignore = "needs root"]
fn record_follows_duplicated_descriptors() {
    let script = "import fcntl, os, socket\n\
        s = socket.socket()\n\
        a = socket.socket(fileno=os.dup(s.fileno()))\n\
        a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n\
        os.dup2(s.fileno(), 50)\n\
        b = socket.socket(fileno=50)\n\
        b.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)\n\
        c = socket.socket(fileno=fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 60))\n\
        c.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)\n\
        s.close(); a.close(); b.close()\n\
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)\n";
    // Every BPF hook kind (auto, and each asked for) follows them.
    for hooks in ["bpf", "tracepoint", "raw"] {
        let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .args([
                "sockets",
                "--record",
                "--recorder",
                hooks,
                "--json",
                "-o",
                "/dev/null",
            ])
            .args(["--", "python3", "-c", script])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let rec = json(&out);
        let tcp: Vec<&Value> = rec["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["tcp"] == true || s["origin"] == "inherited")
            .collect();
        assert_eq!(tcp.len(), 1, "{rec:#}");
        let opts: Vec<&str> = tcp[0]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["option"].as_str().unwrap())
            .collect();
        assert_eq!(
            opts,
            ["TCP_NODELAY", "TCP_CORK", "SO_KEEPALIVE", "TCP_QUICKACK"],
            "{rec:#}"
        );
        let calls: Vec<&str> = rec["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["call"].as_str().unwrap())
            .collect();
        // (Python's os.dup is fcntl(F_DUPFD_CLOEXEC))
        for c in ["dup2", "fcntl"] {
            assert!(calls.contains(&c), "{c} not in {calls:?}");
        }
        // TCP_QUICKACK above came through `c` after three of the four descriptors were closed;
        // all four closes are logged against the one socket.
        let closes = rec["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["call"] == "close" && e["socket"] == tcp[0]["id"])
            .count();
        assert_eq!(closes, 4, "{rec:#}");
    }
}
