//! `path-queueing`: a queue on the path (bufferbloat, a shaper) fills under load: the SYN
//! RTT rises under load and the application feels it.

use lagtrace_model::Cause;

use super::facts::Facts;
use super::{Candidate, CauseRule, QUEUE_RISE_US, has, ms, note, out, sup};
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
                    "p50 {} at c=1 → {} at c={}",
                    ms(c1.latency.p50_us),
                    ms(cn.latency.p50_us),
                    cn.concurrency
                ),
            ));
            c.layers.push(LayerName::App);
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

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    let run = x.main_run();
    format!(
        "the path's queue adds ~{} to every packet under load; p50 {} at c={}{}",
        ms(c.added_us),
        ms(run.map(|r| r.latency.p50_us).unwrap_or(0)),
        run.map(|r| r.concurrency).unwrap_or(1),
        x.c1.map(|r| format!(" vs {} at c=1", ms(r.latency.p50_us)))
            .unwrap_or_default()
    )
}
