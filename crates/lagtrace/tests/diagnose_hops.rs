//! `lagtrace diagnose` follows the request behind the server (issue 25): real nginx from
//! Debian proxying to a real Python backend in a lab namespace, the fault on the backend's
//! side of the loopback hop. The hop is found from nginx's own sockets (never from a port),
//! captured on the namespace's loopback, and judged with the same rules. Needs root.

mod common;

use std::path::Path;

use lagtrace_lab::{Lab, LabOptions, ServerKind};
use serde_json::Value;

use common::{
    Foreground, diagnose_json, evidence_lines, nginx_in_lab, nginx_proxy_in_lab, python_backend,
    python_server, start_in_lab,
};

fn name(test: &str) -> String {
    format!("hp{test}{}", std::process::id() % 100_000)
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

/// Run `run`'s hop layer to `peer` (panics, showing the verdict, when there is none).
fn hop_layer<'a>(j: &'a Value, peer: &str, run: u32) -> &'a Value {
    j["layers"]["hops"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["peer"] == peer))
        .unwrap_or_else(|| panic!("run {run}: no hop layer to {peer}: {}", show(j)))
}

/// A hop layer's exchanges and how many of them the upstream join matched.
fn exchanges_joined(hop: &Value) -> (u64, u64) {
    (
        hop["join"]["exchanges"].as_u64().unwrap_or(0),
        hop["join"]["joined"].as_u64().unwrap_or(0),
    )
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
    let be = python_backend(&lab, 9411, true, 0.0);
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9412, 9411, "");
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
        let hop = hop_layer(&j, "127.0.0.1:9411", run);
        assert_eq!(hop["from"]["comm"], "nginx");
        assert_eq!(hop["to"]["pid"], u64::from(be.0.id()));
        // The HTML report draws the chain with the backend marked.
        let page = std::fs::read_to_string(&html).expect("the report");
        let marked = format!("<mark class=\"at\">{who} (pid {pid}) 127.0.0.1:9411</mark>");
        assert!(page.contains(&marked), "{marked} not in the report's chain");
    }
}

/// A backend that thinks 30 ms per request: `slow-server` at the backend (its pid), not at
/// nginx — the proxy's own time (its server time less its wait on the hop) is reported, and
/// under a millisecond.
#[test]
#[ignore = "needs root"]
fn a_slow_backend_behind_nginx_is_slow_server_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("sl")).server(ServerKind::Builtin)).expect("lab up");
    let be = python_backend(&lab, 9421, false, 0.03);
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9422, 9421, "");
    let url = format!("http://{}:9422/", lab.server_addr());
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_at_backend(&j, &err, run, "slow-server", &be, "127.0.0.1:9421");
        let own = j["verdict"]["hop"]["server_own_us"].as_u64();
        eprintln!("run {run}: nginx's own time {own:?} µs");
        assert!(
            own.is_some_and(|o| o < 1_000),
            "run {run}: the proxy's own time {own:?}\n{}",
            show(&j)
        );
    }
}

/// A Python backend on `backend` that stalls 200 ms on one request in 400 (counted over the
/// whole server), behind nginx on `front`: the backend, and nginx with its config directory.
fn stalling_backend_behind_nginx(
    lab: &Lab,
    backend: u16,
    front: u16,
) -> (Foreground, (Foreground, tempfile::TempDir)) {
    let port = backend.to_string();
    let be = start_in_lab(
        lab,
        Path::new("/"),
        &[
            "python3",
            "-c",
            &common::every_nth_server(),
            &port,
            "400",
            "0.2",
        ],
        backend,
    );
    (be, nginx_proxy_in_lab(lab, front, backend, ""))
}

/// Who names what (issue 25): a backend that stalls 200 ms on one request in 400 (counted
/// over the whole server) behind nginx at c=32. The stalls are a tail past the p99 that the
/// hop's own distributions hide; the upstream join shows, request by request, that the slow
/// requests' server time at nginx was their wait on the backend. The verdict names the
/// backend (`slow-server`, `verdict.hop` at its pid and address, the fix there), not nginx.
#[test]
#[ignore = "needs root"]
fn a_rare_stall_of_the_backend_behind_nginx_is_named_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("rs")).server(ServerKind::Builtin)).expect("lab up");
    let (be, _nginx) = stalling_backend_behind_nginx(&lab, 9425, 9426);
    let url = format!("http://{}:9426/", lab.server_addr());
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "5s", "-c", "32"]);
        assert_at_backend(&j, &err, run, "slow-server", &be, "127.0.0.1:9425");
        assert!(
            j["verdict"]["tail"].is_object(),
            "run {run}: the tail is the finding\n{}",
            show(&j)
        );
        let fix = j["verdict"]["fix"][0]["location"].as_str().unwrap_or("");
        assert!(
            fix.contains("127.0.0.1:9425"),
            "run {run}: the fix is the backend's: {fix}"
        );
        eprintln!("run {run}: {}", j["verdict"]["summary"]);
    }
}

/// Negative control: the same chain with a backend that answers at once (a second nginx
/// returning a fixed body) is healthy, and no hop is blamed. Not the Python backend: at
/// c=32 its threads queue for the interpreter lock and ~0.08 % of requests wait 100–220 ms
/// (GIL switches of 5 ms behind 32 threads) — a real tail past the p99 that the join, given
/// the whole run's first stretch, sees and names.
#[test]
#[ignore = "needs root"]
fn a_healthy_chain_is_healthy_and_blames_no_hop() {
    let lab = Lab::up(&LabOptions::new(&name("ok")).server(ServerKind::Builtin)).expect("lab up");
    let (_be, _bdir) = nginx_in_lab(&lab, 9431, "", "", "return 200 \"hello\\n\";");
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9432, 9431, "");
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
    let be = python_backend(&lab, 9441, true, 0.0);
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

/// The same Nagle fault behind Apache httpd (Debian's `apache2`, `mod_proxy_http`): a third
/// proxy the hop code has no case for. One process (`-X`: its event MPM's threads in the
/// process the test started, so the guard stops all of it).
#[test]
#[ignore = "needs root"]
fn nagle_on_the_backend_behind_apache_is_named_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("ap")).server(ServerKind::Builtin)).expect("lab up");
    let be = python_backend(&lab, 9491, true, 0.0);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let m = "/usr/lib/apache2/modules";
    let conf = dir.path().join("httpd.conf");
    std::fs::write(
        &conf,
        format!(
            "LoadModule mpm_event_module {m}/mod_mpm_event.so\n\
             LoadModule authz_core_module {m}/mod_authz_core.so\n\
             LoadModule proxy_module {m}/mod_proxy.so\n\
             LoadModule proxy_http_module {m}/mod_proxy_http.so\n\
             ServerName lab\nListen 9492\nPidFile {d}/httpd.pid\nDefaultRuntimeDir {d}\n\
             ThreadLimit 64\nThreadsPerChild 64\nMaxRequestWorkers 64\n\
             ErrorLog {d}/error.log\nProxyPass / http://127.0.0.1:9491/\n"
        ),
    )
    .unwrap();
    let conf = conf.display().to_string();
    let _apache = start_in_lab(&lab, dir.path(), &["apache2", "-X", "-f", &conf], 9492);
    let url = format!("http://{}:9492/", lab.server_addr());
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_at_backend(&j, &err, run, "nagle-delayed-ack", &be, "127.0.0.1:9491");
        assert_eq!(code, 1);
        let chain = j["verdict"]["hop"]["text"].as_str().unwrap();
        assert!(chain.starts_with("client → apache2 (pid "), "{chain}");
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
    let be = python_backend(&lab, base, true, 0.0);
    // Started back to front: each proxies to the one started before it.
    let nginx: Vec<_> = (1..=proxies)
        .map(|i| nginx_proxy_in_lab(&lab, base + i, base + i - 1, ""))
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

/// Negative control: Nagle on nginx's own client-facing side (`tcp_nodelay off`, its
/// upstream unbuffered so the response head and body leave in two writes) in front of a
/// healthy backend: `nagle-delayed-ack` at the front — no hop in the verdict, the fix
/// nginx's `tcp_nodelay` — never at the backend.
#[test]
#[ignore = "needs root"]
fn nagle_on_the_front_proxy_is_named_at_the_front_not_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("fr")).server(ServerKind::Builtin)).expect("lab up");
    // Healthy (TCP_NODELAY on): the head, 2 ms, then the body — nginx, unbuffered, passes
    // them on as two writes.
    let script = python_server(
        "",
        "pass",
        "self.send_response(200)\n        self.send_header(\"Content-Length\", \"6\")\n        \
         self.end_headers()\n        time.sleep(0.002)\n        self.wfile.write(b\"hello\\n\")\n        \
         return",
    );
    let _be = start_in_lab(
        &lab,
        Path::new("/"),
        &["python3", "-c", &script, "9501"],
        9501,
    );
    let (nginx, _dir) = nginx_in_lab(
        &lab,
        9502,
        "upstream app { server 127.0.0.1:9501; keepalive 64; }",
        "tcp_nodelay off;",
        "proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; \
         proxy_buffering off;",
    );
    let url = format!("http://{}:9502/", lab.server_addr());
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_eq!(
            j["verdict"]["cause"],
            "nagle-delayed-ack",
            "run {run}: {err}\n{}",
            show(&j)
        );
        assert_eq!(code, 1);
        // At the front: no hop, or the chain's node at the front nginx itself.
        if let Some((_, pid, _)) = hop_at(&j) {
            assert_eq!(pid, u64::from(nginx.0.id()), "run {run}: {}", show(&j));
        }
        let fixes = j["verdict"]["fix"].to_string();
        assert!(fixes.contains("tcp_nodelay"), "run {run}: {fixes}");
        assert!(!fixes.contains("127.0.0.1:9501"), "run {run}: {fixes}");
    }
}

/// Negative control: a server that thinks 30 ms per request itself while holding an idle
/// connection to a backend with Nagle on (opened at start, never used — a keep-alive pool
/// at rest): `slow-server` at the server; the idle hop is found but not blamed.
#[test]
#[ignore = "needs root"]
fn an_idle_upstream_connection_is_not_blamed_for_the_servers_own_time() {
    let lab = Lab::up(&LabOptions::new(&name("id")).server(ServerKind::Builtin)).expect("lab up");
    let _be = python_backend(&lab, 9511, true, 0.0);
    let front = python_server(
        "import socket\nIDLE = socket.create_connection((\"127.0.0.1\", int(sys.argv[2])))",
        "pass",
        "time.sleep(0.03)",
    );
    let fe = start_in_lab(
        &lab,
        Path::new("/"),
        &["python3", "-c", &front, "9512", "9511"],
        9512,
    );
    let url = format!("http://{}:9512/", lab.server_addr());
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_eq!(
            j["verdict"]["cause"],
            "slow-server",
            "run {run}: {err}\n{}",
            show(&j)
        );
        if let Some((_, pid, _)) = hop_at(&j) {
            assert_eq!(pid, u64::from(fe.0.id()), "run {run}: {}", show(&j));
        }
        // The idle connection was seen all the same.
        assert!(
            j["layers"]["hops"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h["peer"] == "127.0.0.1:9511")),
            "run {run}: {}",
            serde_json::to_string(&j["layers"]["hops"]).unwrap()
        );
    }
}

/// `diagnose --pcap` on captures that hold both sides: tcpdump on `any` in the server's
/// namespace while wrk (bounded: 4 connections, 2 s) loads nginx in front of the Nagle
/// backend, nginx's upstream pool open since before the captures. The hop is found from the
/// packets alone — the server's host connected to it and its exchanges lie inside nginx's
/// requests — and named: `nagle-delayed-ack` at
/// 127.0.0.1:9521, with no process (a file names none). Three captures, the same verdict.
/// A capture of the client-facing port alone names no hop: what the file cannot show is
/// not guessed.
#[test]
#[ignore = "needs root"]
fn a_capture_holding_both_sides_names_the_hop() {
    use lagtrace_testkit::tcpdump::{stop_tcpdump, tcpdump_on, tcpdump_on_filter};
    let lab = Lab::up(&LabOptions::new(&name("pc")).server(ServerKind::Builtin)).expect("lab up");
    let _be = python_backend(&lab, 9521, true, 0.0);
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9522, 9521, "");
    let url = format!("http://{}:9522/", lab.server_addr());
    let ns = lagtrace_lab::netns_name(lab.name());
    let dir = tempfile::tempdir().expect("tempdir");
    // nginx's upstream pool opened before any capture: the hop's connections are joined
    // midway, with no SYN in the file (as an incident's capture finds them).
    let warm = std::process::Command::new("wrk")
        .args(["-t1", "-c4", "-d1s", "--timeout", "2s", &url])
        .output()
        .expect("wrk");
    assert!(warm.status.success(), "wrk: {warm:?}");
    for run in 1..=3 {
        let all = dir.path().join(format!("all{run}.pcap"));
        let front = dir.path().join(format!("front{run}.pcap"));
        {
            let _turn = lagtrace_testkit::measuring();
            let td_all = tcpdump_on_filter(Some(&ns), "any", &all, "tcp");
            let td_front = tcpdump_on(Some(&ns), "any", &front, 9522);
            let wrk = std::process::Command::new("wrk")
                .args(["-t1", "-c4", "-d2s", "--timeout", "2s", &url])
                .output()
                .expect("wrk");
            stop_tcpdump(td_all);
            stop_tcpdump(td_front);
            assert!(wrk.status.success(), "wrk: {wrk:?}");
        }
        let (code, j, err) =
            common::diagnose_cmd_json(&["--pcap", all.to_str().unwrap(), "--port", "9522"]);
        assert_eq!(
            j["verdict"]["cause"],
            "nagle-delayed-ack",
            "run {run}: {err}\n{}",
            show(&j)
        );
        assert_eq!(code, 1);
        let h = &j["verdict"]["hop"];
        let at = h["at"]
            .as_u64()
            .unwrap_or_else(|| panic!("no hop: {}", show(&j))) as usize;
        assert_eq!(
            h["chain"][at]["addr"],
            "127.0.0.1:9521",
            "run {run}: {}",
            show(&j)
        );
        assert!(h["chain"][at]["pid"].is_null(), "{}", show(&j));
        let fix = j["verdict"]["fix"][0]["location"].as_str().unwrap_or("");
        assert!(
            fix.contains("127.0.0.1:9521"),
            "run {run}: the fix is the backend's: {fix}"
        );
        if run == 1 {
            let (_, f, err) =
                common::diagnose_cmd_json(&["--pcap", front.to_str().unwrap(), "--port", "9522"]);
            assert!(f["verdict"]["hop"].is_null(), "{err}\n{}", show(&f));
            assert!(
                f["layers"]["hops"].as_array().is_none_or(|h| h.is_empty()),
                "{}",
                show(&f)
            );
            eprintln!("the client-facing port alone: {}", f["verdict"]["cause"]);
        }
    }
}

/// The same on a busy chain: tcpdump on `any` while wrk loads nginx in front of nginx at
/// c=32 for 3 s (tens of thousands of requests). The file's timings are kept as a sample past
/// a few thousand, and an exchange lies inside *some* request only among all the requests in
/// progress: judged against a sample, the hop's exchanges fell outside it and no hop was
/// found (`layers.hops` empty). The hop is found, and a healthy chain's hop is not blamed.
#[test]
#[ignore = "needs root"]
fn a_capture_of_a_busy_chain_holding_both_sides_names_the_hop() {
    use lagtrace_testkit::tcpdump::{stop_tcpdump, tcpdump_on_filter};
    let lab = Lab::up(&LabOptions::new(&name("pb")).server(ServerKind::Builtin)).expect("lab up");
    let (_be, _bdir) = nginx_in_lab(&lab, 9531, "", "", "return 200 \"hello\\n\";");
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9532, 9531, "");
    let url = format!("http://{}:9532/", lab.server_addr());
    let ns = lagtrace_lab::netns_name(lab.name());
    let dir = tempfile::tempdir().expect("tempdir");
    let all = dir.path().join("all.pcap");
    let requests = {
        let _turn = lagtrace_testkit::measuring();
        let td = tcpdump_on_filter(Some(&ns), "any", &all, "tcp");
        let wrk = std::process::Command::new("wrk")
            .args(["-t2", "-c32", "-d3s", "--timeout", "2s", &url])
            .output()
            .expect("wrk");
        stop_tcpdump(td);
        assert!(wrk.status.success(), "wrk: {wrk:?}");
        String::from_utf8_lossy(&wrk.stdout)
            .lines()
            .find_map(|l| l.trim().split(" requests in").next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(requests > 10_000, "not a busy run: {requests} requests");
    let (_, j, err) =
        common::diagnose_cmd_json(&["--pcap", all.to_str().unwrap(), "--port", "9532"]);
    let hops = j["layers"]["hops"].as_array().cloned().unwrap_or_default();
    assert!(
        hops.iter().any(|h| h["peer"] == "127.0.0.1:9531"),
        "{requests} requests: {err}\n{}\n{}",
        show(&j),
        serde_json::to_string(&j["layers"]["hops"]).unwrap()
    );
    assert!(j["verdict"]["hop"].is_null(), "{}", show(&j));
}

/// Debian's php-fpm binary (`php-fpm8.2` on bookworm: the version is in its name).
fn php_fpm() -> String {
    std::fs::read_dir("/usr/sbin")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("php-fpm"))
        .max()
        .unwrap_or_else(|| "php-fpm".into())
}

/// php-fpm (Debian's `php-fpm`) started in `lab`'s namespace with `conf`, its socket
/// under `dir`; stopped with SIGTERM (its master then stops its workers), SIGKILL after 5 s.
struct PhpFpm(std::process::Child);

impl PhpFpm {
    fn start(lab: &Lab, dir: &Path, conf: &Path) -> PhpFpm {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &lagtrace_lab::netns_name(lab.name())])
            .arg(php_fpm())
            .args(["--nodaemonize", "--allow-to-run-as-root", "--fpm-config"])
            .arg(conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start php-fpm8.2");
        let fpm = PhpFpm(child);
        let t = std::time::Instant::now();
        while !dir.join("php.sock").exists() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "php-fpm did not open its socket: {}",
                std::fs::read_to_string(dir.join("fpm.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        fpm
    }

    /// Its workers' pids (the master's children).
    fn workers(&self) -> Vec<u64> {
        let master = self.0.id();
        let text = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
            .unwrap_or_default();
        text.split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for PhpFpm {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Unix-socket upstream: nginx → php-fpm over a Unix socket, a script that works 30 ms
/// per request. No packet shows that hop; the off-CPU tracer sees nginx wait in epoll
/// inside each request's server time and who woke it (sched_waking): a php-fpm worker.
/// `slow-server` with the chain ending at php-fpm (one of its workers), the fix on its
/// side, its part of the server time the injected 30 ms within ±20 % — three runs.
#[test]
#[ignore = "needs root"]
fn a_slow_script_behind_php_fpm_on_a_unix_socket_is_named_at_php_fpm() {
    let lab = Lab::up(&LabOptions::new(&name("fp")).server(ServerKind::Builtin)).expect("lab up");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    std::fs::write(
        dir.path().join("slow.php"),
        "<?php usleep(30000); echo \"hello\\n\";\n",
    )
    .unwrap();
    let conf = dir.path().join("fpm.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\npid = {d}/fpm.pid\nerror_log = {d}/fpm.log\ndaemonize = no\n\
             [lab]\nuser = root\ngroup = root\nlisten = {d}/php.sock\npm = static\n\
             pm.max_children = 4\n"
        ),
    )
    .unwrap();
    let fpm = PhpFpm::start(&lab, dir.path(), &conf);
    let (_nginx, _ndir) = nginx_in_lab(
        &lab,
        9532,
        "",
        "",
        &format!(
            "include /etc/nginx/fastcgi_params; fastcgi_param SCRIPT_FILENAME {d}/slow.php; \
             fastcgi_pass unix:{d}/php.sock;"
        ),
    );
    let url = format!("http://{}:9532/", lab.server_addr());
    let workers = fpm.workers();
    assert!(!workers.is_empty(), "php-fpm has no workers");
    for run in 1..=3 {
        let (code, j, err) = diagnose_json(&url, &["-d", "4s"]);
        assert_eq!(
            j["verdict"]["cause"],
            "slow-server",
            "run {run}: {err}\n{}",
            show(&j)
        );
        assert_eq!(code, 1);
        let h = &j["verdict"]["hop"];
        let at = h["at"]
            .as_u64()
            .unwrap_or_else(|| panic!("run {run}: no hop\n{}", show(&j))) as usize;
        let n = &h["chain"][at];
        assert!(
            n["name"].as_str().is_some_and(|s| s.starts_with("php-fpm")),
            "run {run}: {}",
            show(&j)
        );
        assert!(
            n["pid"].as_u64().is_some_and(|p| workers.contains(&p)),
            "run {run}: {} not one of {workers:?}",
            n["pid"]
        );
        let fix = &j["verdict"]["fix"][0];
        assert!(
            fix["location"]
                .as_str()
                .is_some_and(|l| l.starts_with("php-fpm")),
            "run {run}: {fix}"
        );
        // The added time is the injected 30 ms within ±20 %.
        let added = j["verdict"]["cost"]["added_us"].as_u64().unwrap_or(0);
        assert!(
            (24_000..=36_000).contains(&added),
            "run {run}: added {added} µs for a 30 ms script\n{}",
            show(&j)
        );
    }
}

/// A Python backend on the lab's host side of its veth (`client_addr`, the root namespace:
/// "another host" as seen from the server's namespace, whose sockets lagtrace does not read
/// from there), thinking `think` seconds per request.
fn remote_backend(lab: &Lab, port: u16, think: f64) -> Foreground {
    let script = python_server("", "pass", &format!("time.sleep({think})"))
        .replace("\"0.0.0.0\"", &format!("\"{}\"", lab.client_addr()));
    let child = std::process::Command::new("python3")
        .args(["-c", &script, &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3");
    let fg = Foreground(child);
    common::wait_listening(
        std::net::SocketAddr::from((lab.client_addr(), port)),
        "the backend",
    );
    fg
}

/// An upstream on another host that thinks 30 ms per request, behind nginx: the hop is
/// found and captured on the server's side, but nothing of the peer's can be read from
/// there. `slow-server` with mechanism `upstream-wait` at that hop (its address, no pid),
/// the fix pointing at an agent there — three runs of three. Control: a server that sleeps
/// itself while holding an idle connection to the same upstream is not `upstream-wait`.
#[test]
#[ignore = "needs root"]
fn a_slow_upstream_on_another_host_is_upstream_wait_at_that_hop() {
    let lab = Lab::up(&LabOptions::new(&name("rw")).server(ServerKind::Builtin)).expect("lab up");
    let _be = remote_backend(&lab, 9531, 0.03);
    let peer = format!("{}:9531", lab.client_addr());
    let (_nginx, _dir) = common::nginx_proxy_to_in_lab(&lab, 9532, &peer, "");
    let url = format!("http://{}:9532/", lab.server_addr());
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "4s"]);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "slow-server", "run {run}: {err}\n{}", show(&j));
        assert_eq!(v["mechanism"], "upstream-wait", "run {run}: {}", show(&j));
        let h = &v["hop"];
        let at = &h["chain"][h["at"].as_u64().unwrap_or(0) as usize];
        assert_eq!(at["addr"], peer.as_str(), "run {run}: {}", show(&j));
        assert!(at["pid"].is_null(), "run {run}: {}", show(&j));
        assert!(
            v["fix"][0]["change"]
                .as_str()
                .is_some_and(|c| c.contains("lagtrace agent")),
            "run {run}: {}",
            show(&j)
        );
        eprintln!(
            "run {run}: {} / {} at {} — {}",
            v["cause"], v["mechanism"], h["text"], v["cost"]["text"]
        );
    }
    // Control: the server's own sleep, an idle connection to the same upstream beside it.
    let front = python_server(
        &format!(
            "import socket\nIDLE = socket.create_connection((\"{}\", 9531))",
            lab.client_addr()
        ),
        "pass",
        "time.sleep(0.03)",
    );
    let _fe = start_in_lab(
        &lab,
        Path::new("/"),
        &["python3", "-c", &front, "9533"],
        9533,
    );
    let (_, j, err) = diagnose_json(
        &format!("http://{}:9533/", lab.server_addr()),
        &["-d", "4s"],
    );
    assert_eq!(j["verdict"]["cause"], "slow-server", "{err}\n{}", show(&j));
    assert_ne!(j["verdict"]["mechanism"], "upstream-wait", "{}", show(&j));
}

/// An upstream over a path that drops: nginx behind nginx in one namespace, 3 % of the
/// backend's data segments dropped on its output by nft (before the loopback capture sees
/// them), each response one segment, so each drop waits for the kernel's probe timer
/// (~200 ms). `packet-loss` at the hop, with the backend's pid and address, three runs of
/// three — not the front's own segments "dropped before the wire": the front's late
/// responses are its wait on the hop (the upstream join), not a timer of its own.
#[test]
#[ignore = "needs root"]
fn drops_on_the_backends_output_are_packet_loss_at_the_hop() {
    let lab = Lab::up(&LabOptions::new(&name("dr")).server(ServerKind::Builtin)).expect("lab up");
    let (be, _bdir) = nginx_in_lab(&lab, 9551, "", "", "return 200 \"hello\\n\";");
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9552, 9551, "");
    let url = format!("http://{}:9552/", lab.server_addr());
    common::drop_output_in_lab(&lab, 9551, 3);
    for run in 1..=3 {
        let (_, j, err) = diagnose_json(&url, &["-d", "4s"]);
        eprintln!(
            "run {run}: {} / {} at {} (nft dropped {} so far)",
            j["verdict"]["cause"],
            j["verdict"]["mechanism"],
            j["verdict"]["hop"]["text"],
            common::nft_dropped_in_lab(&lab)
        );
        assert_at_backend(&j, &err, run, "packet-loss", &be, "127.0.0.1:9551");
        assert_ne!(
            j["verdict"]["mechanism"],
            "dropped-before-wire",
            "run {run}: the front's own segments were not dropped\n{}",
            show(&j)
        );
        let fix = &j["verdict"]["fix"][0];
        assert!(
            fix["location"]
                .as_str()
                .is_some_and(|l| l.contains("127.0.0.1:9551")),
            "run {run}: {fix}"
        );
    }
}

/// nginx's `location` for the join checks: proxying to `upstream app` over its keep-alive
/// pool, each request tagged with the client connection's port and its request number
/// there (headers only the backend reads and logs).
const TAGGING_PROXY: &str = "proxy_pass http://app; proxy_http_version 1.1; \
     proxy_set_header Connection \"\"; proxy_set_header X-Client-Port $remote_port; \
     proxy_set_header X-Conn-Req $connection_requests;";

/// The join checked against the backend's own account (issue 25): nginx at c=32 in front of
/// a keep-alive upstream pool, every proxied request carrying the client connection's port
/// and its request number on that connection (`$remote_port`, `$connection_requests`) in
/// headers only the backend reads and logs, with the upstream connection it came on (its
/// peer port) and its position there. The join matches by timestamps alone; each kept
/// record's upstream exchange must be the one the backend logged: the same upstream
/// connection, and a position that differs from the backend's by one offset per connection
/// (the capture counts a pooled connection's exchanges from its first one captured).
/// Of all the run's requests (each kept record weighted by the requests it stands for):
/// 99.3–99.9 % right over seven runs, held to the issue's 95 %. The kept records alone,
/// where the slowest are kept whole: 92–100 % right (random would be ~3 %), held to 90 % —
/// the slowest are where nginx, busy with a burst (the run's 32 connections arriving at
/// once, a stall releasing them together), takes requests out of their order of arrival, and
/// neither side's timestamps then say which is which (taking near ties by the answer side
/// instead, or the least-cost matching, was tried: 5–10 % wrong over all requests).
#[test]
#[ignore = "needs root"]
fn the_upstream_join_at_c32_matches_the_backends_own_log() {
    let lab = Lab::up(&LabOptions::new(&name("jn")).server(ServerKind::Builtin)).expect("lab up");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("backend.log");
    let script = python_server(
        "LOG = open(sys.argv[2], \"a\", buffering=1)\nlock = threading.Lock()",
        "pass",
        "self.n = getattr(self, \"n\", -1) + 1\n        \
         with lock:\n            \
         LOG.write(\"%s %s %d %d\\n\" % (self.headers.get(\"X-Client-Port\"), \
         self.headers.get(\"X-Conn-Req\"), self.client_address[1], self.n))",
    );
    let _be = start_in_lab(
        &lab,
        Path::new("/"),
        &["python3", "-c", &script, "9531", log.to_str().unwrap()],
        9531,
    );
    let (_nginx, _ndir) = nginx_in_lab(
        &lab,
        9532,
        "upstream app { server 127.0.0.1:9531; keepalive 64; }",
        "",
        TAGGING_PROXY,
    );
    let url = format!("http://{}:9532/", lab.server_addr());
    let (_, j, err) = diagnose_json(&url, &["-d", "4s", "-c", "32"]);
    check_join(
        &j,
        &err,
        &log,
        0,
        (90, 90, 95),
        None,
        "c=32, a Python backend",
    );
}

/// The same check where requests are many and fast (issue 25): nginx in front of nginx,
/// ~15 000–20 000 req/s at c=32 for 7 s, 100 000 requests and more. The capture keeps a sample
/// of a run that long, and a sample cannot be joined by time — which request caused an
/// exchange is told among *all* the requests in progress (a sampled front joined 2 of 1 200
/// records). The run's first stretch (100 000 transactions) is kept whole on both sides for
/// the join: the records in it (measured 74–100 % of them) joined 80–95 % right (the
/// exchanges of many requests in progress at once start within microseconds of each other);
/// held to 40 % joined and 70 % of those right.
#[test]
#[ignore = "needs root"]
fn the_upstream_join_behind_a_fast_proxy_matches_the_backends_own_log() {
    let lab = Lab::up(&LabOptions::new(&name("jf")).server(ServerKind::Builtin)).expect("lab up");
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("backend.log");
    let (_nginx, _ndir) = nginx_in_lab(
        &lab,
        9542,
        &format!(
            "log_format t '$http_x_client_port $http_x_conn_req $remote_port \
             $connection_requests'; upstream app {{ server 127.0.0.1:9541; keepalive 64; }} \
             server {{ listen 9541; access_log {} t; location / {{ return 200 \"hi\\n\"; }} }}",
            log.display()
        ),
        "",
        TAGGING_PROXY,
    );
    let url = format!("http://{}:9542/", lab.server_addr());
    let (_, j, err) = diagnose_json(&url, &["-d", "7s", "-c", "32"]);
    let requests = j["layers"]["app"]["data"]["cn"]["requests"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        requests > 50_000,
        "not a fast run: {requests} requests\n{}",
        show(&j)
    );
    // The join covers the run's first 100 000 requests (`JOIN_STRETCH`): at ~48 000 req/s
    // (a fresh machine) that is under half of a 7 s run, and the kept records past it have
    // no exchange. Judged over the kept records among the first 90 000 requests the backend
    // logged from the run's first one kept.
    check_join(
        &j,
        &err,
        &log,
        1,
        (80, 70, 70),
        Some(90_000),
        "c=32, nginx behind nginx",
    );
}

/// A record the backend logged: its (upstream port, index), the join's if any, its weight.
type Logged = ((u16, u32), Option<(u16, u32)>, f64);

/// Checks `j`'s upstream join against a backend's log (lines `CLIENT_PORT REQUEST_NUMBER
/// UPSTREAM_PORT INDEX`, the request number from 1, the index from `base`): at least
/// `least_joined_pct` % of the kept records the backend logged are joined, and at least
/// `least_pct` % of those to the exchange it logged — the same upstream connection, and a
/// position on it that differs from the backend's by one offset per connection (the capture
/// counts a pooled connection's exchanges from its first one captured); and, weighing each
/// kept record by the requests it stands for, at least `least_of_all_pct` % of the run's
/// joined requests are right. With `within`, only the kept records among the first `within`
/// lines of the log from the earliest kept record's count.
fn check_join(
    j: &Value,
    err: &str,
    log: &Path,
    base: u32,
    (least_joined_pct, least_pct, least_of_all_pct): (usize, usize, usize),
    within: Option<usize>,
    what: &str,
) {
    use std::collections::HashMap;
    // (client port, request number from 1) → (upstream port, the backend's index on it),
    // and its line in the log.
    let lines: HashMap<(u16, u32), ((u16, u32), usize)> = std::fs::read_to_string(log)
        .expect("the backend's log")
        .lines()
        .enumerate()
        .filter_map(|(n, l)| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                (f.first()?.parse().ok()?, f.get(1)?.parse().ok()?),
                (
                    (
                        f.get(2)?.parse().ok()?,
                        f.get(3)?.parse::<u32>().ok()?.checked_sub(base)?,
                    ),
                    n,
                ),
            ))
        })
        .collect();
    let key = |r: &Value| -> Option<(u16, u32)> {
        let port = r["local"].as_str()?.rsplit(':').next()?.parse().ok()?;
        Some((port, r["index"].as_u64()? as u32 + 1))
    };
    let records = j["layers"]["app"]["data"]["cn"]["records"]["records"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let joins = j["layers"]["packets"]["data"]["joins"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|l| l["requests"].as_array())
        .cloned()
        .unwrap_or_default();
    assert_eq!(records.len(), joins.len(), "{err}\n{}", show(j));
    let first_line = records
        .iter()
        .filter_map(|r| lines.get(&key(r)?).map(|x| x.1))
        .min()
        .unwrap_or(0);
    let last_line = within.map_or(usize::MAX, |n| first_line + n);
    // (record, the backend's (port, index), the join's (port, index) if any).
    let mut pairs = Vec::new();
    for (r, p) in records.iter().zip(&joins) {
        let Some(&(t, line)) = key(r).and_then(|k| lines.get(&k)) else {
            continue;
        };
        if line > last_line {
            continue;
        }
        let up = &p["upstream"];
        let got = up["local_port"]
            .as_u64()
            .zip(up["index"].as_u64())
            .map(|(a, b)| (a as u16, b as u32));
        pairs.push((t, got, r["weight"].as_f64().unwrap_or(1.0)));
    }
    // The offset per upstream connection: the backend's index less the capture's, as most
    // of the connection's joined records have it.
    let mut offsets: HashMap<u16, HashMap<i64, u32>> = HashMap::new();
    for (t, got, _) in &pairs {
        if let Some(g) = got.filter(|g| g.0 == t.0) {
            *offsets
                .entry(t.0)
                .or_default()
                .entry(i64::from(t.1) - i64::from(g.1))
                .or_default() += 1;
        }
    }
    let offset = |port: u16| {
        offsets
            .get(&port)
            .and_then(|m| m.iter().max_by_key(|e| *e.1).map(|e| *e.0))
    };
    let is_right = |(t, got, _): &&Logged| {
        got.is_some_and(|g| g.0 == t.0 && offset(t.0) == Some(i64::from(t.1) - i64::from(g.1)))
    };
    let right = pairs.iter().filter(is_right).count();
    let joined = pairs.iter().filter(|p| p.1.is_some()).count();
    // Of all the run's requests: each kept record stands for `weight` of them (the sample's
    // records for many, the slowest kept exactly for themselves) — the slowest, kept whole,
    // are where a server busy with a burst takes requests out of their order of arrival.
    let weight_of = |f: &dyn Fn(&&Logged) -> bool| pairs.iter().filter(f).map(|p| p.2).sum::<f64>();
    let right_of_all = 100.0 * weight_of(&is_right) / weight_of(&|p| p.1.is_some()).max(1e-9);
    let hop = &j["layers"]["hops"][0];
    eprintln!(
        "upstream join ({what}): {right} of {} logged records joined to the right exchange \
         ({joined} joined; of all the run's requests, weighted, {right_of_all:.2} % of the \
         joined right; {} upstream connections; {} requests in the backend's log; the \
         hop's capture {} packets, {} dropped; its join {})",
        pairs.len(),
        offsets.len(),
        lines.len(),
        hop["packets"]["data"]["packets"],
        hop["packets"]["data"]["dropped"],
        hop["join"]
    );
    assert!(pairs.len() >= 100, "too few records logged: {}", show(j));
    assert!(
        joined * 100 >= pairs.len() * least_joined_pct,
        "{joined} of {} joined\n{}",
        pairs.len(),
        show(j)
    );
    assert!(
        right * 100 >= joined * least_pct,
        "{right} of {joined} joined right ({} logged)\n{}",
        pairs.len(),
        show(j)
    );
    assert!(
        right_of_all >= least_of_all_pct as f64,
        "{right_of_all:.2} % of the run's joined requests right\n{}",
        show(j)
    );
}

/// `wrk` against `url` for `secs` seconds at `c` connections, in the background: the real
/// clients of a passive run (bounded, stops by itself).
fn clients(url: &str, c: u32, secs: u32) -> std::process::Child {
    std::process::Command::new("wrk")
        .args([
            "-t1".to_string(),
            format!("-c{c}"),
            format!("-d{secs}s"),
            "--timeout".into(),
            "2s".into(),
            url.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("wrk")
}

/// `diagnose --passive` follows the hops too (issue 25: "`--passive` and `--pcap` follow hops
/// when the capture holds them"): real clients (wrk) through nginx to a Python backend with
/// Nagle on, watched in the server's namespace without sending a request. The hop is found
/// from nginx's own sockets and captured as in a live run; the verdict names Nagle at the
/// backend with its pid and address, and each hop exchange is joined to the client's request
/// that caused it. Before, a passive run had no hops at all (`slow-server` at nginx).
#[test]
#[ignore = "needs root"]
fn a_passive_run_follows_the_hop_and_names_nagle_at_the_backend() {
    let lab = Lab::up(&LabOptions::new(&name("pv")).server(ServerKind::Builtin)).expect("lab up");
    let be = python_backend(&lab, 9541, true, 0.0);
    let (_nginx, _dir) = nginx_proxy_in_lab(&lab, 9542, 9541, "");
    let url = format!("http://{}:9542/", lab.server_addr());
    let ns = lagtrace_lab::netns_name(lab.name());
    for run in 1..=3 {
        let (code, j, err) = {
            let _turn = lagtrace_testkit::measuring();
            let mut wrk = clients(&url, 4, 6);
            std::thread::sleep(std::time::Duration::from_millis(500));
            let r = common::diagnose_cmd_json(&[
                "--passive",
                "--netns",
                &ns,
                "--port",
                "9542",
                "-d",
                "4s",
            ]);
            let _ = wrk.wait();
            r
        };
        let who = assert_at_backend(&j, &err, run, "nagle-delayed-ack", &be, "127.0.0.1:9541");
        assert_eq!(code, 1, "run {run}");
        assert!(who.starts_with("python"), "{who}");
        let hop = hop_layer(&j, "127.0.0.1:9541", run);
        assert_eq!(hop["from"]["comm"], "nginx");
        let (exchanges, joined) = exchanges_joined(hop);
        eprintln!("run {run}: {joined} of {exchanges} hop exchanges joined");
        assert!(
            exchanges > 20 && joined * 10 >= exchanges * 9,
            "run {run}: {joined} of {exchanges} joined\n{}",
            show(&j)
        );
    }
}

/// `diagnose --pcap` joins the hop's exchanges to the server's requests request by request,
/// as a live run does: a backend that stalls 200 ms on one request in 400 behind nginx at
/// c=32, tcpdump on `any` in the server's namespace. The stalls are a tail past the p99 that
/// the hop's own distributions hide; only the per-request join shows that the slow requests'
/// server time at nginx was their wait on the backend, so the verdict names the backend
/// (before: `slow-server` at nginx, the hop found but its `join` empty). The proxy's own
/// time is reported, and small.
#[test]
#[ignore = "needs root"]
fn a_capture_holding_both_sides_joins_each_request_to_its_hop_exchange() {
    use lagtrace_testkit::tcpdump::{stop_tcpdump, tcpdump_on_filter};
    let lab = Lab::up(&LabOptions::new(&name("pj")).server(ServerKind::Builtin)).expect("lab up");
    let (_be, _nginx) = stalling_backend_behind_nginx(&lab, 9551, 9552);
    let url = format!("http://{}:9552/", lab.server_addr());
    let ns = lagtrace_lab::netns_name(lab.name());
    let dir = tempfile::tempdir().expect("tempdir");
    for run in 1..=3 {
        let all = dir.path().join(format!("all{run}.pcap"));
        {
            let _turn = lagtrace_testkit::measuring();
            let td = tcpdump_on_filter(Some(&ns), "any", &all, "tcp");
            let wrk = std::process::Command::new("wrk")
                .args(["-t1", "-c32", "-d5s", "--timeout", "2s", &url])
                .output()
                .expect("wrk");
            stop_tcpdump(td);
            assert!(wrk.status.success(), "wrk: {wrk:?}");
        }
        let (_, j, err) =
            common::diagnose_cmd_json(&["--pcap", all.to_str().unwrap(), "--port", "9552"]);
        assert_eq!(
            j["verdict"]["cause"],
            "slow-server",
            "run {run}: {err}\n{}",
            show(&j)
        );
        let h = &j["verdict"]["hop"];
        let at = h["at"]
            .as_u64()
            .unwrap_or_else(|| panic!("run {run}: no hop: {}", show(&j))) as usize;
        assert_eq!(
            h["chain"][at]["addr"],
            "127.0.0.1:9551",
            "run {run}: {}",
            show(&j)
        );
        let hop = hop_layer(&j, "127.0.0.1:9551", run);
        let (exchanges, joined) = exchanges_joined(hop);
        let own = hop["join"]["own"]["p50_us"].as_u64();
        eprintln!(
            "run {run}: {joined} of {exchanges} joined, nginx's own p50 {own:?} µs: {}",
            j["verdict"]["summary"]
        );
        assert!(
            exchanges > 1000 && joined * 10 >= exchanges * 9,
            "run {run}: {joined} of {exchanges} joined\n{}",
            show(&j)
        );
        assert!(
            own.is_some_and(|o| o < 1_000),
            "run {run}: nginx's own time {own:?}\n{}",
            show(&j)
        );
        // The slow requests' wait is on the hop: a kept record of ≥ 150 ms whose upstream
        // wait is most of its server time.
        let slow_on_hop = j["layers"]["packets"]["data"]["joins"]
            .as_array()
            .and_then(|js| js.last())
            .and_then(|jn| jn["requests"].as_array())
            .map_or(0, |rs| {
                rs.iter()
                    .filter(|r| {
                        let (s, u) = (
                            r["server_us"].as_u64().unwrap_or(0),
                            r["upstream_us"].as_u64().unwrap_or(0),
                        );
                        s >= 150_000 && u * 10 >= s * 9
                    })
                    .count()
            });
        assert!(
            slow_on_hop >= 3,
            "run {run}: {slow_on_hop} slow requests on the hop"
        );
    }
}
