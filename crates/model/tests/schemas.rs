//! The committed JSON Schemas (`schemas/<command>.schema.json`) are what the model types
//! generate. `LAGTRACE_BLESS=1 cargo test -p lagtrace-model --test schemas` rewrites them.

use std::path::PathBuf;

use lagtrace_lab::{LabState, LabStatusReport};
use lagtrace_model::Envelope;
use lagtrace_model::RequestRecords;
use lagtrace_model::analyze::Analysis;
use lagtrace_model::diagnosis::Diagnosis;
use lagtrace_model::host::HostReport;
use lagtrace_model::load::{LoadMergeReport, LoadReport};
use lagtrace_model::probe::{PingReport, RouteReport};
use lagtrace_sockets::Inspection;
use lagtrace_sockets::record::Recording;

fn schemas() -> Vec<(&'static str, schemars::Schema)> {
    vec![
        // A diagnosis carries `schema_version` and `command` itself: it is also a file format
        // (`--save`, `--verify`).
        ("analyze", schemars::schema_for!(Envelope<Analysis>)),
        ("diagnose", schemars::schema_for!(Diagnosis)),
        ("host", schemars::schema_for!(Envelope<HostReport>)),
        ("load", schemars::schema_for!(Envelope<LoadReport>)),
        (
            "load-merge",
            schemars::schema_for!(Envelope<LoadMergeReport>),
        ),
        (
            "load-records",
            schemars::schema_for!(Envelope<RequestRecords>),
        ),
        ("ping", schemars::schema_for!(Envelope<PingReport>)),
        ("route", schemars::schema_for!(Envelope<RouteReport>)),
        // `sockets`, `lab`: their types live in lagtrace-sockets / lagtrace-lab.
        ("sockets", schemars::schema_for!(Envelope<Inspection>)),
        ("sockets-record", schemars::schema_for!(Envelope<Recording>)),
        ("lab-up", schemars::schema_for!(Envelope<LabState>)),
        (
            "lab-status",
            schemars::schema_for!(Envelope<LabStatusReport>),
        ),
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
}

#[test]
fn committed_schemas_match_the_types() {
    let bless = std::env::var_os("LAGTRACE_BLESS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (command, schema) in schemas() {
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        let path = dir().join(format!("{command}.schema.json"));
        if bless {
            std::fs::create_dir_all(dir()).unwrap();
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "JSON output types changed: {stale:?} differ from what the types generate.\n\
         A change of any --json output needs a bump of lagtrace_model::SCHEMA_VERSION \
         (unless only adding an optional field) and a CHANGELOG.md entry; then rewrite the \
         files with LAGTRACE_BLESS=1 cargo test -p lagtrace-model --test schemas"
    );
}

#[test]
fn every_schema_names_its_version_and_command() {
    for (command, schema) in schemas() {
        let v = schema.as_value();
        let required = v["required"].as_array().unwrap();
        for field in ["schema_version", "command"] {
            assert!(
                required.iter().any(|r| r == field),
                "{command}: `{field}` is not a required top-level field"
            );
        }
    }
}

#[test]
fn the_envelope_puts_version_and_command_beside_the_report_fields() {
    let doc = Envelope::new(
        "ping",
        lagtrace_model::Target {
            url: None,
            host: "example.org".into(),
            addr: "192.0.2.1".into(),
            port: 80,
        },
    );
    let v = serde_json::to_value(&doc).unwrap();
    assert_eq!(v["schema_version"], lagtrace_model::SCHEMA_VERSION);
    assert_eq!(v["command"], "ping");
    assert_eq!(v["host"], "example.org");
    assert!(v.get("url").is_none(), "an absent url is left out: {v}");
    let back: Envelope<lagtrace_model::Target> = serde_json::from_value(v).unwrap();
    assert_eq!(back, doc);
}
