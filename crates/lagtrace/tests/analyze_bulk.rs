//! Packet findings stay true on bulk transfers (issue 14). A real nginx (Debian's) in a
//! server namespace serves 1 MB and 16 MB files to `lagtrace load` in a client namespace;
//! the client reaches it through a bridge, so a capture on `any` in the client namespace
//! sees every packet twice (on the bridge and on its veth port), GSO super-segments
//! included. Both captures — `any` and the veth alone — must give the same findings, and
//! the retransmissions found must be ones the kernel made: at most the namespaces' own
//! `TcpRetransSegs` deltas for the same run (tshark flags the copies as retransmissions
//! too, so it is no ground truth here).
//!
//! - healthy (tcp_nodelay on, sendfile on) at c=1, 32 and 64, and behind a tbf shaper: no
//!   Nagle or delayed-ACK finding;
//! - positive controls: `tcp_nodelay off` with the reference 615 B page keeps
//!   nagle-delayed-ack; a 1 % nftables drop keeps its retransmissions.
//!
//! Everything (namespaces, links, nft tables, nginx, tcpdumps) is removed by guards. Needs
//! root and nginx: marked `#[ignore = "needs root"]`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::analyze_json;
use lagtrace_testkit::net::{NetGuard, nft_load};
use lagtrace_testkit::tcpdump::{stop_tcpdump, tcpdump_on};
use lagtrace_testkit::{in_ns, sh, unique_name};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");
const CLIENT_IP: &str = "10.99.0.1";
const SERVER_IP: &str = "10.99.0.2";
const PORT: u16 = 8080;

/// nginx inside the server namespace; stopped (SIGTERM to its master) on drop.
struct NginxNs {
    master: i32,
}

impl Drop for NginxNs {
    fn drop(&mut self) {
        // SAFETY: signalling the nginx master this test started.
        unsafe { libc::kill(self.master, libc::SIGTERM) };
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{}", self.master)).exists()
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Client and server namespaces joined by a veth pair whose client end is a bridge port.
/// Field order is drop order: nginx stops before the namespaces go.
struct Bench {
    _nginx: NginxNs,
    guard: NetGuard,
    client: String,
    server: String,
    /// The veth end in the client namespace (the bridge's port).
    port_dev: String,
    /// The veth end in the server namespace.
    peer: String,
    dir: tempfile::TempDir,
}

fn nginx_conf(d: &Path, nodelay: bool) -> String {
    let d = d.display();
    let nd = if nodelay { "on" } else { "off" };
    format!(
        "user root;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 256; }}\nhttp {{\n    access_log off;\n    sendfile on;\n    \
         tcp_nopush off;\n    tcp_nodelay {nd};\n    keepalive_requests 100000;\n    \
         client_body_temp_path {d}/tmp;\n    proxy_temp_path {d}/tmp;\n    fastcgi_temp_path {d}/tmp;\n    \
         uwsgi_temp_path {d}/tmp;\n    scgi_temp_path {d}/tmp;\n    \
         server {{\n        listen {PORT};\n        root {d}/html;\n    }}\n}}\n"
    )
}

/// One bench at a time: two at once on a small machine make tcpdump drop packets of the
/// doubled `any` capture, and the captures would differ by what was dropped.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

impl Bench {
    fn up(nodelay: bool) -> Bench {
        let mut guard = NetGuard::new();
        let client = guard.add_ns("bulkc");
        let server = guard.add_ns("bulks");
        let tag = unique_name("lb", 12);
        let (port_dev, peer, br) = (format!("{tag}c"), format!("{tag}s"), format!("{tag}b"));
        // Both ends are created inside the namespaces: they go with them.
        sh(&[
            "ip", "link", "add", &port_dev, "netns", &client, "type", "veth", "peer", "name",
            &peer, "netns", &server,
        ]);
        in_ns(&client, &["ip", "link", "add", &br, "type", "bridge"]);
        in_ns(&client, &["ip", "link", "set", &port_dev, "master", &br]);
        in_ns(
            &client,
            &["ip", "addr", "add", &format!("{CLIENT_IP}/24"), "dev", &br],
        );
        in_ns(&client, &["ip", "link", "set", &port_dev, "up"]);
        in_ns(&client, &["ip", "link", "set", &br, "up"]);
        in_ns(
            &server,
            &[
                "ip",
                "addr",
                "add",
                &format!("{SERVER_IP}/24"),
                "dev",
                &peer,
            ],
        );
        in_ns(&server, &["ip", "link", "set", &peer, "up"]);

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("html")).unwrap();
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        std::fs::write(d.join("html/index.html"), vec![b'x'; 615]).unwrap();
        for mb in [1usize, 4, 16] {
            std::fs::write(d.join(format!("html/{mb}m.bin")), vec![b'b'; mb << 20]).unwrap();
        }
        std::fs::write(d.join("nginx.conf"), nginx_conf(d, nodelay)).unwrap();
        let conf = d.join("nginx.conf");
        let out = Command::new("ip")
            .args(["netns", "exec", &server, "nginx", "-c"])
            .arg(&conf)
            .arg("-p")
            .arg(d)
            .args(["-g", "daemon on;"])
            .output()
            .expect("run nginx");
        assert!(
            out.status.success(),
            "nginx: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t0 = Instant::now();
        let master = loop {
            if let Some(p) = std::fs::read_to_string(d.join("nginx.pid"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no nginx pid file");
            std::thread::sleep(Duration::from_millis(20));
        };
        Bench {
            _nginx: NginxNs { master },
            guard,
            client,
            server,
            port_dev,
            peer,
            dir,
        }
    }

    /// `TcpRetransSegs` of both namespaces together (each sender's own count).
    fn retrans_segs(&self) -> u64 {
        [&self.client, &self.server]
            .iter()
            .map(|ns| snmp_retrans(&in_ns(ns, &["cat", "/proc/net/snmp"])))
            .sum()
    }

    /// Waits (at most 5 s) until the previous run's connections are gone from both
    /// namespaces (TIME-WAIT aside): one still open may resend after the `any` capture
    /// started but before the veth's capture and the kernel's count did (the captures start
    /// one after the other) — seen twice in CI as one resend more on `any` than the kernel
    /// counted, the veth exact.
    fn settle(&self) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            let open = [&self.client, &self.server].iter().any(|ns| {
                in_ns(ns, &["ss", "-Htan", "state", "connected"])
                    .lines()
                    .any(|l| !l.starts_with("TIME-WAIT") && l.contains(&format!(":{PORT}")))
            });
            if !open {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Loads `path` at `c` connections for `dur` while tcpdump captures on `any` and on the
    /// veth port in the client namespace. Returns the two analyses and the kernel's
    /// retransmitted segments meanwhile.
    fn run(&mut self, tag: &str, path: &str, c: u32, dur: &str) -> Run {
        let files: Vec<PathBuf> = ["any", "veth"]
            .iter()
            .map(|w| self.dir.path().join(format!("{tag}-{w}.pcap")))
            .collect();
        let dev = self.port_dev.clone();
        self.settle();
        for (f, d) in files.iter().zip(["any", dev.as_str()]) {
            let td = tcpdump_on(Some(&self.client), d, f, PORT);
            self.guard.own_child(td);
        }
        let before = self.retrans_segs();
        let url = format!("http://{SERVER_IP}:{PORT}/{path}");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.client, BIN, "load", "--json"])
            .args(["-c", &c.to_string(), "-t", &c.min(2).to_string()])
            .args(["-d", dur, "--timeout", "5s", &url])
            .output()
            .expect("lagtrace load");
        assert!(
            out.status.success(),
            "load: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let load: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // The load's connections close under the induced loss: a FIN resent after the
        // captures stopped would be counted by the kernel only (CI run 45: 11 061 resends in
        // both captures, 11 062 by the kernel). Stop when they are done.
        self.settle();
        for td in self.guard.take_children() {
            stop_tcpdump(td);
        }
        // Over the same time as the captures.
        let kernel_retrans = self.retrans_segs() - before;
        // For a post-mortem: LAGTRACE_TEST_KEEP=DIR keeps every run's captures.
        if let Some(keep) = std::env::var_os("LAGTRACE_TEST_KEEP") {
            keep_files(&PathBuf::from(keep), &files);
        }
        let [any, veth] = [&files[0], &files[1]].map(|f| analyze_json(f));
        let r = Run {
            tag: tag.to_string(),
            any,
            veth,
            kernel_retrans,
            files,
        };
        eprintln!(
            "{tag}: load {} requests; kernel retransmitted {} segments; any {:?} (warnings {}); veth {:?}",
            load["requests"],
            r.kernel_retrans,
            counts(&r.any),
            r.any["warnings"],
            counts(&r.veth)
        );
        r
    }
}

fn snmp_retrans(snmp: &str) -> u64 {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap(), tcp.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|w| w == "RetransSegs")
        .unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

struct Run {
    tag: String,
    any: serde_json::Value,
    veth: serde_json::Value,
    kernel_retrans: u64,
    /// The `any` and veth captures, in the bench's temporary directory.
    files: Vec<PathBuf>,
}

/// Copies `files` into `dir` (made if missing); says what it could not copy (it runs in a
/// destructor while a failed check unwinds: a panic there would abort every test of the file).
fn keep_files(dir: &Path, files: &[PathBuf]) {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("cannot keep the captures in {}: {e}", dir.display());
        return;
    }
    for f in files {
        let to = dir.join(f.file_name().unwrap_or_default());
        if let Err(e) = std::fs::copy(f, &to) {
            eprintln!("cannot keep {}: {e}", f.display());
        }
    }
}

/// A run whose checks fail leaves its captures behind (the bench's directory goes with it):
/// the flakes this test has had were seen only in CI, and only the packets can tell a copy
/// taken for a resend from a resend the kernel did not count.
impl Drop for Run {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dir = std::env::temp_dir().join(unique_name("lagtrace-failed-bulk", 40));
            keep_files(&dir, &self.files);
            eprintln!("{}: the captures are kept in {}", self.tag, dir.display());
        }
    }
}

/// Findings per kind.
fn counts(an: &serde_json::Value) -> BTreeMap<String, u64> {
    an["summary"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().unwrap().to_string(),
                s["findings"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Wire segments the retransmission findings of an analysis resent (a retransmitted
/// super-segment counts as the MSS-sized segments the kernel counts; a resent SYN, SYN-ACK
/// or FIN as one).
fn retrans_segments(an: &serde_json::Value) -> u64 {
    let mss = 1448;
    an["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "retransmission" || f["kind"] == "syn-retransmit")
        .map(|f| {
            let e = f["explanation"].as_str().unwrap();
            let bytes: u64 = e
                .split(" of ")
                .nth(1)
                .and_then(|r| r.split(" B").next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(1);
            // A resent FIN carries no payload and counts one segment.
            bytes.div_ceil(mss).max(1)
        })
        .sum()
}

impl Run {
    /// The two captures agree, and their retransmissions are the kernel's.
    fn check_consistent(&self, shaped: bool) {
        let (a, v) = (counts(&self.any), counts(&self.veth));
        // The two tcpdumps start and stop a moment apart (a transaction at either edge may
        // be in one file only) and stamp the same packet microseconds apart: counts agree up
        // to that. Retransmissions: Wireshark's rule calls a resend within one handshake RTT
        // of the sender's newest data out-of-order, and the captures' handshake RTTs differ
        // by those microseconds, which moves that line for resends right at it (seen: 173
        // against 199 under a 1 % drop, every one of them a real resend).
        let close =
            |x: u64, y: u64, pct: u64| x.abs_diff(y) <= 3 || x.abs_diff(y) * 100 <= pct * x.max(y);
        for k in [
            "nagle-delayed-ack",
            "nagle-stall",
            "delayed-ack",
            "held-until-ack",
            "syn-retransmit",
            "tcp-cork",
            "retransmission",
        ] {
            let (x, y) = (
                a.get(k).copied().unwrap_or(0),
                v.get(k).copied().unwrap_or(0),
            );
            let pct = if k == "retransmission" { 20 } else { 10 };
            assert!(
                close(x, y, pct),
                "{}: {k} on any {a:?}, on the veth {v:?}",
                self.tag
            );
        }
        let tx = |an: &serde_json::Value| an["transactions_total"].as_u64().unwrap();
        assert!(close(tx(&self.any), tx(&self.veth), 5), "{}", self.tag);
        // Against the senders' own counters. A resend the capture cannot miss counts as the
        // kernel counts it (per wire segment; a resend right after its original on a
        // reordering path too: the IPv4 identifications tell it from the original arriving
        // late — one 16 MB c=1 run had 409 by the kernel, 184 by Wireshark's time rule).
        // Never more than the kernel (a copy or a late original counted as a resend). Less
        // only where a capture missed packets: behind a shaper that drops before the capture
        // point, or when tcpdump dropped some on a loaded machine (then the two captures
        // disagree: seen 163 on `any` against 188, the veth's count another); when the two
        // independent captures agree, they saw it all and equal the kernel.
        let k = self.kernel_retrans;
        let [on_any, on_veth] = [&self.any, &self.veth].map(retrans_segments);
        eprintln!(
            "{}: retransmitted segments: any {on_any}, veth {on_veth}, kernel {k}",
            self.tag
        );
        for (w, ours) in [("any", on_any), ("veth", on_veth)] {
            assert!(
                ours <= k,
                "{}: {w}: {ours} resent segments, the kernel {k}",
                self.tag
            );
            assert!(
                shaped || on_any != on_veth || ours == k,
                "{}: {w}: {ours} resent segments (both captures), the kernel {k}",
                self.tag
            );
        }
        // The `any` capture did see the copies (else this test tests nothing).
        assert!(
            self.any["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str().unwrap().contains("second capture")),
            "{}: {:?}",
            self.tag,
            self.any["warnings"]
        );
    }

    /// No Nagle-shaped finding at all, delayed-ACK stalls on at most a tenth of the
    /// transactions. A stream's next data sometimes waits through the client's delayed ACK
    /// of a small tail (376 B after each 64 KB sendfile chunk) while one nginx worker serves
    /// the other connections (16 MB c=32, behind tbf): released late, after the worker sent
    /// on other connections since the ACK, those are its scheduling and not named (issue 14
    /// item 5; 11 delayed-ack findings on 137 transactions before, 2 after, same capture).
    fn check_no_ack_stalls(&self) {
        // The same veth capture as one started mid-transfer (issue 36): the first half of
        // its frames cut, so no handshake and no window scale in it. Every full window named
        // there is a frame tshark calls full on the whole file, where the scale is known (a
        // raw window read as bytes named hundreds that were not). Counts are not compared:
        // how long the sender then waited depends on which later segments are resends, and
        // under loss the cut's sequence history differs from the whole's (1m-c8-tbf: the
        // whole's next fresh data 0.5 ms after a full window, the cut's 3.7 ms).
        let frames = self.veth["frames"].as_u64().unwrap();
        let half = frames / 2;
        let cut = self.files[1].with_extension("cut.pcap");
        lagtrace_testkit::capture_from_frame(&self.files[1], half, &cut);
        let mid = analyze_json(&cut);
        assert!(
            mid["mid_connection_streams"].as_u64() > Some(0),
            "{}",
            self.tag
        );
        let full = lagtrace_testkit::tshark_frames(&self.files[1], "tcp.analysis.window_full");
        for f in mid["findings"].as_array().unwrap() {
            if f["kind"] == "window-full" {
                let at = f["frames"][0].as_u64().unwrap() + half;
                assert!(
                    full.contains(&at),
                    "{}: window-full at frame {at} of the whole capture, not full for tshark: {f}",
                    self.tag
                );
            }
        }
        for an in [&self.any, &self.veth, &mid] {
            let c = counts(an);
            for k in ["nagle-delayed-ack", "nagle-stall", "held-until-ack"] {
                assert!(
                    !c.contains_key(k),
                    "{}: {k} on a healthy server: {c:?}",
                    self.tag
                );
            }
            // At most a tenth of the transactions — and one, where a tenth is less than one:
            // the half capture of the tbf case holds ~8 transactions, and one delayed ACK
            // there (a true one: the shaper's pause can outlast the ACK timer) is 12.5 %.
            let (da, n) = an["summary"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["kind"] == "delayed-ack")
                .map_or((0.0, 0), |s| {
                    (
                        s["share"].as_f64().unwrap(),
                        s["transactions_affected"].as_u64().unwrap(),
                    )
                });
            let limit = 0.1;
            assert!(
                da <= limit || n <= 1,
                "{}: delayed-ack on {da} of transactions ({n}): {c:?}",
                self.tag
            );
        }
    }
}

#[test]
#[ignore = "needs root"]
fn bulk_transfers_from_a_healthy_nginx_show_no_ack_stalls_and_no_copies() {
    let _one = serial();
    let mut b = Bench::up(true);
    for (mb, c) in [(1, 1), (1, 32), (16, 1), (16, 32), (4, 64)] {
        let r = b.run(&format!("{mb}m-c{c}"), &format!("{mb}m.bin"), c, "1500ms");
        r.check_consistent(false);
        r.check_no_ack_stalls();
    }
    // Behind a tbf shaper (100 Mbit/s, 64 KB queue) on the server's egress.
    let peer = b.peer.clone();
    in_ns(
        &b.server,
        &[
            "tc", "qdisc", "add", "dev", &peer, "root", "tbf", "rate", "100mbit", "burst", "32kb",
            "limit", "65536",
        ],
    );
    // 100 Mbit/s moves ~12 transfers of 1 MB a second: 6 s gives the share bound ~70
    // transactions to be measured on (at 2 s, ~25: one finding moved the share 4 %, and CI
    // run 35 failed on 3 of 29).
    let r = b.run("1m-c8-tbf", "1m.bin", 8, "6s");
    r.check_consistent(true);
    r.check_no_ack_stalls();
}

#[test]
#[ignore = "needs root"]
fn nagle_and_loss_keep_their_findings_through_the_copies() {
    let _one = serial();
    // nginx with tcp_nodelay off, the reference page, a few keep-alive connections.
    let mut b = Bench::up(false);
    let r = b.run("nodelay-off", "index.html", 3, "1s");
    r.check_consistent(false);
    for an in [&r.any, &r.veth] {
        let n = counts(an).get("nagle-delayed-ack").copied().unwrap_or(0);
        assert!(n >= 10, "{}: {:?}", r.tag, counts(an));
    }
    // This run's captures go with its bench (CI run 45: a later failure had this run try to
    // keep captures already removed, and its destructor's panic aborted the whole file).
    drop(r);
    drop(b);
    // 1 % of the server's TCP packets dropped at the ingress of the client's veth port.
    let mut b = Bench::up(true);
    let table = unique_name("ltbulk", 30).replace('-', "_");
    nft_load(
        Some(&b.client),
        &format!(
            "table netdev {table} {{\n  chain c {{\n    type filter hook ingress device \"{}\" priority 0; policy accept;\n    ip saddr {SERVER_IP} meta l4proto tcp numgen random mod 100 < 1 counter drop\n  }}\n}}\n",
            b.port_dev
        ),
    );
    let r = b.run("drop1", "1m.bin", 4, "1500ms");
    // Dropped after the capture point (the tap runs before the netdev hook): seen whole.
    r.check_consistent(false);
    for an in [&r.any, &r.veth] {
        let n = counts(an).get("retransmission").copied().unwrap_or(0);
        assert!(n > 0, "{}: {:?}", r.tag, counts(an));
    }
}

/// Issue 14, acceptance point 3: segments nginx (tcp_nodelay on) writes are dropped on its
/// own host before the wire (an nftables rule on the server namespace's output path), so
/// the capture sees only their resends, released late by the client's ACKs or the
/// retransmission timer; the clients re-send requests whose answers are late. None of
/// that is Nagle or a delayed ACK: `analyze` alone names no nagle*/delayed-ack finding on
/// either capture, shows the losses (retransmissions, held-until-ack), and its resend count
/// lies between the kernel's (`TcpRetransSegs` of both namespaces) less the segments the
/// rule dropped (resends the capture never saw, or whose original it never saw at the
/// stream's tail) and the kernel's. Three runs at varied shares: the same answer each time.
#[test]
#[ignore = "needs root"]
fn a_drop_before_the_wire_is_not_nagle() {
    let _one = serial();
    let mut b = Bench::up(true);
    let table = unique_name("ltwd", 30).replace('-', "_");
    let mut dropped_any = 0;
    for (i, pct) in [3u8, 5, 4].into_iter().enumerate() {
        // The data segments (IP length over a bare ACK's) leaving nginx, before the wire.
        nft_load(
            Some(&b.server),
            &format!(
                "table inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    tcp sport {PORT} ip length > 80 numgen random mod 100 < {pct} counter drop\n  }}\n}}\n"
            ),
        );
        let r = b.run(&format!("wiredrop{i}-{pct}pct"), "index.html", 8, "2s");
        let listed = in_ns(&b.server, &["nft", "list", "table", "inet", &table]);
        let dropped: u64 = listed
            .split("counter packets ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        dropped_any += dropped;
        // Dropped before every capture point: the captures see less than the kernel sent.
        r.check_consistent(true);
        for (w, an) in [("any", &r.any), ("veth", &r.veth)] {
            let c = counts(an);
            // Nor a cork: a body resent ~200 ms late after sends the capture never saw
            // (their IPv4 identifications skipped) is dropped-before-capture.
            for k in [
                "nagle-delayed-ack",
                "nagle-stall",
                "delayed-ack",
                "tcp-cork",
            ] {
                assert!(
                    !c.contains_key(k),
                    "{}: {w}: {k} on drops before the wire: {c:?}\n{}",
                    r.tag,
                    stall_lines(an)
                );
            }
            assert!(
                c.contains_key("retransmission") || c.contains_key("held-until-ack"),
                "{}: {w}: the losses are not shown: {c:?}",
                r.tag
            );
            let ours = retrans_segments(an);
            eprintln!(
                "{}: {w}: {ours} resent segments, kernel {}, dropped by nft {dropped}",
                r.tag, r.kernel_retrans
            );
            assert!(
                ours + dropped >= r.kernel_retrans,
                "{}: {w}: {ours} resent segments, kernel {}, dropped {dropped}",
                r.tag,
                r.kernel_retrans
            );
        }
        // Each run counts its own drops.
        nft_load(Some(&b.server), &format!("delete table inet {table}\n"));
    }
    assert!(dropped_any > 0, "the rule dropped nothing");
}

/// The stall findings of an analysis, one line each, for a failure message.
fn stall_lines(an: &serde_json::Value) -> String {
    an["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["kind"]
                .as_str()
                .is_some_and(|k| k.contains("nagle") || k.contains("ack") || k == "tcp-cork")
        })
        .map(|f| format!("{} {} {}\n", f["kind"], f["frames"], f["explanation"]))
        .collect()
}

/// The issue's own case, end to end: `lagtrace diagnose` against a healthy nginx
/// (tcp_nodelay on, sendfile on) serving a 4 MB file at the default c=32, from the client
/// namespace through the bridge — `healthy` on every run, no Nagle/delayed-ACK or loss
/// evidence for it, and the sockets layer read the server's sockets (the direct evidence
/// that rules Nagle out).
#[test]
#[ignore = "needs root"]
fn diagnose_of_a_healthy_nginx_serving_megabytes_is_healthy_every_run() {
    let _one = serial();
    let b = Bench::up(true);
    let url = format!("http://{SERVER_IP}:{PORT}/4m.bin");
    for run in 1..=3 {
        let (_, j, err) =
            common::diagnose_json_via(&["ip", "netns", "exec", &b.client], &url, &["-d", "4s"]);
        let ev = common::evidence_lines(&j);
        assert_eq!(
            j["verdict"]["cause"], "healthy",
            "run {run}: {err}\n{}\n{ev}",
            j["verdict"]
        );
        assert_eq!(j["layers"]["sockets"]["status"], "ok", "run {run}: {ev}");
        for l in ev.lines().filter(|l| l.starts_with("\"supports\"")) {
            assert!(
                !l.contains("Nagle") && !l.contains("retransmi"),
                "run {run}: {l}"
            );
        }
    }
}
