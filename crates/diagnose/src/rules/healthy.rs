//! `healthy`: no candidate cause. The verdict states the latency the user sees, with every
//! alternative ruled out, as sure as the layers that could have shown a problem — and never
//! sure when the responses measured were mostly error statuses (the page was not measured)
//! or a material share of the requests failed.

use lagtrace_model::Cause;

use super::facts::Facts;
use super::notes::{missing_layers, rule_outs};
use super::{Judgement, ms, note};
use crate::evidence::{LayerName, LayerStatus, Layers};
use crate::verdict::{Confidence, Cost, Verdict};

/// One sentence for the healthy verdict.
const SUMMARY: &str = "no latency problem beyond the path RTT and a normal server time";

/// The latency the user sees, which is all a healthy target costs.
fn cost(x: &Facts<'_>) -> Cost {
    let mut cost = String::from("none");
    if let Some(c1) = x.c1 {
        cost.push_str(&format!(": p50 {} at c=1", ms(c1.latency.p50_us)));
    }
    if let Some(cn) = x.cn {
        cost.push_str(&format!(
            "{} {} at {} ({:.0} req/s)",
            if x.c1.is_some() { "," } else { ": p50" },
            ms(cn.latency.p50_us),
            cn.label(),
            cn.requests_per_sec
        ));
    }
    if x.rtt_us > 0 {
        cost.push_str(&format!("; path RTT {}", ms(x.rtt_us)));
    }
    let run = x.main_run();
    Cost {
        p50_us: run.map(|r| r.latency.p50_us),
        concurrency: run.map(|r| r.concurrency),
        text: cost,
        ..Cost::default()
    }
}

/// Complete requests a capture needs before its quiet tail clears the server: fewer, and
/// its "p99" is one of a handful of requests.
const MIN_PASSIVE_REQUESTS: u64 = 100;

/// The `healthy` judgement.
pub(super) fn judge(layers: &Layers, x: &Facts<'_>) -> Judgement {
    let mut evidence = rule_outs(x, &[]);
    if let Some(run) = x.main_run() {
        evidence.insert(
            0,
            note(
                LayerName::App,
                format!(
                    "{}: {} requests, p50 {}, p99 {}, {:.0} req/s, {} errors",
                    run.label(),
                    run.requests,
                    ms(run.latency.p50_us),
                    ms(run.latency.p99_us),
                    run.requests_per_sec,
                    run.errors.total()
                ),
            ),
        );
    }
    // Healthy is as sure as the layers that could have shown a problem.
    let ran = |l: LayerName| matches!(layers.status(l), LayerStatus::Ok | LayerStatus::Finding);
    // Measured on error responses (the page itself was not measured), or requests failed.
    let (errors, failed) = x.main_run().map_or((0.0, 0.0), |r| {
        (
            super::notes::error_status_share(r),
            super::notes::failed_share(r),
        )
    });
    // A capture cut short, or too small for a p99, cannot clear the server: it says so.
    let limits = x.packets.map(|p| p.limits.as_slice()).unwrap_or_default();
    let few = x
        .main_run()
        .filter(|r| x.passive && r.requests < MIN_PASSIVE_REQUESTS)
        .map(|r| r.requests);
    for l in limits {
        evidence.push(note(LayerName::Packets, l.clone()));
    }
    if let Some(n) = few {
        evidence.push(note(
            LayerName::App,
            format!(
                "only {n} complete requests in the capture: too few for a p99 (at least \
                 {MIN_PASSIVE_REQUESTS}), so nothing slow in it is no all-clear"
            ),
        ));
    }
    let confidence =
        if !ran(LayerName::App) || errors.max(failed) >= 0.5 || !limits.is_empty() || few.is_some()
        {
            Confidence::Low
        } else if errors >= super::notes::ERROR_STATUS_SHARE
            || failed >= super::notes::FAILED_SHARE
            || super::first::slow_first(x.c1, x.cn).is_some()
        {
            // Or new connections wait: keep-alive hid it from this run's p99 only.
            Confidence::Medium
        } else if ran(LayerName::Packets) && ran(LayerName::Path) {
            Confidence::High
        } else {
            Confidence::Medium
        };
    evidence.extend(missing_layers(layers));
    Judgement {
        verdict: Verdict {
            cause: Cause::Healthy,
            secondary: Vec::new(),
            confidence,
            summary: SUMMARY.into(),
            cost: cost(x),
            mechanism: None,
            tail: None,
            fix: Vec::new(),
            hop: None,
        },
        evidence,
        finding_layers: Vec::new(),
    }
}
