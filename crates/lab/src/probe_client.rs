//! A minimal HTTP/1.1 client: N sequential GETs on one keep-alive connection, timing each
//! from the request's write to the last byte of its response. For lab tests and `demo`;
//! the real load generator is the `load` crate.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One response as the client saw it.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body (Content-Length bytes).
    pub body: Vec<u8>,
    /// From writing the request to reading the last body byte.
    pub elapsed: Duration,
}

/// Sends `n` sequential `GET /` requests to `addr` on one connection and returns them in
/// order. `timeout` bounds each read; a timeout or a closed connection is an error.
pub fn get_sequence(addr: SocketAddr, n: usize, timeout: Duration) -> io::Result<Vec<Response>> {
    get_sequence_until(addr, n, timeout, &AtomicBool::new(false))
}

/// [`get_sequence`] that stops early (returning the responses so far) once `stop` is set.
pub fn get_sequence_until(
    addr: SocketAddr,
    n: usize,
    timeout: Duration,
    stop: &AtomicBool,
) -> io::Result<Vec<Response>> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    let req = format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: lagtrace-lab\r\nAccept: */*\r\n\r\n"
    );
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t0 = Instant::now();
        s.write_all(req.as_bytes())?;
        let r = read_response(&mut s, &mut buf)?;
        out.push(Response {
            status: r.0,
            body: r.1,
            elapsed: t0.elapsed(),
        });
    }
    Ok(out)
}

/// Times in milliseconds, for messages.
pub fn millis(rs: &[Response]) -> Vec<f64> {
    rs.iter().map(|r| r.elapsed.as_secs_f64() * 1e3).collect()
}

/// `read`, again after EINTR.
fn read_retrying(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<(u16, Vec<u8>)> {
    let mut chunk = [0u8; 8192];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = resp.code.unwrap_or(0);
                let cl = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| {
                        std::str::from_utf8(h.value)
                            .ok()?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    })
                    .ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            "response without Content-Length",
                        )
                    })?;
                while buf.len() < len + cl {
                    let k = read_retrying(s, &mut chunk)?;
                    if k == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed in a response body",
                        ));
                    }
                    buf.extend_from_slice(&chunk[..k]);
                }
                let body = buf[len..len + cl].to_vec();
                buf.drain(..len + cl);
                return Ok((status, body));
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad response: {e}"),
                ));
            }
        }
        let k = read_retrying(s, &mut chunk)?;
        if k == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            ));
        }
        buf.extend_from_slice(&chunk[..k]);
    }
}

/// (min, median) in milliseconds of the requests after the first. The first request of a
/// connection never stalls on delayed ACK (the client starts in quick-ACK mode), so the
/// stall shows in the rest. `(0, 0)` for fewer than two responses.
pub fn after_first_ms(rs: &[Response]) -> (f64, f64) {
    if rs.len() < 2 {
        return (0.0, 0.0);
    }
    let mut v = millis(&rs[1..]);
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}

/// Takes up to `attempts` samples of [`get_sequence`] (each on a new connection) and returns
/// the first one `accept` takes, or the last one. On a loaded machine one sample can be
/// disturbed by scheduling (a late delayed-ACK timer, a descheduled server); a real stall,
/// or its absence, shows in every sample.
pub fn sample_until(
    addr: SocketAddr,
    n: usize,
    timeout: Duration,
    attempts: usize,
    accept: impl Fn(&[Response]) -> bool,
) -> io::Result<Vec<Response>> {
    let mut last = Vec::new();
    for _ in 0..attempts.max(1) {
        last = get_sequence(addr, n, timeout)?;
        if accept(&last) {
            break;
        }
    }
    Ok(last)
}

/// Whether a sample shows the Nagle/delayed-ACK stall: every request after the first took
/// at least `floor_ms` (30 ms in the tests: the client's delayed ACK is at least 40 ms).
pub fn stalls(rs: &[Response], floor_ms: f64) -> bool {
    rs.len() >= 2 && after_first_ms(rs).0 >= floor_ms
}

/// Whether a sample is fast: the median request after the first took under `ms`.
pub fn fast(rs: &[Response], ms: f64) -> bool {
    rs.len() >= 2 && after_first_ms(rs).1 < ms
}

/// Whether no request after the first took `floor_ms` or more (no stall at all).
pub fn no_stall(rs: &[Response], floor_ms: f64) -> bool {
    rs.len() >= 2
        && rs[1..]
            .iter()
            .all(|r| r.elapsed.as_secs_f64() * 1e3 < floor_ms)
}
