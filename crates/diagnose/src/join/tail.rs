//! The tail from the join: what the slowest requests wait for that the typical one does not,
//! split into the join's components, and the patterns that show how (every-nth,
//! periodic-pause). Pure: the records and their join in, numbers out.
//!
//! ## The split
//! The slow set is every request at or above the run's percentile (p99 by weight: sampled
//! records stand for `weight` requests), the typical set every request between its p40 and
//! p60. Each component's part of the excess is its mean over the slow set less its mean over
//! the typical set. The components and the `unexplained` remainder add up to each request's
//! wait, so the parts add up to the excess of the slow set's mean wait over the typical
//! one's; a part's share is its fraction of that excess (negative parts, components the slow
//! requests wait *less* for, are left out).
//!
//! ## Mechanisms (only with the evidence that shows them)
//! A request is *hit* when the tail's largest component is at least half its tail part above
//! the typical mean, and at least half the median of such requests' (the cost itself): it
//! paid the cost, whether or not it reached the p99. When no pattern shows at that bar, the
//! p99.9 set's (half its mean): a rarer, longer cost stands out there.
//! - every-nth: the hits' index on their connection lines up: one residue modulo `n`
//!   holds ≥ [`LINE_UP`] of the hits, at least half of all requests at that position are hit
//!   and at most [`STRAY`] elsewhere, and the hits repeat along the connections (at least two
//!   positions `r`, `r + n`, … are hit). The largest such `n` ≤ [`MAX_N`] (its divisors
//!   would spread the hits over several residues).
//! - periodic-pause: the hits of different connections end (their response leaves the
//!   server: the last byte read less the client's read and the transfer) at the same instant: hits whose ends lie within [`SAME_INSTANT_US`] (or an
//!   eighth of the cost, the work queued behind a pause, up to [`SAME_INSTANT_MAX_US`]) of
//!   the previous one form a stall (two stalls closer than [`PERIOD_SLACK`] of the median gap
//!   are one pause seen in two bursts); stalls spanning at least [`PAUSE_CONNS`] connections hold
//!   ≥ [`LINE_UP`] of the hits; there are at least [`MIN_STALLS`]; the period is the median
//!   gap between their starts, called periodic when ≥ [`LINE_UP`] of the gaps lie within
//!   [`PERIOD_SLACK`] of a whole multiple of it (a pause no request met leaves a double gap),
//!   and the stalls recur through the run (from the first to a period after the last, at
//!   least [`RECUR`] of it).
//!   Not looked for when every-nth holds: connections in lockstep pay an every-nth cost at
//!   the same instants, while a pause does not follow the order on the connection.

use std::collections::{BTreeSet, HashMap};

use lagtrace_model::RequestRecord;

use super::Parts;

/// Share of hits that must line up (same residue, or stalls across connections; and of the
/// gaps, on the period).
pub const LINE_UP: f64 = 0.8;
/// Largest share of the other positions that may be hit for every-nth.
pub const STRAY: f64 = 0.1;
/// Largest `n` tried for every-nth.
pub const MAX_N: u32 = 64;
/// Ends within this of each other are one instant (µs): scheduling of the woken threads.
pub const SAME_INSTANT_US: u64 = 2_000;
/// ... or within an eighth of the cost (the work queued behind a pause), up to this (µs):
/// wider, independent waits of a few connections (RTOs after random drops) would chain into
/// stalls by coincidence.
pub const SAME_INSTANT_MAX_US: u64 = 5_000;
/// Connections a stall must span to be process-wide.
pub const PAUSE_CONNS: usize = 2;
/// Stalls needed to call them periodic.
pub const MIN_STALLS: usize = 3;
/// How far (share of the period) a gap may lie from a whole multiple of the period.
pub const PERIOD_SLACK: f64 = 0.2;
/// Share of the run the stalls (and one period after the last) must span to be periodic.
pub const RECUR: f64 = 0.5;

/// Where a request's time went (the join's components).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// Connection setup.
    Connect,
    /// Request delivery.
    Delivery,
    /// The server's time.
    Server,
    /// Data held before the wire.
    Hold,
    /// Loss recovery.
    Loss,
    /// Response transfer.
    Transfer,
    /// The client's read of a response already on the wire.
    ClientRead,
    /// Outside every measured component.
    Unexplained,
}

impl Component {
    /// All, in order.
    pub const ALL: [Component; 8] = [
        Component::Connect,
        Component::Delivery,
        Component::Server,
        Component::Hold,
        Component::Loss,
        Component::Transfer,
        Component::ClientRead,
        Component::Unexplained,
    ];

    /// Its value in a request's parts, µs (signed: the remainder may be negative).
    pub fn of(self, p: &Parts) -> i64 {
        let u = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        match self {
            Component::Connect => u(p.connect_us),
            Component::Delivery => u(p.delivery_us),
            Component::Server => u(p.server_us),
            Component::Hold => u(p.hold_us),
            Component::Loss => u(p.loss_us),
            Component::Transfer => u(p.transfer_us),
            Component::ClientRead => u(p.client_read_us),
            Component::Unexplained => p.unexplained_us,
        }
    }

    /// In words, as the slow requests wait for it.
    pub fn name(self) -> &'static str {
        match self {
            Component::Connect => "connection setup",
            Component::Delivery => "request delivery",
            Component::Server => "server time",
            Component::Hold => "data held before the wire",
            Component::Loss => "loss recovery",
            Component::Transfer => "response transfer",
            Component::ClientRead => "the client's read (response already received)",
            Component::Unexplained => "unexplained",
        }
    }
}

/// One component's part of the tail's excess.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Piece {
    /// The component.
    pub component: Component,
    /// Mean over the slow set less mean over the typical set, µs.
    pub added_us: u64,
    /// Its share of the excess, 0–1.
    pub share: f64,
}

/// Every n-th request of a connection pays the cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EveryNth {
    /// The period in requests.
    pub n: u32,
    /// The index (0-based) on the connection of the first one: `index % n == residue`.
    pub residue: u32,
    /// Share of the hits at that position.
    pub lined_up: f64,
    /// Share of the requests at that position that were hit.
    pub hit_there: f64,
    /// Share of the requests elsewhere that were hit.
    pub hit_elsewhere: f64,
}

/// The server stalled every connection at once, periodically.
#[derive(Debug, Clone, PartialEq)]
pub struct Pause {
    /// Stalls seen (hits of ≥ [`PAUSE_CONNS`] connections ending at one instant).
    pub stalls: usize,
    /// Median connections per stall.
    pub connections: usize,
    /// Share of the hits in such stalls.
    pub lined_up: f64,
    /// The median gap between stalls, µs.
    pub period_us: u64,
    /// Share of the gaps within [`PERIOD_SLACK`] of a multiple of the period.
    pub on_period: f64,
    /// When each stall ended (the first hit's first response byte), µs on the records' clock.
    pub ends_us: Vec<u64>,
}

/// The tail of a run, split by the join.
#[derive(Debug, Clone, PartialEq)]
pub struct TailSplit {
    /// The percentile, in percent.
    pub percentile: f64,
    /// The p50 wait, µs.
    pub p50_us: u64,
    /// The wait at the percentile, µs.
    pub at_us: u64,
    /// Requests in the slow set.
    pub slow: usize,
    /// Of the slow set, those the capture saw.
    pub slow_matched: usize,
    /// Mean wait of the slow set less that of the typical set, µs.
    pub excess_us: u64,
    /// The components' parts, largest first (positive ones only).
    pub parts: Vec<Piece>,
    /// Of the server time's part, what the slow requests waited on their upstreams beyond
    /// the typical request's wait there (the exchanges each caused on the hops behind the
    /// server, from the upstream join), µs; 0 with no hop joined.
    pub upstream_us: u64,
    /// Requests hit by the largest part.
    pub hits: usize,
    /// Every-nth, when the hits line up on the connections.
    pub every_nth: Option<EveryNth>,
    /// A periodic process-wide pause, when the hits line up in time across connections.
    pub pause: Option<Pause>,
}

/// The weighted `q` quantile of `(value, weight)` sorted by value.
pub fn quantile(sorted: &[(u64, f64)], q: f64) -> u64 {
    let total: f64 = sorted.iter().map(|x| x.1).sum();
    let mut acc = 0.0;
    for &(v, w) in sorted {
        acc += w;
        if acc >= q * total {
            return v;
        }
    }
    sorted.last().map_or(0, |x| x.0)
}

/// The weighted mean of each component over the records `set`.
fn means(rs: &[RequestRecord], parts: &[Parts], set: &[usize]) -> (f64, [f64; 8]) {
    let mut m = [0.0; 8];
    let mut wait = 0.0;
    let total: f64 = set.iter().map(|&k| rs[k].weight).sum::<f64>().max(1e-9);
    for &k in set {
        let w = rs[k].weight / total;
        wait += rs[k].wait_us as f64 * w;
        for (i, c) in Component::ALL.iter().enumerate() {
            m[i] += c.of(&parts[k]) as f64 * w;
        }
    }
    (wait, m)
}

/// The records at or above `at_us`. Records kept exactly (weight 1: the recorder and the
/// diagnosis keep every request above the p99 up to their caps) stand for themselves; a
/// sampled record (weight 2 or more) stands for many requests around its rank, nearly all
/// below the percentile, so it joins the slow set only when no exact record is there (a
/// run whose kept tail was cut to its slowest: the set is then those, the p99.9's and up).
/// Also the set's least wait (the percentile as the set reaches it).
fn slow_set(rs: &[RequestRecord], at_us: u64) -> (Vec<usize>, u64) {
    let above = |k: &usize| rs[*k].wait_us >= at_us;
    let exact: Vec<usize> = (0..rs.len())
        .filter(above)
        .filter(|&k| rs[k].weight < 2.0)
        .collect();
    let set = if exact.is_empty() {
        (0..rs.len()).filter(above).collect()
    } else {
        exact
    };
    let least = set.iter().map(|&k| rs[k].wait_us).min().unwrap_or(at_us);
    (set, least.max(at_us))
}

/// The split of the tail at `percentile` (99.0 for the p99) of a run's records, with each
/// record's parts and whether the capture saw it (the same order); `None` without records.
/// `from_us`: where the slow set starts when the caller knows it (a deep tail's bound),
/// else the weighted quantile at `percentile`.
pub fn split(
    rs: &[RequestRecord],
    parts: &[Parts],
    seen: &[bool],
    percentile: f64,
    from_us: Option<u64>,
) -> Option<TailSplit> {
    let n = rs.len().min(parts.len()).min(seen.len());
    if n == 0 {
        return None;
    }
    let rs = &rs[..n];
    let mut sorted: Vec<(u64, f64)> = rs.iter().map(|r| (r.wait_us, r.weight)).collect();
    sorted.sort_by_key(|x| x.0);
    let q = |p: f64| quantile(&sorted, p);
    let (p50_us, lo, hi) = (q(0.5), q(0.4), q(0.6));
    let (slow, at_us) = slow_set(rs, from_us.unwrap_or_else(|| q(percentile / 100.0)));
    let typical: Vec<usize> = (0..n)
        .filter(|&k| (lo..=hi).contains(&rs[k].wait_us))
        .collect();
    let (ws, ms) = means(rs, parts, &slow);
    let (wt, mt) = means(rs, parts, &typical);
    let upstream = |set: &[usize]| {
        let total: f64 = set.iter().map(|&k| rs[k].weight).sum::<f64>().max(1e-9);
        set.iter()
            .map(|&k| parts[k].upstream_us as f64 * rs[k].weight / total)
            .sum::<f64>()
    };
    let upstream_us = (upstream(&slow) - upstream(&typical)).max(0.0) as u64;
    let excess = (ws - wt).max(0.0);
    let mut pieces: Vec<Piece> = Component::ALL
        .iter()
        .enumerate()
        .filter(|&(i, _)| ms[i] > mt[i])
        .map(|(i, &c)| Piece {
            component: c,
            added_us: (ms[i] - mt[i]) as u64,
            share: ((ms[i] - mt[i]) / excess.max(1.0)).min(1.0),
        })
        .collect();
    pieces.sort_by_key(|p| std::cmp::Reverse(p.added_us));
    // The bars a hit must reach: half the tail part above the typical mean at the
    // percentile, then half the p99.9 set's mean (where a rarer, longer cost stands out).
    let (hits, nth, pause) = match pieces.first() {
        Some(top) => {
            let i = Component::ALL
                .iter()
                .position(|&c| c == top.component)
                .unwrap_or(0);
            let at999 = q(0.999);
            let top999: Vec<usize> = (0..n).filter(|&k| rs[k].wait_us >= at999).collect();
            let bars = [
                mt[i] + top.added_us as f64 / 2.0,
                means(rs, parts, &top999).1[i] / 2.0,
            ];
            patterns(rs, parts, top.component, &bars)
        }
        None => (0, None, None),
    };
    Some(TailSplit {
        percentile,
        p50_us,
        at_us,
        slow: slow.len(),
        slow_matched: slow.iter().filter(|&&k| seen[k]).count(),
        excess_us: excess as u64,
        parts: pieces,
        upstream_us,
        hits,
        every_nth: nth,
        pause,
    })
}

/// The requests that paid the component's cost: at least `bar`, then at least half the
/// median of those (the cost itself: a tail set by a few long waits also holds many short
/// ones, which scheduling spreads at random and which would hide the pattern); and that
/// cost, µs.
fn hits(c: Component, parts: &[Parts], bar: f64) -> (Vec<bool>, u64) {
    let vals: Vec<i64> = parts.iter().map(|p| c.of(p)).collect();
    let mut above: Vec<i64> = vals.iter().copied().filter(|&v| v as f64 >= bar).collect();
    above.sort_unstable();
    let cost = above.get(above.len() / 2).copied().unwrap_or(0);
    let bar = bar.max(cost as f64 / 2.0);
    let hit = vals.iter().map(|&v| v as f64 >= bar).collect();
    (hit, u64::try_from(cost).unwrap_or(0))
}

/// The hits at each bar in turn, and the first bar's patterns found (its hit count, else
/// the first bar's).
fn patterns(
    rs: &[RequestRecord],
    parts: &[Parts],
    c: Component,
    bars: &[f64],
) -> (usize, Option<EveryNth>, Option<Pause>) {
    let mut first = None;
    for &bar in bars {
        let (hit, cost) = hits(c, parts, bar);
        let count = hit.iter().filter(|&&h| h).count();
        first.get_or_insert(count);
        let nth = every_nth(rs, &hit);
        // Connections in lockstep pay an every-nth cost at the same instants too; the order
        // on the connection is the stronger evidence (a pause does not follow it).
        let pause = if nth.is_none() {
            pause(rs, parts, &hit, cost)
        } else {
            None
        };
        if nth.is_some() || pause.is_some() {
            return (count, nth, pause);
        }
    }
    (first.unwrap_or(0), None, None)
}

/// Every-nth: the hits' index on their connection lines up (see the module docs).
fn every_nth(rs: &[RequestRecord], hit: &[bool]) -> Option<EveryNth> {
    let hits: Vec<u32> = rs
        .iter()
        .zip(hit)
        .filter(|(_, h)| **h)
        .map(|(r, _)| r.index)
        .collect();
    if hits.len() < MIN_STALLS {
        return None;
    }
    let max_index = rs.iter().map(|r| r.index).max().unwrap_or(0);
    let mut best = None;
    for n in 2..=MAX_N.min(max_index / 2 + 1) {
        let mut count: HashMap<u32, usize> = HashMap::new();
        for &i in &hits {
            *count.entry(i % n).or_default() += 1;
        }
        let Some((&residue, &c)) = count
            .iter()
            .max_by_key(|(r, c)| (**c, std::cmp::Reverse(**r)))
        else {
            continue;
        };
        let lined_up = c as f64 / hits.len() as f64;
        let positions: BTreeSet<u32> = hits
            .iter()
            .filter(|&&i| i % n == residue)
            .copied()
            .collect();
        if lined_up < LINE_UP || positions.len() < 2 {
            continue;
        }
        // Weighted shares of requests hit at the position and elsewhere.
        let (mut on, mut on_hit, mut off, mut off_hit) = (0.0, 0.0, 0.0, 0.0);
        for (r, h) in rs.iter().zip(hit) {
            let w = r.weight;
            if r.index % n == residue {
                on += w;
                on_hit += if *h { w } else { 0.0 };
            } else {
                off += w;
                off_hit += if *h { w } else { 0.0 };
            }
        }
        let (hit_there, hit_elsewhere) = (on_hit / on.max(1e-9), off_hit / off.max(1e-9));
        if hit_there >= 0.5 && hit_elsewhere <= STRAY {
            best = Some(EveryNth {
                n,
                residue,
                lined_up,
                hit_there,
                hit_elsewhere,
            });
        }
    }
    best
}

/// Periodic-pause: hits of several connections end at the same instant, on a period.
fn pause(rs: &[RequestRecord], parts: &[Parts], hit: &[bool], cost_us: u64) -> Option<Pause> {
    // The released requests are answered one after another: their ends spread with the
    // work queued behind the pause, a small part of it.
    let same = (cost_us / 8).clamp(SAME_INSTANT_US, SAME_INSTANT_MAX_US);
    // A stall ends when the server answers: the response on the wire, i.e. the last byte
    // read less the client's read and the transfer (a CPU-busy client reads the released
    // responses milliseconds apart, which would split one stall in two).
    let end = |r: &RequestRecord, p: &Parts| match r.last_byte_us {
        Some(e) => Some(e.saturating_sub(p.client_read_us + p.transfer_us)),
        None => r.first_byte_us,
    };
    let mut ends: Vec<(u64, u64)> = rs
        .iter()
        .zip(parts)
        .zip(hit)
        .filter(|(_, h)| **h)
        .filter_map(|((r, p), _)| Some((end(r, p)?, r.conn)))
        .collect();
    if ends.len() < MIN_STALLS * PAUSE_CONNS {
        return None;
    }
    ends.sort_unstable();
    // Stalls: (first end, connections, hits).
    let mut stalls: Vec<(u64, BTreeSet<u64>, usize)> = Vec::new();
    let mut prev = None;
    for &(t, conn) in &ends {
        match stalls.last_mut() {
            Some(s) if prev.is_some_and(|p| t - p <= same) => {
                s.1.insert(conn);
                s.2 += 1;
            }
            _ => stalls.push((t, BTreeSet::from([conn]), 1)),
        }
        prev = Some(t);
    }
    stalls.retain(|s| s.1.len() >= PAUSE_CONNS);
    let in_stalls: usize = stalls.iter().map(|s| s.2).sum();
    let lined_up = in_stalls as f64 / ends.len() as f64;
    if stalls.len() < MIN_STALLS || lined_up < LINE_UP {
        return None;
    }
    let mut gaps: Vec<u64> = stalls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    gaps.sort_unstable();
    // One pause seen as two bursts (on a CPU-busy machine the released connections are not
    // all answered at once): a gap far shorter than the period is no gap.
    let first = gaps[gaps.len() / 2];
    gaps.retain(|&g| g as f64 >= PERIOD_SLACK * first as f64);
    let pauses = gaps.len() + 1;
    if pauses < MIN_STALLS {
        return None;
    }
    let period_us = gaps[gaps.len() / 2];
    let on = gaps
        .iter()
        .filter(|&&g| {
            let k = (g as f64 / period_us as f64).round().max(1.0);
            (g as f64 - k * period_us as f64).abs() <= PERIOD_SLACK * period_us as f64
        })
        .count();
    let on_period = on as f64 / gaps.len() as f64;
    if on_period < LINE_UP {
        return None;
    }
    // Periodic means through the run: the stalls, a period on from the last, span half of
    // it. Three hiccups within half a second of a 5 s run (another process's burst of
    // kernel work on a busy machine: suite run at 4df8bdc, "every 185 ms" in a healthy
    // nginx's p99.9) are an event, not the server's period.
    let (from, to) = run_span(rs)?;
    let span = stalls.last()?.0.saturating_sub(stalls.first()?.0) + period_us;
    if (span as f64) < RECUR * to.saturating_sub(from) as f64 {
        return None;
    }
    let mut conns: Vec<usize> = stalls.iter().map(|s| s.1.len()).collect();
    conns.sort_unstable();
    Some(Pause {
        stalls: pauses,
        connections: conns[conns.len() / 2],
        lined_up,
        period_us,
        on_period,
        ends_us: stalls.iter().map(|s| s.0).collect(),
    })
}

/// The run's length as its records show it: the first start to the last end (µs).
fn run_span(rs: &[RequestRecord]) -> Option<(u64, u64)> {
    let from = rs.iter().map(|r| r.start_us).min()?;
    let to = rs
        .iter()
        .map(|r| {
            r.last_byte_us
                .or(r.first_byte_us)
                .unwrap_or(r.start_us + r.wait_us)
        })
        .max()?;
    Some((from, to))
}

#[cfg(test)]
#[path = "tail_tests.rs"]
mod tests;
