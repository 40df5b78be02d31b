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

use lagtrace_model::diagnosis::evidence::RequestJoin;
use lagtrace_model::{Cause, FindingKind, RequestRecord};

use super::{ms, pct};
use crate::join::tail::{Component, TailSplit, split};
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
    let (rs, j) = (records?, join?);
    if rs.len() != j.requests.len() || j.matched == 0 {
        return None;
    }
    let seen: Vec<bool> = j.requests.iter().map(|p| p.stream.is_some()).collect();
    let s = split(rs, &j.requests, &seen, percentile)?;
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
    Some(JoinedTail {
        parts,
        split: s,
        mechanism: mech,
    })
}

impl JoinedTail {
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
                format!(
                    "{} +{} ({})",
                    p.component.name(),
                    ms(p.added_us),
                    pct(p.share)
                )
            })
            .collect();
        let mut t = format!(
            "per request: the {} requests at or above the p{} ({}) were seen in the capture \
             {} times; over the typical request they wait +{}: {}",
            s.slow,
            s.percentile,
            ms(s.at_us),
            s.slow_matched,
            ms(s.excess_us),
            parts.join(", ")
        );
        if let Some((_, m)) = &self.mechanism {
            t.push_str("; ");
            t.push_str(m);
        }
        t
    }
}

#[cfg(test)]
#[path = "tail_join_tests.rs"]
mod tests;
