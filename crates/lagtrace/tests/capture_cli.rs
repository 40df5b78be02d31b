//! `lagtrace capture` end to end: real libpcap on a veth into a namespace this test makes,
//! files checked with tshark. Needs root.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lagtrace_testkit::ns_lab::NsLab;
use lagtrace_testkit::tshark_fields_first as tshark_fields;

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

/// A running `lagtrace capture`; killed (it is our own child) if the test panics.
struct Cap {
    child: Child,
    err: BufReader<ChildStderr>,
    head: String,
}

struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Cap {
    /// Starts the capture and waits until it says it is listening.
    fn start(args: &[&str]) -> Cap {
        let mut child = Command::new(BIN)
            .arg("capture")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut head = String::new();
        err.read_line(&mut head).unwrap();
        let cap = Cap { child, err, head };
        assert!(
            cap.head.contains("listening on"),
            "did not start: {}",
            cap.head
        );
        cap
    }

    fn finished(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Waits (at most `limit`) for the capture to exit by itself.
    fn wait(mut self, limit: Duration) -> Done {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t0.elapsed() < limit,
                "capture still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = t0.elapsed();
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let mut stderr = std::mem::take(&mut self.head);
        self.err.read_to_string(&mut stderr).unwrap();
        Done {
            status,
            stdout,
            stderr,
            took,
        }
    }
}

impl Drop for Cap {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The number N in a line "N <what>" of the final counters.
fn counter(stderr: &str, what: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_suffix(what))
        .unwrap_or_else(|| panic!("no '{what}' line in: {stderr}"))
        .trim()
        .parse()
        .unwrap()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("capture")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs root"]
fn count_writes_exactly_count_packets_as_pcap_and_pcapng() {
    let lab = NsLab::up("clic", 2000);
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("a.pcap");
    let ng = dir.path().join("a.pcapng");
    let filter = format!("tcp port {}", lab.port);
    let p = pcap.to_str().unwrap();
    let n = ng.to_str().unwrap();
    let mut a = Cap::start(&["-i", &lab.host_iface, "-c", "12", "-w", p, &filter]);
    let mut b = Cap::start(&[
        "-i",
        &lab.host_iface,
        "-c",
        "12",
        "--pcapng",
        "-w",
        n,
        "-f",
        &filter,
    ]);
    let t0 = Instant::now();
    while !(a.finished() && b.finished()) && t0.elapsed() < Duration::from_secs(20) {
        lab.exchange();
    }
    for (cap, file) in [(a, &pcap), (b, &ng)] {
        let d = cap.wait(Duration::from_secs(5));
        assert!(d.status.success(), "{}", d.stderr);
        assert_eq!(counter(&d.stderr, " packets captured"), 12, "{}", d.stderr);
        assert!(counter(&d.stderr, " packets received by filter") >= 12);
        counter(&d.stderr, " packets dropped by kernel");
        assert_eq!(tshark_fields(file, None, &["frame.number"]).len(), 12);
    }
    // Both saw the same packets (both were listening before the first one). Times are
    // not compared: each packet socket stamps received packets itself, so two captures
    // differ by a few µs on the incoming direction.
    let f = &["frame.len", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw"];
    assert_eq!(tshark_fields(&pcap, None, f), tshark_fields(&ng, None, f));
    let kinds = Command::new("capinfos")
        .arg("-t")
        .arg(&pcap)
        .arg(&ng)
        .output()
        .unwrap();
    let kinds = String::from_utf8_lossy(&kinds.stdout);
    assert!(
        kinds.contains("pcapng") && kinds.contains("nanosecond pcap"),
        "{kinds}"
    );
}

#[test]
#[ignore = "needs root"]
fn duration_stops_by_itself() {
    let lab = NsLab::up("clid", 10);
    let cap = Cap::start(&["-i", &lab.host_iface, "--duration", "800ms", "tcp port 9"]);
    let d = cap.wait(Duration::from_secs(6));
    assert!(d.status.success(), "{}", d.stderr);
    assert!(d.took < Duration::from_secs(6));
    assert_eq!(counter(&d.stderr, " packets captured"), 0);
}

#[test]
#[ignore = "needs root"]
fn netns_capture_prints_the_packets_like_tcpdump() {
    let lab = NsLab::up("clin", 100);
    let filter = format!("tcp port {}", lab.port);
    let cap = Cap::start(&["--netns", &lab.ns, "-i", &lab.ns_iface, "-c", "3", &filter]);
    lab.exchange();
    let d = cap.wait(Duration::from_secs(10));
    assert!(d.status.success(), "{}", d.stderr);
    let lines: Vec<&str> = d.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", d.stdout);
    let syn_to = format!("> {}.{}: Flags [S], seq ", lab.server, lab.port);
    assert!(lines[0].contains(&syn_to), "{}", lines[0]);
    assert!(
        lines[0].starts_with(|c: char| c.is_ascii_digit()),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("Flags [S.]") && lines[1].contains(", ack "),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("Flags [.]") && lines[2].ends_with("length 0"),
        "{}",
        lines[2]
    );
    // Outside the namespace the interface does not exist.
    let (code, _, err) = run(&["-i", &lab.ns_iface, "-c", "1"]);
    assert_eq!(code, 2);
    assert!(err.contains("no interface named"), "{err}");
}

#[test]
#[ignore = "needs root"]
fn ctrl_c_stops_cleanly_with_the_counters_and_a_complete_file() {
    let lab = NsLab::up("clis", 1000);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.pcap");
    let filter = format!("tcp port {}", lab.port);
    let cap = Cap::start(&["-i", &lab.host_iface, "-w", f.to_str().unwrap(), &filter]);
    lab.exchange();
    lab.exchange();
    // SIGINT to our own child, as Ctrl-C would.
    let pid = cap.child.id() as libc::pid_t;
    // SAFETY: signalling a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let d = cap.wait(Duration::from_secs(5));
    // An interrupted run exits 130, like every command (README, "Exit status").
    assert_eq!(d.status.code(), Some(130), "{}", d.stderr);
    let n = counter(&d.stderr, " packets captured");
    assert!(n >= 2 * 9, "{}", d.stderr);
    assert_eq!(tshark_fields(&f, None, &["frame.number"]).len() as u64, n);
}

#[test]
#[ignore = "needs root"]
fn target_picks_the_interface_of_its_route() {
    let lab = NsLab::up("clit", 10);
    let server = lab.server.to_string();
    let cap = Cap::start(&["--target", &server, "--duration", "100ms"]);
    let d = cap.wait(Duration::from_secs(5));
    assert!(d.status.success(), "{}", d.stderr);
    assert!(
        d.stderr
            .contains(&format!("listening on {},", lab.host_iface)),
        "{}",
        d.stderr
    );
}

#[test]
#[ignore = "needs root"]
fn bad_input_is_a_one_line_error_with_exit_2() {
    let lab = NsLab::up("clie", 10);
    for (args, want) in [
        (
            vec!["-i", lab.host_iface.as_str(), "tcp", "port"],
            "bad filter \"tcp port\"",
        ),
        (
            vec!["-i", "lagtrace-nope0", "-c", "1"],
            "no interface named lagtrace-nope0",
        ),
        (
            vec!["--netns", "lagtrace-no-such-ns", "-c", "1"],
            "lagtrace-no-such-ns",
        ),
        (vec!["-i", "lo", "--duration", "5x"], "invalid duration"),
        (vec!["-i", "lo", "--pcapng"], "--pcapng needs -w"),
    ] {
        let (code, out, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
        if want != "invalid duration" {
            // (clap's own usage errors span a few lines; ours are one line.)
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("lagtrace: error: "), "{err}");
        }
    }
}

#[test]
fn without_cap_net_raw_it_names_the_capability() {
    if Command::new("setpriv").arg("--version").output().is_err() {
        panic!("setpriv (util-linux) is needed to drop CAP_NET_RAW for this test");
    }
    let out = Command::new("setpriv")
        .args(["--bounding-set=-net_raw", "--"])
        .arg(BIN)
        .args(["capture", "-i", "lo", "-c", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs CAP_NET_RAW"), "{err}");
    assert!(err.contains("lagtrace analyze"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
#[ignore = "needs root"]
fn any_interface_uses_linux_cooked_headers_and_still_prints_tcp() {
    let lab = NsLab::up("clia", 100);
    let filter = format!("tcp port {} and host {}", lab.port, lab.server);
    let cap = Cap::start(&["-i", "any", "-c", "3", &filter]);
    assert!(cap.head.contains("LINUX_SLL"), "{}", cap.head);
    lab.exchange();
    let d = cap.wait(Duration::from_secs(10));
    assert!(d.status.success(), "{}", d.stderr);
    let lines: Vec<&str> = d.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", d.stdout);
    let syn = format!("IP {}.", lab.client);
    assert!(lines[0].contains(&syn), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("> {}.{}: Flags [S], seq ", lab.server, lab.port)),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("Flags [S.]"), "{}", lines[1]);
}

#[test]
#[ignore = "needs root"]
fn printed_lines_match_tcpdump_reading_the_same_packets() {
    let lab = NsLab::up("clip", 3000);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.pcap");
    let filter = format!("tcp port {}", lab.port);
    let mut printer = Cap::start(&["-i", &lab.host_iface, "-c", "20", &filter]);
    let mut writer = Cap::start(&[
        "-i",
        &lab.host_iface,
        "-c",
        "20",
        "-w",
        f.to_str().unwrap(),
        &filter,
    ]);
    let t0 = Instant::now();
    while !(printer.finished() && writer.finished()) && t0.elapsed() < Duration::from_secs(20) {
        lab.exchange();
    }
    let ours = printer.wait(Duration::from_secs(5));
    assert!(writer.wait(Duration::from_secs(5)).status.success());
    let tcpdump = Command::new("tcpdump")
        .args(["-nn", "-S", "-r"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(tcpdump.status.success());
    // Drop the time (each capture socket stamps incoming packets itself) and tcpdump's
    // TCP options, which we do not print.
    let norm = |l: &str| -> String {
        let l = l.split_once(' ').map(|x| x.1).unwrap_or(l);
        match (l.find(", options ["), l.find("], length")) {
            (Some(a), Some(b)) if b > a => format!("{}{}", &l[..a], &l[b + 1..]),
            _ => l.to_string(),
        }
    };
    let theirs: Vec<String> = String::from_utf8_lossy(&tcpdump.stdout)
        .lines()
        .map(norm)
        .collect();
    let ours: Vec<String> = ours.stdout.lines().map(norm).collect();
    assert_eq!(ours.len(), 20);
    assert_eq!(ours, theirs);
}

#[test]
#[ignore = "needs root"]
fn netns_without_cap_sys_admin_names_the_capability() {
    let lab = NsLab::up("clis2", 10);
    let out = Command::new("setpriv")
        .args(["--bounding-set=-sys_admin", "--"])
        .arg(BIN)
        .args([
            "capture",
            "--netns",
            &lab.ns,
            "-i",
            &lab.ns_iface,
            "-c",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs CAP_SYS_ADMIN"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A veth pair this test owns (named by its first end); deleted on drop (even on panic) if
/// still there.
struct Dummy(String);

impl Drop for Dummy {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
#[ignore = "needs root"]
fn interface_that_disappears_mid_capture_ends_with_counters_and_exit_2() {
    let name = format!("ltgone{}", std::process::id() % 100_000);
    let ok = Command::new("ip")
        .args([
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{name}p"),
        ])
        .status()
        .unwrap()
        .success();
    assert!(ok, "cannot create veth pair {name}");
    let dummy = Dummy(name.clone());
    assert!(
        Command::new("ip")
            .args(["link", "set", &name, "up"])
            .status()
            .unwrap()
            .success()
    );
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("gone.pcap");
    let mut cap = Cap::start(&["-i", &name, "-w", f.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!cap.finished(), "capture ended before the interface went");
    drop(dummy);
    let d = cap.wait(Duration::from_secs(10));
    assert_eq!(d.status.code(), Some(2), "{}", d.stderr);
    assert!(!d.stderr.contains("panicked"), "{}", d.stderr);
    let n = counter(&d.stderr, " packets captured");
    let errors: Vec<&str> = d
        .stderr
        .lines()
        .filter(|l| l.starts_with("lagtrace: error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{}", d.stderr);
    assert!(errors[0].contains(&name), "{}", d.stderr);
    // The file is complete and readable with what was captured before.
    assert_eq!(tshark_fields(&f, None, &["frame.number"]).len() as u64, n);
}
