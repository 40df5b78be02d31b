//! `lagtrace agent` and `lagtrace diagnose --agent` across two namespaces standing for two
//! hosts (needs root): the agent runs in the lab's server namespace, diagnose runs here
//! without CAP_SYS_ADMIN (so it cannot enter the server's namespace: every server-side
//! layer has to come over the channel), and the verdict, evidence and fix equal a local
//! diagnose's of the same case. Plus the refusals and the clock offset under a known skew.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use lagtrace_lab::{Lab, LabOptions, ServerKind};
use serde_json::Value;

use common::{BIN, Foreground};

const TOKEN: &str = "test-token-0123456789abcdef";

fn name(test: &str) -> String {
    format!("ag{test}{}", std::process::id())
}

/// A running agent: its address and fingerprint.
struct Agent {
    addr: SocketAddr,
    fingerprint: String,
    out: String,
    pid: u32,
    _proc: Foreground,
}

/// Starts `lagtrace agent` in the lab's server namespace for `port`, listening on the
/// lab's server address (a free port), with `env` added.
fn agent(lab: &Lab, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Agent {
    let listen = format!("{}:0", lab.server_addr());
    let port = port.to_string();
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        &lagtrace_lab::netns_name(lab.name()),
        BIN,
        "agent",
    ])
    .args(["--listen", &listen, "--port", &port])
    .args(extra)
    .env("LAGTRACE_AGENT_TOKEN", TOKEN)
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start the agent");
    let stdout = child.stdout.take().unwrap();
    // `ip netns exec` execs the agent: the same process.
    let pid = child.id();
    let fg = Foreground(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut out = String::new();
    let (mut addr, mut fingerprint) = (None, None);
    while addr.is_none() || fingerprint.is_none() {
        let l = lines.next().expect("agent output").expect("agent output");
        out += &l;
        out.push('\n');
        if let Some(rest) = l.strip_prefix("lagtrace agent on ") {
            addr = rest.split_whitespace().next().and_then(|a| a.parse().ok());
        }
        if let Some(fp) = l.strip_prefix("fingerprint ") {
            fingerprint = Some(fp.to_string());
        }
    }
    // The rest of its output (capability lines) without blocking on it.
    std::thread::spawn(move || for _ in lines {});
    Agent {
        addr: addr.unwrap(),
        fingerprint: fingerprint.unwrap(),
        out,
        pid,
        _proc: fg,
    }
}

/// `lagtrace diagnose URL --agent ...` without CAP_SYS_ADMIN (no namespace can be entered).
fn remote_diagnose(url: &str, a: &Agent, args: &[&str]) -> (i32, Value, String) {
    let _turn = lagtrace_testkit::measuring();
    let home = tempfile::tempdir().unwrap();
    let addr = a.addr.to_string();
    let out = Command::new("setpriv")
        .args([
            "--bounding-set",
            "-sys_admin",
            "--inh-caps",
            "-sys_admin",
            BIN,
        ])
        .args(["diagnose", url, "--json", "-q", "--agent", &addr])
        .args(["--agent-fingerprint", &a.fingerprint])
        .args(args)
        .env("XDG_STATE_HOME", home.path())
        .env("LAGTRACE_AGENT_TOKEN", TOKEN)
        .output()
        .expect("run lagtrace");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let j = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), j, stderr)
}

/// What must be equal between a local and a remote diagnose: cause, mechanism, fix and
/// the evidence for and against (stance and layer; their figures are the run's). Notes
/// (`note` stance: context such as how busy the load generator's host was) differ between
/// any two runs and are left out.
fn verdict_shape(j: &Value) -> (Value, Value, Value, Vec<String>) {
    let v = &j["verdict"];
    let mut ev: Vec<String> = j["evidence"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["stance"] != "note")
                .map(|e| format!("{} {}", e["stance"], e["layer"]))
                .collect()
        })
        .unwrap_or_default();
    ev.sort();
    (
        v["cause"].clone(),
        v["mechanism"].clone(),
        v["fix"].clone(),
        ev,
    )
}

fn status<'a>(j: &'a Value, l: &str) -> &'a str {
    j["layers"][l]["status"].as_str().unwrap_or("?")
}

fn reason<'a>(j: &'a Value, l: &str) -> &'a str {
    j["layers"][l]["reason"].as_str().unwrap_or("")
}

/// Every server-side layer (packets, sockets, host) came over the channel: `ok` or
/// `finding`; `what` says which run failed.
fn server_layers_ran(j: &Value, what: &str, err: &str) {
    for l in ["packets", "sockets", "host"] {
        assert!(
            matches!(status(j, l), "ok" | "finding"),
            "{what}: {l} {} {}\n{err}",
            status(j, l),
            reason(j, l)
        );
    }
}

/// A hop through the agent: nginx in the lab's namespace (the server's host) in front of a
/// Python backend with Nagle on. diagnose here cannot enter that namespace; the agent
/// follows nginx's own connections, captures and analyses them on its host, and sends the
/// hops with its window. The verdict is the local run's (`diagnose_hops.rs`):
/// `nagle-delayed-ack` at the backend, its pid and address in the chain — three runs.
#[test]
#[ignore = "needs root"]
fn through_the_agent_the_hop_behind_nginx_is_named_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("hop")).server(ServerKind::Builtin)).expect("lab up");
    let be = common::python_backend(&lab, 9611, true, 0.0);
    let (_nginx, _dir) = common::nginx_proxy_in_lab(&lab, 9612, 9611, "");
    let a = agent(&lab, 9612, &[], &[]);
    let url = format!("http://{}:9612/", lab.server_addr());
    for run in 1..=3 {
        let (code, j, err) = remote_diagnose(&url, &a, &["-d", "4s"]);
        let shown = || {
            format!(
                "{}\n{}",
                serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default(),
                common::evidence_lines(&j)
            )
        };
        assert_eq!(
            j["verdict"]["cause"],
            "nagle-delayed-ack",
            "run {run}: {err}\n{}",
            shown()
        );
        assert_eq!(code, 1);
        let h = &j["verdict"]["hop"];
        let at = h["at"]
            .as_u64()
            .unwrap_or_else(|| panic!("run {run}: no hop\n{}", shown())) as usize;
        assert_eq!(h["chain"][at]["pid"], u64::from(be.0.id()), "{}", shown());
        assert_eq!(h["chain"][at]["addr"], "127.0.0.1:9611", "{}", shown());
        // Every server-side layer came over the channel, the hop's packets too.
        let hop = j["layers"]["hops"]
            .as_array()
            .and_then(|h| h.iter().find(|h| h["peer"] == "127.0.0.1:9611"))
            .unwrap_or_else(|| panic!("no hop layer: {}", shown()));
        assert!(
            hop["packets"]["data"]["transactions"].as_u64() > Some(0),
            "{}",
            shown()
        );
    }
}

/// The reference case and the healthy server: the same verdict from the agent as locally.
#[test]
#[ignore = "needs root"]
fn remote_diagnose_equals_local_on_the_reference_case_and_the_healthy_server() {
    let lab = Lab::up(&LabOptions::new(&name("eq"))).expect("lab up");
    for (url, port, want) in [
        (
            lab.latency_url(),
            lab.latency_addr().port(),
            "nagle-delayed-ack",
        ),
        (lab.good_url(), lab.good_addr().port(), "healthy"),
    ] {
        let (_, local, err) = common::diagnose_json(&url, &["-d", "4s"]);
        assert_eq!(
            local["verdict"]["cause"],
            want,
            "local {url}: {err}\n{}\n{}",
            serde_json::to_string_pretty(&local["verdict"]).unwrap_or_default(),
            common::evidence_lines(&local)
        );
        // The agent's clock 2.5 s ahead: its capture must be moved onto ours to join.
        let a = agent(
            &lab,
            port,
            &[],
            &[("LAGTRACE_AGENT_TEST_SKEW_US", "2500000")],
        );
        assert!(
            a.out.contains("capabilities kept: CAP_NET_RAW"),
            "{}",
            a.out
        );
        let (_, remote, err) = remote_diagnose(&url, &a, &["-d", "4s"]);
        // Every server-side layer ran and says it came from the agent.
        server_layers_ran(&remote, &url, &err);
        for l in ["packets", "sockets", "host"] {
            assert!(
                reason(&remote, l).contains("from agent"),
                "{l}: {}",
                reason(&remote, l)
            );
        }
        assert_eq!(
            verdict_shape(&remote),
            verdict_shape(&local),
            "{url}\nremote:\n{}\nlocal:\n{}",
            common::evidence_lines(&remote),
            common::evidence_lines(&local)
        );
        // The server-side capture joined the requests: the skew was taken out (both
        // namespaces share one clock, so what is left is the join's own few ms at most).
        let join = &remote["layers"]["packets"]["data"]["joins"][0];
        assert!(join["matched"].as_u64().unwrap_or(0) > 0, "{join}");
        let theta = join["offset_us"].as_i64().expect("join offset");
        assert!(
            theta.abs() < 50_000,
            "offset left after the agent's: {theta} µs"
        );
        // The host layer's drops by reason ran there as here (BPF with the kept CAP_BPF and
        // CAP_PERFMON): the same status and scope.
        let drops = |j: &Value| {
            let d = &j["layers"]["host"]["data"]["drops"];
            (d["status"].clone(), d["data"]["scope"].clone())
        };
        assert_eq!(drops(&remote), drops(&local));
        // The on-CPU profile ran there too (CAP_BPF and CAP_PERFMON kept) and came over the
        // channel: the same status, and the server's samples in it.
        let oncpu = |j: &Value| j["layers"]["host"]["data"]["oncpu"]["status"].clone();
        assert_eq!(oncpu(&remote), oncpu(&local));
        assert_eq!(oncpu(&remote), "ok", "{}", reason(&remote, "host"));
        assert!(
            remote["layers"]["host"]["data"]["oncpu"]["data"]["samples"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{}",
            remote["layers"]["host"]["data"]["oncpu"]
        );
        // The server's socket options came over the channel: the same process and counts.
        let srv = |j: &Value| j["layers"]["sockets"]["data"]["server"]["comm"].clone();
        assert_eq!(srv(&remote), srv(&local));
    }
}

/// A raw HTTPS request to the agent with `auth` (None: no header), pinned to its
/// certificate: (status, body).
fn raw(a: &Agent, method: &str, path: &str, auth: Option<&str>, body: &[u8]) -> (u16, String) {
    raw_len(a, method, path, auth, body, body.len())
}

/// [`raw`] declaring `len` body bytes (more than sent: the agent refuses on the header).
fn raw_len(
    a: &Agent,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
    len: usize,
) -> (u16, String) {
    let (code, body) = request(a, method, path, auth, body, len, Duration::from_secs(10));
    let text = String::from_utf8_lossy(&body);
    (
        code,
        text.split("\r\n\r\n").next().unwrap_or("").to_string(),
    )
}

/// One HTTPS request to the agent, pinned to its certificate, with `auth` (None: no
/// header) and `len` declared body bytes: the status and the bytes after the head.
fn request(
    a: &Agent,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
    len: usize,
    timeout: Duration,
) -> (u16, Vec<u8>) {
    let pin = lagtrace_agent::tls::parse_fingerprint(&a.fingerprint).unwrap();
    let cfg = lagtrace_agent::tls::client_config(pin).unwrap();
    let name = rustls::pki_types::ServerName::try_from("lagtrace-agent").unwrap();
    let mut conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut tcp = TcpStream::connect(a.addr).unwrap();
    tcp.set_read_timeout(Some(timeout)).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len}\r\n"
    );
    if let Some(t) = auth {
        req += &format!("Authorization: Bearer {t}\r\n");
    }
    req += "\r\n";
    tls.write_all(req.as_bytes()).unwrap();
    tls.write_all(body).unwrap();
    let mut resp = Vec::new();
    let _ = tls.read_to_end(&mut resp);
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let code = String::from_utf8_lossy(&resp[..head_end])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, resp[head_end..].to_vec())
}

#[test]
#[ignore = "needs root"]
fn the_agent_refuses_without_disclosing_anything() {
    let lab = Lab::up(&LabOptions::new(&name("ref"))).expect("lab up");
    let port = lab.latency_addr().port();
    let a = agent(&lab, port, &["--grace", "1s"], &[]);
    // Least privilege: the agent's effective and bounding sets hold the five it needs only
    // (CAP_NET_RAW 13, CAP_SYS_PTRACE 19, CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39).
    let want = (1u64 << 13) | (1 << 19) | (1 << 21) | (1 << 38) | (1 << 39);
    // Every thread's: capability sets are per thread (the signal handler's thread too, and
    // the runtime's, up once a request was answered).
    let (code, body) = raw(&a, "GET", "/v1/clock", Some(TOKEN), b"");
    assert_eq!(code, 200, "{body}");
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{}/task", a.pid))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(tasks.len() > 2, "{tasks:?}");
    for t in &tasks {
        let status = std::fs::read_to_string(t.join("status")).unwrap();
        for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
            let v = status
                .lines()
                .find_map(|l| l.strip_prefix(set))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap();
            assert_eq!(v, want, "{} {set} {v:x}", t.display());
        }
    }
    let open = format!(r#"{{"port":{port},"window_ms":500}}"#);
    // No token, a wrong token: 401 and one generic line, whatever was asked.
    for auth in [None, Some("test-token-0123456789abcdeX"), Some("")] {
        for (m, p) in [("GET", "/v1/clock"), ("POST", "/v1/session")] {
            let (code, body) = raw(&a, m, p, auth, open.as_bytes());
            assert_eq!(
                (code, body.as_str()),
                (401, r#"{"error":"unauthorized"}"#),
                "{auth:?} {p}"
            );
        }
    }
    // Two Authorization headers, the token in either: refused alike.
    let twice = [
        format!("{TOKEN}\r\nAuthorization: Bearer not-the-token"),
        format!("not-the-token\r\nAuthorization: Bearer {TOKEN}"),
        format!("{TOKEN}\r\nAuthorization: Bearer {TOKEN}"),
    ];
    for auth in &twice {
        let (code, body) = raw(&a, "GET", "/v1/clock", Some(auth), b"");
        assert_eq!(
            (code, body.as_str()),
            (401, r#"{"error":"unauthorized"}"#),
            "{auth:?}"
        );
    }
    // The capture of an open session is the agent's alone: in memory (a memfd), nothing on a
    // filesystem another user could open; it ends with the session, and with the agent.
    {
        let (code, body) = raw(&a, "POST", "/v1/session", Some(TOKEN), open.as_bytes());
        assert_eq!(code, 201, "{body}");
        let memfds = |pid: u32| -> usize {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            std::fs::read_link(e.path()).is_ok_and(|l| {
                                l.to_string_lossy().contains("memfd:lagtrace-agent-capture")
                            })
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        // The agent's descriptor, and libpcap's own while it writes.
        assert!(memfds(a.pid) >= 1, "the session's capture in memory");
        let on_disk = |pid: u32| -> Vec<std::path::PathBuf> {
            std::fs::read_dir(std::env::temp_dir())
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("lagtrace-agent-{pid}-"))
                })
                .map(|e| e.path())
                .collect()
        };
        assert!(on_disk(a.pid).is_empty(), "{:?}", on_disk(a.pid));
        // Never finished, never asked for again: it ends by itself at its window's end
        // plus the grace period (500 ms + 1 s), its capture with it.
        std::thread::sleep(Duration::from_millis(2_500));
        assert_eq!(memfds(a.pid), 0, "the capture outlived its session");
    }
    // `diagnose --agent` with an agent that refuses its token, or none listening there: a
    // one-line error naming the agent, exit 2, before any request (never a verdict over the
    // client's side alone, as if the server's had been seen).
    let url = format!("http://{}/", lab.latency_addr());
    let addr = a.addr.to_string();
    let down = SocketAddr::new(a.addr.ip(), 9).to_string();
    for (at, token, why) in [
        (addr.as_str(), "not-the-token-0123456789abcdef", "401"),
        (down.as_str(), TOKEN, "cannot reach"),
    ] {
        let t0 = std::time::Instant::now();
        let out = Command::new(BIN)
            .args(["diagnose", &url, "--json", "-q", "-d", "2s", "--agent", at])
            .args(["--agent-fingerprint", &a.fingerprint])
            .env("LAGTRACE_AGENT_TOKEN", token)
            .output()
            .expect("run lagtrace");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{at}: {err}");
        assert!(out.stdout.is_empty(), "{at}: a verdict was printed");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("--agent {at}")) && err.contains(why),
            "{at}: {err}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{at}: {:?}",
            t0.elapsed()
        );
    }
    // Another port's owner: refused, no session.
    let other = format!(r#"{{"port":{},"window_ms":500}}"#, lab.good_addr().port());
    let (code, body) = raw(&a, "POST", "/v1/session", Some(TOKEN), other.as_bytes());
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("nginx") && !body.contains("pid"), "{body}");
    // Garbage JSON, an oversized body, an unknown endpoint: clear errors.
    let (code, body) = raw(&a, "POST", "/v1/session", Some(TOKEN), b"\x00\xffgarbage");
    assert_eq!(code, 400, "{body}");
    assert!(body.starts_with(r#"{"error":"bad request"#), "{body}");
    let (code, body) = raw_len(&a, "POST", "/v1/session", Some(TOKEN), b"", 100_000);
    assert_eq!(
        (code, body.as_str()),
        (413, r#"{"error":"request too large"}"#)
    );
    let (code, _) = raw(&a, "GET", "/etc/passwd", Some(TOKEN), b"");
    assert_eq!(code, 404);
    // Garbage bytes instead of TLS: the connection ends, nothing but a TLS alert comes back.
    let mut tcp = TcpStream::connect(a.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.write_all(b"GET /v1/clock HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut back = Vec::new();
    let _ = tcp.read_to_end(&mut back);
    assert!(
        back.len() < 16 && !String::from_utf8_lossy(&back).contains("error"),
        "{back:?}"
    );
    // An expired session: its window (500 ms) and grace (1 s) past, it is gone.
    let id = open_session(&a, &open);
    std::thread::sleep(Duration::from_millis(2_000));
    let (code, body) = raw(
        &a,
        "POST",
        &format!("/v1/session/{id}/finish"),
        Some(TOKEN),
        b"",
    );
    assert_eq!(code, 410, "{body}");
    // A wrong session id: 404.
    let (code, _) = raw(&a, "GET", "/v1/session/0123/sockets", Some(TOKEN), b"");
    assert_eq!(code, 404);
    // Rate limit (1/s, bursts of 2): beyond the burst, 429 and nothing else. A flood
    // without the token is limited on its own budget: the caller with the token is still
    // served right after it.
    let slow = agent(&lab, port, &["--rate", "1"], &[]);
    let too_many = |replies: &[(u16, String)]| {
        replies
            .iter()
            .any(|(c, b)| *c == 429 && b == r#"{"error":"too many requests"}"#)
    };
    let flood: Vec<(u16, String)> = (0..8)
        .map(|_| {
            raw(
                &slow,
                "GET",
                "/v1/clock",
                Some("not-the-token-0123456789"),
                b"",
            )
        })
        .collect();
    assert!(too_many(&flood), "{flood:?}");
    assert!(
        flood.iter().all(|(c, _)| matches!(c, 401 | 429)),
        "{flood:?}"
    );
    let (code, body) = raw(&slow, "GET", "/v1/clock", Some(TOKEN), b"");
    assert_eq!(code, 200, "after a flood without the token: {body}");
    let replies: Vec<(u16, String)> = (0..8)
        .map(|_| raw(&slow, "GET", "/v1/clock", Some(TOKEN), b""))
        .collect();
    assert!(too_many(&replies), "{replies:?}");
}

/// [`raw`] with the token and the body as bytes (a capture).
fn raw_bytes(a: &Agent, method: &str, path: &str) -> (u16, Vec<u8>) {
    request(
        a,
        method,
        path,
        Some(TOKEN),
        b"",
        0,
        Duration::from_secs(20),
    )
}

/// Opens a session with the request body `open` (201 expected): its id.
fn open_session(a: &Agent, open: &str) -> String {
    let (code, body) = raw(a, "POST", "/v1/session", Some(TOKEN), open.as_bytes());
    assert_eq!(code, 201, "{body}");
    let id: Value = serde_json::from_str(&body).unwrap();
    id["session"].as_str().unwrap().to_string()
}

/// Finishes session `id` (waiting for its window's end) and writes the capture the agent
/// serves to `dir/served.pcap`: its path.
fn served_pcap(a: &Agent, id: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let (code, body) = raw(
        a,
        "POST",
        &format!("/v1/session/{id}/finish"),
        Some(TOKEN),
        b"",
    );
    assert_eq!(code, 200, "{body}");
    let (code, pcap) = raw_bytes(a, "GET", &format!("/v1/session/{id}/pcap"));
    assert_eq!(code, 200);
    let f = dir.join("served.pcap");
    std::fs::write(&f, &pcap).unwrap();
    f
}

/// The served capture holds the caller's connections to the served port and nothing else
/// (issue 33): not the caller's connection from a client port equal to the served port to
/// another listener, not the server host's own connection to the caller's port of that
/// number — both matched the old `tcp port P and host CALLER`. Checked with tshark on the
/// capture the agent served.
#[test]
#[ignore = "needs root"]
fn the_served_capture_holds_only_the_callers_connections_to_the_port() {
    use std::net::{IpAddr, TcpListener};
    let lab = Lab::up(&LabOptions::new(&name("flt"))).expect("lab up");
    let p = lab.latency_addr().port();
    let a = agent(&lab, p, &[], &[]);
    let id = open_session(
        &a,
        &format!(r#"{{"port":{p},"window_ms":1500,"no_hops":true}}"#),
    );
    let get = |s: &mut TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        assert!(
            b.starts_with(b"HTTP/1.1"),
            "{:?}",
            String::from_utf8_lossy(&b)
        );
    };
    // The caller's own request to the served port: in.
    get(&mut TcpStream::connect(lab.latency_addr()).unwrap());
    // The caller's connection from client port P to another listener (port 80): out.
    let other = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    other.set_reuse_address(true).unwrap();
    other
        .bind(&SocketAddr::new(IpAddr::V4(lab.client_addr()), p).into())
        .unwrap();
    other.connect(&lab.good_addr().into()).unwrap();
    get(&mut TcpStream::from(other));
    // The server host's own connection to the caller's port P: out.
    let listener = TcpListener::bind((lab.client_addr(), p)).unwrap();
    let ns = lagtrace_lab::netns_name(lab.name());
    let to = format!("{}", lab.client_addr());
    let dial = Command::new("ip")
        .args(["netns", "exec", &ns, "python3", "-c"])
        .arg(format!(
            "import socket; s = socket.create_connection(('{to}', {p}), 5); \
             s.sendall(b'out'); s.close()"
        ))
        .output()
        .expect("dial from the server's namespace");
    assert!(dial.status.success(), "{dial:?}");
    let (mut c, _) = listener.accept().unwrap();
    let mut b = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = c.read_to_end(&mut b);
    assert_eq!(b, b"out");
    // The window ends; the capture is served.
    let dir = tempfile::tempdir().unwrap();
    let f = served_pcap(&a, &id, dir.path());
    let out = Command::new("tshark")
        .args(["-r", f.to_str().unwrap(), "-T", "fields"])
        .args([
            "-e",
            "ip.src",
            "-e",
            "tcp.srcport",
            "-e",
            "ip.dst",
            "-e",
            "tcp.dstport",
        ])
        .output()
        .expect("tshark");
    assert!(out.status.success(), "{out:?}");
    let caller = lab.client_addr().to_string();
    let server = lab.server_addr().to_string();
    let rows: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect();
    assert!(
        rows.len() >= 6,
        "the caller's own request is served: {rows:?}"
    );
    let ps = p.to_string();
    for r in &rows {
        let toward = r[0] == caller && r[2] == server && r[3] == ps;
        let back = r[0] == server && r[1] == ps && r[2] == caller;
        assert!(
            toward || back,
            "not the caller's connection to port {p}: {r:?}"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn the_clock_offset_estimate_holds_a_known_skew_within_its_uncertainty() {
    let lab = Lab::up(&LabOptions::new(&name("clk"))).expect("lab up");
    let port = lab.latency_addr().port();
    for skew_us in [2_500_000i64, -730_000] {
        let a = agent(
            &lab,
            port,
            &[],
            &[("LAGTRACE_AGENT_TEST_SKEW_US", &skew_us.to_string())],
        );
        let pin = lagtrace_agent::tls::parse_fingerprint(&a.fingerprint).unwrap();
        let token = lagtrace_agent::auth::Token::new(TOKEN).unwrap();
        let c = lagtrace_agent::AgentClient::new(a.addr, pin, token).unwrap();
        for _ in 0..3 {
            let o = c.clock_offset().expect("clock offset");
            let err = (o.offset_ns - skew_us * 1000).abs();
            assert!(err <= o.uncertainty_ns, "skew {skew_us} µs: {o:?}");
            // On one machine the round trip is well under 10 ms.
            assert!(o.uncertainty_ns < 10_000_000, "{o:?}");
        }
        // A wrong pin: no connection at all.
        let bad = lagtrace_agent::AgentClient::new(
            a.addr,
            [7u8; 32],
            lagtrace_agent::auth::Token::new(TOKEN).unwrap(),
        )
        .unwrap();
        let e = bad.clock_offset().unwrap_err().to_string();
        assert!(e.contains("fingerprint") || e.contains("TLS"), "{e}");
    }
}

/// Attack clients without the token, each a thread that runs until the guard is dropped.
struct Attack {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Attack {
    fn new() -> Attack {
        Attack {
            stop: Default::default(),
            threads: Vec::new(),
        }
    }

    fn spawn(&mut self, f: impl FnOnce(&std::sync::atomic::AtomicBool) + Send + 'static) {
        let stop = self.stop.clone();
        self.threads.push(std::thread::spawn(move || f(&stop)));
    }
}

impl Drop for Attack {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A TCP connection to `to` from `from` (port chosen by the kernel), or none.
fn connect_from(from: std::net::IpAddr, to: SocketAddr) -> Option<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    s.bind(&SocketAddr::new(from, 0).into()).ok()?;
    s.connect_timeout(&to.into(), Duration::from_secs(1)).ok()?;
    Some(s.into())
}

/// `n` connections from `from` kept open — idle (`drip` false: nothing sent, a TLS handshake
/// never started) or a slowloris (`drip`: a TLS record header's bytes one a second, never
/// finished) — each opened again as soon as the agent closes it.
fn hold(
    stop: &std::sync::atomic::AtomicBool,
    from: Vec<std::net::IpAddr>,
    to: SocketAddr,
    n: usize,
    drip: bool,
) {
    use std::sync::atomic::Ordering;
    let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let hello = [
        0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    let mut tick = 0usize;
    while !stop.load(Ordering::Relaxed) {
        for (i, c) in conns.iter_mut().enumerate() {
            let alive = c.as_mut().is_some_and(|s| {
                let _ = s.set_nonblocking(true);
                let mut b = [0u8; 64];
                match s.read(&mut b) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                }
            });
            if !alive {
                *c = connect_from(from[i % from.len()], to);
            }
            if drip && let Some(s) = c.as_mut() {
                let _ = s.write_all(&hello[tick % hello.len()..tick % hello.len() + 1]);
            }
        }
        tick += 1;
        for _ in 0..10 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A TLS client without the token sending `GET /v1/clock` every 4 s on a keep-alive
/// connection, connecting again whenever the agent closes it.
fn unauthenticated_loop(
    stop: &std::sync::atomic::AtomicBool,
    from: std::net::IpAddr,
    a: SocketAddr,
    fingerprint: String,
) {
    use std::sync::atomic::Ordering;
    let pin = lagtrace_agent::tls::parse_fingerprint(&fingerprint).unwrap();
    let cfg = lagtrace_agent::tls::client_config(pin).unwrap();
    while !stop.load(Ordering::Relaxed) {
        let Some(mut tcp) = connect_from(from, a) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
        let name = rustls::pki_types::ServerName::try_from("lagtrace-agent").unwrap();
        let mut conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        while !stop.load(Ordering::Relaxed) {
            if tls
                .write_all(b"GET /v1/clock HTTP/1.1\r\nHost: x\r\n\r\n")
                .is_err()
            {
                break;
            }
            let mut b = [0u8; 4096];
            match tls.read(&mut b) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
            for _ in 0..40 {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Issue 33's lockout: floods without the token — 500 idle connections, a slowloris of
/// 500, 64 keep-alive loops of refused requests (a TLS handshake again after each
/// refusal), each from a hundred addresses — while a caller
/// with the token diagnoses through the agent: every server-side layer comes over the
/// channel, every time (the agent held 64 connections in all, and an unauthenticated one
/// lived a minute past the window: each of these left 0 of 10 requests served).
#[test]
#[ignore = "needs root"]
fn floods_without_the_token_do_not_lock_the_caller_out() {
    let lab = Lab::up(&LabOptions::new(&name("lo"))).expect("lab up");
    let ns = lagtrace_lab::netns_name(lab.name());
    // A hundred more client addresses, routed back from the server's namespace (removed
    // with the lab's veth).
    let n = (std::process::id() % 200) as u8 + 20;
    let from: Vec<std::net::IpAddr> = (1..=100u8)
        .map(|i| std::net::IpAddr::from([10, 249, n, i]))
        .collect();
    lagtrace_testkit::sh(&[
        "sh",
        "-c",
        &format!(
            "for i in $(seq 1 100); do ip addr add 10.249.{n}.$i/32 dev {}; done",
            lab.client_iface()
        ),
    ]);
    lagtrace_testkit::in_ns(
        &ns,
        &[
            "ip",
            "route",
            "add",
            &format!("10.249.{n}.0/24"),
            "dev",
            lab.server_iface(),
        ],
    );
    let a = agent(&lab, lab.good_addr().port(), &[], &[]);
    let url = lab.good_url();
    type Flood = Box<dyn Fn(&mut Attack)>;
    let floods: Vec<(&str, Flood)> = vec![
        ("500 idle connections", {
            let (f, to) = (from.clone(), a.addr);
            Box::new(move |att: &mut Attack| {
                let f = f.clone();
                att.spawn(move |s| hold(s, f, to, 500, false));
            })
        }),
        ("a slowloris of 500", {
            let (f, to) = (from.clone(), a.addr);
            Box::new(move |att: &mut Attack| {
                let f = f.clone();
                att.spawn(move |s| hold(s, f, to, 500, true));
            })
        }),
        ("64 refused keep-alive loops", {
            let (f, to, fp) = (from.clone(), a.addr, a.fingerprint.clone());
            Box::new(move |att: &mut Attack| {
                for i in 0..64 {
                    let (src, fp) = (f[i % f.len()], fp.clone());
                    att.spawn(move |s| unauthenticated_loop(s, src, to, fp));
                }
            })
        }),
    ];
    for (what, start) in &floods {
        let mut attack = Attack::new();
        start(&mut attack);
        // Let the flood take the slots first.
        std::thread::sleep(Duration::from_secs(2));
        for run in 1..=2 {
            let (code, j, err) = remote_diagnose(&url, &a, &["-d", "2s"]);
            server_layers_ran(&j, &format!("{what}, run {run}"), &err);
            let v = serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default();
            assert_eq!(code, 0, "{what}, run {run}: {err}\n{v}\n{}", evidence(&j));
            assert_eq!(
                j["verdict"]["cause"], "healthy",
                "{what}, run {run}: {err}\n{v}"
            );
        }
        drop(attack);
    }
}

/// The evidence lines, one per line (for a failure's message).
fn evidence(j: &Value) -> String {
    common::evidence_lines(j)
}

/// A body shorter than it said (with the token) no longer holds the connection: `408`
/// within the body timeout (5 s), the connection closed.
#[test]
#[ignore = "needs root"]
fn a_body_that_never_arrives_is_timed_out() {
    let lab = Lab::up(&LabOptions::new(&name("bt"))).expect("lab up");
    let a = agent(&lab, lab.good_addr().port(), &[], &[]);
    let t = std::time::Instant::now();
    let (code, body) = request(
        &a,
        "POST",
        "/v1/session",
        Some(TOKEN),
        b"{\"port\":",
        100,
        Duration::from_secs(20),
    );
    let took = t.elapsed();
    assert_eq!(code, 408, "{}", String::from_utf8_lossy(&body));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// The agent lost mid-run (SIGKILL during the window): the layers it was to give are
/// errors naming the agent, each named in the evidence, and the verdict over the client's
/// side alone is never at high confidence.
#[test]
#[ignore = "needs root"]
fn an_agent_lost_mid_run_leaves_its_layers_failed_and_the_verdict_unsure() {
    let lab = Lab::up(&LabOptions::new(&name("mr"))).expect("lab up");
    let a = agent(&lab, lab.good_addr().port(), &[], &[]);
    let url = lab.good_url();
    let pid = a.pid;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2_500));
        // SAFETY: kill(2) on the agent this test started (still its child: not reaped).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let (code, j, err) = remote_diagnose(&url, &a, &["-d", "4s"]);
    killer.join().unwrap();
    for l in ["packets", "sockets", "host"] {
        assert_eq!(status(&j, l), "error", "{l}: {}\n{err}", reason(&j, l));
        assert!(reason(&j, l).contains("agent"), "{l}: {}", reason(&j, l));
        assert!(!reason(&j, l).contains("applied"), "{l}: {}", reason(&j, l));
        assert!(
            j["evidence"].as_array().is_some_and(|e| e.iter().any(
                |e| e["layer"] == l && e["text"].as_str().is_some_and(|t| t.contains("error"))
            )),
            "{l} not named in the evidence: {}",
            common::evidence_lines(&j)
        );
    }
    assert_ne!(j["verdict"]["confidence"], "high", "{err}");
    assert!(matches!(code, 0 | 1), "exit {code}: {err}");
}

/// Least privilege, as /proc shows it on every thread of a running agent: no_new_privs
/// set (no exec regains a privilege), and no capability beyond the listed five (CAP_NET_RAW,
/// CAP_SYS_PTRACE, CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) in its effective, permitted or
/// bounding set, and a seccomp filter on each. (Every other agent test runs the agent under
/// that filter: a refused call a layer needed would fail them.)
#[test]
#[ignore = "needs root"]
fn every_agent_thread_runs_with_no_new_privs_and_only_the_listed_capabilities() {
    let lab = Lab::up(&LabOptions::new(&name("np"))).expect("lab up");
    let a = agent(&lab, lab.good_addr().port(), &[], &[]);
    // CAP_NET_RAW 13, CAP_SYS_ADMIN 21, CAP_SYS_PTRACE 19, CAP_PERFMON 38, CAP_BPF 39.
    let listed: u64 = [13u32, 19, 21, 38, 39].iter().map(|b| 1u64 << b).sum();
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{}/task", a.pid))
        .unwrap()
        .flatten()
        .collect();
    assert!(tasks.len() >= 2, "the agent's runtime threads");
    for t in tasks {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|| panic!("{k} in {status}"))
        };
        assert_eq!(field("NoNewPrivs:"), "1", "{}", t.path().display());
        // Mode 2: a filter (crates/agent/src/seccomp.rs; its own test shows the refusals).
        assert_eq!(field("Seccomp:"), "2", "{}", t.path().display());
        for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
            let v = u64::from_str_radix(&field(set), 16).unwrap();
            assert_eq!(v & !listed, 0, "{set} {v:x} of {}", t.path().display());
        }
    }
}

/// Two listeners on one port on the agent's host: the server on the lab's address and another
/// process on 127.0.0.1. The agent's sockets and host layers name the same process — the one
/// its caller reaches (a caller from another host never reaches a loopback listener).
#[test]
#[ignore = "needs root"]
fn through_the_agent_a_loopback_listener_on_the_port_is_not_the_server() {
    let lab = Lab::up(&LabOptions::new(&name("two"))).expect("lab up");
    let dir = tempfile::tempdir().expect("tempdir");
    let port = 9312;
    let (server, _decoy) = common::listener_and_loopback_decoy(&lab, dir.path(), port);
    let a = agent(&lab, port, &[], &[]);
    let url = format!("http://{}:{port}/", lab.server_addr());
    let (_, j, err) = remote_diagnose(&url, &a, &["-d", "2s"]);
    let want = Value::from(server.0.id());
    assert_eq!(
        j["layers"]["sockets"]["data"]["server"]["pid"], want,
        "{err}"
    );
    assert_eq!(j["layers"]["host"]["data"]["scope"]["pid"], want, "{err}");
}

/// The served capture holds the connections to the listener the caller names (`"addr"`) and
/// not another process's listener on the same port at another of the host's addresses —
/// the caller's connection to that one was in the capture while the filter knew only the
/// caller and the port. Checked with tshark on the capture the agent served.
#[test]
#[ignore = "needs root"]
fn the_served_capture_leaves_out_another_listener_on_the_port_at_another_address() {
    let lab = Lab::up(&LabOptions::new(&name("adr"))).expect("lab up");
    let ns = lagtrace_lab::netns_name(lab.name());
    // A second address on the server's side, routed from here through the lab's link (the
    // route goes with the lab's client device).
    let u = lagtrace_testkit::unique();
    let extra = format!("198.18.{}.{}", (u >> 8) % 256, u % 254 + 1);
    lagtrace_testkit::in_ns(
        &ns,
        &[
            "ip",
            "addr",
            "add",
            &format!("{extra}/32"),
            "dev",
            lab.server_iface(),
        ],
    );
    lagtrace_testkit::sh(&[
        "ip",
        "route",
        "replace",
        &format!("{extra}/32"),
        "via",
        &lab.server_addr().to_string(),
        "dev",
        lab.client_iface(),
    ]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    let p: u16 = 9313;
    let ps = p.to_string();
    let server_addr = lab.server_addr().to_string();
    let _server = common::start_in_lab(
        &lab,
        dir.path(),
        &["python3", "-m", "http.server", "--bind", &server_addr, &ps],
        p,
    );
    let _other = common::spawn_in_lab(
        &lab,
        dir.path(),
        &["python3", "-m", "http.server", "--bind", &extra, &ps],
    );
    let other_at: SocketAddr = format!("{extra}:{p}").parse().unwrap();
    common::wait_listening(other_at, "the other listener");
    let a = agent(&lab, p, &[], &[]);
    let id = open_session(
        &a,
        &format!(r#"{{"port":{p},"window_ms":1500,"no_hops":true,"addr":"{server_addr}"}}"#),
    );
    let get = |to: SocketAddr| {
        let mut s = TcpStream::connect(to).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        assert!(
            b.starts_with(b"HTTP/1."),
            "{:?}",
            String::from_utf8_lossy(&b)
        );
    };
    get(SocketAddr::new(lab.server_addr().into(), p));
    get(other_at);
    let f = served_pcap(&a, &id, dir.path());
    let rows = lagtrace_testkit::tshark_fields(&f, None, &["ip.src", "ip.dst"]);
    assert!(
        rows.len() >= 6,
        "the caller's own request is served: {rows:?}"
    );
    for r in &rows {
        assert!(
            r.contains(&server_addr) && !r.contains(&extra),
            "not the caller's connection to {server_addr}:{p}: {r:?}"
        );
    }
}
