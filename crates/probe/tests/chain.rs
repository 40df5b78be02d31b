//! Acceptance tests on real traffic through a namespace chain client → r1 → r2 → server.
//! Need root (namespaces, raw sockets); every namespace is deleted by the `Chain` guard.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lagtrace_netns::NetNs;
use lagtrace_probe::{
    HopReply, PingMode, PingOptions, PingReport, Proto, RouteOptions, RouteReport, SampleKind,
};
use lagtrace_testkit::chain::Chain;
use lagtrace_testkit::in_ns;
use lagtrace_testkit::net::NetGuard;

fn chain(tag: &str) -> Chain {
    Chain::up(tag)
}

fn in_client<T: Send>(c: &Chain, f: impl FnOnce() -> T + Send) -> T {
    NetNs::Named(c.client_ns().to_string())
        .run(f)
        .expect("entering client namespace")
}

/// A listening socket inside the server namespace (the kernel answers SYNs; nobody accepts).
fn listen_in_server(c: &Chain) -> TcpListener {
    NetNs::Named(c.server_ns().to_string())
        .run(|| TcpListener::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap()
}

fn ping(c: &Chain, port: u16, mode: PingMode, count: u32, timeout_ms: u64) -> PingReport {
    let mut o = PingOptions::new(SocketAddr::new(IpAddr::V4(c.server()), port));
    o.mode = mode;
    o.count = count;
    o.interval = Duration::from_millis(20);
    o.timeout = Duration::from_millis(timeout_ms);
    o.fallback_to_connect = false;
    in_client(c, || lagtrace_probe::ping(&o, &AtomicBool::new(false))).unwrap()
}

fn route(c: &Chain, proto: Proto, port: u16) -> RouteReport {
    let mut o = RouteOptions::new(IpAddr::V4(c.server()));
    o.proto = proto;
    o.port = port;
    o.timeout = Duration::from_millis(1500);
    in_client(c, || lagtrace_probe::route(&o)).unwrap()
}

fn hop_addrs(r: &RouteReport) -> Vec<Vec<IpAddr>> {
    r.hops.iter().map(|h| h.addrs.clone()).collect()
}

#[test]
#[ignore = "needs root"]
fn route_lists_r1_r2_and_the_server_for_tcp_udp_and_icmp() {
    let c = chain("route3");
    let l = listen_in_server(&c);
    let open = l.local_addr().unwrap().port();
    let want = vec![
        vec![IpAddr::V4(c.r1())],
        vec![IpAddr::V4(c.r2())],
        vec![IpAddr::V4(c.server())],
    ];
    for (proto, port) in [
        (Proto::Tcp, open),
        (Proto::Tcp, 1),
        (Proto::Udp, 33434),
        (Proto::Icmp, 0),
    ] {
        let r = route(&c, proto, port);
        assert!(r.reached, "{proto:?}:{port} {r:#?}");
        assert_eq!(hop_addrs(&r), want, "{proto:?}:{port}");
        assert!(
            r.hops
                .iter()
                .take(2)
                .all(|h| h.probes.iter().all(|p| p.reply == HopReply::TimeExceeded))
        );
        assert_eq!(r.hops[2].probes[0].reply, HopReply::Target);
        assert!(
            r.hops.iter().all(|h| h.stats.received == 3),
            "{proto:?} every probe answered: {r:#?}"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn route_shows_a_star_where_r2_drops_its_time_exceeded_and_still_reaches_the_server() {
    let c = chain("routestar");
    let r2 = &c.ns[2];
    in_ns(
        r2,
        &[
            "nft",
            "add table inet ltdrop; add chain inet ltdrop out { type filter hook output priority 0; }; \
             add rule inet ltdrop out icmp type time-exceeded drop",
        ],
    );
    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        let t0 = Instant::now();
        let r = route(&c, proto, if proto == Proto::Udp { 33434 } else { 80 });
        let took = t0.elapsed();
        assert!(r.reached, "{proto:?}");
        let a = hop_addrs(&r);
        assert_eq!(a.len(), 3, "{proto:?} {a:?}");
        assert_eq!(a[0], vec![IpAddr::V4(c.r1())]);
        assert!(a[1].is_empty(), "hop 2 silent: {a:?}");
        assert_eq!(r.hops[1].stats.loss_pct, 100.0);
        assert_eq!(a[2], vec![IpAddr::V4(c.server())]);
        // All 90 probes were in flight at once: one timeout (1.5 s), not one per hop.
        assert!(
            took < Duration::from_millis(4000),
            "{proto:?} took {took:?}"
        );
        assert!(
            took >= Duration::from_millis(1400),
            "{proto:?} waited for hop 2: {took:?}"
        );
    }
}

fn syn_recv_count(c: &Chain) -> usize {
    in_ns(c.server_ns(), &["ss", "-Htan", "state", "syn-recv"])
        .lines()
        .count()
}

#[test]
#[ignore = "needs root"]
fn syn_ping_open_and_closed_ports_give_samples_and_leave_no_half_open_connection() {
    let c = chain("synping");
    let l = listen_in_server(&c);
    let open = l.local_addr().unwrap().port();
    let r = ping(&c, open, PingMode::Syn, 5, 1000);
    assert_eq!(r.mode, PingMode::Syn);
    assert_eq!(r.stats.received, 5, "{r:#?}");
    for s in &r.samples {
        assert_eq!(s.kind, SampleKind::SynAck);
        assert_eq!(s.flags.as_deref(), Some("SA"));
        assert_eq!(s.ttl, Some(62), "two routers decrement the server's TTL 64");
        let rtt = s.rtt_us.unwrap();
        assert!(rtt > 1.0 && rtt < 200_000.0, "rtt {rtt} µs");
    }
    assert!(r.timestamp_source.contains("SO_TIMESTAMPNS"));
    // veth has no qdisc queue: the kernel stamps every SYN during the send, and every reply.
    assert!(
        r.samples
            .iter()
            .all(|s| s.tx_kernel_ts == Some(true) && s.rx_kernel_ts == Some(true)),
        "{r:#?}"
    );
    // Our kernel reset each SYN-ACK: the server holds no half-open connection.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(syn_recv_count(&c), 0, "no SYN-RECV on the server");
    assert!(
        in_ns(c.server_ns(), &["ss", "-Htan", "state", "established"])
            .trim()
            .is_empty(),
        "nothing established either"
    );

    let r = ping(&c, 1, PingMode::Syn, 3, 1000);
    assert_eq!(r.stats.received, 3);
    assert!(
        r.samples
            .iter()
            .all(|s| s.kind == SampleKind::Rst && s.flags.as_deref() == Some("RA"))
    );
    drop(l);
}

#[test]
#[ignore = "needs root"]
fn syn_ping_to_a_dropped_port_is_all_loss_after_the_timeout() {
    let c = chain("syndrop");
    in_ns(
        c.server_ns(),
        &[
            "nft",
            "add table inet ltdrop; add chain inet ltdrop in { type filter hook input priority 0; }; \
             add rule inet ltdrop in tcp dport 9 drop",
        ],
    );
    let t0 = Instant::now();
    let r = ping(&c, 9, PingMode::Syn, 3, 400);
    let took = t0.elapsed();
    assert_eq!(r.stats.sent, 3);
    assert_eq!(r.stats.received, 0);
    assert_eq!(r.stats.loss_pct, 100.0);
    assert!(
        r.samples
            .iter()
            .all(|s| s.kind == SampleKind::Lost && s.rtt_us.is_none())
    );
    // 2 intervals (40 ms) + one timeout (400 ms): never hangs past it.
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1500),
        "{took:?}"
    );
}

#[test]
#[ignore = "needs root"]
fn udp_icmp_and_connect_modes_measure_the_same_path() {
    let c = chain("modes");
    let l = listen_in_server(&c);
    let open = l.local_addr().unwrap().port();
    let r = ping(&c, 33434, PingMode::Udp, 3, 1000);
    assert_eq!(r.stats.received, 3, "{r:#?}");
    assert!(
        r.samples
            .iter()
            .all(|s| s.kind == SampleKind::PortUnreachable)
    );
    let r = ping(&c, 0, PingMode::Icmp, 3, 1000);
    assert_eq!(r.stats.received, 3, "{r:#?}");
    assert!(
        r.samples
            .iter()
            .all(|s| s.kind == SampleKind::EchoReply && s.ttl == Some(62))
    );
    let r = ping(&c, open, PingMode::Connect, 3, 1000);
    assert_eq!(r.stats.received, 3);
    assert!(r.samples.iter().all(|s| s.kind == SampleKind::Connected));
    let r = ping(&c, 1, PingMode::Connect, 2, 1000);
    assert!(r.samples.iter().all(|s| s.kind == SampleKind::Refused));

    // TTL 1 dies at r1: its time exceeded is recorded, but it is not a reply from the target.
    let mut o = PingOptions::new(SocketAddr::new(IpAddr::V4(c.server()), open));
    o.count = 2;
    o.interval = Duration::from_millis(10);
    o.ttl = 1;
    let r = in_client(&c, || lagtrace_probe::ping(&o, &AtomicBool::new(false))).unwrap();
    assert_eq!(r.stats.received, 0);
    assert_eq!(r.stats.loss_pct, 100.0);
    for s in &r.samples {
        assert_eq!(s.kind, SampleKind::IcmpError);
        assert_eq!(s.from, Some(IpAddr::V4(c.r1())));
        assert_eq!(
            s.icmp_error,
            Some(lagtrace_probe::wire::IcmpError::TimeExceeded)
        );
    }
}

#[test]
#[ignore = "needs root"]
fn tbf_queue_under_load_makes_the_syn_rtt_rise() {
    let c = chain("tbf");
    let l = listen_in_server(&c);
    let open = l.local_addr().unwrap().port();
    let idle = ping(&c, open, PingMode::Syn, 10, 1000);
    assert_eq!(idle.stats.received, 10);
    // 4 Mbit/s with a 100 kB queue: up to ~200 ms of queueing on r1 → r2.
    let (r1, dev) = c.r1_to_r2_dev();
    in_ns(
        r1,
        &[
            "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "4mbit", "burst", "5kb",
            "limit", "100kb",
        ],
    );
    // Bounded competing load: one TCP bulk sender, at most 4 MB or 4 s.
    let sink = listen_in_server(&c);
    let sink_addr = SocketAddr::new(IpAddr::V4(c.server()), sink.local_addr().unwrap().port());
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let (mut s, _) = sink.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    let done = AtomicBool::new(false);
    let loaded = std::thread::scope(|s| {
        s.spawn(|| {
            use std::io::Write;
            let mut t = in_client(&c, || TcpStream::connect(sink_addr)).unwrap();
            let chunk = vec![0u8; 16384];
            let t0 = Instant::now();
            let mut sent = 0;
            t.set_write_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            while sent < 4 << 20
                && t0.elapsed() < Duration::from_secs(4)
                && !done.load(Ordering::Relaxed)
            {
                match t.write(&chunk) {
                    Ok(n) => sent += n,
                    Err(_) => continue,
                }
            }
        });
        // Let the queue fill, then ping from a background thread while the load runs.
        std::thread::sleep(Duration::from_millis(600));
        let r = s
            .spawn(|| ping(&c, open, PingMode::Syn, 15, 2000))
            .join()
            .unwrap();
        done.store(true, Ordering::Relaxed);
        r
    });
    reader.join().unwrap();
    let i = idle.stats.rtt.p50_us;
    let b = loaded.stats.rtt.p50_us;
    eprintln!(
        "SYN RTT p50 idle {i:.1} µs, under load through tbf {b:.1} µs ({} of {} answered)",
        loaded.stats.received, loaded.stats.sent
    );
    assert!(loaded.stats.received >= 5, "{:#?}", loaded.stats);
    assert!(b > i + 20_000.0, "SYN RTT under load {b} µs vs idle {i} µs");
}

#[test]
#[ignore = "needs root"]
fn ipv6_syn_udp_icmp_ping_and_route_on_loopback() {
    // A namespace with only loopback (so no other process's services answer).
    let mut guard = NetGuard::new();
    let ns = guard.add_ns("v6lo");
    let net = NetNs::Named(ns.clone());
    let l = net.run(|| TcpListener::bind("[::1]:0")).unwrap().unwrap();
    let open = l.local_addr().unwrap().port();
    for (mode, port, kind) in [
        (PingMode::Syn, open, SampleKind::SynAck),
        (PingMode::Syn, 1, SampleKind::Rst),
        (PingMode::Udp, 33434, SampleKind::PortUnreachable),
        (PingMode::Icmp, 0, SampleKind::EchoReply),
    ] {
        let mut o = PingOptions::new(SocketAddr::new("::1".parse().unwrap(), port));
        o.mode = mode;
        o.count = 3;
        o.interval = Duration::from_millis(5);
        let r = net
            .run(|| lagtrace_probe::ping(&o, &AtomicBool::new(false)))
            .unwrap()
            .unwrap();
        assert_eq!(r.stats.received, 3, "{mode:?} {r:#?}");
        assert!(
            r.samples
                .iter()
                .all(|s| s.kind == kind && s.ttl == Some(64)),
            "{mode:?} {r:#?}"
        );
    }
    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        let mut o = RouteOptions::new("::1".parse().unwrap());
        o.proto = proto;
        o.port = if proto == Proto::Udp { 33434 } else { open };
        let r = net.run(|| lagtrace_probe::route(&o)).unwrap().unwrap();
        assert!(r.reached, "{proto:?}");
        assert_eq!(r.hops.len(), 1);
        assert_eq!(r.hops[0].addrs, vec!["::1".parse::<IpAddr>().unwrap()]);
    }
}

#[test]
#[ignore = "needs root"]
fn ipv6_route_and_syn_ping_through_the_routers() {
    let c = chain("v6route");
    let server: IpAddr = c.addr6(2, 2).into();
    let want: Vec<Vec<IpAddr>> = vec![
        vec![c.addr6(0, 2).into()],
        vec![c.addr6(1, 2).into()],
        vec![server],
    ];
    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
        let mut o = RouteOptions::new(server);
        o.proto = proto;
        o.port = if proto == Proto::Udp { 33434 } else { 80 };
        o.max_ttl = 8;
        let r = in_client(&c, || lagtrace_probe::route(&o)).unwrap();
        assert!(r.reached, "{proto:?} {r:#?}");
        assert_eq!(hop_addrs(&r), want, "{proto:?}");
    }
    let mut o = PingOptions::new(SocketAddr::new(server, 80));
    o.count = 3;
    o.interval = Duration::from_millis(10);
    let r = in_client(&c, || lagtrace_probe::ping(&o, &AtomicBool::new(false))).unwrap();
    assert_eq!(r.stats.received, 3, "{r:#?}");
    assert!(
        r.samples
            .iter()
            .all(|s| s.kind == SampleKind::Rst && s.ttl == Some(62))
    );
}
