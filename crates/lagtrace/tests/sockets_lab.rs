//! `lagtrace sockets` on the lab (issue #2's two-host case): the latency nginx's keep-alive
//! sockets show TCP_NODELAY off and the good one's on, the lens cites the config line, and
//! the built-in server's sockets match its flags. Run as root (CI does).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use lagtrace_lab::{Lab, LabOptions, serve};
use lagtrace_netns::NetNs;
use lagtrace_sockets::{InspectOptions, Inspection, SocketInfo, inspect};
use lagtrace_testkit::nginx::keepalive_to as keepalive;

fn server_side(ins: &Inspection, port: u16) -> Vec<&SocketInfo> {
    ins.sockets
        .iter()
        .filter(|s| s.state == "ESTABLISHED" && s.local.port() == port)
        .collect()
}

#[test]
#[ignore = "needs root"]
fn lab_latency_nginx_has_nodelay_off_and_the_lens_cites_the_line() {
    let lab = Lab::up(&LabOptions::new(&format!("skl{}", std::process::id()))).unwrap();
    let _lat: Vec<_> = (0..3).map(|_| keepalive(lab.latency_addr(), 2)).collect();
    let _good: Vec<_> = (0..3).map(|_| keepalive(lab.good_addr(), 2)).collect();
    let lport = lab.latency_addr().port();
    let gport = lab.good_addr().port();

    let ins = inspect(&InspectOptions {
        netns: lab.netns(),
        process: Some("nginx".into()),
        ..Default::default()
    })
    .unwrap();
    let lat = server_side(&ins, lport);
    let good = server_side(&ins, gport);
    assert_eq!((lat.len(), good.len()), (3, 3), "{ins:#?}");
    let workers = lab.server_pids("latency");
    assert!(!workers.is_empty());
    for s in &lat {
        assert_eq!(s.options.as_ref().unwrap().nodelay, Some(false), "{s:?}");
        assert!(
            s.owners.iter().all(|o| workers.contains(&o.pid)),
            "owned by the latency workers {workers:?}: {s:?}"
        );
    }
    // The lab's good nginx runs Debian's stock `sendfile on; tcp_nopush on;`: nginx sends
    // each response corked and uncorks at its end (which pushes the last partial frame out
    // at once); on Linux it then does not set TCP_NODELAY (ngx_http_set_keepalive only sets
    // it when the connection was not corked). So no stall, yet TCP_NODELAY reads off:
    // the socket options alone are not the verdict, the lens's tcp_nopush is part of it.
    for s in &good {
        let o = s.options.as_ref().unwrap();
        assert_eq!((o.nodelay, o.cork), (Some(false), Some(false)), "{s:?}");
    }
    // The good nginx's listener is shared by its master and workers: all are owners.
    let listener = ins
        .sockets
        .iter()
        .find(|s| s.state == "LISTEN" && s.local.port() == gport)
        .unwrap();
    assert!(listener.owners.len() >= 2, "{listener:?}");

    let st = lab.state();
    let conf = st
        .servers
        .iter()
        .find(|s| s.role == "latency")
        .and_then(|s| s.config.clone())
        .unwrap();
    let f = ins
        .configs
        .iter()
        .find(|c| c.directive == "tcp_nodelay" && c.ports == vec![lport])
        .unwrap_or_else(|| panic!("{:#?}", ins.configs));
    assert_eq!(f.value, "off");
    assert_eq!(f.file.as_deref(), Some(conf.as_path()));
    let text = std::fs::read_to_string(&conf).unwrap();
    assert_eq!(
        text.lines()
            .nth(f.line.unwrap() as usize - 1)
            .unwrap()
            .trim(),
        "tcp_nodelay off;"
    );
    // The good server's effective value is nginx's default, and it uses tcp_nopush.
    let g = |d: &str| {
        ins.configs
            .iter()
            .find(|c| c.directive == d && c.ports == vec![gport])
            .unwrap()
            .clone()
    };
    assert!(g("tcp_nodelay").default && g("tcp_nodelay").value == "on");
    assert_eq!(g("tcp_nopush").value, "on");

    // The CLI says the same in one line per process.
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args([
            "sockets",
            "--netns",
            &st.netns,
            "--port",
            &lport.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "3 established on :{lport}, 1 listening, TCP_NODELAY off on 3/3"
        )),
        "{text}"
    );

    // Asked for by pid without --netns, a process in another namespace is found there, and
    // the output says where (issue 34: "no matching TCP sockets", exit 0, no hint).
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["sockets", "--pid", &workers[0].to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("no matching TCP sockets"), "{text}");
    assert!(
        text.contains(&format!(
            "note: none in this network namespace; found in {}",
            st.netns
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("[{}] ESTABLISHED", st.netns)),
        "{text}"
    );

    // `lab fix` changes the latency server's `tcp_nodelay off;` line to `tcp_nodelay on;`
    // (nothing else) and reloads: the lens follows the file, the new workers' keep-alive
    // sockets have TCP_NODELAY on.
    lab.fix().unwrap();
    let _fixed: Vec<_> = (0..2).map(|_| keepalive(lab.latency_addr(), 2)).collect();
    let ins = inspect(&InspectOptions {
        netns: lab.netns(),
        port: Some(lport),
        ..Default::default()
    })
    .unwrap();
    let f = |d: &str| {
        ins.configs
            .iter()
            .find(|c| c.directive == d && c.ports == vec![lport])
            .unwrap_or_else(|| panic!("{:#?}", ins.configs))
            .clone()
    };
    assert_eq!(f("tcp_nodelay").value, "on");
    assert_eq!(
        f("tcp_nopush").value,
        "off",
        "the fix changes tcp_nodelay alone"
    );
    let new_conns = server_side(&ins, lport)
        .into_iter()
        .filter(|s| s.options.as_ref().and_then(|o| o.nodelay) == Some(true))
        .count();
    assert!(new_conns >= 2, "{ins:#?}");
}

/// A `lagtrace serve` process in the lab's namespace with Nagle on and TCP_CORK left on:
/// its accepted socket reads back exactly those flags, owned by that process.
#[test]
#[ignore = "needs root"]
fn lab_builtin_process_sockets_match_its_flags() {
    let lab = Lab::up(&LabOptions::new(&format!("skb{}", std::process::id()))).unwrap();
    let port = 9090;
    let pid = lab
        .start_builtin(
            std::path::Path::new(env!("CARGO_BIN_EXE_lagtrace")),
            port,
            &serve::ServeOptions {
                nodelay: false,
                cork: true,
                ..Default::default()
            },
        )
        .unwrap();
    let _c = keepalive(SocketAddr::from((lab.server_addr(), port)), 1);
    let ins = inspect(&InspectOptions {
        netns: lab.netns(),
        port: Some(port),
        ..Default::default()
    })
    .unwrap();
    let s = server_side(&ins, port);
    assert_eq!(s.len(), 1, "{ins:#?}");
    assert_eq!(
        s[0].owners.iter().map(|o| o.pid).collect::<Vec<_>>(),
        vec![pid]
    );
    let o = s[0].options.as_ref().unwrap();
    assert_eq!((o.nodelay, o.cork), (Some(false), Some(true)), "{o:?}");
}

#[test]
fn builtin_server_sockets_match_its_flags() {
    for (nodelay, cork) in [(false, false), (true, true)] {
        let srv = serve::Server::spawn(serve::ServeOptions {
            nodelay,
            cork,
            netns: NetNs::Current,
            ..Default::default()
        })
        .unwrap();
        let addr = srv.local_addr();
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // one request, so the accept and its setsockopt calls have happened
        (&c).write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut tmp = [0u8; 2048];
        let _ = (&c).read(&mut tmp).unwrap();
        let ins = inspect(&InspectOptions {
            port: Some(addr.port()),
            pid: Some(std::process::id()),
            ..Default::default()
        })
        .unwrap();
        let s = server_side(&ins, addr.port());
        assert_eq!(s.len(), 1, "{ins:#?}");
        let o = s[0].options.as_ref().unwrap();
        assert_eq!(
            (o.nodelay, o.cork),
            (Some(nodelay), Some(cork)),
            "serve nodelay={nodelay} cork={cork}: {o:?}"
        );
    }
}
