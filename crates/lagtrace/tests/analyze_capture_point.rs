//! The same stall seen from both ends: a server in a network namespace this test creates
//! (joined by a veth pair), a client here, tcpdump on BOTH sides at once — inside the
//! namespace on the server's interface, and here on the host end. `lagtrace analyze` must
//! name the same finding on each capture (on the server's side the delayed ACK arrives one
//! RTT later and the held segment leaves at once; on the client's side the reverse).
//! IPv4 and IPv6. Everything is removed by a guard. Needs root: marked `#[ignore = "needs root"]`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{analyze_json, kinds, read_request};
use lagtrace_testkit::net::{VethNs, enter_netns};
use lagtrace_testkit::tcpdump::{stop_tcpdump, tcpdump_on};

/// Namespace + veth; returns the guard (peer = the device inside) and the namespace's address.
fn lab(which: u32, v6: bool) -> (VethNs, String) {
    let pid = std::process::id();
    let (host, ns, plen) = if v6 {
        let n = format!("fd00:1a7:{:x}:{which}", pid % 0xffff);
        (format!("{n}::1"), format!("{n}::2"), "64")
    } else {
        let n = format!("10.{}.{}", 240 - which, (pid % 250) + 1);
        (format!("{n}.1"), format!("{n}.2"), "30")
    };
    let g = VethNs::up(
        &format!("analyze-cp-{which}"),
        &format!("{host}/{plen}"),
        &format!("{ns}/{plen}"),
        v6,
    );
    (g, ns)
}

fn tcpdump(g: &mut VethNs, netns: Option<&str>, dev: &str, file: &Path, port: u16) {
    let td = tcpdump_on(netns, dev, file, port);
    g.guard.own_child(td);
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
    let (mut g, ns_ip) = lab(which, v6);
    let peer = g.peer.clone();
    let port: u16 = 21_000 + (std::process::id() % 1000) as u16 + 1000 * which as u16;
    let bind: SocketAddr = if v6 {
        format!("[{ns_ip}]:{port}")
    } else {
        format!("{ns_ip}:{port}")
    }
    .parse()
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let netns = g.netns.clone();
    let server = std::thread::spawn(move || {
        enter_netns(&netns);
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
    for td in g.guard.take_children() {
        stop_tcpdump(td);
    }
    Some([analyze_json(&files[0]), analyze_json(&files[1])])
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
#[ignore = "needs root"]
fn nagle_delayed_ack_named_from_server_and_client_side_ipv4() {
    check_both(run(1, false, Split::Response, 8), 8);
}

#[test]
#[ignore = "needs root"]
fn nagle_delayed_ack_named_from_server_and_client_side_ipv6() {
    check_both(run(2, true, Split::Response, 8), 8);
}

/// The client writes its request in two pieces with Nagle on; the server's delayed ACK of
/// the first piece releases the second: the same finding, in the other direction.
#[test]
#[ignore = "needs root"]
fn request_split_by_client_nagle_meets_server_delayed_ack() {
    check_both(run(3, false, Split::Request, 8), 8);
}
