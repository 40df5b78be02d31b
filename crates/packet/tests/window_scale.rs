//! Window scale per side: known, bounded or unknown (issue 36), on real frames — the
//! repository's captures, whole and cut at points along their length (a capture started
//! there: no handshake for the connections already open).
//!
//! Whole, every stream whose two SYNs are in the file knows both scales, as the SYNs say.
//! Cut, a stream without its SYNs never claims a known scale, and a bound inferred from the
//! bytes in flight never exceeds the true shift (what the whole file's SYNs say): it is a
//! lower bound, or the window-full rule built on it would name windows that were not full.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use lagtrace_model::analyze::{Analysis, WindowScale};
use lagtrace_packet::{AnalyzeOptions, Analyzer, CaptureReader, ReadEvent};

fn captures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let mut v = Vec::new();
    for dir in ["case", "golden"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "pcap") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

/// The analysis of `path` from frame `skip + 1` on, as a capture started there sees it.
fn analyze_from(path: &Path, skip: u64) -> Analysis {
    let f = std::fs::File::open(path).unwrap();
    let mut r = CaptureReader::new(std::io::BufReader::new(f)).unwrap();
    let mut an = Analyzer::new(AnalyzeOptions::default());
    let mut n = 0;
    while let Some(ev) = r.next() {
        if let ReadEvent::Frame(f) = ev {
            n += 1;
            if n > skip {
                an.push_frame(&f);
            }
        }
    }
    an.finish()
}

/// Each endpoint's window scale, by (endpoint, peer).
fn scales(a: &Analysis) -> HashMap<(SocketAddr, SocketAddr), (WindowScale, bool)> {
    let mut m = HashMap::new();
    for st in &a.streams {
        let seen = st.syn_a.is_some() && st.syn_b.is_some();
        m.insert((st.a, st.b), (st.scale_a, seen));
        m.insert((st.b, st.a), (st.scale_b, seen));
    }
    m
}

#[test]
fn both_syns_give_the_scales_they_announce() {
    let mut checked = 0;
    for p in captures() {
        let a = analyze_from(&p, 0);
        for st in a.streams.iter() {
            let (Some(sa), Some(sb)) = (st.syn_a, st.syn_b) else {
                continue;
            };
            let agreed = sa.wscale.is_some() && sb.wscale.is_some();
            let want = |s: Option<u8>| WindowScale::Known {
                shift: if agreed { s.unwrap_or(0) } else { 0 },
            };
            assert_eq!(st.scale_a, want(sa.wscale), "{}: {st:?}", p.display());
            assert_eq!(st.scale_b, want(sb.wscale), "{}: {st:?}", p.display());
            checked += 1;
        }
        assert_eq!(a.mid_connection_streams, {
            a.streams
                .iter()
                .filter(|s| s.syn_a.is_none() && s.syn_b.is_none())
                .count() as u64
        });
    }
    assert!(checked >= 10, "{checked} streams with both SYNs");
}

#[test]
fn a_cut_capture_bounds_the_scale_from_below_and_never_claims_it() {
    let (mut bounded, mut unknown) = (0, 0);
    for p in captures() {
        let whole = analyze_from(&p, 0);
        let truth = scales(&whole);
        let frames = whole.frames;
        for skip in [3, 6, 12, frames / 5, frames / 3, frames / 2, 2 * frames / 3] {
            let cut = analyze_from(&p, skip);
            for st in cut.streams.iter() {
                if st.syn_a.is_some() || st.syn_b.is_some() {
                    continue;
                }
                for (me, peer, got) in [(st.a, st.b, st.scale_a), (st.b, st.a, st.scale_b)] {
                    let where_ = format!("{} from frame {}: {me} ({got:?})", p.display(), skip + 1);
                    match got {
                        WindowScale::Known { .. } => panic!("{where_}: known without a SYN"),
                        WindowScale::Bounded { at_least } => {
                            bounded += 1;
                            if let Some((WindowScale::Known { shift }, true)) =
                                truth.get(&(me, peer))
                            {
                                assert!(
                                    at_least <= *shift,
                                    "{where_}: bound {at_least} above the SYN's shift {shift}"
                                );
                            }
                        }
                        WindowScale::Unknown => unknown += 1,
                    }
                }
            }
        }
    }
    // Neither state is vacuous on these captures.
    assert!(
        bounded > 0 && unknown > 0,
        "bounded {bounded}, unknown {unknown}"
    );
}
