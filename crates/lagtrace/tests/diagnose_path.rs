//! `lagtrace diagnose` against faults of the path that the earlier tests do not build: a
//! standing queue in an htb shaper's deep FIFO on the server's egress, kept full by another
//! client's bulk download while diagnose probes a small page of a real nginx. Labs, qdiscs
//! and the bulk client are removed by guards, also when a test fails. Needs root: marked
//! `#[ignore = "needs root"]`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lagtrace_lab::serve::ServeOptions;
use lagtrace_lab::{Lab, LabOptions};
use serde_json::Value;

use common::BIN;

fn name(test: &str) -> String {
    format!("pq{test}{}", std::process::id())
}

fn show(j: &Value) -> String {
    serde_json::to_string_pretty(&j["verdict"]).unwrap_or_default()
        + "\n"
        + &common::evidence_lines(j)
}

/// Runs `tc ARGS` in the lab's namespace.
fn tc(lab: &Lab, args: &[&str]) {
    let ns = lagtrace_lab::netns_name(lab.name());
    let out = Command::new("tc")
        .args(["-n", &ns])
        .args(args)
        .output()
        .expect("tc");
    assert!(
        out.status.success(),
        "tc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Another client downloading from `addr` back to back (a new connection per download),
/// until dropped or for at most two minutes.
struct Bulk {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Bulk {
    fn start(addr: SocketAddr) -> Bulk {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(120);
            let mut got = 0u64;
            let mut buf = vec![0u8; 1 << 16];
            while !s.load(Ordering::Relaxed) && Instant::now() < end {
                let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || s.load(Ordering::Relaxed) {
                        break;
                    }
                    got += n as u64;
                }
            }
            got
        });
        Bulk {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The lab's real nginx (stock config) behind an htb shaper at 20 Mbit/s whose one class
/// queues in a 300-packet FIFO, on the server's egress. A second client downloads 1 MB
/// bodies from another server in the namespace back to back: its TCP keeps the FIFO full,
/// so every packet toward the clients waits behind it (~10–100 ms on a veth whose RTT is
/// ~50 µs), before the load starts as under it: the SYN RTT does not *rise* under load.
/// An expert reads `tc -s qdisc` (a backlog at the shaper's rate) and the RTT and says
/// bufferbloat. diagnose says path-queueing from the host layer's qdisc, three runs of three.
#[test]
#[ignore = "needs root"]
fn a_queue_kept_full_by_another_clients_download_is_path_queueing_from_the_host() {
    let lab = Lab::up(&LabOptions::new(&name("htb"))).expect("lab up");
    let big = ServeOptions {
        body_size: 1 << 20,
        ..ServeOptions::default()
    };
    lab.start_builtin(Path::new(BIN), 9001, &big)
        .expect("start_builtin");
    let dev = lab.server_iface().to_string();
    tc(
        &lab,
        &[
            "qdisc", "add", "dev", &dev, "root", "handle", "1:", "htb", "default", "10",
        ],
    );
    tc(
        &lab,
        &[
            "class", "add", "dev", &dev, "parent", "1:", "classid", "1:10", "htb", "rate",
            "20mbit", "ceil", "20mbit",
        ],
    );
    tc(
        &lab,
        &[
            "qdisc", "add", "dev", &dev, "parent", "1:10", "handle", "10:", "pfifo", "limit", "300",
        ],
    );
    let _bulk = Bulk::start(SocketAddr::from((lab.server_addr(), 9001)));
    std::thread::sleep(Duration::from_secs(2));
    for run in 1..=3 {
        let (_, j, err) = common::diagnose_json(&lab.good_url(), &["-d", "4s"]);
        let v = &j["verdict"];
        assert_eq!(
            v["cause"],
            "path-queueing",
            "run {run}: {err}\n{}",
            show(&j)
        );
        assert_eq!(j["layers"]["host"]["status"], "finding", "{}", show(&j));
        let host_line = j["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["layer"] == "host" && e["stance"] == "supports")
            .map(|e| e["text"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        assert!(
            host_line.contains(&format!("qdisc htb 1: on {dev}")),
            "run {run}: {}",
            show(&j)
        );
        let fix = v["fix"][0]["location"].as_str().unwrap_or_default();
        assert!(fix.contains(&dev), "run {run}: {}", show(&j));
    }
}
