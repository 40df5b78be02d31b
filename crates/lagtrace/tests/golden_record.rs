//! Records the golden diagnoses that `crates/diagnose/tests/golden.rs` replays through the
//! pure rules: `lagtrace diagnose URL --json` against real lab servers, one per builtin fault
//! and case. Ignored: it needs root, takes a minute or two, and its output is data to review
//! and commit, not a pass/fail check. Run it when the evidence model changes:
//!
//! ```text
//! LAGTRACE_RECORD_GOLDEN=all cargo test --release -p lagtrace --test golden_record -- --ignored
//! ```
//! `LAGTRACE_RECORD_GOLDEN=nginx-limit-rate,python-backlog` records only those. Without it
//! nothing is recorded (a `--include-ignored` test run must not rewrite committed data).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lagtrace_lab::serve::ServeOptions;
use lagtrace_lab::{Lab, LabOptions, ServerKind};

use common::{BIN, Foreground};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diagnose/tests/golden")
}

fn name(test: &str) -> String {
    format!("gr{test}{}", std::process::id())
}

/// Whether `LAGTRACE_RECORD_GOLDEN` (`all`, or a comma-separated list) names `golden`.
fn wanted(golden: &str) -> bool {
    std::env::var("LAGTRACE_RECORD_GOLDEN")
        .is_ok_and(|v| v == "all" || v == "1" || v.split(',').any(|n| n == golden))
}

/// Starts `CMD ARGS` in the lab's namespace (in `dir`) and waits until `port` answers.
fn in_lab(lab: &Lab, dir: &Path, cmd: &[&str], port: u16) -> Foreground {
    common::start_in_lab(lab, dir, cmd, port)
}

/// Runs `lagtrace diagnose URL --json -q ARGS` and writes its stdout to golden/NAME.json.
fn record(golden: &str, url: &str, args: &[&str]) {
    if !wanted(golden) {
        return;
    }
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
    if !wanted(golden) {
        return;
    }
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
    if std::env::var_os("LAGTRACE_RECORD_GOLDEN").is_none() {
        eprintln!("golden_record: LAGTRACE_RECORD_GOLDEN is not set; nothing recorded");
        return;
    }
    rate_limited_and_backlog();
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

/// nginx with `limit_rate 400k` (a paced response) and `python3 -m http.server` (listen
/// backlog 5: connections refused under load), as in tests/diagnose.rs.
fn rate_limited_and_backlog() {
    if !wanted("nginx-limit-rate") && !wanted("python-backlog") {
        return;
    }
    let lab = Lab::up(&LabOptions::new(&name("rate")).server(ServerKind::Builtin)).expect("lab");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    std::fs::write(dir.path().join("big.bin"), vec![b'x'; 100 * 1024]).expect("big.bin");
    std::fs::write(dir.path().join("index.html"), "hello\n").expect("index.html");
    let conf = format!(
        "daemon off; master_process off; pid {d}/nginx.pid; error_log {d}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{ access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/px;\n\
         fastcgi_temp_path {d}/fc; uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
         server {{ listen 9002; root {d}; limit_rate 400k; }} }}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).expect("nginx.conf");
    if wanted("nginx-limit-rate") {
        let conf = format!("{d}/nginx.conf");
        let _nginx = in_lab(&lab, dir.path(), &["nginx", "-p", &d, "-c", &conf], 9002);
        let url = format!("http://{}:9002/big.bin", lab.server_addr());
        record("nginx-limit-rate", &url, &["-d", "3s", "-c", "4"]);
    }
    if wanted("python-backlog") {
        let cmd = ["python3", "-m", "http.server", "9003", "--bind", "0.0.0.0"];
        let _py = in_lab(&lab, dir.path(), &cmd, 9003);
        let url = format!("http://{}:9003/", lab.server_addr());
        record("python-backlog", &url, &["-d", "3s"]);
    }
}
