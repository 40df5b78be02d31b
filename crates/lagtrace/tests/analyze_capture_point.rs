//! The same stall seen from both ends: a server in a network namespace this test creates
//! (joined by a veth pair), a client here, tcpdump on BOTH sides at once — inside the
//! namespace on the server's interface, and here on the host end. `lagtrace analyze` must
//! name the same finding on each capture (on the server's side the delayed ACK arrives one
//! RTT later and the held segment leaves at once; on the client's side the reverse).
//! IPv4 and IPv6. Everything is removed by a guard. Needs root; without it the tests say so.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Guard {
    netns: String,
    veth: String,
    dumps: Vec<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.dumps {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

fn sh(args: &[&str]) {
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

/// Namespace + veth; returns the guard, the namespace's address and the device inside.
fn lab(which: u32, v6: bool) -> (Guard, String, String) {
    let pid = std::process::id();
    let tag = pid % 100_000;
    let g = Guard {
        netns: format!("lt-analyze-cp-{which}-{pid}"),
        veth: format!("lcp{tag}{which}h"),
        dumps: Vec::new(),
    };
    let peer = format!("lcp{tag}{which}n");
    sh(&["ip", "netns", "add", &g.netns]);
    sh(&[
        "ip", "link", "add", &g.veth, "type", "veth", "peer", "name", &peer,
    ]);
    sh(&["ip", "link", "set", &peer, "netns", &g.netns]);
    let (host, ns, plen) = if v6 {
        let n = format!("fd00:1a7:{:x}:{which}", pid % 0xffff);
        (format!("{n}::1"), format!("{n}::2"), "64")
    } else {
        let n = format!("10.{}.{}", 240 - which, (pid % 250) + 1);
        (format!("{n}.1"), format!("{n}.2"), "30")
    };
    let mut add = vec!["ip", "addr", "add"];
    let ha = format!("{host}/{plen}");
    add.extend([ha.as_str(), "dev", g.veth.as_str()]);
    if v6 {
        add.push("nodad");
    }
    sh(&add);
    sh(&["ip", "link", "set", &g.veth, "up"]);
    let na = format!("{ns}/{plen}");
    let mut add = vec![
        "ip", "netns", "exec", &g.netns, "ip", "addr", "add", &na, "dev", &peer,
    ];
    if v6 {
        add.push("nodad");
    }
    sh(&add);
    sh(&[
        "ip", "netns", "exec", &g.netns, "ip", "link", "set", &peer, "up",
    ]);
    sh(&[
        "ip", "netns", "exec", &g.netns, "ip", "link", "set", "lo", "up",
    ]);
    (g, ns, peer)
}

fn tcpdump(g: &mut Guard, netns: Option<&str>, dev: &str, file: &Path, port: u16) {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tcpdump"]);
            c
        }
        None => Command::new("tcpdump"),
    };
    let mut td = cmd
        .args([
            "-i",
            dev,
            "-nn",
            "-U",
            "--immediate-mode",
            "-s",
            "256",
            "-w",
        ])
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
    g.dumps.push(td);
}

fn read_request(s: &mut TcpStream) -> bool {
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

/// Who makes the two small writes with Nagle on.
#[derive(Clone, Copy, PartialEq)]
enum Split {
    /// The server writes headers and body separately (nginx `tcp_nodelay off`).
    Response,
    /// The client writes its request line and its headers separately.
    Request,
}

const BODY: usize = 600;

/// Runs `n` keep-alive requests and returns (server-side analysis, client-side analysis).
fn run(which: u32, v6: bool, split: Split, n: usize) -> Option<[serde_json::Value; 2]> {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (CAP_NET_ADMIN, CAP_NET_RAW) for a namespace and tcpdump");
        return None;
    }
    let (mut g, ns_ip, peer) = lab(which, v6);
    let port: u16 = 21_000 + (std::process::id() % 1000) as u16 + 1000 * which as u16;
    let bind: SocketAddr = if v6 {
        format!("[{ns_ip}]:{port}")
    } else {
        format!("{ns_ip}:{port}")
    }
    .parse()
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let ns_path = format!("/run/netns/{}", g.netns);
    let server = std::thread::spawn(move || {
        let f = std::fs::File::open(&ns_path).expect("open netns");
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let l = TcpListener::bind(bind).expect("bind in namespace");
        tx.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if split == Split::Request {
            s.set_nodelay(true).unwrap();
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\nX-Pad: {}\r\nContent-Length: {BODY}\r\n\r\n",
            "p".repeat(150)
        );
        while read_request(&mut s) {
            if split == Split::Response {
                s.write_all(head.as_bytes()).unwrap();
                s.write_all(&[b'b'; BODY]).unwrap();
            } else {
                let mut all = head.clone().into_bytes();
                all.extend_from_slice(&[b'b'; BODY]);
                s.write_all(&all).unwrap();
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("server up");
    let dir = tempfile::tempdir().unwrap();
    let files: [PathBuf; 2] = [
        dir.path().join("server.pcap"),
        dir.path().join("client.pcap"),
    ];
    let netns = g.netns.clone();
    tcpdump(&mut g, Some(&netns), &peer, &files[0], port);
    let veth = g.veth.clone();
    tcpdump(&mut g, None, &veth, &files[1], port);

    let mut c = TcpStream::connect_timeout(&bind, Duration::from_secs(5)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_nodelay(split == Split::Response).unwrap();
    let mut buf = vec![0u8; 65536];
    for _ in 0..n {
        if split == Split::Request {
            c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
            c.write_all(b"Host: t\r\n\r\n").unwrap();
        } else {
            c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        }
        let mut got = 0;
        while got < 150 + BODY {
            let k = c.read(&mut buf).unwrap();
            assert!(k > 0);
            got += k;
        }
    }
    drop(c);
    server.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for td in &mut g.dumps {
        unsafe { libc::kill(td.id() as i32, libc::SIGINT) };
        let _ = td.wait();
    }
    g.dumps.clear();
    let an = |f: &Path| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
            .args(["analyze", "--json"])
            .arg(f)
            .output()
            .unwrap();
        // Exit 1 means "findings"; 2 would be an error.
        assert_ne!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    Some([an(&files[0]), an(&files[1])])
}

fn kinds(an: &serde_json::Value) -> Vec<(String, u64, u64)> {
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

fn check_both(res: Option<[serde_json::Value; 2]>, n: usize) {
    let Some(res) = res else { return };
    for (side, an) in ["server side", "client side"].iter().zip(&res) {
        let k = kinds(an);
        eprintln!("{side}: {k:?}");
        let nda: Vec<_> = k
            .iter()
            .filter(|(k, _, _)| k == "nagle-delayed-ack")
            .collect();
        // The first request escapes (quick-ACK mode); the later ones pay ~40 ms each.
        assert!(nda.len() + 2 >= n, "{side}: {k:?}");
        assert!(
            nda.iter()
                .all(|(_, t, c)| *t >= 1 && (30_000..120_000).contains(c)),
            "{side}: {k:?}"
        );
        assert!(
            !k.iter().any(|(k, _, _)| k == "slow-server"
                || k == "tcp-cork"
                || k == "nagle-stall"
                || k == "delayed-ack"),
            "{side}: {k:?}"
        );
        assert_eq!(an["transactions_total"].as_u64(), Some(n as u64), "{side}");
    }
}

#[test]
fn nagle_delayed_ack_named_from_server_and_client_side_ipv4() {
    check_both(run(1, false, Split::Response, 8), 8);
}

#[test]
fn nagle_delayed_ack_named_from_server_and_client_side_ipv6() {
    check_both(run(2, true, Split::Response, 8), 8);
}

/// The client writes its request in two pieces with Nagle on; the server's delayed ACK of
/// the first piece releases the second: the same finding, in the other direction.
#[test]
fn request_split_by_client_nagle_meets_server_delayed_ack() {
    check_both(run(3, false, Split::Request, 8), 8);
}
