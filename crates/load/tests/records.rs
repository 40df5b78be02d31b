//! Per-request records on real traffic: one record per completed request or failed connect,
//! indices per connection, ordered timestamps, local ports the server saw, the bound on kept
//! records, and (root, in a namespace made here) connects held by dropped SYNs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lagtrace_load::{LoadOptions, LoadReport, RecordOptions, run};
use lagtrace_model::{RequestError, RequestRecord, RequestRecords};

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// Peer address of every accepted connection.
    peers: Mutex<Vec<SocketAddr>>,
    /// Responses written after a `slow` delay.
    delayed: AtomicU64,
}

/// A keep-alive HTTP server on 127.0.0.1 (in the calling thread's namespace): 5-byte bodies,
/// `Connection: close` on every `close_every`-th response of a connection (0: never), and
/// the `slow_every`-th request of a connection (0: none) answered after `slow`.
fn serve(close_every: u64, slow_every: u64, slow: Duration) -> (SocketAddr, Arc<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            s2.peers.lock().unwrap().push(s.peer_addr().unwrap());
            let seen = s2.clone();
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut k = 0u64;
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        k += 1;
                        let delay = slow_every > 0 && k.is_multiple_of(slow_every);
                        if delay {
                            std::thread::sleep(slow);
                        }
                        let close = close_every > 0 && k.is_multiple_of(close_every);
                        let head = if close { "Connection: close\r\n" } else { "" };
                        let resp =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n{head}\r\nhello");
                        if s.write_all(resp.as_bytes()).is_err() {
                            return;
                        }
                        if delay {
                            seen.delayed.fetch_add(1, Ordering::SeqCst);
                        }
                        if close {
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
    (addr, seen)
}

fn opts(addr: SocketAddr, c: usize, t: usize, ms: u64, rec: RecordOptions) -> LoadOptions {
    let mut o = LoadOptions::new(&format!("http://{addr}/"));
    o.connections = c;
    o.threads = t;
    o.duration = Some(Duration::from_millis(ms));
    o.records = Some(rec);
    o
}

fn go(o: &LoadOptions) -> (LoadReport, RequestRecords) {
    let r = run(o, None, &AtomicBool::new(false)).expect("load runs");
    let recs = r.records.clone().expect("records were asked for");
    (r, recs)
}

/// Every record ends a request or connect the report counted, or is pending at the end.
fn assert_accounted(r: &LoadReport, recs: &RequestRecords) {
    let e = r.errors;
    assert_eq!(
        recs.seen,
        r.requests + e.connect + e.read + e.write + e.timeout + recs.pending,
        "{:?}",
        r.errors
    );
    let kept_pending = recs.records.iter().filter(|x| x.pending).count() as u64;
    assert!(kept_pending <= recs.pending);
    // A run pends at most one request or connect per connection.
    assert!(recs.pending <= r.options.connections as u64);
    if recs.records.len() as u64 == recs.seen {
        assert_eq!(kept_pending, recs.pending);
    }
}

/// The timestamps of a record are in the order things happen.
fn assert_ordered(x: &RequestRecord) {
    let end = x.start_us + x.wait_us;
    assert!(
        x.start_us >= x.connect_start_us || x.intended_us.is_some(),
        "{x:?}"
    );
    let mut chain = vec![x.connect_start_us];
    chain.extend(x.connect_end_us);
    chain.extend(x.sent_first_us);
    chain.extend(x.sent_last_us);
    chain.extend(x.first_byte_us);
    chain.extend(x.last_byte_us);
    assert!(chain.windows(2).all(|w| w[0] <= w[1]), "{x:?}");
    assert!(*chain.last().unwrap() <= end, "{x:?}");
    if let Some(lb) = x.last_byte_us {
        assert_eq!(lb, end, "{x:?}");
    }
}

#[test]
fn one_record_per_request_with_indices_ordered_times_and_the_servers_ports() {
    let (addr, seen) = serve(5, 0, Duration::ZERO);
    // Caps far above what 600 ms on loopback can do (~30 k requests on an idle machine), so
    // the assertion below does not depend on the machine's speed.
    let caps = RecordOptions {
        slow_cap: 1 << 17,
        sample_cap: 1 << 17,
    };
    let (r, recs) = go(&opts(addr, 4, 2, 600, caps));
    assert!(r.requests > 100, "{r:?}");
    assert_eq!(r.errors, Default::default());
    assert_accounted(&r, &recs);
    // Below the caps: everything kept, weight 1.
    assert_eq!(recs.records.len() as u64, recs.seen);
    assert!(recs.records.iter().all(|x| x.weight == 1.0));
    assert_eq!(recs.threads, 2);
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        now_us - recs.start_unix_us < 5_000_000,
        "{}",
        recs.start_unix_us
    );

    let done: Vec<&RequestRecord> = recs.records.iter().filter(|x| !x.pending).collect();
    assert_eq!(done.len() as u64, r.requests);
    let mut by_conn: BTreeMap<u64, Vec<&RequestRecord>> = BTreeMap::new();
    for x in &recs.records {
        assert_ordered(x);
        assert_eq!(x.remote, addr);
        by_conn.entry(x.conn).or_default().push(x);
        if !x.pending {
            // 38-byte head + 5-byte body, + "Connection: close\r\n" on a connection's last.
            let bytes = if x.index == 4 { 43 + 19 } else { 43 };
            assert_eq!(
                (x.status, x.error, x.bytes),
                (Some(200), None, bytes),
                "{x:?}"
            );
            assert_eq!(x.syn_retransmits, Some(0), "{x:?}");
        }
    }
    // Connection: close every 5th response: 5 requests per connection, indices 0..5, one
    // local address per connection, the first request's wait includes its connect.
    for (conn, xs) in &by_conn {
        let mut idx: Vec<u32> = xs.iter().map(|x| x.index).collect();
        idx.sort_unstable();
        assert_eq!(idx, (0..xs.len() as u32).collect::<Vec<_>>(), "conn {conn}");
        assert!(xs.len() <= 5, "conn {conn}: {}", xs.len());
        let locals: BTreeSet<_> = xs.iter().map(|x| x.local).collect();
        assert_eq!(locals.len(), 1, "conn {conn}");
        for x in xs {
            if x.index == 0 {
                assert_eq!(x.start_us, x.connect_start_us, "{x:?}");
            } else {
                assert_eq!(Some(x.start_us), x.sent_first_us, "{x:?}");
            }
        }
    }
    // No preflight with records on: the server accepted exactly the recorded connections.
    // The server closes first, so the client's port is free at once and a later connection
    // may reuse it: compare the sets of addresses, and the counts of connections.
    let accepted = seen.peers.lock().unwrap().clone();
    let peers: BTreeSet<SocketAddr> = accepted.iter().copied().collect();
    let locals: BTreeSet<SocketAddr> = recs.records.iter().filter_map(|x| x.local).collect();
    assert_eq!(locals, peers);
    assert_eq!(by_conn.len(), accepted.len());
}

#[test]
fn under_rate_a_records_wait_is_from_its_intended_send_time() {
    let (addr, _) = serve(0, 0, Duration::ZERO);
    let mut o = opts(addr, 2, 1, 800, RecordOptions::default());
    o.rate = Some(200.0);
    let (r, recs) = go(&o);
    assert_accounted(&r, &recs);
    let done: Vec<_> = recs.records.iter().filter(|x| !x.pending).collect();
    assert_eq!(done.len() as u64, r.requests);
    assert!((120..=170).contains(&done.len()), "{}", done.len());
    for x in &recs.records {
        assert_ordered(x);
        assert_eq!(Some(x.start_us), x.intended_us, "{x:?}");
        assert!(x.sent_first_us.unwrap() >= x.start_us, "{x:?}");
    }
    // The intended times of a connection are 10 ms apart (2 connections at 200/s).
    let first: Vec<u64> = done
        .iter()
        .filter(|x| x.conn == done[0].conn)
        .map(|x| x.start_us)
        .collect();
    assert!(first.windows(2).all(|w| w[1] - w[0] == 10_000), "{first:?}");
}

#[test]
fn records_off_by_default_and_absent_from_the_json() {
    let (addr, _) = serve(0, 0, Duration::ZERO);
    let mut o = opts(addr, 1, 1, 200, RecordOptions::default());
    o.records = None;
    let r = run(&o, None, &AtomicBool::new(false)).unwrap();
    assert!(r.records.is_none());
    let j = serde_json::to_value(&r).unwrap();
    assert!(j.get("records").is_none());
}

#[test]
fn memory_stays_bounded_and_every_slow_request_is_kept() {
    // Every 100th request waits 5 ms: 1 % slow.
    let (addr, seen) = serve(0, 100, Duration::from_millis(5));
    let rec = RecordOptions {
        slow_cap: 300,
        sample_cap: 100,
    };
    let (r, recs) = go(&opts(addr, 1, 1, 1500, rec));
    assert_accounted(&r, &recs);
    assert!(
        recs.seen > 4000,
        "too few requests to test the bound: {}",
        recs.seen
    );
    assert_eq!(recs.records.len(), 400, "one thread keeps 300 + 100");
    let delayed = seen.delayed.load(Ordering::SeqCst);
    assert!((20..=300).contains(&delayed), "{delayed}");
    // Scheduling on a busy machine may make a few others slow too, but fewer than the cap.
    let over_5ms = recs.records.iter().filter(|x| x.wait_us >= 5_000).count();
    assert!(over_5ms < 300, "{over_5ms}");
    // So each delayed response (the 100th, 200th, ... of the connection) was kept; the last
    // may have been pending (not yet 5 ms) when the run ended, then written to a client
    // that no longer read.
    let kept: Vec<_> = recs
        .records
        .iter()
        .filter(|x| x.index % 100 == 99 && !x.pending)
        .collect();
    let n = kept.len() as u64;
    assert!(
        (delayed.saturating_sub(1)..=delayed).contains(&n),
        "{n} kept of {delayed} delayed"
    );
    assert!(
        kept.iter()
            .all(|x| x.slow && x.weight == 1.0 && x.wait_us >= 5_000)
    );
    let weights: f64 = recs.records.iter().map(|x| x.weight).sum();
    assert!((weights - recs.seen as f64).abs() < 1e-6 * recs.seen as f64);
    let sampled = recs.records.iter().filter(|x| !x.slow).collect::<Vec<_>>();
    assert_eq!(sampled.len(), 100);
    assert!(sampled.iter().all(|x| x.weight > 1.0));
}

#[test]
fn a_refused_connect_is_a_record_not_an_error() {
    // Held, so no server of a test running beside this one takes the port.
    let closed = lagtrace_testkit::nginx::ClosedPort::new();
    let (r, recs) = go(&opts(closed.addr(), 1, 1, 100, RecordOptions::default()));
    assert_eq!(r.requests, 0);
    assert!(r.errors.connect >= 1, "{:?}", r.errors);
    assert_accounted(&r, &recs);
    // Every kept record is a refused connect but one still pending at the end; with the
    // weights (`assert_accounted`) they stand for every connect seen. The records are
    // bounded: a fresh machine refused 10 134 connects in the 100 ms and kept 8 192.
    let refused = recs
        .records
        .iter()
        .filter(|x| x.error == Some(RequestError::ConnectRefused))
        .count();
    let pending = recs.records.iter().filter(|x| x.pending).count();
    assert!(
        refused >= 1 && pending <= 1 && refused + pending == recs.records.len(),
        "{refused} refused and {pending} pending of {} kept records ({} seen)",
        recs.records.len(),
        recs.seen
    );
    for x in recs.records.iter().filter(|x| !x.pending) {
        assert_ordered(x);
        assert_eq!(x.connect_end_us, Some(x.start_us + x.wait_us));
        assert_eq!((x.index, x.sent_first_us, x.status), (0, None, None));
    }
}

/// nftables in the namespace: the first `drops` SYNs of every new connection to `port` are
/// dropped (a set per drop remembers the connections already held once).
fn drop_first_syns(ns: &str, port: u16, drops: u32) {
    let mut rules = format!("table inet ltrec{port} {{\n");
    for k in 0..drops {
        rules += &format!(
            "set s{k} {{ type ipv4_addr . inet_service; flags dynamic,timeout; timeout 1m; }}\n"
        );
    }
    rules += "chain input { type filter hook input priority 0;\n";
    for k in 0..drops {
        rules += &format!(
            "tcp dport {port} tcp flags & (syn|ack) == syn ip saddr . tcp sport != @s{k} \
             update @s{k} {{ ip saddr . tcp sport }} drop\n"
        );
    }
    rules += "}\n}\n";
    lagtrace_testkit::net::nft_load(Some(ns), &rules);
}

fn connect_us(x: &RequestRecord) -> Option<u64> {
    Some(x.connect_end_us? - x.connect_start_us)
}

/// SYNs dropped by nftables: connects that wait for the first, then the second SYN
/// retransmission are records with that wait and that count, and a connect timeout between
/// them is a record of the wait with the retransmissions seen so far.
#[test]
#[ignore = "needs root"]
fn dropped_syns_give_records_with_their_connect_wait_and_retransmissions() {
    let mut guard = lagtrace_testkit::net::NetGuard::new();
    let ns = guard.add_ns("rec-syn");
    // Classic exponential SYN backoff (1 s, then 2 s more: retransmissions at 1 s and 3 s).
    // Linux ≥ 6.5 makes the first retransmissions linear (1 s apart) by default.
    let _ = lagtrace_testkit::try_in_ns(
        &ns,
        &["sysctl", "-qw", "net.ipv4.tcp_syn_linear_timeouts=0"],
    );
    let results = lagtrace_netns::NetNs::Named(ns.clone())
        .run(|| {
            let (one, _) = serve(1, 0, Duration::ZERO);
            let (two, _) = serve(1, 0, Duration::ZERO);
            drop_first_syns(&ns, one.port(), 1);
            drop_first_syns(&ns, two.port(), 2);
            let mut a = opts(one, 2, 1, 2500, RecordOptions::default());
            a.connect_timeout = Duration::from_millis(3500);
            let mut b = opts(two, 1, 1, 3700, RecordOptions::default());
            b.connect_timeout = Duration::from_millis(3500);
            let mut c = opts(two, 1, 1, 3700, RecordOptions::default());
            c.connect_timeout = Duration::from_millis(1500);
            std::thread::scope(|s| {
                let hs = [a, b, c].map(|o| s.spawn(move || go(&o)));
                hs.map(|h| h.join().unwrap())
            })
        })
        .expect("enter the namespace");
    let [(ra, a), (rb, b), (rc, c)] = results;
    for (r, recs) in [(&ra, &a), (&rb, &b), (&rc, &c)] {
        assert_accounted(r, recs);
        recs.records.iter().for_each(assert_ordered);
    }
    let near = |us: u64, s: f64| (us as f64 / 1e6 - s).abs() < 0.25;

    // One SYN dropped: every connect that completed took ~1 s with one retransmission; each
    // request (one per connection) is a record whose wait includes it.
    let done: Vec<_> = a.records.iter().filter(|x| !x.pending).collect();
    assert!(done.len() >= 3, "{a:?}");
    assert_eq!(done.len() as u64, ra.requests);
    for x in &done {
        assert!(near(connect_us(x).unwrap(), 1.0), "{x:?}");
        assert_eq!(x.syn_retransmits, Some(1), "{x:?}");
        assert!(
            x.wait_us >= 1_000_000 && x.index == 0 && x.status == Some(200),
            "{x:?}"
        );
    }

    // Two dropped: the connect completes at ~3 s with two retransmissions.
    let done: Vec<_> = b.records.iter().filter(|x| !x.pending).collect();
    assert_eq!(done.len(), 1, "{b:?}");
    assert!(near(connect_us(done[0]).unwrap(), 3.0), "{:?}", done[0]);
    assert_eq!(done[0].syn_retransmits, Some(2));
    // The next connect is pending at the end: a record of at least its age, not dropped.
    let pending: Vec<_> = b.records.iter().filter(|x| x.pending).collect();
    assert_eq!(pending.len(), 1, "{b:?}");
    assert_eq!((pending[0].connect_end_us, pending[0].error), (None, None));
    // It started at ~3 s, so at 3.7 s its SYN has not been retransmitted yet.
    assert_eq!(pending[0].syn_retransmits, Some(0), "{:?}", pending[0]);
    assert!(pending[0].wait_us > 0);

    // A 1.5 s connect timeout between the two retransmissions: each attempt is a
    // connect-timeout record of ~1.5 s that saw one retransmission.
    let timed_out: Vec<_> = c
        .records
        .iter()
        .filter(|x| x.error == Some(RequestError::ConnectTimeout))
        .collect();
    assert_eq!(rc.requests, 0);
    assert_eq!(timed_out.len() as u64, rc.errors.connect);
    assert_eq!(timed_out.len(), 2, "{c:?}");
    for x in timed_out {
        assert!(near(x.wait_us, 1.5), "{x:?}");
        assert_eq!(x.syn_retransmits, Some(1), "{x:?}");
    }
    assert_eq!(c.records.iter().filter(|x| x.pending).count(), 1, "{c:?}");
}

/// With the namespace's own SYN schedule (Linux ≥ 6.5 retransmits the first SYNs linearly,
/// 1 s apart, by default: `tcp_syn_linear_timeouts` = 4), a connect whose first two SYNs
/// are dropped is a record of the second retransmission's time: 2 s there, 3 s on older
/// kernels. A 3.5 s connect timeout sees it either way.
#[test]
#[ignore = "needs root"]
fn two_dropped_syns_wait_for_the_kernels_second_retransmission() {
    let mut guard = lagtrace_testkit::net::NetGuard::new();
    let ns = guard.add_ns("rec-lin");
    let linear: u32 =
        lagtrace_testkit::try_in_ns(&ns, &["cat", "/proc/sys/net/ipv4/tcp_syn_linear_timeouts"])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
    let expect_s = if linear >= 2 { 2.0 } else { 3.0 };
    let (r, recs) = lagtrace_netns::NetNs::Named(ns.clone())
        .run(|| {
            let (addr, _) = serve(1, 0, Duration::ZERO);
            drop_first_syns(&ns, addr.port(), 2);
            let mut o = opts(addr, 1, 1, 3700, RecordOptions::default());
            o.connect_timeout = Duration::from_millis(3500);
            go(&o)
        })
        .expect("enter the namespace");
    assert_accounted(&r, &recs);
    let done: Vec<_> = recs.records.iter().filter(|x| !x.pending).collect();
    assert!(!done.is_empty(), "{recs:?}");
    for x in done {
        let s = connect_us(x).unwrap() as f64 / 1e6;
        assert!((s - expect_s).abs() < 0.25, "linear {linear}: {x:?}");
        assert_eq!((x.syn_retransmits, x.status), (Some(2), Some(200)), "{x:?}");
    }
}
