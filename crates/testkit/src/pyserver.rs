//! Python servers started inside a [`VethNs`] (faults lagtrace did not write), owned by its
//! guard: killed on drop even after a panic.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::VethNs;

/// Keep-alive HTTP/1.1, one thread per connection, TCP_NODELAY on, each response one write;
/// the `EVERY`-th request of each connection sleeps `SLOW` seconds first.
/// Arguments: PORT EVERY SLOW.
pub const EVERY_NTH: &str = r#"
import socket, sys, threading, time
PORT, EVERY, SLOW = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf, k = b"", 0
    while True:
        while b"\r\n\r\n" not in buf:
            d = c.recv(4096)
            if not d:
                c.close()
                return
            buf += d
        buf = buf.split(b"\r\n\r\n", 1)[1]
        k += 1
        if k % EVERY == 0:
            time.sleep(SLOW)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n")
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", PORT))
s.listen(512)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Starts [`EVERY_NTH`] in `g`'s namespace on `addr` (the namespace end's address), slow on
/// every `every`-th request by `slow_ms`, and waits until it accepts; its pid.
pub fn every_nth(g: &mut VethNs, addr: SocketAddr, every: u32, slow_ms: u32) -> u32 {
    let child = Command::new("ip")
        .args(["netns", "exec", &g.netns, "python3", "-c", EVERY_NTH])
        .args([
            addr.port().to_string(),
            every.to_string(),
            format!("{}", f64::from(slow_ms) / 1000.0),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    // `ip netns exec` execs the program: the child is the server.
    let pid = child.id();
    g.guard.own_child(child);
    wait_accepting(addr, Duration::from_secs(10));
    pid
}

/// Waits until something accepts on `addr`; panics after `within`.
pub fn wait_accepting(addr: SocketAddr, within: Duration) {
    let t = Instant::now();
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(t.elapsed() < within, "nothing accepts on {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
