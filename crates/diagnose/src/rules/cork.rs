//! `tcp-cork`: TCP_CORK left on holds each response until the kernel's 200 ms ceiling.
//! Shown by the packets' `tcp-cork` finding, by TCP_CORK set on the server's sockets, or by
//! the server time clustered at the ceiling.

use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{
    Candidate, CauseRule, MATERIAL_SHARE, example_text, finding_text, has, material, ms, out, pct,
    sup,
};
use crate::evidence::{LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};

pub(super) struct Cork;

const CAUSE: Cause = Cause::TcpCork;

/// What the server's sockets say: a line when TCP_CORK is on.
fn sockets_line(x: &Facts<'_>) -> Option<EvidenceLine> {
    let s = x.sockets.filter(|s| s.cork.on > 0)?;
    let who = s
        .server
        .as_ref()
        .map(|p| format!("{} (pid {})", p.comm, p.pid))
        .unwrap_or_else(|| "the server".into());
    Some(sup(
        LayerName::Sockets,
        CAUSE,
        format!(
            "{who}: TCP_CORK set on {}/{} established sockets",
            s.cork.on,
            s.cork.on + s.cork.off + s.cork.unknown
        ),
    ))
}

/// What the server's sockets rule out. The options are one reading taken during the load: a
/// server that corks each response and uncorks at its end (nginx's `tcp_nopush on` with
/// sendfile) is caught corked on the sockets that were mid-response at that instant, a
/// different number on every run. Such a reading rules the cork out as firmly as an all-off
/// one when the packets saw no response held to the ceiling, so both give the same line
/// kind: which of the two a run gets must not depend on the instant of the reading.
fn sockets_rule_out(x: &Facts<'_>) -> Option<EvidenceLine> {
    let s = x.sockets?;
    let read = s.cork.on + s.cork.off;
    if read == 0 {
        return None;
    }
    if s.cork.on == 0 {
        return Some(out(
            LayerName::Sockets,
            CAUSE,
            format!("server sockets: TCP_CORK off on {read}/{read}"),
        ));
    }
    // Corked at the reading: only the packets can say whether the cork outlives a response.
    x.packets
        .filter(|p| p.finding(FindingKind::TcpCork).is_none())?;
    let nopush = s
        .directive("tcp_nopush")
        .filter(|d| d.value == "on")
        .map(|d| format!(" (tcp_nopush on at {}:{})", d.file, d.line))
        .unwrap_or_default();
    Some(out(
        LayerName::Sockets,
        CAUSE,
        format!(
            "server sockets: TCP_CORK on {}/{read} at the reading{nopush}, set while a \
             response is written and released at its end: no response held to the ceiling",
            s.cork.on
        ),
    ))
}

impl CauseRule for Cork {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        if x.cork_ruled_out().is_some() {
            return None;
        }
        let mut ev = Vec::new();
        let mut layers = Vec::new();
        let mut found = None;
        let mut counted = None;
        if let Some(f) = x
            .finding(FindingKind::TcpCork)
            .filter(|f| material(f, MATERIAL_SHARE))
        {
            ev.push(sup(
                LayerName::Packets,
                CAUSE,
                finding_text(f, x.transactions()),
            ));
            layers.push(LayerName::Packets);
            found = Some((f.median_added_us, f.share, f.transactions));
        }
        let sockets_say = if let Some(l) = sockets_line(x) {
            ev.push(l);
            layers.push(LayerName::Sockets);
            true
        } else {
            false
        };
        // The server time clustered at the kernel's 200 ms cork ceiling, with the packets
        // showing at least one partial frame released by it: cork, even unseen in the
        // sockets.
        let at_ceiling = x.packets.and_then(|p| p.server_time.as_ref()).filter(|t| {
            t.count > 0 && (195_000..=220_000).contains(&t.p50_us) && t.p90_us <= 260_000
        });
        let (added, share) = match (found, x.finding(FindingKind::TcpCork), at_ceiling) {
            (Some((added, share, n)), _, _) => {
                counted = Some((n, Some(x.transactions())));
                (added, share)
            }
            (None, Some(f), Some(t)) if !sockets_say => {
                ev.push(sup(
                    LayerName::Packets,
                    CAUSE,
                    format!(
                        "server time p50 {} (p90 {}): responses leave at the 200 ms TCP_CORK \
                         ceiling; {} released by it{}",
                        ms(t.p50_us),
                        ms(t.p90_us),
                        f.kind,
                        example_text(f)
                    ),
                ));
                layers.push(LayerName::Packets);
                (t.p50_us, 1.0)
            }
            _ => {
                // Without packets: TCP_CORK on and c=1 latency at the 200 ms ceiling.
                let c1 = x.c1?;
                if !(sockets_say && (150_000..=260_000).contains(&c1.latency.p50_us)) {
                    return None;
                }
                ev.push(sup(
                    LayerName::App,
                    CAUSE,
                    format!(
                        "c=1 p50 {}: the 200 ms TCP_CORK ceiling",
                        ms(c1.latency.p50_us)
                    ),
                ));
                layers.push(LayerName::App);
                (c1.latency.p50_us.saturating_sub(x.rtt_us), 1.0)
            }
        };
        let mut c = Candidate::new(CAUSE, added, share, layers);
        c.counted = counted;
        c.evidence = ev;
        Some(c)
    }

    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
        let mut v = Vec::new();
        if has(chosen, CAUSE) {
            return v;
        }
        if let Some((read, share)) = x.cork_ruled_out() {
            v.push(out(
                LayerName::Sockets,
                CAUSE,
                format!(
                    "{} of responses left at the 200 ms cork ceiling, yet TCP_CORK was off on \
                     {read}/{read} server sockets when read: a server corked that long would \
                     have been caught corked, so the wait is the server's own",
                    pct(share)
                ),
            ));
            return v;
        }
        if let Some(p) = x.packets
            && p.finding(FindingKind::TcpCork).is_none()
        {
            v.push(out(
                LayerName::Packets,
                CAUSE,
                "no response held to the 200 ms cork ceiling".into(),
            ));
        }
        if let Some(l) = sockets_rule_out(x) {
            v.push(l);
        }
        v
    }

    fn summary(&self) -> &'static str {
        "TCP_CORK holds responses until its 200 ms ceiling"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        c.cost(x, cost_text(c, x))
    }

    fn fixes(&self, _c: &Candidate, x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        vec![Fix {
            side: FixSide::Server,
            location: x
                .sockets
                .and_then(|s| s.directive("tcp_nopush"))
                .filter(|d| d.value == "on")
                .map(|d| format!("{}:{}", d.file, d.line)),
            change: format!(
                "{} {}: uncork after each response (setsockopt \
                 TCP_CORK=0 flushes), or use MSG_MORE on all writes but the last",
                x.server_name(),
                match x.sockets {
                    Some(s) if s.cork.on > 0 => "leaves TCP_CORK on",
                    // Read, and uncorked at that instant: the cork comes and goes.
                    Some(_) =>
                        "most likely sets TCP_CORK and releases it late (its sockets \
                                were uncorked when read; the holds end at the 200 ms ceiling)",
                    None =>
                        "most likely leaves TCP_CORK on (its sockets were not read: \
                             run as root, or with CAP_SYS_PTRACE, to read them)",
                }
            ),
            tradeoff: None,
        }]
    }
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    let run = x.main_run();
    format!(
        "adds ~{} to {} of requests (held until the 200 ms cork ceiling); p50 {} at {}",
        ms(c.added_us),
        pct(c.share),
        ms(run.map(|r| r.latency.p50_us).unwrap_or(0)),
        run.map_or_else(|| "c=1".to_string(), |r| r.label())
    )
}
