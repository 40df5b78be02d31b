//! `dropped-before-wire` (cause `packet-loss`): the server host dropped its own segments
//! before they reached the wire — an nftables rule on its output path, or a qdisc on its
//! egress device that was full.
//!
//! ## What the kernel does
//! A segment dropped on the sending host never reaches the capture point (the tap sits after
//! the netfilter output hook and after the qdisc). The drop is synchronous: `ip_local_out`
//! (netfilter: `-EPERM`) or the qdisc's enqueue (`NET_XMIT_DROP`) returns an error to
//! `tcp_write_xmit`, which stops and keeps the segment *unsent* at the head of the write
//! queue — no retransmission is counted, none is visible. It leaves on the next trigger:
//! - the next ACK from the peer (`tcp_ack` → `tcp_data_snd_check`), when earlier data of
//!   the response is in flight: at the capture point the segment follows the client's ACK
//!   within a path RTT — the packets' `held-until-ack` finding (a sub-MSS segment held until
//!   the ACK with Nagle ruled out);
//! - the zero-window probe timer, when nothing is in flight (the *first* segment of a
//!   response was dropped): `tcp_check_probe_timer` arms it for `max(RTO, TCP_RTO_MIN)`,
//!   at least [`TCP_RTO_MIN_US`], doubling while the retries are dropped too. The capture
//!   then shows nothing to hold — only a response that appears late, which the join would
//!   count as the server's time. [`reattributed`] moves that wait to loss recovery when the
//!   host layer shows the local drops.
//!
//! ## The evidence it takes
//! The host layer's drops: the `NETFILTER_DROP` (and egress qdisc/tc) reasons of the
//! `skb:kfree_skb` tracepoint, and the namespace's qdisc drop counters (rtnetlink, the
//! numbers `tc -s qdisc` prints). A drop count that is machine-wide (`scope` `machine`)
//! can hold anyone's drops: it names the mechanism only when the target's own packets show
//! the holds, never on its own. Volume: every held segment or late first segment needs at
//! least one drop, so fewer drops than half of them (the tracer may lose samples; then the
//! count is a lower bound and not checked) do not account for them.

use std::borrow::Cow;

use lagtrace_model::diagnosis::evidence::RequestJoin;
use lagtrace_model::diagnosis::evidence::RequestParts;
use lagtrace_model::host::{HostReport, QdiscDelta};
use lagtrace_model::{Cause, FindingKind, RequestRecord};

use super::Direct;
use super::facts::Facts;
use super::{MATERIAL_ADDED_US, MATERIAL_LOSS_SHARE, ms, pct, sup};
use crate::evidence::{FindingSummary, LayerName};
use crate::verdict::{EvidenceLine, Fix, FixSide, Mechanism};

/// Linux's `TCP_RTO_MIN` (200 ms): the zero-window probe timer that sends a segment left
/// unsent by a local drop fires no sooner (`tcp_probe0_base` = max(RTO, `TCP_RTO_MIN`)).
pub const TCP_RTO_MIN_US: u64 = 200_000;
/// Probe retries looked for: the wait doubles with each dropped retry.
const MAX_PROBES: u32 = 5;

/// `skb:kfree_skb` reasons of a drop on the local output path by netfilter.
const NETFILTER_REASONS: &[&str] = &["NETFILTER_DROP", "BPF_CGROUP_EGRESS"];
/// ... and by a qdisc or a tc egress filter.
const QDISC_REASONS: &[&str] = &[
    "QDISC_DROP",
    "QDISC_OVERLIMIT",
    "QDISC_CONGESTED",
    "CAKE_FLOOD",
    "FQ_BAND_LIMIT",
    "FQ_HORIZON_LIMIT",
    "FQ_FLOW_LIMIT",
    "TC_EGRESS",
];

/// The server host's local drops over the window.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LocalDrops<'a> {
    /// Netfilter drops by reason (the tracepoint), when any.
    pub netfilter: u64,
    /// Qdisc/tc drops by reason (the tracepoint).
    pub qdisc_reason: u64,
    /// What the reason counts cover (`machine`, or the namespace/device the tracer saw).
    pub scope: &'a str,
    /// Whether the tracer lost samples (counts are lower bounds).
    pub lost: bool,
    /// The namespace's qdiscs that dropped packets themselves, most first, with those
    /// drops: a classful parent (htb, prio, ...) also counts the drops of the qdiscs below
    /// it, so the one named is the child whose queue was full.
    pub qdiscs: Vec<(&'a QdiscDelta, u64)>,
}

impl LocalDrops<'_> {
    /// Qdisc drops (the namespace's qdisc counters and the tracepoint see the same drops:
    /// the larger of the two).
    pub(super) fn qdisc(&self) -> u64 {
        self.own_qdisc().max(self.qdisc_reason)
    }

    /// The drops the qdiscs made themselves (each drop once, at the qdisc that made it).
    fn own_qdisc(&self) -> u64 {
        self.qdiscs.iter().map(|q| q.1).sum()
    }

    /// Drops in all.
    pub(super) fn total(&self) -> u64 {
        self.netfilter + self.qdisc()
    }

    /// Whether `needed` drops are accounted for.
    fn account_for(&self, needed: u64) -> bool {
        self.lost || self.total() * 2 >= needed
    }
}

/// The local drops the host layer shows, when there are any.
pub(super) fn local_drops(host: &HostReport) -> Option<LocalDrops<'_>> {
    let drops = host.drops.get();
    let count = |names: &[&str]| -> u64 {
        drops.map_or(0, |d| {
            d.reasons
                .iter()
                .filter(|r| names.contains(&r.reason.as_str()))
                .map(|r| r.count)
                .sum()
        })
    };
    let mut qdiscs = host.qdiscs.get().map(|v| own_drops(v)).unwrap_or_default();
    qdiscs.sort_by_key(|q| std::cmp::Reverse(q.1));
    let l = LocalDrops {
        netfilter: count(NETFILTER_REASONS),
        qdisc_reason: count(QDISC_REASONS),
        scope: drops.map_or("machine", |d| d.scope.as_str()),
        lost: drops.is_some_and(|d| d.lost > 0),
        qdiscs,
    };
    (l.total() > 0).then_some(l)
}

/// The major number of a handle as `tc` prints it (`10:` and `1:1` → `10`, `1`); none for
/// `root` and `ingress`.
fn major(handle: &str) -> Option<&str> {
    handle.split_once(':').map(|(m, _)| m)
}

/// The qdiscs that dropped packets themselves, with those drops: a qdisc's drops less
/// those of the qdiscs whose parent is one of its classes (a classful qdisc counts its
/// children's drops as its own: `tc -s qdisc` shows them at both levels).
fn own_drops(all: &[QdiscDelta]) -> Vec<(&QdiscDelta, u64)> {
    all.iter()
        .filter(|q| q.drops > 0)
        .filter_map(|q| {
            let below: u64 = all
                .iter()
                .filter(|c| c.dev == q.dev && c.handle != q.handle)
                .filter(|c| major(&c.parent).is_some_and(|m| Some(m) == major(&q.handle)))
                .map(|c| c.drops)
                .sum();
            let own = q.drops.saturating_sub(below);
            (own > 0).then_some((q, own))
        })
        .collect()
}

/// The held segments of the target's packets: `held-until-ack` findings.
fn held<'a>(x: &Facts<'a>) -> Option<&'a FindingSummary> {
    x.finding(FindingKind::HeldUntilAck)
}

/// A component's median and p90 over the joined requests (`keep`: those the caller
/// judges), each record standing for its `weight` requests (the fast ones are sampled), µs.
fn spread_us(
    rs: &[RequestRecord],
    j: &RequestJoin,
    part: fn(&RequestParts) -> u64,
    keep: &dyn Fn(&RequestParts) -> bool,
) -> (u64, u64) {
    let mut v: Vec<(u64, f64)> = rs
        .iter()
        .zip(&j.requests)
        .filter(|(_, p)| p.stream.is_some() && keep(p))
        .map(|(r, p)| (part(p), r.weight.max(0.0)))
        .collect();
    v.sort_unstable_by_key(|x| x.0);
    let total: f64 = v.iter().map(|x| x.1).sum();
    let at = |q: f64| {
        let mut acc = 0.0;
        v.iter()
            .find(|x| {
                acc += x.1;
                acc >= q * total
            })
            .map_or(0, |x| x.0)
    };
    (at(0.5), at(0.9))
}

/// Linux's `TCP_RESOURCE_PROBE_INTERVAL` (500 ms): after a probe that a qdisc dropped
/// (local congestion, `NET_XMIT_DROP`), the next probe waits this, without backing off.
pub const TCP_RESOURCE_PROBE_US: u64 = 500_000;

/// The timer's wait in a time `excess_us` over the typical, when the excess lies on the
/// kernel's schedule: the first probe (or the client's RTO) after `TCP_RTO_MIN`, then the
/// timer doubling while retries are dropped (`TCP_RTO_MIN × (2^k − 1)`), or, after
/// qdisc drops (`qdisc`), every `TCP_RESOURCE_PROBE_INTERVAL`. No sooner than the timer,
/// and no later than the timer wheel's rounding (an eighth of the timeout) plus `spread_us`,
/// how much the component varies on its own.
fn probe_wait_us(excess_us: u64, spread_us: u64, qdisc: bool) -> Option<u64> {
    let backoff = (1..=MAX_PROBES).map(|k| TCP_RTO_MIN_US * ((1u64 << k) - 1));
    let resource = (1..MAX_PROBES)
        .map(|k| TCP_RTO_MIN_US + TCP_RESOURCE_PROBE_US * u64::from(k))
        .filter(|_| qdisc);
    backoff
        .chain(resource)
        .filter(|&w| (w..=w + w / 8 + spread_us).contains(&excess_us))
        .max()
}

/// A late first response segment, and the wait it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Late {
    /// Index into the records (and the join's requests).
    index: usize,
    /// The wait moved to loss recovery.
    wait_us: u64,
    /// Seen as the request's delivery (the client's retransmission of a request whose ACK
    /// went with the dropped response released it) rather than the server's time.
    delivery: bool,
}

/// Requests whose first response segment left at a retransmission timer, on the kernel's
/// schedule: either the server's probe timer (the wait shows as the server's time), or the
/// client's RTO — the server's ACK of the request rode on the dropped segment, so the
/// client sends the request again and its arrival releases the response (the wait shows as
/// the request's delivery, the copy D-SACKed and free on the path's account).
fn late_first(rs: &[RequestRecord], j: &RequestJoin, qdisc: bool) -> Vec<Late> {
    if rs.len() != j.requests.len() {
        return Vec::new();
    }
    // The server's own time: a wait on its upstream (the request's exchange behind it,
    // from the upstream join) is no segment of its own held at a timer — a drop on the hop
    // shows on the front as a late response all the same, and is the hop's.
    // Where the hops were joined, a request left unjoined may have waited on an exchange
    // the join could not place: its server time says nothing of the server's own segments.
    let own = |p: &RequestParts| p.server_us.saturating_sub(p.upstream_us);
    let joined = j.requests.iter().any(|p| p.upstream.is_some());
    let keep = |p: &RequestParts| !joined || p.upstream.is_some();
    let (server, server90) = spread_us(rs, j, own, &keep);
    let (delivery, delivery90) = spread_us(rs, j, |p| p.delivery_us, &keep);
    j.requests
        .iter()
        .enumerate()
        .filter(|(_, p)| p.stream.is_some() && keep(p))
        .filter_map(|(index, p)| {
            let s = probe_wait_us(own(p).saturating_sub(server), server90 - server, qdisc);
            let d = probe_wait_us(
                p.delivery_us.saturating_sub(delivery),
                delivery90 - delivery,
                qdisc,
            );
            match (s, d) {
                (Some(wait_us), _) => Some(Late {
                    index,
                    wait_us,
                    delivery: false,
                }),
                (None, Some(wait_us)) => Some(Late {
                    index,
                    wait_us,
                    delivery: true,
                }),
                (None, None) => None,
            }
        })
        .collect()
}

/// The join with each late first response segment's probe wait moved from the server's
/// time to loss recovery, when the host layer shows local drops enough for them and the
/// held segments (each needs one): see the module's doc. Otherwise the join as it is.
pub(super) fn reattributed<'a>(
    x: &Facts<'_>,
    rs: Option<&[RequestRecord]>,
    j: &'a RequestJoin,
) -> Cow<'a, RequestJoin> {
    let (Some(d), Some(rs)) = (x.host.and_then(local_drops), rs) else {
        return Cow::Borrowed(j);
    };
    let late = late_first(rs, j, d.qdisc() > 0);
    let needed = late.len() as u64 + held(x).map_or(0, |h| h.count);
    if late.is_empty() || !d.account_for(needed) || timed(x, &late).is_some_and(|t| t.elsewhere()) {
        return Cow::Borrowed(j);
    }
    let mut out = j.clone();
    for l in late {
        let p = &mut out.requests[l.index];
        if l.delivery {
            p.delivery_us -= l.wait_us;
        } else {
            p.server_us -= l.wait_us;
        }
        p.loss_us += l.wait_us;
    }
    Cow::Owned(out)
}

/// Whether a held-until-ack summary matters the way a retransmission does (the loss rule's
/// bar): a few instances on a material share, with RTO-class waits or a material cost.
fn material(f: &FindingSummary) -> bool {
    f.count >= 3
        && f.share >= MATERIAL_LOSS_SHARE
        && (f.median_added_us >= 20_000 || f.share * f.median_added_us as f64 >= 500.0)
}

/// `dropped-before-wire`: the target's packets show segments held until an ACK (or first
/// segments sent at the probe timer, in the c=N join), and the host layer shows local
/// drops enough for them. `tail_loss`: the tail's largest part is loss recovery (then the
/// holds matter however few they are).
pub(super) fn dropped(x: &Facts<'_>, tail_loss: bool) -> Option<Direct> {
    let d = local_drops(x.host?)?;
    let h = held(x);
    let mut late = late_of(x, &d);
    // The host's drops placed in time: late responses that did not wait through any are
    // late for another reason.
    let when = timed(x, &late);
    if when.is_some_and(|t| t.elsewhere()) {
        late.clear();
    }
    let needed = h.map_or(0, |h| h.count) + late.len() as u64;
    let matters = h.is_some_and(material) || (tail_loss && needed > 0);
    if !matters || !d.account_for(needed) {
        return None;
    }
    let mut evidence = Vec::new();
    if let Some(h) = h {
        evidence.push(sup(LayerName::Packets, Cause::PacketLoss, held_line(h, x)));
    }
    if !late.is_empty() {
        evidence.push(sup(
            LayerName::Packets,
            Cause::PacketLoss,
            late_line(x, &late),
        ));
    }
    evidence.push(host_line(&d, x.host?, needed));
    if let Some(t) = when.filter(|_| !late.is_empty()) {
        evidence.push(sup(
            LayerName::Host,
            Cause::PacketLoss,
            t.text("late responses"),
        ));
    }
    let (added_us, share, counted) = match h {
        Some(h) => (
            h.median_added_us.max(MATERIAL_ADDED_US),
            h.share,
            Some((h.transactions, Some(x.transactions()))),
        ),
        None => {
            let total = x.cn.and_then(|r| r.waits.as_ref()).map_or(0, |w| w.count);
            let mut w: Vec<u64> = late.iter().map(|l| l.wait_us).collect();
            w.sort_unstable();
            (
                w[w.len() / 2],
                late.len() as f64 / total.max(1) as f64,
                Some((late.len() as u64, Some(total))),
            )
        }
    };
    Some(Direct {
        cause: Cause::PacketLoss,
        mechanism: Mechanism::DroppedBeforeWire,
        evidence,
        fix: fix(&d, x.host?, needed),
        added_us,
        share,
        counted,
    })
}

/// The packets' line for the late first segments.
fn late_line(x: &Facts<'_>, late: &[Late]) -> String {
    let by_client = late.iter().filter(|l| l.delivery).count();
    let streams: Vec<String> =
        x.cn.and_then(|r| super::facts::join_of(x, r))
            .map(|j| {
                late.iter()
                    .filter_map(|l| j.requests[l.index].stream)
                    .take(5)
                    .map(|s| s.to_string())
                    .collect()
            })
            .unwrap_or_default();
    format!(
        "{} responses of {} left a retransmission timer late (+{}, the kernel's \
         max(RTO, 200 ms) schedule) with nothing of them on the wire before: their first \
         segment was dropped before the wire and sent again at the server's probe timer \
         ({}) or on the client's retransmitted request, whose ACK it carried ({}); e.g. \
         streams {}; counted as loss recovery, not the server's time",
        late.len(),
        x.cn.map_or_else(String::new, |r| r.run_name()),
        ms(late.iter().map(|l| l.wait_us).min().unwrap_or(0)),
        late.len() - by_client,
        by_client,
        streams.join(", ")
    )
}

/// The packets' line: the held segments, with an example (stream, frames, time).
fn held_line(h: &FindingSummary, x: &Facts<'_>) -> String {
    format!(
        "{}: {} segments of {} of {} transactions ({}) left only with the client's next ACK \
         (median +{}, p99 +{}), with no retransmission on the wire and the sender's \
         TCP_NODELAY on: they were dropped before the wire and sent again on the ACK{}",
        h.kind,
        h.count,
        h.transactions,
        x.transactions(),
        pct(h.share),
        ms(h.median_added_us),
        ms(h.p99_added_us),
        super::example_text(h)
    )
}

/// Where the host dropped them, in words.
fn host_line(d: &LocalDrops<'_>, host: &HostReport, needed: u64) -> EvidenceLine {
    let mut parts = Vec::new();
    if d.netfilter > 0 {
        parts.push(format!(
            "{} packets dropped by netfilter (skb:kfree_skb reason NETFILTER_DROP, {})",
            d.netfilter,
            scope_text(d.scope)
        ));
    }
    for (q, own) in &d.qdiscs {
        parts.push(format!(
            "qdisc {} {}{} on {} dropped {own} packets ({} in all, as `tc -s qdisc` counts; \
             sent {}, overlimits {})",
            q.kind,
            q.handle,
            below(q),
            q.dev,
            q.drops_total,
            q.packets,
            q.overlimits
        ));
    }
    if d.qdiscs.is_empty() && d.qdisc_reason > 0 {
        parts.push(format!(
            "{} packets dropped by a qdisc or tc egress (skb:kfree_skb, {})",
            d.qdisc_reason,
            scope_text(d.scope)
        ));
    }
    sup(
        LayerName::Host,
        Cause::PacketLoss,
        format!(
            "the server host dropped packets before the wire over {}: {}; enough for the \
             {needed} segments the packets show held or late{}",
            ms(host.window_us),
            parts.join("; "),
            if d.lost {
                " (the tracer lost samples: counts are lower bounds)"
            } else {
                ""
            }
        ),
    )
}

fn scope_text(scope: &str) -> String {
    if scope == "machine" {
        "machine-wide: the target's own held or late segments tie them to it".into()
    } else {
        format!("counted for {scope}")
    }
}

/// Where the server host dropped them, for the tail line: "by netfilter", "by the tbf
/// qdisc on veth0".
pub(super) fn where_text(x: &Facts<'_>) -> Option<String> {
    let d = local_drops(x.host?)?;
    let needed = held(x).map_or(0, |h| h.count) + late_of(x, &d).len() as u64;
    Some(match named_qdisc(&d, needed) {
        Some(top) if top.parent == "root" => format!("by the {} qdisc on {}", top.kind, top.dev),
        Some(top) => format!(
            "by the {} qdisc {}{} on {}",
            top.kind,
            top.handle,
            below(top),
            top.dev
        ),
        None if d.netfilter > 0 => "by netfilter".into(),
        None => "by a qdisc".into(),
    })
}

/// The host's drops on the output path placed in time, joined with the late responses'
/// requests.
fn timed(x: &Facts<'_>, late: &[Late]) -> Option<super::facts::TimedDrops> {
    let recs = x.cn?.records.as_ref()?;
    let reasons: Vec<&str> = NETFILTER_REASONS
        .iter()
        .chain(QDISC_REASONS)
        .copied()
        .collect();
    (!late.is_empty())
        .then(|| {
            super::facts::waited_through_drops(
                x.host?,
                &reasons,
                recs,
                late.iter().map(|l| l.index),
            )
        })
        .flatten()
}

/// The c=N run's late first segments.
fn late_of(x: &Facts<'_>, d: &LocalDrops<'_>) -> Vec<Late> {
    x.cn.and_then(|r| Some((&r.records.as_ref()?.records, super::facts::join_of(x, r)?)))
        .map(|(rs, j)| late_first(rs, j, d.qdisc() > 0))
        .unwrap_or_default()
}

/// The qdisc to name: the namespace's own qdisc counters (the server's, unlike a
/// machine-wide `NETFILTER_DROP` count that another namespace's rule may have made) when they
/// account for the `needed` segments on their own, or outnumber netfilter's drops.
fn named_qdisc<'a>(d: &LocalDrops<'a>, needed: u64) -> Option<&'a QdiscDelta> {
    let top = d.qdiscs.first()?.0;
    let own = d.own_qdisc();
    (own * 2 >= needed || own >= d.netfilter).then_some(top)
}

/// A qdisc's parent when it is not the device's root: " (parent 1:1)", a class of the
/// qdisc above it.
fn below(q: &QdiscDelta) -> String {
    match q.parent.as_str() {
        "root" => String::new(),
        p => format!(" (parent {p})"),
    }
}

/// The fix: where to look, in the server's namespace.
fn fix(d: &LocalDrops<'_>, host: &HostReport, needed: u64) -> Fix {
    // Commands run in the server's namespace.
    let ns = match (&host.scope.netns, host.scope.pid) {
        (Some(n), _) => format!("ip netns exec {n} "),
        (None, Some(p)) => format!("nsenter -t {p} -n "),
        (None, None) => String::new(),
    };
    let (location, change) = match named_qdisc(d, needed) {
        Some(top) => (
            Some(format!(
                "{} qdisc {}{} on {}",
                top.kind,
                top.handle,
                below(top),
                top.dev
            )),
            format!(
                "the {} qdisc {}{} on {} drops the server's outgoing segments (its queue is \
                 full): check `{ns}tc -s qdisc show dev {}` and raise its limit/burst, or \
                 remove the shaping",
                top.kind,
                top.handle,
                below(top),
                top.dev,
                top.dev
            ),
        ),
        _ => (
            Some("netfilter output path".into()),
            format!(
                "a netfilter rule drops the server's outgoing segments: find it with \
                 `{ns}nft list ruleset` (a rule on the output/postrouting hook with drop, \
                 numgen, limit or quota) and remove or narrow it"
            ),
        ),
    };
    Fix {
        side: FixSide::Server,
        location,
        change,
        tradeoff: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_wait_is_the_kernels_schedule_never_less_than_rto_min() {
        assert_eq!(probe_wait_us(150_000, 100, false), None);
        assert_eq!(probe_wait_us(199_999, 100, false), None);
        assert_eq!(probe_wait_us(204_000, 100, false), Some(200_000));
        // Beyond the timer's rounding and the server's own spread: a slow server.
        assert_eq!(probe_wait_us(260_000, 100, false), None);
        assert_eq!(probe_wait_us(260_000, 40_000, false), Some(200_000));
        // A retry dropped too: the timer doubled (200 + 400 ms).
        assert_eq!(probe_wait_us(610_000, 100, false), Some(600_000));
        assert_eq!(probe_wait_us(1_000_000, 100, false), None);
        // After qdisc drops the retries wait the resource probe interval (200 + 500 ms).
        assert_eq!(probe_wait_us(705_000, 100, false), None);
        assert_eq!(probe_wait_us(705_000, 100, true), Some(700_000));
    }

    fn q(dev: &str, kind: &str, handle: &str, parent: &str, drops: u64) -> QdiscDelta {
        QdiscDelta {
            dev: dev.into(),
            kind: kind.into(),
            handle: handle.into(),
            parent: parent.into(),
            packets: 100,
            bytes: 100_000,
            drops,
            overlimits: 0,
            requeues: 0,
            drops_total: drops,
            qlen: 0,
            backlog_bytes: 0,
            backlog_sampled: None,
        }
    }

    #[test]
    fn a_classful_parent_counting_its_childs_drops_is_not_the_one_named() {
        // htb 1: root, its class 1:1 holds tbf 10:, which dropped 40; htb counts them too.
        // On another device a root tbf dropped 5; a parent that dropped some of its own
        // keeps those.
        let all = vec![
            q("veth0", "htb", "1:", "root", 40),
            q("veth0", "tbf", "10:", "1:1", 40),
            q("veth0", "pfifo", "20:", "1:2", 0),
            q("veth1", "tbf", "8001:", "root", 5),
            q("veth2", "htb", "1:", "root", 7),
            q("veth2", "pfifo", "30:", "1:3", 4),
        ];
        let own: Vec<(&str, &str, u64)> = own_drops(&all)
            .into_iter()
            .map(|(q, n)| (q.dev.as_str(), q.kind.as_str(), n))
            .collect();
        assert_eq!(
            own,
            vec![
                ("veth0", "tbf", 40),
                ("veth1", "tbf", 5),
                ("veth2", "htb", 3),
                ("veth2", "pfifo", 4)
            ]
        );
        assert_eq!(below(&all[1]), " (parent 1:1)");
        assert_eq!(below(&all[3]), "");
    }

    fn rec() -> RequestRecord {
        RequestRecord {
            conn: 0,
            local: None,
            remote: "10.0.0.2:80".parse().unwrap(),
            index: 1,
            start_us: 0,
            wait_us: 1_000,
            connect_start_us: 0,
            connect_end_us: Some(1),
            syn_retransmits: Some(0),
            intended_us: None,
            sent_first_us: Some(0),
            sent_last_us: Some(0),
            first_byte_us: Some(1),
            last_byte_us: Some(1),
            bytes: 1,
            status: Some(200),
            error: None,
            pending: false,
            slow: false,
            weight: 1.0,
        }
    }

    #[test]
    fn late_first_segments_are_a_timer_wait_over_the_typical_server_or_delivery_time() {
        let p = |server_us: u64, delivery_us: u64| RequestParts {
            stream: Some(1),
            server_us,
            delivery_us,
            ..RequestParts::default()
        };
        let mut requests: Vec<RequestParts> = (0..20).map(|_| p(300, 20)).collect();
        let mut rs: Vec<RequestRecord> = (0..20).map(|_| rec()).collect();
        // The fast requests are sampled: each kept one stands for 50.
        for r in &mut rs {
            r.weight = 50.0;
        }
        for (s, d) in [
            (204_500, 20),
            (150_000, 20),
            (300, 208_000),
            (1_000_000, 20),
        ] {
            requests.push(p(s, d));
            rs.push(RequestRecord {
                slow: true,
                ..rec()
            });
        }
        // Not seen in the capture: not judged.
        requests.push(RequestParts {
            stream: None,
            server_us: 204_000,
            ..RequestParts::default()
        });
        rs.push(rec());
        let j = RequestJoin {
            concurrency: 8,
            offset_us: Some(0),
            offset_uncertainty_us: 0,
            offset_consistent: true,
            matched: 24,
            captured_until_us: None,
            requests,
        };
        let late = |index, delivery| Late {
            index,
            wait_us: 200_000,
            delivery,
        };
        assert_eq!(
            late_first(&rs, &j, false),
            vec![late(20, false), late(22, true)]
        );
    }
}
