//! In-test HTTP servers on 127.0.0.1: counting keep-alive server, silent server, garbage,
//! close mid-response, and a TLS variant (through [`TestServer::spawn_with`]). Each stops
//! (threads end) when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// A byte stream a connection can be served over.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// Turns an accepted socket into the stream to serve over.
pub type Wrapper = Arc<dyn Fn(TcpStream) -> Box<dyn Stream> + Send + Sync>;

/// How the server answers.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// A valid response: `status`, `body` bytes (chunked or Content-Length), `Connection:
    /// close` on every `close_every`-th response of a connection (0: never), after `delay`.
    Answer {
        status: u16,
        body: usize,
        chunked: bool,
        close_every: u64,
        delay: Duration,
    },
    /// Reads requests, never answers.
    Silent,
    /// Answers with bytes that are not HTTP.
    Garbage,
    /// Sends a head promising 1000 bytes, 10 of them, then closes.
    CloseMid,
}

impl Mode {
    pub fn ok() -> Mode {
        Mode::Answer {
            status: 200,
            body: 615,
            chunked: false,
            close_every: 0,
            delay: Duration::ZERO,
        }
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    /// Complete requests received.
    pub requests: Arc<AtomicU64>,
    /// Connections accepted.
    pub connections: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn spawn(mode: Mode) -> TestServer {
        Self::spawn_with(mode, None)
    }

    /// With `wrap`, each accepted connection is served through the stream it returns
    /// (e.g. a TLS server stream).
    pub fn spawn_with(mode: Mode, wrap: Option<Wrapper>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, c, s) = (requests.clone(), connections.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            for sock in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(sock) = sock else { continue };
                c.fetch_add(1, Ordering::Relaxed);
                let (r, s, wrap) = (r.clone(), s.clone(), wrap.clone());
                std::thread::spawn(move || {
                    let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
                    let _ = sock.set_nodelay(true);
                    match wrap {
                        None => serve(sock, mode, &r, &s),
                        Some(w) => serve(w(sock), mode, &r, &s),
                    }
                });
            }
        });
        TestServer {
            addr,
            requests,
            connections,
            stop,
            accept: Some(accept),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    pub fn count(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve<S: Read + Write>(mut sock: S, mode: Mode, count: &AtomicU64, stop: &AtomicBool) {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let mut served = 0u64;
    loop {
        while let Some(end) = find(&buf, b"\r\n\r\n") {
            buf.drain(..end + 4);
            count.fetch_add(1, Ordering::SeqCst);
            served += 1;
            let resp = match mode {
                Mode::Silent => continue,
                Mode::Garbage => b"this is not http at all\r\n\r\n".to_vec(),
                Mode::CloseMid => {
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789");
                    let _ = sock.flush();
                    return;
                }
                Mode::Answer {
                    status,
                    body,
                    chunked,
                    close_every,
                    delay,
                } => {
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    let close = close_every > 0 && served.is_multiple_of(close_every);
                    let mut r = format!("HTTP/1.1 {status} X\r\nServer: test\r\n");
                    if close {
                        r.push_str("Connection: close\r\n");
                    }
                    let payload = vec![b'x'; body];
                    let mut bytes;
                    if chunked {
                        r.push_str("Transfer-Encoding: chunked\r\n\r\n");
                        bytes = r.into_bytes();
                        // Uneven chunks, with an extension on the first.
                        let (a, b) = payload.split_at(body / 3);
                        if !a.is_empty() {
                            bytes.extend_from_slice(format!("{:x};ext=1\r\n", a.len()).as_bytes());
                            bytes.extend_from_slice(a);
                            bytes.extend_from_slice(b"\r\n");
                        }
                        if !b.is_empty() {
                            bytes.extend_from_slice(format!("{:X}\r\n", b.len()).as_bytes());
                            bytes.extend_from_slice(b);
                            bytes.extend_from_slice(b"\r\n");
                        }
                        bytes.extend_from_slice(b"0\r\n\r\n");
                    } else {
                        r.push_str(&format!("Content-Length: {body}\r\n\r\n"));
                        bytes = r.into_bytes();
                        bytes.extend_from_slice(&payload);
                    }
                    if sock.write_all(&bytes).and_then(|_| sock.flush()).is_err() {
                        return;
                    }
                    if close {
                        return;
                    }
                    continue;
                }
            };
            if sock.write_all(&resp).and_then(|_| sock.flush()).is_err() {
                return;
            }
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match sock.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
