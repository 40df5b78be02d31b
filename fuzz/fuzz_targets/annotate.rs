//! Fuzzes the pcap/pcapng annotate copier on arbitrary bytes.
//! Run: `cd fuzz && cargo +nightly fuzz run annotate -- -max_total_time=300`
//!
//! Invariants: no panic on any input; whatever is accepted comes out as pcapng that the
//! copier reads back whole (no warnings) with the same number of frames, and annotating
//! that output again is byte-for-byte stable.
#![no_main]

use std::collections::BTreeMap;

use lagtrace_packet::annotate::annotate_stream;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut comments = BTreeMap::new();
    comments.insert(1u64, "first".to_string());
    comments.insert(2, String::new());
    comments.insert(7, "ünïcödé".to_string());
    let mut out = Vec::new();
    let Ok(st) = annotate_stream(data, &mut out, &comments) else {
        return;
    };
    let mut again = Vec::new();
    let st2 = annotate_stream(&out[..], &mut again, &BTreeMap::new())
        .expect("our own pcapng output reads back");
    assert!(st2.warnings.is_empty(), "{:?}", st2.warnings);
    assert_eq!(st2.frames, st.frames);
    assert_eq!(st2.input_format, "pcapng");
    // Copying our pcapng without comments changes nothing.
    assert_eq!(again, out);
});
