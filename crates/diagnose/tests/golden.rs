//! Golden diagnoses: `lagtrace diagnose --json` recorded from real runs of each builtin fault
//! and case server (`crates/lagtrace/tests/golden_record.rs` records them into
//! `tests/golden/`). Each is fed back through the pure rules: the verdict, the evidence lines
//! and the layers marked `finding` must come out exactly as recorded.
//!
//! `LAGTRACE_BLESS=1 cargo test -p lagtrace-diagnose --test golden` rewrites each file's
//! verdict, evidence and layer statuses with what the rules say now (the layers' data is
//! kept as recorded): for a deliberate change of the verdict's contract; review the diff.

use std::path::{Path, PathBuf};

use lagtrace_diagnose::{Assemble, Diagnosis, LayerStatus, Layers};
use serde_json::Value;

fn golden_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/golden")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

/// The layers as the rules saw them: `assemble` turns `ok` into `finding` afterwards.
fn as_judged(mut layers: Layers) -> Layers {
    for st in [
        &mut layers.path.status,
        &mut layers.app.status,
        &mut layers.packets.status,
        &mut layers.sockets.status,
    ] {
        if *st == LayerStatus::Finding {
            *st = LayerStatus::Ok;
        }
    }
    layers
}

/// Re-judges one recorded diagnosis: (recorded JSON, re-assembled JSON).
fn rejudge(path: &Path) -> (Value, Value) {
    let text = std::fs::read_to_string(path).expect("read golden");
    let recorded: Value = serde_json::from_str(&text).expect("golden is JSON");
    let d: Diagnosis = serde_json::from_str(&text).expect("golden is a Diagnosis");
    let again = Diagnosis::assemble(d.target, d.settings, as_judged(d.layers), d.elapsed_us);
    (recorded, serde_json::to_value(&again).expect("serialize"))
}

fn statuses(d: &Value) -> Vec<Value> {
    ["path", "app", "packets", "sockets"]
        .iter()
        .map(|l| d["layers"][l]["status"].clone())
        .collect()
}

#[test]
fn recorded_diagnoses_judge_the_same() {
    let files = golden_files();
    assert!(files.len() >= 10, "golden files: {files:?}");
    let bless = std::env::var_os("LAGTRACE_BLESS").is_some();
    let mut causes = std::collections::BTreeSet::new();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let (mut recorded, again) = rejudge(path);
        causes.insert(again["verdict"]["cause"].as_str().unwrap_or("?").to_owned());
        if bless {
            recorded["verdict"] = again["verdict"].clone();
            recorded["evidence"] = again["evidence"].clone();
            for l in ["path", "app", "packets", "sockets"] {
                recorded["layers"][l]["status"] = again["layers"][l]["status"].clone();
            }
            let text = serde_json::to_string_pretty(&recorded).expect("json") + "\n";
            std::fs::write(path, text).expect("bless");
            continue;
        }
        assert_eq!(
            recorded["verdict"], again["verdict"],
            "{name}: verdict\nrecorded {:#}\nnow {:#}",
            recorded["verdict"], again["verdict"]
        );
        let (r, a) = (&recorded["evidence"], &again["evidence"]);
        assert_eq!(r, a, "{name}: evidence\nrecorded {r:#}\nnow {a:#}");
        assert_eq!(
            statuses(&recorded),
            statuses(&again),
            "{name}: layer status"
        );
    }
    // The recordings cover the causes a real lab run produces.
    for c in [
        "healthy",
        "nagle-delayed-ack",
        "slow-server",
        "tcp-cork",
        "packet-loss",
        "path-queueing",
        "unreachable",
    ] {
        assert!(causes.contains(c), "no golden says {c}: {causes:?}");
    }
}
