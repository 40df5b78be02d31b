//! Any sequence of frames into the TCP tracker. Each frame: 1 byte link-type selector,
//! 2 bytes timestamp step (signed, µs, so time can go backwards), 1 byte length, then bytes.
//! A valid Ethernet/IPv4/TCP header template is xored with the fuzz bytes so that most
//! frames reach the tracker with odd flags, sequence numbers, windows and options.
#![no_main]

use libfuzzer_sys::fuzz_target;

const TEMPLATE: [u8; 66] = [
    0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0, 0, 52, 0, 0, 0x40, 0, 64, 6,
    0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 0x9f, 0x54, 0x1f, 0x90, 0, 0, 0, 100, 0, 0, 0, 0, 0x80, 0x10,
    0xff, 0xff, 0, 0, 0, 0, 1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0,
];
const LINKTYPES: [u32; 8] = [1, 1, 1, 113, 276, 101, 0, 999];

fuzz_target!(|data: &[u8]| {
    let mut an = lagtrace_packet::Analyzer::new(lagtrace_packet::AnalyzeOptions {
        keep_stream: Some(1),
        ..Default::default()
    });
    let mut ts: i64 = 1_000_000_000_000_000;
    let mut d = data;
    while d.len() >= 4 {
        let lt = LINKTYPES[usize::from(d[0] & 7)];
        let step = i64::from(i16::from_le_bytes([d[1], d[2]]));
        let n = usize::from(d[3]).min(d.len() - 4);
        ts += step * 1000;
        let mut frame = TEMPLATE.to_vec();
        for (i, b) in d[4..4 + n].iter().enumerate() {
            if i < frame.len() {
                frame[i] ^= b;
            } else {
                frame.push(*b);
            }
        }
        let len = frame.len() as u32 + u32::from(d[0] >> 3) * 100;
        an.push(ts, len, lt, &frame);
        d = &d[4 + n..];
    }
    let _ = an.finish();
});
