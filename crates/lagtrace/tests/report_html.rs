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
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs root"]
fn report_of_the_reference_case_renders_with_its_ladder_and_chart() {
    let lab = Lab::up(&LabOptions::new(&format!("dgrep{}", std::process::id()))).expect("lab");
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let turn = lagtrace_testkit::measuring();
    let out = Command::new(BIN)
        .args(["diagnose", &lab.latency_url(), "-q", "-d", "4s", "--report"])
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
    assert!(dom.contains("stall: Nagle holds the segment until the client"));
    assert!(dom.contains("GET /"));
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
