//! `diagnose --report` on the real reference case (lab nginx, needs root), opened in headless
//! Chromium: the page renders offline, both charts are drawn from the measured data (the
//! ladder of a captured connection with its stall), and the browser logs no error.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lagtrace_lab::{Lab, LabOptions};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn chromium(args: &[String]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,2600",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium (apt-get install chromium; .ci/setup does)");
    // Drain both pipes while waiting: a DOM larger than a pipe's buffer (64 KiB) would
    // otherwise block chromium's write until the time limit.
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.success(), "{err}");
    (out, err)
}

#[test]
#[ignore = "needs root"]
fn report_of_the_reference_case_renders_with_its_ladder_and_chart() {
    let lab = Lab::up(&LabOptions::new(&format!("dgrep{}", std::process::id()))).expect("lab");
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let turn = lagtrace_testkit::measuring();
    let out = Command::new(BIN)
        .args([
            "diagnose",
            &lab.latency_url(),
            "-q",
            "--json",
            "-d",
            "4s",
            "--report",
        ])
        .arg(&html)
        .env("XDG_STATE_HOME", dir.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(turn);
    drop(lab);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("<script") && !page.contains("<link") && !page.contains("src="));
    let url = format!("file://{}", html.display());
    let (dom, log) = chromium(&["--dump-dom".into(), url.clone()]);
    for bad in ["Uncaught", "CONSOLE(", "net::ERR_"] {
        assert!(!log.contains(bad), "{bad}: {log}");
    }
    assert!(dom.contains("nagle-delayed-ack"));
    assert_eq!(dom.matches("class=\"series\"").count(), 2, "c=1 and c=32");
    assert!(dom.contains("id=\"flow-ladder\""));
    // The captured connection: arrows for its packets, the stall band and its label.
    assert!(dom.matches("class=\"pkt\"").count() >= 5);
    assert!(dom.contains("class=\"stall\""));
    // Its caption: the duration, then the cause wrapped between the lifelines.
    assert!(dom.contains("ms stall</text>"));
    assert!(dom.contains(">Nagle holds the segment until the client"));
    assert!(dom.contains("GET /"));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).expect("diagnose --json");
    handshake_and_header(&dom, &d);
    tail_charts(&dom, &d);
    // Every label of the page (ladder, charts) has room of its own, as Chromium lays it out.
    let checked = dir.path().join("checked.html");
    std::fs::write(&checked, lagtrace_testkit::browser::with_label_check(&page)).unwrap();
    let (cdom, clog) = chromium(&["--dump-dom".into(), format!("file://{}", checked.display())]);
    let (n, bad) = lagtrace_testkit::browser::label_check_result(&cdom)
        .unwrap_or_else(|| panic!("the label check did not run: {clog}"));
    assert!(n >= 20, "only {n} labels measured");
    assert!(bad.is_empty(), "labels collide:\n{}", bad.join("\n"));
    // The screenshot is a drawn page, not a blank one.
    let shot = dir.path().join("shot.png");
    chromium(&[format!("--screenshot={}", shot.display()), url]);
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    assert!(
        png.len() > 50_000,
        "screenshot of {} bytes: blank?",
        png.len()
    );
}

/// The per-request timelines and the tail's decomposition in the rendered page agree with
/// the diagnosis's JSON: one mark per kept record of each run, one colour per connection
/// (of the twelve), and the tail's parts as bars when the verdict has a tail.
/// The ladder opens with the captured connection's handshake, and the header names the run's
/// date and the version.
fn handshake_and_header(dom: &str, d: &serde_json::Value) {
    let f = &d["layers"]["packets"]["data"]["example_flow"];
    let flags = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|p| p["flags"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut opening = flags(&f["handshake"]);
    if opening.is_empty() {
        opening = flags(&f["packets"]).into_iter().take(3).collect();
    }
    // As captured: the kept stream may start at the SYN-ACK (seen once: the client's
    // SYN is not in the capture), so the ladder opens with what the capture holds.
    assert!(
        opening.first().is_some_and(|f| f.starts_with("SYN")),
        "{f:#}"
    );
    assert!(opening.iter().any(|f| f == "SYN,ACK"), "{f:#}");
    assert!(dom.contains("SYN,ACK"));
    let started = d["started_unix_us"].as_u64().expect("started_unix_us");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        started < now && now - started < 600_000_000,
        "{started} vs {now}"
    );
    assert!(
        dom.contains("<div class=\"sub\" id=\"run\">run 20"),
        "run date in the header"
    );
    assert!(dom.contains(&format!("· lagtrace {}</div>", env!("CARGO_PKG_VERSION"))));
}

fn tail_charts(dom: &str, d: &serde_json::Value) {
    let mut timelines = 0;
    for run in ["c1", "cn"] {
        let r = &d["layers"]["app"]["data"][run];
        let Some(recs) = r["records"]["records"].as_array() else {
            continue;
        };
        let id = format!("id=\"timeline-c{}\"", r["concurrency"]);
        let at = dom.find(&id).unwrap_or_else(|| panic!("{id} missing"));
        let svg = &dom[at..at + dom[at..].find("</svg>").unwrap()];
        assert_eq!(svg.matches("class=\"rec ").count(), recs.len(), "{id}");
        let conns: std::collections::BTreeSet<u64> =
            recs.iter().map(|x| x["conn"].as_u64().unwrap()).collect();
        let colours: std::collections::BTreeSet<&str> = svg
            .split("class=\"rec ")
            .skip(1)
            .filter_map(|m| m.split("stroke=\"").nth(1))
            .filter_map(|m| m.split('"').next())
            .collect();
        assert_eq!(colours.len(), conns.len().min(12), "{id}: {colours:?}");
        let slow = recs.iter().filter(|x| x["slow"] == true).count();
        assert!(dom.contains(&format!("slowest {slow} kept exactly + sample of")));
        timelines += 1;
    }
    assert_eq!(timelines, 2, "c=1 and c=32 kept records");
    slowest_tables(dom, d);
    match d["verdict"]["tail"]["parts"].as_array() {
        Some(parts) => {
            let at = dom.find("id=\"tail-decomposition\"").expect("tail chart");
            let svg = &dom[at..at + dom[at..].find("</svg>").unwrap()];
            assert_eq!(svg.matches("class=\"part\"").count(), parts.len() + 2);
            for p in parts {
                assert!(svg.contains(p["cause"].as_str().unwrap()));
            }
        }
        None => assert!(!dom.contains("tail-decomposition")),
    }
}

/// Each run whose records were joined with the packets (the captured one) has its table of the slowest
/// requests: one row per kept record up to 10, the slowest first with its wait and its
/// server part as the JSON has them.
fn slowest_tables(dom: &str, d: &serde_json::Value) {
    use lagtrace_model::Micros;
    let joins = d["layers"]["packets"]["data"]["joins"].as_array();
    let mut tables = 0;
    for run in ["c1", "cn"] {
        let r = &d["layers"]["app"]["data"][run];
        let (Some(recs), Some(j)) = (
            r["records"]["records"].as_array(),
            joins.and_then(|js| js.iter().find(|j| j["concurrency"] == r["concurrency"])),
        ) else {
            continue;
        };
        let id = format!("id=\"slowest-c{}\"", r["concurrency"]);
        let at = dom.find(&id).unwrap_or_else(|| panic!("{id} missing"));
        let table = &dom[at..at + dom[at..].find("</table>").unwrap()];
        assert_eq!(
            table.matches("<tr class=\"req\">").count(),
            recs.len().min(10),
            "{id}"
        );
        let wait = |i: usize| recs[i]["wait_us"].as_u64().unwrap();
        let top = (0..recs.len()).map(wait).max().unwrap();
        let i = (0..recs.len()).find(|&i| wait(i) == top).unwrap();
        let row = &table[table.find("<tr class=\"req\">").unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(
            row.contains(&format!("<td class=\"wait\">{}</td>", Micros(top))),
            "{row}"
        );
        // A request no transaction matched shows why, and no part.
        let matched = j["requests"][i]["stream"].is_u64();
        assert_eq!(row.contains("not matched: "), !matched, "{row}");
        let server = j["requests"][i]["server_us"].as_u64().unwrap();
        let cell = if server == 0 || !matched {
            String::new()
        } else {
            Micros(server).to_string()
        };
        assert!(
            row.contains(&format!("<td class=\"server\">{cell}</td>")),
            "{row}"
        );
        tables += 1;
    }
    // The capture runs during the c=32 run, which kept records: it is joined.
    let joined = joins.map_or(0, |js| js.len());
    assert!(joined >= 1, "the captured run is joined with its records");
    assert_eq!(
        tables, joined,
        "a table of the slowest requests per joined run"
    );
}

/// A real tail: a Python server on loopback (one write per response, TCP_NODELAY on) whose
/// every 20th request takes a 60 ms slow path. The verdict has a tail, and the page draws its decomposition next to the
/// percentile chart (one bar per part, agreeing with the JSON) and both runs' timelines.
#[test]
#[ignore = "needs root"]
fn report_of_an_every_nth_tail_draws_its_decomposition() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let script = format!(
        r#"
import http.server, itertools, threading, time
n = itertools.count(1)
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        with lock:
            k = next(n)
        if k % 20 == 0:
            time.sleep(0.06)
        body = b"x" * 200
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        self.wfile.write(head + body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H).serve_forever()
"#
    );
    let mut server = Command::new("python3")
        .args(["-c", &script])
        .spawn()
        .expect("python3");
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "python server not up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let turn = lagtrace_testkit::measuring();
    let out = Command::new(BIN)
        .args([
            "diagnose",
            &format!("http://127.0.0.1:{port}/"),
            "-q",
            "--json",
        ])
        .args(["-d", "3s", "-c", "8", "--report"])
        .arg(&html)
        .env("XDG_STATE_HOME", dir.path())
        .output()
        .unwrap();
    drop(turn);
    let _ = server.kill();
    let _ = server.wait();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        d["verdict"]["tail"].is_object(),
        "a 60 ms slow path on every 20th request is a tail: {}",
        d["verdict"]
    );
    let url = format!("file://{}", html.display());
    let (dom, log) = chromium(&["--dump-dom".into(), url]);
    for bad in ["Uncaught", "CONSOLE(", "net::ERR_"] {
        assert!(!log.contains(bad), "{bad}: {log}");
    }
    assert!(dom.contains("id=\"tail-decomposition\""));
    tail_charts(&dom, &d);
}
