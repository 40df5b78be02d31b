//! The built-in HTTP/1.1 fault server: keep-alive, with switches for the socket behaviours
//! that make request latency (Nagle via TCP_NODELAY off, split writes, TCP_CORK left on, a
//! think time, the response size).
//!
//! One thread per connection; the listener polls a stop flag so [`Server`] stops on drop.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lagtrace_netns::NetNs;

/// The largest request head accepted before answering 400.
const MAX_HEAD: usize = 16 * 1024;
/// How often blocked threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// How the server behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// TCP_NODELAY on accepted sockets (off = Nagle's algorithm on).
    pub nodelay: bool,
    /// Headers and body in two `write`s (one otherwise).
    pub split_writes: bool,
    /// Time to wait before each response.
    pub think: Duration,
    /// Set TCP_CORK on accepted sockets and leave it on.
    pub cork: bool,
    /// Response body size in bytes.
    pub body_size: usize,
    /// Namespace the listening socket is opened in.
    pub netns: NetNs,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            nodelay: true,
            split_writes: false,
            think: Duration::ZERO,
            cork: false,
            body_size: DEFAULT_BODY_SIZE,
            netns: NetNs::Current,
        }
    }
}

impl ServeOptions {
    /// The command-line flags of `lagtrace serve` that reproduce these options
    /// (without `--netns`: the lab starts the process inside the namespace instead).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "serve".to_string(),
            "--listen".into(),
            self.listen.to_string(),
            "--nodelay".into(),
            if self.nodelay { "on" } else { "off" }.into(),
            "--body-size".into(),
            self.body_size.to_string(),
        ];
        if self.split_writes {
            a.push("--split-writes".into());
        }
        if self.cork {
            a.push("--cork".into());
        }
        if !self.think.is_zero() {
            a.push("--think".into());
            a.push(self.think.as_millis().to_string());
        }
        a
    }
}

/// Size of the default body: the same as Debian's stock nginx index.html.
pub const DEFAULT_BODY_SIZE: usize = 615;

/// A running in-process server; stops (listener and connections) when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `opts.listen` (inside `opts.netns`) and serves on background threads.
    pub fn spawn(opts: ServeOptions) -> io::Result<Server> {
        let listen = opts.listen;
        let listener = opts.netns.run(move || bind(listen))??;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (requests.clone(), stop.clone());
        let opts = Arc::new(opts);
        let thread = std::thread::Builder::new()
            .name(format!("serve {addr}"))
            .spawn(move || accept_loop(&listener, &opts, &r, &s))?;
        Ok(Server {
            addr,
            requests,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far (200s and 400s).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The shared request counter (readable after [`Server::wait`] consumed the server).
    pub fn request_counter(&self) -> Arc<AtomicU64> {
        self.requests.clone()
    }

    /// Blocks until the server stops (never, unless [`Server::stop`] runs elsewhere).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// A handle that stops the server from another thread (e.g. a signal handler).
    pub fn stopper(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Stops accepting and closes connections.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())
        .map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
    sock.listen(1024)?;
    Ok(sock.into())
}

fn accept_loop(
    listener: &TcpListener,
    opts: &Arc<ServeOptions>,
    n: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) {
    // The sockets of live connections, to shut them down at stop: a thread blocked writing
    // to a client that stopped reading would never see the flag. A thread removes its fd
    // under the lock before closing it, so only open sockets are ever shut down.
    let live: Arc<Mutex<Vec<RawFd>>> = Arc::new(Mutex::new(Vec::new()));
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let (o, n, s, l) = (opts.clone(), n.clone(), stop.clone(), live.clone());
                let fd = stream.as_raw_fd();
                lock(&live).push(fd);
                let spawned =
                    std::thread::Builder::new()
                        .name("serve conn".into())
                        .spawn(move || {
                            let mut stream = stream;
                            let _ = connection(&mut stream, &o, &n, &s);
                            lock(&l).retain(|&f| f != fd);
                            drop(stream);
                        });
                match spawned {
                    Ok(h) => conns.push(h),
                    Err(e) => {
                        lock(&live).retain(|&f| f != fd);
                        log(&format!("no thread for a connection: {e}"));
                    }
                }
                conns.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(listener, POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log(&format!("accept: {e}"));
                std::thread::sleep(POLL);
            }
        }
    }
    for &fd in lock(&live).iter() {
        // SAFETY: `fd` is open: its thread removes it from `live` (under this lock) before
        // closing it.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }
    for h in conns {
        let _ = h.join();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits until `listener` has a connection to accept, at most `limit`.
fn wait_readable(listener: &TcpListener, limit: Duration) {
    let mut fds = [libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid array of one pollfd for the duration of the call.
    unsafe {
        libc::poll(fds.as_mut_ptr(), 1, ms);
    }
}

/// Reports a server-side problem through the `log` facade (target `lagtrace serve`); the
/// binary installs the printer, the engine never prints.
fn log(msg: &str) {
    log::warn!(target: "lagtrace serve", "{msg}");
}

/// A parsed request head: what the server needs from it.
struct Head {
    close: bool,
    content_length: usize,
    len: usize,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let mut close = req.version == Some(0);
            let mut content_length = 0usize;
            for h in req.headers.iter() {
                if h.name.eq_ignore_ascii_case("connection") {
                    let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
                    if v.contains("close") {
                        close = true;
                    } else if v.contains("keep-alive") {
                        close = false;
                    }
                } else if h.name.eq_ignore_ascii_case("content-length") {
                    content_length = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .ok_or(())?;
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    return Err(()); // chunked request bodies are not supported
                }
            }
            Ok(Some(Head {
                close,
                content_length,
                len,
            }))
        }
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Ok(None),
        _ => Err(()),
    }
}

fn body(size: usize) -> Vec<u8> {
    let pattern = b"lagtrace serve: built-in fault server. ";
    pattern.iter().copied().cycle().take(size).collect()
}

fn connection(
    s: &mut TcpStream,
    o: &ServeOptions,
    n: &AtomicU64,
    stop: &AtomicBool,
) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(o.nodelay)?;
    if o.cork {
        socket2::SockRef::from(&s).set_tcp_cork(true)?;
    }
    s.set_read_timeout(Some(POLL))?;
    let body = body(o.body_size);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        // Read one request head (and its body, which is discarded).
        let head = loop {
            match parse_head(&buf) {
                Ok(Some(h)) => break h,
                Ok(None) => {}
                Err(()) => {
                    n.fetch_add(1, Ordering::Relaxed);
                    let msg = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                    let _ = s.write_all(msg);
                    return Ok(());
                }
            }
            match s.read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        // The body is discarded as it arrives, never buffered: a client's Content-Length
        // (up to usize::MAX) must not decide how much memory the server takes.
        buf.drain(..head.len);
        let mut body_left = head.content_length;
        let in_buf = body_left.min(buf.len());
        buf.drain(..in_buf);
        body_left -= in_buf;
        while body_left > 0 {
            match s.read(&mut chunk[..body_left.min(4096)]) {
                Ok(0) => return Ok(()),
                Ok(k) => body_left -= k,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Think in slices so a stop (Ctrl-C, `lab down`) is not held up by a long think time.
        let mut left = o.think;
        while !left.is_zero() {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let step = left.min(POLL);
            std::thread::sleep(step);
            left -= step;
        }
        let headers = format!(
            "HTTP/1.1 200 OK\r\nServer: lagtrace-serve\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
            body.len(),
            if head.close { "close" } else { "keep-alive" }
        );
        if o.split_writes {
            s.write_all(headers.as_bytes())?;
            s.write_all(&body)?;
        } else {
            let mut all = headers.into_bytes();
            all.extend_from_slice(&body);
            s.write_all(&all)?;
        }
        n.fetch_add(1, Ordering::Relaxed);
        if head.close {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads() {
        let h = parse_head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .expect("ok")
            .expect("complete");
        assert!(!h.close);
        assert_eq!(h.content_length, 0);
        let h =
            parse_head(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
                .expect("ok")
                .expect("complete");
        assert!(h.close);
        assert_eq!((h.content_length, h.len), (5, 57));
        let h = parse_head(b"GET / HTTP/1.0\r\n\r\n")
            .expect("ok")
            .expect("complete");
        assert!(h.close, "HTTP/1.0 closes by default");
        assert!(
            parse_head(b"GET / HTTP/1.1\r\nHo").expect("ok").is_none(),
            "partial"
        );
        assert!(parse_head(b"\x00\x01garbage\r\n\r\n").is_err());
        assert!(parse_head(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(
            parse_head(&vec![b'a'; MAX_HEAD + 1]).is_err(),
            "oversized head"
        );
    }

    #[test]
    fn body_has_the_asked_size() {
        assert_eq!(body(0).len(), 0);
        assert_eq!(body(DEFAULT_BODY_SIZE).len(), 615);
        assert_eq!(body(100_000).len(), 100_000);
    }
}

#[cfg(test)]
mod stop_tests {
    use super::*;

    /// A client that never reads a large response must not keep the server from stopping.
    #[test]
    fn stop_does_not_hang_on_a_client_that_does_not_read() {
        let mut server = Server::spawn(ServeOptions {
            body_size: 64 << 20,
            ..ServeOptions::default()
        })
        .expect("spawn");
        let mut c = TcpStream::connect(server.local_addr()).expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("request");
        std::thread::sleep(Duration::from_millis(200));
        let t0 = std::time::Instant::now();
        server.stop();
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "stop took {:?}",
            t0.elapsed()
        );
    }

    /// A request body is discarded as it streams in (not buffered), a huge Content-Length
    /// does not overflow, and the next keep-alive request on the connection is answered.
    #[test]
    fn request_bodies_are_discarded_and_keep_alive_continues() {
        let mut server = Server::spawn(ServeOptions::default()).expect("spawn");
        let mut c = TcpStream::connect(server.local_addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let body = vec![b'x'; 3 << 20];
        let mut req = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3145728\r\n\r\n".to_vec();
        req.extend_from_slice(&body);
        req.extend_from_slice(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        c.write_all(&req).expect("requests");
        let mut resp = Vec::new();
        c.read_to_end(&mut resp).expect("responses");
        let text = String::from_utf8_lossy(&resp);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");

        let mut c = TcpStream::connect(server.local_addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        c.write_all(b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\nab")
            .expect("request");
        // The server waits for the rest of the body: no response, no crash.
        let mut b = [0u8; 64];
        assert!(
            c.read(&mut b).is_err(),
            "no response before the body is complete"
        );
        drop(c);
        let mut c = TcpStream::connect(server.local_addr()).expect("server still serves");
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("request");
        let mut resp = Vec::new();
        c.read_to_end(&mut resp).expect("response");
        assert!(resp.starts_with(b"HTTP/1.1 200 OK"));
        server.stop();
    }

    /// A request in its think time must not keep the server from stopping (Ctrl-C on
    /// `lagtrace serve --think 600000` waited out the whole think time).
    #[test]
    fn stop_does_not_wait_out_a_think_time() {
        let mut server = Server::spawn(ServeOptions {
            think: Duration::from_secs(60),
            ..ServeOptions::default()
        })
        .expect("spawn");
        let mut c = TcpStream::connect(server.local_addr()).expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("request");
        std::thread::sleep(Duration::from_millis(300));
        let t0 = std::time::Instant::now();
        server.stop();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "stop took {:?} with a 60 s think time",
            t0.elapsed()
        );
    }
}
