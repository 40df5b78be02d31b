//! `syn-drop`: connection setup waits for SYN retransmissions (SYNs dropped, accept queue
//! full), or under load connection attempts get no SYN-ACK at all.

use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{Candidate, CauseRule, MATERIAL_LOSS_SHARE, example_text, ms, pct, sup};
use crate::evidence::{LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};

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
            "at c={} {failed} of {} connection attempts ({}) got no SYN-ACK within the \
             {} connect timeout, while c=1 and the SYN probes connected every time: \
             the server stops accepting new connections under load",
            cn.concurrency,
            cn.requests + failed,
            pct(share),
            ms(CONNECT_TIMEOUT_US)
        ),
    ));
    Some(c)
}

impl CauseRule for Syn {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn network(&self) -> bool {
        true
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
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

    fn fixes(&self, _c: &Candidate, _x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
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

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    if c.layers.first() == Some(&LayerName::App) {
        let conc = x.main_run().map(|r| r.concurrency).unwrap_or(1);
        format!(
            "{} of new connections at c={conc} fail: no SYN-ACK within the {} connect \
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
