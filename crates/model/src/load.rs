//! `lagtrace load --json`: what a load run measured.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{LatencySummary, Target};

/// A latency distribution of a load run: the contract's [`LatencySummary`] plus wrk's spread
/// columns.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct LoadLatency {
    /// count, min, mean, p50, p90, p99, p99.9, max.
    #[serde(flatten)]
    pub summary: LatencySummary,
    /// Standard deviation.
    pub stdev_us: u64,
    /// 75th percentile.
    pub p75_us: u64,
    /// 99.99th percentile.
    pub p9999_us: u64,
    /// Share of values within mean ± stdev, 0–1 (wrk's "+/- Stdev").
    pub within_stdev_share: f64,
}

/// Per-thread requests/sec, sampled every 100 ms (wrk's "Req/Sec" row).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct RateSummary {
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Largest sample.
    pub max: f64,
    /// Share of samples within mean ± stdev, 0–1.
    pub within_stdev_share: f64,
}

/// Errors by kind. Each is a measurement: the run went on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ErrorCounts {
    /// Connections that could not be made (refused, reset, or `--connect-timeout`).
    pub connect: u64,
    /// Reads that failed (reset, not HTTP, TLS failure, closed mid-response).
    pub read: u64,
    /// Writes that failed.
    pub write: u64,
    /// Requests with no complete response within `--timeout`.
    pub timeout: u64,
    /// Responses with status ≥ 400 (also counted in `requests`).
    pub status: u64,
}

/// The latency at one percentile (for percentile charts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PercentilePoint {
    /// Percentile (0–100).
    pub percentile: f64,
    /// Latency at that percentile.
    pub latency_us: u64,
}

/// The options a run used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadOptions {
    /// Target URL.
    pub url: String,
    /// Connections.
    pub connections: usize,
    /// Threads.
    pub threads: usize,
    /// Duration limit.
    pub duration_us: u64,
    /// `-n`: requests to make.
    pub requests: Option<u64>,
    /// `--rate`: requests/sec across all connections.
    pub rate: Option<f64>,
    /// Request timeout.
    pub timeout_us: u64,
    /// Connect timeout.
    pub connect_timeout_us: u64,
    /// HTTP method.
    pub method: String,
    /// Extra headers.
    pub headers: Vec<String>,
    /// Body size, bytes.
    pub body_bytes: usize,
    /// TCP_QUICKACK set after every read.
    pub quickack: bool,
    /// Certificates not verified.
    pub insecure: bool,
}

/// What a load run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadReport {
    /// What was loaded.
    pub target: Target,
    /// Completed responses (any status).
    pub requests: u64,
    /// Wall time of the run.
    pub duration_us: u64,
    /// Completed responses per second.
    pub requests_per_sec: f64,
    /// Bytes read (response heads and bodies).
    pub bytes: u64,
    /// Bytes read per second.
    pub bytes_per_sec: f64,
    /// Latency. With `--rate`, measured from each request's intended send time (corrected
    /// for coordinated omission); otherwise from the moment it was sent.
    pub latency: LoadLatency,
    /// With `--rate`: latency from the actual send time (not corrected).
    pub uncorrected_latency: Option<LoadLatency>,
    /// Latency of the first request on each connection.
    pub first_request_latency: LoadLatency,
    /// Latency of the requests after the first on each connection (keep-alive reuse).
    pub later_request_latency: LoadLatency,
    /// Latency at 100·(1 − 10^(−k/4)) for k = 0..=20, then 100, for percentile charts.
    pub percentiles: Vec<PercentilePoint>,
    /// Per-thread requests/sec (wrk's Req/Sec row).
    pub thread_requests_per_sec: RateSummary,
    /// Errors by kind.
    pub errors: ErrorCounts,
    /// Responses by status code.
    pub status_codes: BTreeMap<u16, u64>,
    /// TCP connections established.
    pub connections_opened: u64,
    /// The run was stopped early (Ctrl-C / stop flag).
    pub interrupted: bool,
    /// Options used.
    pub options: LoadOptions,
}

/// `lagtrace load merge --json`: the exact union of several workers' `--hdr-log` logs (the
/// latency histograms added, never percentiles averaged), with a row per worker and the
/// merged wall-clock timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadMergeReport {
    /// The union as one load report (the fields of `lagtrace load --json`): counts summed,
    /// latency from the added histograms, `duration_us` from the first worker's start to the
    /// last one's end, `options` summed (connections, threads, rate) or the first worker's.
    #[serde(flatten)]
    pub union: LoadReport,
    /// The first worker's start, µs since the Unix epoch.
    pub start_unix_us: u64,
    /// The logs' interval length.
    pub interval_us: u64,
    /// One row per log, in the order given.
    pub workers: Vec<LoadWorker>,
    /// The merged intervals in time order: interval `k` holds the responses of every worker
    /// completed in `[k·interval_us, (k+1)·interval_us)` µs since the Unix epoch.
    pub timeline: Vec<LoadInterval>,
}

/// One worker of a merge, from its own log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadWorker {
    /// The worker's id (`--worker-id`).
    pub worker: String,
    /// Its log file, as given.
    pub log: String,
    /// Its start, µs since the Unix epoch.
    pub start_unix_us: u64,
    /// Its run's length.
    pub duration_us: u64,
    /// Completed responses.
    pub requests: u64,
    /// `requests / duration`.
    pub requests_per_sec: f64,
    /// Bytes read.
    pub bytes: u64,
    /// Errors by kind.
    pub errors: ErrorCounts,
    /// Its latency.
    pub latency: LoadLatency,
    /// Connections.
    pub connections: usize,
    /// Threads.
    pub threads: usize,
    /// `--rate`.
    pub rate: Option<f64>,
    /// Target URL.
    pub url: String,
    /// Stopped early.
    pub interrupted: bool,
}

/// One interval of a merged timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoadInterval {
    /// Start, µs since the Unix epoch (the earliest worker's, whole ms).
    pub start_unix_us: u64,
    /// End (the latest worker's, whole ms).
    pub end_unix_us: u64,
    /// Workers with responses or a line for this interval.
    pub workers: u32,
    /// Latency of the responses completed in it, every worker (`count`: how many).
    pub latency: LatencySummary,
}
