//! Where a slow server's time goes, on real servers (needs root): a Python server in the
//! lab's namespace whose handler sleeps, contends for one lock, computes, or reads a block
//! device throttled by the blkio cgroup is `slow-server` with mechanism `sleep`, `lock-wait`,
//! `on-cpu` or `disk-io` — three runs each, the same cause and mechanism every time — with
//! the kernel stack in the fix where the mechanism is a wait; a compiled handler computing in
//! a named function and nginx doing a full TLS handshake per request are `on-cpu` with the
//! function (its ELF symbol) or the setting (libcrypto: `ssl_session_cache`) in the fix, from
//! the host layer's on-CPU profile. Negative control: the same
//! server with no work gets no slow-server mechanism. Labs, servers, loop devices and
//! cgroups are removed by guards, also when a test fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use lagtrace_lab::{Lab, LabOptions, ServerKind};
use serde_json::Value;

use common::Foreground;

/// HTTP/1.1 keep-alive, a thread per connection, TCP_NODELAY on, each response in one
/// write. argv: port, work (`none`, `sleep`, `lock`, `cpu`, or `disk:DEVICE`).
const SERVER: &str = r#"
import mmap, os, random, socket, sys, threading, time
PORT, WORK = int(sys.argv[1]), sys.argv[2]
LOCK = threading.Lock()
DEV = None
if WORK.startswith("disk:"):
    DEV = os.open(WORK[5:], os.O_RDONLY | os.O_DIRECT)
    BLOCKS = os.lseek(DEV, 0, os.SEEK_END) // 4096
def work():
    if WORK == "sleep":
        time.sleep(0.03)
    elif WORK == "lock":
        with LOCK:
            time.sleep(0.004)
    elif WORK == "cpu":
        end = time.thread_time() + 0.015
        while time.thread_time() < end:
            pass
    elif DEV is not None:
        buf = mmap.mmap(-1, 4096)
        os.preadv(DEV, [buf], random.randrange(BLOCKS) * 4096)
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    try:
        while True:
            d = c.recv(4096)
            if not d:
                return
            buf += d
            while b"\r\n\r\n" in buf:
                _, buf = buf.split(b"\r\n\r\n", 1)
                work()
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
    except OSError:
        pass
    finally:
        c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", PORT))
s.listen(256)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

fn name(test: &str) -> String {
    format!("st{test}{}", std::process::id())
}

fn server(lab: &Lab, port: u16, work: &str) -> Foreground {
    let port_s = port.to_string();
    common::start_in_lab(
        lab,
        Path::new("/"),
        &["python3", "-c", SERVER, &port_s, work],
        port,
    )
}

fn show(j: &Value) -> String {
    let mut h = j["layers"]["host"]["data"]["offcpu"].clone();
    if let Some(s) = h.pointer_mut("/data/stacks") {
        *s = Value::String("…".into());
    }
    serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default()
        + "\n"
        + &common::evidence_lines(j)
        + &serde_json::to_string(&h).unwrap_or_default()
}

/// Diagnoses `url` three times: each run is slow-server with `mechanism`, its first fix
/// containing `fix`, and the serving thread found for most requests. Returns the last run.
fn three_runs(url: &str, args: &[&str], mechanism: &str, fix: &str) -> Value {
    runs(url, args, mechanism, fix, true)
}

/// [`three_runs`]; `found`: assert the serving thread was found for most requests (an
/// event loop busy through the window blocks for none of them: it is not).
fn runs(url: &str, args: &[&str], mechanism: &str, fix: &str, found: bool) -> Value {
    let mut last = Value::Null;
    for run in 0..3 {
        let (_, j, err) = common::diagnose_json(url, args);
        let v = &j["verdict"];
        assert_eq!(v["cause"], "slow-server", "run {run}: {err}\n{}", show(&j));
        assert_eq!(v["mechanism"], mechanism, "run {run}: {}", show(&j));
        assert!(
            v["fix"][0]["change"]
                .as_str()
                .is_some_and(|c| c.contains(fix)),
            "run {run}: {}",
            show(&j)
        );
        let split = &j["layers"]["host"]["data"]["offcpu"]["data"]["during_requests"];
        assert!(
            !found
                || split["attributed"].as_u64().unwrap_or(0) * 2
                    >= split["requests"].as_u64().unwrap_or(u64::MAX),
            "run {run}: most requests' serving thread found: {}",
            show(&j)
        );
        eprintln!(
            "run {run}: {} / {}: {}",
            v["cause"], v["mechanism"], v["fix"][0]["change"]
        );
        last = j;
    }
    last
}

#[test]
#[ignore = "needs root"]
fn a_handler_that_sleeps_is_slow_server_sleep() {
    let lab = Lab::up(&LabOptions::new(&name("sl")).server(ServerKind::Builtin)).expect("lab");
    let _py = server(&lab, 9021, "sleep");
    let url = format!("http://{}:9021/", lab.server_addr());
    let j = three_runs(&url, &["-d", "2s", "-c", "8"], "sleep", "do_nanosleep");
    let parts = &j["layers"]["host"]["data"]["offcpu"]["data"]["during_requests"]["parts"];
    assert_eq!(parts[0]["class"], "sleep", "{}", show(&j));
    assert!(
        parts[0]["share"].as_f64().unwrap_or(0.0) >= 0.8,
        "{}",
        show(&j)
    );
}

#[test]
#[ignore = "needs root"]
fn threads_contending_for_one_lock_are_lock_wait() {
    let lab = Lab::up(&LabOptions::new(&name("lk")).server(ServerKind::Builtin)).expect("lab");
    let _py = server(&lab, 9022, "lock");
    let url = format!("http://{}:9022/", lab.server_addr());
    three_runs(&url, &["-d", "2s", "-c", "16"], "lock-wait", "futex");
}

#[test]
#[ignore = "needs root"]
fn a_handler_that_computes_is_on_cpu() {
    let lab = Lab::up(&LabOptions::new(&name("cp")).server(ServerKind::Builtin)).expect("lab");
    let _py = server(&lab, 9023, "cpu");
    let url = format!("http://{}:9023/", lab.server_addr());
    three_runs(&url, &["-d", "2s", "-c", "8"], "on-cpu", "computes ~");
}

/// A C server (a thread per connection, TCP_NODELAY) whose handler computes ~15 ms of CPU
/// in `render_report` before each answer; argv: port. Built with symbols (`.symtab`).
const C_SERVER: &str = r#"
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double thread_secs(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) unsigned long render_report(double secs) {
    volatile unsigned long x = 1;
    double end = thread_secs() + secs;
    while (thread_secs() < end)
        for (int i = 0; i < 20000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}
static void *serve(void *arg) {
    int c = (int)(long)arg, one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[4096];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(c, buf + have, sizeof buf - have - 1);
        if (n <= 0) break;
        have += n;
        buf[have] = 0;
        char *end;
        while ((end = strstr(buf, "\r\n\r\n"))) {
            render_report(0.015);
            const char r[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
            if (write(c, r, sizeof r - 1) < 0) break;
            size_t used = end + 4 - buf;
            memmove(buf, end + 4, have - used + 1);
            have -= used;
        }
        if (have >= sizeof buf - 1) have = 0;
    }
    close(c);
    return 0;
}
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[1]));
    if (bind(s, (void *)&a, sizeof a) || listen(s, 256)) return 1;
    for (;;) {
        int c = accept(s, 0, 0);
        if (c < 0) continue;
        pthread_t t;
        pthread_create(&t, 0, serve, (void *)(long)c);
        pthread_detach(t);
    }
}
"#;

/// A compiled server whose handler computes in a named function: on-cpu, and the on-CPU
/// profile names that function (its ELF symbol) with most of the samples, in the fix too.
#[test]
#[ignore = "needs root"]
fn a_compiled_handler_that_computes_is_on_cpu_in_its_named_function() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = lagtrace_testkit::compile_c(dir.path(), "srv", C_SERVER, &["-O1", "-pthread"]);
    // The symbol the profile must name is in the binary's symbol table (nm, the peer).
    let nm = Command::new("nm").arg(&bin).output().expect("nm");
    assert!(String::from_utf8_lossy(&nm.stdout).contains(" T render_report"));
    let lab = Lab::up(&LabOptions::new(&name("cc")).server(ServerKind::Builtin)).expect("lab");
    let bin_s = bin.display().to_string();
    let srv = common::start_in_lab(&lab, dir.path(), &[&bin_s, "9025"], 9025);
    let url = format!("http://{}:9025/", lab.server_addr());
    // Two clients for two CPUs: a thread per connection computing, not queued for a CPU.
    let j = three_runs(
        &url,
        &["-d", "2s", "-c", "2"],
        "on-cpu",
        "render_report (srv)",
    );
    // The peer: perf record on the same process under the same load names the same
    // function in the same file first (perf report, self time by file and symbol).
    let rep = perf_report(&url, &["-c", "2"], srv.0.id(), dir.path(), "dso,sym");
    let top = rep.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert!(
        top.contains("srv") && top.contains("render_report"),
        "perf report's first line: {top:?}\n{rep}"
    );
    let p = &j["layers"]["host"]["data"]["oncpu"]["data"];
    assert_eq!(p["functions"][0]["function"], "render_report", "{p:#}");
    assert_eq!(p["functions"][0]["module"], "srv", "{p:#}");
    assert!(
        p["functions"][0]["share"].as_f64().unwrap_or(0.0) >= 0.5,
        "{p:#}"
    );
    // Folded stacks: root first, the function innermost.
    assert!(
        p["folded"]
            .as_array()
            .is_some_and(|f| f.iter().any(|s| s["stack"]
                .as_str()
                .is_some_and(|t| t.ends_with("srv`render_report")))),
        "{p:#}"
    );
}

/// `perf record -e cpu-clock -F 199 -p PID` for 2 s while `lagtrace load URL LOAD -d 4s`
/// runs, then `perf report --sort SORT` (self time, quiet): the peer's profile of the same
/// process under the same load.
fn perf_report(url: &str, load: &[&str], pid: u32, dir: &Path, sort: &str) -> String {
    // Four seconds of load and a profile: a measurement, and CPU another test's diagnose
    // must not share (a gzip run beside one waited 18 % of its time for a CPU, suite run).
    let _turn = lagtrace_testkit::measuring();
    let mut l = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["load", url, "-d", "4s", "--json"])
        .args(load)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("lagtrace load");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let data = dir.join("perf.data");
    let rec = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "199", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep", "2"])
        .output()
        .expect("perf record");
    let _ = l.wait();
    assert!(
        rec.status.success(),
        "{}",
        String::from_utf8_lossy(&rec.stderr)
    );
    let rep = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "-q",
            "--no-children",
            "--sort",
            sort,
            "-i",
        ])
        .arg(&data)
        .output()
        .expect("perf report");
    String::from_utf8_lossy(&rep.stdout).into_owned()
}

/// nginx terminating TLS with keep-alive off and no session resumption (cache and tickets
/// off): every request pays a full handshake, and its one worker's CPU goes to libcrypto —
/// on-cpu, with the fix in nginx's terms. With an RSA 4096 key a handshake costs ~5 ms,
/// the server's own time alone; with RSA 2048 ~0.9 ms, quick alone, and under 32 clients
/// each waits ~19 ms for its handshake's turn (p50), in connection setup, where the server
/// time in packets (request to response, ~1 ms) does not look: the profile names the work
/// (was `healthy, high`).
#[test]
#[ignore = "needs root"]
fn nginx_doing_a_full_tls_handshake_per_request_is_on_cpu_in_libcrypto() {
    let lab = Lab::up(&LabOptions::new(&name("tl")).server(ServerKind::Builtin)).expect("lab");
    for (port, key, c) in [(9026u16, "rsa:4096", "8"), (9028, "rsa:2048", "32")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().display().to_string();
        // An RSA 4096 key takes seconds of a CPU to generate: not while another test
        // measures.
        let out = {
            let _turn = lagtrace_testkit::measuring();
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", key, "-nodes", "-days", "2"])
                .args(["-subj", "/CN=lab", "-keyout"])
                .arg(format!("{d}/k.pem"))
                .arg("-out")
                .arg(format!("{d}/c.pem"))
                .output()
                .expect("openssl")
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = format!(
            "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{ access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/px;\n\
             fastcgi_temp_path {d}/fc; uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
             keepalive_timeout 0; ssl_session_cache off; ssl_session_tickets off;\n\
             server {{ listen {port} ssl; ssl_certificate {d}/c.pem;\n\
             ssl_certificate_key {d}/k.pem; location / {{ return 200 \"ok\\n\"; }} }} }}\n"
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let conf = format!("{d}/nginx.conf");
        let _ng = common::start_in_lab(&lab, dir.path(), &["nginx", "-p", &d, "-c", &conf], port);
        let url = format!("https://{}:{port}/", lab.server_addr());
        let j = runs(
            &url,
            &["-d", "2s", "-c", c, "--insecure"],
            "on-cpu",
            "ssl_session_cache",
            false,
        );
        let p = &j["layers"]["host"]["data"]["oncpu"]["data"];
        assert_eq!(p["modules"][0]["module"], "libcrypto.so.3", "{key}: {p:#}");
    }
}

/// nginx compressing a 1 MB text file at `gzip_comp_level 9` for clients that ask for gzip
/// (`diagnose -H "Accept-Encoding: gzip"`): its worker's CPU goes to libz — on-cpu, the fix
/// naming `gzip_comp_level` (nginx's own term). Control: the same server for clients that do
/// not ask gets no on-cpu.
#[test]
#[ignore = "needs root"]
fn nginx_compressing_at_level_9_is_on_cpu_in_libz_with_gzip_comp_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    // Compressible but not trivially: lines of words with numbers.
    let mut text = String::new();
    let mut i = 0u64;
    while text.len() < 1 << 20 {
        i += 1;
        text.push_str(&format!(
            "{i} request latency {} ms at hop {} of chain {} status {}\n",
            (i * 7919) % 1000,
            i % 13,
            (i * 104_729) % 97,
            200 + (i % 5)
        ));
    }
    std::fs::create_dir(dir.path().join("www")).unwrap();
    std::fs::write(dir.path().join("www/big.txt"), text).unwrap();
    let conf = format!(
        "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/px;\n\
         fastcgi_temp_path {d}/fc; uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
         types {{ text/plain txt; }} gzip on; gzip_comp_level 9; gzip_types text/plain;\n\
         server {{ listen 9029; root {d}/www; }} }}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let lab = Lab::up(&LabOptions::new(&name("gz")).server(ServerKind::Builtin)).expect("lab");
    let conf = format!("{d}/nginx.conf");
    let _ng = common::start_in_lab(&lab, dir.path(), &["nginx", "-p", &d, "-c", &conf], 9029);
    let url = format!("http://{}:9029/big.txt", lab.server_addr());
    let j = runs(
        &url,
        &["-d", "2s", "-c", "4", "-H", "Accept-Encoding: gzip"],
        "on-cpu",
        "gzip_comp_level",
        false,
    );
    let p = &j["layers"]["host"]["data"]["oncpu"]["data"];
    let top = p["modules"][0]["module"].as_str().unwrap_or("");
    assert!(top.starts_with("libz.so"), "{p:#}");
    // The peer names the same file first (perf report by shared object), and, as lagtrace,
    // no function there unless a symbol covers it (Debian's libz keeps only .dynsym).
    let nginx = j["layers"]["sockets"]["data"]["server"]["pid"]
        .as_u64()
        .expect("the server's pid") as u32;
    let rep = perf_report(
        &url,
        &["-c", "4", "-H", "Accept-Encoding: gzip"],
        nginx,
        dir.path(),
        "dso",
    );
    let first = rep.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert!(
        first.contains(top),
        "perf: {first:?}, lagtrace: {top}\n{rep}"
    );
    let (_, j, err) = common::diagnose_json(&url, &["-d", "2s", "-c", "4"]);
    assert_ne!(j["verdict"]["mechanism"], "on-cpu", "{err}\n{}", show(&j));
}

/// A Node.js server whose event loop computes ~15 ms in `busyRender` before each answer;
/// argv: port.
const NODE_SERVER: &str = r#"
const http = require('http');
function busyRender(ms) {
  const end = process.hrtime.bigint() + BigInt(ms) * 1000000n;
  let x = 0;
  while (process.hrtime.bigint() < end) {
    for (let i = 0; i < 20000; i++) x = (x * 31 + i) | 0;
  }
  return x;
}
http.createServer((req, res) => { busyRender(15); res.end('ok\n'); })
  .listen(+process.argv[2]);
"#;

/// Removes the perf map node wrote for `pid` (/tmp/perf-PID.map), also when a test fails.
struct PerfMap(u32);

impl Drop for PerfMap {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.0));
    }
}

/// node's event loop blocked by a synchronous CPU loop: on-cpu. With --perf-basic-prof
/// the profile names the JavaScript function (node's perf map); without, the fix says
/// which flag would.
#[test]
#[ignore = "needs root"]
fn a_node_event_loop_blocked_by_cpu_work_is_on_cpu_named_with_perf_basic_prof() {
    let dir = tempfile::tempdir().expect("tempdir");
    let js = dir.path().join("srv.js");
    std::fs::write(&js, NODE_SERVER).unwrap();
    let js = js.display().to_string();
    let lab = Lab::up(&LabOptions::new(&name("js")).server(ServerKind::Builtin)).expect("lab");
    let url = format!("http://{}:9027/", lab.server_addr());
    {
        let node = common::start_in_lab(
            &lab,
            dir.path(),
            &["node", "--perf-basic-prof", &js, "9027"],
            9027,
        );
        let _map = PerfMap(node.0.id());
        // An event loop busy through the window: its thread blocks for no request.
        let j = runs(
            &url,
            &["-d", "2s", "-c", "4"],
            "on-cpu",
            "busyRender",
            false,
        );
        let p = &j["layers"]["host"]["data"]["oncpu"]["data"];
        assert!(
            p["functions"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["function"]
                    .as_str()
                    .is_some_and(|n| n.contains("busyRender"))
                    && f["module"] == "[jit]")),
            "{p:#}"
        );
    }
    let _node = common::start_in_lab(&lab, dir.path(), &["node", &js, "9027"], 9027);
    let j = runs(
        &url,
        &["-d", "2s", "-c", "4"],
        "on-cpu",
        "--perf-basic-prof",
        false,
    );
    let p = &j["layers"]["host"]["data"]["oncpu"]["data"];
    assert!(
        p["hint"]
            .as_str()
            .is_some_and(|h| h.contains("--perf-basic-prof")),
        "{p:#}"
    );
}

/// A loop device over a sparse file, detached (and the file removed) on drop.
struct Loop {
    dev: String,
    file: PathBuf,
}

impl Loop {
    fn new() -> Loop {
        let file = std::env::temp_dir().join(lagtrace_testkit::unique_name("lt-st-", 40));
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(64 << 20))
            .expect("image file");
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            file,
        }
    }

    /// MAJ:MIN.
    fn numbers(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let r = std::fs::metadata(&self.dev).expect("loop device").rdev();
        format!("{}:{}", libc::major(r), libc::minor(r))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// A v1 blkio cgroup limiting reads from one device, removed (its processes moved back to
/// the root) on drop.
struct Blkio(PathBuf);

impl Blkio {
    fn new(dev: &str, read_iops: u32) -> Blkio {
        let dir =
            Path::new("/sys/fs/cgroup/blkio").join(lagtrace_testkit::unique_name("lt-st-", 40));
        std::fs::create_dir(&dir).expect("mkdir v1 blkio cgroup");
        let g = Blkio(dir);
        std::fs::write(
            g.0.join("blkio.throttle.read_iops_device"),
            format!("{dev} {read_iops}"),
        )
        .expect("read_iops_device");
        g
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("cgroup.procs");
    }
}

impl Drop for Blkio {
    fn drop(&mut self) {
        if let Ok(p) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in p.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/blkio/cgroup.procs", pid);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Uncached reads (O_DIRECT) from a loop device throttled to 20 reads/s: quick alone, but
/// four clients queue 4 × 50 ms — responses leave at ~200 ms, the TCP_CORK ceiling. The
/// sockets read uncorked rule the cork out; the serving thread blocked in io_schedule names
/// disk-io.
#[test]
#[ignore = "needs root"]
fn reads_from_a_throttled_block_device_are_disk_io() {
    let lab = Lab::up(&LabOptions::new(&name("dk")).server(ServerKind::Builtin)).expect("lab");
    let dev = Loop::new();
    let cg = Blkio::new(&dev.numbers(), 20);
    let py = server(&lab, 9024, &format!("disk:{}", dev.dev));
    cg.add(py.0.id());
    let url = format!("http://{}:9024/", lab.server_addr());
    let j = three_runs(&url, &["-d", "2s", "-c", "4"], "disk-io", "on disk I/O");
    assert!(
        !common::evidence_lines(&j).contains("+ [packets] tcp-cork"),
        "{}",
        show(&j)
    );
    // The fix names the device and the limit that paced it (the cgroup's file, 20 reads/s).
    let fix = j["verdict"]["fix"][0]["change"].as_str().unwrap_or("");
    let name = dev.dev.trim_start_matches("/dev/");
    assert!(
        fix.contains(&format!("on {name} ({})", dev.numbers()))
            && fix.contains("to 20 reads/s")
            && fix.contains("blkio.throttle.read_iops_device"),
        "{}",
        show(&j)
    );
}

/// The same server with nothing to do: no slow-server mechanism, and the off-CPU layer ran
/// (its threads wait between requests, which is no part of any request).
#[test]
#[ignore = "needs root"]
fn a_server_with_no_work_gets_no_server_time_mechanism() {
    let lab = Lab::up(&LabOptions::new(&name("no")).server(ServerKind::Builtin)).expect("lab");
    let _py = server(&lab, 9025, "none");
    let url = format!("http://{}:9025/", lab.server_addr());
    let (_, j, err) = common::diagnose_json(&url, &["-d", "2s", "-c", "8"]);
    assert_eq!(
        j["layers"]["host"]["data"]["offcpu"]["status"],
        "ok",
        "{err}\n{}",
        show(&j)
    );
    let m = j["verdict"]["mechanism"].as_str().unwrap_or("");
    assert!(
        !["sleep", "lock-wait", "disk-io", "on-cpu"].contains(&m),
        "{}",
        show(&j)
    );
}
