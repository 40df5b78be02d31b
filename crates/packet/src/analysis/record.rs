//! The findings recorder: counts every finding per kind, keeps up to `max_findings` in
//! detail, tracks which transactions each kind touched, and holds back the findings that are
//! decided at the end (stalls released late, slow-server candidates).

use std::net::SocketAddr;

use lagtrace_model::FindingKind;
use lagtrace_model::analyze::{Finding, KindSummary};

use super::http::Txn;
use super::stats::percentile;

const KINDS: usize = FindingKind::ALL.len();

pub(super) struct Recorder {
    max_findings: usize,
    /// Findings kept in detail.
    pub findings: Vec<Finding>,
    costs: [Vec<u64>; KINDS],
    counts: [u64; KINDS],
    affected: [u64; KINDS],
    /// slow-server candidates, decided once each server's usual time is known.
    slow_pending: Vec<(usize, Finding)>,
    slow_pending_dropped: u64,
    /// Set while the decided slow-server findings are recorded.
    deciding: bool,
    /// Per sender: Nagle/delayed-ACK stalls released within about one RTT of their ACK.
    prompt_releases: super::tracker::FxMap<SocketAddr, u64>,
    /// Such stalls released later, decided at the end (kept up to `max_findings`).
    late_pending: Vec<(usize, SocketAddr, Finding)>,
    /// (stream, transaction, kind) already counted as affected.
    affected_seen: super::tracker::FxSet<(u32, u32, FindingKind)>,
}

impl Recorder {
    pub fn new(max_findings: usize) -> Recorder {
        Recorder {
            max_findings,
            findings: Vec::new(),
            costs: Default::default(),
            counts: [0; KINDS],
            affected: [0; KINDS],
            slow_pending: Vec::new(),
            slow_pending_dropped: 0,
            deciding: false,
            prompt_releases: Default::default(),
            late_pending: Vec::new(),
            affected_seen: Default::default(),
        }
    }

    /// A finding of stream `i` from `sender`'s segment; `late`: an ACK stall released later
    /// than about one RTT after its ACK. `open`: the stream's open transaction.
    pub fn found(
        &mut self,
        i: usize,
        sender: SocketAddr,
        f: Finding,
        late: bool,
        open: Option<&mut Txn>,
    ) {
        if f.kind.is_ack_stall() {
            if late {
                if self.late_pending.len() < self.max_findings {
                    self.late_pending.push((i, sender, f));
                }
                return;
            }
            *self.prompt_releases.entry(sender).or_default() += 1;
        }
        self.record(i, f, open);
    }

    /// Counts and keeps a finding (slow-server candidates wait for [`Self::take_slow`]).
    pub fn record(&mut self, i: usize, f: Finding, open: Option<&mut Txn>) {
        let k = f.kind.index();
        if f.kind == FindingKind::SlowServer && !self.deciding {
            if self.slow_pending.len() < self.max_findings {
                self.slow_pending.push((i, f));
            } else {
                self.slow_pending_dropped += 1;
            }
            return;
        }
        self.counts[k] += 1;
        if self.costs[k].len() < 1_000_000 {
            self.costs[k].push(f.cost_us);
        }
        if let Some(t) = open
            && Some(t.t.index) == f.transaction
        {
            t.mark(f.kind);
        }
        // Each transaction counts once per kind, also for findings decided at the end.
        if let Some(tx) = f.transaction
            && self.affected_seen.insert((f.stream, tx, f.kind))
        {
            self.affected[k] += 1;
        }
        if self.findings.len() < self.max_findings {
            self.findings.push(f);
        }
    }

    /// Where the next recorded finding of `kind` and its cost would go (None: not kept).
    pub fn next_slots(&self, kind: FindingKind) -> (Option<usize>, Option<usize>) {
        let k = kind.index();
        (
            (self.findings.len() < self.max_findings).then_some(self.findings.len()),
            (self.costs[k].len() < 1_000_000).then_some(self.costs[k].len()),
        )
    }

    /// A retransmission recorded at `slots` that the receiver reported receiving twice
    /// (D-SACK): it cost nothing.
    pub fn spurious(&mut self, slots: (Option<usize>, Option<usize>)) {
        let k = FindingKind::Retransmission.index();
        if let Some(c) = slots.1.and_then(|c| self.costs[k].get_mut(c)) {
            *c = 0;
        }
        if let Some(f) = slots
            .0
            .and_then(|i| self.findings.get_mut(i))
            .filter(|f| f.kind == FindingKind::Retransmission)
        {
            f.explanation.push_str(
                "; the receiver reported it received this data twice (D-SACK): the \
                 original arrived, only its ACK was late — spurious, it cost nothing",
            );
            // `detail` stays Wireshark's kind (what the sender did); the cost is what changed.
            f.cost_us = 0;
        }
    }

    /// The stalls released late, each with how many stalls its sender had released at once.
    pub fn take_late(&mut self) -> Vec<(usize, u64, Finding)> {
        std::mem::take(&mut self.late_pending)
            .into_iter()
            .map(|(i, sender, f)| {
                let prompt = self.prompt_releases.get(&sender).copied().unwrap_or(0);
                (i, prompt, f)
            })
            .collect()
    }

    /// The slow-server candidates; from now on, recorded slow-server findings count.
    pub fn take_slow(&mut self) -> Vec<(usize, Finding)> {
        self.deciding = true;
        std::mem::take(&mut self.slow_pending)
    }

    /// The warning for candidates beyond `max_findings`, if any.
    pub fn dropped_warning(&self) -> Option<String> {
        (self.slow_pending_dropped > 0).then(|| {
            format!(
                "{} slow-server candidates beyond --max-findings were not evaluated",
                self.slow_pending_dropped
            )
        })
    }

    /// One row per kind that occurred, in report order.
    pub fn summary(&mut self, transactions_total: u64) -> Vec<KindSummary> {
        let total_tx = transactions_total.max(1);
        let mut summary = Vec::new();
        for kind in FindingKind::ALL {
            let k = kind.index();
            if self.counts[k] == 0 {
                continue;
            }
            let v = &mut self.costs[k];
            v.sort_unstable();
            summary.push(KindSummary {
                kind,
                findings: self.counts[k],
                transactions_affected: self.affected[k],
                share: self.affected[k] as f64 / total_tx as f64,
                median_us: percentile(v, 0.5),
                p99_us: percentile(v, 0.99),
                total_us: v.iter().sum(),
            });
        }
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(kind: FindingKind, transaction: Option<u32>, cost_us: u64) -> Finding {
        Finding {
            kind,
            detail: None,
            stream: 0,
            transaction,
            frames: vec![],
            start_us: 0,
            end_us: 0,
            cost_us,
            explanation: String::new(),
        }
    }

    #[test]
    fn counts_all_keeps_some() {
        let mut r = Recorder::new(2);
        for c in [10, 30, 20] {
            r.record(0, finding(FindingKind::Retransmission, None, c), None);
        }
        assert_eq!(r.findings.len(), 2);
        let s = r.summary(4);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].findings, s[0].median_us, s[0].total_us), (3, 20, 60));
        assert_eq!(s[0].transactions_affected, 0);
    }

    #[test]
    fn late_stalls_wait_and_slow_server_waits_for_its_decision() {
        let a = SocketAddr::from(([10, 0, 0, 2], 80));
        let mut r = Recorder::new(10);
        r.found(
            0,
            a,
            finding(FindingKind::NagleStall, Some(0), 5),
            true,
            None,
        );
        r.found(
            0,
            a,
            finding(FindingKind::NagleStall, Some(1), 5),
            false,
            None,
        );
        r.record(0, finding(FindingKind::SlowServer, Some(1), 5), None);
        assert_eq!(r.findings.len(), 1);
        let late = r.take_late();
        assert_eq!(late.len(), 1);
        assert_eq!(
            late[0].1, 1,
            "one stall of the same sender released at once"
        );
        let slow = r.take_slow();
        assert_eq!(slow.len(), 1);
        for (i, f) in slow {
            r.record(i, f, None);
        }
        let s = r.summary(2);
        assert_eq!(s[0].kind, FindingKind::NagleStall);
        assert_eq!(s[1].kind, FindingKind::SlowServer);
        assert_eq!(s[1].transactions_affected, 1);
    }
}
