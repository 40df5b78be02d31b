//! The engine against in-test servers on 127.0.0.1: counts match what the server saw,
//! errors are counted by kind, -n is exact, --rate holds, TLS, the HdrHistogram log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lagtrace_load::{LoadOptions, run};
use lagtrace_testkit::server::{Mode, TestServer, Wrapper};

fn opts(url: &str, c: usize, t: usize) -> LoadOptions {
    let mut o = LoadOptions::new(url);
    o.connections = c;
    o.threads = t;
    o.duration = Some(Duration::from_millis(1000));
    o
}

fn go(o: &LoadOptions) -> lagtrace_load::LoadReport {
    run(o, None, &AtomicBool::new(false)).expect("load runs")
}

#[test]
fn counts_match_the_server_for_a_duration_run() {
    let srv = TestServer::spawn(Mode::ok());
    let r = go(&opts(&srv.url(), 8, 2));
    let seen = srv.count();
    assert!(r.requests > 100, "{r:?}");
    // Requests still in flight when the time is up were received but not completed.
    assert!(
        seen >= r.requests && seen <= r.requests + 8,
        "server {seen}, client {}",
        r.requests
    );
    assert_eq!(r.errors, Default::default());
    assert_eq!(r.status_codes.get(&200), Some(&r.requests));
    assert!(r.bytes >= r.requests * 615, "{}", r.bytes);
    assert_eq!(r.latency_us.count, r.requests);
    assert!(r.latency_us.p50 < 30_000, "{:?}", r.latency_us);
    assert_eq!(
        r.first_request_latency_us.count + r.later_request_latency_us.count,
        r.requests
    );
    assert_eq!(
        r.first_request_latency_us.count, 8,
        "one first request per connection"
    );
    assert_eq!(
        srv.connections.load(Ordering::SeqCst),
        9,
        "8 connections + the probe"
    );
}

#[test]
fn n_stops_at_exactly_n_with_chunked_bodies_and_connection_close() {
    let srv = TestServer::spawn(Mode::Answer {
        status: 200,
        body: 1000,
        chunked: true,
        close_every: 7,
        delay: Duration::ZERO,
    });
    let mut o = opts(&srv.url(), 5, 2);
    o.duration = None;
    o.requests = Some(1003);
    let r = go(&o);
    assert_eq!(r.requests, 1003, "{:?}", r.errors);
    assert_eq!(srv.count(), 1003);
    assert_eq!(r.errors, Default::default());
    // Connection: close every 7th response on a connection: each was honoured by reconnecting.
    assert!(r.connections_opened >= 1003 / 7, "{}", r.connections_opened);
    assert_eq!(
        srv.connections.load(Ordering::SeqCst),
        r.connections_opened + 1
    );
}

#[test]
fn timeouts_are_counted_against_a_server_that_never_answers() {
    let srv = TestServer::spawn(Mode::Silent);
    let mut o = opts(&srv.url(), 2, 1);
    o.timeout = Duration::from_millis(200);
    let t0 = Instant::now();
    let r = go(&o);
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(r.requests, 0);
    // 2 connections × ~1 s / 200 ms, each timeout abandons the request and reconnects.
    assert!((4..=12).contains(&r.errors.timeout), "{:?}", r.errors);
    assert_eq!(
        r.errors.read + r.errors.write + r.errors.connect,
        0,
        "{:?}",
        r.errors
    );
    assert!(srv.connections.load(Ordering::SeqCst) > r.errors.timeout);
}

#[test]
fn garbage_and_close_mid_response_are_read_errors() {
    for mode in [Mode::Garbage, Mode::CloseMid] {
        let srv = TestServer::spawn(mode);
        let mut o = opts(&srv.url(), 2, 1);
        o.duration = Some(Duration::from_millis(300));
        let r = go(&o);
        assert_eq!(r.requests, 0, "{mode:?}");
        assert!(r.errors.read >= 2, "{mode:?} {:?}", r.errors);
        assert_eq!(r.errors.timeout, 0, "{mode:?} {:?}", r.errors);
    }
}

#[test]
fn error_statuses_are_counted_as_non_2xx_3xx() {
    let srv = TestServer::spawn(Mode::Answer {
        status: 503,
        body: 10,
        chunked: false,
        close_every: 0,
        delay: Duration::ZERO,
    });
    let mut o = opts(&srv.url(), 2, 1);
    o.requests = Some(50);
    o.duration = None;
    let r = go(&o);
    assert_eq!((r.requests, r.errors.status), (50, 50));
    assert_eq!(r.status_codes.get(&503), Some(&50));
}

#[test]
fn unreachable_targets_are_errors_not_reports() {
    // A port on loopback with nothing listening, held for the test.
    let closed = lagtrace_testkit::nginx::ClosedPort::new();
    let port = closed.port;
    let e = run(
        &opts(&format!("http://127.0.0.1:{port}/"), 1, 1),
        None,
        &AtomicBool::new(false),
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("refused"), "{e:#}");
    for (url, want) in [
        ("ftp://127.0.0.1/", "unknown scheme"),
        ("127.0.0.1:80", "malformed URL"),
        ("http://no-such-host.invalid/", "cannot resolve"),
    ] {
        let e = run(&opts(url, 1, 1), None, &AtomicBool::new(false)).unwrap_err();
        assert!(format!("{e:#}").contains(want), "{url}: {e:#}");
    }
    let mut o = opts("http://127.0.0.1:1/", 1, 2);
    o.threads = 2;
    assert!(
        run(&o, None, &AtomicBool::new(false)).is_err(),
        "threads > connections"
    );
}

#[test]
fn rate_holds_within_two_percent_and_latency_is_from_intended_times() {
    let srv = TestServer::spawn(Mode::ok());
    let mut o = opts(&srv.url(), 4, 2);
    o.duration = Some(Duration::from_secs(2));
    o.rate = Some(400.0);
    let r = go(&o);
    let rate = r.requests as f64 / 2.0;
    assert!(
        (rate - 400.0).abs() <= 8.0,
        "rate {rate} ({} requests)",
        r.requests
    );
    let u = r
        .uncorrected_latency_us
        .expect("rate mode reports uncorrected latency");
    assert_eq!(u.count, r.requests);
    // Corrected latency includes any lateness of the send; it cannot be below the raw one.
    assert!(r.latency_us.p50 >= u.p50 && r.latency_us.max >= u.max);
}

#[test]
fn rate_mode_corrects_for_coordinated_omission() {
    // One connection, 100 ms per response, asked for 50 req/s: only ~10/s get through and
    // each waits longer than the last for its intended send time.
    let srv = TestServer::spawn(Mode::Answer {
        status: 200,
        body: 10,
        chunked: false,
        close_every: 0,
        delay: Duration::from_millis(100),
    });
    let mut o = opts(&srv.url(), 1, 1);
    o.rate = Some(50.0);
    o.duration = Some(Duration::from_millis(1500));
    let r = go(&o);
    let u = r.uncorrected_latency_us.unwrap();
    assert!(u.p50 >= 100_000 && u.p50 < 200_000, "{u:?}");
    assert!(
        r.latency_us.max > 800_000,
        "corrected max {:?}",
        r.latency_us
    );
}

#[test]
fn latency_of_a_slow_server_is_measured() {
    let slow = TestServer::spawn(Mode::Answer {
        status: 200,
        body: 615,
        chunked: false,
        close_every: 0,
        delay: Duration::from_millis(40),
    });
    let fast = TestServer::spawn(Mode::ok());
    let rs = go(&opts(&slow.url(), 4, 1));
    let rf = go(&opts(&fast.url(), 4, 1));
    assert!(
        rs.latency_us.p50 >= 40_000 && rs.latency_us.p50 < 80_000,
        "{:?}",
        rs.latency_us
    );
    assert!(rf.latency_us.p50 < 30_000, "{:?}", rf.latency_us);
    let pts = &rs.percentiles;
    assert_eq!(pts.len(), lagtrace_load::chart_percentiles().len());
    assert!(pts.windows(2).all(|w| w[0].latency_us <= w[1].latency_us));
}

#[test]
fn stop_flag_ends_the_run_with_a_report() {
    let srv = TestServer::spawn(Mode::ok());
    let mut o = opts(&srv.url(), 2, 1);
    o.duration = Some(Duration::from_secs(30));
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let calls = std::cell::Cell::new(0);
    let cb = |p: &lagtrace_load::Progress| {
        calls.set(calls.get() + 1);
        if p.elapsed > Duration::from_millis(300) {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let r = run(&o, Some(&cb), &stop).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(r.interrupted && r.requests > 0);
    assert!(calls.get() >= 3);
}

#[test]
fn https_with_insecure_and_certificate_rejection_without() {
    let srv = TestServer::spawn_with(Mode::ok(), Some(tls_wrapper()));
    let url = format!("https://localhost:{}/", srv.addr.port());
    let mut o = opts(&url, 3, 1);
    o.insecure = true;
    o.requests = Some(200);
    o.duration = None;
    let r = go(&o);
    assert_eq!((r.requests, srv.count()), (200, 200), "{:?}", r.errors);
    assert_eq!(r.errors, Default::default());
    o.insecure = false;
    let e = run(&o, None, &AtomicBool::new(false)).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("TLS handshake") && msg.contains("--insecure"),
        "{msg}"
    );
}

/// https:// to a server that speaks plain HTTP: the error says so and gives the http:// URL
/// (with the port, which the https default would otherwise change) — not "--insecure".
#[test]
fn https_to_a_plain_http_server_says_use_http() {
    let srv = TestServer::spawn(Mode::ok());
    let url = format!("https://127.0.0.1:{}/p?q=1", srv.addr.port());
    let e = run(&opts(&url, 2, 1), None, &AtomicBool::new(false)).unwrap_err();
    let msg = format!("{e:#}");
    let want = format!("use http://127.0.0.1:{}/p?q=1", srv.addr.port());
    assert!(
        msg.contains("plain HTTP, not TLS") && msg.ends_with(&want),
        "{msg}"
    );
    assert!(!msg.contains("--insecure"), "{msg}");
}

#[test]
fn hdr_log_holds_every_latency() {
    use hdrhistogram::serialization::Deserializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    let srv = TestServer::spawn(Mode::ok());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.hlog");
    let mut o = opts(&srv.url(), 2, 2);
    o.duration = Some(Duration::from_millis(1500));
    o.hdr_log = Some(path.clone());
    let r = go(&o);
    let text = std::fs::read(&path).unwrap();
    let (mut total, mut first) = (0, 0);
    let mut untagged = Vec::new();
    let mut de = Deserializer::new();
    for e in IntervalLogIterator::new(&text) {
        if let Ok(LogEntry::Interval(iv)) = e {
            let bytes = base64_decode(iv.encoded_histogram());
            let h: hdrhistogram::Histogram<u64> = de.deserialize(&mut &bytes[..]).unwrap();
            match iv.tag().as_deref() {
                None => {
                    total += h.len();
                    untagged.push((iv.start_timestamp(), iv.duration()));
                }
                Some("first-request") => first += h.len(),
                Some(t) => panic!("unexpected tag {t} without --rate"),
            }
        }
    }
    // One line per interval for the whole run (its 2 threads summed), each starting where
    // the one before ended: 1.5 s of 1 s intervals on the clock is 2 or 3 of them.
    assert!((2..=3).contains(&untagged.len()), "{untagged:?}");
    for w in untagged.windows(2) {
        assert_eq!(w[0].0 + w[0].1, w[1].0, "{untagged:?}");
    }
    assert_eq!(total, r.requests);
    assert_eq!(first, r.first_request_latency_us.count);
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let b: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(val).collect();
    b.chunks(4)
        .flat_map(|c| {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |a, (i, &v)| a | u32::from(v) << (18 - 6 * i));
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            bytes[..c.len() - 1].to_vec()
        })
        .collect()
}

#[test]
fn sequential_returns_one_latency_per_request() {
    let srv = TestServer::spawn(Mode::Answer {
        status: 200,
        body: 100,
        chunked: true,
        close_every: 3,
        delay: Duration::ZERO,
    });
    let v = lagtrace_load::sequential(&srv.url(), 10, Duration::from_secs(2)).unwrap();
    assert_eq!(v.len(), 10);
    assert_eq!(srv.count(), 10);
    assert!(v.iter().all(|d| *d < Duration::from_secs(1)));
}

/// Serves over TLS with a fresh self-signed certificate for "localhost".
fn tls_wrapper() -> Wrapper {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = std::sync::Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap(),
    );
    std::sync::Arc::new(move |sock| {
        let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
        Box::new(rustls::StreamOwned::new(conn, sock))
    })
}

/// A listener whose accept queue is full drops SYNs: connects hang until --connect-timeout.
#[test]
fn connect_timeouts_are_counted_as_connect_errors() {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    sock.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    sock.listen(0).unwrap();
    let listener: std::net::TcpListener = sock.into();
    let addr = listener.local_addr().unwrap();
    // Accept only the probe connection, then never again.
    let acceptor = std::thread::spawn(move || {
        let probe = listener.accept();
        std::thread::sleep(Duration::from_secs(3));
        drop((probe, listener));
    });
    let mut o = opts(&format!("http://{addr}/"), 6, 1);
    o.connect_timeout = Duration::from_millis(200);
    o.timeout = Duration::from_millis(500);
    o.duration = Some(Duration::from_millis(1200));
    let r = go(&o);
    assert_eq!(r.requests, 0);
    // Connections the kernel completed into the full queue time out on their request; the
    // rest never complete the handshake.
    assert!(r.errors.connect >= 6, "{:?}", r.errors);
    acceptor.join().unwrap();
}

/// A server that closes after every 3rd response without saying `Connection: close` (as a
/// server with a keep-alive request limit may): response and FIN leave in one segment
/// (TCP_CORK, then shutdown), so the client sees both in one event. Returns the address and
/// the count of requests received.
fn spawn_silent_closer() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::AtomicU64;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let count = std::sync::Arc::new(AtomicU64::new(0));
    let c2 = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let count = c2.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut served = 0;
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        count.fetch_add(1, Ordering::SeqCst);
                        served += 1;
                        let last = served % 3 == 0;
                        if last {
                            let _ = socket2::SockRef::from(&s).set_tcp_cork(true);
                        }
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                        if last {
                            let _ = s.shutdown(std::net::Shutdown::Write);
                            // Read on until the client closes: no RST for unread bytes.
                            while matches!(s.read(&mut chunk), Ok(n) if n > 0) {}
                            return;
                        }
                    }
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, count)
}

#[test]
fn a_fin_that_comes_with_the_response_is_honoured_like_connection_close() {
    let (addr, count) = spawn_silent_closer();
    let mut o = opts(&format!("http://{addr}/"), 4, 1);
    o.duration = Some(Duration::from_secs(30));
    o.requests = Some(300);
    let r = go(&o);
    // Before: the next request was written on the half-closed connection; the FIN's edge
    // had been used up, so it waited for --timeout (a timeout per close, -n short of
    // responses, 30 s instead of a fraction of a second).
    assert_eq!(r.errors, Default::default(), "{} requests", r.requests);
    assert_eq!(r.requests, 300);
    assert_eq!(count.load(Ordering::SeqCst), 300);
    assert!(r.connections_opened >= 100, "{}", r.connections_opened);
}
