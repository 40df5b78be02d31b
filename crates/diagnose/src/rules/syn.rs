//! `syn-drop`: connection setup waits for SYN retransmissions (SYNs dropped, accept queue
//! full), or under load connection attempts get no SYN-ACK at all.
//!
//! Evidence, best first: the load's per-request records (connects that waited for a SYN
//! retransmission, counted over the whole run, their connect times, the slowest one as the
//! example), the capture's `syn-retransmit` finding, or connects failing at c=N only.
//! `mechanism` stays unset: `accept-queue-overflow` needs the server's listen-queue overflow
//! counter (the host layer), beyond "the SYN probes were answered meanwhile".

use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{Candidate, CauseRule, MATERIAL_LOSS_SHARE, example_text, frames_text, ms, pct, sup};
use crate::adapters::app::{connect_time_us, syn_retransmitted};
use crate::evidence::{AppRun, ConnectStats, LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};
use lagtrace_model::RequestRecord;
use lagtrace_model::diagnosis::evidence::SynAcksLost;

pub(super) struct Syn;

const CAUSE: Cause = Cause::SynDrop;

/// The load's connect timeout: a connection attempt that fails is a SYN not answered in it.
const CONNECT_TIMEOUT_US: u64 = 1_000_000;

/// At c=N a material share of connection attempts fail while c=1 connected every time and
/// the path answers SYNs: the server stops accepting under load (listen backlog full). The
/// SYN retransmission is often not in the packets, because the client gives up first.
/// Returns (failed attempts, share of attempts).
fn refused_under_load(x: &Facts<'_>) -> Option<(u64, f64)> {
    let cn = x.cn?;
    let failed = cn.errors.connect;
    let share = failed as f64 / (cn.requests + failed).max(1) as f64;
    let c1_clean = x.c1.is_some_and(|c1| c1.errors.connect == 0);
    let path_ok = x.path.is_some_and(|p| p.reached && p.port_open);
    (c1_clean && path_ok && failed >= 2 && share >= MATERIAL_LOSS_SHARE).then_some((failed, share))
}

/// Connection attempts that failed under load, seen by the application only.
fn refused_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let (failed, share) = refused_under_load(x)?;
    let cn = x.cn?;
    let mut c = Candidate::new(CAUSE, CONNECT_TIMEOUT_US, share, vec![LayerName::App]);
    c.direct = x.packets.is_some();
    c.counted = Some((failed, Some(cn.requests + failed)));
    c.evidence.push(sup(
        LayerName::App,
        CAUSE,
        format!(
            "at {} {failed} of {} connection attempts ({}) got no SYN-ACK within the \
             {} connect timeout, while c=1 and the SYN probes connected every time: \
             the server stops accepting new connections under load",
            cn.label(),
            cn.requests + failed,
            pct(share),
            ms(CONNECT_TIMEOUT_US)
        ),
    ));
    Some(c)
}

/// The connects of `run` that waited for a SYN retransmission, from its records: (count
/// over the whole run, attempts, share of the run's requests, median connect time of the
/// kept ones, the slowest kept one).
struct SynWaits<'a> {
    run: &'a AppRun,
    count: u64,
    attempts: u64,
    share: f64,
    median_us: u64,
    slowest: Option<&'a RequestRecord>,
}

/// The run whose requests waited most often for a SYN retransmission, when they are at least
/// two and [`MATERIAL_LOSS_SHARE`] of its requests (the p99 is set by the slowest 1 %, and
/// each such wait is at least the 1 s initial retransmission timeout).
fn syn_waits<'a>(x: &Facts<'a>) -> Option<SynWaits<'a>> {
    x.runs
        .iter()
        .filter_map(|run| {
            let c = run.connects.as_ref()?;
            let seen = run.waits.as_ref()?.count.max(1);
            let share = c.syn_retransmitted as f64 / seen as f64;
            (c.syn_retransmitted >= 2 && share >= MATERIAL_LOSS_SHARE).then_some((run, c, share))
        })
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(run, c, share)| {
            let mut kept: Vec<&RequestRecord> = run
                .records
                .iter()
                .flat_map(|r| r.records.iter())
                .filter(|r| syn_retransmitted(r))
                .collect();
            kept.sort_by_key(|r| connect_time_us(r));
            SynWaits {
                run,
                count: c.syn_retransmitted,
                attempts: c.attempts,
                share,
                median_us: kept
                    .get(kept.len() / 2)
                    .map_or(ConnectStats::SYN_RTO_US, |r| connect_time_us(r)),
                slowest: kept.last().copied(),
            }
        })
}

/// Connects that waited for a SYN retransmission, measured per request by the load.
fn records_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let w = syn_waits(x)?;
    let mut c = Candidate::new(CAUSE, w.median_us, w.share, vec![LayerName::App]);
    c.counted = Some((w.count, Some(w.attempts)));
    let c_ = w.run.connects.as_ref();
    let (failed, pending) = c_.map_or((0, 0), |s| (s.failed, s.pending));
    let probes = x
        .path
        .and_then(|p| p.under_load.as_ref().or(p.idle.as_ref()))
        .filter(|s| s.received > s.rst)
        .map(|s| {
            format!(
                "; meanwhile the SYN probes got {} SYN-ACKs to {} SYNs",
                s.received - s.rst,
                s.sent
            )
        })
        .unwrap_or_default();
    let example = w
        .slowest
        .map(|r| {
            format!(
                "; e.g. connection {} at {:.3}s: connect {}{}{}",
                r.local
                    .map_or_else(|| format!("#{}", r.conn), |a| a.to_string()),
                r.connect_start_us as f64 / 1e6,
                ms(connect_time_us(r)),
                r.syn_retransmits
                    .map(|n| format!(", {n} SYN retransmission(s)"))
                    .unwrap_or_default(),
                if r.pending { ", still pending" } else { "" }
            )
        })
        .unwrap_or_default();
    let (_, tail) = tail_text(w.run);
    c.evidence.push(sup(
        LayerName::App,
        CAUSE,
        format!(
            "{}: {} of {} connects ({} of requests) waited for a SYN retransmission, median \
             connect {} (typical {}); {failed} failed, {pending} still pending at the \
             end{probes}{example}{tail}",
            w.run.label(),
            w.count,
            w.attempts,
            pct(w.share),
            ms(w.median_us),
            ms(c_.map_or(0, |s| s.time.p50_us))
        ),
    ));
    if let Some(f) = x
        .finding(FindingKind::SynRetransmit)
        .filter(|f| f.count > 0)
    {
        c.layers.push(LayerName::Packets);
        c.evidence.push(sup(
            LayerName::Packets,
            CAUSE,
            format!(
                "syn-retransmit: {} SYNs retransmitted in the capture{}",
                f.count,
                example_text(f)
            ),
        ));
    }
    Some(c)
}

/// How the SYN waits sit in the tail, from the run's records (weighted): how many connects
/// waited for one SYN retransmission, two, three or more (1 s, then 1 s or doubling more
/// each, by kernel), and how many of the requests at and beyond the p99 and the p99.9 they
/// are.
fn tail_text(run: &AppRun) -> (u64, String) {
    let Some(recs) = run.records.as_ref() else {
        return (0, String::new());
    };
    let r = &recs.records;
    // Retransmissions of the record's own connect (a connection's later requests carry its
    // count too, but did not wait for it); at least one when its connect took a SYN timeout.
    let resent = |x: &RequestRecord| match x.syn_retransmits {
        _ if !syn_retransmitted(x) => 0,
        Some(n) if n > 0 => n,
        _ => 1,
    };
    let weight = |f: &dyn Fn(&RequestRecord) -> bool| -> u64 {
        r.iter()
            .filter(|x| f(x))
            .map(|x| x.weight)
            .sum::<f64>()
            .round() as u64
    };
    let by = [
        ("one retransmission", weight(&|x| resent(x) == 1)),
        ("two", weight(&|x| resent(x) == 2)),
        ("three or more", weight(&|x| resent(x) >= 3)),
    ];
    let by: Vec<String> = by
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(w, n)| format!("{n} for {w}"))
        .collect();
    let total = weight(&|x| resent(x) > 0);
    let mut text = String::new();
    if !by.is_empty() {
        text = format!("; of them {}", by.join(", "));
    }
    let w = run.waited();
    for (label, at) in [("p99", w.p99_us), ("p99.9", w.p999_us)] {
        let n = weight(&|x| x.wait_us >= at);
        let k = weight(&|x| x.wait_us >= at && resent(x) > 0);
        if n > 0 && at > 0 {
            text.push_str(&format!(
                "; at and beyond the {label} ({}): {k} of {n} requests waited for one",
                ms(at)
            ));
        }
    }
    (total, text)
}

/// The capture shows the SYNs answered: at least two, and half, of the SYNs sent again came
/// after the other side's SYN-ACK had passed the capture point — the SYN-ACKs were lost
/// beyond it, not the SYNs.
fn answered<'a>(x: &Facts<'a>) -> Option<&'a SynAcksLost> {
    let lost = x.packets?.syn_acks_lost.as_ref()?;
    (lost.count >= 2 && 2 * lost.count >= lost.of).then_some(lost)
}

/// The evidence line of [`answered`].
fn answered_line(x: &Facts<'_>) -> Option<EvidenceLine> {
    let lost = answered(x)?;
    let e = &lost.example;
    Some(sup(
        LayerName::Packets,
        CAUSE,
        format!(
            "the SYNs were answered: {} of the {} SYNs sent again came after the other side's \
             SYN-ACK had passed the capture point ({}), e.g. stream {} frames {}: the SYN-ACKs \
             were lost beyond it, not the SYNs",
            lost.count,
            lost.of,
            x.packets.map_or("", |p| p.capture_point.as_str()),
            e.stream,
            frames_text(&e.frames)
        ),
    ))
}

/// SYN probes that got no answer under load while every idle one did, and the load's own
/// connects went through: the listener dropped SYNs when its queue was full — the same
/// drops the waiting connects show, seen from the path (issue 28 item 5).
fn probes_dropped_under_load(x: &Facts<'_>) -> Option<EvidenceLine> {
    let p = x.path?;
    let (idle, load) = (p.idle.as_ref()?, p.under_load.as_ref()?);
    let lost = load.sent.saturating_sub(load.received);
    let connected = x.cn.map_or(0, |r| {
        r.connects.as_ref().map_or(r.requests, |c| {
            c.attempts.saturating_sub(c.failed + c.pending)
        })
    });
    (idle.sent > 0 && idle.received == idle.sent && lost >= 2 && connected > 0).then(|| {
        sup(
            LayerName::Path,
            CAUSE,
            format!(
                "under load {lost} of {} SYN probes got no SYN-ACK (idle: {} of {}) while the \
                 load's connects went through: consistent with the listener dropping SYNs \
                 while its queue was full",
                load.sent, idle.received, idle.sent
            ),
        )
    })
}

impl CauseRule for Syn {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn network(&self) -> bool {
        true
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        let mut c = self.waiting_candidate(x)?;
        if let Some(e) = answered_line(x) {
            if !c.layers.contains(&LayerName::Packets) {
                c.layers.push(LayerName::Packets);
            }
            c.evidence.push(e);
        } else if let Some(e) = probes_dropped_under_load(x) {
            c.layers.push(LayerName::Path);
            c.evidence.push(e);
        }
        Some(c)
    }

    fn rule_out(&self, _x: &Facts<'_>, _chosen: &[Candidate]) -> Vec<EvidenceLine> {
        Vec::new()
    }

    fn summary(&self) -> &'static str {
        "connection setup waits for SYN retransmissions"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        c.cost(x, cost_text(c, x))
    }

    fn fixes(&self, _c: &Candidate, x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        if answered(x).is_some() {
            return vec![Fix {
                side: FixSide::Path,
                location: None,
                change: "the server answers the SYNs; its SYN-ACKs are lost on the way back: \
                         look for what drops them between the capture point and the client \
                         (a firewall or security group that does not pass them, asymmetric \
                         routing through a stateful device, the client's own input rules)"
                    .into(),
                tradeoff: None,
            }];
        }
        vec![Fix {
            side: FixSide::Server,
            location: None,
            change: "raise the listen backlog (the server's backlog and net.core.somaxconn), \
                     accept faster, and check rules that drop SYNs"
                .into(),
            tradeoff: None,
        }]
    }
}

impl Syn {
    /// The candidate from the connects that waited: the load's records, else the capture's
    /// retransmitted SYNs, else connection attempts that failed under load.
    fn waiting_candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        if let Some(c) = records_candidate(x) {
            return Some(c);
        }
        let Some(f) = x
            .finding(FindingKind::SynRetransmit)
            .filter(|f| f.count >= 2 && f.median_added_us >= 100_000)
        else {
            return refused_candidate(x);
        };
        // Connections are few compared with requests: weigh by connections, not
        // transactions.
        let share = f.share.max(0.01);
        let mut c = Candidate::new(CAUSE, f.median_added_us, share, vec![LayerName::Packets]);
        c.counted = Some((f.count, None));
        c.evidence.push(sup(
            LayerName::Packets,
            CAUSE,
            format!(
                "syn-retransmit: {} connection attempts waited for a SYN retransmission, \
                 median +{}{}",
                f.count,
                ms(f.median_added_us),
                example_text(f)
            ),
        ));
        // The load's records say how those waits sit in the tail.
        if let Some(run) = x.main_run()
            && let (n @ 1.., t) = tail_text(run)
        {
            c.layers.push(LayerName::App);
            c.evidence.push(sup(
                LayerName::App,
                CAUSE,
                format!(
                    "{}: {n} requests waited for a SYN retransmission in its records{t}",
                    run.label()
                ),
            ));
        }
        Some(c)
    }
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    if let Some(w) = syn_waits(x) {
        format!(
            "{} of requests at {} wait ~{} to connect: a SYN retransmission ({} of {} \
             connects)",
            pct(w.share),
            w.run.label(),
            ms(w.median_us),
            w.count,
            w.attempts
        )
    } else if c.layers.first() == Some(&LayerName::App) {
        let conc = x
            .main_run()
            .map_or_else(|| "c=1".to_string(), |r| r.label());
        format!(
            "{} of new connections at {conc} fail: no SYN-ACK within the {} connect \
             timeout",
            pct(c.share),
            ms(c.added_us)
        )
    } else {
        format!(
            "new connections wait ~{} for a SYN retransmission",
            ms(c.added_us)
        )
    }
}
