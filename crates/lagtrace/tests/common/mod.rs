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

/// Starts `cmd` in `lab`'s namespace, in directory `dir`, and waits (at most 10 s) until
/// the lab's server address answers on `port`.
pub fn start_in_lab(lab: &lagtrace_lab::Lab, dir: &Path, cmd: &[&str], port: u16) -> Foreground {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let child = Command::new("ip")
        .args(["netns", "exec", &lagtrace_lab::netns_name(lab.name())])
        .args(cmd)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let fg = Foreground(child);
    let addr = std::net::SocketAddr::from((lab.server_addr(), port));
    let t = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{cmd:?} did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fg
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
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let j = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "diagnose {url}: not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().unwrap_or(-1), j, stderr)
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
