//! The tail from the per-request join, when the app layer kept its records and the packets
//! joined them: what the slowest requests waited for *that the typical one did not*,
//! request by request, rather than the layers' distributions side by side.
//!
//! The largest component of the excess names the cause (`join::tail` splits it):
//! server time → `slow-server`, loss recovery → `packet-loss`, connection setup →
//! `syn-drop`, data held before the wire → the hold's own cause (Nagle, cork, window, by
//! the finding kind most slow requests carry), the remainder → `unexplained-tail`. Request
//! delivery and response transfer name no cause of their own: a tail there is the path's
//! or the client's, which other layers judge; they stay in the numbers.
//!
//! A mechanism is named only with its evidence: `every-nth` when the hit requests' index on
//! their connection lines up, `periodic-pause` when their ends line up in time across
//! connections on a measured period. Both are the server's patterns: named on a
//! `slow-server` part only.

use std::collections::HashMap;

use lagtrace_model::diagnosis::evidence::RequestJoin;
use lagtrace_model::{Cause, FindingKind, RequestRecord};

use super::{ms, pct};
use crate::join::tail::{Component, TailSplit, quantile, split};
use crate::verdict::{Mechanism, TailPart};

/// What the join says about a run's tail.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct JoinedTail {
    /// The parts, largest first (components that name a cause).
    pub parts: Vec<TailPart>,
    /// The split they come from.
    pub split: TailSplit,
    /// How the largest part works, with its evidence in words.
    pub mechanism: Option<(Mechanism, String)>,
    /// Slow requests left out of the split: they started after the capture had stopped.
    pub after_capture: usize,
    /// The pause's stalls were read from the load's own records, past the capture's end
    /// (the split's component from the captured part).
    pub pause_from_records: bool,
    /// The hop behind the server whose wait is most of the tail's server time, when the
    /// server time is the tail's largest part.
    pub upstream: Option<TailUpstream>,
}

/// The tail's server time spent waiting on a hop behind the server (the upstream join's):
/// the time is the hop's, not the server's own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TailUpstream {
    /// Index of the hop in `layers.hops` most of the slow requests' exchanges went to.
    pub hop: u32,
    /// What the slow requests waited there beyond the typical request, µs.
    pub added_us: u64,
    /// Its share of the tail's excess.
    pub share: f64,
    /// Slow requests whose exchange on that hop was joined.
    pub requests: usize,
}

/// The hop the tail's server time waited on ([`JoinedTail::upstream`]): the server time is
/// the largest part, and at least half of it is the wait on upstreams; the hop is the one
/// most slow requests' exchanges went to.
fn upstream_of(s: &TailSplit, rs: &[RequestRecord], j: &RequestJoin) -> Option<TailUpstream> {
    let server = s
        .parts
        .first()
        .filter(|p| p.component == Component::Server)?;
    if s.upstream_us == 0 || s.upstream_us.saturating_mul(2) < server.added_us {
        return None;
    }
    let mut by_hop: HashMap<u32, usize> = HashMap::new();
    for (r, p) in rs.iter().zip(&j.requests) {
        if let Some(u) = p.upstream.filter(|_| r.wait_us >= s.at_us) {
            *by_hop.entry(u.hop).or_default() += 1;
        }
    }
    let (hop, requests) = by_hop
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))?;
    Some(TailUpstream {
        hop,
        added_us: s.upstream_us.min(server.added_us),
        share: (s.upstream_us.min(server.added_us) as f64 / s.excess_us.max(1) as f64).min(1.0),
        requests,
    })
}

/// The cause a component names, given the slow requests' hold kinds and whether their
/// connects waited for SYN retransmissions (`syn`).
fn cause_of(c: Component, hold: Option<FindingKind>, syn: bool) -> Option<Cause> {
    Some(match c {
        Component::Server => Cause::SlowServer,
        Component::Loss => Cause::PacketLoss,
        // A connect slow by milliseconds (a busy accept, a handshake behind other work) is
        // no SYN drop: only connects that waited for a retransmitted SYN name it.
        Component::Connect if syn => Cause::SynDrop,
        Component::Connect => return None,
        Component::Hold => match hold? {
            FindingKind::TcpCork => Cause::TcpCork,
            FindingKind::ZeroWindow | FindingKind::WindowFull => Cause::ReceiveWindow,
            _ => Cause::NagleDelayedAck,
        },
        Component::Unexplained => Cause::UnexplainedTail,
        Component::Delivery | Component::Transfer | Component::ClientRead => return None,
    })
}

/// The hold kind most of the slowest requests carry.
fn hold_kind(rs: &[RequestRecord], j: &RequestJoin, at_us: u64) -> Option<FindingKind> {
    let mut n = [0usize; FindingKind::ALL.len()];
    for (r, p) in rs.iter().zip(&j.requests) {
        if let Some(k) = p.hold_kind.filter(|_| r.wait_us >= at_us) {
            n[k.index()] += 1;
        }
    }
    let (i, &c) = n.iter().enumerate().max_by_key(|(_, c)| **c)?;
    (c > 0).then(|| FindingKind::ALL[i])
}

/// "every 7th request of a connection", "the 1st of every 7 ..."
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The mechanism of the split's largest part, with its evidence.
fn mechanism(s: &TailSplit) -> Option<(Mechanism, String)> {
    if s.parts.first()?.component != Component::Server {
        return None;
    }
    if let Some(e) = s.every_nth {
        let which = if e.residue + 1 == e.n {
            format!("on every {} request of a connection", ordinal(e.n))
        } else {
            format!(
                "on the request at index {} of every {} on a connection",
                e.residue, e.n
            )
        };
        let text = format!(
            "{which} ({} of such requests slow, {} of the others; {} of the slow ones at \
             that position)",
            pct(e.hit_there),
            pct(e.hit_elsewhere),
            pct(e.lined_up)
        );
        return Some((Mechanism::EveryNth, text));
    }
    let p = s.pause.as_ref()?;
    let text = format!(
        "in process-wide pauses every {} ({} stalls, each releasing {} connections at the \
         same instant; {} of the gaps on that period)",
        ms(p.period_us),
        p.stalls,
        p.connections,
        pct(p.on_period)
    );
    Some((Mechanism::PeriodicPause, text))
}

/// The tail of a run from its records and their join (`None` when either is missing, or
/// they do not belong together).
pub(super) fn joined(
    records: Option<&[RequestRecord]>,
    join: Option<&RequestJoin>,
    percentile: f64,
) -> Option<JoinedTail> {
    joined_from(records, join, percentile, None)
}

/// [`joined`] with the slow set starting at `from_us` when the caller knows where (a deep
/// tail's bound). Requests that started after the capture's last packet
/// ([`RequestJoin::captured_until_us`]: the capture stopped at its packet limit while the
/// load went on) carry no packets to split: the split reads the requests the capture
/// covered, and says how many slow ones it left out ([`JoinedTail::after_capture`]).
pub(super) fn joined_from(
    records: Option<&[RequestRecord]>,
    join: Option<&RequestJoin>,
    percentile: f64,
    from_us: Option<u64>,
) -> Option<JoinedTail> {
    let (rs, j) = (records?, join?);
    if rs.len() != j.requests.len() || j.matched == 0 {
        return None;
    }
    // The capture was cut when requests started after its last packet (its packet limit;
    // a capture stopping with the run ends a hair before the run's last records). Then a
    // request whose wait had not ended by its last packet has part of its wait unseen (a
    // missing response would read as server time): not covered either.
    let cut = j
        .captured_until_us
        .filter(|&u| rs.iter().any(|r| r.start_us > u));
    let covered = |r: &RequestRecord| cut.is_none_or(|u| r.start_us + r.wait_us <= u);
    let (all_rs, all_j) = (rs, j);
    let (rs, j, after_capture, from_us) = if rs.iter().all(covered) {
        (
            std::borrow::Cow::Borrowed(rs),
            std::borrow::Cow::Borrowed(j),
            0,
            from_us,
        )
    } else {
        let keep: Vec<usize> = (0..rs.len()).filter(|&k| covered(&rs[k])).collect();
        // The run's bound, not the covered part's own percentile.
        let slow_from = from_us.unwrap_or_else(|| weighted_at(rs, percentile));
        let left = (0..rs.len())
            .filter(|&k| !covered(&rs[k]) && rs[k].wait_us >= slow_from)
            .count();
        let mut j2 = j.clone();
        j2.requests = keep.iter().map(|&k| j.requests[k]).collect();
        let rs2: Vec<RequestRecord> = keep.iter().map(|&k| rs[k].clone()).collect();
        (
            std::borrow::Cow::Owned(rs2),
            std::borrow::Cow::Owned(j2),
            left,
            Some(slow_from),
        )
    };
    let (rs, j) = (rs.as_ref(), j.as_ref());
    let seen: Vec<bool> = j.requests.iter().map(|p| p.stream.is_some()).collect();
    let mut s = split(rs, &j.requests, &seen, percentile, from_us)?;
    // The run's own percentile, not the covered part's.
    s.percentile = percentile;
    // A pause the covered part shows as server time but too few times to call periodic:
    // the load's own records show whether the same stalls recur after the capture stopped
    // (every connection released at one instant, on a period). The component is the
    // capture's; only the pattern is read from the records (said so in the line).
    let mut pause_from_records = false;
    if after_capture > 0
        && s.pause.is_none()
        && s.every_nth.is_none()
        && s.parts
            .first()
            .is_some_and(|p| p.component == Component::Server)
    {
        let parts: Vec<_> = all_rs
            .iter()
            .zip(&all_j.requests)
            .map(|(r, p)| {
                let mut p = *p;
                if !covered(r) {
                    p.server_us += u64::try_from(p.unexplained_us).unwrap_or(0);
                    p.unexplained_us = 0;
                }
                p
            })
            .collect();
        let seen: Vec<bool> = all_rs
            .iter()
            .zip(&all_j.requests)
            .map(|(r, p)| p.stream.is_some() || !covered(r))
            .collect();
        // The whole run's top part must be the server's time too, and at least one of its
        // stalls must lie in the captured part (where the packets show that stall as the
        // server's): a periodic stall only after the capture could be the client's own.
        let until = cut.unwrap_or(u64::MAX);
        if let Some(p) = split(all_rs, &parts, &seen, percentile, from_us)
            .filter(|w| {
                w.parts
                    .first()
                    .is_some_and(|p| p.component == Component::Server)
            })
            .and_then(|w| w.pause)
            .filter(|p| p.ends_us.iter().any(|&e| e <= until))
        {
            s.pause = Some(p);
            pause_from_records = true;
        }
    }
    let hold = hold_kind(rs, j, s.at_us);
    // The slow set's connects that waited for a SYN retransmission: two at least (or the one
    // of a set under 20) — one such connect among hundreds adds its second to their mean but
    // is that request, not the tail's shape (a c=32 run whose one connect waited 1 s among
    // 845 slow requests read "syn-drop +1.25 ms" at its p99).
    let slow = rs.iter().filter(|r| r.wait_us >= s.at_us);
    let (n, waited) = slow.fold((0usize, 0usize), |(n, w), r| {
        (
            n + 1,
            w + usize::from(crate::adapters::app::syn_retransmitted(r)),
        )
    });
    let syn = waited >= 2 || (waited == 1 && n < 20);
    let mech = mechanism(&s);
    let mut parts: Vec<TailPart> = Vec::new();
    for p in &s.parts {
        let Some(cause) = cause_of(p.component, hold, syn) else {
            continue;
        };
        parts.push(TailPart {
            cause,
            mechanism: None,
            added_us: p.added_us,
            share: p.share,
        });
    }
    if let (Some(first), Some((m, _))) = (parts.first_mut(), &mech)
        && first.cause == Cause::SlowServer
    {
        first.mechanism = Some(*m);
    }
    let upstream = upstream_of(&s, rs, j);
    Some(JoinedTail {
        parts,
        split: s,
        mechanism: mech,
        after_capture,
        pause_from_records,
        upstream,
    })
}

/// The weighted wait at `percentile` of the records.
fn weighted_at(rs: &[RequestRecord], percentile: f64) -> u64 {
    let mut v: Vec<(u64, f64)> = rs.iter().map(|r| (r.wait_us, r.weight)).collect();
    v.sort_by_key(|x| x.0);
    quantile(&v, percentile / 100.0)
}

impl JoinedTail {
    /// Whether the capture saw every slow request whole: no slow one after it stopped, none
    /// missing from it, and no pattern read from the records instead of the packets.
    pub(super) fn complete(&self) -> bool {
        self.split.slow_matched == self.split.slow
            && self.after_capture == 0
            && !self.pause_from_records
    }

    /// Whether most of the slow requests came after the capture stopped: what it shows of
    /// them is too little to rule a cause out.
    pub(super) fn mostly_uncaptured(&self) -> bool {
        self.after_capture > 0 && self.after_capture >= self.split.slow
    }

    /// The tail line's explanation: "100% server time (+40.1 ms), on every 7th request of a
    /// connection".
    pub(super) fn text(&self) -> String {
        let Some(s) = self.split.parts.first() else {
            return "no component of their wait stands out".into();
        };
        let mut t = format!(
            "{} {} (+{})",
            pct(s.share),
            s.component.name(),
            ms(s.added_us)
        );
        if let Some((_, m)) = &self.mechanism {
            t.push_str(", ");
            t.push_str(m.split(" (").next().unwrap_or(m));
        }
        t
    }

    /// The evidence line: how many slow requests the capture saw, the split, the mechanism.
    pub(super) fn line(&self) -> String {
        let s = &self.split;
        let parts: Vec<String> = s
            .parts
            .iter()
            .map(|p| {
                let upstream = match self.upstream {
                    Some(u) if p.component == Component::Server => format!(
                        " — of it +{} their wait on the exchanges they caused behind the \
                         server ({} of them joined to one)",
                        ms(u.added_us),
                        u.requests
                    ),
                    _ => String::new(),
                };
                format!(
                    "{} +{} ({}){upstream}",
                    p.component.name(),
                    ms(p.added_us),
                    pct(p.share)
                )
            })
            .collect();
        let after = if self.after_capture > 0 && s.slow == 0 {
            format!(
                " (all {} of them started after the capture stopped: it saw none)",
                self.after_capture
            )
        } else if self.after_capture > 0 {
            format!(
                " ({} more started after the capture stopped and are left out)",
                self.after_capture
            )
        } else {
            String::new()
        };
        let mut t = format!(
            "per request: {} requests at or above the {} ({}), {} of them seen in the \
             capture{after}; over the typical request they wait +{}: {}",
            s.slow,
            super::percentile_label(s.percentile),
            ms(s.at_us),
            s.slow_matched,
            ms(s.excess_us),
            parts.join(", ")
        );
        if let Some((_, m)) = &self.mechanism {
            t.push_str("; ");
            t.push_str(m);
            if self.pause_from_records {
                t.push_str(
                    " — the stalls read from the load's own records over the whole run, \
                     the capture having stopped before enough of them",
                );
            }
        }
        t
    }
}

#[cfg(test)]
#[path = "tail_join_tests.rs"]
mod tests;
