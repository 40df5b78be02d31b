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
//! The types live in `lagtrace_model::diagnosis`; the generated JSON Schema is
//! `schemas/diagnose.schema.json`.
//! ```text
//! schema_version  2
//! command         "diagnose"
//! target      {url, host, addr, port}
//! settings    {concurrency, duration_us}
//! elapsed_us
//! verdict     {cause, secondary: [cause], confidence: high|medium|low, summary,
//!              cost: {added_us, share (0–1), affected?, of?, p50_us?, concurrency?,
//!                     p50_without_us?, text},
//!              mechanism?: every-nth|periodic-pause|cpu-throttled|cpu-contention|
//!                          dropped-before-wire|accept-queue-overflow,
//!              tail?: {percentile, latency_us, excess_us,
//!                      parts: [{cause, mechanism?, added_us, share}], text},
//!              fix: [{side: server|client|path, location?, change, tradeoff?}]}
//! layers      {path, app, packets, sockets, host}, each
//!             {status: ok|finding|skipped|unavailable|error, reason?, data?}
//!   path.data    {method: tcp-syn|tcp-connect|udp|icmp, idle: rtt?, under_load: rtt?,
//!                 hops: [{ttl, addr?, rtt_us?}], reached, port_open, notes}
//!                rtt = {sent, received, rst, min_us, p50_us, avg_us, p90_us, max_us}
//!   app.data     {c1: run?, cn: run?}; run = {concurrency, requests, duration_us,
//!                 requests_per_sec, latency: pct, distribution: [{percentile, latency_us}],
//!                 errors: {connect, read, write, timeout, status},
//!                 first_request: pct?, later_requests: pct?}
//!                pct = {count, min_us, mean_us, p50_us, p90_us, p99_us, p999_us, max_us}
//!   packets.data {capture_point, packets, dropped, streams, transactions,
//!                 handshake_rtt: pct?, server_time: pct?,
//!                 findings: [{kind, count, transactions, share, median_added_us,
//!                             p99_added_us, examples: [{stream, frames, time_us, added_us, note}]}],
//!                 example_flow: {stream, client, server,
//!                                packets: [{frame, t_us, dir: to-server|to-client, flags, len, note}],
//!                                stalls: [{from_frame, to_frame, gap_us, label}]}?}
//!   sockets.data {client: {nodelay, quickack, note}, server: {pid, comm, netns}?, established,
//!                 nodelay: {on, off, unknown}, cork: {on, off, unknown},
//!                 config: [{name, value, file, line, default}], notes}
//!   host.data    `lagtrace host --json`'s report over the c=N run (schemas/host.schema.json):
//!                {scope, window_us, counters, listeners, cgroup (with its throttling
//!                 timeline), threads, qdiscs, sockstat, drops, cost}
//! evidence    [{layer, stance: supports|rules-out|note, cause?, text}]
//! verify      {baseline, before_cause, after_cause, before_app,
//!              rows: [{run, metric: p50|p99|req/s, before, after, improvement}]}?
//! ```
#![deny(missing_docs)]

pub mod adapters;
pub mod client_cpu;
mod error;
pub mod hops;
pub mod join;
mod partial;
pub mod passive;
mod pcap_hops;
pub mod remote;
pub mod rules;
pub mod run;

// The output types live in `lagtrace-model`; these re-exports keep `crate::evidence::*`,
// `lagtrace_diagnose::Verdict` and friends working for the rules and the callers.
pub use lagtrace_model::diagnosis::{CompareRow, Diagnosis, SCHEMA_VERSION, Settings, Verify};
pub use lagtrace_model::diagnosis::{evidence, verdict};

pub use error::{Error, Result};
pub use evidence::{
    AppEvidence, AppRun, Layer, LayerName, LayerStatus, Layers, PacketEvidence, PathEvidence,
    SocketEvidence, Target,
};
pub use rules::{Judgement, judge};
pub use run::{DiagnoseOptions, ServerLocation, Step, run};
pub use verdict::{
    Confidence, Cost, EvidenceLine, Fix, FixSide, Mechanism, Stance, Tail, TailPart, Verdict,
};

/// Builds a [`Diagnosis`] by judging its layers: `Diagnosis::assemble(...)` with this trait
/// in scope. (The type lives in `lagtrace-model`; judging needs the rules, which live here.)
pub trait Assemble {
    /// Judges the layers and puts it all together; layers whose data supports the verdict
    /// get status `finding`.
    fn assemble(target: Target, settings: Settings, layers: Layers, elapsed_us: u64) -> Self;
}

impl Assemble for Diagnosis {
    fn assemble(target: Target, settings: Settings, layers: Layers, elapsed_us: u64) -> Self {
        assemble(target, settings, layers, elapsed_us)
    }
}

/// Judges the layers and puts it all together; layers whose data supports the verdict get
/// status `finding`.
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
            LayerName::Host => &mut layers.host.status,
        };
        if *st == LayerStatus::Ok {
            *st = LayerStatus::Finding;
        }
    }
    Diagnosis {
        schema_version: SCHEMA_VERSION,
        command: "diagnose".into(),
        target,
        settings,
        elapsed_us,
        started_unix_us: 0,
        lagtrace_version: env!("CARGO_PKG_VERSION").into(),
        verdict: j.verdict,
        layers,
        evidence: j.evidence,
        verify: None,
    }
}
