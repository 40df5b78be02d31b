//! The capture tests' fixture: a network namespace joined to this one by a veth pair, with
//! a tiny TCP server inside it. Unique names per test and process; the [`NetGuard`] removes
//! everything on drop, even after a panic. (Needs no lab crate.)

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use lagtrace_netns::NetNs;

use crate::net::NetGuard;

fn ip(args: &[&str]) {
    let mut v = vec!["ip"];
    v.extend_from_slice(args);
    crate::sh(&v);
}

/// A namespace `ns` with `ns_iface` (address `server`) paired with `host_iface` here
/// (address `client`), and a TCP server on `server:port` answering each line with
/// `reply_len` bytes, then closing.
pub struct NsLab {
    /// The namespace's name.
    pub ns: String,
    /// Host end of the veth pair.
    pub host_iface: String,
    /// Namespace end of the veth pair.
    pub ns_iface: String,
    /// This side's address.
    pub client: Ipv4Addr,
    /// The server's address (inside the namespace).
    pub server: Ipv4Addr,
    /// The server's port.
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    guard: NetGuard,
}

impl NsLab {
    /// Builds the namespace and starts the server. `tag` is a short test name.
    pub fn up(tag: &str, reply_len: usize) -> NsLab {
        let pid = std::process::id();
        let n = crate::unique();
        let ns = format!("lagtrace-cap-{tag}-{pid}-{n}");
        // Interface names are at most 15 bytes.
        let short = format!("{:x}{:x}", pid, n);
        let host_iface = format!("lch{}", &short[short.len().saturating_sub(11)..]);
        let ns_iface = format!("lcn{}", &short[short.len().saturating_sub(11)..]);
        // A /30 in 10.224.0.0/11 derived from pid and sequence.
        let idx = ((pid as u64) * 64 + n as u64) % (1 << 19);
        let base = 0x0AE0_0000u32 + (idx as u32) * 4;
        let client = Ipv4Addr::from(base + 1);
        let server = Ipv4Addr::from(base + 2);
        let mut lab = NsLab {
            ns: ns.clone(),
            host_iface: host_iface.clone(),
            ns_iface: ns_iface.clone(),
            client,
            server,
            port: 0,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
            guard: NetGuard::new(),
        };
        // From here on the guard cleans up whatever got made.
        lab.guard.add_ns_named(&ns);
        lab.guard.add_veth(&host_iface, &ns_iface, &ns);
        ip(&["addr", "add", &format!("{client}/30"), "dev", &host_iface]);
        ip(&["link", "set", &host_iface, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{server}/30"),
            "dev",
            &ns_iface,
        ]);
        ip(&["-n", &ns, "link", "set", &ns_iface, "up"]);

        let netns = NetNs::Named(ns.clone());
        let listener = netns
            .run(|| TcpListener::bind((server, 0)))
            .expect("entering the test namespace")
            .expect("binding the test server");
        lab.port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = lab.stop.clone();
        lab.thread = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        let mut buf = [0u8; 1024];
                        let mut got = Vec::new();
                        while !got.contains(&b'\n') {
                            match s.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(k) => got.extend_from_slice(&buf[..k]),
                            }
                        }
                        let _ = s.write_all(&vec![b'x'; reply_len]);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        }));
        // Wait until the veth carries traffic (IPv6 DAD etc. does not matter for v4).
        for _ in 0..100 {
            // A full exchange, so no late reply of this probe lands in a test's capture.
            if let Ok(mut s) = TcpStream::connect_timeout(&lab.addr(), Duration::from_millis(200)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.write_all(b"probe\n");
                let _ = s.read_to_end(&mut Vec::new());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        lab
    }

    /// The server's address and port.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.server, self.port))
    }

    /// One request/response exchange on a fresh connection; returns the bytes received.
    pub fn exchange(&self) -> usize {
        let mut s = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(5))
            .expect("connecting to the test server");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /\n").unwrap();
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v.len()
    }

    /// The namespace as a NetNs.
    pub fn netns(&self) -> NetNs {
        NetNs::Named(self.ns.clone())
    }
}

impl Drop for NsLab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The guard (a field) then removes the veth and the namespace.
    }
}
