//! `diagnose --pcap` on a capture that holds the server's own connections too (a capture on
//! `any` in the server's namespace, or on its loopback as well as its client-facing
//! interface): the hops behind the server, found from the packets alone.
//!
//! With no process to ask, a peer is a hop when
//! 1. the server's host connected to it: the connecting side's address is one the server's
//!    clients reached it at, or a loopback one (the side that sent the SYN, or the first
//!    request of a connection the capture joined midway); and
//! 2. its exchanges happen inside the server's requests: at least [`NESTED_SHARE`] of them
//!    (and [`MIN_EXCHANGES`]) sent after some request's first byte arrived and answered
//!    before that request's response left — the join of a live run, read the other way.
//!
//! Every stream to such a peer goes through the same TCP analysis, and the rules judge it as
//! they judge a hop a live run captured. What a saved capture cannot tell is said in the
//! hop's packet limits: the processes at either end, the peer's sockets and listener; and
//! hops behind the first (a peer's own upstreams) are not followed.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use lagtrace_model::analyze::{Analysis, TxnTiming};
use lagtrace_model::diagnosis::evidence::{HopEvidence, ServerProcess};
use lagtrace_packet::wire::decode;
use lagtrace_packet::{Analyzer, CaptureReader, Frame, ReadEvent};

use crate::evidence::Layer;
use crate::run::{JOIN_STRETCH, Timings};

/// At most this many peers are analysed (those the server's host connected to most).
const MAX_PCAP_HOPS: usize = 8;
/// The share of a peer's exchanges that must lie inside the server's requests.
const NESTED_SHARE: f64 = 0.9;
/// A peer with fewer exchanges than this is not judged a hop (too few to tell).
const MIN_EXCHANGES: usize = 3;

/// Reads every frame of `path` (until `stop`) into `each`; false when the file cannot be read.
fn each_frame(path: &Path, stop: &AtomicBool, mut each: impl FnMut(&Frame<'_>)) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(mut reader) = CaptureReader::new(std::io::BufReader::new(f)) else {
        return false;
    };
    while let Some(ev) = reader.next() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if let ReadEvent::Frame(f) = ev {
            each(&f);
        }
    }
    true
}

/// The server's requests as time windows (absolute µs), sorted by start, with the latest
/// end of any window starting at or before each one: an exchange `[s, e]` lies inside some
/// request iff the latest end among the windows starting by `s` is at least `e`.
struct Windows {
    starts: Vec<i64>,
    max_end: Vec<i64>,
}

impl Windows {
    /// From the server's timings (µs since `first_ts_ns`, its analysis's first packet).
    fn new(first_ts_ns: i64, timings: &[TxnTiming]) -> Windows {
        let base = first_ts_ns / 1000;
        let mut w: Vec<(i64, i64)> = timings
            .iter()
            .filter_map(|t| Some((t.request_first_at_us?, t.response_last_at_us?)))
            .map(|(s, e)| (base + s, base + e))
            .collect();
        w.sort_unstable();
        let mut max_end = Vec::with_capacity(w.len());
        let mut m = i64::MIN;
        for &(_, e) in &w {
            m = m.max(e);
            max_end.push(m);
        }
        Windows {
            starts: w.into_iter().map(|(s, _)| s).collect(),
            max_end,
        }
    }

    /// Of a hop's complete exchanges (µs since `first_ts_ns`, its analysis's first packet)
    /// that end by `horizon` (absolute µs; all when None): how many lie inside a request,
    /// and how many there are.
    fn nested(
        &self,
        first_ts_ns: i64,
        timings: &[TxnTiming],
        horizon: Option<i64>,
    ) -> (usize, usize) {
        let base = first_ts_ns / 1000;
        let mut n = (0, 0);
        for t in timings {
            let (Some(s), Some(e)) = (t.request_first_at_us, t.response_last_at_us) else {
                continue;
            };
            let (s, e) = (base + s, base + e);
            if horizon.is_some_and(|h| e > h) {
                continue;
            }
            n.1 += 1;
            let i = self.starts.partition_point(|&x| x <= s);
            if i > 0 && self.max_end[i - 1] >= e {
                n.0 += 1;
            }
        }
        n
    }
}

/// The end (absolute µs) of the server's stretch whose requests are all in `front`'s
/// timings: its analysis keeps its first [`JOIN_STRETCH`] transactions whole and a sample of
/// the rest, and an exchange lies inside *some* request only among all the requests in
/// progress. None when every transaction is kept.
fn horizon(front: &Analysis) -> Option<i64> {
    let seen = front.timing_keep.as_ref().map_or(0, |k| k.seen);
    if seen <= JOIN_STRETCH as u64 {
        return None;
    }
    let mut ends: Vec<i64> = front
        .timings
        .iter()
        .filter_map(|t| t.response_last_at_us)
        .collect();
    // The first stretch's transactions are all among the timings: the JOIN_STRETCH-th
    // earliest end is (about) where it stops.
    let n = JOIN_STRETCH.min(ends.len()).checked_sub(1)?;
    let (_, &mut h, _) = ends.select_nth_unstable(n);
    Some(front.first_ts_ns / 1000 + h)
}

/// The analyzer's options for the server's side and each hop's in a capture that may hold
/// hops: the passive bounds, and the first [`JOIN_STRETCH`] transactions kept whole (see
/// [`horizon`]).
pub(crate) fn analyze_options() -> lagtrace_packet::AnalyzeOptions {
    lagtrace_packet::AnalyzeOptions {
        keep_first: JOIN_STRETCH,
        ..crate::passive::analyze_options()
    }
}

/// The hops behind the server at `port` in the capture `path`, given the analysis of the
/// server's own traffic (`front`), each with its timed exchanges for the per-request join
/// ([`crate::join::upstream`]; one capture, one clock). Empty when the capture holds no
/// connection the server's host opened whose exchanges lie inside its requests.
pub(crate) fn find(
    path: &Path,
    port: u16,
    addr: Option<IpAddr>,
    front: &Analysis,
    stop: &AtomicBool,
) -> (Vec<HopEvidence>, Vec<Option<Timings>>) {
    // The addresses the server's clients reached it at.
    let servers: Vec<IpAddr> = {
        let mut v: Vec<IpAddr> = front
            .timings
            .iter()
            .map(|t| t.server.ip().to_canonical())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    if servers.is_empty() {
        return Default::default();
    }
    let the_server = |ip: IpAddr, p: u16| {
        p == port && addr.is_none_or(|a| a.to_canonical() == ip.to_canonical())
    };
    let from_server_host =
        |ip: IpAddr| ip.is_loopback() || servers.binary_search(&ip.to_canonical()).is_ok();
    // 1. The peers the server's host opened connections to: every other TCP stream analysed
    //    once, its client and server told apart by its handshake, or — a keep-alive pool
    //    opened before the capture began — by who sent the first request. (Counting SYNs
    //    alone missed such a pool: a second capture of the same nginx found no hop.)
    let mut others = Analyzer::new(crate::passive::analyze_options());
    let read = each_frame(path, stop, |f| {
        let other = decode(f.linktype, f.data)
            .is_ok_and(|s| !the_server(s.dst, s.dport) && !the_server(s.src, s.sport));
        if other {
            others.push_frame(f);
        } else {
            others.push_skipped();
        }
    });
    if !read {
        return Default::default();
    }
    let mut exchanges: BTreeMap<SocketAddr, u32> = BTreeMap::new();
    for t in &others.finish().timings {
        if from_server_host(t.client.ip()) {
            *exchanges.entry(t.server).or_default() += 1;
        }
    }
    if exchanges.is_empty() {
        return Default::default();
    }
    let mut peers: Vec<(u32, SocketAddr)> = exchanges.into_iter().map(|(p, n)| (n, p)).collect();
    peers.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    peers.truncate(MAX_PCAP_HOPS);
    // 2. Each peer's streams through the same analysis (frame numbers stay the file's).
    let mut analyzers: Vec<(SocketAddr, Analyzer)> = peers
        .iter()
        .map(|&(_, p)| (p, Analyzer::new(analyze_options())))
        .collect();
    each_frame(path, stop, |f| {
        let hit = decode(f.linktype, f.data).ok().and_then(|s| {
            analyzers.iter().position(|(p, _)| {
                (s.dst == p.ip() && s.dport == p.port()) || (s.src == p.ip() && s.sport == p.port())
            })
        });
        for (i, (_, a)) in analyzers.iter_mut().enumerate() {
            if Some(i) == hit {
                a.push_frame(f);
            } else {
                a.push_skipped();
            }
        }
    });
    // 3. The hops: the peers whose exchanges lie inside the server's requests.
    let windows = Windows::new(front.first_ts_ns, &front.timings);
    let horizon = horizon(front);
    let point = format!("file {}", path.display());
    analyzers
        .into_iter()
        .filter_map(|(peer, an)| {
            let a = an.finish();
            let (nested, of) = windows.nested(a.first_ts_ns, &a.timings, horizon);
            if of < MIN_EXCHANGES || (nested as f64) < NESTED_SHARE * of as f64 {
                return None;
            }
            let mut ev = crate::adapters::packets::evidence(&a, point.clone(), 0, false);
            ev.limits.push(format!(
                "a hop found in the capture alone: the server's host connected to {peer}, and \
                 {nested} of its {of} exchanges lie inside the server's requests; the processes \
                 at either end, the peer's sockets and listener, and hops behind it are not in a \
                 saved capture"
            ));
            let hop = HopEvidence {
                depth: 1,
                via: None,
                from: ServerProcess {
                    pid: 0,
                    comm: "server".into(),
                    netns: "capture".into(),
                },
                peer: peer.to_string(),
                to: None,
                service: crate::hops::service_name(peer.port()).map(str::to_string),
                connections: a.streams.len() as u32,
                packets: Layer::ran(ev),
                sockets: Layer::skipped(
                    "--pcap: a saved capture has no sockets; run --passive on the server's host \
                     for them",
                ),
                listener: None,
                join: None,
            };
            let timed = Timings {
                base_us: a.first_ts_ns / 1000,
                timings: a.timings,
                of_record: Vec::new(),
            };
            Some((hop, Some(timed)))
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(s: i64, e: i64) -> TxnTiming {
        TxnTiming {
            stream: 0,
            index: 0,
            client: "127.0.0.1:40000".parse().unwrap(),
            server: "127.0.0.1:80".parse().unwrap(),
            syn_at_us: None,
            syn_retransmits: 0,
            synack_at_us: None,
            request_first_at_us: Some(s),
            request_last_at_us: Some(s),
            response_first_at_us: Some(e),
            response_last_at_us: Some(e),
            server_path_us: 0,
            hold_request_us: 0,
            hold_response_us: 0,
            loss_request_us: 0,
            loss_response_us: 0,
            kinds: Vec::new(),
            weight: 1.0,
        }
    }

    fn timings(w: &[(i64, i64)]) -> Vec<TxnTiming> {
        w.iter().map(|&(s, e)| timing(s, e)).collect()
    }

    #[test]
    fn an_exchange_is_nested_when_a_request_that_began_before_it_ends_after_it() {
        // Requests [0, 100] and [50, 300] (µs); the hop's capture began 1 ms later.
        let w = Windows::new(0, &timings(&[(50, 300), (0, 100)]));
        // The hop's analysis began 1 ms before the server's: its times for the same instant
        // are 1 000 µs larger.
        let early = timings(&[(1_010, 1_090), (1_060, 1_290), (1_290, 1_310)]);
        // [10, 90] inside the first; [60, 290] inside the second; [290, 310] ends after all.
        assert_eq!(w.nested(-1_000_000, &early, None), (2, 3));
        // Past the horizon (the end of the stretch whose requests are all kept), nothing
        // is judged: only [10, 90] ends by 100.
        assert_eq!(w.nested(-1_000_000, &early, Some(100)), (1, 1));
        // Nothing before the first request's start.
        assert_eq!(w.nested(0, &timings(&[(-5, 20)]), None), (0, 1));
        // An open exchange (no response) is not counted at all.
        let mut open = timings(&[(10, 20)]);
        open[0].response_last_at_us = None;
        assert_eq!(w.nested(0, &open, None), (0, 0));
    }
}
