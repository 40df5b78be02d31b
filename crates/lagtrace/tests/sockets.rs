//! `lagtrace sockets` end to end: inspect real nginx, record real wrk and curl, missing
//! privilege, bad input. Run as root (CI does).

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};
use std::time::Duration;

use lagtrace_testkit::nginx::*;
use serde_json::Value;

/// A child process this test started: killed and reaped on drop, even on panic.
struct Owned(std::process::Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 10 s, polling) until `pred` holds: no fixed sleep that a loaded machine
/// can outlast.
fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !pred() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Whether a process named `name` whose parent is `ppid` exists.
fn has_child_named(ppid: u32, name: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // "pid (comm) state ppid ...": the comm may hold spaces, so split after ')'.
            let ppid_of = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            ppid_of == Some(ppid) && comm(pid) == name
        })
}

fn lagtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(args)
        .output()
        .unwrap()
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

fn summary_count(rec: &Value, option: &str, value: &str) -> u64 {
    rec["option_summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["option"] == option && o["value"] == value)
        .map(|o| o["sockets"].as_u64().unwrap())
        .unwrap_or(0)
}

#[test]
#[ignore = "needs root"]
fn record_wrk_sets_nodelay_and_never_quickack() {
    let port = free_port();
    let _n = Nginx::start("", port, None);
    let url = format!("http://127.0.0.1:{port}/");
    let out = lagtrace(&[
        "sockets", "--record", "--json", "--", "wrk", "-t1", "-c2", "-d1s", &url,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rec = json(&out);
    let tcp = rec["tcp_sockets"].as_u64().unwrap();
    assert!(tcp >= 2, "{rec:#}");
    // wrk sets TCP_NODELAY=1 on every connection it makes, and never TCP_QUICKACK.
    assert!(summary_count(&rec, "TCP_NODELAY", "1") >= 2, "{rec:#}");
    // ...except its probe: before starting its threads, wrk connects once from the main
    // thread (blocking connect, no option set) to check the address, and closes.
    assert_eq!(rec["never_nodelay"], serde_json::json!([0]), "{rec:#}");
    let probe = &rec["sockets"][0];
    assert!(probe["options"].as_array().unwrap().is_empty() && probe["closed"] == true);
    assert_eq!(
        rec["never_quickack"].as_array().unwrap().len() as u64,
        tcp,
        "{rec:#}"
    );
    assert!(
        !rec["option_summary"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["option"] == "TCP_QUICKACK")
    );
    // The connects went to our server, and wrk's own threads were followed.
    let peers = rec["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["peer"].as_str() == Some(&format!("{{AF_INET, 127.0.0.1:{port}}}")))
        .count();
    assert!(peers >= 2, "{rec:#}");
    assert!(rec["tasks"].as_u64().unwrap() >= 2, "wrk's thread followed");
    // The live trace went to stderr, strace-style.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines().any(|l| l.starts_with("[pid ")
            && l.contains("setsockopt(")
            && l.ends_with(", SOL_TCP, TCP_NODELAY, [1], 4) = 0")),
        "{err}"
    );
}

#[test]
#[ignore = "needs root"]
fn record_curl_follows_forks_and_passes_exit_status() {
    let port = free_port();
    let _n = Nginx::start("", port, None);
    let url = format!("http://127.0.0.1:{port}/");
    let trace = tempfile::NamedTempFile::new().unwrap();
    let out = lagtrace(&[
        "sockets",
        "--record",
        "-o",
        trace.path().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &format!("curl -s -o /dev/null {url} && curl -s -o /dev/null {url}"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let t = std::fs::read_to_string(trace.path()).unwrap();
    let connects: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("connect(") && l.contains(&format!(":{port}}}")))
        .collect();
    assert_eq!(connects.len(), 2, "two curl processes: {t}");
    let pids: std::collections::BTreeSet<&str> = connects
        .iter()
        .map(|l| l.split(']').next().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{t}");
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains("SOL_TCP TCP_NODELAY=1 on 2 sockets"),
        "{summary}"
    );
    assert!(summary.contains("never set TCP_QUICKACK: 2/2"), "{summary}");

    let out = lagtrace(&["sockets", "--record", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = lagtrace(&["sockets", "--record", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
    // curl's own failure code comes through too (7: could not connect).
    let closed = lagtrace_testkit::nginx::ClosedPort::new();
    let dead = closed.port;
    let out = lagtrace(&[
        "sockets",
        "--record",
        "--",
        "curl",
        "-s",
        &format!("http://127.0.0.1:{dead}/"),
    ]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    // (a non-blocking connect: the refusal shows in SO_ERROR)
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("EINPROGRESS"), "{err}");
    assert!(
        err.contains("getsockopt(") && err.contains("SO_ERROR, [111], [4]) = 0"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root"]
fn inspect_text_names_the_setting_and_the_line() {
    let port = free_port();
    let n = Nginx::start(LATENCY_HTTP, port, None);
    let _c: Vec<_> = (0..2).map(|_| keepalive_client(port, 2)).collect();
    let out = lagtrace(&["sockets", "--port", &port.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "2 established on :{port}, 1 listening, TCP_NODELAY off on 2/2"
        )),
        "{text}"
    );
    let at = format!(
        "tcp_nodelay off  ({}:{})",
        n.conf_path().display(),
        n.line_of("tcp_nodelay off;")
    );
    assert!(text.contains(&at), "{at} not in {text}");
    assert!(text.contains("not a setting"), "{text}");
    let out = lagtrace(&["sockets", "--port", &port.to_string(), "--json"]);
    let v = json(&out);
    assert!(v["sockets"].as_array().unwrap().len() >= 5); // listener + 2×2 ends
}

/// A config edited after nginx loaded it is what is on disk, not what runs: the lens says so
/// (and says nothing while the file is as loaded).
#[test]
#[ignore = "needs root"]
fn config_changed_since_nginx_loaded_it_is_flagged() {
    let port = free_port();
    let n = Nginx::start(LATENCY_HTTP, port, None);
    let args = ["sockets", "--port", &port.to_string(), "--state", "listen"];
    let before = String::from_utf8_lossy(&lagtrace(&args).stderr).into_owned()
        + &String::from_utf8_lossy(&lagtrace(&args).stdout);
    assert!(!before.contains("changed after nginx"), "{before}");
    // Edit it (mtime now, well after the workers' start), as someone fixing it would.
    std::thread::sleep(Duration::from_millis(1100));
    let text = std::fs::read_to_string(n.conf_path()).unwrap();
    std::fs::write(
        n.conf_path(),
        text.replace("tcp_nodelay off;", "tcp_nodelay on;"),
    )
    .unwrap();
    let out = lagtrace(&args);
    let all =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "{} changed after nginx last loaded",
        n.conf_path().display()
    );
    assert!(all.contains(&want), "{want} not in {all}");
}

/// Without CAP_SYS_PTRACE, a process of another uid cannot be looked into: the sockets are
/// still listed with TCP_INFO, and a note says what is missing and why.
#[test]
#[ignore = "needs root"]
fn without_cap_sys_ptrace_results_are_partial_with_a_note() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fd = l.as_raw_fd();
    let child = unsafe {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sleep",
                "30",
            ])
            .pre_exec(move || {
                // SAFETY: in the child: hand it the listener as fd 100, without CLOEXEC.
                if libc::dup2(fd, 100) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .unwrap()
    };
    let mut child = Owned(child);
    drop(l);
    // setpriv holds fd 100 already; wait until it has become `sleep` (the comm asserted).
    let cpid = child.0.id();
    wait_until("setpriv exec'd sleep", || comm(cpid) == "sleep");
    let out = Command::new("setpriv")
        .args([
            "--inh-caps=-sys_ptrace",
            "--bounding-set=-sys_ptrace",
            env!("CARGO_BIN_EXE_lagtrace"),
            "sockets",
            "--port",
            &port.to_string(),
            "--json",
        ])
        .output()
        .unwrap();
    let pid = child.0.id();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    let socks = v["sockets"].as_array().unwrap();
    assert_eq!(socks.len(), 1, "{v:#}");
    assert_eq!(socks[0]["state"], "LISTEN");
    assert!(socks[0]["owners"].as_array().unwrap().is_empty());
    assert!(
        socks[0]["tcp_info"]["rto_us"].is_u64(),
        "TCP_INFO still read"
    );
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("1 listed socket has no known owner")
                && n.contains("CAP_SYS_PTRACE")),
        "{notes:?}"
    );
    let unread = v["unreadable"].as_array().unwrap();
    let me = unread
        .iter()
        .find(|u| u["pid"] == pid)
        .unwrap_or_else(|| panic!("{unread:?}"));
    assert_eq!(me["comm"], "sleep");
    assert!(me["reason"].as_str().unwrap().contains("CAP_SYS_PTRACE"));
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    for args in [
        &["sockets", "--netns", "lt-sk-nope"][..],
        &["sockets", "--state", "bogus"][..],
        &["sockets", "--record"][..],
        &["sockets", "--record", "--", "/nonexistent/lt-cmd"][..],
        &["sockets", "stray"][..],
    ] {
        let out = lagtrace(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("lagtrace: error: "), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

/// Recording a server: nginx (under `timeout`, so it ends by itself) binds, listens, forks
/// its worker, accepts; the latency config's accepted sockets never set TCP_NODELAY while
/// the default config's set it when the connection enters keep-alive.
#[test]
#[ignore = "needs root"]
fn record_nginx_follows_its_worker_and_its_accepts() {
    for (http, expect_nodelay) in [(LATENCY_HTTP, false), ("", true)] {
        let port = free_port();
        let (dir, conf) = nginx_conf(http, port);
        let child = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .args(["sockets", "--record", "--json", "-o"])
            .arg(dir.path().join("trace.txt"))
            .args(["--", "timeout", "-s", "QUIT", "3", "nginx", "-c"])
            .arg(&conf)
            .arg("-p")
            .arg(dir.path())
            .args(["-g", "daemon off;"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(2), "nginx did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let conns: Vec<_> = (0..2).map(|_| keepalive_client(port, 2)).collect();
        drop(conns);
        let out = child.wait_with_output().unwrap();
        // timeout's own status (124: it had to stop nginx) is passed through
        assert_eq!(out.status.code(), Some(124), "{out:?}");
        let rec = json(&out);
        let socks = rec["sockets"].as_array().unwrap();
        let listener = socks
            .iter()
            .find(|s| s["bound"] == format!("{{AF_INET, 127.0.0.1:{port}}}"))
            .unwrap_or_else(|| panic!("{rec:#}"));
        let master = listener["pid"].as_u64().unwrap();
        let accepted: Vec<&Value> = socks
            .iter()
            .filter(|s| s["origin"] == "accept" && s["tcp"] == true)
            .collect();
        // the probe connection of the wait loop above, then the two keep-alive clients
        assert!(accepted.len() >= 3, "{rec:#}");
        for a in &accepted {
            assert_ne!(a["pid"].as_u64().unwrap(), master, "accepted by the worker");
        }
        let with_nodelay = accepted
            .iter()
            .filter(|a| {
                a["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o["option"] == "TCP_NODELAY" && o["value"] == "1")
            })
            .count();
        if expect_nodelay {
            // the keep-alive clients' sockets (the probe closed without a request)
            assert!(with_nodelay >= 2, "{rec:#}");
        } else {
            assert_eq!(with_nodelay, 0, "{rec:#}");
        }
        let trace = std::fs::read_to_string(dir.path().join("trace.txt")).unwrap();
        assert!(trace.contains("listen("), "{trace}");
        assert!(trace.contains("accept4("), "{trace}");
    }
}

/// TCP_NODELAY set on a listener is inherited by the sockets it accepts: those are not
/// listed as "never set TCP_NODELAY"; the client end that set nothing is.
#[test]
fn record_counts_options_inherited_from_the_listener() {
    let script = "import socket\n\
        l = socket.socket()\n\
        l.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n\
        l.bind(('127.0.0.1', 0)); l.listen(1)\n\
        c = socket.create_connection(l.getsockname())\n\
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)\n\
        l.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)\n\
        a, _ = l.accept()\n\
        assert a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1\n";
    let out = lagtrace(&[
        "sockets", "--record", "--json", "--", "python3", "-c", script,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rec = json(&out);
    let socks = rec["sockets"].as_array().unwrap();
    let acc = socks.iter().find(|s| s["origin"] == "accept").unwrap();
    let lis = acc["listener"].as_u64().unwrap();
    let client = socks
        .iter()
        .find(|s| s["origin"] == "socket" && s["id"] != lis && s["tcp"] == true)
        .unwrap();
    let never: Vec<u64> = rec["never_nodelay"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(never, vec![client["id"].as_u64().unwrap()], "{rec:#}");
    // TCP_QUICKACK is not inherited: the accepted socket never set it; the client and the
    // listener did.
    assert_eq!(
        rec["never_quickack"],
        serde_json::json!([acc["id"]]),
        "{rec:#}"
    );
    assert_eq!(summary_count(&rec, "TCP_QUICKACK", "1"), 2);
}

/// Cross-check with the peer tool: strace sees the same setsockopt calls as --record.
#[test]
#[ignore = "needs root"]
fn record_agrees_with_strace_on_setsockopt() {
    let port = free_port();
    let _n = Nginx::start("", port, None);
    let url = format!("http://127.0.0.1:{port}/");
    let st = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=setsockopt",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            &url,
        ])
        .output()
        .unwrap();
    assert!(st.status.success(), "{st:?}");
    let calls = |text: &str| -> Vec<String> {
        // "setsockopt(5, SOL_TCP, TCP_NODELAY, [1], 4) = 0" without pid prefixes
        let mut v: Vec<String> = text
            .lines()
            .filter_map(|l| l.find("setsockopt(").map(|i| l[i..].to_string()))
            .collect();
        v.sort();
        v
    };
    let theirs = calls(&String::from_utf8_lossy(&st.stderr));
    let out = lagtrace(&[
        "sockets",
        "--record",
        "--",
        "curl",
        "-s",
        "-o",
        "/dev/null",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let ours = calls(&String::from_utf8_lossy(&out.stderr));
    assert!(!ours.is_empty());
    assert_eq!(ours, theirs);
}

/// Ctrl-C (SIGINT to the whole process group) ends CMD, not the recording: the summary is
/// still printed and the status is CMD's (130).
#[test]
fn record_survives_ctrl_c_and_reports_cmds_status() {
    let child = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["sockets", "--record", "--", "sleep", "10"])
        .process_group(0)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Ctrl-C only once the command runs under the recorder (its handler is in place then).
    let lpid = child.id();
    wait_until("sleep started under the recorder", || {
        has_child_named(lpid, "sleep")
    });
    // SAFETY: signalling the process group this test just created.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("killed by signal 2"));
}

/// Only socket calls stop the command: a program that opens, reads and closes files
/// records nothing (its close() of a non-socket is resumed without a log line).
#[test]
fn record_ignores_everything_but_socket_calls() {
    let out = lagtrace(&[
        "sockets",
        "--record",
        "--json",
        "--",
        "sh",
        "-c",
        "cat /etc/hostname /etc/passwd >/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rec = json(&out);
    assert_eq!(rec["events"], serde_json::json!([]), "{rec:#}");
    assert_eq!(rec["sockets"], serde_json::json!([]));
    assert!(
        rec["tasks"].as_u64().unwrap() >= 2,
        "sh and its cat child followed"
    );
}

/// One `ss -tinmH` socket: the state line's queues and the info line's `key:value` words.
struct SsSocket {
    local: String,
    peer: String,
    recv_q: u64,
    send_q: u64,
    kv: std::collections::HashMap<String, String>,
}

fn ss_sockets(port: u16) -> Vec<SsSocket> {
    let o = Command::new("ss")
        .args(["-tinmH", &format!("( sport = :{port} or dport = :{port} )")])
        .output()
        .expect("ss (iproute2)");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut out: Vec<SsSocket> = Vec::new();
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            let w: Vec<&str> = line.split_whitespace().collect();
            out.push(SsSocket {
                recv_q: w[1].parse().unwrap(),
                send_q: w[2].parse().unwrap(),
                local: w[3].to_string(),
                peer: w[4].to_string(),
                kv: Default::default(),
            });
        } else if let Some(s) = out.last_mut() {
            for word in line.split_whitespace() {
                if let Some(inner) = word.strip_prefix("skmem:(") {
                    for part in inner.trim_end_matches(')').split(',') {
                        let at = part.find(|c: char| c.is_ascii_digit()).unwrap_or(0);
                        s.kv.insert(format!("skmem.{}", &part[..at]), part[at..].into());
                    }
                } else if let Some((k, v)) = word.split_once(':') {
                    s.kv.insert(k.to_string(), v.to_string());
                }
            }
        }
    }
    out
}

/// Recv-Q, Send-Q, notsent, mss and the byte and segment counters, field by field against
/// `ss -tinm` on the same sockets: one connection whose server does not read (its Recv-Q
/// holds the request), one whose client wrote more than the peer's window (Send-Q and
/// notsent hold the rest). Both are idle while read (segments only from zero-window probes,
/// one per backed-off RTO), and the text shows the same numbers.
#[test]
fn queues_notsent_mss_and_counters_match_ss() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut a = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (_sa, _) = l.accept().unwrap();
    std::io::Write::write_all(&mut a, &[b'x'; 1000]).unwrap();
    let b = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (_sb, _) = l.accept().unwrap();
    b.set_nonblocking(true).unwrap();
    let chunk = vec![b'y'; 65536];
    let mut sent = 0usize;
    loop {
        match std::io::Write::write(&mut &b, &chunk) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    // Let the window fill and the ACKs settle.
    std::thread::sleep(Duration::from_millis(300));
    let b_local = b.local_addr().unwrap().to_string();
    let o = lagtrace(&["sockets", "--port", &port.to_string(), "--json"]);
    let j = json(&o);
    let ss = ss_sockets(port);
    let ours: Vec<&Value> = j["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "ESTABLISHED")
        .collect();
    assert_eq!(ours.len(), 4, "{j}");
    assert_eq!(ss.len(), 4, "{}", ss.len());
    let mut held = 0;
    for s in &ours {
        let (local, remote) = (s["local"].as_str().unwrap(), s["remote"].as_str().unwrap());
        let peer = ss
            .iter()
            .find(|x| x.local == local && x.peer == remote)
            .unwrap_or_else(|| panic!("ss lacks {local} -> {remote}"));
        let t = &s["tcp_info"];
        let what = format!("{local} -> {remote}");
        assert_eq!(s["recv_q"].as_u64(), Some(peer.recv_q), "{what} Recv-Q");
        assert_eq!(s["send_q"].as_u64(), Some(peer.send_q), "{what} Send-Q");
        let kv = |k: &str| peer.kv.get(k).map(|v| v.parse::<u64>().unwrap());
        // ss prints notsent only when there is some, bytes_* only when not 0.
        assert_eq!(
            t["notsent_bytes"].as_u64().filter(|&v| v > 0),
            kv("notsent"),
            "{what}"
        );
        assert_eq!(t["snd_mss"].as_u64(), kv("mss"), "{what} mss");
        assert_eq!(t["rcv_mss"].as_u64(), kv("rcvmss"), "{what} rcvmss");
        let nz = |k: &str| t[k].as_u64().filter(|&v| v > 0);
        assert_eq!(nz("bytes_acked"), kv("bytes_acked"), "{what}");
        assert_eq!(nz("bytes_received"), kv("bytes_received"), "{what}");
        for (k, ssk) in [("segs_out", "segs_out"), ("segs_in", "segs_in")] {
            let (a, b) = (t[k].as_u64().unwrap(), kv(ssk).unwrap_or(0));
            assert!(a.abs_diff(b) <= 2, "{what} {k}: {a} vs ss {b}");
        }
        let m = &s["skmem"];
        assert_eq!(m["rmem_alloc"].as_u64(), kv("skmem.r"), "{what} skmem r");
        assert_eq!(m["rcvbuf"].as_u64(), kv("skmem.rb"), "{what} skmem rb");
        assert_eq!(m["sndbuf"].as_u64(), kv("skmem.tb"), "{what} skmem tb");
        assert_eq!(m["wmem_queued"].as_u64(), kv("skmem.w"), "{what} skmem w");
        if local == b_local {
            held = t["notsent_bytes"].as_u64().unwrap();
            // Unsent bytes are part of Send-Q (write_seq - snd_una).
            assert!(held > 0 && peer.send_q >= held, "{what}: sent {sent}");
        }
    }
    assert!(held > 0, "the stalled writer was not seen");
    // The text says the same.
    let text = String::from_utf8_lossy(&lagtrace(&["sockets", "--port", &port.to_string()]).stdout)
        .into_owned();
    assert!(text.contains("Recv-Q 1000 "), "{text}");
    assert!(text.contains(&format!("notsent {held} ")), "{text}");
}
