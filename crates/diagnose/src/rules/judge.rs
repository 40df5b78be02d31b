//! Collects each rule's candidate, settles how causes explain each other, ranks by expected
//! cost and assembles the verdict.

use lagtrace_model::Cause;

use super::facts::Facts;
use super::{
    Candidate, Judgement, RULE_OUTS, RULES, SLOW_SERVER_US, healthy, hop, host, note, rule, tail,
    unreachable, wiredrop,
};
use crate::evidence::{AppRun, LayerName, LayerStatus, Layers, Target};
use crate::verdict::{Confidence, Cost, EvidenceLine, Mechanism, Tail, Verdict};

/// Decides the verdict from the evidence of all layers, the hops behind the server included:
/// each hop is judged with the same rules, and a cause its packets show becomes the verdict
/// when the server's own verdict sees only time inside the server ([`hop`]).
pub fn judge(target: &Target, layers: &Layers) -> Judgement {
    let front = judge_here(target, layers);
    if layers.hops.is_empty() || !hop::front_open(&front, layers) {
        return front;
    }
    let best = layers
        .hops
        .iter()
        .map(|h| {
            (
                h,
                judge_here(&hop::hop_target(h), &hop::hop_layers(layers, h)),
            )
        })
        .filter(|(_, j)| hop::names_cause(j))
        .max_by(|a, b| hop::impact(&a.1).total_cmp(&hop::impact(&b.1)));
    match best {
        Some((h, j)) => hop::adopt(front, j, h, hop::chain(target, h)),
        None => front,
    }
}

/// The verdict of one server from its own layers.
fn judge_here(target: &Target, layers: &Layers) -> Judgement {
    let x = Facts::new(layers);
    if let Some(j) = unreachable::judge(target, layers, &x) {
        return j;
    }
    let mut tail = tail::assess(&x);
    let mut cands = rank(&x);
    let tail_loss = tail
        .as_ref()
        .is_some_and(|t| t.explained_cause() == Some(Cause::PacketLoss));
    host::adopt(&x, target, &mut cands, tail_loss);
    // The server's threads waited for a CPU through the slow requests: the measurement's
    // own contention (healthy, medium) or a host busy with other work (slow-server).
    if let Some(t) = tail.as_mut().filter(|t| t.server_shaped())
        && let Some(c) = x.host.and_then(|h| {
            let throttled = cands
                .iter()
                .any(|c| c.mechanism == Some(Mechanism::CpuThrottled));
            host::contention(&x, h, throttled)
        })
    {
        if c.own {
            // A slow-server candidate from the typical request's server time stays: the
            // contention explains the tail, not a slow typical request.
            t.measurement_contention(&c.text);
        } else {
            host::merge(&mut cands, c.direct);
            cands.sort_by(|a, b| b.impact_us.total_cmp(&a.impact_us));
        }
    }
    let Some(primary) = cands.first() else {
        return match &tail {
            Some(t) if t.client.is_some() => tail::judge_client(layers, &x, t),
            Some(t) => tail::judge(layers, &x, target, t),
            None => healthy::judge(layers, &x),
        };
    };
    let mut evidence: Vec<EvidenceLine> = cands
        .iter()
        .flat_map(|c| c.evidence.iter().cloned())
        .collect();
    // The tail's mechanism, when the join shows one for the cause that wins (its line is
    // listed even when a layer's direct evidence names the mechanism instead).
    let mechanism = tail.as_ref().and_then(|t| t.mechanism_for(primary.cause));
    if let Some((_, line)) = &mechanism {
        evidence.push(line.clone());
    }
    evidence.extend(rule_outs(&x, &cands));
    if primary.mechanism != Some(Mechanism::CpuContention) {
        evidence.extend(x.host.and_then(host::busy_note));
    }
    evidence.extend(missing_layers(layers));
    let mut finding_layers: Vec<LayerName> = cands
        .iter()
        .flat_map(|c| c.layers.iter().copied())
        .collect();
    finding_layers.sort();
    finding_layers.dedup();
    let (summary, cost, mut fix) = match rule(primary.cause) {
        Some(r) => (
            r.summary().to_owned(),
            r.cost(primary, &x),
            r.fixes(primary, &x, target),
        ),
        None => (String::new(), Cost::default(), Vec::new()),
    };
    if let Some(f) = &primary.host_fix {
        // Shown by the host layer alone: the rule's own fixes read other layers' evidence
        // that is not there (a slow-server candidate's "answers at once but sends slowly").
        if primary.layers == [LayerName::Host] {
            fix.clear();
        }
        fix.insert(0, f.clone());
    }
    let mut cost = cost;
    if let Some(t) = host::cost_text(primary) {
        cost.text = t;
    }
    Judgement {
        verdict: Verdict {
            cause: primary.cause,
            secondary: cands.iter().skip(1).map(|c| c.cause).collect(),
            confidence: confidence(primary),
            summary,
            cost,
            // Direct evidence (a layer that saw the mechanism) wins over the join's pattern;
            // both evidence lines are listed.
            mechanism: primary.mechanism.or(mechanism.map(|m| m.0)),
            tail: tail.map(|t| with_mechanism(t.tail(), primary, &x)),
            fix,
            hop: None,
        },
        evidence,
        finding_layers,
    }
}

/// The tail with the mechanism a layer showed directly for the primary cause on its parts
/// of that cause, and where the segments were dropped in its text.
fn with_mechanism(mut tail: Tail, primary: &Candidate, x: &Facts<'_>) -> Tail {
    let Some(m) = primary.mechanism else {
        return tail;
    };
    for p in tail.parts.iter_mut().filter(|p| p.cause == primary.cause) {
        p.mechanism.get_or_insert(m);
    }
    if m == Mechanism::DroppedBeforeWire
        && tail.parts.first().is_some_and(|p| p.cause == primary.cause)
        && let Some(w) = wiredrop::where_text(x)
    {
        tail.text
            .push_str(&format!(", segments dropped before the wire {w}"));
    }
    tail
}

/// How sure the verdict on `primary` is.
fn confidence(primary: &Candidate) -> Confidence {
    let corroborating = primary.layers.len();
    // A short server time that dominates only on a fast path is a judgement call.
    let short_server = primary.cause == Cause::SlowServer && primary.added_us < SLOW_SERVER_US;
    if primary.direct && corroborating >= 2 && !short_server {
        Confidence::High
    } else if primary.direct {
        Confidence::Medium
    } else {
        Confidence::Low
    }
}

/// The candidates, the primary first.
fn rank(x: &Facts<'_>) -> Vec<Candidate> {
    let mut cands: Vec<Candidate> = RULES
        .iter()
        .filter(|r| r.cause() != Cause::SlowServer)
        .filter_map(|r| r.candidate(x))
        .collect();
    merge_syn_into_loss(&mut cands);
    let slow = rule(Cause::SlowServer).and_then(|r| {
        let slow = r.candidate(x).filter(|s| !explained(x, s, &cands));
        // Nothing else explains a response that takes long to arrive: the sender paces it.
        if slow.is_none() && cands.is_empty() {
            r.fallback(x)
        } else {
            slow
        }
    });
    if let Some(s) = slow {
        // When the server's own time dominates, network causes are never primary.
        for c in cands
            .iter_mut()
            .filter(|c| rule(c.cause).is_some_and(|r| r.network()))
        {
            if c.impact_us <= s.impact_us * 2.0 {
                c.impact_us = c.impact_us.min(s.impact_us * 0.99);
            }
        }
        cands.push(s);
    }
    cands.sort_by(|a, b| b.impact_us.total_cmp(&a.impact_us));
    cands
}

/// SYN retransmissions where data packets are lost too are the same loss, not a separate
/// accept-queue problem — when the data loss is at least as frequent: loss on a path hits
/// a connection's one SYN no more often than its transactions' data segments. Where more
/// connects wait for a SYN retransmission than transactions lose data, the SYNs are dropped
/// selectively (a full accept queue, a SYN filter), and the few data retransmissions are
/// its side effect (the handshake's last ACK dropped with them, the first request sent into
/// a connection the server had not accepted yet): both stay candidates and cost ranks them.
fn merge_syn_into_loss(cands: &mut Vec<Candidate>) {
    let affected = |c: &Candidate| c.counted.map_or(0, |n| n.0);
    if let Some(i) = cands.iter().position(|c| c.cause == Cause::SynDrop)
        && let Some(loss) = cands.iter().find(|c| c.cause == Cause::PacketLoss)
        && affected(&cands[i]) <= affected(loss)
    {
        let syn = cands.remove(i);
        if let Some(l) = cands.iter_mut().find(|c| c.cause == Cause::PacketLoss) {
            for mut e in syn.evidence {
                e.cause = Some(Cause::PacketLoss);
                e.text = format!("connection setup loses packets too: {}", e.text);
                l.evidence.push(e);
            }
        }
    }
}

/// Whether another candidate explains the server's own time `slow`.
fn explained(x: &Facts<'_>, slow: &Candidate, cands: &[Candidate]) -> bool {
    // Nagle or cork explain it when they account for most of it.
    if cands.iter().any(|c| {
        matches!(c.cause, Cause::NagleDelayedAck | Cause::TcpCork)
            && c.added_us * 2 >= slow.added_us
    }) {
        return true;
    }
    // A queue on the path explains a server time seen under load (the capture sees the
    // response after the queue), not a c=1 one. On a bandwidth-limited path the c=1 time
    // also holds the response's transfer at the bottleneck rate (the c=N throughput, since
    // the queue is full): take it out before calling the rest the server's.
    cands
        .iter()
        .find(|c| c.cause == Cause::PathQueueing)
        .is_some_and(|q| {
            x.c1.is_none_or(|c1| {
                c1.latency
                    .p50_us
                    .saturating_sub(x.rtt_us)
                    .saturating_sub(x.bottleneck_transfer_us(c1))
                    < SLOW_SERVER_US
            }) && q.added_us * 2 >= slow.added_us
        })
}

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
                    "c={}: {failed} of {} requests ({}) failed after connecting ({} closed or \
                     reset before a response, {} writes failed){c1}; a failed request is in \
                     no latency",
                    r.concurrency,
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
                        "c={}: {} of {} responses ({}) had an error status{code}: their \
                     latencies are the server's error path, not the page's — check the URL \
                     and the server's error log before trusting the verdict",
                        r.concurrency,
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
             first {} of the c={} run's {} requests; the packet findings and the per-request \
             join cover only those",
            crate::run::MAX_CAPTURE_PACKETS,
            p.transactions,
            super::pct(p.transactions as f64 / cn.requests as f64),
            cn.concurrency,
            cn.requests
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
