//! What the `analyze*` integration tests share beyond the test kit (`lagtrace-testkit`):
//! a tiny HTTP helper and the `lagtrace analyze --json` wrapper. Not every test file uses
//! every item.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

/// Reads one HTTP request head; false on EOF or error.
pub fn read_request(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    true
}

/// `lagtrace analyze --json file`; exit 1 means "findings", 2 would be an error.
pub fn analyze_json(file: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lagtrace"))
        .args(["analyze", "--json"])
        .arg(file)
        .output()
        .unwrap();
    assert_ne!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (kind, transaction, cost µs) of every finding in an analysis JSON.
pub fn kinds(an: &serde_json::Value) -> Vec<(String, u64, u64)> {
    an["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["transaction"].as_u64().unwrap_or(u64::MAX),
                f["cost_us"].as_u64().unwrap(),
            )
        })
        .collect()
}
