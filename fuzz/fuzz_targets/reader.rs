//! Any bytes as a capture file: the reader and the analyzer must not panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = lagtrace_packet::AnalyzeOptions {
        keep_stream: Some(0),
        ..Default::default()
    };
    let _ = lagtrace_packet::analyze_reader(data, &opts);
});
