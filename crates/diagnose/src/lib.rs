//! lagtrace-diagnose: runs the four layers against a URL, turns each layer's report into
//! evidence, and decides a verdict with pure rules.
//!
//! - [`evidence`]: the evidence model (`PathEvidence`, `AppEvidence`, `PacketEvidence`,
//!   `SocketEvidence`, each wrapped in a [`Layer`] with a status).
//! - [`rules::judge`]: evidence in, [`Verdict`] + evidence lines out. No I/O.
//! - [`Diagnosis`]: what `lagtrace diagnose --json` prints and `--save` writes.
//! - [`run()`](run::run): the orchestration; one adapter per layer in [`adapters`].
//!
//! ## JSON schema (version [`SCHEMA_VERSION`]; durations in whole µs, `*_us`)
//! ```text
//! schema      1
//! target      {url, host, addr, port}
//! settings    {concurrency, duration_ms}
//! elapsed_us
//! verdict     {cause, secondary: [cause], confidence: high|medium|low, summary, cost,
//!              fix: [{side: server|client|path, location?, change, tradeoff?}]}
//! layers      {path, app, packets, sockets}, each
//!             {status: ok|finding|skipped|unavailable|error, reason?, data?}
//!   path.data    {method, idle: rtt?, under_load: rtt?, hops: [{ttl, addr?, rtt_us?}],
//!                 reached, port_open, notes}
//!                rtt = {sent, received, rst, min_us, p50_us, avg_us, p90_us, max_us}
//!   app.data     {c1: run?, cn: run?}; run = {concurrency, requests, duration_us,
//!                 requests_per_sec, latency: pct, distribution: [{percentile, latency_us}],
//!                 errors: {connect, read, write, timeout, status},
//!                 first_request: pct?, later_requests: pct?}
//!                pct = {count, min_us, mean_us, p50_us, p90_us, p99_us, p999_us, max_us}
//!   packets.data {capture_point, packets, dropped, streams, transactions,
//!                 handshake_rtt: pct?, server_time: pct?,
//!                 findings: [{kind, count, transactions, share, median_added_us,
//!                             p99_added_us, examples: [{stream, frames, time_s, added_us, note}]}],
//!                 example_flow: {stream, client, server,
//!                                packets: [{frame, t_us, dir: to-server|to-client, flags, len, note}],
//!                                stalls: [{from_frame, to_frame, gap_us, label}]}?}
//!   sockets.data {client: {nodelay, quickack, note}, server: {pid, comm, netns}?, established,
//!                 nodelay: {on, off, unknown}, cork: {on, off, unknown},
//!                 config: [{name, value, file, line, default}], notes}
//! evidence    [{layer, stance: supports|rules-out|note, cause?, text}]
//! verify      {baseline, before_cause, after_cause, before_app,
//!              rows: [{run, metric: p50|p99|req/s, before, after, improvement}]}?
//! ```
#![deny(missing_docs)]

pub mod adapters;
pub mod evidence;
pub mod rules;
pub mod run;
pub mod verdict;

use serde::{Deserialize, Serialize};

pub use evidence::{
    AppEvidence, AppRun, Layer, LayerName, LayerStatus, Layers, PacketEvidence, PathEvidence,
    SocketEvidence, Target,
};
pub use rules::{Judgement, judge};
pub use run::{DiagnoseOptions, ServerLocation, Step, run};
pub use verdict::{Confidence, EvidenceLine, Fix, FixSide, Stance, Verdict};

/// Version of the JSON schema of [`Diagnosis`]; bumped on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// The settings a diagnosis ran with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Settings {
    /// Connections of the concurrent run.
    pub concurrency: u32,
    /// Total load budget (c=1 and c=N runs together), milliseconds.
    pub duration_ms: u64,
}

/// One row of a before/after comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verify {
    /// Where the baseline came from.
    pub baseline: String,
    /// The baseline's verdict.
    pub before_cause: lagtrace_model::Cause,
    /// This run's verdict.
    pub after_cause: lagtrace_model::Cause,
    /// The baseline's application evidence (for the before/after chart).
    pub before_app: Option<AppEvidence>,
    /// p50, p99, req/s at c=1 and c=N, before and after.
    pub rows: Vec<CompareRow>,
}

/// A whole diagnosis: what `--json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// What was diagnosed.
    pub target: Target,
    /// How it ran.
    pub settings: Settings,
    /// Wall time of the whole diagnosis.
    pub elapsed_us: u64,
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

impl Diagnosis {
    /// Judges the layers and puts it all together; layers whose data supports the verdict
    /// get status `finding`.
    pub fn assemble(
        target: Target,
        settings: Settings,
        mut layers: Layers,
        elapsed_us: u64,
    ) -> Diagnosis {
        let j = judge(&target, &layers);
        for l in &j.finding_layers {
            let st = match l {
                LayerName::Path => &mut layers.path.status,
                LayerName::App => &mut layers.app.status,
                LayerName::Packets => &mut layers.packets.status,
                LayerName::Sockets => &mut layers.sockets.status,
            };
            if *st == LayerStatus::Ok {
                *st = LayerStatus::Finding;
            }
        }
        Diagnosis {
            schema: SCHEMA_VERSION,
            target,
            settings,
            elapsed_us,
            verdict: j.verdict,
            layers,
            evidence: j.evidence,
            verify: None,
        }
    }

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
