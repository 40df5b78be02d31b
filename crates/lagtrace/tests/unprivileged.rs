//! Without privileges (the built binary run as `nobody` with every capability dropped by
//! `setpriv`): layers that could not measure never show ✓, and each names the missing
//! capability once; `sockets` names CAP_SYS_PTRACE; `ping` says its timestamp source in a
//! few words.

mod common;

use std::process::{Command, Output};

use common::BIN;
use lagtrace_testkit::server::{Mode, TestServer};

/// `lagtrace ARGS` as uid/gid 65534 with no capabilities (inheritable and ambient cleared),
/// its state in a directory it owns.
fn unprivileged(args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    lagtrace_testkit::sh(&["chown", "65534:65534", home.path().to_str().unwrap()]);
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            BIN,
        ])
        .args(args)
        .env("XDG_STATE_HOME", home.path())
        .output()
        .expect("run setpriv")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs root"]
fn unprivileged_diagnose_shows_no_check_mark_on_layers_that_did_not_measure() {
    let srv = TestServer::spawn(Mode::ok());
    let url = format!("http://{}/", srv.addr);
    let _turn = lagtrace_testkit::measuring();
    let o = unprivileged(&["diagnose", &url, "-d", "1s", "-c", "4"]);
    let (out, err) = text(&o);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{out}{err}");
    // Progress: a layer that did not measure is ✗, never ✓.
    for l in err.lines().filter(|l| l.trim_start().starts_with('✓')) {
        for st in ["unavailable", "skipped", "error"] {
            assert!(
                !l.contains(&format!(": {st}")),
                "✓ on a layer that did not run: {l}"
            );
        }
    }
    assert!(
        err.lines()
            .any(|l| l.trim_start().starts_with("✗ packets: ") && l.contains("CAP_NET_RAW")),
        "{err}"
    );
    // The report: the capture says it is unavailable and why, once.
    let layer = |name: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row: {out}"))
            .to_string()
    };
    assert!(layer("packets ").contains("unavailable"), "{out}");
    assert_eq!(out.matches("CAP_NET_RAW").count(), 1, "{out}");
    // The listener is found, its process cannot be read: not `ok`, CAP_SYS_PTRACE named once.
    let sockets = layer("sockets ");
    assert!(sockets.contains("unavailable"), "{out}");
    assert!(sockets.contains("CAP_SYS_PTRACE"), "{out}");
    assert_eq!(out.matches("CAP_SYS_PTRACE").count(), 1, "{out}");
}

#[test]
#[ignore = "needs root"]
fn unprivileged_sockets_and_ping_name_what_they_lack_in_one_line() {
    let srv = TestServer::spawn(Mode::ok());
    let port = srv.addr.port().to_string();
    let o = unprivileged(&["sockets", "--port", &port]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("LISTEN"), "{out}");
    assert!(out.contains("CAP_SYS_PTRACE"), "{out}");
    let o = unprivileged(&["ping", &srv.addr.to_string(), "-c", "2", "-i", "50ms"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert_eq!(err.matches("CAP_NET_RAW").count(), 1, "{err}");
    let times = out.lines().find(|l| l.contains("times: ")).expect(&out);
    assert!(times.len() < 140, "a short line: {times}");
    // As root the raw mode's line stays short too.
    let o = Command::new(BIN)
        .args(["ping", &srv.addr.to_string(), "-c", "2", "-i", "50ms"])
        .output()
        .unwrap();
    let (out, _) = text(&o);
    let times = out.lines().find(|l| l.contains("times: ")).expect(&out);
    assert!(times.len() < 160, "a short line: {times}");
    assert!(times.contains("kernel"), "{times}");
}
