//! The request ⋈ packets join: each per-request record of a load run matched to the
//! transaction the capture saw for it, and its wait decomposed from timestamps.
//!
//! Pure: records and packet timings in, decompositions out. No I/O, no clock.
//!
//! ## Matching
//! A record names its connection by 4-tuple (local and remote address) and its request by
//! index on the connection; the capture names a transaction by stream (4-tuple + SYN) and
//! index on the stream. A 4-tuple seen on one stream only is matched directly. A 4-tuple the
//! capture saw on several streams (the port was reused) is matched, per connection, to the
//! stream whose handshake (or first request) lies nearest the connection's start, once the
//! clock offset is known from the direct matches.
//!
//! ## Clock offset
//! The records count µs on the monotonic clock from a start whose `CLOCK_REALTIME` value
//! they carry; the capture stamps packets with its own clock. The offset θ (capture time −
//! record time of one instant) is not assumed to be zero; every match bounds it, as NTP
//! does with its four timestamps:
//! - the capture sees a request (or a SYN) only after the client began writing (connecting):
//!   `θ ≤ seen − written`;
//! - the client reads a response (completes a handshake) only after the capture saw it:
//!   `θ ≥ seen − read`.
//!
//! θ is the middle of the tightest interval; when the bounds cross (the capture is not on
//! the client's path, or a clock stepped), the median of the matches' own midpoints, and
//! the interval's width says how far to trust it.
//!
//! ## Decomposition (µs, each from two timestamps)
//! On one request's timeline, in the records' clock (capture times less θ):
//! - `connect`: the connection's `connect(2)` to the handshake's end, for the request that
//!   opened it (its SYN retransmissions are listed);
//! - `delivery`: the request's first write to its last byte seen on the wire, less its
//!   holds and losses;
//! - `server`: the request's last byte seen to the response's first byte seen;
//! - `hold`: data held before the wire (Nagle, delayed ACK, cork, window), request and
//!   response, as the packet detectors measured it;
//! - `loss`: waits for retransmissions, request and response;
//! - `transfer`: the response's first byte seen to its last byte seen, less its holds and
//!   losses;
//! - `client_read`: the response's last byte seen to the last byte read: the whole response
//!   had reached the client, which had not read it yet (its own scheduling, a busy CPU);
//! - `unexplained`: what the request waited outside all of these (queued before its write
//!   under `--rate`, between the connect and the first write, or no packets matched) — an
//!   explicit remainder, never folded into a component.

pub mod tail;
pub mod upstream;

use std::collections::HashMap;
use std::net::SocketAddr;

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::TxnTiming;
use lagtrace_model::diagnosis::evidence::RequestJoin;
use lagtrace_model::{RequestRecord, RequestRecords};

/// A request's wait, split by where it went (µs): the evidence model's type.
pub use lagtrace_model::diagnosis::evidence::RequestParts as Parts;

/// One record and what its wait was made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    /// Index into the records.
    pub record: usize,
    /// The matched transaction (index into the timings), when the capture saw it.
    pub timing: Option<usize>,
    /// The decomposition (its SYN retransmissions as the capture saw them, else as the
    /// client's `TCP_INFO` counted, for the request that opened its connection).
    pub parts: Parts,
}

/// The clock offset between the records and the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offset {
    /// Capture time − record time of one instant, µs.
    pub theta_us: i64,
    /// Half the width of the interval it lies in (0 when the bounds crossed: then θ is the
    /// median of the matches' midpoints and `consistent` is false).
    pub uncertainty_us: i64,
    /// Whether the bounds from every match agree.
    pub consistent: bool,
    /// Matches the estimate came from.
    pub from: usize,
}

/// The join of one run's records with one capture's timings.
#[derive(Debug, Clone, PartialEq)]
pub struct Join {
    /// The clock offset, when any record matched.
    pub offset: Option<Offset>,
    /// Records matched to a transaction.
    pub matched: usize,
    /// The capture's last packet on the records' clock (µs), when an offset was estimated.
    pub captured_until_us: Option<u64>,
    /// One per record, in the records' order.
    pub requests: Vec<Joined>,
}

/// A normalised endpoint (IPv4-mapped IPv6 as IPv4).
fn norm(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// The capture's transactions by 4-tuple: stream → index → timing.
type Streams = HashMap<(SocketAddr, SocketAddr), Vec<(u32, HashMap<u32, usize>)>>;

fn streams(timings: &[TxnTiming]) -> Streams {
    let mut m: Streams = HashMap::new();
    for (i, t) in timings.iter().enumerate() {
        let v = m.entry((norm(t.client), norm(t.server))).or_default();
        match v.iter_mut().find(|(s, _)| *s == t.stream) {
            Some((_, idx)) => {
                idx.insert(t.index, i);
            }
            None => v.push((t.stream, HashMap::from([(t.index, i)]))),
        }
    }
    m
}

/// A stream's start on the capture clock, µs since the capture's first packet.
fn stream_start(timings: &[TxnTiming], idx: &HashMap<u32, usize>) -> Option<i64> {
    let t = &timings[*idx.values().next()?];
    t.syn_at_us.or_else(|| {
        idx.values()
            .filter_map(|&i| timings[i].request_first_at_us)
            .min()
    })
}

/// The bounds one match puts on θ (µs): (lower, upper), each when known. `base` converts a
/// record time to the capture's time line (µs since its first packet) at θ = 0.
fn bounds(r: &RequestRecord, t: &TxnTiming, base: i64) -> (Option<i64>, Option<i64>) {
    let rec = |v: u64| base + i64::try_from(v).unwrap_or(i64::MAX / 2);
    let mut lo: Option<i64> = None;
    let mut hi: Option<i64> = None;
    let mut low = |v: i64| lo = Some(lo.map_or(v, |l| l.max(v)));
    if let (Some(seen), Some(read)) = (t.response_first_at_us, r.first_byte_us) {
        low(seen - rec(read));
    }
    let opened_here = r.index == 0 && t.index == 0;
    if opened_here
        && let (Some(seen), Some(done)) = (t.synack_at_us, r.connect_end_us)
        && r.error.is_none()
    {
        low(seen - rec(done));
    }
    let mut high = |v: i64| hi = Some(hi.map_or(v, |h| h.min(v)));
    if let (Some(seen), Some(wrote)) = (t.request_first_at_us, r.sent_first_us) {
        high(seen - rec(wrote));
    }
    if opened_here && let Some(seen) = t.syn_at_us {
        high(seen - rec(r.connect_start_us));
    }
    (lo, hi)
}

/// θ from the matches' bounds.
fn estimate(b: &[(Option<i64>, Option<i64>)]) -> Option<Offset> {
    let lo = b.iter().filter_map(|x| x.0).max();
    let hi = b.iter().filter_map(|x| x.1).min();
    let from = b.iter().filter(|x| x.0.is_some() || x.1.is_some()).count();
    match (lo, hi) {
        (Some(l), Some(h)) if l <= h => Some(Offset {
            theta_us: l + (h - l) / 2,
            uncertainty_us: (h - l) / 2,
            consistent: true,
            from,
        }),
        (None, None) => None,
        _ => {
            let mut mids: Vec<i64> = b
                .iter()
                .filter_map(|x| match x {
                    (Some(l), Some(h)) => Some(l + (h - l) / 2),
                    (Some(v), None) | (None, Some(v)) => Some(*v),
                    (None, None) => None,
                })
                .collect();
            mids.sort_unstable();
            let consistent = lo.is_none() || hi.is_none();
            Some(Offset {
                theta_us: mids[mids.len() / 2],
                uncertainty_us: 0,
                consistent,
                from,
            })
        }
    }
}

/// Joins a run's records with a capture's timings (`first_ts_ns`: the capture's first
/// packet on its clock, ns since the epoch).
pub fn join(records: &RequestRecords, first_ts_ns: i64, timings: &[TxnTiming]) -> Join {
    join_until(records, first_ts_ns, None, timings)
}

/// [`join`], with the capture's length (`duration_us`: its last packet less its first) so
/// the join says until when the capture saw the records ([`Join::captured_until_us`]).
pub fn join_until(
    records: &RequestRecords,
    first_ts_ns: i64,
    duration_us: Option<u64>,
    timings: &[TxnTiming],
) -> Join {
    let by_tuple = streams(timings);
    // Record times on the capture's µs time line at θ = 0.
    let base = i64::try_from(records.start_unix_us).unwrap_or(0) - first_ts_ns / 1000;
    let key = |r: &RequestRecord| r.local.map(|l| (norm(l), norm(r.remote)));
    // Pass 1: 4-tuples the capture saw on one stream only.
    let mut pick: Vec<Option<usize>> = vec![None; records.records.len()];
    let mut b = Vec::new();
    for (k, r) in records.records.iter().enumerate() {
        let Some(v) = key(r).and_then(|t| by_tuple.get(&t)) else {
            continue;
        };
        if let [(_, idx)] = v.as_slice()
            && let Some(&i) = idx.get(&r.index)
        {
            pick[k] = Some(i);
            b.push(bounds(r, &timings[i], base));
        }
    }
    let mut offset = estimate(&b);
    // Pass 2: reused 4-tuples, each connection to the stream that started nearest to it.
    let theta = offset.map_or(0, |o| o.theta_us);
    let mut late = false;
    for (k, r) in records.records.iter().enumerate() {
        let Some(v) = key(r)
            .and_then(|t| by_tuple.get(&t))
            .filter(|v| v.len() > 1)
        else {
            continue;
        };
        let at = base + i64::try_from(r.connect_start_us).unwrap_or(0) + theta;
        let nearest = v
            .iter()
            .filter_map(|(_, idx)| Some((stream_start(timings, idx)?, idx)))
            .min_by_key(|(s, _)| (s - at).abs());
        if let Some((_, idx)) = nearest
            && let Some(&i) = idx.get(&r.index)
        {
            pick[k] = Some(i);
            b.push(bounds(r, &timings[i], base));
            late = true;
        }
    }
    if late {
        offset = estimate(&b).or(offset);
    }
    let theta = offset.map_or(0, |o| o.theta_us);
    let requests: Vec<Joined> = records
        .records
        .iter()
        .enumerate()
        .map(|(k, r)| decompose(k, r, pick[k].map(|i| (i, &timings[i])), base + theta))
        .collect();
    // The capture's last packet on the records' clock: capture time less θ less `base`.
    let captured_until_us = offset
        .zip(duration_us)
        .and_then(|(o, d)| u64::try_from(i64::try_from(d).ok()? - o.theta_us - base).ok());
    Join {
        offset,
        matched: pick.iter().filter(|p| p.is_some()).count(),
        captured_until_us,
        requests,
    }
}

/// One record's decomposition; `shift` converts a record time to the capture's time line
/// (µs since its first packet).
fn decompose(k: usize, r: &RequestRecord, t: Option<(usize, &TxnTiming)>, shift: i64) -> Joined {
    let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX / 4);
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    let end = i(r
        .last_byte_us
        .unwrap_or(r.start_us.saturating_add(r.wait_us)));
    // The request that opened its connection waited for the connect (a connect that never
    // completed waited until its failure or the run's end).
    let opened = r.index == 0 && r.start_us <= r.connect_start_us;
    let connect_us = if opened {
        u(r.connect_end_us.map_or(end, i) - i(r.connect_start_us))
    } else {
        0
    };
    let mut p = Parts {
        connect_us,
        ..Parts::default()
    };
    p.syn_retransmits = r.syn_retransmits.filter(|_| opened);
    if let Some((_, t)) = t {
        p.stream = Some(t.stream);
        if opened && t.syn_at_us.is_some() {
            p.syn_retransmits = Some(t.syn_retransmits);
        }
        p.hold_kind = t.kinds.iter().copied().find(|k| is_hold(*k));
    }
    if let (Some((_, t)), Some(w)) = (t, r.sent_first_us) {
        let w = i(w);
        // Capture times on the record's clock, kept in order within [w, end].
        let rec = |v: i64| v - shift;
        let q = t.request_last_at_us.map_or(w, rec).clamp(w, end.max(w));
        let f = t.response_first_at_us.map_or(end, rec).clamp(q, end.max(q));
        let e = end.max(f);
        // The response's last byte on the wire; after it, the client had all of it and had
        // not read it yet (its own scheduling, not the path's or the server's).
        let l = t.response_last_at_us.map_or(e, rec).clamp(f, e);
        let (hq, lq) = capped(u(q - w), t.hold_request_us, t.loss_request_us);
        let (hs, ls) = capped(u(l - f), t.hold_response_us, t.loss_response_us);
        p.delivery_us = u(q - w) - hq - lq;
        p.server_us = u(f - q);
        p.transfer_us = u(l - f) - hs - ls;
        p.client_read_us = u(e - l);
        p.hold_us = hq + hs;
        p.loss_us = lq + ls;
    }
    let sum = p.connect_us
        + p.delivery_us
        + p.server_us
        + p.hold_us
        + p.loss_us
        + p.transfer_us
        + p.client_read_us;
    p.unexplained_us = i(r.wait_us) - i(sum);
    Joined {
        record: k,
        timing: t.map(|(i, _)| i),
        parts: p,
    }
}

/// Finding kinds that hold data before the wire.
fn is_hold(k: FindingKind) -> bool {
    matches!(
        k,
        FindingKind::NagleDelayedAck
            | FindingKind::NagleStall
            | FindingKind::DelayedAck
            | FindingKind::ZeroWindow
            | FindingKind::WindowFull
            | FindingKind::TcpCork
    )
}

impl Join {
    /// Each record's parts, in the records' order.
    pub fn parts(&self) -> Vec<Parts> {
        self.requests.iter().map(|r| r.parts).collect()
    }

    /// The evidence of this join for the run of `concurrency` connections.
    pub fn evidence(&self, concurrency: u32) -> RequestJoin {
        RequestJoin {
            concurrency,
            offset_us: self.offset.map(|o| o.theta_us),
            offset_uncertainty_us: self.offset.map_or(0, |o| o.uncertainty_us.unsigned_abs()),
            offset_consistent: self.offset.is_some_and(|o| o.consistent),
            matched: self.matched as u64,
            captured_until_us: self.captured_until_us,
            requests: self.parts(),
        }
    }

    /// Whether the capture saw each record, in the records' order.
    pub fn seen(&self) -> Vec<bool> {
        self.requests.iter().map(|r| r.timing.is_some()).collect()
    }
}

/// Hold and loss within an interval of `span` µs: each at most what is left of it.
fn capped(span: u64, hold: u64, loss: u64) -> (u64, u64) {
    let h = hold.min(span);
    (h, loss.min(span - h))
}

#[cfg(test)]
mod tests;
