//! The diagnosis: what `lagtrace diagnose --json` prints and `--save` writes.
//!
//! - [`evidence`]: the evidence model, one [`Layer`](evidence::Layer) per method layer.
//! - [`verdict`]: the conclusion and the evidence lines for and against it.
//! - [`Diagnosis`]: target, settings, verdict, layers and evidence together.
//!
//! The rules that decide a verdict live in `lagtrace-diagnose`; this module is plain data.

pub mod evidence;
pub mod verdict;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Cause;
use evidence::{AppEvidence, Layers, Target};
use verdict::{EvidenceLine, Verdict};

pub use crate::contract::SCHEMA_VERSION;

/// The settings a diagnosis ran with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Settings {
    /// Connections of the concurrent run.
    pub concurrency: u32,
    /// Total load budget (c=1 and c=N runs together), µs.
    pub duration_us: u64,
}

/// One row of a before/after comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompareRow {
    /// `c=1` or `c=32`.
    pub run: String,
    /// `p50`, `p99` or `req/s`.
    pub metric: String,
    /// The baseline's value (µs for latencies).
    pub before: f64,
    /// This run's value.
    pub after: f64,
    /// before / after for latencies, after / before for req/s: > 1 is better.
    pub improvement: f64,
}

/// `--verify`: this run against a saved baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Verify {
    /// Where the baseline came from.
    pub baseline: String,
    /// The baseline's verdict.
    pub before_cause: Cause,
    /// This run's verdict.
    pub after_cause: Cause,
    /// The baseline's application evidence (for the before/after chart).
    pub before_app: Option<AppEvidence>,
    /// p50, p99, req/s at c=1 and c=N, before and after.
    pub rows: Vec<CompareRow>,
}

/// A whole diagnosis: what `--json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Diagnosis {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Always `diagnose`.
    pub command: String,
    /// What was diagnosed.
    pub target: Target,
    /// How it ran.
    pub settings: Settings,
    /// Wall time of the whole diagnosis.
    pub elapsed_us: u64,
    /// When the run started, µs since the Unix epoch (0: not recorded, as in diagnoses saved
    /// before it was).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub started_unix_us: u64,
    /// The lagtrace version that ran it (empty: not recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lagtrace_version: String,
    /// The conclusion.
    pub verdict: Verdict,
    /// Each layer's status and data.
    pub layers: Layers,
    /// Evidence for the verdict and against the alternatives.
    pub evidence: Vec<EvidenceLine>,
    /// Before/after, when verifying against a baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Diagnosis {
    /// Compares this run (after) with a baseline (before).
    pub fn compare_with(&self, before: &Diagnosis, baseline: &str) -> Verify {
        let mut rows = Vec::new();
        let runs = |d: &Diagnosis| {
            let a = d.layers.app.get().cloned().unwrap_or_default();
            (a.c1, a.cn)
        };
        let (b1, bn) = runs(before);
        let (a1, an) = runs(self);
        for (b, a) in [(b1, a1), (bn, an)] {
            let (Some(b), Some(a)) = (b, a) else { continue };
            if b.requests == 0 || a.requests == 0 {
                continue;
            }
            let name = format!("c={}", a.concurrency);
            let lat = |m: &str, bv: u64, av: u64| CompareRow {
                run: name.clone(),
                metric: m.into(),
                before: bv as f64,
                after: av as f64,
                improvement: bv as f64 / (av.max(1)) as f64,
            };
            rows.push(lat("p50", b.latency.p50_us, a.latency.p50_us));
            rows.push(lat("p99", b.latency.p99_us, a.latency.p99_us));
            rows.push(CompareRow {
                run: name.clone(),
                metric: "req/s".into(),
                before: b.requests_per_sec,
                after: a.requests_per_sec,
                improvement: a.requests_per_sec / b.requests_per_sec.max(1e-9),
            });
        }
        // A baseline taken against another server compares two different things: say so
        // wherever the comparison is shown.
        let b = &before.target;
        let t = &self.target;
        let baseline = if (b.addr.as_str(), b.port) != (t.addr.as_str(), t.port) || b.url != t.url {
            format!(
                "{baseline} (taken against {}, not {}: a different target)",
                b.url, t.url
            )
        } else {
            baseline.into()
        };
        Verify {
            baseline,
            before_cause: before.verdict.cause,
            after_cause: self.verdict.cause,
            before_app: before.layers.app.get().cloned(),
            rows,
        }
    }
}
