//! The renderers on a constructed diagnosis (the reference case's numbers and its packet
//! pattern from ../shared/case/README.md): text layout, JSON schema, and the HTML report
//! rendered by headless Chromium — it renders, the charts are drawn (screenshot pixels), the
//! page loads nothing external and logs no console error.

use std::io::Read as _;
use std::path::Path;
use std::process::Command;

use lagtrace_diagnose::Assemble;
use lagtrace_diagnose::evidence::*;
use lagtrace_diagnose::{Diagnosis, Settings};
use lagtrace_testkit::layers::{Synth, directive, options, target};

fn run(c: u32, p50: u64, p99: u64, rps: f64) -> AppRun {
    Synth::REPORT.run(c, p50, p99, rps)
}

fn pkt(frame: u64, t_us: u64, dir: Direction, flags: &str, len: u32, note: &str) -> FlowPacket {
    FlowPacket {
        frame,
        t_us,
        dir,
        flags: flags.into(),
        len,
        note: note.into(),
    }
}

/// The reference case as a diagnosis.
fn nagle_case() -> Diagnosis {
    use Direction::*;
    let flow = Flow {
        stream: 1,
        client: "10.77.0.1:41234".into(),
        server: "10.77.0.2:8080".into(),
        handshake: vec![
            pkt(1, 0, ToServer, "SYN", 0, ""),
            pkt(2, 71, ToClient, "SYN,ACK", 0, ""),
            pkt(3, 95, ToServer, "ACK", 0, ""),
        ],
        packets: vec![
            pkt(12, 1_000, ToServer, "PSH,ACK", 41, "GET / (request 1)"),
            pkt(13, 1_884, ToClient, "PSH,ACK", 238, "response headers"),
            pkt(14, 1_894, ToClient, "PSH,ACK", 615, "body"),
            pkt(15, 1_938, ToServer, "PSH,ACK", 41, "GET / (request 2)"),
            pkt(16, 4_397, ToClient, "PSH,ACK", 238, "headers (writev)"),
            pkt(17, 45_638, ToServer, "ACK", 0, "delayed ACK"),
            pkt(18, 45_932, ToClient, "PSH,ACK", 615, "body held by Nagle"),
        ],
        stalls: vec![Stall {
            from_frame: 16,
            to_frame: 18,
            gap_us: 41_535,
            label: "Nagle holds the body until the client's delayed ACK".into(),
        }],
    };
    let mut layers = Synth::REPORT.healthy_layers();
    let path = layers.path.data.as_mut().unwrap();
    path.idle = Some(RttStats::from_samples(5, 0, &[62, 58, 71, 60, 66]));
    path.under_load = Some(RttStats::from_samples(5, 0, &[90, 120, 85, 101, 97]));
    layers.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 41_200, 42_000, 24.0)),
        cn: Some(run(32, 43_900, 48_000, 730.0)),
    });
    let p = layers.packets.data.as_mut().unwrap();
    p.capture_point = "lt-c-x in the current namespace".into();
    p.packets = 11_000;
    p.transactions = 2_920;
    p.handshake_rtt = Some(Synth::REPORT.pct(32, 70, 150));
    p.server_time = Some(Synth::REPORT.pct(2_920, 160, 2_400));
    p.findings = vec![FindingSummary {
        kind: FindingKind::NagleDelayedAck,
        count: 2_830,
        transactions: 2_830,
        share: 2_830.0 / 2_920.0,
        median_added_us: 40_900,
        p99_added_us: 43_100,
        examples: vec![FindingExample {
            stream: 1,
            frames: vec![16, 17, 18],
            time_us: 47_146,
            added_us: 41_535,
            note: "body held until the delayed ACK".into(),
        }],
    }];
    p.example_flow = Some(flow);
    let s = layers.sockets.data.as_mut().unwrap();
    s.server.as_mut().unwrap().netns = "lt-lab".into();
    s.nodelay = options(0, 32);
    s.config = vec![directive(
        "tcp_nodelay",
        "off",
        "/run/lagtrace/lab/latency.conf",
        12,
    )];
    let mut d = Diagnosis::assemble(
        target(),
        Settings {
            concurrency: 32,
            duration_us: 10_000_000,
        },
        layers,
        11_200_000,
    );
    // `date -u -d @1795439696`: Mon Nov 23 13:14:56 UTC 2026.
    d.started_unix_us = 1_795_439_696_000_000;
    d
}

/// The same after the fix, verified against the first.
fn verified_case() -> Diagnosis {
    let before = nagle_case();
    let mut layers = before.layers.clone();
    layers.app = Layer::ran(AppEvidence {
        c1: Some(run(1, 95, 300, 9_000.0)),
        cn: Some(run(32, 1_300, 5_200, 21_000.0)),
    });
    layers.packets.data.as_mut().unwrap().findings.clear();
    layers.packets.data.as_mut().unwrap().example_flow = None;
    layers.packets.status = LayerStatus::Ok;
    layers.sockets.status = LayerStatus::Ok;
    layers.app.status = LayerStatus::Ok;
    let s = layers.sockets.data.as_mut().unwrap();
    s.nodelay = options(32, 0);
    s.config[0].value = "on".into();
    let mut after = Diagnosis::assemble(before.target.clone(), before.settings.clone(), layers, 1);
    after.verify = Some(after.compare_with(&before, "before.json"));
    after
}

#[test]
fn text_puts_the_verdict_first_then_layers_evidence_fix() {
    let t = lagtrace_report::text(&nagle_case());
    let pos = |s: &str| {
        t.find(s)
            .unwrap_or_else(|| panic!("{s:?} missing in:\n{t}"))
    };
    assert!(pos("VERDICT  nagle-delayed-ack  (confidence high)") < pos("LAYERS"));
    assert!(pos("LAYERS") < pos("EVIDENCE"));
    assert!(pos("EVIDENCE") < pos("FIX"));
    pos("  packets  finding");
    pos("  path     ok");
    pos("/run/lagtrace/lab/latency.conf:12: tcp_nodelay off; → tcp_nodelay on;");
    pos("stream 1 frames #16 #17 #18");
    pos("97% of requests");
    pos("client lagtrace: TCP_NODELAY on, delayed ACK on");
    let v = lagtrace_report::text(&verified_case());
    assert!(
        v.contains("VERIFY  against before.json: nagle-delayed-ack → healthy"),
        "{v}"
    );
    assert!(v.contains("c=32   p50"), "{v}");
}

#[test]
fn json_has_the_documented_top_level_shape() {
    let j: serde_json::Value = serde_json::from_str(&lagtrace_report::json(&nagle_case())).unwrap();
    for k in ["cause", "secondary", "confidence", "cost", "fix"] {
        assert!(j["verdict"].get(k).is_some(), "verdict.{k}");
    }
    for l in ["path", "app", "packets", "sockets"] {
        assert!(j["layers"][l]["status"].is_string(), "layers.{l}.status");
        assert!(j["layers"][l]["data"].is_object(), "layers.{l}.data");
    }
    assert!(j["evidence"].as_array().unwrap().len() >= 4);
}

// ---- headless Chromium ----------------------------------------------------------------

fn chromium() -> &'static str {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c;
        }
    }
    panic!("headless Chromium is needed for this test: apt-get install chromium (.ci/setup does)");
}

fn chromium_cmd(profile: &Path) -> Command {
    let mut c = Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1200,2400",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// A minimal PNG decoder (8-bit RGB/RGBA, non-interlaced: what Chromium writes).
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<[u8; 3]>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let mut i = 8;
    let (mut w, mut h, mut ctype) = (0u32, 0u32, 0u8);
    let mut idat = Vec::new();
    while i + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap()) as usize;
        let kind = &bytes[i + 4..i + 8];
        let data = &bytes[i + 8..i + 8 + len];
        match kind {
            b"IHDR" => {
                w = u32::from_be_bytes(data[0..4].try_into().unwrap());
                h = u32::from_be_bytes(data[4..8].try_into().unwrap());
                assert_eq!(data[8], 8, "bit depth");
                ctype = data[9];
                assert_eq!(data[12], 0, "interlaced");
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        i += 12 + len;
    }
    let bpp = match ctype {
        2 => 3,
        6 => 4,
        c => panic!("colour type {c}"),
    };
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&idat[..])
        .read_to_end(&mut raw)
        .unwrap();
    let stride = w as usize * bpp;
    let mut prev = vec![0u8; stride];
    let mut px = Vec::with_capacity((w * h) as usize);
    for r in 0..h as usize {
        let line = &raw[r * (stride + 1)..(r + 1) * (stride + 1)];
        let f = line[0];
        let mut cur = line[1..].to_vec();
        for x in 0..stride {
            let a = if x >= bpp { cur[x - bpp] as i16 } else { 0 };
            let b = prev[x] as i16;
            let c = if x >= bpp { prev[x - bpp] as i16 } else { 0 };
            let add = match f {
                0 => 0,
                1 => a,
                2 => b,
                3 => (a + b) / 2,
                4 => {
                    let p = a + b - c;
                    let (pa, pb, pc) = ((p - a).abs(), (p - b).abs(), (p - c).abs());
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => panic!("filter {f}"),
            };
            cur[x] = cur[x].wrapping_add(add as u8);
        }
        for p in cur.chunks(bpp) {
            px.push([p[0], p[1], p[2]]);
        }
        prev = cur;
    }
    (w, h, px)
}

fn near(p: [u8; 3], q: [u8; 3]) -> bool {
    p.iter()
        .zip(q)
        .all(|(a, b)| (*a as i16 - b as i16).abs() <= 12)
}

/// Runs chromium with a time limit (a hung browser must not hang the test suite).
fn run_limited(mut c: Command) -> std::process::Output {
    use std::time::{Duration, Instant};
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

fn render(d: &Diagnosis, name: &str) -> (Vec<[u8; 3]>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join(format!("{name}.html"));
    std::fs::write(&page, lagtrace_report::html(d)).unwrap();
    let url = format!("file://{}", page.display());
    // 1. The DOM as Chromium built it, and its console.
    let prof = tempfile::tempdir().unwrap();
    let mut c = chromium_cmd(prof.path());
    c.arg("--dump-dom").arg(&url);
    let out = run_limited(c);
    assert!(
        out.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    // 2. A screenshot.
    let shot = dir.path().join(format!("{name}.png"));
    let prof = tempfile::tempdir().unwrap();
    let mut c = chromium_cmd(prof.path());
    c.arg(format!("--screenshot={}", shot.display())).arg(&url);
    let out = run_limited(c);
    assert!(
        out.status.success(),
        "chromium --screenshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    if let Ok(keep) = std::env::var("LAGTRACE_KEEP_SCREENSHOTS") {
        std::fs::copy(&shot, Path::new(&keep).join(format!("{name}.png"))).unwrap();
        std::fs::copy(&page, Path::new(&keep).join(format!("{name}.html"))).unwrap();
    }
    let (w, h, px) = decode_png(&png);
    assert_eq!((w, h), (1200, 2400));
    (px, dom, log)
}

fn assert_clean_console(log: &str) {
    for bad in ["Uncaught", "CONSOLE(", "net::ERR_", "Failed to load"] {
        assert!(!log.contains(bad), "chromium logged {bad:?}:\n{log}");
    }
}

#[test]
fn html_report_renders_in_headless_chromium_with_charts_and_stall() {
    let d = nagle_case();
    let html = lagtrace_report::html(&d);
    // Self-contained: nothing fetched from anywhere.
    for ext in [
        "http://", "https://", "src=", "<link", "@import", "url(http",
    ] {
        let n = html.matches(ext).count();
        // The target URL itself appears as text (http://10.77.0.2:8080/), and SVG namespaces.
        let allowed = html.matches("http://10.77.0.2").count()
            + html.matches("http://www.w3.org/2000/svg").count();
        if ext == "http://" {
            assert_eq!(n, allowed, "external reference in the report");
        } else {
            assert_eq!(n, 0, "{ext} in the report");
        }
    }
    let (px, dom, log) = render(&d, "nagle");
    assert_clean_console(&log);
    // The DOM Chromium built holds the verdict, both charts, their lines and the stall.
    assert!(dom.contains("nagle-delayed-ack"));
    assert!(dom.contains("id=\"percentile-chart\""));
    assert!(dom.contains("id=\"flow-ladder\""));
    assert_eq!(
        dom.matches("class=\"series\"").count(),
        2,
        "c=1 and c=32 lines"
    );
    assert_eq!(
        dom.matches("class=\"pkt\"").count(),
        7,
        "one arrow per packet"
    );
    assert_eq!(
        dom.matches("class=\"pkt handshake\"").count(),
        3,
        "SYN, SYN-ACK, ACK on the ladder"
    );
    assert!(dom.contains("SYN,ACK (handshake)"));
    assert!(dom.contains("later on the same connection"));
    assert!(
        dom.contains(&format!(
            "run 2026-11-23 13:14:56 UTC · lagtrace {}",
            env!("CARGO_PKG_VERSION")
        )),
        "run date and version in the header"
    );
    assert!(dom.contains("class=\"stall\""));
    assert!(dom.contains("41.53ms stall</text>"));
    assert!(dom.contains(">Nagle holds the body"));
    // The screenshot is not blank: many colours, and the drawn parts are visible.
    let mut colours: Vec<[u8; 3]> = px.clone();
    colours.sort_unstable();
    colours.dedup();
    assert!(
        colours.len() > 200,
        "only {} colours: blank page?",
        colours.len()
    );
    let count = |c: [u8; 3]| px.iter().filter(|p| near(**p, c)).count();
    let verdict_red = count([0xb0, 0x3a, 0x2e]);
    let c1_blue = count([0x24, 0x71, 0xa3]);
    let stall_band = count([0xfd, 0xec, 0xea]);
    assert!(
        verdict_red > 5_000,
        "verdict banner/red series: {verdict_red} px"
    );
    assert!(c1_blue > 300, "the c=1 series line is drawn: {c1_blue} px");
    assert!(
        stall_band > 5_000,
        "the stall band is drawn: {stall_band} px"
    );
}

#[test]
fn verified_report_draws_before_and_after_series() {
    let d = verified_case();
    let (px, dom, log) = render(&d, "verified");
    assert_clean_console(&log);
    assert!(dom.contains("id=\"verify\""));
    assert_eq!(
        dom.matches("class=\"series\"").count(),
        4,
        "c=1/c=32 before and after"
    );
    assert!(dom.contains("c=32 before"));
    assert!(dom.contains("× better"));
    // Healthy verdict banner in green; the dashed "before" series in light red.
    let green = px.iter().filter(|p| near(**p, [0x1e, 0x84, 0x49])).count();
    let before = px.iter().filter(|p| near(**p, [0xf1, 0x94, 0x8a])).count();
    assert!(green > 5_000, "green verdict: {green}");
    assert!(before > 100, "before series: {before}");
}

// ---- labels measured in the browser ---------------------------------------------------

/// The report's SVG labels as Chromium lays them out: how many were measured, and each
/// pair that overlaps (or label cut off by its chart); and the browser's log.
fn label_overlaps(html: &str, name: &str) -> (usize, Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join(format!("{name}.html"));
    let measured = lagtrace_testkit::browser::with_label_check(html);
    std::fs::write(&page, measured).unwrap();
    let prof = tempfile::tempdir().unwrap();
    let mut c = chromium_cmd(prof.path());
    c.arg("--dump-dom")
        .arg(format!("file://{}", page.display()));
    let out = run_limited(c);
    assert!(out.status.success(), "chromium --dump-dom failed");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let (n, bad) = lagtrace_testkit::browser::label_check_result(&dom)
        .unwrap_or_else(|| panic!("the measuring script did not run:\n{log}"));
    (n, bad, log)
}

/// A busy connection: IPv6 endpoints, long request lines with several findings marked,
/// two stalls ending on the same packet and a third overlapping them.
fn busy_case() -> Diagnosis {
    use Direction::*;
    let mut d = nagle_case();
    let long = "GET /api/v2/search?q=a-very-long-query-string&page=12&sort=relevance HTTP/1.1";
    let mut packets = Vec::new();
    for i in 0..40u64 {
        let (dir, flags, len, note) = match i % 4 {
            0 => (
                ToServer,
                "PSH,ACK",
                96,
                format!("{long} · retransmission, dsack"),
            ),
            1 => (ToClient, "ACK", 0, String::new()),
            2 => (
                ToClient,
                "PSH,ACK",
                1448,
                "HTTP/1.1 200 OK · held-until-ack".into(),
            ),
            _ => (
                ToServer,
                "FIN,PSH,ACK,ECE,CWR",
                0,
                "nagle-delayed-ack".into(),
            ),
        };
        packets.push(pkt(100 + i, 1_000 + i * 50, dir, flags, len, &note));
    }
    let stall = |from, to, gap_us, label: &str| Stall {
        from_frame: from,
        to_frame: to,
        gap_us,
        label: label.into(),
    };
    let p = d.layers.packets.data.as_mut().unwrap();
    p.example_flow = Some(Flow {
        stream: 7,
        client: "[2001:db8:ffff:ffff:ffff:ffff:ffff:1]:65535".into(),
        server: "[2001:db8:ffff:ffff:ffff:ffff:ffff:2]:65535".into(),
        handshake: vec![
            pkt(1, 0, ToServer, "SYN", 0, ""),
            pkt(2, 1_000_000, ToServer, "SYN", 0, "syn-retransmit"),
            pkt(3, 1_000_071, ToClient, "SYN,ACK", 0, ""),
            pkt(4, 1_000_095, ToServer, "ACK", 0, ""),
        ],
        packets,
        stalls: vec![
            stall(
                104,
                110,
                41_535,
                "Nagle holds the segment until the client's delayed ACK",
            ),
            stall(
                106,
                110,
                200_000,
                "TCP_CORK holds the partial frame until its 200 ms ceiling",
            ),
            stall(108, 111, 3_000, "lost: waiting for the retransmission"),
            stall(
                120,
                121,
                1_000,
                &"a label far longer than the ladder is wide ".repeat(4),
            ),
        ],
    });
    d
}

#[test]
fn ladder_labels_do_not_overlap_in_the_browser_even_on_a_busy_flow() {
    // The ladder alone has 4 host labels and 2 per packet (10 and 44 packets here).
    for (name, d, least) in [("nagle", nagle_case(), 24), ("busy", busy_case(), 92)] {
        let html = lagtrace_report::html(&d);
        let (n, bad, log) = label_overlaps(&html, name);
        assert_clean_console(&log);
        assert!(n >= least, "{name}: only {n} labels measured");
        assert!(
            bad.is_empty(),
            "{name}: {} labels collide:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
    // A cut label keeps its whole text as a tooltip.
    let html = lagtrace_report::html(&busy_case());
    assert!(
        html.contains("…<") || html.contains("…</text>"),
        "a long label is cut"
    );
    let whole = "a label far longer than the ladder is wide ".repeat(4);
    assert!(
        html.contains(&format!("stall: {whole}</title>")),
        "its whole text stays"
    );
}

/// The check itself: two labels drawn on top of each other are reported, and a label an
/// arrow runs through ("apart"); one beside a lifeline ("clear") is not.
#[test]
fn the_label_check_sees_overlapping_labels() {
    let html = "<!DOCTYPE html><html><body><main><svg id=\"t\" width=\"300\" height=\"100\">\
        <text x=\"10\" y=\"20\">first label here</text><text x=\"30\" y=\"24\">second</text>\
        <text x=\"10\" y=\"50\">apart</text><line class=\"pkt\" x1=\"0\" y1=\"40\" x2=\"300\" \
        y2=\"52\" stroke=\"#000\"/><text x=\"10\" y=\"80\">clear</text>\
        <line class=\"lifeline\" x1=\"200\" y1=\"60\" x2=\"200\" y2=\"100\" stroke=\"#000\"/>\
        </svg></main></body></html>";
    let (n, bad, _) = label_overlaps(html, "control");
    assert_eq!(n, 4);
    assert_eq!(
        bad,
        vec![
            "t: \"first label here\" / \"second\"".to_string(),
            "t: \"apart\" is crossed by a line".to_string(),
        ]
    );
}

/// A passive run's report names the clients' connections in its header, never a
/// concurrency lagtrace did not choose (`c=N`).
#[test]
fn a_passive_reports_header_names_the_clients_connections() {
    let mut d = nagle_case();
    let cn = d
        .layers
        .app
        .data
        .as_mut()
        .and_then(|a| a.cn.as_mut())
        .expect("a c=N run");
    cn.passive = Some(PassiveRun {
        source: "file capture.pcap".into(),
        server: "10.77.0.2:8080".into(),
        clients: 3,
        connections: cn.concurrency.into(),
        incomplete: 0,
        joined_open: 0,
        by_client: Vec::new(),
    });
    let n = cn.concurrency;
    let h = lagtrace_report::html(&d);
    let sub = h
        .split("<div class=\"sub\">")
        .nth(1)
        .and_then(|s| s.split("</div>").next())
        .expect("the header's line");
    assert!(sub.contains(&format!("{n} client connections")), "{sub}");
    assert!(!sub.contains("c="), "{sub}");
    // An active run keeps its c=N.
    let h = lagtrace_report::html(&nagle_case());
    assert!(h.contains(&format!(" · c={n} · ")), "active header");
}
