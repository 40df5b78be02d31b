//! `lagtrace demo`: the reference case found, fixed and verified end to end within 60 s, and
//! nothing left behind — also when interrupted with Ctrl-C mid-diagnosis. Needs root.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn gone(name: &str) -> bool {
    !Path::new("/run/netns")
        .join(lagtrace_lab::netns_name(name))
        .exists()
        && !lagtrace_lab::state_dir(name).exists()
}

#[test]
#[ignore = "needs root"]
fn demo_finds_fixes_and_verifies_within_a_minute() {
    let name = format!("dgdemo{}", std::process::id());
    let home = tempfile::tempdir().unwrap();
    let report = home.path().join("demo.html");
    let t = Instant::now();
    let out = Command::new(BIN)
        .args(["demo", "--name", &name, "-d", "4s", "--report"])
        .arg(&report)
        .env("XDG_STATE_HOME", home.path())
        .output()
        .unwrap();
    let wall = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    assert!(wall < Duration::from_secs(60), "{wall:?}");
    // Step by step: the diagnosis names the cause and the config line, the fix verifies.
    let pos = |s: &str| {
        text.find(s)
            .unwrap_or_else(|| panic!("{s:?} missing:\n{text}"))
    };
    assert!(pos("1. lab up") < pos("3. lagtrace diagnose"));
    assert!(pos("verdict: nagle-delayed-ack") < pos("4. lab fix"));
    assert!(pos("nginx.conf:") < pos("4. lab fix"));
    assert!(pos("4. lab fix") < pos("verdict: healthy"));
    assert!(pos("verdict: healthy") < pos("6. lab down"));
    let p50 = text
        .lines()
        .find(|l| l.trim_start().starts_with("c=32") && l.contains(" p50 "))
        .unwrap_or_else(|| panic!("no c=32 p50 row:\n{text}"));
    let better: f64 = p50
        .split_whitespace()
        .find_map(|w| w.strip_suffix('x').and_then(|n| n.parse().ok()))
        .unwrap_or_else(|| panic!("no ratio in {p50:?}"));
    assert!(better > 10.0, "{p50}");
    assert!(std::fs::read_to_string(&report).unwrap().contains("flow"));
    assert!(gone(&name), "lab {name} left behind");
}

#[test]
#[ignore = "needs root"]
fn demo_interrupted_mid_diagnosis_leaves_nothing() {
    let name = format!("dgint{}", std::process::id());
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["demo", "--name", &name, "-d", "6s"])
        .env("XDG_STATE_HOME", home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let t = Instant::now();
    // Wait until the first diagnosis runs, then a bit into its load.
    loop {
        let l = lines.next().expect("demo ended before diagnosing").unwrap();
        if l.starts_with("3. lagtrace diagnose") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30));
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!gone(&name), "the lab should be up mid-demo");
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid as i32, libc::SIGINT);
    }
    let t = Instant::now();
    let status = child.wait().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?} to stop",
        t.elapsed()
    );
    assert!(
        !status.success(),
        "an interrupted demo does not report success"
    );
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        !rest.iter().any(|l| l.starts_with("5. ")),
        "went on after Ctrl-C: {rest:?}"
    );
    assert!(gone(&name), "lab {name} left behind after Ctrl-C");
}
