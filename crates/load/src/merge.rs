//! `lagtrace load merge`: the exact union of several workers' `--hdr-log` logs.
//!
//! Latency is combined by adding HdrHistograms (never by averaging percentiles): the union's
//! p99 is the p99 of every response of every worker. The timeline adds the histograms of
//! the same wall-clock interval (the logs' intervals are aligned to the clock, see
//! `hdrlog.rs`), so it survives workers started at different moments. With `--rate` every
//! worker's latency is already measured from intended send times (corrected for
//! coordinated omission); the union keeps that, and the uncorrected histograms beside it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use hdrhistogram::Histogram;

use crate::engine::new_hist;
use crate::error::{Error, Result, bail};
use crate::hdrlog::WorkerLog;
use crate::report::{
    ErrorCounts, LatencySummary, LoadReport, OptionsUsed, RateSummary, format_metric,
    format_time_us, percentile_points, render_text,
};

/// One worker of a merge, from its own log.
#[derive(Debug, Clone)]
pub struct WorkerRow {
    /// The worker's id.
    pub worker: String,
    /// Its log file.
    pub log: PathBuf,
    /// Its start, µs since the Unix epoch.
    pub start_unix_us: u64,
    /// Its run's length, µs.
    pub duration_us: u64,
    /// Completed responses.
    pub requests: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Errors by kind.
    pub errors: ErrorCounts,
    /// Its latency (from its histograms).
    pub latency: LatencySummary,
    /// Connections, threads, `--rate` and URL it ran with.
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

/// One wall-clock interval of the merged timeline.
#[derive(Debug, Clone)]
pub struct TimelineRow {
    /// Start, µs since the Unix epoch (the earliest of the workers' lines for it).
    pub start_unix_us: u64,
    /// End (the latest).
    pub end_unix_us: u64,
    /// Workers with a line for this interval.
    pub workers: u32,
    /// Latency of the responses completed in it, all workers (count = responses).
    pub latency: LatencySummary,
}

/// The merge: the union as a load report, and the workers and timeline behind it.
#[derive(Debug, Clone)]
pub struct MergedLoad {
    /// The union: every response of every worker.
    pub report: LoadReport,
    /// The earliest worker start, µs since the Unix epoch.
    pub start_unix_us: u64,
    /// Interval length of the logs, µs.
    pub interval_us: u64,
    /// One row per log, in the order given.
    pub workers: Vec<WorkerRow>,
    /// The merged intervals, in time order.
    pub timeline: Vec<TimelineRow>,
}

fn add(into: &mut Histogram<u64>, h: &Histogram<u64>, log: &WorkerLog) -> Result<()> {
    into.add(h).map_err(|e| {
        Error::Other(format!(
            "{}: a histogram out of range: {e:?}",
            log.path.display()
        ))
    })
}

/// What the logs must agree on to be merged.
fn check(logs: &[WorkerLog]) -> Result<()> {
    let Some(first) = logs.first() else {
        bail!("no logs to merge");
    };
    let mut ids = BTreeSet::new();
    for l in logs {
        if l.interval_us != first.interval_us {
            bail!(
                "{} has {} ms intervals, {} has {} ms: merge logs written with the same interval",
                first.path.display(),
                first.interval_us / 1000,
                l.path.display(),
                l.interval_us / 1000
            );
        }
        if l.summary.options.rate.is_some() != first.summary.options.rate.is_some() {
            bail!(
                "{} and {}: one ran with --rate and one without; their latencies are measured \
                 from different moments (intended vs actual send times) and do not add up",
                first.path.display(),
                l.path.display()
            );
        }
        if !ids.insert(l.summary.worker.as_str()) {
            bail!(
                "worker {:?} appears twice ({}): each worker's log once",
                l.summary.worker,
                l.path.display()
            );
        }
    }
    Ok(())
}

/// Merges worker logs into one report (see the module docs).
pub fn merge_logs(logs: &[WorkerLog]) -> Result<MergedLoad> {
    check(logs)?;
    let paced = logs[0].summary.options.rate.is_some();
    let (mut latency, mut first, mut uncorrected) = (new_hist(), new_hist(), new_hist());
    let mut slots: BTreeMap<u64, (Histogram<u64>, u64, u64, u32)> = BTreeMap::new();
    let mut workers = Vec::new();
    for l in logs {
        let mut own = new_hist();
        for (&k, iv) in &l.intervals {
            add(&mut own, &iv.latency, l)?;
            add(&mut first, &iv.first, l)?;
            if let Some(u) = &iv.uncorrected {
                add(&mut uncorrected, u, l)?;
            }
            let e = slots
                .entry(k)
                .or_insert_with(|| (new_hist(), u64::MAX, 0, 0));
            add(&mut e.0, &iv.latency, l)?;
            e.1 = e.1.min(iv.start_unix_us);
            e.2 = e.2.max(iv.end_unix_us);
            e.3 += 1;
        }
        let s = &l.summary;
        if own.len() != s.requests {
            bail!(
                "{}: its intervals hold {} responses, its summary {} (a damaged log?)",
                l.path.display(),
                own.len(),
                s.requests
            );
        }
        add(&mut latency, &own, l)?;
        workers.push(WorkerRow {
            worker: s.worker.clone(),
            log: l.path.clone(),
            start_unix_us: s.start_unix_us,
            duration_us: s.duration_us,
            requests: s.requests,
            bytes: s.bytes,
            errors: errors_from(&s.errors),
            latency: LatencySummary::from_hist(&own),
            connections: s.options.connections,
            threads: s.options.threads,
            rate: s.options.rate,
            url: s.options.url.clone(),
            interrupted: s.interrupted,
        });
    }
    let timeline = slots
        .into_values()
        .map(|(h, start, end, n)| TimelineRow {
            start_unix_us: start,
            end_unix_us: end,
            workers: n,
            latency: LatencySummary::from_hist(&h),
        })
        .collect();
    let report = union_report(logs, latency, first, paced.then_some(uncorrected));
    Ok(MergedLoad {
        start_unix_us: logs
            .iter()
            .map(|l| l.summary.start_unix_us)
            .min()
            .unwrap_or(0),
        interval_us: logs[0].interval_us,
        report,
        workers,
        timeline,
    })
}

fn errors_from(e: &lagtrace_model::load::ErrorCounts) -> ErrorCounts {
    ErrorCounts {
        connect: e.connect,
        read: e.read,
        write: e.write,
        timeout: e.timeout,
        status: e.status,
    }
}

/// The union's report: counts summed, latency from the summed histograms, the length the
/// wall-clock span from the first start to the last end.
fn union_report(
    logs: &[WorkerLog],
    latency: Histogram<u64>,
    first: Histogram<u64>,
    uncorrected: Option<Histogram<u64>>,
) -> LoadReport {
    let sums = |f: &dyn Fn(&WorkerLog) -> u64| logs.iter().map(f).sum::<u64>();
    let start = logs.iter().map(|l| l.summary.start_unix_us).min();
    let end = logs
        .iter()
        .map(|l| l.summary.start_unix_us + l.summary.duration_us)
        .max();
    let span_s = (end.unwrap_or(0).saturating_sub(start.unwrap_or(0)) as f64 / 1e6).max(1e-9);
    let requests = sums(&|l| l.summary.requests);
    let bytes = sums(&|l| l.summary.bytes);
    let mut errors = ErrorCounts::default();
    let mut status_codes = BTreeMap::new();
    let mut samples = Vec::new();
    for l in logs {
        let e = errors_from(&l.summary.errors);
        errors.connect += e.connect;
        errors.read += e.read;
        errors.write += e.write;
        errors.timeout += e.timeout;
        errors.status += e.status;
        for (&c, &n) in &l.summary.status_codes {
            *status_codes.entry(c).or_insert(0) += n;
        }
        samples.extend(l.summary.thread_rate_samples.iter().map(|&x| x as f64));
    }
    let mut later = latency.clone();
    let _ = later.subtract(&first);
    let s0 = &logs[0].summary;
    let same_target = logs.iter().all(|l| l.summary.target == s0.target);
    LoadReport {
        requests,
        duration_s: span_s,
        requests_per_sec: requests as f64 / span_s,
        bytes,
        bytes_per_sec: bytes as f64 / span_s,
        latency_us: LatencySummary::from_hist(&latency),
        uncorrected_latency_us: uncorrected.as_ref().map(LatencySummary::from_hist),
        first_request_latency_us: LatencySummary::from_hist(&first),
        later_request_latency_us: LatencySummary::from_hist(&later),
        percentiles: percentile_points(&latency),
        thread_requests_per_sec: RateSummary::from_samples(&samples),
        thread_rate_samples: samples,
        errors,
        status_codes,
        connections_opened: sums(&|l| l.summary.connections_opened),
        interrupted: logs.iter().any(|l| l.summary.interrupted),
        options: union_options(logs, span_s),
        host: if same_target {
            s0.target.host.clone()
        } else {
            String::new()
        },
        addr: s0
            .target
            .addr
            .parse::<std::net::IpAddr>()
            .ok()
            .filter(|_| same_target)
            .map(|ip| std::net::SocketAddr::new(ip, s0.target.port)),
        histogram: latency,
        records: None,
    }
}

fn union_options(logs: &[WorkerLog], span_s: f64) -> OptionsUsed {
    let o0 = &logs[0].summary.options;
    let urls: BTreeSet<&str> = logs
        .iter()
        .map(|l| l.summary.options.url.as_str())
        .collect();
    let requests: Option<Vec<u64>> = logs.iter().map(|l| l.summary.options.requests).collect();
    let rates: Option<Vec<f64>> = logs.iter().map(|l| l.summary.options.rate).collect();
    OptionsUsed {
        url: urls.into_iter().collect::<Vec<_>>().join(" "),
        connections: logs.iter().map(|l| l.summary.options.connections).sum(),
        threads: logs.iter().map(|l| l.summary.options.threads).sum(),
        duration_s: span_s,
        requests: requests.map(|v| v.iter().sum()),
        rate: rates.map(|v| v.iter().sum()),
        timeout_s: o0.timeout_us as f64 / 1e6,
        connect_timeout_s: o0.connect_timeout_us as f64 / 1e6,
        method: o0.method.clone(),
        headers: o0.headers.clone(),
        body_bytes: o0.body_bytes,
        quickack: o0.quickack,
        insecure: o0.insecure,
    }
}

/// The merge in wrk's layout (the union), then one row per worker, then (with `timeline`)
/// one row per interval.
pub fn render_merged_text(
    m: &MergedLoad,
    distribution: bool,
    uncorrected: bool,
    timeline: bool,
) -> String {
    let o = &m.report.options;
    let mut s = String::new();
    let _ = writeln!(s, "Merged {} workers @ {}", m.workers.len(), o.url);
    let _ = writeln!(
        s,
        "  {} threads and {} connections in all, {} from the first start to the last end",
        o.threads,
        o.connections,
        format_time_us(m.report.duration_s * 1e6)
    );
    if let Some(r) = o.rate {
        let _ = writeln!(
            s,
            "  constant rate {r} requests/sec in all (latency from intended send times)"
        );
    }
    s.push_str(&render_text(&m.report, distribution, uncorrected));
    let _ = writeln!(
        s,
        "  Workers{:>17}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>8}",
        "start", "duration", "requests", "Req/Sec", "p50", "p99", "max", "errors"
    );
    for w in &m.workers {
        let l = &w.latency;
        let _ = writeln!(
            s,
            "    {:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>8}",
            w.worker,
            format!(
                "+{:.3}s",
                w.start_unix_us.saturating_sub(m.start_unix_us) as f64 / 1e6
            ),
            format_time_us(w.duration_us as f64),
            w.requests,
            format_metric(w.requests as f64 / (w.duration_us as f64 / 1e6).max(1e-9)),
            format_time_us(l.p50 as f64),
            format_time_us(l.p99 as f64),
            format_time_us(l.max as f64),
            w.errors.socket(),
        );
    }
    if timeline {
        let _ = writeln!(
            s,
            "  Timeline{:>14}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
            "start", "length", "workers", "requests", "p50", "p99", "max"
        );
        for t in &m.timeline {
            let l = &t.latency;
            let _ = writeln!(
                s,
                "    {:>20}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
                format!(
                    "+{:.3}s",
                    t.start_unix_us.saturating_sub(m.start_unix_us) as f64 / 1e6
                ),
                format_time_us(t.end_unix_us.saturating_sub(t.start_unix_us) as f64),
                t.workers,
                l.count,
                format_time_us(l.p50 as f64),
                format_time_us(l.p99 as f64),
                format_time_us(l.max as f64),
            );
        }
    }
    s
}

impl From<&MergedLoad> for lagtrace_model::load::LoadMergeReport {
    fn from(m: &MergedLoad) -> Self {
        use lagtrace_model::load as md;
        md::LoadMergeReport {
            union: (&m.report).into(),
            start_unix_us: m.start_unix_us,
            interval_us: m.interval_us,
            workers: m
                .workers
                .iter()
                .map(|w| md::LoadWorker {
                    worker: w.worker.clone(),
                    log: w.log.display().to_string(),
                    start_unix_us: w.start_unix_us,
                    duration_us: w.duration_us,
                    requests: w.requests,
                    requests_per_sec: w.requests as f64 / (w.duration_us as f64 / 1e6).max(1e-9),
                    bytes: w.bytes,
                    errors: md::ErrorCounts {
                        connect: w.errors.connect,
                        read: w.errors.read,
                        write: w.errors.write,
                        timeout: w.errors.timeout,
                        status: w.errors.status,
                    },
                    latency: (&w.latency).into(),
                    connections: w.connections,
                    threads: w.threads,
                    rate: w.rate,
                    url: w.url.clone(),
                    interrupted: w.interrupted,
                })
                .collect(),
            timeline: m
                .timeline
                .iter()
                .map(|t| md::LoadInterval {
                    start_unix_us: t.start_unix_us,
                    end_unix_us: t.end_unix_us,
                    workers: t.workers,
                    latency: md::LoadLatency::from(&t.latency).summary,
                })
                .collect(),
        }
    }
}
