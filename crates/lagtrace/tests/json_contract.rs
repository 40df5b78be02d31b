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

/// Runs `lab down` on drop so a failing test leaves no lab behind.
struct LabDown(String);
impl Drop for LabDown {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["lab", "down", "--name", &self.0])
            .output();
    }
}

/// `lab up`, `lab status`, `sockets` (live, in the lab's namespace and across namespaces) and
/// `sockets --record` of a real curl: the real nginx of a real lab, each document validated.
#[test]
#[ignore = "needs root"]
fn lab_and_sockets_json_match_their_schemas() {
    let name = format!("jc-{}", std::process::id());
    let _down = LabDown(name.clone());
    let up = json_of(&["lab", "up", "--name", &name, "--json"]);
    assert_valid("lab-up", &up);
    assert_eq!(up["command"], "lab up");
    let good = up["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["role"] == "good")
        .expect("a good server")
        .clone();
    assert_eq!(good["kind"], "nginx", "the lab runs real nginx: {up}");
    let url = format!(
        "http://{}:{}/",
        up["server_addr"].as_str().unwrap(),
        good["port"]
    );

    let st = json_of(&["lab", "status", "--name", &name, "--json"]);
    assert_valid("lab-status", &st);
    assert_eq!(st["labs"][0]["name"], name.as_str(), "{st}");
    assert!(st["labs"][0]["answering"][0].as_bool().unwrap(), "{st}");

    // A live connection to nginx, so the view holds more than the listeners.
    let addr: std::net::SocketAddr = url[7..url.len() - 1].parse().unwrap();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut conn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let netns = up["netns"].as_str().unwrap();
    let live = json_of(&["sockets", "--netns", netns, "--json"]);
    assert_valid("sockets", &live);
    assert_eq!(live["command"], "sockets");
    let socks = live["sockets"].as_array().unwrap();
    assert!(
        socks
            .iter()
            .any(|s| s["state"] != "listen" && s["state"] != "LISTEN"),
        "the established connection is in the view: {live}"
    );
    assert_valid("sockets", &json_of(&["sockets", "--all-netns", "--json"]));
    drop(conn);

    let rec = json_of(&[
        "sockets",
        "--record",
        "--json",
        "--",
        "curl",
        "-s",
        "-o",
        "/dev/null",
        &url,
    ]);
    assert_valid("sockets-record", &rec);
    assert_eq!(rec["command"], "sockets record");
    assert!(!rec["sockets"].as_array().unwrap().is_empty(), "{rec}");

    // The new schemas can fail: a wrong type and a missing field are caught.
    for (schema_name, doc, field) in [
        ("lab-up", &up, "servers"),
        ("lab-status", &st, "labs"),
        ("sockets", &live, "sockets"),
        ("sockets-record", &rec, "sockets"),
    ] {
        let v = jsonschema::validator_for(&schema(schema_name)).unwrap();
        let mut bad = doc.clone();
        bad[field] = Value::from("many");
        assert!(!v.is_valid(&bad), "{schema_name}: a string {field}");
        let mut bad = doc.clone();
        bad.as_object_mut().unwrap().remove(field);
        assert!(!v.is_valid(&bad), "{schema_name}: no {field}");
    }
}

#[test]
fn load_records_and_merge_json_match_their_schemas() {
    use lagtrace_testkit::server::{Mode, TestServer};
    let srv = TestServer::spawn(Mode::ok());
    let dir = tempfile::tempdir().unwrap();
    let (log, recs) = (dir.path().join("w.hlog"), dir.path().join("w.json"));
    let (log, recs) = (log.to_str().unwrap(), recs.to_str().unwrap());
    json_of(&[
        "load",
        "-c2",
        "-t1",
        "-d300ms",
        "--rate",
        "200",
        "--json",
        "--hdr-log",
        log,
        "--records",
        recs,
        &srv.url(),
    ]);
    let r: Value = serde_json::from_slice(&std::fs::read(recs).unwrap()).unwrap();
    assert_valid("load-records", &r);
    let m = json_of(&["load", "merge", "--json", log]);
    assert_valid("load-merge", &m);
    // The union's fields are `load --json`'s: the load schema holds for them too.
    assert_valid("load", &m);
}
