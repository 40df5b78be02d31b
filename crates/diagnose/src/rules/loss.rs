//! `packet-loss`: segments lost (on the path or before the wire) and recovered by
//! retransmission. Shown by the packets' retransmissions; the application's tail and lost
//! SYN probes under load corroborate.
//!
//! `pmtu-black-hole` when the packets show one (`analyze`'s `black_hole`): the same
//! full-size segments resent and never acknowledged on several connections while the
//! sender's smaller segments pass after them. A random loss lets a resend through; a link
//! that is down passes nothing; only a size limit passes the small and never the large.
//! The fixes are then the path MTU's: let the ICMP through, clamp the MSS, or probe.
//!
//! Lost inside the server's host, not on the path, when a capture next to the server
//! (`packets.inbound_lost`) saw the clients' segments pass and then sent again, the second
//! copies acknowledged as new data: a copy that had reached the server's TCP would be
//! acknowledged with a D-SACK (RFC 2883; Linux reports one by default, `tcp_dsack`). The
//! first copies were dropped on the host's input path, after the capture point. The host
//! layer names by whom (`host.rs`: a netfilter rule, `dropped-by-netfilter`).

use lagtrace_model::analyze::BlackHole;
use lagtrace_model::diagnosis::evidence::InboundLost;
use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{
    Candidate, CauseRule, MATERIAL_LOSS_SHARE, finding_text, frames_text, has, ms, out, pct, sup,
};
use crate::evidence::{FindingSummary, LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide, Mechanism};

pub(super) struct Loss;

const CAUSE: Cause = Cause::PacketLoss;

/// The run whose requests timed out most, when no request of any run completed: the
/// responses never arrived (their segments are resent and never acknowledged).
fn none_completed<'a>(x: &Facts<'a>) -> Option<&'a crate::evidence::AppRun> {
    if x.main_run().is_some() {
        return None;
    }
    x.runs
        .iter()
        .copied()
        .filter(|r| r.errors.timeout > 0)
        .max_by_key(|r| r.errors.timeout)
}

/// What the application shows of the loss: a tail at the retransmission wait, or timeouts.
fn app_line(x: &Facts<'_>, f: &FindingSummary) -> Option<EvidenceLine> {
    if let Some(run) = none_completed(x) {
        return Some(sup(
            LayerName::App,
            CAUSE,
            format!(
                "{}: no request completed; {} timed out after the connection was made: \
                 the responses never arrived",
                run.label(),
                run.errors.timeout
            ),
        ));
    }
    let run = x.main_run()?;
    if f.share >= 0.01
        && run.latency.p99_us >= f.median_added_us / 2
        && run.latency.p99_us >= run.latency.p50_us * 4
    {
        return Some(sup(
            LayerName::App,
            CAUSE,
            format!(
                "{}: p99 {} against p50 {}: the tail is the retransmission wait",
                run.label(),
                ms(run.latency.p99_us),
                ms(run.latency.p50_us)
            ),
        ));
    }
    (run.errors.timeout + run.errors.read > 0).then(|| {
        sup(
            LayerName::App,
            CAUSE,
            format!(
                "{}: {} timeouts, {} read errors; p99 {}",
                run.label(),
                run.errors.timeout,
                run.errors.read,
                ms(run.latency.p99_us)
            ),
        )
    })
}

impl CauseRule for Loss {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn network(&self) -> bool {
        true
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        // A few fast retransmissions or tail-loss probes a few ms apart are normal on a busy
        // link; what users feel is RTO-class waits or a cost of more than ~0.5 ms per
        // request.
        let material = |f: &&FindingSummary| {
            f.count >= 3
                && f.share >= MATERIAL_LOSS_SHARE
                && (f.median_added_us >= 20_000 || f.share * f.median_added_us as f64 >= 500.0)
        };
        // Segments whose first copies never reached the capture (their sender's IPv4
        // identifications skip them) are losses the capture shows no retransmission of.
        let f = x
            .finding(FindingKind::Retransmission)
            .filter(material)
            .or_else(|| {
                x.finding(FindingKind::DroppedBeforeCapture)
                    .filter(material)
            })?;
        let mut c = Candidate::new(CAUSE, f.median_added_us, f.share, vec![LayerName::Packets]);
        c.counted = Some((f.transactions, Some(x.transactions())));
        c.evidence.push(sup(
            LayerName::Packets,
            CAUSE,
            finding_text(f, x.transactions()),
        ));
        if let Some(h) = black_hole(x) {
            c.mechanism = Some(Mechanism::PmtuBlackHole);
            c.evidence
                .push(sup(LayerName::Packets, CAUSE, hole_line(h)));
        }
        if let Some(l) = x.inbound_lost() {
            c.evidence
                .push(sup(LayerName::Packets, CAUSE, inbound_line(l)));
        }
        if let Some(l) = app_line(x, f) {
            c.evidence.push(l);
            c.layers.push(LayerName::App);
        }
        if let Some(l) = x.path.and_then(|p| p.under_load.as_ref())
            && l.sent > 0
            && l.received < l.sent
        {
            c.evidence.push(sup(
                LayerName::Path,
                CAUSE,
                format!(
                    "SYN ping under load: {} of {} probes lost",
                    l.sent - l.received,
                    l.sent
                ),
            ));
            c.layers.push(LayerName::Path);
        }
        Some(c)
    }

    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
        let Some(p) = x.packets.filter(|_| !has(chosen, CAUSE)) else {
            return Vec::new();
        };
        let n = p
            .finding(FindingKind::Retransmission)
            .map(|f| f.count)
            .unwrap_or(0);
        vec![out(
            LayerName::Packets,
            CAUSE,
            if n == 0 {
                format!("no retransmissions in {} packets", p.packets)
            } else {
                format!(
                    "{n} retransmissions in {} packets: too few to matter",
                    p.packets
                )
            },
        )]
    }

    fn summary(&self) -> &'static str {
        "retransmissions after lost packets inflate latency"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        c.cost(x, cost_text(c, x))
    }

    fn fixes(&self, _c: &Candidate, x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        if let Some(h) = black_hole(x) {
            return hole_fixes(h);
        }
        if x.inbound_lost().is_some() {
            return vec![Fix {
                side: FixSide::Server,
                location: Some("the server host's input path".into()),
                change: "the clients' segments reach the server's host and are dropped inside \
                         it, after the capture point: look at its input path — `nft list \
                         ruleset` (input/prerouting rules with drop, limit, quota or numgen), \
                         `nstat -az | grep -iE 'backlogdrop|prune|rcvq|ofodrop'` (a full socket \
                         backlog or receive buffer)"
                    .into(),
                tradeoff: None,
            }];
        }
        vec![Fix {
            side: FixSide::Path,
            location: None,
            change: "find where packets drop: firewall rules (`nft list ruleset`), interface \
                     and qdisc drops (`ip -s link`, `tc -s qdisc`), a lossy link on the route"
                .into(),
            tradeoff: None,
        }]
    }
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    if let Some(run) = none_completed(x) {
        return format!(
            "no request completes: {} of the responses seen wait ~{} for retransmissions, \
             and all {} requests at {} timed out",
            pct(c.share),
            ms(c.added_us),
            run.errors.timeout,
            run.label()
        );
    }
    let run = x.main_run();
    format!(
        "{} of requests wait ~{} for a retransmission; p99 {} at {} (p50 {})",
        pct(c.share),
        ms(c.added_us),
        ms(run.map(|r| r.latency.p99_us).unwrap_or(0)),
        run.map_or_else(|| "c=1".to_string(), |r| r.label()),
        ms(run.map(|r| r.latency.p50_us).unwrap_or(0))
    )
}

/// The packets' line for the clients' segments lost inside the server's host.
fn inbound_line(l: &InboundLost) -> String {
    let e = l
        .example
        .as_ref()
        .map(|e| {
            format!(
                ", e.g. stream {} frames {}",
                e.stream,
                frames_text(&e.frames)
            )
        })
        .unwrap_or_default();
    format!(
        "lost inside the server's host, not on the path: {} of the {} segments the clients \
         sent again had passed the server's capture point, and the server acknowledged the \
         second copies as new data (no D-SACK) — the first copies never reached its TCP{e}",
        l.count, l.of
    )
}

/// The packets' black hole, when they show one.
fn black_hole<'a>(x: &Facts<'a>) -> Option<&'a BlackHole> {
    x.packets.and_then(|p| p.black_hole.as_ref())
}

/// The black hole's direct evidence, with the frames to check it.
fn hole_line(h: &BlackHole) -> String {
    format!(
        "PMTU black hole: {} — a link on the path carries smaller packets than these, and \
         the ICMP \"fragmentation needed\" that would say so never reaches the sender (e.g. \
         stream {}, frames {})",
        h.what(),
        h.stream,
        h.frames
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The path MTU's fixes, the durable first.
fn hole_fixes(h: &BlackHole) -> Vec<Fix> {
    vec![
        Fix {
            side: FixSide::Path,
            location: None,
            change: format!(
                "let ICMP \"fragmentation needed\" (IPv4 type 3 code 4; ICMPv6 type 2 \"packet \
                 too big\") through every firewall between {} and {}: path MTU \
                 discovery needs it (`nft list ruleset` on the routers and hosts on the way; \
                 the router before the smaller link sends it)",
                h.sender, h.receiver
            ),
            tradeoff: None,
        },
        Fix {
            side: FixSide::Path,
            location: None,
            change: "clamp the MSS where the MTU shrinks: on that router `nft add rule inet \
                     filter forward tcp flags syn tcp option maxseg size set rt mtu` \
                     (iptables: `-t mangle -A FORWARD -p tcp --tcp-flags SYN,RST SYN -j TCPMSS \
                     --clamp-mss-to-pmtu`)"
                .into(),
            tradeoff: Some("covers TCP only; other protocols still need the ICMP".into()),
        },
        Fix {
            side: FixSide::Server,
            location: None,
            change: format!(
                "on {}: `sysctl -w net.ipv4.tcp_mtu_probing=1` — after a retransmission \
                 timeout TCP tries smaller segments and finds what the path carries",
                h.sender
            ),
            tradeoff: Some(
                "a workaround: each connection still waits one timeout before it shrinks".into(),
            ),
        },
    ]
}
