//! Every command's real `--json` output, on real runs, validates against its committed
//! schema (`schemas/<command>.schema.json`, generated from the model types by
//! `crates/model/tests/schemas.rs`): the contract a script relies on is what the binary
//! prints, not only what the types say.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::BIN;
use serde_json::Value;

fn schema(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../schemas")
        .join(format!("{name}.schema.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).expect("committed schema")).unwrap()
}

/// Asserts `doc` is valid against `schemas/{name}.schema.json`, listing every violation.
fn assert_valid(name: &str, doc: &Value) {
    let v = jsonschema::validator_for(&schema(name)).expect("the schema compiles");
    let errs: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errs.is_empty(),
        "{name}: {} violations:\n{}",
        errs.len(),
        errs.join("\n")
    );
    assert_eq!(doc["schema_version"], 2, "{name}");
}

/// Runs `lagtrace ARGS` (its saved state in a private directory) and parses stdout.
fn json_of(args: &[&str]) -> Value {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(args)
        .env("XDG_STATE_HOME", home.path())
        .output()
        .expect("run lagtrace");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{args:?}: exit {:?}: {err}",
        out.status.code()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}{err}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn a_validator_rejects_what_breaks_the_contract() {
    // The check can fail: a wrong type, a missing field and an unknown cause are caught.
    let an = json_of(&[
        "analyze",
        "--json",
        lagtrace_testkit::case_pcap("nagle-delayed-ack.pcap")
            .to_str()
            .unwrap(),
    ]);
    let v = jsonschema::validator_for(&schema("analyze")).unwrap();
    let mut bad = an.clone();
    bad["frames"] = Value::from("many");
    assert!(!v.is_valid(&bad));
    let mut bad = an.clone();
    bad.as_object_mut().unwrap().remove("streams");
    assert!(!v.is_valid(&bad));
    let d = jsonschema::validator_for(&schema("diagnose")).unwrap();
    assert!(!d.is_valid(&serde_json::json!({"schema_version": 2, "command": "diagnose"})));
}

#[test]
fn analyze_json_matches_its_schema() {
    for f in ["nagle-delayed-ack.pcap", "healthy.pcap"] {
        let p = lagtrace_testkit::case_pcap(f);
        assert_valid(
            "analyze",
            &json_of(&["analyze", "--json", p.to_str().unwrap()]),
        );
    }
}

#[test]
#[ignore = "needs root"]
fn live_commands_json_matches_their_schemas() {
    use lagtrace_testkit::server::{Mode, TestServer};
    let srv = TestServer::spawn(Mode::ok());
    let hp = srv.addr.to_string();
    let url = format!("http://{hp}/");
    let _turn = lagtrace_testkit::measuring();
    assert_valid(
        "ping",
        &json_of(&["ping", &hp, "-c", "3", "-i", "50ms", "--json"]),
    );
    assert_valid(
        "ping",
        &json_of(&["ping", &hp, "-c", "2", "-i", "50ms", "--connect", "--json"]),
    );
    assert_valid("route", &json_of(&["route", &hp, "--json"]));
    assert_valid(
        "load",
        &json_of(&["load", &url, "-c", "4", "-d", "1s", "--json"]),
    );
    assert_valid("host", &json_of(&["host", "-d", "1s", "--json"]));
    let d = json_of(&["diagnose", &url, "-d", "1s", "-c", "4", "--json", "-q"]);
    assert_valid("diagnose", &d);
    // An unreachable target's diagnosis (other layers' statuses) holds to it too.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let d = json_of(&[
        "diagnose",
        &format!("http://{closed}/"),
        "-d",
        "1s",
        "--json",
        "-q",
    ]);
    assert_valid("diagnose", &d);
}
