//! Downstream ⋈ upstream: each transaction a server answered, matched to the upstream
//! exchanges it caused on the server's hops, from timestamps alone — no header injected, no
//! help from either server. Pure: two captures' timed transactions in, the matches out.
//!
//! ## What can be a match
//! A server passes a request on only after it began to arrive, and answers only after the
//! upstream began to answer. So an upstream exchange U can have been caused by a downstream
//! transaction D only when, on one clock (both captures on the server's host):
//! - D's request's first byte ≤ U's start (its SYN when U opened its connection, else its
//!   request's first byte), and
//! - U's response's first byte ≤ D's response's first byte.
//!
//! ## Which match
//! A hop with about one exchange per request (a proxy: at most [`PROXY_RATIO`] exchanges
//! per answered request) gets one exchange per request, chosen two ways, and the way that
//! fits better wins ([`Candidates::score`]):
//! - *in order*: each exchange, in order of its start, to the request among its candidates
//!   that has waited longest — a server passes requests on in the order they came;
//! - *by gap*: the cheapest pairs first, then swaps of two matches that cost less traded —
//!   robust to requests that cause no exchange. The cost is the square of (U's start − D's
//!   request's last byte, or 0) plus a quarter of the square of (D's response's first byte
//!   − U's response's last byte when D answered after it, else U's first byte: a server
//!   that buffers a response answers from its end, one that streams it from its start).
//!
//! An exchange left over goes to its cheapest candidate only, when that costs no more than
//! the cap (a gap of the hop's median exchange) and does not overlap that request's other
//! exchanges on the hop. On a hop with several exchanges per request (an application
//! calling its database in a loop) time alone cannot tell which of two overlapping requests
//! made a call: an exchange is joined only when one request in progress could have made it.
//! Candidates come from a sweep: only the requests in progress when an exchange starts can
//! contain it, and each exchange keeps its [`MAX_CANDIDATES`] cheapest.
//!
//! ## The wait on the upstream
//! A joined request's wait on its upstreams is the union of its exchanges' spans inside its
//! server time (its request's last byte to its response's first byte): from the exchange's
//! start (its SYN, when it opened its connection: its request followed the handshake at
//! once, within [`OPENED_FOR_US`]) to its response's
//! last byte — or to its first byte, when the server answered before the upstream finished
//! (a stream: the rest is the server's forwarding). Its own time is the rest.

use lagtrace_model::analyze::TxnTiming;
use lagtrace_model::diagnosis::evidence::{HopEvidence, HopJoin, RequestParts, UpstreamRef};

/// One capture's timed transactions with their clock: `base_us` + a timing's `*_at_us` is
/// µs since the epoch (`first_ts_ns / 1000` of the analysis).
#[derive(Debug, Clone, Copy)]
pub struct Timed<'a> {
    /// The capture's first packet, µs since the epoch.
    pub base_us: i64,
    /// Its timed transactions.
    pub timings: &'a [TxnTiming],
}

/// An upstream exchange caused by a downstream transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Caused {
    /// Index of its hop in the `ups` given to [`join`].
    pub hop: usize,
    /// Index of its timing on that hop.
    pub timing: usize,
}

/// The matches of one downstream capture with the hops behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamJoin {
    /// Per downstream timing, the exchanges it caused, in order of their start.
    pub caused: Vec<Vec<Caused>>,
    /// Per hop: its complete exchanges (a start and a response) within the time the capture
    /// in front covers, and how many were joined.
    pub per_hop: Vec<(usize, usize)>,
}

/// An interval on the common clock, µs since the epoch.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// The request's first byte.
    start: i64,
    /// Downstream: the request's last byte, where the server's time begins. Upstream: its
    /// start.
    ready: i64,
    /// The response's first byte.
    answer: i64,
    /// The response's last byte.
    end: i64,
}

/// Most exchanges per answered request for a hop to be joined one exchange per request.
pub const PROXY_RATIO: f64 = 1.25;

/// Candidates kept per exchange (the cheapest): bounds time and memory at high
/// concurrency, where every request in progress is a candidate.
pub const MAX_CANDIDATES: usize = 64;

fn down_span(base: i64, t: &TxnTiming) -> Option<Span> {
    let start = base + t.request_first_at_us?;
    let answer = base + t.response_first_at_us?;
    Some(Span {
        start,
        ready: base + t.request_last_at_us.unwrap_or(t.request_first_at_us?),
        answer,
        end: base + t.response_last_at_us.unwrap_or(t.response_first_at_us?),
    })
}

/// At most this long (µs) from a connection's handshake to its first request for the
/// exchange to have opened it itself: a server that connects for a request sends it as the
/// handshake completes; a pool that opened the connection earlier does not.
pub const OPENED_FOR_US: i64 = 10_000;

fn up_span(base: i64, t: &TxnTiming) -> Option<Span> {
    let first = base + t.request_first_at_us?;
    // The exchange that opened its connection began with the connect: its SYN is where the
    // server passed the request on (several requests arriving together each open one; the
    // handshakes, not the SYNs, complete out of order).
    let opened = match (t.syn_at_us, t.synack_at_us) {
        (Some(s), Some(a)) if t.index == 0 && first - (base + a) <= OPENED_FOR_US => base + s,
        _ => first,
    };
    let start = opened.min(first);
    Some(Span {
        start,
        ready: start,
        answer: base + t.response_first_at_us?,
        end: base + t.response_last_at_us.unwrap_or(t.response_first_at_us?),
    })
}

/// Joins the downstream transactions `down` with the exchanges of the hops `ups` behind it.
pub fn join(down: Timed<'_>, ups: &[Timed<'_>]) -> UpstreamJoin {
    let ds: Vec<Option<Span>> = down
        .timings
        .iter()
        .map(|t| down_span(down.base_us, t))
        .collect();
    let mut order: Vec<usize> = (0..ds.len()).filter(|&i| ds[i].is_some()).collect();
    order.sort_by_key(|&i| ds[i].map(|s| s.start));
    // The time the capture in front covers: an exchange outside it can be caused by no
    // transaction there, and is not counted (a hop's capture starts when the hop is found
    // and stops after the front's: its first and last exchanges lie outside).
    let (from, until) = ds.iter().flatten().fold((i64::MAX, i64::MIN), |(a, b), s| {
        (a.min(s.start), b.max(s.end))
    });
    let mut us: Vec<(Span, Caused)> = Vec::new();
    let mut per_hop = vec![(0, 0); ups.len()];
    for (h, up) in ups.iter().enumerate() {
        for (i, t) in up.timings.iter().enumerate() {
            if let Some(s) = up_span(up.base_us, t).filter(|s| s.start >= from && s.end <= until) {
                us.push((s, Caused { hop: h, timing: i }));
                per_hop[h].0 += 1;
            }
        }
    }
    us.sort_by_key(|(s, c)| (s.start, *c));
    let cands = Candidates::sweep(&ds, &order, &us);
    let answered = order.len() as f64;
    let proxy: Vec<bool> = per_hop
        .iter()
        .map(|&(n, _)| n as f64 <= PROXY_RATIO * answered)
        .collect();
    let caps = caps(&us, ups.len());
    // Phase one on the proxy-shaped hops, two ways; the one that fits better.
    let on_proxy: Vec<bool> = us.iter().map(|(_, c)| proxy[c.hop]).collect();
    let in_order = cands.in_order(&ds, &us, &on_proxy);
    let by_gap = cands.by_gap(&us, ds.len(), &on_proxy);
    let mut of_up = if cands.score(&in_order, &us, &caps) < cands.score(&by_gap, &us, &caps) {
        in_order
    } else {
        by_gap
    };
    let mut caused: Vec<Vec<Caused>> = vec![Vec::new(); ds.len()];
    for (k, d) in of_up.iter().enumerate() {
        if let Some(d) = *d {
            caused[d].push(us[k].1);
        }
    }
    // Then the rest: to the cheapest candidate only (a proxy's hop: within the cap), or to
    // the only candidate (a hop with several exchanges per request), when that request's
    // exchanges on the hop do not overlap it.
    let overlaps = |a: &Span, b: &Span| a.start < b.end && b.start < a.end;
    let mut span_of = std::collections::HashMap::new();
    for (k, (s, c)) in us.iter().enumerate() {
        span_of.insert(*c, (*s, k));
    }
    for k in 0..us.len() {
        if of_up[k].is_some() {
            continue;
        }
        let (u, c) = us[k];
        let options = cands.of(k);
        let pick = if proxy[c.hop] {
            options
                .iter()
                .min_by_key(|p| (p.cost, p.d))
                .filter(|p| p.cost <= caps[c.hop])
        } else if options.len() == 1 {
            options.first()
        } else {
            None
        };
        let Some(d) = pick.map(|p| p.d) else { continue };
        let clash = caused[d]
            .iter()
            .filter(|o| o.hop == c.hop)
            .any(|o| span_of.get(o).is_some_and(|(s, _)| overlaps(s, &u)));
        if !clash {
            of_up[k] = Some(d);
            caused[d].push(c);
        }
    }
    for (k, d) in of_up.iter().enumerate() {
        if d.is_some() {
            per_hop[us[k].1.hop].1 += 1;
        }
    }
    for c in &mut caused {
        c.sort_by_key(|x| span_of.get(x).map(|(s, k)| (s.start, *k)));
    }
    UpstreamJoin { caused, per_hop }
}

/// A transaction that could have caused an exchange.
#[derive(Debug, Clone, Copy)]
struct Pair {
    /// The exchange (index into the sorted exchanges).
    k: usize,
    /// The transaction.
    d: usize,
    /// [`cost`] of its gaps.
    cost: i64,
}

/// How far a match is from passing the request on at once: the gap on the request side
/// (`a`: the exchange's start after the request's last byte) squared, and the answer side's
/// (`b`) squared at a quarter. Squares, so that of two requests passed on close together
/// the matches that keep their order cost less than the ones that cross (linear gaps sum the
/// same either way); the request side counts four times because a server passes requests
/// on in the order they came more faithfully than it passes answers back (measured behind
/// nginx at c=32: 0.04 % of neighbouring pairs out of order on the request side, 4.4 % on
/// the answer side).
fn cost(a: i64, b: i64) -> i64 {
    a.saturating_mul(a).saturating_add(b.saturating_mul(b) / 4)
}

/// The upstream's moment the server answered `d` from, when `u` caused it: the response's
/// last byte when `d`'s answer came after it (a server that buffers the upstream's response,
/// as nginx does a small one), else its first byte (a server that streams it). Measured
/// from the first byte alone, a buffering proxy in front of an upstream that sends its head
/// at once and its body later (Nagle and the proxy's delayed ACK: ~40 ms) made every right
/// pair cost the body's delay and the wrong ones less: 51 of 197 kept requests joined right
/// behind nginx at c=4 (tshark's FIFO truth on the same capture).
fn answered_from(u: &Span, d: &Span) -> i64 {
    if u.end <= d.answer { u.end } else { u.answer }
}

/// Every (exchange, transaction) that could be a match, grouped by exchange.
struct Candidates {
    pairs: Vec<Pair>,
    /// Exchange `k`'s candidates are `pairs[first[k]..first[k + 1]]`.
    first: Vec<usize>,
}

impl Candidates {
    /// The sweep over the exchanges in order of their start: only the transactions in
    /// progress then can contain one.
    fn sweep(ds: &[Option<Span>], order: &[usize], us: &[(Span, Caused)]) -> Candidates {
        let mut pairs = Vec::new();
        let mut first = Vec::with_capacity(us.len() + 1);
        let mut open: Vec<usize> = Vec::new();
        let mut next = 0;
        for (k, (u, _)) in us.iter().enumerate() {
            first.push(pairs.len());
            while next < order.len() && ds[order[next]].is_some_and(|d| d.start <= u.start) {
                open.push(order[next]);
                next += 1;
            }
            // An exchange starting now answers no earlier than now: a transaction answered
            // before can hold none of these exchanges.
            open.retain(|&d| ds[d].is_some_and(|d| d.answer >= u.start));
            let from = pairs.len();
            for &d in &open {
                let Some(s) = ds[d] else { continue };
                if u.answer <= s.answer {
                    let a = (u.start - s.ready).max(0);
                    pairs.push(Pair {
                        k,
                        d,
                        cost: cost(a, s.answer - answered_from(u, &s)),
                    });
                }
            }
            // The cheapest few, then by transaction (for `cost_of`'s search).
            let mine = &mut pairs[from..];
            if mine.len() > MAX_CANDIDATES {
                mine.select_nth_unstable_by_key(MAX_CANDIDATES, |p| (p.cost, p.d));
                pairs.truncate(from + MAX_CANDIDATES);
            }
            pairs[from..].sort_unstable_by_key(|p| p.d);
        }
        first.push(pairs.len());
        Candidates { pairs, first }
    }

    fn of(&self, k: usize) -> &[Pair] {
        &self.pairs[self.first[k]..self.first[k + 1]]
    }

    fn cost_of(&self, k: usize, d: usize) -> Option<i64> {
        let of = self.of(k);
        of.binary_search_by_key(&d, |p| p.d)
            .ok()
            .map(|i| of[i].cost)
    }

    /// Every pair, cheapest first.
    fn by_cost(&self) -> Vec<Pair> {
        let mut v = self.pairs.clone();
        v.sort_unstable_by_key(|p| (p.cost, p.k, p.d));
        v
    }

    /// Each exchange, in order of its start, to the transaction that has waited longest
    /// among its candidates not yet holding one on that hop: a server passes requests on in
    /// the order they came. Exact for a proxy; a transaction that never causes an exchange on
    /// the hop (served from a cache, by another hop) would take a later one's.
    fn in_order(
        &self,
        ds: &[Option<Span>],
        us: &[(Span, Caused)],
        on: &[bool],
    ) -> Vec<Option<usize>> {
        let mut of_up = vec![None; us.len()];
        let mut holds: std::collections::HashSet<(usize, usize)> = Default::default();
        for k in (0..us.len()).filter(|&k| on[k]) {
            let hop = us[k].1.hop;
            let pick = self
                .of(k)
                .iter()
                .filter(|p| !holds.contains(&(p.d, hop)))
                .min_by_key(|p| (ds[p.d].map(|s| (s.ready, s.start)), p.d));
            if let Some(p) = pick {
                holds.insert((p.d, hop));
                of_up[k] = Some(p.d);
            }
        }
        of_up
    }

    /// Greedy by the cheapest pair, then [`Candidates::improve`]: robust to transactions
    /// that cause no exchange, but blind to the order of near ties.
    fn by_gap(&self, us: &[(Span, Caused)], downs: usize, on: &[bool]) -> Vec<Option<usize>> {
        let mut of_up = vec![None; us.len()];
        let mut held: Vec<Vec<(usize, usize)>> = vec![Vec::new(); downs];
        for p in self.by_cost() {
            let hop = us[p.k].1.hop;
            if on[p.k] && of_up[p.k].is_none() && !held[p.d].iter().any(|&(h, _)| h == hop) {
                of_up[p.k] = Some(p.d);
                held[p.d].push((hop, p.k));
            }
        }
        self.improve(us, &mut of_up, &mut held);
        of_up
    }

    /// Swaps matches where two exchanges traded between their transactions cost less:
    /// greedy by the single cheapest pair can pair a transaction with a neighbour's exchange,
    /// and the neighbour then takes what is left.
    fn improve(
        &self,
        us: &[(Span, Caused)],
        of_up: &mut [Option<usize>],
        held: &mut [Vec<(usize, usize)>],
    ) {
        let holds = |held: &[Vec<(usize, usize)>], d: usize, hop: usize| {
            held[d].iter().find(|&&(h, _)| h == hop).map(|&(_, k)| k)
        };
        for _ in 0..PASSES {
            let mut swapped = false;
            for p in &self.pairs {
                let (k, d) = (p.k, p.d);
                let Some(d2) = of_up[k].filter(|&x| x != d) else {
                    continue;
                };
                let hop = us[k].1.hop;
                let Some(k2) = holds(held, d, hop) else {
                    continue;
                };
                let (Some(now1), Some(now2), Some(alt)) = (
                    self.cost_of(k, d2),
                    self.cost_of(k2, d),
                    self.cost_of(k2, d2),
                ) else {
                    continue;
                };
                if p.cost.saturating_add(alt) < now1.saturating_add(now2) {
                    of_up[k] = Some(d);
                    of_up[k2] = Some(d2);
                    for x in held[d].iter_mut().filter(|x| x.0 == hop) {
                        x.1 = k;
                    }
                    for x in held[d2].iter_mut().filter(|x| x.0 == hop) {
                        x.1 = k2;
                    }
                    swapped = true;
                }
            }
            if !swapped {
                break;
            }
        }
    }

    /// How well a phase-one assignment fits: each match's cost, capped at its hop's cap (a
    /// rare wrong match of the in-order way costs no more than an exchange left unmatched),
    /// and the cap for each exchange unmatched. Lower is better.
    fn score(&self, of_up: &[Option<usize>], us: &[(Span, Caused)], caps: &[i64]) -> i64 {
        of_up
            .iter()
            .enumerate()
            .map(|(k, d)| {
                let cap = caps[us[k].1.hop];
                d.and_then(|d| self.cost_of(k, d))
                    .map_or(cap, |c| c.min(cap))
            })
            .fold(0i64, i64::saturating_add)
    }
}

/// Most passes of [`Candidates::improve`].
const PASSES: usize = 8;

/// The least cap of a match's cost in [`Candidates::score`], as a gap (µs): beyond a
/// millisecond a server is not passing a request on at once.
const CAP_LEAST_US: i64 = 1_000;

/// Each hop's cap of a match's cost: a gap as long as the hop's median exchange (start to
/// the response's first byte), at least [`CAP_LEAST_US`] — on the scale of what is being
/// matched, so that a chain of wrong matches (each a transaction that waited for another's
/// exchange) counts against the in-order way.
fn caps(us: &[(Span, Caused)], hops: usize) -> Vec<i64> {
    (0..hops)
        .map(|h| {
            let mut w: Vec<i64> = us
                .iter()
                .filter(|(_, c)| c.hop == h)
                .map(|(s, _)| s.answer - s.start)
                .collect();
            w.sort_unstable();
            let m = w.get(w.len() / 2).copied().unwrap_or(0).max(CAP_LEAST_US);
            cost(m, 0)
        })
        .collect()
}

impl UpstreamJoin {
    /// Downstream timing `d`'s wait on its exchanges (on hop `hop` only, or on every hop),
    /// µs: the union of their spans inside its server time. `None` when it caused none
    /// there (or has no server time).
    pub fn wait_us(
        &self,
        down: Timed<'_>,
        ups: &[Timed<'_>],
        d: usize,
        hop: Option<usize>,
    ) -> Option<u64> {
        let s = down_span(down.base_us, down.timings.get(d)?)?;
        let mine = self.caused.get(d)?;
        if mine.iter().all(|c| hop.is_some_and(|h| h != c.hop)) {
            return None;
        }
        let mut spans: Vec<(i64, i64)> = mine
            .iter()
            .filter(|c| hop.is_none_or(|h| h == c.hop))
            .filter_map(|c| {
                let up = ups.get(c.hop)?;
                let u = up_span(up.base_us, up.timings.get(c.timing)?)?;
                let from = u.start;
                // To its last byte, or its first when the server answered before the
                // upstream finished (a stream: the rest is the server's forwarding).
                let to = if u.end <= s.answer { u.end } else { u.answer };
                let (a, b) = (from.max(s.ready), to.min(s.answer));
                (a < b).then_some((a, b))
            })
            .collect();
        spans.sort_unstable();
        let mut total = 0i64;
        let mut reach = i64::MIN;
        for (a, b) in spans {
            let a = a.max(reach);
            if b > a {
                total += b - a;
                reach = b;
            }
        }
        Some(u64::try_from(total).unwrap_or(0))
    }

    /// Downstream timing `d`'s server time (its request's last byte to its response's first
    /// byte), µs.
    pub fn server_us(down: Timed<'_>, d: usize) -> Option<u64> {
        let s = down_span(down.base_us, down.timings.get(d)?)?;
        u64::try_from(s.answer - s.ready).ok()
    }
}

/// Joins the captured hops with what is in front of them and writes the matches into the
/// evidence: each hop's [`HopJoin`] (against the client-facing capture at depth 1, the hop
/// it is behind deeper), and for the client-facing join each kept record's
/// `upstream_us`/`upstream` (`records[i]`: the timing of `requests[i]`, when matched).
/// `hop_timed[k]` is hop `k`'s capture, when it was timed.
pub fn attach(
    front: Option<Timed<'_>>,
    records: &[Option<usize>],
    requests: &mut [RequestParts],
    hops: &mut [HopEvidence],
    hop_timed: &[Option<Timed<'_>>],
) {
    // The downstream of each hop: None for the client-facing capture, Some(g) for hop g.
    let down_of = |k: usize| -> Option<Option<usize>> {
        let h = &hops[k];
        if h.depth <= 1 {
            return Some(None);
        }
        let via = h.via.as_deref()?;
        (0..hops.len())
            .find(|&g| {
                let x = &hops[g];
                x.depth + 1 == h.depth
                    && x.peer == via
                    && hop_timed.get(g).is_some_and(|t| t.is_some())
            })
            .map(Some)
    };
    let mut groups: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
    for (k, t) in hop_timed.iter().enumerate().take(hops.len()) {
        if t.is_none() {
            continue;
        }
        let Some(d) = down_of(k) else { continue };
        match groups.iter_mut().find(|(g, _)| *g == d) {
            Some((_, v)) => v.push(k),
            None => groups.push((d, vec![k])),
        }
    }
    for (d, members) in groups {
        let down = match d {
            None => front,
            Some(g) => hop_timed[g],
        };
        let Some(down) = down else { continue };
        let ups: Vec<Timed<'_>> = members.iter().filter_map(|&k| hop_timed[k]).collect();
        let j = join(down, &ups);
        for (m, &k) in members.iter().enumerate() {
            hops[k].join = Some(j.summary(down, &ups, m));
        }
        if d.is_some() {
            continue;
        }
        for (r, t) in requests.iter_mut().zip(records) {
            let Some(t) = *t else { continue };
            let Some(first) = j.caused.get(t).and_then(|c| c.first()) else {
                continue;
            };
            r.upstream_us = j.wait_us(down, &ups, t, None).unwrap_or(0).min(r.server_us);
            let u = &ups[first.hop].timings[first.timing];
            r.upstream = Some(UpstreamRef {
                hop: members[first.hop] as u32,
                local_port: u.client.port(),
                stream: u.stream,
                index: u.index,
            });
        }
    }
}

impl UpstreamJoin {
    /// Hop `m`'s summary: its exchanges joined, and the wait and own time of the
    /// transactions that caused them.
    pub fn summary(&self, down: Timed<'_>, ups: &[Timed<'_>], m: usize) -> HopJoin {
        let (exchanges, joined) = self.per_hop.get(m).copied().unwrap_or((0, 0));
        let mut wait = Vec::new();
        let mut own = Vec::new();
        for d in 0..self.caused.len() {
            let Some(w) = self.wait_us(down, ups, d, Some(m)) else {
                continue;
            };
            wait.push(w);
            if let (Some(s), Some(all)) =
                (Self::server_us(down, d), self.wait_us(down, ups, d, None))
            {
                own.push(s.saturating_sub(all));
            }
        }
        HopJoin {
            exchanges: exchanges as u64,
            joined: joined as u64,
            downstream: wait.len() as u64,
            wait: crate::adapters::percentiles_of(&mut wait),
            own: crate::adapters::percentiles_of(&mut own),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timings on the clock the test writes them in.
    fn on_one_clock(timings: &[TxnTiming]) -> Timed<'_> {
        Timed {
            base_us: 0,
            timings,
        }
    }

    /// A timing on stream `stream` (index `index`): request first..last, response first..last
    /// (µs on its capture's clock).
    fn t(stream: u32, index: u32, req: (i64, i64), resp: (i64, i64)) -> TxnTiming {
        TxnTiming {
            stream,
            index,
            client: "127.0.0.1:40000".parse().unwrap(),
            server: "127.0.0.1:9000".parse().unwrap(),
            syn_at_us: None,
            syn_retransmits: 0,
            synack_at_us: None,
            request_first_at_us: Some(req.0),
            request_last_at_us: Some(req.1),
            response_first_at_us: Some(resp.0),
            response_last_at_us: Some(resp.1),
            server_path_us: 0,
            hold_request_us: 0,
            hold_response_us: 0,
            loss_request_us: 0,
            loss_response_us: 0,
            kinds: Vec::new(),
            weight: 1.0,
        }
    }

    #[test]
    fn each_request_goes_to_the_exchange_nested_tightest_in_it() {
        // Two overlapping downstream requests; their upstream exchanges interleave so that
        // both nest in the first one's window: the gaps decide.
        let down = vec![
            t(0, 0, (0, 0), (1_000, 1_000)),
            t(1, 0, (100, 100), (700, 700)),
        ];
        let up = [
            t(5, 0, (150, 150), (650, 650)),
            t(6, 0, (60, 60), (950, 950)),
        ];
        let d = on_one_clock(&down);
        // The hop's capture started 10 µs later: its clock is shifted.
        let shifted: Vec<TxnTiming> = up
            .iter()
            .map(|x| {
                let mut x = x.clone();
                for v in [
                    &mut x.request_first_at_us,
                    &mut x.request_last_at_us,
                    &mut x.response_first_at_us,
                    &mut x.response_last_at_us,
                ] {
                    *v = v.map(|v| v - 10);
                }
                x
            })
            .collect();
        let u = [Timed {
            base_us: 10,
            timings: &shifted,
        }];
        let j = join(d, &u);
        assert_eq!(j.caused[0], vec![Caused { hop: 0, timing: 1 }]);
        assert_eq!(j.caused[1], vec![Caused { hop: 0, timing: 0 }]);
        assert_eq!(j.per_hop, vec![(2, 2)]);
        assert_eq!(j.wait_us(d, &u, 0, None), Some(890));
        assert_eq!(j.wait_us(d, &u, 1, Some(0)), Some(500));
        assert_eq!(UpstreamJoin::server_us(d, 1), Some(600));
    }

    #[test]
    fn a_buffering_proxy_is_joined_by_the_upstreams_last_byte_not_its_head() {
        // nginx at c=4 in front of a backend whose head leaves at once and whose body waits
        // ~40 ms for nginx's delayed ACK (the bodies released in another order than the
        // requests came); nginx answers each client ~100 µs after its body. Requests come
        // 1 ms apart and are passed on 25 µs later; the heads all arrive ~300 µs after.
        let release = [40_900, 40_400, 41_600, 40_100];
        let down: Vec<TxnTiming> = (0..4)
            .map(|i| {
                let at = 1_000 * i as i64;
                let end = release[i] + 100;
                t(i as u32, 1, (at, at), (end, end))
            })
            .collect();
        let up: Vec<TxnTiming> = (0..4)
            .map(|i| {
                let at = 1_000 * i as i64 + 25;
                t(10 + i as u32, 1, (at, at), (at + 300, release[i]))
            })
            .collect();
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        for (i, c) in j.caused.iter().enumerate() {
            assert_eq!(c, &vec![Caused { hop: 0, timing: i }], "request {i}");
        }
        // Its whole server time but the 100 µs is the wait on the hop.
        assert_eq!(
            j.wait_us(d, &u, 3, None),
            Some((release[3] - 3_000 - 25) as u64)
        );
    }

    #[test]
    fn an_exchange_outside_every_request_is_not_joined() {
        // Before the request arrived, and answered after the response left (two short
        // requests around them: the capture in front covers 40..700).
        let down = vec![
            t(0, 0, (100, 100), (500, 500)),
            t(1, 0, (40, 40), (45, 45)),
            t(2, 0, (590, 590), (700, 700)),
        ];
        let up = vec![
            t(5, 0, (50, 50), (200, 200)),
            t(5, 1, (200, 200), (600, 600)),
        ];
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        assert!(j.caused.iter().all(Vec::is_empty), "{:?}", j.caused);
        assert_eq!(j.per_hop, vec![(2, 0)]);
        assert_eq!(j.wait_us(d, &u, 0, None), None);
        // Outside the time the capture in front covers, an exchange is not even counted
        // (the hop's capture began before it and ended after it).
        let late = vec![t(5, 2, (800, 800), (900, 900)), t(5, 3, (10, 10), (30, 30))];
        let j = join(d, &[on_one_clock(&late)]);
        assert_eq!(j.per_hop, vec![(0, 0)]);
    }

    #[test]
    fn calls_in_sequence_all_go_to_their_request_and_a_new_connection_counts_its_connect() {
        // One request calling its database three times in a row, the first on a new
        // connection whose SYN left 50 µs before its request.
        let down = vec![t(0, 0, (0, 0), (2_000, 2_000))];
        let mut first = t(7, 0, (200, 200), (500, 500));
        first.syn_at_us = Some(150);
        first.synack_at_us = Some(160);
        let up = vec![
            first,
            t(7, 1, (600, 600), (900, 900)),
            t(7, 2, (1_000, 1_000), (1_900, 1_900)),
        ];
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        assert_eq!(j.caused[0].len(), 3);
        assert_eq!(j.per_hop, vec![(3, 3)]);
        // 350 + 300 + 900.
        assert_eq!(j.wait_us(d, &u, 0, Some(0)), Some(1_550));
    }

    #[test]
    fn a_request_that_causes_no_exchange_does_not_take_the_next_ones() {
        // The first request waits on something else (another hop, not captured) for 2 ms;
        // the second is passed on at once. In order of arrival the exchange would go to the
        // first; the fit says the second.
        let down = vec![
            t(0, 0, (0, 0), (2_000, 2_000)),
            t(1, 0, (100, 100), (1_000, 1_000)),
        ];
        let up = vec![t(5, 0, (150, 150), (900, 900))];
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        assert!(j.caused[0].is_empty());
        assert_eq!(j.caused[1], vec![Caused { hop: 0, timing: 0 }]);
    }

    #[test]
    fn requests_passed_on_in_order_keep_their_order() {
        // A proxy's turns: four requests passed on in the order they came, 20–40 µs after
        // each arrived; the upstream answers in that order, and each answer goes back in
        // order 10–90 µs later. The cheapest single pairs first (then swapping pairs) would
        // give the first exchange to the second request and leave the third unmatched.
        let down = vec![
            t(0, 0, (10, 10), (1_010, 1_010)),
            t(1, 0, (30, 30), (1_060, 1_060)),
            t(2, 0, (80, 80), (1_090, 1_090)),
            t(3, 0, (130, 130), (1_120, 1_120)),
        ];
        let up = vec![
            t(5, 0, (50, 50), (1_000, 1_000)),
            t(6, 0, (100, 100), (1_010, 1_010)),
            t(7, 0, (120, 120), (1_020, 1_020)),
            t(8, 0, (160, 160), (1_030, 1_030)),
        ];
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        for (i, c) in j.caused.iter().enumerate() {
            assert_eq!(c, &vec![Caused { hop: 0, timing: i }], "request {i}: {j:?}");
        }
    }

    #[test]
    fn overlapping_requests_calling_a_hop_in_a_loop_are_joined_only_where_one_could_call() {
        // Two requests in progress together, each calling its database three times in a
        // row (the review's example): a call made while both were in progress could be
        // either's, and is left unjoined rather than given to the wrong one.
        let down = vec![
            t(0, 0, (0, 0), (2_000, 2_000)),
            t(1, 0, (550, 550), (2_600, 2_600)),
        ];
        let up = vec![
            t(5, 0, (200, 200), (500, 500)),
            t(5, 1, (600, 600), (900, 900)),
            t(5, 2, (1_000, 1_000), (1_300, 1_300)),
            t(6, 0, (700, 700), (1_000, 1_000)),
            t(6, 1, (1_100, 1_100), (1_400, 1_400)),
            t(6, 2, (2_100, 2_100), (2_400, 2_400)),
        ];
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        // Stream 5 is request 0's connection, stream 6 request 1's.
        for (r, c) in j.caused.iter().enumerate() {
            for x in c {
                assert_eq!(up[x.timing].stream, 5 + r as u32, "request {r}: {j:?}");
            }
        }
        assert_eq!(j.caused[0], vec![Caused { hop: 0, timing: 0 }]);
        assert_eq!(j.caused[1], vec![Caused { hop: 0, timing: 5 }]);
    }

    #[test]
    fn a_proxy_passes_each_request_on_once() {
        // Two back-to-back requests on one connection, each passed on once; a second
        // exchange overlapping the first is not stacked onto the same request.
        let down = vec![
            t(0, 0, (0, 0), (1_000, 1_000)),
            t(0, 1, (1_100, 1_100), (2_000, 2_000)),
        ];
        let up = vec![
            t(5, 0, (50, 50), (900, 900)),
            t(6, 0, (60, 60), (700, 700)),
            t(5, 1, (1_150, 1_150), (1_900, 1_900)),
        ];
        let d = on_one_clock(&down);
        let u = [on_one_clock(&up)];
        let j = join(d, &u);
        assert_eq!(j.caused[0], vec![Caused { hop: 0, timing: 0 }]);
        assert_eq!(j.caused[1], vec![Caused { hop: 0, timing: 2 }]);
        assert_eq!(j.per_hop, vec![(3, 2)]);
    }
}
