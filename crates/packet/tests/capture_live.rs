//! Live capture on a veth into a namespace this test creates, cross-checked with tshark
//! reading the file the same capture wrote. Needs root (CAP_NET_RAW, CAP_SYS_ADMIN).

use std::time::{Duration, Instant};

use etherparse::{LaxSlicedPacket, TransportSlice};
use lagtrace_packet::capture::{Capture, CaptureOptions, CapturedPacket, FileFormat, StopReason};
use lagtrace_testkit::ns_lab::NsLab;
use lagtrace_testkit::tshark_fields_first as tshark_fields;

const REPLY: usize = 3000;

/// (frame length, tcp.flags as tshark prints it) of an Ethernet frame.
fn len_flags(p: &CapturedPacket) -> (String, String) {
    assert_eq!(p.linktype, 1, "veth captures are Ethernet");
    let s = LaxSlicedPacket::from_ethernet(&p.data).expect("ethernet frame");
    let flags = match s.transport {
        Some(TransportSlice::Tcp(t)) => {
            let h = t.header_slice();
            (u16::from(h[12] & 0x0f) << 8) | u16::from(h[13])
        }
        other => panic!("filter let a non-TCP packet through: {other:?}"),
    };
    (p.orig_len.to_string(), format!("0x{flags:04x}"))
}

fn opts(lab: &NsLab, out: Option<std::path::PathBuf>, format: FileFormat) -> CaptureOptions {
    CaptureOptions {
        iface: lab.host_iface.clone(),
        filter: Some(format!("tcp port {}", lab.port)),
        output: out,
        format,
        ..CaptureOptions::default()
    }
}

#[test]
#[ignore = "needs root"]
fn capture_matches_tshark_on_the_written_file() {
    matches_tshark(false);
}

#[test]
#[ignore = "needs root"]
fn capture_in_immediate_mode_matches_tshark_too() {
    matches_tshark(true);
}

fn matches_tshark(immediate: bool) {
    let lab = NsLab::up(if immediate { "imm" } else { "match" }, REPLY);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.pcap");
    let mut o = opts(&lab, Some(file.clone()), FileFormat::Pcap);
    o.immediate = immediate;
    let (h, rx) = Capture::start_channel(&o).unwrap();
    for _ in 0..3 {
        assert_eq!(lab.exchange(), REPLY);
    }
    // Stop right away: what the kernel already holds must still be drained.
    let st = h.stop().unwrap();
    let pkts: Vec<CapturedPacket> = rx.try_iter().collect();
    assert_eq!(st.stop_reason, StopReason::Stopped);
    assert_eq!(st.captured as usize, pkts.len());
    let ts = tshark_fields(&file, None, &["frame.len", "tcp.flags", "frame.time_epoch"]);
    assert_eq!(ts.len(), pkts.len(), "tshark frame count vs ours");
    for (i, (p, t)) in pkts.iter().zip(&ts).enumerate() {
        let (len, flags) = len_flags(p);
        assert_eq!((&len, &flags), (&t[0], &t[1]), "frame {}", i + 1);
        // Nanosecond timestamps in the file equal the ones handed to the channel.
        let want = format!("{}.{:09}", p.ts_ns / 1_000_000_000, p.ts_ns % 1_000_000_000);
        assert_eq!(t[2], want, "frame {} time", i + 1);
    }
    // The traffic really is there: three handshakes, three replies of REPLY bytes.
    let syns = pkts.iter().filter(|p| len_flags(p).1 == "0x0002").count();
    let synacks = pkts.iter().filter(|p| len_flags(p).1 == "0x0012").count();
    assert_eq!((syns, synacks), (3, 3), "{ts:?}");
    let payload = tshark_fields(
        &file,
        Some(&format!("tcp.srcport == {}", lab.port)),
        &["tcp.len"],
    );
    let sent: usize = payload.iter().map(|r| r[0].parse::<usize>().unwrap()).sum();
    assert_eq!(sent, 3 * REPLY);
}

#[test]
#[ignore = "needs root"]
fn netns_capture_sees_the_traffic_inside_the_namespace() {
    let lab = NsLab::up("netns", 500);
    let o = CaptureOptions {
        iface: lab.ns_iface.clone(),
        netns: lab.netns(),
        filter: Some(format!("tcp port {}", lab.port)),
        ..CaptureOptions::default()
    };
    // The namespace's interface does not exist out here.
    let err = Capture::start(
        &CaptureOptions {
            iface: lab.ns_iface.clone(),
            ..CaptureOptions::default()
        },
        None,
    )
    .err()
    .expect("the namespace's interface is not visible outside it");
    assert!(err.to_string().contains(&lab.ns_iface), "{err}");
    let (h, rx) = Capture::start_channel(&o).unwrap();
    assert_eq!(lab.exchange(), 500);
    let st = h.stop().unwrap();
    let pkts: Vec<_> = rx.try_iter().collect();
    assert!(st.captured >= 5, "{st:?}");
    // The SYN arrives at the server's address, from the client's.
    let syn = pkts
        .iter()
        .find(|p| len_flags(p).1 == "0x0002")
        .expect("the SYN was captured inside the namespace");
    let s = LaxSlicedPacket::from_ethernet(&syn.data).unwrap();
    match s.net {
        Some(etherparse::LaxNetSlice::Ipv4(v4)) => {
            assert_eq!(v4.header().destination_addr(), lab.server);
            assert_eq!(v4.header().source_addr(), lab.client);
        }
        other => panic!("not IPv4: {other:?}"),
    }
}

#[test]
#[ignore = "needs root"]
fn count_stops_at_exactly_count() {
    let lab = NsLab::up("count", REPLY);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.pcap");
    let mut o = opts(&lab, Some(file.clone()), FileFormat::Pcap);
    o.count = Some(7);
    let h = Capture::start(&o, None).unwrap();
    // Each exchange is at least 9 packets; make traffic until the capture ends by itself.
    let t0 = Instant::now();
    while !h.is_finished() && t0.elapsed() < Duration::from_secs(20) {
        lab.exchange();
    }
    let st = h.wait().unwrap();
    assert_eq!(st.stop_reason, StopReason::Count);
    assert_eq!(st.captured, 7);
    assert_eq!(tshark_fields(&file, None, &["frame.number"]).len(), 7);
}

#[test]
#[ignore = "needs root"]
fn duration_stops_by_itself_on_a_quiet_interface() {
    let lab = NsLab::up("dur", 10);
    let mut o = opts(&lab, None, FileFormat::Pcap);
    o.duration = Some(Duration::from_millis(700));
    let t0 = Instant::now();
    let h = Capture::start(&o, None).unwrap();
    let st = h.wait().unwrap();
    let took = t0.elapsed();
    assert_eq!(st.stop_reason, StopReason::Duration);
    assert_eq!(st.captured, 0);
    assert!(took >= Duration::from_millis(700), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
#[ignore = "needs root"]
fn stop_is_prompt_on_a_quiet_interface() {
    let lab = NsLab::up("stop", 10);
    let h = Capture::start(&opts(&lab, None, FileFormat::Pcap), None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let st = h.stop().unwrap();
    assert_eq!(st.stop_reason, StopReason::Stopped);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
#[ignore = "needs root"]
fn pcapng_output_reads_in_tshark_with_the_same_packets_and_times() {
    let lab = NsLab::up("ng", REPLY);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.pcapng");
    let (h, rx) =
        Capture::start_channel(&opts(&lab, Some(file.clone()), FileFormat::Pcapng)).unwrap();
    lab.exchange();
    lab.exchange();
    let st = h.stop().unwrap();
    let pkts: Vec<_> = rx.try_iter().collect();
    assert!(st.captured >= 10, "{st:?}");
    let ts = tshark_fields(
        &file,
        None,
        &[
            "frame.len",
            "tcp.flags",
            "frame.time_epoch",
            "frame.interface_name",
        ],
    );
    assert_eq!(ts.len(), pkts.len());
    for (i, (p, t)) in pkts.iter().zip(&ts).enumerate() {
        let (len, flags) = len_flags(p);
        assert_eq!((&len, &flags), (&t[0], &t[1]), "frame {}", i + 1);
        let want = format!("{}.{:09}", p.ts_ns / 1_000_000_000, p.ts_ns % 1_000_000_000);
        assert_eq!(t[2], want, "frame {} time", i + 1);
        assert_eq!(t[3], lab.host_iface);
    }
    let kind = std::process::Command::new("capinfos")
        .arg("-t")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&kind.stdout).contains("pcapng"),
        "{}",
        String::from_utf8_lossy(&kind.stdout)
    );
}

#[test]
#[ignore = "needs root"]
fn bad_filter_and_missing_interface_are_one_line_errors() {
    let lab = NsLab::up("bad", 10);
    let mut o = opts(&lab, None, FileFormat::Pcap);
    o.filter = Some("tcp port".into());
    let e = format!("{:#}", Capture::start(&o, None).err().unwrap());
    assert!(
        e.contains("bad filter") && e.contains("syntax error"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    let o = CaptureOptions {
        iface: format!("lcx{}", std::process::id()),
        ..CaptureOptions::default()
    };
    let e = format!("{:#}", Capture::start(&o, None).err().unwrap());
    assert!(e.contains("no interface named"), "{e}");
    let o = CaptureOptions {
        netns: lagtrace_netns::NetNs::Named("lagtrace-cap-no-such-ns".into()),
        ..CaptureOptions::default()
    };
    let e = format!("{:#}", Capture::start(&o, None).err().unwrap());
    assert!(e.contains("lagtrace-cap-no-such-ns"), "{e}");
}

#[test]
#[ignore = "needs root"]
fn snaplen_cuts_the_bytes_but_keeps_the_wire_length() {
    let lab = NsLab::up("snap", REPLY);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.pcap");
    let mut o = opts(&lab, Some(file.clone()), FileFormat::Pcap);
    o.snaplen = 100;
    let (h, rx) = Capture::start_channel(&o).unwrap();
    lab.exchange();
    h.stop().unwrap();
    let pkts: Vec<_> = rx.try_iter().collect();
    let ts = tshark_fields(&file, None, &["frame.len", "frame.cap_len"]);
    assert_eq!(ts.len(), pkts.len());
    let mut cut = 0;
    for (p, t) in pkts.iter().zip(&ts) {
        assert!(p.data.len() <= 100);
        assert_eq!(t[0], p.orig_len.to_string());
        assert_eq!(t[1], p.data.len().to_string());
        if p.orig_len as usize > p.data.len() {
            cut += 1;
        }
    }
    // The 3000-byte reply was cut (offloaded: possibly one large segment).
    assert!(cut >= 1, "{ts:?}");
}
