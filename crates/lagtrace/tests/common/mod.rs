//! Fixtures shared by the `analyze*` integration tests: command runners, a root check,
//! a network namespace joined by a veth pair with a guard that removes it (and any tcpdump
//! or nft table the test added) even on panic, tcpdump start/stop, tiny HTTP helpers and
//! the `lagtrace analyze --json` / tshark wrappers. Not every test file uses every item.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Runs `args[0]` with the rest as arguments; panics with its stderr if it fails.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`sh`] inside the network namespace `ns`.
pub fn in_ns(ns: &str, args: &[&str]) {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v);
}

/// True when running as root; otherwise prints `skipped: {why}` and returns false.
pub fn root(why: &str) -> bool {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: {why}");
        return false;
    }
    true
}

/// A namespace joined to this one by a veth pair. Drop kills the tcpdumps, deletes the
/// optional nft netdev table on the host side, the veth and the namespace.
pub struct NsGuard {
    pub netns: String,
    /// Host end of the veth pair.
    pub veth: String,
    /// Namespace end of the veth pair.
    pub peer: String,
    pub dumps: Vec<Child>,
    /// nft netdev table on the host side of our veth (only hooks that device).
    pub host_table: Option<String>,
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        for c in &mut self.dumps {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(t) = &self.host_table {
            let _ = Command::new("nft")
                .args(["delete", "table", "netdev", t])
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// Creates namespace `netns` and veth `veth`/`peer` (peer moved inside), addresses
/// `host_cidr` here and `ns_cidr` inside (with `nodad` when `nodad`), all links up.
/// The guard exists before the first command, so a failure part-way still cleans up.
pub fn veth_ns(
    netns: String,
    veth: String,
    peer: String,
    host_cidr: &str,
    ns_cidr: &str,
    nodad: bool,
) -> NsGuard {
    let g = NsGuard {
        netns,
        veth,
        peer,
        dumps: Vec::new(),
        host_table: None,
    };
    sh(&["ip", "netns", "add", &g.netns]);
    sh(&[
        "ip", "link", "add", &g.veth, "type", "veth", "peer", "name", &g.peer,
    ]);
    sh(&["ip", "link", "set", &g.peer, "netns", &g.netns]);
    let mut add = vec!["ip", "addr", "add", host_cidr, "dev", g.veth.as_str()];
    if nodad {
        add.push("nodad");
    }
    sh(&add);
    sh(&["ip", "link", "set", &g.veth, "up"]);
    let mut add = vec!["ip", "addr", "add", ns_cidr, "dev", g.peer.as_str()];
    if nodad {
        add.push("nodad");
    }
    in_ns(&g.netns, &add);
    in_ns(&g.netns, &["ip", "link", "set", &g.peer, "up"]);
    in_ns(&g.netns, &["ip", "link", "set", "lo", "up"]);
    g
}

/// Loads an nft ruleset from `rules` (`nft -f -`), inside `netns` if given.
pub fn nft_load(netns: Option<&str>, rules: &str) {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    let nft = cmd
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().map(|mut s| s.write_all(rules.as_bytes()));
            c.wait()
        })
        .expect("run nft");
    assert!(nft.success());
}

/// Moves the calling thread into the network namespace `netns` (by name).
pub fn enter_netns(netns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{netns}")).expect("open netns");
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns");
}

/// Starts `tcpdump {opts} -w file "tcp port {port}"` (inside `netns` if given) and waits
/// until it says it is listening.
pub fn spawn_tcpdump(netns: Option<&str>, opts: &[&str], file: &Path, port: u16) -> Child {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tcpdump"]);
            c
        }
        None => Command::new("tcpdump"),
    };
    let mut td = cmd
        .args(opts)
        .arg("-w")
        .arg(file)
        .arg(format!("tcp port {port}"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run tcpdump");
    let mut line = String::new();
    BufReader::new(td.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening"), "tcpdump: {line}");
    td
}

/// [`spawn_tcpdump`] on `dev`, unbuffered, 256-byte snaplen.
pub fn tcpdump_on(netns: Option<&str>, dev: &str, file: &Path, port: u16) -> Child {
    spawn_tcpdump(
        netns,
        &["-i", dev, "-nn", "-U", "--immediate-mode", "-s", "256"],
        file,
        port,
    )
}

/// Stops a tcpdump with SIGINT (so it flushes the file) and waits for it.
pub fn stop_tcpdump(mut td: Child) {
    unsafe { libc::kill(td.id() as i32, libc::SIGINT) };
    let _ = td.wait();
}

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

/// `tshark -r file -Y filter -T fields -e ...`, one row per frame.
pub fn tshark_fields(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(file).args(["-Y", filter, "-T", "fields"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}
