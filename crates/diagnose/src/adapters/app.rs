//! Layer 2: a `lagtrace_load` report → [`AppRun`].

use lagtrace_load::{LatencySummary, LoadReport};

use crate::evidence::{AppRun, Errors, PercentilePoint, Percentiles};

fn pct(l: &LatencySummary) -> Percentiles {
    Percentiles {
        count: l.count,
        min_us: l.min,
        mean_us: l.mean.round().max(0.0) as u64,
        p50_us: l.p50,
        p90_us: l.p90,
        p99_us: l.p99,
        p999_us: l.p999,
        max_us: l.max,
    }
}

/// One load run as evidence.
pub fn run(concurrency: u32, r: &LoadReport) -> AppRun {
    let first = (r.first_request_latency_us.count > 0).then(|| pct(&r.first_request_latency_us));
    let later = (r.later_request_latency_us.count > 0).then(|| pct(&r.later_request_latency_us));
    AppRun {
        concurrency,
        requests: r.latency_us.count,
        duration_us: (r.duration_s * 1e6) as u64,
        requests_per_sec: r.requests_per_sec,
        latency: pct(&r.latency_us),
        distribution: if r.latency_us.count > 0 {
            r.percentiles
                .iter()
                .map(|p| PercentilePoint {
                    percentile: p.percentile,
                    latency_us: p.latency_us,
                })
                .collect()
        } else {
            Vec::new()
        },
        errors: Errors {
            connect: r.errors.connect,
            read: r.errors.read,
            write: r.errors.write,
            timeout: r.errors.timeout,
            status: r.errors.status,
        },
        first_request: first,
        bytes: r.bytes,
        later_requests: later,
    }
}

/// A run that could not start (nothing listening, connect timeout): one connect error.
pub fn failed(concurrency: u32) -> AppRun {
    AppRun {
        concurrency,
        errors: Errors {
            connect: 1,
            ..Errors::default()
        },
        ..AppRun::default()
    }
}
