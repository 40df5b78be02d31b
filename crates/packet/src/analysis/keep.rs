//! Bounded per-transaction timings (`AnalyzeOptions::timing_keep`): a long capture (minutes
//! of a busy server) keeps every transaction's wait in HdrHistograms, its slowest timings
//! exactly and a uniform sample of the others — the load engine's record keeping
//! (`lagtrace_model::request`), over the capture's transactions. Memory is fixed by the
//! caps, whatever the capture's length.

use hdrhistogram::Histogram;
use lagtrace_model::LatencySummary;
use lagtrace_model::analyze::{TimingKeep, TxnTiming};
use lagtrace_model::request::{SlowestAndSample, WantedKeys, sample_key};
use std::collections::HashSet;
use std::sync::Arc;

/// Longest wait the histograms hold exactly (1 h); longer ones are clamped to it.
const HIST_HIGH_US: u64 = 3_600_000_000;

/// The percentiles of [`TimingKeep::distribution`].
const POINTS: [f64; 12] = [
    0.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0,
];

/// How many timings to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeepCaps {
    /// The slowest timings kept exactly.
    pub slow_cap: usize,
    /// The uniform sample of the others.
    pub sample_cap: usize,
}

impl Default for KeepCaps {
    /// 16 384 slow + 4 096 sampled (a few MB at most): every transaction above the p99 of
    /// captures of up to 1.6 million transactions is kept.
    fn default() -> Self {
        KeepCaps {
            slow_cap: 16_384,
            sample_cap: 4_096,
        }
    }
}

/// The wait of a transaction as its client saw it at the capture, µs: from the request's
/// first byte (the SYN for a connection's first request with its handshake captured) to
/// the response's last byte; `None` without a complete response.
pub fn wait_us(t: &TxnTiming) -> Option<u64> {
    let start = match (t.index, t.syn_at_us) {
        (0, Some(syn)) => Some(syn),
        _ => t.request_first_at_us,
    }?;
    let end = t.response_last_at_us?;
    u64::try_from(end - start).ok()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_HIGH_US, 3).expect("static histogram bounds are valid")
}

fn summary(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    LatencySummary {
        count: h.len(),
        min_us: h.min(),
        mean_us: h.mean().round() as u64,
        p50_us: h.value_at_quantile(0.5),
        p90_us: h.value_at_quantile(0.9),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
    }
}

/// The kept timings and the histograms of all.
pub(super) struct Keep {
    caps: KeepCaps,
    kept: SlowestAndSample<TxnTiming>,
    /// The keys of the requests the load kept (the run is over: all are in).
    wanted: Option<Arc<WantedKeys>>,
    /// The timings the load wanted, kept exactly (weight 0: the slow ones and the sample
    /// stand for the distribution; these are for the join).
    extras: Vec<TxnTiming>,
    /// The first this many timings are kept exactly too (weight 0).
    keep_first: usize,
    seen: u64,
    incomplete: u64,
    waits: Histogram<u64>,
    first: Histogram<u64>,
    later: Histogram<u64>,
}

impl Keep {
    pub fn new(caps: KeepCaps, wanted: Option<Arc<WantedKeys>>, keep_first: usize) -> Keep {
        Keep {
            caps,
            // A fixed seed: the same capture keeps the same sample.
            kept: SlowestAndSample::new(caps.slow_cap, caps.sample_cap, 1 << 16, 0),
            wanted,
            extras: Vec::new(),
            keep_first,
            seen: 0,
            incomplete: 0,
            waits: hist(),
            first: hist(),
            later: hist(),
        }
    }

    pub fn offer(&mut self, t: TxnTiming) {
        let early = self.seen < self.keep_first as u64;
        self.seen += 1;
        let wait = wait_us(&t);
        match wait {
            Some(w) => {
                let w = w.clamp(1, HIST_HIGH_US);
                self.waits.saturating_record(w);
                if t.index == 0 && t.syn_at_us.is_some() {
                    self.first.saturating_record(w);
                } else {
                    self.later.saturating_record(w);
                }
            }
            None => self.incomplete += 1,
        }
        // Keyed as the load engine keys its records: a sampled record's transaction is in
        // this sample when this sample is at least as dense.
        let key = sample_key(t.client, t.server, t.index);
        if early || self.wanted.as_ref().is_some_and(|w| w.contains(&key)) {
            let mut x = t.clone();
            x.weight = 0.0;
            self.extras.push(x);
        }
        self.kept.offer_keyed(wait.unwrap_or(0), key, t);
    }

    /// The kept timings, weighted, and how they were kept.
    pub fn finish(self) -> (Vec<TxnTiming>, TimingKeep) {
        let k = self.kept.finish();
        let mut out = k.slow;
        out.extend(k.sample.into_iter().map(|mut t| {
            t.weight = k.weight;
            t
        }));
        // The wanted ones not kept already.
        let have: HashSet<(u32, u32)> = out.iter().map(|t| (t.stream, t.index)).collect();
        out.extend(
            self.extras
                .into_iter()
                .filter(|t| !have.contains(&(t.stream, t.index))),
        );
        let keep = TimingKeep {
            slow_cap: u32::try_from(self.caps.slow_cap).unwrap_or(u32::MAX),
            sample_cap: u32::try_from(self.caps.sample_cap).unwrap_or(u32::MAX),
            seen: self.seen,
            incomplete: self.incomplete,
            waits: summary(&self.waits),
            first: summary(&self.first),
            later: summary(&self.later),
            distribution: if self.waits.is_empty() {
                Vec::new()
            } else {
                POINTS
                    .iter()
                    .map(|&p| (p, self.waits.value_at_quantile(p / 100.0)))
                    .collect()
            },
        };
        (out, keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(index: u32, start: i64, wait: i64) -> TxnTiming {
        TxnTiming {
            stream: index,
            index,
            client: "10.0.0.1:40000".parse().unwrap(),
            server: "10.0.0.2:80".parse().unwrap(),
            syn_at_us: None,
            syn_retransmits: 0,
            synack_at_us: None,
            request_first_at_us: Some(start),
            request_last_at_us: Some(start),
            response_first_at_us: Some(start + wait),
            response_last_at_us: Some(start + wait),
            server_path_us: 0,
            hold_request_us: 0,
            hold_response_us: 0,
            loss_request_us: 0,
            loss_response_us: 0,
            kinds: Vec::new(),
            weight: 1.0,
        }
    }

    #[test]
    fn every_slow_one_is_kept_and_the_weights_add_up_to_all() {
        let mut k = Keep::new(
            KeepCaps {
                slow_cap: 10,
                sample_cap: 20,
            },
            None,
            0,
        );
        // 1000 fast transactions and 10 slow ones spread among them.
        for i in 0..1010u32 {
            let wait = if i % 101 == 50 {
                40_000
            } else {
                200 + i64::from(i % 7)
            };
            k.offer(timing(i, i64::from(i) * 1000, wait));
        }
        let (kept, keep) = k.finish();
        assert_eq!(keep.seen, 1010);
        assert_eq!(keep.waits.count, 1010);
        assert_eq!(kept.len(), 30);
        assert_eq!(
            kept.iter().filter(|t| wait_us(t) == Some(40_000)).count(),
            10
        );
        let total: f64 = kept.iter().map(|t| t.weight).sum();
        assert!((total - 1010.0).abs() < 1e-6, "{total}");
        assert!((39_900..=40_100).contains(&keep.waits.max_us), "{keep:?}");
        assert!((200..=207).contains(&keep.waits.p50_us), "{keep:?}");
    }

    #[test]
    fn a_transaction_without_a_response_is_counted_incomplete() {
        let mut k = Keep::new(KeepCaps::default(), None, 0);
        let mut t = timing(0, 0, 100);
        t.response_last_at_us = None;
        k.offer(t);
        let (kept, keep) = k.finish();
        assert_eq!((keep.seen, keep.incomplete, keep.waits.count), (1, 1, 0));
        assert_eq!(kept.len(), 1);
    }

    /// A transaction the load called slow is kept exactly though it is fast at the capture,
    /// once, weighing nothing (the others still stand for all).
    #[test]
    fn transactions_the_load_wants_are_kept_whatever_their_wait_here() {
        let key = |t: &TxnTiming| sample_key(t.client, t.server, t.index);
        let want: Vec<u32> = (0..5).map(|j| 7 + 1000 * j).collect();
        let wanted: WantedKeys = want.iter().map(|&w| key(&timing(w, 0, 0))).collect();
        let mut k = Keep::new(
            KeepCaps {
                slow_cap: 5,
                sample_cap: 5,
            },
            Some(Arc::new(wanted)),
            0,
        );
        for i in 0..5_000u32 {
            k.offer(timing(i, i64::from(i) * 1000, 200 + i64::from(i % 13)));
        }
        let (kept, keep) = k.finish();
        assert_eq!(keep.seen, 5_000);
        for w in &want {
            assert_eq!(kept.iter().filter(|t| t.index == *w).count(), 1, "{w}");
        }
        assert_eq!(kept.iter().filter(|t| t.weight == 0.0).count(), 5);
        let total: f64 = kept.iter().map(|t| t.weight).sum();
        assert!((total - 5_000.0).abs() < 1e-6, "{total}");
    }
}
