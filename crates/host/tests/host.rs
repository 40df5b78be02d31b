//! The host layer on real kernel mechanisms in namespaces and cgroups this test makes:
//! an accept-queue overflow, a cgroup v1 CPU quota on a busy process, a tbf qdisc dropping.
//! Each has a negative control (another listener, another process, another device) that
//! must not be blamed, and a cross-check against the peer tool (ss, tc, nstat) where one
//! exists.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lagtrace_host::{HostOptions, WindowControl, measure_with};
use lagtrace_model::host::HostReport;
use lagtrace_testkit::net::{NetGuard, enter_netns};
use lagtrace_testkit::{in_ns, unique_name};

/// Starts `python3 -c code args...` inside `ns` (or here), waits for its "ready" line.
fn python(ns: Option<&str>, code: &str, args: &[&str]) -> Child {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    let mut child = c
        .arg("-c")
        .arg(code)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "python helper did not start");
    child
}

/// A listener on 127.0.0.1:PORT with backlog BACKLOG; accepts (and closes) only if the
/// third argument is `accept`. Lives at most 30 s.
const LISTENER: &str = r#"
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(int(sys.argv[2]))
print("ready", flush=True)
end = time.time() + 30
if sys.argv[3] == "accept":
    s.settimeout(0.2)
    while time.time() < end:
        try:
            c, _ = s.accept(); c.close()
        except socket.timeout:
            pass
else:
    time.sleep(30)
"#;

/// The bound of a window that the test ends itself once its traffic is done.
const BOUND: Duration = Duration::from_secs(15);

/// A window on its own thread, armed (counters read, tracer open) before `window` returns:
/// traffic sent after it is counted, whatever the scheduling of the test's threads.
struct Window {
    h: std::thread::JoinHandle<HostReport>,
    ctl: WindowControl,
}

fn window(o: HostOptions) -> Window {
    let ctl = WindowControl::default();
    let h = std::thread::spawn({
        let ctl = ctl.clone();
        move || measure_with(&o, &ctl).expect("host measure")
    });
    assert!(ctl.wait_armed(BOUND), "window not armed");
    Window { h, ctl }
}

impl Window {
    /// Ends the window now (the test's traffic is over) and returns its report.
    fn end(self) -> HostReport {
        self.ctl.stop();
        self.join()
    }

    /// Lets the window run its whole duration.
    fn join(self) -> HostReport {
        self.h.join().unwrap()
    }
}

fn counter(r: &HostReport, name: &str) -> i64 {
    r.counters
        .get()
        .unwrap()
        .iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.delta)
}

/// `n` non-blocking connects to 127.0.0.1:port from inside `ns`, with SO_LINGER 0: the
/// caller holds them, and dropping them resets them so that nothing moves after.
fn connects(ns: &str, port: u16, n: usize) -> Vec<socket2::Socket> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter_netns(&ns);
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut socks = Vec::new();
        for _ in 0..n {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_nonblocking(true).unwrap();
            let _ = s.connect(&addr.into());
            s.set_linger(Some(Duration::ZERO)).unwrap();
            socks.push(s);
        }
        socks
    })
    .join()
    .unwrap()
}

#[test]
#[ignore = "needs root"]
fn an_accept_queue_overflow_shows_on_its_listener_only() {
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-ovf");
    let base = 20_000 + (std::process::id() % 5000) as u16;
    let (full_port, ok_port) = (base, base + 7);
    let full = python(Some(&ns), LISTENER, &[&full_port.to_string(), "1", "no"]);
    let ok = python(
        Some(&ns),
        LISTENER,
        &[&ok_port.to_string(), "128", "accept"],
    );
    let (full_pid, ok_pid) = (full.id(), ok.id());
    g.own_child(full);
    g.own_child(ok);
    let target = window(HostOptions {
        pid: Some(full_pid),
        duration: BOUND,
        ..Default::default()
    });
    let control = window(HostOptions {
        pid: Some(ok_pid),
        duration: BOUND,
        ..Default::default()
    });
    // Held 1.5 s (the queue sampled full), then reset, then the windows end.
    let held = (connects(&ns, full_port, 30), connects(&ns, ok_port, 30));
    std::thread::sleep(Duration::from_millis(1500));
    drop(held);
    let (t, c) = (target.end(), control.end());

    let ls = t.listeners.get().unwrap();
    assert_eq!(ls.len(), 1, "only the process's own listener: {ls:?}");
    let l = &ls[0];
    assert!(l.local.ends_with(&format!(":{full_port}")), "{l:?}");
    assert_eq!(l.max, 1, "{l:?}");
    assert!(
        l.full_samples > 0 && l.peak > l.max,
        "queue seen full: {l:?}"
    );
    let drops = l.drops.expect("listener drops") as i64;
    assert!(drops > 0, "{l:?}");
    let overflows = counter(&t, "TcpExt.ListenOverflows");
    assert!(overflows > 0, "ListenOverflows moved: {:?}", t.counters);
    // One overflowing listener in the namespace: its own drops are the namespace's.
    assert_eq!(
        drops,
        counter(&t, "TcpExt.ListenDrops"),
        "{l:?} {:?}",
        t.counters
    );
    // nstat (the peer) reads the same counter: nothing moved after the clients reset.
    let nstat = in_ns(&ns, &["nstat", "-az", "TcpExtListenOverflows"]);
    let after = t
        .counters
        .get()
        .unwrap()
        .iter()
        .find(|c| c.name == "TcpExt.ListenOverflows");
    let peer: i64 = nstat
        .lines()
        .find_map(|l| l.strip_prefix("TcpExtListenOverflows"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("nstat line");
    assert_eq!(after.unwrap().after, peer, "nstat: {nstat}");
    // ss (the peer) sees the same queue and limit.
    let ss = in_ns(&ns, &["ss", "-Hltn", &format!("sport = :{full_port}")]);
    let f: Vec<&str> = ss.split_whitespace().collect();
    assert_eq!(
        (f[1], f[2]),
        (l.current.to_string().as_str(), "1"),
        "ss: {ss}"
    );

    // The control listens in the same namespace and accepts: not blamed.
    let cl = c.listeners.get().unwrap();
    assert_eq!(cl.len(), 1, "{cl:?}");
    assert!(cl[0].local.ends_with(&format!(":{ok_port}")), "{cl:?}");
    assert_eq!((cl[0].full_samples, cl[0].drops), (0, Some(0)), "{cl:?}");
}

/// A v1 `cpu` cgroup made by the test, removed (after its processes) on drop.
struct Cgroup(std::path::PathBuf, Vec<Child>);
impl Cgroup {
    fn new(quota_us: Option<u64>) -> Cgroup {
        let dir = std::path::Path::new("/sys/fs/cgroup/cpu").join(unique_name("lt-host-", 40));
        std::fs::create_dir(&dir).expect("mkdir v1 cpu cgroup");
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
        if let Some(q) = quota_us {
            std::fs::write(dir.join("cpu.cfs_quota_us"), q.to_string()).unwrap();
        }
        Cgroup(dir, Vec::new())
    }
    /// A busy process (bounded to 20 s) inside this cgroup; its pid.
    fn busy(&mut self) -> u32 {
        let c = python(
            None,
            "import time\nprint('ready', flush=True)\nend = time.time() + 20\nwhile time.time() < end: pass",
            &[],
        );
        std::fs::write(self.0.join("cgroup.procs"), c.id().to_string()).unwrap();
        let pid = c.id();
        self.1.push(c);
        pid
    }
}
impl Drop for Cgroup {
    fn drop(&mut self) {
        for c in &mut self.1 {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
#[ignore = "needs root"]
fn a_cpu_quota_throttles_its_own_process_only() {
    let mut quota = Cgroup::new(Some(20_000));
    let mut free = Cgroup::new(None);
    let (busy, other) = (quota.busy(), free.busy());
    let d = Duration::from_secs(2);
    let target = window(HostOptions {
        pid: Some(busy),
        duration: d,
        ..Default::default()
    });
    let control = window(HostOptions {
        pid: Some(other),
        duration: d,
        ..Default::default()
    });
    let (t, c) = (target.join(), control.join());

    let cg = t.cgroup.get().unwrap();
    assert_eq!(
        (cg.version, cg.quota_us, cg.period_us),
        (1, Some(20_000), Some(100_000))
    );
    assert!(
        cg.path
            .ends_with(quota.0.file_name().unwrap().to_str().unwrap()),
        "{cg:?}"
    );
    assert!(cg.periods >= 10 && cg.throttled_share > 0.5, "{cg:?}");
    assert!(cg.throttled_us > 0, "{cg:?}");
    // The kernel held it to its quota: at most 20 % of one CPU over the window (its
    // threads' own run time; less on a busy machine). The process's cpuacct group is the
    // root here, whose usage is not this group's.
    assert_eq!(cg.usage_us, None, "{cg:?}");
    let th = t.threads.get().unwrap();
    let share = th.run_us as f64 / t.window_us as f64;
    assert!(
        th.run_us > 0 && share < 0.3,
        "ran {share} of the window: {th:?}"
    );

    let cc = c.cgroup.get().unwrap();
    assert_eq!(
        (cc.quota_us, cc.throttled_periods, cc.throttled_us),
        (None, 0, 0),
        "{cc:?}"
    );
}

/// `tc -s qdisc show dev DEV` inside `ns`: (sent packets, dropped) of its first qdisc.
fn tc_counts(ns: &str, dev: &str) -> (u64, u64) {
    let out = in_ns(ns, &["tc", "-s", "qdisc", "show", "dev", dev]);
    let words: Vec<&str> = out
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == ',' || c == '(' || c == ')'))
        .collect();
    let after = |key: &str| -> u64 {
        let i = words
            .iter()
            .position(|w| *w == key)
            .unwrap_or_else(|| panic!("{key} in {out}"));
        words[i + 1].parse().unwrap()
    };
    let pkt = words.iter().position(|w| *w == "pkt").expect("pkt");
    (words[pkt - 1].parse().unwrap(), after("dropped"))
}

#[test]
#[ignore = "needs root"]
fn a_dropping_tbf_qdisc_is_counted_as_tc_counts_it() {
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-tbf");
    // Two veth pairs inside the namespace, each with a tbf on its first end and a static
    // neighbour, so that datagrams to .2 leave through the qdisc (no ARP, no loopback).
    // No IPv6 link chatter (router solicitations): only the test's datagrams leave.
    in_ns(
        &ns,
        &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
    );
    let net = format!("10.{}", 200 + std::process::id() % 40);
    let third = (lagtrace_testkit::unique() % 100) as u8 * 2;
    for (i, dev) in ["lthd0", "lthd1"].into_iter().enumerate() {
        let peer = format!("lthp{i}");
        let sub = format!("{net}.{}", third + i as u8);
        in_ns(
            &ns,
            &[
                "ip", "link", "add", dev, "type", "veth", "peer", "name", &peer,
            ],
        );
        in_ns(
            &ns,
            &["ip", "addr", "add", &format!("{sub}.1/24"), "dev", dev],
        );
        in_ns(&ns, &["ip", "link", "set", dev, "up"]);
        in_ns(&ns, &["ip", "link", "set", &peer, "up"]);
        let neigh = format!("{sub}.2");
        in_ns(
            &ns,
            &[
                "ip",
                "neigh",
                "add",
                &neigh,
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                dev,
                "nud",
                "permanent",
            ],
        );
        in_ns(
            &ns,
            &[
                "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "1mbit", "burst", "5kb",
                "limit", "5kb",
            ],
        );
    }
    let target = window(HostOptions {
        netns: Some(ns.clone()),
        duration: BOUND,
        ..Default::default()
    });
    let dst = format!("{net}.{third}.2:9");
    let sender = std::thread::spawn({
        let ns = ns.clone();
        move || {
            enter_netns(&ns);
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..400 {
                let _ = s.send_to(&[0u8; 1200], &dst);
            }
        }
    });
    sender.join().unwrap();
    // tbf releases what it queued within its 5 kB at 1 Mbit/s (40 ms): let it drain.
    std::thread::sleep(Duration::from_millis(200));
    let r = target.end();
    let qs = r.qdiscs.get().unwrap();
    let q = qs.iter().find(|q| q.dev == "lthd0").expect("lthd0 qdisc");
    assert_eq!(
        (q.kind.as_str(), q.parent.as_str()),
        ("tbf", "root"),
        "{q:?}"
    );
    assert!(
        q.drops > 100,
        "tbf with a 5 kB limit drops most of 480 kB: {q:?}"
    );
    let (sent, dropped) = tc_counts(&ns, "lthd0");
    assert_eq!(
        (q.packets, q.drops, q.drops_total),
        (sent, dropped, dropped),
        "tc -s qdisc"
    );
    assert!(q.overlimits > 0, "{q:?}");
    // The tracepoint saw them as qdisc drops on that device, as many as tc counts.
    let d = r.drops.get().unwrap_or_else(|| panic!("{:?}", r.drops));
    assert_eq!(d.scope, "namespace", "{d:?}");
    let qdisc_drops = |reasons: &[lagtrace_model::host::DropReasonCount]| -> u64 {
        reasons
            .iter()
            .filter(|c| c.reason.starts_with("QDISC_"))
            .map(|c| c.count)
            .sum()
    };
    let dev = d
        .devices
        .iter()
        .find(|x| x.device.as_deref() == Some("lthd0"));
    assert_eq!(dev.map_or(0, |x| qdisc_drops(&x.reasons)), dropped, "{d:?}");
    assert_eq!(qdisc_drops(&d.reasons), dropped, "no other device: {d:?}");
    assert!(
        !d.devices
            .iter()
            .any(|x| x.device.as_deref() == Some("lthd1")),
        "{d:?}"
    );
    // The other device carried nothing: not blamed.
    let other = qs.iter().find(|q| q.dev == "lthd1").expect("lthd1 qdisc");
    assert_eq!((other.drops, other.packets), (0, 0), "{other:?}");
    assert_eq!(tc_counts(&ns, "lthd1"), (0, 0));
}

/// The `counter packets N` of the first counter in `nft list table FAMILY NAME` inside `ns`.
fn nft_counter(ns: &str, family: &str, table: &str) -> u64 {
    let out = in_ns(ns, &["nft", "list", "table", family, table]);
    let w: Vec<&str> = out.split_whitespace().collect();
    let i = w.iter().position(|x| *x == "packets").expect("counter");
    w[i + 1].parse().unwrap()
}

#[test]
#[ignore = "needs root"]
fn netfilter_drops_are_counted_by_reason_as_the_rule_counts_them() {
    let mut g = NetGuard::new();
    // The watched namespace and another one dropping the same way at the same time.
    let (ns, other) = (g.add_ns("host-nft"), g.add_ns("host-nfb"));
    let base = 30_000 + (std::process::id() % 5000) as u16;
    let (dropped, open) = (base, base + 3);
    for n in [&ns, &other] {
        lagtrace_testkit::net::nft_load(
            Some(n),
            &format!(
                "table inet lthost {{\n chain out {{\n type filter hook output priority 0;\n tcp dport {dropped} counter drop\n }}\n}}\n"
            ),
        );
    }
    let w = window(HostOptions {
        netns: Some(ns.clone()),
        duration: BOUND,
        ..Default::default()
    });
    // SYNs to `dropped` die in the output hook and are retransmitted after 1 s; SYNs to
    // `open` are answered by a RST (no listener): not a netfilter drop. The window ends
    // once both rules have counted both rounds and the sockets are reset.
    let held = (
        connects(&ns, dropped, 5),
        connects(&ns, open, 5),
        connects(&other, dropped, 7),
    );
    let t0 = std::time::Instant::now();
    while nft_counter(&ns, "inet", "lthost") < 10 || nft_counter(&other, "inet", "lthost") < 14 {
        assert!(t0.elapsed() < BOUND, "the SYNs were not retransmitted");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    let r = w.end();
    let rule = nft_counter(&ns, "inet", "lthost");
    assert!(rule >= 10, "5 SYNs and their retransmits: {rule}");
    let d = r.drops.get().unwrap_or_else(|| panic!("{:?}", r.drops));
    assert_eq!((d.scope.as_str(), d.lost), ("namespace", 0), "{d:?}");
    let nf = d.reasons.iter().find(|c| c.reason == "NETFILTER_DROP");
    // Exactly the watched namespace's rule: the other namespace's 14 are not counted.
    assert_eq!(nf.map_or(0, |c| c.count), rule, "{d:?}");
    // All on the route's device (loopback): dropped before it was set on the packet.
    let lo = d.devices.iter().find(|x| x.device.as_deref() == Some("lo"));
    let on_lo = lo.and_then(|x| x.reasons.iter().find(|c| c.reason == "NETFILTER_DROP"));
    assert_eq!(on_lo.map_or(0, |c| c.count), rule, "{d:?}");
    // The same drops placed in time, each once: the SYNs, then their retransmissions
    // ~1 s later (the SYN timer), in intervals that far apart.
    let times = d.times_of(&["NETFILTER_DROP"]);
    assert_eq!(times.iter().map(|t| t.2).sum::<u64>(), rule, "{times:?}");
    let (first, last) = (times[0], times[times.len() - 1]);
    assert!(times.len() >= 2 && last.1 - first.0 >= 800_000, "{times:?}");
    assert!(times.iter().all(|t| t.0 < t.1), "{times:?}");
}

#[test]
#[ignore = "needs root"]
fn a_syn_flood_with_syncookies_off_fills_the_syn_queue_of_its_listener() {
    let mut g = NetGuard::new();
    let ns = g.add_ns("host-syn");
    in_ns(&ns, &["sysctl", "-qw", "net.ipv4.tcp_syncookies=0"]);
    // The listeners' address on a device whose other end answers nothing: SYN-ACKs to the
    // spoofed sources go unanswered, so their requests stay in the SYN queue.
    let net = format!(
        "10.{}.{}",
        200 + std::process::id() % 40,
        lagtrace_testkit::unique() % 200
    );
    in_ns(
        &ns,
        &[
            "ip", "link", "add", "lthd0", "type", "veth", "peer", "name", "lthp0",
        ],
    );
    in_ns(
        &ns,
        &["ip", "addr", "add", &format!("{net}.1/24"), "dev", "lthd0"],
    );
    in_ns(&ns, &["ip", "link", "set", "lthd0", "up"]);
    in_ns(&ns, &["ip", "link", "set", "lthp0", "up"]);
    let spoofed = format!("{net}.5");
    in_ns(
        &ns,
        &[
            "ip",
            "neigh",
            "add",
            &spoofed,
            "lladdr",
            "02:00:00:00:00:05",
            "dev",
            "lthd0",
            "nud",
            "permanent",
        ],
    );
    let base = 26_000 + (std::process::id() % 5000) as u16;
    let (flooded, quiet) = (base, base + 5);
    let code = LISTENER.replace("\"127.0.0.1\"", &format!("\"{net}.1\""));
    let a = python(Some(&ns), &code, &[&flooded.to_string(), "8", "accept"]);
    let b = python(Some(&ns), &code, &[&quiet.to_string(), "8", "accept"]);
    let (a_pid, b_pid) = (a.id(), b.id());
    g.own_child(a);
    g.own_child(b);
    let target = window(HostOptions {
        pid: Some(a_pid),
        duration: BOUND,
        ..Default::default()
    });
    let control = window(HostOptions {
        pid: Some(b_pid),
        duration: BOUND,
        ..Default::default()
    });
    // 200 SYNs from one spoofed address in the listener's subnet (hping3 moves the source
    // port each time), 1 ms apart (bounded). The SYN-ACKs leave through lthd0 to no one.
    in_ns(
        &ns,
        &[
            "hping3",
            "-q",
            "-S",
            "-p",
            &flooded.to_string(),
            "-c",
            "200",
            "-i",
            "u1000",
            "-a",
            &spoofed,
            &format!("{net}.1"),
        ],
    );
    // The listener's queue sampled (every 100 ms) after the last SYN.
    std::thread::sleep(Duration::from_millis(300));
    let (t, c) = (target.end(), control.end());
    let qfull = counter(&t, "TcpExt.TCPReqQFullDrop");
    assert!(qfull > 0, "SYN queue full, no syncookies: {:?}", t.counters);
    let ls = t.listeners.get().unwrap();
    assert_eq!(ls.len(), 1, "{ls:?}");
    let drops = ls[0].drops.expect("listener drops") as i64;
    assert!(drops >= qfull, "the flooded listener's own drops: {ls:?}");
    // Its own drops are the namespace's listen drops (its sk_drops also counts the odd
    // packet dropped on the listener for another reason, e.g. a RST to an embryonic one).
    let listen_drops = counter(&t, "TcpExt.ListenDrops");
    assert!(
        (drops - listen_drops).abs() <= 2 + listen_drops / 100,
        "{ls:?} {:?}",
        t.counters
    );
    let cl = c.listeners.get().unwrap();
    assert_eq!(
        (cl.len(), cl[0].drops),
        (1, Some(0)),
        "the quiet listener: {cl:?}"
    );
}

/// Clears `caps` from the calling thread's effective set (capabilities are per thread).
fn drop_caps(caps: &[u32]) {
    // struct __user_cap_header_struct { version, pid } and two __user_cap_data_struct
    // { effective, permitted, inheritable } (version 3: 64 capabilities).
    let mut hdr = [0x2008_0522u32, 0];
    let mut data = [0u32; 6];
    // SAFETY: capget/capset with a version-3 header and room for two data structs.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()),
            0
        );
        for &c in caps {
            data[(c / 32) as usize * 3] &= !(1 << (c % 32));
        }
        assert_eq!(
            libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_ptr()),
            0
        );
    }
}

#[test]
#[ignore = "needs root"]
fn without_cap_bpf_drops_fall_back_to_machine_wide_and_say_why() {
    const SYS_ADMIN: u32 = 21;
    const PERFMON: u32 = 38;
    const BPF: u32 = 39;
    let run = |caps: &'static [u32], machine: bool| {
        std::thread::spawn(move || {
            drop_caps(caps);
            measure_with(
                &HostOptions {
                    duration: Duration::from_millis(200),
                    drops_machine: machine,
                    ..Default::default()
                },
                &WindowControl::default(),
            )
            .expect("host measure")
            .drops
        })
        .join()
        .unwrap()
    };
    // CAP_PERFMON kept: the machine-wide tracepoint runs, and says why not per namespace.
    let l = run(&[SYS_ADMIN, BPF], true);
    let d = l.get().unwrap_or_else(|| panic!("{l:?}"));
    assert_eq!(d.scope, "machine", "{d:?}");
    let why = d.scope_reason.as_deref().unwrap_or("");
    assert!(
        why.contains("CAP_BPF") && why.contains("CAP_PERFMON"),
        "{why}"
    );
    // Not accepted machine-wide (diagnose): unavailable, naming the privilege.
    let l = run(&[SYS_ADMIN, BPF], false);
    assert_eq!(
        l.status,
        lagtrace_model::diagnosis::evidence::LayerStatus::Unavailable,
        "{l:?}"
    );
    assert!(
        l.reason.as_deref().unwrap_or("").contains("CAP_BPF"),
        "{l:?}"
    );
    // Neither: unavailable, naming both.
    let l = run(&[SYS_ADMIN, BPF, PERFMON], true);
    assert!(l.get().is_none(), "{l:?}");
    let why = l.reason.as_deref().unwrap_or("");
    assert!(
        why.contains("CAP_BPF") && why.contains("CAP_PERFMON"),
        "{why}"
    );
}

/// Computes until `until`: the function the on-CPU profile must name.
#[inline(never)]
fn lagtrace_test_spin(until: std::time::Instant) -> u64 {
    let mut x = 1u64;
    while std::time::Instant::now() < until {
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
        }
        x = std::hint::black_box(x);
    }
    x
}

/// The on-CPU profile of this test process while one of its threads computes in a named
/// function: that function (its ELF symbol, this binary's file) holds most of the samples,
/// and its samples agree with the thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`, the
/// peer). Negative control: another process busy the whole window is never in the profile.
#[test]
#[ignore = "needs root"]
fn the_on_cpu_profile_names_the_watched_process_function_and_nothing_of_another() {
    let mut g = NetGuard::new();
    let busy = python(
        None,
        "import time\nprint('ready', flush=True)\nend = time.time() + 20\nwhile time.time() < end:\n    pass\n",
        &[],
    );
    g.own_child(busy);
    let w = window(HostOptions {
        pid: Some(std::process::id()),
        duration: Duration::from_secs(10),
        offcpu: false,
        softirq: false,
        drops: false,
        ..Default::default()
    });
    let spin = std::thread::spawn(|| {
        let cpu0 = lagtrace_host::thread_cpu_us();
        lagtrace_test_spin(std::time::Instant::now() + Duration::from_millis(1500));
        lagtrace_host::thread_cpu_us() - cpu0
    });
    let spin_us = spin.join().unwrap();
    let r = w.end();
    let p = r.oncpu.get().unwrap_or_else(|| panic!("{:?}", r.oncpu));
    let f = p
        .functions
        .iter()
        .find(|f| {
            f.function
                .as_deref()
                .is_some_and(|n| n.contains("lagtrace_test_spin"))
        })
        .unwrap_or_else(|| panic!("the spinning function is not named: {p:#?}"));
    let exe = std::env::current_exe().unwrap();
    assert_eq!(
        f.module,
        exe.file_name().unwrap().to_string_lossy(),
        "{p:#?}"
    );
    // Other tests of this binary run beside it (their windows' threads): most, not all.
    assert!(f.share >= 0.3, "{p:#?}");
    let sampled_us = f.samples * 1_000_000 / p.hz;
    assert!(
        sampled_us as f64 >= 0.7 * spin_us as f64 && sampled_us as f64 <= 1.3 * spin_us as f64,
        "samples say {sampled_us} us on a CPU, the thread's clock {spin_us} us: {p:#?}"
    );
    assert!(
        !p.modules.iter().any(|m| m.module.starts_with("python")),
        "another process's samples: {p:#?}"
    );
    assert!(
        p.folded
            .iter()
            .any(|s| s.stack.contains("lagtrace_test_spin")),
        "{p:#?}"
    );
    assert!(p.missed * 100 <= p.samples, "{p:#?}");
}
