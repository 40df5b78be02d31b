//! `inspect` against real sockets: our own listener with known options, real nginx
//! (latency config vs stock), a namespace, processes that vanish, missing privilege.
//! Run as root (CI does).

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use lagtrace_netns::NetNs;
use lagtrace_sockets::{InspectOptions, Inspection, SocketInfo, inspect};
use lagtrace_testkit::net::NetGuard;
use lagtrace_testkit::nginx::*;

/// One line per socket (state, ends, inode, owners, notes): a failure shows the whole
/// listing, where `{:#?}` of every TCP_INFO field is cut off by a CI log's length limit.
fn listing(ins: &Inspection) -> String {
    let mut out = String::new();
    for s in &ins.sockets {
        let owners: Vec<String> = s
            .owners
            .iter()
            .map(|o| format!("{}/{}:{}", o.comm, o.pid, o.fd))
            .collect();
        out += &format!(
            "\n  {} {} {} -> {} inode {} owners [{}]",
            s.netns,
            s.state,
            s.local,
            s.remote,
            s.inode,
            owners.join(" ")
        );
    }
    for n in &ins.notes {
        out += &format!("\n  note: {n}");
    }
    out
}

fn established_on(ins: &Inspection, local_port: u16) -> Vec<&SocketInfo> {
    ins.sockets
        .iter()
        .filter(|s| s.state == "ESTABLISHED" && s.local.port() == local_port)
        .collect()
}

/// Our own server: four accepted sockets, each configured differently; inspect must read
/// exactly those options back, and TCP_INFO must agree with `ss -ti`.
#[test]
fn own_listener_options_are_read_back_exactly() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let clients: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let accepted: Vec<socket2::Socket> = (0..4).map(|_| l.accept().unwrap().0.into()).collect();
    accepted[0].set_tcp_nodelay(true).unwrap();
    accepted[1].set_tcp_nodelay(false).unwrap();
    accepted[2].set_tcp_cork(true).unwrap();
    accepted[3].set_send_buffer_size(50_000).unwrap();
    accepted[3].set_tcp_notsent_lowat(16_384).unwrap();

    let ins = inspect(&InspectOptions {
        port: Some(port),
        pid: Some(std::process::id()),
        ..Default::default()
    })
    .unwrap();
    let mine = established_on(&ins, port);
    assert_eq!(mine.len(), 4, "{}", listing(&ins));
    for (i, a) in accepted.iter().enumerate() {
        let peer = a.peer_addr().unwrap().as_socket().unwrap();
        let s = mine.iter().find(|s| s.remote == peer).unwrap();
        assert!(
            s.owners
                .iter()
                .any(|o| o.pid == std::process::id() && o.fd == a.as_raw_fd()),
            "{s:?}"
        );
        let o = s.options.as_ref().unwrap_or_else(|| panic!("{s:?}"));
        assert_eq!(o.nodelay, Some(i == 0), "socket {i}: {o:?}");
        assert_eq!(o.cork, Some(i == 2), "socket {i}: {o:?}");
        if i == 3 {
            assert_eq!(o.sndbuf, Some(100_000)); // the kernel doubles it
            assert_eq!(o.notsent_lowat, Some(16_384));
        } else {
            assert_eq!(o.notsent_lowat, Some(0));
            assert_ne!(o.sndbuf, Some(100_000));
        }
        let t = s.tcp_info.as_ref().unwrap();
        assert!(t.rtt_us.is_some() && t.snd_cwnd.is_some() && t.delivery_rate.is_some());
    }
    // The listener is there too, with its owner.
    let lis = ins
        .sockets
        .iter()
        .find(|s| s.state == "LISTEN" && s.local.port() == port)
        .unwrap();
    assert_eq!(lis.owners[0].fd, l.as_raw_fd());
    // Cross-check with the peer tool: ss sees the same cwnd, mss and congestion control.
    let out = Command::new("ss")
        .args(["-tinH", "state", "established", &format!("sport = :{port}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let ss_cwnds: Vec<u32> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("cwnd:"))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(ss_cwnds.len(), 4, "{text}");
    let ss_vals = |key: &str| -> Vec<u64> {
        text.split_whitespace()
            .filter_map(|w| w.strip_prefix(key))
            .map(|v| v.split('.').next().unwrap().parse().unwrap())
            .collect()
    };
    let (ss_rto, ss_mss) = (ss_vals("rto:"), ss_vals("mss:"));
    for s in &mine {
        let t = s.tcp_info.as_ref().unwrap();
        assert!(ss_cwnds.contains(&t.snd_cwnd.unwrap()));
        assert!(
            ss_rto.contains(&(u64::from(t.rto_us.unwrap()) / 1000)),
            "{ss_rto:?} {t:?}"
        );
        assert!(
            ss_mss.contains(&u64::from(t.snd_mss.unwrap())),
            "{ss_mss:?} {t:?}"
        );
        let cc = s.congestion.as_deref().unwrap();
        assert!(text.contains(&format!(" {cc} ")), "{cc} not in {text}");
    }
    // The per-process summary counts them, with the 4 client ends (Nagle on: default).
    let me = ins
        .processes
        .iter()
        .find(|p| p.pid == std::process::id())
        .unwrap();
    assert_eq!((me.nodelay_on, me.nodelay_off, me.cork_on), (1, 7, 1));
    assert_eq!(
        (me.server_ports.clone(), me.client_ports.clone()),
        (vec![port], vec![port])
    );
    assert!(
        me.line().contains("TCP_NODELAY off on 7/8"),
        "{}",
        me.line()
    );
    drop(clients);
}

/// The reference case: the latency nginx's keep-alive sockets have TCP_NODELAY off, the
/// stock nginx's on, and the lens cites the `tcp_nodelay off;` line.
#[test]
#[ignore = "needs root"]
fn nginx_latency_vs_good_and_config_lens() {
    let (pl, pg) = (free_port(), free_port());
    let latency = Nginx::start(LATENCY_HTTP, pl, None);
    let good = Nginx::start("", pg, None);
    // Two requests per connection: nginx sets TCP_NODELAY lazily on entering keep-alive.
    let _cl: Vec<_> = (0..3).map(|_| keepalive_client(pl, 2)).collect();
    let _cg: Vec<_> = (0..3).map(|_| keepalive_client(pg, 2)).collect();

    let ins = inspect(&InspectOptions {
        process: Some("nginx".into()),
        ..Default::default()
    })
    .unwrap();
    let lat = established_on(&ins, pl);
    let goo = established_on(&ins, pg);
    assert_eq!((lat.len(), goo.len()), (3, 3), "{}", listing(&ins));
    for s in &lat {
        assert_eq!(s.options.as_ref().unwrap().nodelay, Some(false), "{s:?}");
        assert!(s.owners.iter().all(|o| o.comm == "nginx"));
    }
    for s in &goo {
        assert_eq!(s.options.as_ref().unwrap().nodelay, Some(true), "{s:?}");
    }
    let worker_summary = ins
        .processes
        .iter()
        .find(|p| p.established == 3 && p.server_ports == vec![pl])
        .unwrap_or_else(|| panic!("{:#?}", ins.processes));
    assert!(
        worker_summary
            .line()
            .contains(&format!("3 established on :{pl}")),
        "{}",
        worker_summary.line()
    );
    assert!(worker_summary.line().contains("TCP_NODELAY off on 3/3"));

    let f = ins
        .configs
        .iter()
        .find(|c| c.pid == latency.master && c.directive == "tcp_nodelay" && c.ports == vec![pl])
        .unwrap_or_else(|| panic!("{:#?}", ins.configs));
    assert_eq!(f.value, "off");
    assert_eq!(f.file.as_deref(), Some(latency.conf_path()));
    let line = f.line.unwrap();
    assert_eq!(line, latency.line_of("tcp_nodelay off;"));
    let text = std::fs::read_to_string(latency.conf_path()).unwrap();
    assert_eq!(
        text.lines().nth(line as usize - 1).unwrap().trim(),
        "tcp_nodelay off;"
    );
    let g = ins
        .configs
        .iter()
        .find(|c| c.pid == good.master && c.directive == "tcp_nodelay" && c.ports == vec![pg])
        .unwrap();
    assert!(g.default && g.value == "on", "{g:?}");
}

/// Sockets in a namespace the test made: invisible from here, found with `netns` and with
/// `all_netns` (once, even though several processes share the namespace).
#[test]
#[ignore = "needs root"]
fn namespaces_named_and_all() {
    let mut guard = NetGuard::new();
    let ns_name = guard.add_ns("sk-ns");
    let port = free_port();
    let _nginx = Nginx::start(LATENCY_HTTP, port, Some(&ns_name));
    let netns = NetNs::Named(ns_name.clone());
    let _c = netns.run(|| keepalive_client(port, 2)).unwrap();

    let here = inspect(&InspectOptions {
        port: Some(port),
        ..Default::default()
    })
    .unwrap();
    assert!(here.sockets.iter().all(|s| s.netns == "current"));
    let inside = inspect(&InspectOptions {
        netns: netns.clone(),
        port: Some(port),
        ..Default::default()
    })
    .unwrap();
    let est: Vec<_> = inside
        .sockets
        .iter()
        .filter(|s| s.state == "ESTABLISHED")
        .collect();
    assert_eq!(est.len(), 2, "{}", listing(&inside)); // both ends, on loopback inside
    assert!(inside.sockets.iter().all(|s| s.netns == ns_name));
    let server = est.iter().find(|s| s.local.port() == port).unwrap();
    assert_eq!(server.options.as_ref().unwrap().nodelay, Some(false));
    assert!(server.ack.is_some(), "/proc/net/tcp of the namespace read");

    let all = inspect(&InspectOptions {
        all_netns: true,
        port: Some(port),
        ..Default::default()
    })
    .unwrap();
    let in_ns: Vec<_> = all
        .sockets
        .iter()
        .filter(|s| s.local.port() == port && s.state == "ESTABLISHED")
        .collect();
    assert_eq!(in_ns.len(), 1, "namespace scanned once: {}", listing(&all));
    assert_eq!(in_ns[0].netns, ns_name, "named before pid-labelled");
}

/// A process whose socket was listed exits before its options are read: a note, no panic.
#[test]
fn process_exiting_mid_scan_gives_a_note() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fd = l.as_raw_fd();
    let mut child = unsafe {
        Command::new("sleep")
            .arg("30")
            .pre_exec(move || {
                // SAFETY: dup2 in the child; fd 100 now holds the listener without CLOEXEC.
                if libc::dup2(fd, 100) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .unwrap()
    };
    let pid = child.id();
    drop(l); // only the child holds it now
    std::thread::sleep(Duration::from_millis(100));
    let o = InspectOptions {
        pid: Some(pid),
        port: Some(port),
        ..Default::default()
    };
    let listed = lagtrace_sockets::inspect_sockets(&o).unwrap();
    assert_eq!(listed.sockets.len(), 1, "{listed:#?}");
    assert_eq!(listed.sockets[0].owners[0].pid, pid);
    child.kill().unwrap();
    child.wait().unwrap();
    let ins = lagtrace_sockets::finish_inspection(listed, &o);
    let s = &ins.sockets[0];
    assert!(s.options.is_none());
    assert_eq!(
        s.options_error.as_deref(),
        Some("process exited during the scan")
    );
    assert!(
        ins.notes
            .iter()
            .any(|n| n.contains(&format!("({pid})")) && n.contains("exited")),
        "{:?}",
        ins.notes
    );
}

#[test]
fn pid_that_does_not_exist_is_a_note() {
    // pid_max is 32768 or more; find a pid that is not running.
    let pid = (30_000..32_000)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let ins = inspect(&InspectOptions {
        pid: Some(pid),
        ..Default::default()
    })
    .unwrap();
    assert!(ins.sockets.is_empty());
    assert!(
        ins.notes
            .iter()
            .any(|n| n == &format!("pid {pid}: no such process")),
        "{:?}",
        ins.notes
    );
}

#[test]
fn missing_namespace_is_an_error() {
    let e = inspect(&InspectOptions {
        netns: NetNs::Named("lt-sk-no-such-ns".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("lt-sk-no-such-ns"), "{e}");
}

/// IPv6 sockets are enumerated too, and the state filter keeps only what was asked.
#[test]
fn ipv6_and_state_filter() {
    let Ok(l) = TcpListener::bind("[::1]:0") else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    let port = l.local_addr().unwrap().port();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (a, _) = l.accept().unwrap();
    a.set_nodelay(true).unwrap();
    let ins = inspect(&InspectOptions {
        port: Some(port),
        // Only ours: another process may hold port P on IPv4 as a client end.
        pid: Some(std::process::id()),
        ..Default::default()
    })
    .unwrap();
    let est = established_on(&ins, port);
    assert_eq!(est.len(), 1, "{}", listing(&ins));
    assert!(est[0].local.is_ipv6());
    assert_eq!(est[0].options.as_ref().unwrap().nodelay, Some(true));
    assert!(est[0].ack.is_some(), "/proc/net/tcp6 read");
    let listen_only = inspect(&InspectOptions {
        port: Some(port),
        states: Some(vec![
            lagtrace_sockets::diag::state_number("listen").unwrap(),
        ]),
        pid: Some(std::process::id()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(listen_only.sockets.len(), 1, "{}", listing(&listen_only));
    assert_eq!(listen_only.sockets[0].state, "LISTEN");
    drop((c, a));
}
