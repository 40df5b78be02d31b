//! Real nginx instances (Debian's binary) on loopback or inside a network namespace the test
//! creates, each stopped by its guard even on panic, and a keep-alive client for them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A port on 127.0.0.1 that refuses connections for as long as this lives: a TCP socket
/// bound to it but not listening (no SO_REUSEADDR). Unlike a port bound then released, no
/// test running beside this one can take it and accept the connects meant to be refused.
pub struct ClosedPort {
    fd: std::os::fd::OwnedFd,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain socket calls on a descriptor this function owns; the sockaddr is
        // a zeroed sockaddr_in of its own size.
        unsafe {
            let raw = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(raw >= 0, "socket: {}", std::io::Error::last_os_error());
            let fd = std::os::fd::OwnedFd::from_raw_fd(raw);
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let p = (&raw mut sa).cast::<libc::sockaddr>();
            assert_eq!(
                libc::bind(fd.as_raw_fd(), p, len),
                0,
                "bind: {}",
                std::io::Error::last_os_error()
            );
            assert_eq!(libc::getsockname(fd.as_raw_fd(), p, &mut len), 0);
            ClosedPort {
                fd,
                port: u16::from_be(sa.sin_port),
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Default for ClosedPort {
    fn default() -> Self {
        ClosedPort::new()
    }
}

impl std::fmt::Debug for ClosedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClosedPort({}, fd {:?})", self.port, self.fd)
    }
}

/// A real nginx master (+1 worker) with its own prefix directory; stopped on drop.
pub struct Nginx {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    pub port: u16,
    pub master: u32,
}

/// Writes an nginx config (prefix = a new temporary directory) listening on 127.0.0.1:port
/// with `http_extra` inside `http {}`.
pub fn nginx_conf(http_extra: &str, port: u16) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("logs")).unwrap();
    let conf = d.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes 1;\npid {pid};\nerror_log {d}/logs/error.log;\nevents {{ }}\n\
             http {{\n    access_log off;\n{http_extra}    server {{\n        listen 127.0.0.1:{port};\n        \
             root /var/www/html;\n        index index.nginx-debian.html;\n    }}\n}}\n",
            pid = d.join("nginx.pid").display(),
            d = d.display()
        ),
    )
    .unwrap();
    (dir, conf)
}

/// The latency server's http block, as in the reference case.
pub const LATENCY_HTTP: &str =
    "    sendfile on;\n    tcp_nopush off;\n    tcp_nodelay off;\n    keepalive_timeout 65;\n";

impl Nginx {
    /// Starts nginx listening on 127.0.0.1:port with `http_extra` inside `http {}`,
    /// optionally inside a namespace.
    pub fn start(http_extra: &str, port: u16, netns: Option<&str>) -> Nginx {
        let (dir, conf) = nginx_conf(http_extra, port);
        let d = dir.path();
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "nginx"]);
                c
            }
            None => Command::new("nginx"),
        };
        let out = cmd
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(d)
            .args(["-g", "daemon on;"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nginx failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pidfile = d.join("nginx.pid");
        let t0 = Instant::now();
        let master = loop {
            if let Some(p) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no nginx pid file");
            std::thread::sleep(Duration::from_millis(20));
        };
        Nginx {
            dir,
            conf,
            port,
            master,
        }
    }

    /// The 1-based line of the first line of the config containing `needle`.
    pub fn line_of(&self, needle: &str) -> u32 {
        let text = std::fs::read_to_string(&self.conf).unwrap();
        text.lines().position(|l| l.contains(needle)).unwrap() as u32 + 1
    }

    pub fn conf_path(&self) -> &Path {
        &self.conf
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: signalling the nginx master this fixture started.
        unsafe { libc::kill(self.master as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while Path::new(&format!("/proc/{}", self.master)).exists()
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends `n` keep-alive GETs on one connection, reading each full response; returns the
/// still-open connection (nginx has set its keep-alive socket options by then).
pub fn keepalive_client(port: u16, n: usize) -> TcpStream {
    keepalive_to(SocketAddr::from(([127, 0, 0, 1], port)), n)
}

/// [`keepalive_client`] to any address (5 s connect timeout).
pub fn keepalive_to(addr: SocketAddr, n: usize) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for _ in 0..n {
        s.write_all(b"GET / HTTP/1.1\r\nHost: lt\r\n\r\n").unwrap();
        read_response(&mut s);
    }
    s
}

fn read_response(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "connection closed mid-response");
        buf.extend_from_slice(&tmp[..n]);
        if let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..h]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if buf.len() >= h + 4 + len {
                return;
            }
        }
    }
}
