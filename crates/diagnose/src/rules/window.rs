//! `receive-window`: the receiver's window (zero or full) holds the sender back, shown by
//! the packets' `zero-window` / `window-full` findings.

use lagtrace_model::{Cause, FindingKind};

use super::facts::Facts;
use super::{
    Candidate, CauseRule, MATERIAL_SHARE, explains_typical, finding_text, material, ms, pct, sup,
};
use crate::evidence::{LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide};

pub(super) struct Window;

const CAUSE: Cause = Cause::ReceiveWindow;

impl CauseRule for Window {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn network(&self) -> bool {
        true
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        let f = [FindingKind::ZeroWindow, FindingKind::WindowFull]
            .into_iter()
            .filter_map(|k| x.finding(k))
            .find(|f| material(f, MATERIAL_SHARE) && explains_typical(x, f))?;
        let mut c = Candidate::new(CAUSE, f.median_added_us, f.share, vec![LayerName::Packets]);
        c.counted = Some((f.transactions, Some(x.transactions())));
        c.evidence.push(sup(
            LayerName::Packets,
            CAUSE,
            finding_text(f, x.transactions()),
        ));
        Some(c)
    }

    fn rule_out(&self, _x: &Facts<'_>, _chosen: &[Candidate]) -> Vec<EvidenceLine> {
        Vec::new()
    }

    fn summary(&self) -> &'static str {
        "the receiver's window holds the sender back"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        c.cost(x, cost_text(c))
    }

    fn fixes(&self, _c: &Candidate, _x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        vec![Fix {
            side: FixSide::Client,
            location: None,
            change: "the receiver reads too slowly or its buffer is small: read faster, raise \
                     SO_RCVBUF / net.ipv4.tcp_rmem"
                .into(),
            tradeoff: Some("larger buffers cost memory per connection".into()),
        }]
    }
}

/// The cost in the user's terms, in one sentence.
fn cost_text(c: &Candidate) -> String {
    format!(
        "{} of requests wait ~{} for the receiver's window to open",
        pct(c.share),
        ms(c.added_us)
    )
}
