//! `lagtrace host`: the JSON contract, one-line errors, and the text on a real accept-queue
//! overflow (a Python listener with backlog 1 that never accepts, in a namespace the test
//! makes).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lagtrace_testkit::net::{NetGuard, enter_netns};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

#[test]
fn json_follows_the_contract_and_errors_are_one_line() {
    let out = Command::new(BIN)
        .args(["host", "-d", "300ms", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["schema_version"].as_u64(), v["command"].as_str()),
        (Some(2), Some("host"))
    );
    assert!(v["window_us"].as_u64().unwrap() >= 300_000);
    assert_eq!(v["counters"]["status"], "ok");
    assert_eq!(
        v["cgroup"]["status"], "skipped",
        "no --pid: {}",
        v["cgroup"]
    );
    for (args, needle) in [
        (
            vec!["host", "--pid", "4000000000", "-d", "1s"],
            "no process 4000000000",
        ),
        (
            vec!["host", "--netns", "lt-no-such-ns", "-d", "1s"],
            "no network namespace",
        ),
        (vec!["host", "-d", "0s"], "window"),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

/// A Python listener on 127.0.0.1:`port` in `ns` with this backlog that never accepts,
/// owned by the guard; its pid, once it listens.
fn listener(g: &mut NetGuard, ns: &str, port: u16, backlog: u32) -> u32 {
    let mut server = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(
            "import socket, sys, time\ns = socket.socket()\n\
             s.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen(int(sys.argv[2]))\n\
             print('ready', flush=True)\ntime.sleep(20)",
        )
        .args([port.to_string(), backlog.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = server.id();
    g.own_child(server);
    pid
}

#[test]
#[ignore = "needs root"]
fn the_text_names_an_overflowing_listener_and_what_it_means() {
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-cli");
    let port = 24_000 + (std::process::id() % 5000) as u16;
    let pid = listener(&mut g, &ns, port, 1);
    let host = std::thread::spawn(move || {
        Command::new(BIN)
            .args(["host", "--pid", &pid.to_string(), "-d", "2s"])
            .output()
            .unwrap()
    });
    let client = std::thread::spawn(move || {
        enter_netns(&ns);
        std::thread::sleep(Duration::from_millis(300));
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let socks: Vec<_> = (0..20)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = s.connect(&addr.into());
                s.set_linger(Some(Duration::ZERO)).unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1200));
        drop(socks);
    });
    client.join().unwrap();
    let out = host.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("TcpExt.ListenOverflows"), "{text}");
    assert!(
        text.contains(&format!("listener 127.0.0.1:{port} queue peak 2/1")),
        "{text}"
    );
    assert!(text.contains("the accept queue overflowed"), "{text}");
    assert!(text.contains(&format!("{pid}/python3")), "{text}");
    assert!(text.contains("cost:"), "{text}");
}

/// SYN probes (hping3's kind, here lagtrace ping's) to a listener that accepts everything:
/// each SYN-ACK is answered by the prober's RST, which the listener discards and counts in
/// its sk_drops while the namespace's ListenDrops stays still. The host layer counts no
/// dropped connection and says no queue overflowed.
#[test]
#[ignore = "needs root"]
fn syn_probes_reset_at_a_listener_are_not_dropped_connections() {
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-probe");
    let port = 27_000 + (std::process::id() % 5000) as u16;
    listener(&mut g, &ns, port, 128);
    let window = |json: bool| {
        let ns = ns.clone();
        std::thread::spawn(move || {
            let mut args = vec!["host", "--netns", &ns, "-d", "2500ms"];
            if json {
                args.push("--json");
            }
            Command::new(BIN).args(&args).output().unwrap()
        })
    };
    let (j, t) = (window(true), window(false));
    std::thread::sleep(Duration::from_millis(600));
    let p = port.to_string();
    let ping = Command::new("ip")
        .args(["netns", "exec", &ns, BIN, "ping", "127.0.0.1", "-p", &p])
        .args(["-c", "6", "-i", "50ms"])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stderr)
    );
    let (j, t) = (j.join().unwrap(), t.join().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    let l = v["listeners"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["local"] == format!("127.0.0.1:{port}"))
        .unwrap_or_else(|| panic!("{}", v["listeners"]));
    assert!(l["drops"].as_u64().unwrap_or(0) >= 6, "{l}");
    let ns_drops = v["counters"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "TcpExt.ListenDrops")
        .map_or(0, |c| c["delta"].as_i64().unwrap());
    assert_eq!(ns_drops, 0, "{}", v["counters"]);
    let text = String::from_utf8_lossy(&t.stdout);
    assert!(text.contains("other segments discarded"), "{text}");
    assert!(!text.contains("connections dropped"), "{text}");
    assert!(!text.contains("the accept queue overflowed"), "{text}");
}

/// `lagtrace ARGS` as user nobody (uid/gid 65534): no capability at all.
fn as_nobody(args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(BIN)
        .args(args)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap()
}

/// Without privilege (as `nobody`): the tracepoint part says `unavailable` and names
/// CAP_PERFMON, the other parts still run; entering another namespace is refused naming
/// CAP_SYS_ADMIN.
#[test]
#[ignore = "needs root"]
fn without_privilege_the_parts_that_need_it_say_which_capability() {
    use std::os::unix::process::CommandExt;
    let out = as_nobody(&["host", "-d", "300ms", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["drops"]["status"], "unavailable", "{}", v["drops"]);
    assert!(
        v["drops"]["reason"]
            .as_str()
            .unwrap()
            .contains("CAP_PERFMON")
    );
    for part in ["counters", "listeners", "qdiscs", "sockstat"] {
        assert_eq!(v[part]["status"], "ok", "{part}: {}", v[part]);
    }
    // Another user's process: reading its namespace is refused, naming CAP_SYS_PTRACE.
    let me = std::process::id().to_string();
    let out = as_nobody(&["host", "--pid", &me, "-d", "300ms"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("CAP_SYS_PTRACE"), "{err}");
    // Its own process in this namespace needs no setns: the per-process parts run too.
    let mut own = Command::new("sleep")
        .arg("5")
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let pid = own.id().to_string();
    let out = as_nobody(&["host", "--pid", &pid, "-d", "300ms", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let _ = own.kill();
    let _ = own.wait();
    assert_eq!(v["threads"]["status"], "ok", "{}", v["threads"]);
    assert_eq!(v["cgroup"]["status"], "ok", "{}", v["cgroup"]);
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-priv");
    let out = as_nobody(&["host", "--netns", &ns, "-d", "300ms"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("CAP_SYS_ADMIN") && err.lines().count() == 1,
        "{err}"
    );
}

/// Connection tracking read in the watched namespace: a stateful rule there (`ct state`)
/// makes the kernel track its connections, and 20 connects to a listener during the window
/// are 20 entries or more; `lagtrace host` shows them in the JSON and on a `conntrack:`
/// line, against the table's maximum.
#[test]
#[ignore = "needs root"]
fn connection_tracking_is_read_in_the_namespace() {
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-ct");
    let nft = Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(
                b"table inet ltct {\n chain in {\n  type filter hook input priority 0; policy accept;\n  ct state established,related accept\n }\n}\n",
            )?;
            c.wait()
        })
        .expect("nft");
    assert!(nft.success(), "nft -f");
    let port = 26_000 + (std::process::id() % 5000) as u16;
    let pid = listener(&mut g, &ns, port, 64);
    let run = |json: bool| {
        let host = std::thread::spawn(move || {
            let mut c = Command::new(BIN);
            c.args(["host", "--pid", &pid.to_string(), "-d", "2s"]);
            if json {
                c.arg("--json");
            }
            c.output().unwrap()
        });
        let ns = ns.clone();
        let client = std::thread::spawn(move || {
            enter_netns(&ns);
            std::thread::sleep(Duration::from_millis(300));
            let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let socks: Vec<_> = (0..20)
                .map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)))
                .collect();
            std::thread::sleep(Duration::from_millis(300));
            drop(socks);
        });
        client.join().unwrap();
        let out = host.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let j: serde_json::Value = serde_json::from_str(&run(true)).expect("json");
    let ct = &j["conntrack"];
    assert_eq!(ct["status"], "ok", "{ct}");
    let peak = ct["data"]["peak"].as_u64().unwrap_or(0);
    assert!(peak >= 20, "20 connects, {peak} entries at the most: {ct}");
    assert!(ct["data"]["max"].as_u64().is_some_and(|m| m > 0), "{ct}");
    assert_eq!(ct["data"]["drop"], 0, "{ct}");
    let text = run(false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("conntrack: ") && l.contains(" entries at the most")),
        "{text}"
    );
}
