//! Records the golden diagnoses that `crates/diagnose/tests/golden.rs` replays through the
//! pure rules: `lagtrace diagnose URL --json` against real lab servers, one per builtin fault
//! and case. Ignored: it needs root, takes a minute or two, and its output is data to review
//! and commit, not a pass/fail check. Run it when the evidence model changes:
//!
//! ```text
//! cargo test --release -p lagtrace --test golden_record -- --ignored --test-threads 1
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lagtrace_lab::serve::ServeOptions;
use lagtrace_lab::{Lab, LabOptions, ServerKind};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diagnose/tests/golden")
}

fn name(test: &str) -> String {
    format!("gr{test}{}", std::process::id())
}

/// Runs `lagtrace diagnose URL --json -q ARGS` and writes its stdout to golden/NAME.json.
fn record(golden: &str, url: &str, args: &[&str]) {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["diagnose", url, "--json", "-q"])
        .args(args)
        .env("XDG_STATE_HOME", home.path())
        .output()
        .expect("run lagtrace");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{golden}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let text = serde_json::to_string_pretty(&v).expect("json") + "\n";
    std::fs::write(golden_dir().join(format!("{golden}.json")), text).expect("write golden");
    eprintln!("{golden}: {}", v["verdict"]["cause"]);
}

fn builtin(golden: &str, opts: ServeOptions, setup: impl FnOnce(&Lab)) {
    // Lab names are short: the golden's initials.
    let tag: String = golden.split('-').filter_map(|w| w.chars().next()).collect();
    let lab = Lab::up(&LabOptions::new(&name(&tag)).server(ServerKind::Builtin)).expect("lab");
    lab.start_builtin(Path::new(BIN), 9000, &opts)
        .expect("start_builtin");
    setup(&lab);
    record(
        golden,
        &format!("http://{}:9000/", lab.server_addr()),
        &["-d", "4s"],
    );
}

#[test]
#[ignore = "needs root; records golden data for crates/diagnose/tests/golden.rs"]
fn record_goldens() {
    std::fs::create_dir_all(golden_dir()).expect("golden dir");
    {
        let lab = Lab::up(&LabOptions::new(&name("ngx"))).expect("lab up");
        record("nginx-latency", &lab.latency_url(), &[]);
        record("nginx-good", &lab.good_url(), &["-d", "4s"]);
    }
    let nagle = ServeOptions {
        nodelay: false,
        split_writes: true,
        ..ServeOptions::default()
    };
    builtin("builtin-nagle-split-writes", nagle, |_| {});
    let think = |ms| ServeOptions {
        think: Duration::from_millis(ms),
        ..ServeOptions::default()
    };
    builtin("builtin-think-25ms", think(25), |_| {});
    builtin("builtin-think-5ms", think(5), |_| {});
    let cork = ServeOptions {
        cork: true,
        ..ServeOptions::default()
    };
    builtin("builtin-cork", cork, |_| {});
    builtin("builtin-drop-3pct", ServeOptions::default(), |lab| {
        lab.drop_percent(3).expect("nft drop");
    });
    let big = ServeOptions {
        body_size: 32 * 1024,
        ..ServeOptions::default()
    };
    builtin("builtin-tbf-queue", big, |lab| {
        lab.shape(100_000_000, 32_000, 4_000_000).expect("tbf");
    });
    // A slow bottleneck that TCP fills: the response's transfer time dominates.
    let paced = ServeOptions {
        body_size: 100 * 1024,
        ..ServeOptions::default()
    };
    builtin("builtin-tbf-10mbit-100kb", paced, |lab| {
        lab.shape(10_000_000, 32_000, 200_000).expect("tbf");
    });
    builtin("builtin-healthy", ServeOptions::default(), |_| {});
    {
        let lab = Lab::up(&LabOptions::new(&name("closed")).server(ServerKind::Builtin)).unwrap();
        record(
            "closed-port",
            &format!("http://{}:9/", lab.server_addr()),
            &[],
        );
        let st = lab.state();
        let mask = u32::MAX << (32 - u32::from(st.prefix_len));
        let silent = std::net::Ipv4Addr::from(u32::from(lab.server_addr()) & mask);
        record("silent-address", &format!("http://{silent}:8080/"), &[]);
        record(
            "https-to-plain-http",
            &format!("https://{}:{}/", lab.server_addr(), lagtrace_lab::GOOD_PORT),
            &[],
        );
    }
}
