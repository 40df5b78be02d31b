//! Where a slow server's time goes, on real servers (needs root): a Python server in the
//! lab's namespace whose handler sleeps, contends for one lock, computes, or reads a block
//! device throttled by the blkio cgroup is `slow-server` with mechanism `sleep`, `lock-wait`,
//! `on-cpu` or `disk-io` — three runs each, the same cause and mechanism every time — with
//! the kernel stack in the fix where the mechanism is a wait. Negative control: the same
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
/// containing `fix`. Returns the last run.
fn three_runs(url: &str, args: &[&str], mechanism: &str, fix: &str) -> Value {
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
            split["attributed"].as_u64().unwrap_or(0) * 2
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
