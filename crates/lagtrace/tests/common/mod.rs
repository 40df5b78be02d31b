//! What the binary's integration tests share beyond the test kit (`lagtrace-testkit`): a
//! tiny HTTP helper, the `lagtrace analyze --json` and `lagtrace diagnose --json` wrappers,
//! and a server process started in a lab's namespace. Not every test file uses every item.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

/// Reads one HTTP request head; false on EOF or error.
pub fn read_request(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    true
}

/// `lagtrace analyze --json file`; exit 1 means "findings", 2 would be an error.
pub fn analyze_json(file: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["analyze", "--json"])
        .arg(file)
        .output()
        .unwrap();
    assert_ne!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (kind, transaction, cost µs) of every finding in an analysis JSON.
pub fn kinds(an: &serde_json::Value) -> Vec<(String, u64, u64)> {
    an["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["transaction"].as_u64().unwrap_or(u64::MAX),
                f["cost_us"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The `lagtrace` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

/// A server process the test started, killed (and reaped) when dropped.
pub struct Foreground(pub std::process::Child);

impl Drop for Foreground {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tc ARGS` in `lab`'s namespace (panics with tc's error when it fails); its output.
pub fn tc_in_lab(lab: &lagtrace_lab::Lab, args: &[&str]) -> String {
    let ns = lagtrace_lab::netns_name(lab.name());
    let out = std::process::Command::new("tc")
        .args(["-n", &ns])
        .args(args)
        .output()
        .expect("tc");
    assert!(
        out.status.success(),
        "tc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Loads an nftables ruleset into `lab`'s namespace (the namespace, and the rules with it,
/// go with the lab); panics when `nft -f` refuses it.
pub fn nft_in_lab(lab: &lagtrace_lab::Lab, rules: &str) {
    use std::io::Write;
    use std::process::Stdio;
    let ns = lagtrace_lab::netns_name(lab.name());
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(rules.as_bytes())
        .expect("write rules");
    assert!(child.wait().expect("nft").success(), "nft -f: {rules}");
}

/// Drops `pct` % of the data segments (IP length over a bare ACK's) leaving `sport` on
/// `lab`'s output path, counted, in the table `inet ltwd` (any ruleset before is flushed).
pub fn drop_output_in_lab(lab: &lagtrace_lab::Lab, sport: u16, pct: u8) {
    nft_in_lab(lab, "flush ruleset\n");
    nft_in_lab(
        lab,
        &format!(
            "table inet ltwd {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n  tcp sport {sport} ip length > 80 numgen random mod 100 < {pct} counter drop\n }}\n}}\n"
        ),
    );
}

/// Packets `lab`'s `ltwd` rule ([`drop_output_in_lab`]) dropped so far.
pub fn nft_dropped_in_lab(lab: &lagtrace_lab::Lab) -> u64 {
    let ns = lagtrace_lab::netns_name(lab.name());
    let out = Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "list", "table", "inet", "ltwd"])
        .output()
        .expect("nft list");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("counter packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Starts `cmd` in `lab`'s namespace, in directory `dir`, and waits (at most 10 s) until
/// the lab's server address answers on `port`.
pub fn start_in_lab(lab: &lagtrace_lab::Lab, dir: &Path, cmd: &[&str], port: u16) -> Foreground {
    let fg = spawn_in_lab(lab, dir, cmd);
    wait_listening(
        std::net::SocketAddr::from((lab.server_addr(), port)),
        &format!("{cmd:?}"),
    );
    fg
}

/// Starts `cmd` in `lab`'s namespace, in `dir`, its output discarded (not waiting for it).
pub fn spawn_in_lab(lab: &lagtrace_lab::Lab, dir: &Path, cmd: &[&str]) -> Foreground {
    use std::process::Stdio;
    let child = Command::new("ip")
        .args(["netns", "exec", &lagtrace_lab::netns_name(lab.name())])
        .args(cmd)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    Foreground(child)
}

/// Waits (at most 10 s) until `addr` accepts a connection; panics naming `what` otherwise.
pub fn wait_listening(addr: std::net::SocketAddr, what: &str) {
    use std::time::{Duration, Instant};
    let t = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what} did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `lagtrace diagnose ARGS --json -q` (its saved state in a private directory): exit code,
/// JSON, stderr.
pub fn diagnose_cmd_json(args: &[&str]) -> (i32, serde_json::Value, String) {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("diagnose")
        .args(args)
        .args(["--json", "-q"])
        .env("XDG_STATE_HOME", home.path())
        .output()
        .expect("run lagtrace");
    json_output(&format!("{args:?}"), out)
}

/// A `diagnose --json` run's exit code, JSON (a panic naming `what` when it is not JSON)
/// and stderr.
fn json_output(what: &str, out: std::process::Output) -> (i32, serde_json::Value, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let j = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "diagnose {what}: not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), j, stderr)
}

/// Runs `lagtrace diagnose URL --json -q ARGS` (its saved state in a private directory,
/// taking its measuring turn); returns the exit code, the JSON and stderr.
pub fn diagnose_json(url: &str, args: &[&str]) -> (i32, serde_json::Value, String) {
    diagnose_json_via(&[], url, args)
}

/// [`diagnose_json`] run through a command `via` (e.g. `ip netns exec NS`, `taskset MASK`).
pub fn diagnose_json_via(
    via: &[&str],
    url: &str,
    args: &[&str],
) -> (i32, serde_json::Value, String) {
    let _turn = lagtrace_testkit::measuring();
    let home = tempfile::tempdir().expect("tempdir");
    let mut cmd = match via.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    let out = cmd
        .args(["diagnose", url, "--json", "-q"])
        .args(args)
        .env("XDG_STATE_HOME", home.path())
        .output()
        .expect("run lagtrace");
    json_output(url, out)
}

/// A diagnose JSON's evidence, one `stance layer text` line each, for failure messages.
pub fn evidence_lines(j: &serde_json::Value) -> String {
    j["evidence"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| format!("{} {} {}\n", e["stance"], e["layer"], e["text"]))
                .collect()
        })
        .unwrap_or_default()
}

/// A Python HTTP server (argv: port, then the hooks' own): HTTP/1.1 keep-alive, one thread
/// per connection, a listen backlog large enough that no SYN is dropped, and TCP_NODELAY on
/// (the handler writes its head and body separately: Nagle would hold every response 40 ms).
/// It answers `hello` to every GET. `globals` are Python lines run first (`sys`, `random`,
/// `threading` and `time` are imported);
/// `on_connect` runs when a connection is accepted, before anything is read, and `on_request`
/// before each answer (each one Python statement or `pass`).
pub fn python_server(globals: &str, on_connect: &str, on_request: &str) -> String {
    format!(
        r#"
import sys, random, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
{globals}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def setup(self):
        {on_connect}
        super().setup()
    def do_GET(self):
        {on_request}
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(ThreadingHTTPServer):
    request_queue_size = 512
    daemon_threads = True
S(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"#
    )
}

/// [`python_server`] (argv: port, EVERY, SLOW) whose every `EVERY`-th request (counted over
/// the whole server) sleeps `SLOW` seconds before it answers; the others answer at once.
pub fn every_nth_server() -> String {
    python_server(
        "EVERY, SLOW = int(sys.argv[2]), float(sys.argv[3])\nlock = threading.Lock()\nn = [0]",
        "pass",
        "with lock:\n            n[0] += 1\n            slow = n[0] % EVERY == 0\n        if slow:\n            time.sleep(SLOW)",
    )
}

/// nginx in `lab` on `listen`, proxying to 127.0.0.1:`upstream` over a keep-alive pool (as
/// production configurations do); `server_extra` goes into the server block.
pub fn nginx_proxy_in_lab(
    lab: &lagtrace_lab::Lab,
    listen: u16,
    upstream: u16,
    server_extra: &str,
) -> (Foreground, tempfile::TempDir) {
    nginx_proxy_to_in_lab(lab, listen, &format!("127.0.0.1:{upstream}"), server_extra)
}

/// [`nginx_proxy_in_lab`] to the upstream at `upstream` (`ADDR:PORT`).
pub fn nginx_proxy_to_in_lab(
    lab: &lagtrace_lab::Lab,
    listen: u16,
    upstream: &str,
    server_extra: &str,
) -> (Foreground, tempfile::TempDir) {
    nginx_in_lab(
        lab,
        listen,
        &format!("upstream app {{ server {upstream}; keepalive 64; }}"),
        server_extra,
        "proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\";",
    )
}

/// nginx in `lab` on `listen` (one process, its files in a temporary directory) with
/// `http_extra` in the http block, `server_extra` in the server block and `location` as
/// the directives of `location /`.
pub fn nginx_in_lab(
    lab: &lagtrace_lab::Lab,
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

/// A Python backend ([`python_server`]) in `lab` on `port`: `nagle` leaves Nagle on (its head and body are two small
/// writes), `think` seconds before each answer.
pub fn python_backend(lab: &lagtrace_lab::Lab, port: u16, nagle: bool, think: f64) -> Foreground {
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

/// Two listeners on `port` in `lab`'s namespace (Python's `http.server` serving `dir`): the
/// server on the lab's address, then another process on 127.0.0.1 (a higher pid unless the
/// pids wrapped, and either may come first in a socket dump); both listening when this
/// returns.
pub fn listener_and_loopback_decoy(
    lab: &lagtrace_lab::Lab,
    dir: &Path,
    port: u16,
) -> (Foreground, Foreground) {
    std::fs::write(dir.join("index.html"), "hello\n").expect("index");
    let ns = lagtrace_lab::netns_name(lab.name());
    let (addr, port_s) = (lab.server_addr().to_string(), port.to_string());
    let server = start_in_lab(
        lab,
        dir,
        &["python3", "-m", "http.server", "--bind", &addr, &port_s],
        port,
    );
    let decoy = spawn_in_lab(
        lab,
        dir,
        &[
            "python3",
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port_s,
        ],
    );
    let t = std::time::Instant::now();
    while !lagtrace_testkit::in_ns(&ns, &["ss", "-Hltn", &format!("src 127.0.0.1:{port}")])
        .contains(&format!("127.0.0.1:{port}"))
    {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the second listener did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (server, decoy)
}
