//! `slow-server`: the server's own time between request and response dominates. Two
//! shapes: the server thinks before answering (c=1 latency minus the path RTT, and the
//! server time in the packets), or it answers at once but paces the response (a send rate
//! limit), inferred when nothing else explains a slow transfer.

use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{
    Candidate, CauseRule, DOMINANT_SERVER_US, SLOW_SERVER_US, example_text, has, ms, note, out,
    pct, rate_text, sup,
};
use crate::evidence::{LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};

pub(super) struct SlowServer;

const CAUSE: Cause = Cause::SlowServer;

impl CauseRule for SlowServer {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        let own = x.server_own_us()?;
        // Queueing under load is the larger wait whenever the host shows it, also for a
        // server whose few ms alone dominate its c=1 time: its own time is then a small part
        // of what the user waits, and a hold the packets infer (a cork at ~200 ms) must not
        // explain that part away while the queue goes unsaid (seen: a disk read throttled
        // to 20/s, 3.9 ms alone when the c=1 run caught a few throttled reads, ~200 ms at
        // c=4 — `tcp-cork`, where a quicker c=1 run gave `disk-io`).
        if own < SLOW_SERVER_US && (!x.server_dominates(own) || queued(x).is_some()) {
            return saturated(x);
        }
        let mut c = Candidate::new(CAUSE, own, 1.0, Vec::new());
        c.direct = x.packets.is_some();
        if let Some(c1) = x.c1 {
            c.evidence.push(sup(
                LayerName::App,
                CAUSE,
                format!(
                    "c=1 p50 {} with a path RTT of {}: the server takes ~{} per request itself",
                    ms(c1.latency.p50_us),
                    ms(x.rtt_us),
                    ms(c1.latency.p50_us.saturating_sub(x.rtt_us))
                ),
            ));
            c.layers.push(LayerName::App);
        }
        if let Some(st) = x.packets.and_then(|p| p.server_time.as_ref())
            && st.count > 0
        {
            let mut t = format!(
                "server time (request's last byte → response's first byte) p50 {}, p99 {} \
                 over {} transactions",
                ms(st.p50_us),
                ms(st.p99_us),
                st.count
            );
            if let Some(f) = x.finding(FindingKind::SlowServer) {
                t.push_str(&example_text(f));
            }
            c.evidence.push(sup(LayerName::Packets, CAUSE, t));
            c.layers.push(LayerName::Packets);
        }
        Some(c)
    }

    /// The server answers at once but sends the response slowly (a rate limit such as nginx
    /// `limit_rate`, or a producer that writes in dribbles), with no network cause to
    /// explain it.
    fn fallback(&self, x: &Facts<'_>) -> Option<Candidate> {
        let (transfer, size, bps) = x.paced_transfer()?;
        let c1 = x.c1?;
        let mut c = Candidate::new(CAUSE, transfer, 1.0, vec![LayerName::App]);
        // Inferred from what is absent: never high confidence.
        c.direct = x.packets.is_some();
        c.evidence.push(sup(
            LayerName::App,
            CAUSE,
            format!(
                "c=1 p50 {} with a path RTT of {} and a server time of ~{}: ~{} goes to \
                 sending each ~{} B response, {} — the sender paces it",
                ms(c1.latency.p50_us),
                ms(x.rtt_us),
                ms(x.server_own_us().unwrap_or(0)),
                ms(transfer),
                size,
                rate_text(bps)
            ),
        ));
        if x.packets.is_some() {
            c.evidence.push(sup(
                LayerName::Packets,
                CAUSE,
                "no retransmission, Nagle, cork or window finding explains the transfer time"
                    .into(),
            ));
        }
        Some(c)
    }

    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
        let mut v = Vec::new();
        let Some(own) = x.server_own_us().filter(|_| !has(chosen, CAUSE)) else {
            return v;
        };
        let st = x
            .packets
            .and_then(|p| p.server_time.as_ref())
            .filter(|s| s.count > 0)
            .map(|s| format!("; server time in packets p50 {}", ms(s.p50_us)))
            .unwrap_or_default();
        let hold = chosen
            .iter()
            .find(|c| matches!(c.cause, Cause::NagleDelayedAck | Cause::TcpCork));
        v.push(out(
            if x.c1.is_some() {
                LayerName::App
            } else {
                LayerName::Packets
            },
            CAUSE,
            match hold {
                Some(m) if own >= SLOW_SERVER_US => format!(
                    "the wait before each response (~{}{}) is the {} hold, not the server's \
                     own work",
                    ms(own),
                    st,
                    m.cause
                ),
                _ if own < 100
                    && let Some(c1) = x.c1
                    && x.link_transfer_us(c1) > 0 =>
                {
                    format!(
                        "c=1 p50 {} is the path RTT and moving each ~{} B response at the \
                         path's speed (~{}){st}: not the application",
                        ms(c1.latency.p50_us),
                        c1.bytes / c1.requests.max(1),
                        ms(x.link_transfer_us(c1))
                    )
                }
                _ if own < 100 && x.c1.is_some() => format!(
                    "the server's own time is negligible (c=1 p50 within the path RTT){st}: \
                     not the application"
                ),
                _ if own < 100 => {
                    format!("the server's own time is negligible{st}: not the application")
                }
                _ => format!(
                    "the server's own time is ~{}{}: not the application",
                    ms(own),
                    st
                ),
            },
        ));
        // At c=1 the server is quick, but under load it holds requests itself: say so
        // rather than let "not the application" stand alone.
        if let (Some(p), Some(cn)) = (x.packets.and_then(|p| p.server_time.as_ref()), x.cn)
            && p.count > 0
            && p.p50_us >= DOMINANT_SERVER_US
            && p.p50_us >= own.saturating_mul(4)
        {
            // A standing queue in the server's own egress qdisc (named by the host layer):
            // the capture sees each response as it leaves that queue.
            let egress_queue = chosen
                .iter()
                .any(|c| c.cause == Cause::PathQueueing && c.layers.contains(&LayerName::Host));
            v.push(note(
                LayerName::Packets,
                if egress_queue {
                    format!(
                        "server time in packets p50 {} at {} includes the wait in the \
                         server's egress queue: the capture sees a response as it leaves it",
                        ms(p.p50_us),
                        cn.label()
                    )
                } else {
                    format!(
                        "under load the server queues requests itself: server time p50 {} at \
                     {} against ~{} at c=1 ({:.0} req/s is about what it serves)",
                        ms(p.p50_us),
                        cn.label(),
                        ms(own),
                        cn.requests_per_sec
                    )
                },
            ));
        }
        v
    }

    fn summary(&self) -> &'static str {
        "the server's own time between request and response dominates"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        c.cost(x, cost_text(c, x))
    }

    fn fixes(&self, _c: &Candidate, x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        let server = x.server_name();
        let own = x.server_own_us().unwrap_or(0);
        let change = if let (Some((p50, _)), Some(cn)) = (queued(x), x.cn) {
            format!(
                "{server} serves only ~{:.0} req/s: at {} each request waits ~{} behind \
                 the others — make each request cheaper (where its time goes is in the \
                 evidence) or add capacity (workers, processes, CPUs)",
                cn.requests_per_sec,
                cn.label(),
                ms(p50)
            )
        } else if own < DOMINANT_SERVER_US {
            let (transfer, size, bps) = x.paced_transfer().unwrap_or_default();
            format!(
                "{server} answers at once but sends each ~{size} B response over ~{} \
                 ({}): look for a send rate limit (nginx limit_rate, a proxy's or \
                 shaper's bandwidth cap) or a handler that writes its body in slow pieces",
                ms(transfer),
                rate_text(bps)
            )
        } else {
            format!(
                "{server} spends ~{} per request before answering: profile the handler \
                 and its backends (the network is not the problem)",
                ms(own)
            )
        };
        vec![Fix {
            side: FixSide::Server,
            location: None,
            change,
            tradeoff: None,
        }]
    }
}

/// Quick alone but slow under load: the server queues the requests itself (its own time
/// at c=1 is short; at c=N each waits behind the others). The host layer's split says what
/// it queues for (`server_time`).
fn saturated(x: &Facts<'_>) -> Option<Candidate> {
    let (p50, own) = queued(x)?;
    let cn = x.cn?;
    let mut c = Candidate::new(
        CAUSE,
        p50.saturating_sub(own),
        1.0,
        vec![LayerName::Packets, LayerName::Host],
    );
    let text = if x.handshake_saturated() == Some((p50, own)) {
        let in_packets = x
            .packets
            .and_then(|p| p.server_time.as_ref())
            .filter(|s| s.count > 0)
            .map_or(String::new(), |s| {
                format!(
                    " (request to response in the packets only ~{})",
                    ms(s.p50_us)
                )
            });
        c.layers = vec![LayerName::App, LayerName::Host];
        format!(
            "under load the server queues connections itself: p50 {} at {} against ~{} at \
             c=1, the wait in connection setup{in_packets} — a new connection per request, \
             each a full TLS handshake on the server's CPU; it serves ~{:.0} req/s",
            ms(p50),
            cn.label(),
            ms(x.c1.map_or(own, |c| c.latency.p50_us)),
            cn.requests_per_sec
        )
    } else {
        format!(
            "under load the server queues requests itself: server time p50 {} at {} \
             against ~{} at c=1 — it serves ~{:.0} req/s",
            ms(p50),
            cn.label(),
            ms(own),
            cn.requests_per_sec
        )
    };
    let layer = c.layers[0];
    c.evidence.push(sup(layer, CAUSE, text));
    Some(c)
}

/// [`Facts::server_saturated`] where the server's own time alone is not slow (under
/// [`SLOW_SERVER_US`]; its c=N server time then at least four times that).
fn queued(x: &Facts<'_>) -> Option<(u64, u64)> {
    let own = x.server_own_us()?;
    if own >= SLOW_SERVER_US {
        return None;
    }
    x.server_saturated()
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    if let (Some((p50, own)), Some(cn)) = (queued(x), x.cn) {
        if x.handshake_saturated() == Some((p50, own)) {
            return format!(
                "under load each connection waits ~{} in the server behind the others' TLS \
                 handshakes; p50 {} at {}",
                ms(c.added_us),
                ms(cn.latency.p50_us),
                cn.label()
            );
        }
        return format!(
            "under load each request waits ~{} in the server behind the others (server time \
             p50 {} at {} against ~{} at c=1); p50 {} at {}",
            ms(c.added_us),
            ms(p50),
            cn.label(),
            ms(own),
            ms(cn.latency.p50_us),
            cn.label()
        );
    }
    let run = x.main_run();
    let p50 = run.map(|r| r.latency.p50_us).unwrap_or(0);
    let conc = run.map_or_else(|| "c=1".to_string(), |r| r.label());
    if let Some((transfer, size, bps)) = x.paced_transfer().filter(|p| p.0 == c.added_us) {
        return format!(
            "each ~{size} B response takes ~{} to arrive ({}) on a path with RTT {}; p50 {} \
             at {conc}",
            ms(transfer),
            rate_text(bps),
            ms(x.rtt_us),
            ms(p50)
        );
    }
    let share =
        x.c1.filter(|c1| c1.latency.p50_us > 0)
            .map(|c1| {
                format!(
                    " ({} of the c=1 p50 {})",
                    pct((c.added_us as f64 / c1.latency.p50_us as f64).min(1.0)),
                    ms(c1.latency.p50_us)
                )
            })
            .unwrap_or_default();
    format!(
        "the server takes ~{} per request itself{share}; the network adds {} (path \
         RTT); p50 {} at {}",
        ms(c.added_us),
        ms(x.rtt_us),
        ms(p50),
        conc
    )
}
