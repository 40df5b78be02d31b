//! The lagtrace test kit: used only as a dev-dependency, never shipped.
//!
//! - [`net`]: the one guard for what a test builds in the network stack (namespaces, veth
//!   pairs, host nft tables, helper processes), removed on drop even after a panic, plus a
//!   namespace joined to this one by a veth ([`net::VethNs`]);
//! - [`chain`]: `client → r1 → r2 → server` through two routers, for path tests;
//! - [`ns_lab`]: a namespace with a tiny TCP server inside, for capture tests;
//! - [`nginx`] and [`server`]: a real nginx, and in-test HTTP servers on 127.0.0.1;
//! - [`pyserver`]: Python servers inside a [`net::VethNs`] (faults lagtrace did not write);
//! - [`tcpdump`]: start/stop a tcpdump that has flushed its file;
//! - [`layers`]: constructed diagnosis evidence (`lagtrace-model` types) for the verdict and
//!   renderer tests;
//! - here: [`sh`], [`in_ns`], [`tshark_fields`], [`case_pcap`], unique names.
//!
//! Helpers panic with the failing command and its stderr: that is a test failure, with the
//! reason in the message. Tests that need root are marked `#[ignore = "needs root"]` and run
//! with `cargo test -- --include-ignored` (README's test command does).

pub mod browser;
pub mod chain;
pub mod layers;
pub mod net;
pub mod nginx;
pub mod ns_lab;
pub mod pyserver;
pub mod server;
pub mod tcpdump;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Runs `args[0]` with the rest as arguments; its stdout, or the command line and its
/// stderr as the error.
pub fn try_sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("running {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`try_sh`] that panics with the command line and its stderr when it fails.
pub fn sh(args: &[&str]) -> String {
    try_sh(args).unwrap_or_else(|e| panic!("{e}"))
}

/// `ip netns exec NS args...`, as [`try_sh`].
pub fn try_in_ns(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    try_sh(&v)
}

/// `ip netns exec NS args...`, as [`sh`].
pub fn in_ns(ns: &str, args: &[&str]) -> String {
    try_in_ns(ns, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `program args...` inside namespace `ns` (`ip netns exec`) and returns its output,
/// whatever its exit status.
pub fn output_in_ns(ns: &str, program: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {ns} {program}: {e}"))
}

/// Pins the calling thread (and the threads it spawns from now on) to CPU `cpu`: traffic
/// between two sockets of one host over a veth enters the receiver through the sending
/// CPU's backlog, so segments a sender writes from two CPUs (its thread, and the softirq
/// that runs its ACK processing) can pass each other on the way. All on one CPU, they
/// arrive in the order written.
pub fn pin_this_thread(cpu: usize) {
    let me = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let tid = me
        .file_name()
        .and_then(|t| t.to_str())
        .expect("a thread id")
        .to_string();
    sh(&["taskset", "-p", "-c", &cpu.to_string(), &tid]);
}

/// Copies a test's capture `file` (about to be removed with its temporary directory) to
/// `$TMPDIR/lagtrace-{what}-{pid}.pcap` for a look in Wireshark after a failure; that path.
pub fn keep_capture(file: &Path, what: &str) -> std::path::PathBuf {
    let keep = std::env::temp_dir().join(format!("lagtrace-{what}-{}.pcap", std::process::id()));
    let _ = std::fs::copy(file, &keep);
    keep
}

/// `tshark -r file -T fields [-Y filter] -e ...`: one row per frame, one string per field
/// (a field that occurs several times in a frame: its values joined by commas).
pub fn tshark_fields(file: &Path, filter: Option<&str>, fields: &[&str]) -> Vec<Vec<String>> {
    tshark(file, filter, fields, &[])
}

/// The frame numbers tshark's display `filter` selects (e.g. Wireshark's own retransmission
/// flags), for comparing a detector's frames with tshark's.
pub fn tshark_frames(file: &Path, filter: &str) -> std::collections::BTreeSet<u64> {
    tshark_fields(file, Some(filter), &["frame.number"])
        .into_iter()
        .map(|r| r[0].parse().expect("tshark prints frame numbers"))
        .collect()
}

/// [`tshark_fields`] with `-n -E occurrence=f`: no name resolution, the first occurrence of
/// a repeated field only.
pub fn tshark_fields_first(file: &Path, filter: Option<&str>, fields: &[&str]) -> Vec<Vec<String>> {
    tshark(file, filter, fields, &["-n", "-E", "occurrence=f"])
}

fn tshark(file: &Path, filter: Option<&str>, fields: &[&str], extra: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(file)
        .args(extra)
        .args(["-T", "fields", "-E", "separator=\t"]);
    if let Some(f) = filter {
        cmd.args(["-Y", f]);
    }
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("running tshark");
    assert!(
        out.status.success(),
        "tshark on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// `src` without its first `skip` frames, written to `out` by tshark (frame numbers restart
/// at 1): the capture as one started at frame `skip + 1` would have it — mid-connection for
/// every connection already open.
pub fn capture_from_frame(src: &Path, skip: u64, out: &Path) {
    let (src, out) = (src.to_string_lossy(), out.to_string_lossy());
    let filter = format!("frame.number > {skip}");
    sh(&["tshark", "-r", &src, "-Y", &filter, "-w", &out]);
}

/// The repository's copy of a reference capture: `testdata/case/{name}`
/// (`nagle-delayed-ack.pcap`, `healthy.pcap`). Panics when it is not there.
pub fn case_pcap(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/case")
        .join(name);
    assert!(p.is_file(), "reference capture {} missing", p.display());
    p
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A number no other call in this process returned, for unique names.
pub fn unique() -> u32 {
    SEQ.fetch_add(1, Ordering::SeqCst)
}

/// A name unique on this machine while this process lives: `{prefix}{pid:x}{n:x}`, at most
/// `max` bytes (the pid and counter are kept; the prefix is cut to fit). Interface names
/// take at most 15 bytes.
pub fn unique_name(prefix: &str, max: usize) -> String {
    let tail = format!("{:x}x{:x}", std::process::id(), unique());
    let keep = max.saturating_sub(tail.len()).min(prefix.len());
    format!("{}{tail}", &prefix[..keep])
}

/// Held while a test measures latency (a `lagtrace diagnose` or `load` whose verdict or
/// figures it asserts); dropping it lets the next one run.
pub struct Measuring {
    _lock: Option<std::fs::File>,
}

thread_local!(static MEASURING_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });

/// Compiles the C program `source` into `dir/name` with `cc` and `flags`, holding the
/// measuring turn (compiling takes a CPU: not while another test measures); panics with the
/// compiler's output when it fails. Returns the binary's path.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write the C source");
    let bin = dir.join(name);
    let out = {
        let _turn = measuring();
        Command::new("cc")
            .args(flags)
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .output()
            .expect("cc")
    };
    assert!(
        out.status.success(),
        "cc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// Waits (at most `max`) until the machine is quiet: a 100 ms interval of /proc/stat in
/// which the CPUs were busy less than a fifth of the time — the kernel's own deferred work
/// (a namespace's cleanup, rules freed after their commit) included. Call it holding the
/// measuring turn after tearing down something large.
pub fn settle(max: std::time::Duration) {
    fn busy_total() -> Option<(u64, u64)> {
        let s = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = s
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        let total: u64 = v.iter().take(8).sum();
        Some((total - idle, total))
    }
    let t = std::time::Instant::now();
    while t.elapsed() < max {
        let Some((b0, t0)) = busy_total() else { return };
        std::thread::sleep(std::time::Duration::from_millis(100));
        let Some((b1, t1)) = busy_total() else { return };
        if (b1 - b0) * 5 < (t1 - t0).max(1) {
            return;
        }
    }
}

/// Waits until no other test, in this process or another test binary, is measuring, and
/// holds that until the guard drops. Verdicts judge the tail of real runs: two diagnoses
/// on 2 cores at once make each other's p99 (the scheduler's, not the server's), so the
/// tests that assert a verdict take turns while the rest of the suite stays parallel.
pub fn measuring() -> Measuring {
    use std::os::fd::AsRawFd;
    // Re-entrant on one thread: a test that holds its turn (to time a diagnose from before it
    // starts) may call a helper that takes it again.
    if MEASURING_DEPTH.with(|h| h.get()) > 0 {
        MEASURING_DEPTH.with(|h| h.set(h.get() + 1));
        return Measuring { _lock: None };
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("lagtrace-tests-measuring.lock"))
        .expect("open the measuring lock");
    // SAFETY: flock on a file descriptor this function owns; it blocks until the lock is free
    // and is released when the file is closed (the guard drops).
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    MEASURING_DEPTH.with(|h| h.set(1));
    Measuring { _lock: Some(f) }
}

impl Drop for Measuring {
    fn drop(&mut self) {
        MEASURING_DEPTH.with(|h| h.set(h.get().saturating_sub(1)));
    }
}
