//! The lines every verdict carries besides its cause: what rules out the causes not chosen,
//! and notes on what the layers could not show (a layer that did not run, a cut capture,
//! error responses, failed requests, a passive run's limits). Shared by the rules and the
//! assembly in `judge`; imports no rule module.

use super::facts::Facts;
use super::{Candidate, RULE_OUTS, note};
use crate::evidence::{AppRun, LayerName, LayerStatus, Layers};
use crate::verdict::EvidenceLine;

/// Lines that rule out what was not chosen, path first, sockets last.
pub(super) fn rule_outs(x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
    let mut v: Vec<EvidenceLine> = RULE_OUTS
        .iter()
        .flat_map(|r| r.rule_out(x, chosen))
        .collect();
    // Grouped by layer, in the rules' order within a layer.
    v.sort_by_key(|l| l.layer);
    v
}

/// A passive run's clients that waited materially differently (the slowest client's p50 at
/// least twice the quickest's and [`super::MATERIAL_ADDED_US`] more): one note naming both.
fn clients_differ(c: &[lagtrace_model::diagnosis::evidence::ClientWaits]) -> Option<EvidenceLine> {
    let slow = c.iter().max_by_key(|c| c.p50_us)?;
    let quick = c.iter().min_by_key(|c| c.p50_us)?;
    (slow.p50_us >= 2 * quick.p50_us && slow.p50_us >= quick.p50_us + super::MATERIAL_ADDED_US)
        .then(|| {
            note(
                LayerName::App,
                format!(
                    "clients differ: {} waited p50 {} p99 {} ({} requests), {} p50 {} p99 {} \
                     ({} requests)",
                    slow.addr,
                    super::ms(slow.p50_us),
                    super::ms(slow.p99_us),
                    slow.requests,
                    quick.addr,
                    super::ms(quick.p50_us),
                    super::ms(quick.p99_us),
                    quick.requests
                ),
            )
        })
}

/// The share of a run's responses with an error status (≥ 400) from which a note says the
/// latency measured is the error path's ([`request_errors`]).
pub(super) const ERROR_STATUS_SHARE: f64 = super::MATERIAL_SHARE;

/// The share of `run`'s completed responses that carried an error status (≥ 400).
pub(super) fn error_status_share(run: &AppRun) -> f64 {
    run.errors.status as f64 / run.requests.max(1) as f64
}

/// The share of a run's requests that failed at once after their connection was made — the
/// server closed or reset it before a response, or a write failed — from which a note says
/// so ([`failures`]): the slowest 1 % is what the p99 judges, and a failed request is worse
/// than a slow one, yet it is in no latency. (Timeouts are in the run's waits, the tail sees
/// them; failed connects are `syn-drop`'s.)
pub(super) const FAILED_SHARE: f64 = 0.01;

/// The share of `run`'s requests that failed at once after connecting (read, write).
pub(super) fn failed_share(run: &AppRun) -> f64 {
    let failed = run.errors.read + run.errors.write;
    failed as f64 / (run.requests + failed).max(1) as f64
}

/// A note for each app run where at least [`FAILED_SHARE`] of the requests failed at once
/// after connecting, by kind, with the c=1 run's count beside a c=N run's (failures under load
/// only: the server stops serving connections beyond a limit).
fn failures(app: &crate::evidence::AppEvidence) -> Vec<EvidenceLine> {
    app.c1
        .iter()
        .chain(app.cn.iter())
        .filter(|r| r.requests > 0 && failed_share(r) >= FAILED_SHARE)
        .map(|r| {
            let e = &r.errors;
            let failed = e.read + e.write;
            let c1 = app
                .c1
                .as_ref()
                .filter(|c1| c1.concurrency != r.concurrency)
                .map(|c1| {
                    let n = c1.errors.read + c1.errors.write;
                    if n == 0 {
                        format!("; none of c=1's {} failed: the server drops connections beyond a limit under load (a worker's connection limit such as nginx worker_connections, an open-file limit, a proxy's maximum)", c1.requests)
                    } else {
                        format!("; {n} at c=1")
                    }
                })
                .unwrap_or_default();
            note(
                LayerName::App,
                format!(
                    "{}: {failed} of {} requests ({}) failed after connecting ({} closed or \
                     reset before a response, {} writes failed){c1}; a failed request is in \
                     no latency",
                    r.label(),
                    r.requests + failed,
                    super::pct(failed_share(r)),
                    e.read,
                    e.write
                ),
            )
        })
        .collect()
}

/// A note for each app run where requests failed ([`failures`]), and where at least
/// [`ERROR_STATUS_SHARE`] of the responses had an error status (a wrong URL's 404, a 403 from unreadable files, an upstream's 502): their
/// latencies are the error path's — fast or slow, not the page's — whatever the verdict.
/// Names the most frequent error status among the run's kept records.
fn request_errors(layers: &Layers) -> Vec<EvidenceLine> {
    let Some(app) = layers.app.get() else {
        return Vec::new();
    };
    let mut v = failures(app);
    v.extend(
        app.c1
            .iter()
            .chain(app.cn.iter())
            .filter(|r| r.requests > 0 && error_status_share(r) >= ERROR_STATUS_SHARE)
            .map(|r| {
                let mut n: Vec<(u16, u64)> = Vec::new();
                for s in r
                    .records
                    .iter()
                    .flat_map(|k| k.records.iter())
                    .filter_map(|k| k.status)
                    .filter(|s| *s >= 400)
                {
                    match n.iter_mut().find(|e| e.0 == s) {
                        Some(e) => e.1 += 1,
                        None => n.push((s, 1)),
                    }
                }
                let code = n
                    .iter()
                    .max_by_key(|e| e.1)
                    .map(|e| format!(", mostly {}", e.0))
                    .unwrap_or_default();
                note(
                    LayerName::App,
                    format!(
                        "{}: {} of {} responses ({}) had an error status{code}: their \
                     latencies are the server's error path, not the page's — check the URL \
                     and the server's error log before trusting the verdict",
                        r.label(),
                        r.errors.status,
                        r.requests,
                        super::pct(error_status_share(r))
                    ),
                )
            }),
    );
    v
}

/// The active run's capture stopped at its packet limit ([`crate::run::MAX_CAPTURE_PACKETS`])
/// while the c=N run went on: its findings and the per-request join cover only the requests
/// it holds (large responses at c=N fill it within a second), so a tail they do not explain
/// may lie in the requests it never saw.
fn capture_cut(layers: &Layers) -> Option<EvidenceLine> {
    let p = layers.packets.get()?;
    let cn = layers.app.get()?.cn.as_ref()?;
    if cn.passive.is_some()
        || p.packets < crate::run::MAX_CAPTURE_PACKETS
        || cn.requests as f64 <= 1.1 * p.transactions as f64
    {
        return None;
    }
    Some(note(
        LayerName::Packets,
        format!(
            "the capture stopped at its {}-packet limit: its {} transactions are about the \
             first {} of the {} requests of {}; the packet findings and the per-request \
             join cover only those",
            crate::run::MAX_CAPTURE_PACKETS,
            p.transactions,
            super::pct(p.transactions as f64 / cn.requests as f64),
            cn.requests,
            cn.run_name()
        ),
    ))
}

/// A note for each layer that did not run, with why (and for a capture that lost packets,
/// what a passive run cannot tell, and runs whose responses were mostly errors).
pub(super) fn missing_layers(layers: &Layers) -> Vec<EvidenceLine> {
    let mut v = request_errors(layers);
    if let Some(a) = layers.app.get() {
        v.extend(super::first::note_line(a.c1.as_ref(), a.cn.as_ref()));
    }
    if let Some(p) = layers
        .app
        .get()
        .and_then(|a| a.cn.as_ref())
        .and_then(|r| r.passive.as_ref())
    {
        v.push(note(LayerName::App, super::PASSIVE_LIMITS.into()));
        v.extend(clients_differ(&p.by_client));
    }
    if let Some(p) = layers.packets.get()
        && p.dropped > 0
    {
        v.push(note(
            LayerName::Packets,
            format!(
                "the capture missed {} packets (kernel buffer full): the analysis covers {} \
                 packets",
                p.dropped, p.packets
            ),
        ));
    }
    v.extend(capture_cut(layers));
    v.extend(
        LayerName::ALL
            .into_iter()
            .filter(|l| !matches!(layers.status(*l), LayerStatus::Ok | LayerStatus::Finding))
            // A skipped host layer (server elsewhere, or a diagnosis recorded before it)
            // changes nothing the other layers say; its reason stays in the layer itself.
            .filter(|l| !(*l == LayerName::Host && layers.status(*l) == LayerStatus::Skipped))
            .map(|l| {
                note(
                    l,
                    format!(
                        "{} layer {}: {}",
                        l.name(),
                        layers.status(l).name(),
                        layers.reason(l).unwrap_or("no reason given")
                    ),
                )
            }),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::clients_differ;
    use lagtrace_model::diagnosis::evidence::ClientWaits;

    fn c(addr: &str, p50_us: u64) -> ClientWaits {
        ClientWaits {
            addr: addr.into(),
            requests: 100,
            p50_us,
            p99_us: p50_us * 2,
        }
    }

    #[test]
    fn only_clients_that_wait_materially_differently_are_noted() {
        let line = clients_differ(&[c("10.0.0.1", 400), c("10.0.0.9", 45_000)]).unwrap();
        assert!(
            line.text
                .starts_with("clients differ: 10.0.0.9 waited p50 45"),
            "{line:?}"
        );
        // Twice as long but only 400 µs more: not material.
        assert!(clients_differ(&[c("10.0.0.1", 400), c("10.0.0.9", 800)]).is_none());
        assert!(clients_differ(&[c("10.0.0.1", 40_000), c("10.0.0.9", 46_000)]).is_none());
        assert!(clients_differ(&[]).is_none());
    }
}
