//! Collects each rule's candidate, settles how causes explain each other, ranks by expected
//! cost and assembles the verdict.

use lagtrace_model::Cause;

use super::facts::Facts;
use super::notes::{missing_layers, rule_outs};
use super::{
    Candidate, Judgement, RULES, SLOW_SERVER_US, healthy, hop, host, ms, note, out, rule,
    server_time, sup, tail, tail_join, unreachable, wiredrop,
};
use crate::evidence::{AppRun, LayerName, Layers, Target};
use crate::verdict::{Confidence, Cost, EvidenceLine, Mechanism, Stance, Tail, Verdict};
use lagtrace_model::diagnosis::evidence::HopEvidence;

/// Decides the verdict from the evidence of all layers, the hops behind the server included:
/// each hop is judged with the same rules, and a cause its packets show becomes the verdict
/// when the server's own verdict sees only time inside the server ([`hop`]).
pub fn judge(target: &Target, layers: &Layers) -> Judgement {
    let (front, waited) = judge_server(target, layers);
    if layers.hops.is_empty() || !hop::front_open(&front, layers) {
        return front;
    }
    match behind(layers, 1, None) {
        Some((path, j)) if hop::explains(&front, &j) => {
            let at = hop::chain(target, &path);
            let mut j = hop::adopt(front, j, path[path.len() - 1], at);
            hop::own_time(&mut j, layers, path[0]);
            j
        }
        // No hop's own packets name a cause, but the slow requests' server time was their
        // wait on a hop (the upstream join's, request by request): the time is the hop's,
        // and the verdict says where.
        _ => match waited.and_then(|u| Some((u, layers.hops.get(u.hop as usize)?))) {
            Some((u, h))
                if matches!(
                    front.verdict.cause,
                    Cause::SlowServer | Cause::UnexplainedTail
                ) =>
            {
                let at = hop::chain(target, &[h]);
                let mut j = hop::tail_on(front, h, at, u.added_us, u.requests);
                hop::own_time(&mut j, layers, h);
                j
            }
            _ => front,
        },
    }
}

/// The hop at `depth` behind `via` (the server itself at depth 1) whose cause becomes the
/// verdict, with the hops leading to it: each hop is judged with the same rules; one whose
/// own time is unexplained (like the server's) passes the verdict on to a hop behind it
/// that names a cause; between hops at one depth, the larger cost wins.
fn behind<'a>(
    layers: &'a Layers,
    depth: u32,
    via: Option<&str>,
) -> Option<(Vec<&'a HopEvidence>, Judgement)> {
    if depth > hop::MAX_DEPTH {
        return None;
    }
    layers
        .hops
        .iter()
        .filter(|h| h.depth == depth && (depth == 1 || h.via.as_deref() == via))
        .filter_map(|h| {
            let hl = hop::hop_layers(layers, h);
            let mut j = judge_here(&hop::hop_target(h), &hl);
            hop::listener_overflow(&mut j, h);
            if hop::front_open(&j, &hl)
                && let Some((mut path, deeper)) = behind(layers, depth + 1, Some(&h.peer))
            {
                path.insert(0, h);
                return Some((path, deeper));
            }
            hop::names_cause(&j).then(|| (vec![h], j))
        })
        .max_by(|a, b| hop::impact(&a.1).total_cmp(&hop::impact(&b.1)))
}

/// The judgement when no other rule names a cause and the tail is the load generator's own
/// host ([`tail::TailFinding::client`]): `healthy` as far as the server and the path go, never
/// with high confidence over that tail, with the client's contention and the tail stated.
fn judge_client(layers: &Layers, x: &Facts<'_>, t: &tail::TailFinding<'_>) -> Judgement {
    let mut j = healthy::judge(layers, x);
    if j.verdict.confidence == Confidence::High {
        j.verdict.confidence = Confidence::Medium;
    }
    let mut lines = vec![t.app_line(x, Cause::Healthy)];
    lines[0].stance = Stance::Note;
    lines[0].cause = None;
    if let Some(c) = &t.client {
        lines.push(note(LayerName::App, c.clone()));
    }
    if let Some(jt) = &t.joined {
        lines.push(note(LayerName::Packets, jt.line()));
    }
    // After healthy's own line on the main run.
    let at = usize::from(x.main_run().is_some()).min(j.evidence.len());
    j.evidence.splice(at..at, lines);
    j.verdict.tail = Some(t.tail());
    j
}

/// The verdict of one server from its own layers.
fn judge_here(target: &Target, layers: &Layers) -> Judgement {
    judge_server(target, layers).0
}

/// [`judge_here`], with the hop the tail's server time waited on when the verdict is the
/// tail's and the upstream join shows one ([`tail_join::TailUpstream`]).
fn judge_server(target: &Target, layers: &Layers) -> (Judgement, Option<tail_join::TailUpstream>) {
    let x = Facts::new(layers);
    if let Some(j) = unreachable::judge(target, layers, &x) {
        return (j, None);
    }
    let reattribute = |run: &AppRun, join| {
        wiredrop::reattributed(&x, run.records.as_ref().map(|r| r.records.as_slice()), join)
    };
    let mut tail = tail::assess(&x, &reattribute);
    let waited = tail
        .as_ref()
        .and_then(|t| t.joined.as_ref())
        .and_then(|j| j.upstream);
    let mut cands = rank(&x);
    let tail_loss = tail
        .as_ref()
        .is_some_and(|t| t.explained_cause() == Some(Cause::PacketLoss));
    // The host dropped packets and the loss is named (by the tail or the packets'
    // retransmissions): the held or late segments matter however few.
    let dropped = wiredrop::dropped(
        &x,
        tail_loss || cands.iter().any(|c| c.cause == Cause::PacketLoss),
    );
    host::adopt(&x, target, &mut cands, dropped);
    // The server's threads waited for a CPU through the slow requests: the measurement's
    // own contention (healthy, medium) or a host busy with other work (slow-server). Without
    // a tail beyond the contention spread, only a server starved by other work: its
    // threads waited for a CPU longer than they ran ([`host::starved`]) — a p99 9× the p50
    // is no tail, but a server given half the CPU it asks for is slow at every percentile.
    let server_tail = tail.as_ref().is_some_and(|t| t.server_shaped());
    let slow_from = tail.as_ref().zip(x.cn).and_then(|(t, cn)| t.slow_from(cn));
    if (server_tail || (tail.is_none() && x.host.is_some_and(host::starved)))
        && let Some(c) = x.host.and_then(|h| {
            let throttled = cands
                .iter()
                .any(|c| c.mechanism == Some(Mechanism::CpuThrottled));
            host::contention(
                &x,
                h,
                throttled,
                slow_from.as_ref().map(|(u, l)| (*u, l.as_str())),
            )
        })
    {
        match tail.as_mut() {
            // A slow-server candidate from the typical request's server time stays: the
            // contention explains the tail, not a slow typical request.
            // A deep tail (≥ 100 ms past the p99) is more than the measurement's own
            // contention adds (a slice per runnable task): it stays a finding.
            Some(t) if c.own && t.is_deep() => {}
            Some(t) if c.own => t.measurement_contention(&c.text),
            // The measurement's own contention with no tail to explain: nothing to say.
            None if c.own => {}
            _ => {
                host::merge(&mut cands, c.direct);
                cands.sort_by(|a, b| b.impact_us.total_cmp(&a.impact_us));
            }
        }
    }
    server_time_split(&x, target, &mut cands);
    let Some(primary) = cands.first() else {
        let j = match &tail {
            Some(t) if t.client.is_some() => judge_client(layers, &x, t),
            Some(t) => tail::judge(layers, &x, target, t),
            None => {
                let mut j = healthy::judge(layers, &x);
                j.evidence.extend(host::flood_note(&x, target));
                j
            }
        };
        return (j, waited);
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
    let j = Judgement {
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
            hop: primary.hop.clone(),
        },
        evidence,
        finding_layers,
    };
    // A cause a layer named (the typical request's server time among them) stays the
    // server's: only a verdict the tail alone gave is moved to the hop it waited on.
    (j, None)
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
    if m == Mechanism::DroppedByNetfilter
        && tail
            .parts
            .first()
            .is_some_and(|p| p.cause == Cause::PacketLoss && primary.cause == Cause::PacketLoss)
    {
        tail.text
            .push_str(", the clients' segments dropped by netfilter on the server's host");
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
    // Nagle or cork explain it when they account for most of it — on most requests: the
    // server's own time is a median (c=1's p50, the packets' server-time p50), which a hold
    // on a few requests cannot explain however long each (seen: a CPU-bound Python server,
    // 20 ms per request, whose 6.6% of responses that waited ~200 ms at c=32 read as a
    // cork's ceiling, and the verdict said tcp-cork).
    if cands.iter().any(|c| {
        matches!(c.cause, Cause::NagleDelayedAck | Cause::TcpCork)
            && c.share >= 0.5
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

/// Where a slow server's time goes, from the host layer's off-CPU blocks inside the
/// requests' server time: a line on the `slow-server` candidate, and its mechanism and fix
/// when one part holds most of it (a mechanism another layer showed directly stays).
///
/// A `tcp-cork` inferred from packets alone (TCP_CORK not seen on the sockets) then yields:
/// the packets cannot tell a response held corked from one written late ~200 ms after its
/// request, and the split shows the serving thread busy or blocked in its own work through
/// the server time — writing late, not held after the write (seen: a CPU-bound Python
/// server whose requests queued ~200 ms on the interpreter lock at c=8).
fn server_time_split(x: &Facts<'_>, target: &Target, cands: &mut Vec<Candidate>) {
    let Some(s) = server_time::split(x) else {
        return;
    };
    // A cork inferred from the packets alone explained the server's time away in the
    // ranking; the split, which shows the serving thread in its own work through that time,
    // outweighs the inference: the server's candidate comes back for it (seen: four
    // uncorked sockets read, which left a 1.3 % chance of a cork, beside a disk wait).
    if !cands.iter().any(|c| c.cause == Cause::SlowServer) {
        let inferred_cork = cands
            .iter()
            .any(|c| c.cause == Cause::TcpCork && !c.layers.contains(&LayerName::Sockets));
        match rule(Cause::SlowServer).and_then(|r| r.candidate(x)) {
            Some(slow) if inferred_cork && s.named.is_some() => cands.push(slow),
            _ => return,
        }
    }
    let Some(c) = cands.iter_mut().find(|c| c.cause == Cause::SlowServer) else {
        return;
    };
    c.evidence.push(s.line);
    if !c.layers.contains(&LayerName::Host) {
        c.layers.push(LayerName::Host);
    }
    // The server waited on another process: the time is that process's, and the verdict
    // says where it sits (a hop no packet showed: a Unix socket, a pipe).
    if let Some((w, fix)) = s.woken {
        let server = x.sockets.and_then(|s| s.server.as_ref());
        c.hop = Some(hop::to_process(target, server, &w.comm, w.pid));
        c.host_fix = Some(fix);
        return;
    }
    // Most of the server time a wait for a descriptor no process of this host ended, and
    // the server has connections to an upstream on another host: the wait is that
    // upstream's (`upstream-wait`), unless its CPU work explains the time (`on-cpu`).
    let on_cpu = matches!(s.named, Some((Mechanism::OnCpu, _)));
    if let (Some(each), false, None) = (s.descriptor_us, on_cpu, c.mechanism)
        && let Some(h) = x
            .hops
            .iter()
            .filter(|h| h.depth == 1 && hop::is_remote(h))
            .max_by_key(|h| h.connections)
    {
        let at = hop::chain(target, &[h]);
        let from = hop::who(&h.from);
        let fix = hop::upstream_wait_fix(&from, &h.peer, each, at.chain[at.at].label());
        c.evidence.push(sup(
            LayerName::Host,
            Cause::SlowServer,
            format!(
                "no process of this host woke the serving thread out of its waits for a \
                 descriptor, and {from} holds {} connection(s) to {} on another host: the \
                 server waits on that upstream",
                h.connections, h.peer
            ),
        ));
        c.mechanism = Some(Mechanism::UpstreamWait);
        c.hop = Some(at);
        c.host_fix = Some(fix);
        return;
    }
    let Some((m, fix)) = s.named else {
        return;
    };
    if c.mechanism.is_none() {
        c.mechanism = Some(m);
        c.host_fix = Some(fix);
    }
    let Some(i) = cands
        .iter()
        .position(|c| c.cause == Cause::TcpCork && !c.layers.contains(&LayerName::Sockets))
    else {
        return;
    };
    let cork = cands.remove(i);
    if let Some(c) = cands.iter_mut().find(|c| c.cause == Cause::SlowServer) {
        c.evidence.push(out(
            LayerName::Host,
            Cause::TcpCork,
            format!(
                "responses held ~{} look corked in the packets, but TCP_CORK was not seen on \
                 the server's sockets and the serving thread was busy in its own work \
                 ({m}) through the server time: they were written late, not held after the \
                 write",
                ms(cork.added_us),
                m = m.name()
            ),
        ));
    }
    cands.sort_by(|a, b| b.impact_us.total_cmp(&a.impact_us));
}
