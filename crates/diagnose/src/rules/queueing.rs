//! `path-queueing`: a queue on the path (bufferbloat, a shaper) fills under load: the SYN
//! RTT rises under load and the application feels it.
//!
//! The queue may also stand before the load starts: another flow (a backup, a download)
//! keeps a shaper's deep FIFO full, so the "idle" SYN RTT is already the queue's and does
//! not rise. When that queue is on the server host's own egress, the host layer sees it:
//! a root qdisc of the server's namespace holding a backlog through the c=N run (the
//! median of its samples, every ~100 ms). Drained at the rate it sent over the run, that
//! backlog delays every packet behind it by backlog / rate (Little's law). It is named when
//! that wait is at least [`QUEUE_RISE_US`], the SYN probes under load (their SYN-ACKs leave
//! through it) and the application's p50 both wait at least half of it: a standing queue,
//! not a burst.

use lagtrace_model::Cause;
use lagtrace_model::host::QdiscDelta;

use super::facts::Facts;
use super::{Candidate, CauseRule, QUEUE_RISE_US, has, ms, note, out, rate_text, sup};
use crate::evidence::{LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};

pub(super) struct Queueing;

const CAUSE: Cause = Cause::PathQueueing;

impl CauseRule for Queueing {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn network(&self) -> bool {
        true
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        let host = host_queue(x);
        let Some(mut c) = rising(x) else {
            return host.map(|q| host_candidate(x, &q));
        };
        if let Some(q) = host {
            c.evidence.push(host_line(&q));
            c.layers.push(LayerName::Host);
        }
        Some(c)
    }

    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
        if has(chosen, CAUSE) {
            return Vec::new();
        }
        if let Some((idle, load, _)) = x.queue_rise_us() {
            return vec![out(
                LayerName::Path,
                CAUSE,
                format!(
                    "SYN RTT p50 {} idle, {} under load: no queue on the path",
                    ms(idle),
                    ms(load)
                ),
            )];
        }
        x.path
            .and_then(|p| p.idle.as_ref())
            .filter(|s| s.received > 0)
            .map(|idle| {
                note(
                    LayerName::Path,
                    format!(
                        "SYN RTT p50 {} idle ({} of {} probes answered)",
                        ms(idle.p50_us),
                        idle.received,
                        idle.sent
                    ),
                )
            })
            .into_iter()
            .collect()
    }

    fn summary(&self) -> &'static str {
        "a queue on the path fills under load and delays every packet"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        c.cost(x, cost_text(c, x))
    }

    fn fixes(&self, _c: &Candidate, _x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        vec![Fix {
            side: FixSide::Path,
            location: None,
            change: "shorten the queue at the bottleneck (tbf `latency`/`limit`, or fq_codel / \
                     cake instead of a deep FIFO), or pace senders below the bottleneck rate"
                .into(),
            tradeoff: Some("a shorter queue drops earlier under bursts".into()),
        }]
    }
}

/// The SYN RTT rises under load by [`QUEUE_RISE_US`] and 3× the idle RTT, and the
/// application feels it.
fn rising(x: &Facts<'_>) -> Option<Candidate> {
    let (idle, load, rise) = x.queue_rise_us()?;
    if rise < QUEUE_RISE_US || load < idle.saturating_mul(3) {
        return None;
    }
    let mut c = Candidate::new(CAUSE, rise, 1.0, vec![LayerName::Path]);
    c.evidence.push(sup(
        LayerName::Path,
        CAUSE,
        format!(
            "SYN RTT p50 {} idle → {} under load (+{}): a queue on the path fills",
            ms(idle),
            ms(load),
            ms(rise)
        ),
    ));
    // The application must feel the queue too: a SYN RTT rising alone (a probe delayed
    // on a busy CPU) is not a queue on the path.
    if let (Some(c1), Some(cn)) = (x.c1, x.cn) {
        if cn.latency.p50_us <= c1.latency.p50_us + rise / 2 {
            return None;
        }
        c.evidence.push(sup(
            LayerName::App,
            CAUSE,
            format!(
                "p50 {} at c=1 → {} at {}",
                ms(c1.latency.p50_us),
                ms(cn.latency.p50_us),
                cn.label()
            ),
        ));
        c.layers.push(LayerName::App);
    }
    Some(c)
}

/// A standing queue in one of the server host's root qdiscs (see the module doc).
struct HostQueue<'a> {
    q: &'a QdiscDelta,
    /// What it sent over the window, bytes/s.
    rate: f64,
    /// Its backlog at that rate (µs).
    wait_us: u64,
    /// The SYN RTT under load, p50 and min (µs).
    syn: (u64, u64),
    /// The c=N run's p50 and its label (`c=32`).
    p50: (u64, String),
}

fn host_queue<'a>(x: &Facts<'a>) -> Option<HostQueue<'a>> {
    let host = x.host?;
    let window_s = host.window_us as f64 / 1e6;
    let load = x.path?.under_load.as_ref().filter(|s| s.received > 0)?;
    let run = x.main_run()?;
    host.qdiscs
        .get()?
        .iter()
        .filter(|q| q.parent == "root" && q.bytes > 0 && window_s > 0.0)
        .map(|q| {
            let rate = q.bytes as f64 / window_s;
            let wait_us = (f64::from(standing_bytes(q)) / rate * 1e6) as u64;
            HostQueue {
                q,
                rate,
                wait_us,
                syn: (load.p50_us, load.min_us),
                p50: (run.latency.p50_us, run.label()),
            }
        })
        .filter(|h| {
            h.wait_us >= QUEUE_RISE_US && h.syn.0 >= h.wait_us / 2 && h.p50.0 >= h.wait_us / 2
        })
        .max_by_key(|h| h.wait_us)
}

/// The samples that make a qdisc's median backlog: at least [`MIN_SAMPLES`].
fn sampled(q: &QdiscDelta) -> Option<lagtrace_model::host::BacklogSamples> {
    q.backlog_sampled.filter(|s| s.samples >= MIN_SAMPLES)
}

/// The bytes a qdisc holds as a rule: the median of its samples through the window, else
/// the end's backlog.
fn standing_bytes(q: &QdiscDelta) -> u32 {
    sampled(q).map_or(q.backlog_bytes, |s| s.p50_bytes)
}

/// How [`standing_bytes`] was seen, in words.
fn standing_text(q: &QdiscDelta) -> String {
    match sampled(q) {
        Some(s) => format!(
            "a median {} B queued over {} samples through the run (max {} B)",
            s.p50_bytes, s.samples, s.max_bytes
        ),
        None => format!(
            "{} B ({} packets) queued at the end of the run",
            q.backlog_bytes, q.qlen
        ),
    }
}

/// Backlog samples that make a median.
const MIN_SAMPLES: u32 = 5;

fn host_line(h: &HostQueue<'_>) -> EvidenceLine {
    let q = h.q;
    sup(
        LayerName::Host,
        CAUSE,
        format!(
            "qdisc {} {} on {}: {}, which it sent at {}: ~{} of queueing for every packet \
             behind them{}",
            q.kind,
            q.handle,
            q.dev,
            standing_text(q),
            rate_text(h.rate * 8.0),
            ms(h.wait_us),
            if q.overlimits > 0 {
                format!("; shaping held packets back {} times", q.overlimits)
            } else {
                String::new()
            }
        ),
    )
}

fn host_candidate(x: &Facts<'_>, h: &HostQueue<'_>) -> Candidate {
    let mut c = Candidate::new(
        CAUSE,
        h.wait_us,
        1.0,
        vec![LayerName::Host, LayerName::Path, LayerName::App],
    );
    c.evidence.push(host_line(h));
    c.evidence.push(sup(
        LayerName::Path,
        CAUSE,
        format!(
            "SYN RTT under load p50 {} (min {}){}: the SYN-ACKs wait in that queue too; it \
             stands rather than rises with the load",
            ms(h.syn.0),
            ms(h.syn.1),
            x.path
                .and_then(|p| p.idle.as_ref())
                .filter(|s| s.received > 0)
                .map(|s| format!(", {} before the load", ms(s.p50_us)))
                .unwrap_or_default()
        ),
    ));
    c.evidence.push(sup(
        LayerName::App,
        CAUSE,
        format!(
            "p50 {} at {}: every request waits behind the queue",
            ms(h.p50.0),
            h.p50.1
        ),
    ));
    c.host_fix = Some(Fix {
        side: FixSide::Path,
        location: Some(format!("{} qdisc {} {}", h.q.dev, h.q.kind, h.q.handle)),
        change: "shorten this queue: a smaller `limit` on its FIFO, or fq_codel / cake as the \
                 shaper's leaf qdisc so one bulk flow cannot fill it for everyone"
            .into(),
        tradeoff: Some("a shorter queue drops earlier under bursts".into()),
    });
    c
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    let run = x.main_run();
    format!(
        "the path's queue adds ~{} to every packet under load; p50 {} at {}{}",
        ms(c.added_us),
        ms(run.map(|r| r.latency.p50_us).unwrap_or(0)),
        run.map_or_else(|| "c=1".to_string(), |r| r.label()),
        x.c1.map(|r| format!(" vs {} at c=1", ms(r.latency.p50_us)))
            .unwrap_or_default()
    )
}
