//! Tracking state follows the connections alive in the capture, not the capture's length.

use lagtrace_packet::{AnalyzeOptions, Analyzer};

/// Ethernet + IPv4 + TCP frame (no options) from client port `cport` to 10.0.0.2:80 or back.
fn frame(cport: u16, to_server: bool, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = (20 + 20 + payload.len()) as u16;
    let (src, dst) = if to_server {
        ([10, 0, 0, 1], [10, 0, 0, 2])
    } else {
        ([10, 0, 0, 2], [10, 0, 0, 1])
    };
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    let (sp, dp) = if to_server { (cport, 80) } else { (80, cport) };
    f.extend_from_slice(&sp.to_be_bytes());
    f.extend_from_slice(&dp.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&ack.to_be_bytes());
    f.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend_from_slice(payload);
    f
}

#[test]
fn closed_streams_are_freed_after_lingering() {
    let mut an = Analyzer::new(AnalyzeOptions::default());
    let (syn, ack, fin, psh) = (0x02, 0x10, 0x01, 0x08);
    let req = b"GET / HTTP/1.1\r\n\r\n";
    let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    let mut max_live = 0;
    // One short connection per second for 20 minutes.
    for c in 0..1200u32 {
        let t0 = 1_000_000_000_000_000_000i64 + i64::from(c) * 1_000_000_000;
        let port = 10_000 + (c % 50_000) as u16;
        let (cs, ss) = (1000u32, 5000u32);
        let rl = req.len() as u32;
        let pl = resp.len() as u32;
        let pkts = [
            frame(port, true, cs, 0, syn, b""),
            frame(port, false, ss, cs + 1, syn | ack, b""),
            frame(port, true, cs + 1, ss + 1, ack, b""),
            frame(port, true, cs + 1, ss + 1, ack | psh, req),
            frame(port, false, ss + 1, cs + 1 + rl, ack | psh, resp),
            frame(port, true, cs + 1 + rl, ss + 1 + pl, ack | fin, b""),
            frame(port, false, ss + 1 + pl, cs + 2 + rl, ack | fin, b""),
            frame(port, true, cs + 2 + rl, ss + 2 + pl, ack, b""),
        ];
        for (k, p) in pkts.iter().enumerate() {
            an.push(t0 + k as i64 * 100_000, p.len() as u32, 1, p);
        }
        max_live = max_live.max(an.live_streams());
    }
    // 120 s of lingering at one connection per second.
    assert!(max_live <= 125, "{max_live} streams held");
    let a = an.finish();
    assert_eq!(a.streams.len(), 1200);
    assert_eq!(a.transactions_total, 1200);
    assert!(a.findings.is_empty(), "{:?}", a.findings.first());
    assert!(
        a.streams
            .iter()
            .all(|s| s.frames_ab == 5 && s.frames_ba == 3)
    );
}
