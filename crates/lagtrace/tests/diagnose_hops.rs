//! `lagtrace diagnose` follows the request behind the server (issue 25): real nginx from
//! Debian proxying to a real Python backend in a lab namespace, the fault on the backend's
//! side of the loopback hop. The hop is found from nginx's own sockets (never from a port),
//! captured on the namespace's loopback, and judged with the same rules. Needs root.

mod common;

use std::path::Path;

use lagtrace_lab::{Lab, LabOptions, ServerKind};
use serde_json::Value;

use common::{Foreground, diagnose_json, evidence_lines, python_server, start_in_lab};

fn name(test: &str) -> String {
    format!("hp{test}{}", std::process::id() % 100_000)
}

/// nginx in `lab` on `listen`, proxying to 127.0.0.1:`upstream` over a keep-alive pool (as
/// production configurations do); `server_extra` goes into the server block.
fn nginx_proxy(
    lab: &Lab,
    listen: u16,
    upstream: u16,
    server_extra: &str,
) -> (Foreground, tempfile::TempDir) {
    nginx_in_lab(
        lab,
        listen,
        &format!("upstream app {{ server 127.0.0.1:{upstream}; keepalive 64; }}"),
        server_extra,
        "proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\";",
    )
}

/// nginx in `lab` on `listen` (one process, its files in a temporary directory) with
/// `http_extra` in the http block, `server_extra` in the server block and `location` as
/// the directives of `location /`.
fn nginx_in_lab(
    lab: &Lab,
    listen: u16,
    http_extra: &str,
    server_extra: &str,
    location: &str,
) -> (Foreground, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let conf = format!(
        "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/px;\n\
         fastcgi_temp_path {d}/fc; uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
         {http_extra}\n\
         server {{ listen {listen}; {server_extra} location / {{ {location} }} }} }}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let conf = format!("{d}/nginx.conf");
    let fg = start_in_lab(lab, dir.path(), &["nginx", "-p", &d, "-c", &conf], listen);
    (fg, dir)
}

/// The Python backend on `port`: `nagle` leaves Nagle on (its head and body are two small
/// writes), `think` seconds before each answer.
fn backend(lab: &Lab, port: u16, nagle: bool, think: f64) -> Foreground {
    let on_connect = if nagle {
        "self.disable_nagle_algorithm = False"
    } else {
        "pass"
    };
    let on_request = if think > 0.0 {
        format!("time.sleep({think})")
    } else {
        "pass".into()
    };
    let script = python_server("", on_connect, &on_request);
    start_in_lab(
        lab,
        Path::new("/"),
        &["python3", "-c", &script, &port.to_string()],
        port,
    )
}

fn show(j: &Value) -> String {
    serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default() + "\n" + &evidence_lines(j)
}

/// The hop named in the verdict: (its process name, pid, address).
fn hop_at(j: &Value) -> Option<(String, u64, String)> {
    let h = &j["verdict"]["hop"];
    let at = h["at"].as_u64()? as usize;
    let n = &h["chain"][at];
    Some((
        n["name"].as_str()?.to_string(),
        n["pid"].as_u64()?,
        n["addr"].as_str()?.to_string(),
    ))
}

/// Asserts that run `run`'s verdict is `cause` with `verdict.hop` at the backend `be`
/// listening on `addr`; its process name.
fn assert_at_backend(
    j: &Value,
    err: &str,
    run: u32,
    cause: &str,
    be: &Foreground,
    addr: &str,
) -> String {
    assert_eq!(
        j["verdict"]["cause"],
        cause,
        "run {run}: {err}\n{}",
        show(j)
    );
    let (who, pid, at) = hop_at(j).unwrap_or_else(|| panic!("run {run}: no hop\n{}", show(j)));
    assert_eq!(pid, u64::from(be.0.id()), "run {run}: {}", show(j));
    assert_eq!(at, addr);
    who
}

/// The regression of issue 25: nginx → a Python backend with Nagle on and two small writes
/// per response. Every request waits for nginx's delayed ACK on the loopback hop; the
/// client-facing capture sees only nginx's server time. The verdict names Nagle at the
/// backend, with its pid and address, and the fix is the backend's — three runs of three.
#[test]
#[ignore = "needs root"]
fn nagle_on_the_backend_behind_nginx_is_named_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("ng")).server(ServerKind::Builtin)).expect("lab up");
    let be = backend(&lab, 9411, true, 0.0);
    let (_nginx, _dir) = nginx_proxy(&lab, 9412, 9411, "");
    let url = format!("http://{}:9412/", lab.server_addr());
    let report = tempfile::tempdir().expect("tempdir");
    let html = report.path().join("r.html").display().to_string();
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s", "--report", &html]);
        let who = assert_at_backend(&j, &err, run, "nagle-delayed-ack", &be, "127.0.0.1:9411");
        assert_eq!(code, 1);
        assert!(who.starts_with("python"), "{who}");
        let pid = be.0.id();
        let chain = j["verdict"]["hop"]["text"].as_str().unwrap();
        assert!(chain.starts_with("client → nginx (pid "), "{chain}");
        let fix = &j["verdict"]["fix"][0];
        assert!(
            fix["location"]
                .as_str()
                .unwrap_or("")
                .contains("127.0.0.1:9411"),
            "the fix is the backend's: {fix}"
        );
        // The hop's evidence in the JSON: its packets hold the Nagle stalls.
        let hop = j["layers"]["hops"]
            .as_array()
            .and_then(|h| h.iter().find(|h| h["peer"] == "127.0.0.1:9411"))
            .unwrap_or_else(|| panic!("no hop layer: {}", show(&j)));
        assert_eq!(hop["from"]["comm"], "nginx");
        assert_eq!(hop["to"]["pid"], u64::from(be.0.id()));
        // The HTML report draws the chain with the backend marked.
        let page = std::fs::read_to_string(&html).expect("the report");
        let marked = format!("<mark class=\"at\">{who} (pid {pid}) 127.0.0.1:9411</mark>");
        assert!(page.contains(&marked), "{marked} not in the report's chain");
    }
}

/// A backend that thinks 30 ms per request: `slow-server` at the backend (its pid), not at
/// nginx — the proxy's own time is small.
#[test]
#[ignore = "needs root"]
fn a_slow_backend_behind_nginx_is_slow_server_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("sl")).server(ServerKind::Builtin)).expect("lab up");
    let be = backend(&lab, 9421, false, 0.03);
    let (_nginx, _dir) = nginx_proxy(&lab, 9422, 9421, "");
    let url = format!("http://{}:9422/", lab.server_addr());
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_at_backend(&j, &err, run, "slow-server", &be, "127.0.0.1:9421");
    }
}

/// Negative control: the same chain with a backend that answers at once with TCP_NODELAY on
/// is healthy, and no hop is blamed.
#[test]
#[ignore = "needs root"]
fn a_healthy_chain_is_healthy_and_blames_no_hop() {
    let lab = Lab::up(&LabOptions::new(&name("ok")).server(ServerKind::Builtin)).expect("lab up");
    let _be = backend(&lab, 9431, false, 0.0);
    let (_nginx, _dir) = nginx_proxy(&lab, 9432, 9431, "");
    let url = format!("http://{}:9432/", lab.server_addr());
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_eq!(
            j["verdict"]["cause"],
            "healthy",
            "run {run}: {err}\n{}",
            show(&j)
        );
        assert_eq!(code, 0);
        assert!(j["verdict"]["hop"].is_null(), "{}", show(&j));
        // The hop was found and looked at all the same.
        assert!(
            j["layers"]["hops"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h["peer"] == "127.0.0.1:9431")),
            "{}",
            serde_json::to_string(&j["layers"]["hops"]).unwrap()
        );
    }
}

/// The same Nagle fault behind HAProxy (Debian's): nothing in the hop code is nginx's.
#[test]
#[ignore = "needs root"]
fn nagle_on_the_backend_behind_haproxy_is_named_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("ha")).server(ServerKind::Builtin)).expect("lab up");
    let be = backend(&lab, 9441, true, 0.0);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        "global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 5s\n  \
         timeout client 30s\n  timeout server 30s\nfrontend f\n  bind :9442\n  \
         default_backend b\nbackend b\n  server s1 127.0.0.1:9441\n",
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let _ha = start_in_lab(&lab, dir.path(), &["haproxy", "-db", "-f", &cfg], 9442);
    let url = format!("http://{}:9442/", lab.server_addr());
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_at_backend(&j, &err, run, "nagle-delayed-ack", &be, "127.0.0.1:9441");
        assert_eq!(code, 1);
        let chain = j["verdict"]["hop"]["text"].as_str().unwrap();
        assert!(chain.starts_with("client → haproxy (pid "), "{chain}");
    }
}

/// The application's side of a Redis hop: a connection per server thread to Redis on
/// `sys.argv[2]`, and `redis_wait()` asks for a key that never comes — `BLPOP` with a
/// `sys.argv[3]`-second timeout, answered `*-1` (nil) when it runs out.
const REDIS_CLIENT: &str = r#"import socket
RP, WAIT = int(sys.argv[2]), sys.argv[3].encode()
tl = threading.local()
CMD = b"*3\r\n$5\r\nBLPOP\r\n$7\r\nnothing\r\n$%d\r\n%s\r\n" % (len(WAIT), WAIT)
def redis_wait():
    s = getattr(tl, "s", None)
    if s is None:
        s = tl.s = socket.create_connection(("127.0.0.1", RP))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(CMD)
    r = b""
    while not r.endswith(b"\r\n"):
        c = s.recv(64)
        if not c:
            raise ConnectionError("redis closed")
        r += c"#;

/// A non-HTTP upstream: an application that asks Debian's redis-server — on a port no table
/// names — for a key that never comes (`BLPOP` timing out after 30 ms) on every request.
/// The wait is timed on the hop by its direction changes and named at Redis, with its pid;
/// the added time is the injected 30 ms within ±20 %.
#[test]
#[ignore = "needs root"]
fn a_slow_redis_command_behind_the_application_is_named_at_the_redis_hop() {
    let lab = Lab::up(&LabOptions::new(&name("rd")).server(ServerKind::Builtin)).expect("lab up");
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = start_in_lab(
        &lab,
        dir.path(),
        &[
            "redis-server",
            "--port",
            "9451",
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            // Redis ends a blocked client's timeout on its cron, 10 times a second by
            // default (a 30 ms BLPOP then waits ~100 ms); at its highest rate, within 2 ms.
            "--hz",
            "500",
        ],
        9451,
    );
    let app = python_server(REDIS_CLIENT, "pass", "redis_wait()");
    let _app = start_in_lab(
        &lab,
        Path::new("/"),
        &["python3", "-c", &app, "9452", "9451", "0.03"],
        9452,
    );
    let url = format!("http://{}:9452/", lab.server_addr());
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "4s"]);
        let who = assert_at_backend(&j, &err, run, "slow-server", &redis, "127.0.0.1:9451");
        assert_eq!(who, "redis-server", "run {run}: {}", show(&j));
        let added = j["verdict"]["cost"]["added_us"].as_u64().unwrap_or(0);
        assert!(
            (24_000..=36_000).contains(&added),
            "run {run}: added {added} µs for a 30 ms wait\n{}",
            show(&j)
        );
    }
}

/// `proxies` nginx in a row in front of the Python backend with Nagle on: every hop but the
/// last shows only the next nginx's time; the watch follows each nginx's own connections,
/// and the verdict is at the last hop, with the whole way in the chain — three runs of three.
fn nagle_behind_proxies_is_named_at_the_last_hop(tag: &str, proxies: u16) {
    let lab = Lab::up(&LabOptions::new(&name(tag)).server(ServerKind::Builtin)).expect("lab up");
    let base = 9460 + 10 * proxies;
    let be = backend(&lab, base, true, 0.0);
    // Started back to front: each proxies to the one started before it.
    let nginx: Vec<_> = (1..=proxies)
        .map(|i| nginx_proxy(&lab, base + i, base + i - 1, ""))
        .collect();
    let url = format!("http://{}:{}/", lab.server_addr(), base + proxies);
    let addr = format!("127.0.0.1:{base}");
    // client, then the front nginx … the last, then the backend.
    let mut want: Vec<Option<u64>> = vec![None];
    want.extend(nginx.iter().rev().map(|(n, _)| Some(u64::from(n.0.id()))));
    want.push(Some(u64::from(be.0.id())));
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_at_backend(&j, &err, run, "nagle-delayed-ack", &be, &addr);
        assert_eq!(code, 1);
        let chain = j["verdict"]["hop"]["chain"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let pids: Vec<Option<u64>> = chain.iter().map(|n| n["pid"].as_u64()).collect();
        assert_eq!(pids, want, "run {run}: {}", show(&j));
        // Each proxy behind the front one is named at the address it listens on.
        for (i, n) in chain
            .iter()
            .enumerate()
            .skip(2)
            .take(usize::from(proxies) - 1)
        {
            let port = base + proxies - (i as u16 - 1);
            assert_eq!(n["addr"], format!("127.0.0.1:{port}"), "{}", show(&j));
        }
    }
}

/// Two hops: nginx → nginx → Python (Nagle on): named at the last hop.
#[test]
#[ignore = "needs root"]
fn nagle_two_hops_behind_is_named_at_the_last_hop() {
    nagle_behind_proxies_is_named_at_the_last_hop("2h", 2);
}

/// Three hops: nginx → nginx → nginx → Python (Nagle on): named at the last hop.
#[test]
#[ignore = "needs root"]
fn nagle_three_hops_behind_is_named_at_the_last_hop() {
    nagle_behind_proxies_is_named_at_the_last_hop("3h", 3);
}

/// nginx without upstream keep-alive (a connection per request) in front of `python3 -m
/// http.server` (listen backlog 5): under nginx's concurrency the backend's accept queue
/// overflows; some upstream connects wait for a SYN or SYN-ACK retransmission, and some
/// requests sent on a handshake the full queue never completed wait for their resend (in
/// the hop's packets alone that reads as loss: the cause varied between `syn-drop` and
/// `packet-loss` until the hop read the backend listener's own drop count). Now `syn-drop`
/// with mechanism `accept-queue-overflow` at the backend, its listener's drops in the
/// evidence, nginx's upstream keep-alive first in the fix and the backlog after — on every
/// run.
#[test]
#[ignore = "needs root"]
fn a_backend_listener_overflowing_behind_nginx_is_syn_drop_at_the_hop() {
    let lab = Lab::up(&LabOptions::new(&name("sd")).server(ServerKind::Builtin)).expect("lab up");
    let web = tempfile::tempdir().expect("tempdir");
    std::fs::write(web.path().join("index.html"), "hello\n").unwrap();
    let be = start_in_lab(
        &lab,
        web.path(),
        &["python3", "-m", "http.server", "9451", "--bind", "0.0.0.0"],
        9451,
    );
    // No upstream keep-alive: a connection per request.
    let (_nginx, _dir) = nginx_in_lab(&lab, 9452, "", "", "proxy_pass http://127.0.0.1:9451;");
    let url = format!("http://{}:9452/", lab.server_addr());
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "syn-drop", "run {run}: {err}\n{}", show(&j));
        assert_eq!(
            v["mechanism"],
            "accept-queue-overflow",
            "run {run}: {}",
            show(&j)
        );
        assert_eq!(code, 1);
        let (_, pid, addr) =
            hop_at(&j).unwrap_or_else(|| panic!("run {run}: no hop\n{}", show(&j)));
        assert_eq!(pid, u64::from(be.0.id()), "run {run}: {}", show(&j));
        assert_eq!(addr, "127.0.0.1:9451");
        let ev = evidence_lines(&j);
        assert!(
            ev.contains("the peer's listener 0.0.0.0:9451") && ev.contains("sk_drops"),
            "run {run}: {ev}"
        );
        let fixes: Vec<String> = v["fix"]
            .as_array()
            .map(|a| a.iter().map(|f| f["change"].to_string()).collect())
            .unwrap_or_default();
        assert!(fixes[0].contains("keepalive"), "run {run}: {fixes:?}");
        assert!(
            fixes.iter().any(|f| f.contains("listen backlog")),
            "run {run}: {fixes:?}"
        );
        eprintln!(
            "run {run}: {}; {}",
            v["cost"]["text"],
            ev.lines()
                .find(|l| l.contains("the peer's listener"))
                .unwrap_or("")
        );
    }
}
