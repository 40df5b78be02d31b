//! Fuzzes what the agent and its client parse from the network: the session request body
//! (agent side) and the pcap whose timestamps the client shifts (client side).
//! Run: `cd fuzz && cargo +nightly fuzz run agent_request -- -max_total_time=300`
//!
//! Invariants: no panic on any input; an accepted request has a port >= 1 and a window in
//! bounds, and re-encodes to a body that parses to the same request; a pcap shifted by d
//! and back by -d is unchanged whenever no timestamp was clamped at zero.
#![no_main]

use lagtrace_agent::pcap::shift;
use lagtrace_agent::proto::{MAX_BODY, parse_session_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_session_request(data, 600_000) {
        Ok(r) => {
            assert!(r.port >= 1 && (100..=600_000).contains(&r.window_ms));
            assert!(data.len() <= MAX_BODY);
            let again = serde_json::to_vec(&r).unwrap();
            assert_eq!(parse_session_request(&again, 600_000).unwrap(), r);
        }
        Err(e) => assert!(matches!(e.status, 400 | 413), "{e}"),
    }
    let mut p = data.to_vec();
    // Forward by a second, then back: nothing is clamped going forward first.
    if shift(&mut p, 1_000_000_000).is_ok() {
        let forward = p.clone();
        shift(&mut p, -1_000_000_000).expect("a shifted pcap stays a pcap");
        let mut again = p.clone();
        shift(&mut again, 1_000_000_000).expect("a shifted pcap stays a pcap");
        assert_eq!(again, forward);
    }
});
