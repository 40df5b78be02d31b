//! The report: serde data computed from the merged histograms, and wrk's text layout.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency summary in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of latencies recorded.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Largest.
    pub max: u64,
    /// Median.
    pub p50: u64,
    /// 75th percentile.
    pub p75: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Share of values within mean ± stdev, in percent (wrk's "+/- Stdev").
    pub within_stdev_pct: f64,
}

impl LatencySummary {
    /// Summarises a histogram (all zeros when it is empty).
    pub fn from_hist(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let (mean, stdev) = (h.mean(), h.stdev());
        let (lo, hi) = (mean - stdev, mean + stdev);
        let within: u64 = h
            .iter_recorded()
            .filter(|v| {
                let x = v.value_iterated_to() as f64;
                x >= lo && x <= hi
            })
            .map(|v| v.count_at_value())
            .sum();
        LatencySummary {
            count: h.len(),
            min: h.min(),
            mean,
            stdev,
            max: h.max(),
            p50: h.value_at_quantile(0.50),
            p75: h.value_at_quantile(0.75),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            p9999: h.value_at_quantile(0.9999),
            within_stdev_pct: 100.0 * within as f64 / h.len() as f64,
        }
    }
}

/// Per-thread requests/sec, sampled every 100 ms (wrk's "Req/Sec" row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RateSummary {
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Largest sample.
    pub max: f64,
    /// Share of samples within mean ± stdev, in percent.
    pub within_stdev_pct: f64,
}

impl RateSummary {
    /// Summarises samples (all zeros when there are none).
    pub fn from_samples(s: &[f64]) -> Self {
        if s.is_empty() {
            return RateSummary::default();
        }
        let n = s.len() as f64;
        let mean = s.iter().sum::<f64>() / n;
        let stdev = if s.len() > 1 {
            (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let within = s
            .iter()
            .filter(|&&x| x >= mean - stdev && x <= mean + stdev)
            .count();
        RateSummary {
            mean,
            stdev,
            max: s.iter().copied().fold(0.0, f64::max),
            within_stdev_pct: 100.0 * within as f64 / n,
        }
    }
}

/// Errors by kind. Each is a measurement: the run went on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    /// Connections that could not be made (refused, reset, or `--connect-timeout`).
    pub connect: u64,
    /// Reads that failed: reset, garbage instead of HTTP, TLS failure, or the server closed
    /// in the middle of a response.
    pub read: u64,
    /// Writes that failed.
    pub write: u64,
    /// Requests with no complete response within `--timeout` (abandoned, connection replaced).
    pub timeout: u64,
    /// Responses with status ≥ 400 (wrk's "Non-2xx or 3xx responses"; these are also counted
    /// in `requests`).
    pub status: u64,
}

impl ErrorCounts {
    /// Socket errors (connect + read + write + timeout).
    pub fn socket(&self) -> u64 {
        self.connect + self.read + self.write + self.timeout
    }
}

/// The latency at one percentile (for percentile charts).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PercentilePoint {
    /// Percentile (0–100).
    pub percentile: f64,
    /// Latency at that percentile, µs.
    pub latency_us: u64,
}

/// The percentiles reported in [`LoadReport::percentiles`]: 100·(1 − 10^(−k/4)) for
/// k = 0..=20 (0, 43.8, 68.4, 82.2, 90, …, 99.999), then 100 — even steps on a log scale of
/// the tail.
pub fn chart_percentiles() -> Vec<f64> {
    let mut v: Vec<f64> = (0..=20)
        .map(|k| 100.0 * (1.0 - 10f64.powf(-f64::from(k) / 4.0)))
        .collect();
    v.push(100.0);
    v
}

pub(crate) fn percentile_points(h: &Histogram<u64>) -> Vec<PercentilePoint> {
    if h.is_empty() {
        return Vec::new();
    }
    chart_percentiles()
        .into_iter()
        .map(|p| PercentilePoint {
            percentile: p,
            latency_us: h.value_at_percentile(p),
        })
        .collect()
}

/// The options a run used, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptionsUsed {
    /// Target URL.
    pub url: String,
    /// Connections.
    pub connections: usize,
    /// Threads.
    pub threads: usize,
    /// Duration limit, seconds.
    pub duration_s: f64,
    /// `-n`: requests to make.
    pub requests: Option<u64>,
    /// `--rate`: requests/sec across all connections.
    pub rate: Option<f64>,
    /// Request timeout, seconds.
    pub timeout_s: f64,
    /// Connect timeout, seconds.
    pub connect_timeout_s: f64,
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
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Completed responses (any status).
    pub requests: u64,
    /// Wall time of the run, seconds.
    pub duration_s: f64,
    /// `requests / duration_s`.
    pub requests_per_sec: f64,
    /// Bytes read (response heads and bodies).
    pub bytes: u64,
    /// `bytes / duration_s`.
    pub bytes_per_sec: f64,
    /// Latency. With `--rate`, measured from each request's intended send time (corrected
    /// for coordinated omission); otherwise from the moment it was sent.
    pub latency_us: LatencySummary,
    /// With `--rate`: latency from the actual send time (not corrected).
    pub uncorrected_latency_us: Option<LatencySummary>,
    /// Latency of the first request on each connection (includes nothing of the connect).
    pub first_request_latency_us: LatencySummary,
    /// Latency of the requests after the first on each connection (keep-alive reuse).
    pub later_request_latency_us: LatencySummary,
    /// Latency at [`chart_percentiles`], for percentile charts.
    pub percentiles: Vec<PercentilePoint>,
    /// Per-thread requests/sec (wrk's Req/Sec row).
    pub thread_requests_per_sec: RateSummary,
    /// The samples behind [`LoadReport::thread_requests_per_sec`] (every 100 ms per thread).
    #[serde(skip)]
    pub thread_rate_samples: Vec<f64>,
    /// Errors by kind.
    pub errors: ErrorCounts,
    /// Responses by status code.
    pub status_codes: BTreeMap<u16, u64>,
    /// TCP connections established.
    pub connections_opened: u64,
    /// The run was stopped early (Ctrl-C / stop flag).
    pub interrupted: bool,
    /// Options used.
    pub options: OptionsUsed,
    /// Host as written in the URL.
    pub host: String,
    /// The address the run connected to.
    pub addr: Option<std::net::SocketAddr>,
    /// The merged latency histogram (µs), the same values as `latency_us`.
    #[serde(skip)]
    pub histogram: Histogram<u64>,
    /// Per-request records, when [`crate::LoadOptions::records`] asked for them (absent from
    /// the JSON otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<lagtrace_model::RequestRecords>,
}

// ---- wrk's text layout ----------------------------------------------------------------------

/// wrk's `format_units`: divide while the value is ≥ 0.85 × scale and a unit is left.
fn format_units(mut n: f64, scale: f64, base: &str, units: &[&str], p: usize) -> String {
    let mut unit = base;
    for u in units {
        if n < scale * 0.85 {
            break;
        }
        n /= scale;
        unit = u;
    }
    format!("{n:.p$}{unit}")
}

/// wrk's `format_time_us`: "635.91us", "12.92ms", "1.20s", "2.00m".
pub fn format_time_us(n: f64) -> String {
    if n >= 1_000_000.0 {
        format_units(n / 1_000_000.0, 60.0, "s", &["m"], 2)
    } else {
        format_units(n, 1000.0, "us", &["ms"], 2)
    }
}

/// wrk's `format_metric`: "56.20k".
pub fn format_metric(n: f64) -> String {
    format_units(n, 1000.0, "", &["k", "M", "G", "T"], 2)
}

/// wrk's `format_binary`: "17.76G" (append "B").
pub fn format_binary(n: f64) -> String {
    format_units(n, 1024.0, "", &["K", "M", "G", "T"], 2)
}

fn units(out: &mut String, msg: &str, width: usize) {
    let b = msg.as_bytes();
    let mut pad = 2;
    if b.last().is_some_and(|c| c.is_ascii_alphabetic()) {
        pad -= 1;
    }
    if b.len() >= 2 && b[b.len() - 2].is_ascii_alphabetic() {
        pad -= 1;
    }
    let w = width - pad;
    let _ = write!(out, "{msg:>w$}{}", &"  "[..pad]);
}

/// The first lines wrk prints before the run.
pub fn render_header(o: &OptionsUsed) -> String {
    let mut s = String::new();
    let what = match o.requests {
        Some(n) => format!("{n} requests"),
        None => format!("{} test", format_units(o.duration_s, 60.0, "s", &["m"], 0)),
    };
    let _ = writeln!(s, "Running {what} @ {}", o.url);
    let _ = writeln!(
        s,
        "  {} threads and {} connections",
        o.threads, o.connections
    );
    if let Some(r) = o.rate {
        let _ = writeln!(
            s,
            "  constant rate {r} requests/sec (latency from intended send time)"
        );
    }
    s
}

/// The report in wrk's layout, extended with p99.9/p99.99, errors by kind and status codes.
/// `distribution` is wrk's `--latency`; `uncorrected` adds the uncorrected distribution.
pub fn render_text(r: &LoadReport, distribution: bool, uncorrected: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "  Thread Stats{:>6}{:>11}{:>8}{:>12}",
        "Avg", "Stdev", "Max", "+/- Stdev"
    );
    let l = &r.latency_us;
    let _ = write!(s, "    {:<10}", "Latency");
    units(&mut s, &format_time_us(l.mean), 8);
    units(&mut s, &format_time_us(l.stdev), 10);
    units(&mut s, &format_time_us(l.max as f64), 9);
    let _ = writeln!(s, "{:>8.2}%", l.within_stdev_pct);
    let q = &r.thread_requests_per_sec;
    let _ = write!(s, "    {:<10}", "Req/Sec");
    units(&mut s, &format_metric(q.mean), 8);
    units(&mut s, &format_metric(q.stdev), 10);
    units(&mut s, &format_metric(q.max), 9);
    let _ = writeln!(s, "{:>8.2}%", q.within_stdev_pct);
    let dist = |s: &mut String, title: &str, l: &LatencySummary| {
        let _ = writeln!(s, "  {title}");
        for (p, v) in [
            ("50", l.p50),
            ("75", l.p75),
            ("90", l.p90),
            ("99", l.p99),
            ("99.9", l.p999),
            ("99.99", l.p9999),
        ] {
            let _ = write!(s, "{p:>7}%");
            units(s, &format_time_us(v as f64), 10);
            s.push('\n');
        }
    };
    if distribution {
        if r.uncorrected_latency_us.is_some() {
            dist(
                &mut s,
                "Latency Distribution (corrected: from intended send times)",
                l,
            );
        } else {
            dist(&mut s, "Latency Distribution", l);
        }
    }
    if let (true, Some(u)) = (uncorrected, &r.uncorrected_latency_us) {
        dist(
            &mut s,
            "Uncorrected Latency Distribution (from actual send times)",
            u,
        );
    }
    if distribution && r.first_request_latency_us.count > 0 && r.later_request_latency_us.count > 0
    {
        let (f, l) = (&r.first_request_latency_us, &r.later_request_latency_us);
        let _ = writeln!(
            s,
            "  Per connection: first request p50 {} p99 {} ({}), later requests p50 {} p99 {} ({})",
            format_time_us(f.p50 as f64),
            format_time_us(f.p99 as f64),
            f.count,
            format_time_us(l.p50 as f64),
            format_time_us(l.p99 as f64),
            l.count
        );
    }
    let _ = writeln!(
        s,
        "  {} requests in {}, {}B read",
        r.requests,
        format_time_us(r.duration_s * 1e6),
        format_binary(r.bytes as f64)
    );
    let e = &r.errors;
    if e.socket() > 0 {
        let _ = writeln!(
            s,
            "  Socket errors: connect {}, read {}, write {}, timeout {}",
            e.connect, e.read, e.write, e.timeout
        );
    }
    if e.status > 0 {
        let _ = writeln!(s, "  Non-2xx or 3xx responses: {}", e.status);
    }
    if !r.status_codes.is_empty() {
        let codes: Vec<String> = r
            .status_codes
            .iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect();
        let _ = writeln!(s, "  Status codes: {}", codes.join(", "));
    }
    if r.interrupted {
        let _ = writeln!(s, "  (interrupted: the report covers what ran)");
    }
    let _ = writeln!(s, "Requests/sec: {:>9.2}", r.requests_per_sec);
    let _ = writeln!(s, "Transfer/sec: {:>10}B", format_binary(r.bytes_per_sec));
    s
}

// ---- the JSON report (lagtrace-model) ---------------------------------------------------

fn share(pct: f64) -> f64 {
    lagtrace_model::contract::share_of_percent(pct)
}

fn secs_us(s: f64) -> u64 {
    (s * 1e6).round() as u64
}

impl From<&LatencySummary> for lagtrace_model::load::LoadLatency {
    fn from(l: &LatencySummary) -> Self {
        lagtrace_model::load::LoadLatency {
            summary: lagtrace_model::LatencySummary {
                count: l.count,
                min_us: l.min,
                mean_us: l.mean.round() as u64,
                p50_us: l.p50,
                p90_us: l.p90,
                p99_us: l.p99,
                p999_us: l.p999,
                max_us: l.max,
            },
            stdev_us: l.stdev.round() as u64,
            p75_us: l.p75,
            p9999_us: l.p9999,
            within_stdev_share: share(l.within_stdev_pct),
        }
    }
}

impl From<&LoadReport> for lagtrace_model::load::LoadReport {
    fn from(r: &LoadReport) -> Self {
        use lagtrace_model::load as m;
        let o = &r.options;
        m::LoadReport {
            target: lagtrace_model::Target {
                url: Some(o.url.clone()),
                host: r.host.clone(),
                addr: r.addr.map(|a| a.ip().to_string()).unwrap_or_default(),
                port: r.addr.map_or(0, |a| a.port()),
            },
            requests: r.requests,
            duration_us: secs_us(r.duration_s),
            requests_per_sec: r.requests_per_sec,
            bytes: r.bytes,
            bytes_per_sec: r.bytes_per_sec,
            latency: (&r.latency_us).into(),
            uncorrected_latency: r.uncorrected_latency_us.as_ref().map(Into::into),
            first_request_latency: (&r.first_request_latency_us).into(),
            later_request_latency: (&r.later_request_latency_us).into(),
            percentiles: r
                .percentiles
                .iter()
                .map(|p| m::PercentilePoint {
                    percentile: p.percentile,
                    latency_us: p.latency_us,
                })
                .collect(),
            thread_requests_per_sec: m::RateSummary {
                mean: r.thread_requests_per_sec.mean,
                stdev: r.thread_requests_per_sec.stdev,
                max: r.thread_requests_per_sec.max,
                within_stdev_share: share(r.thread_requests_per_sec.within_stdev_pct),
            },
            errors: m::ErrorCounts {
                connect: r.errors.connect,
                read: r.errors.read,
                write: r.errors.write,
                timeout: r.errors.timeout,
                status: r.errors.status,
            },
            status_codes: r.status_codes.clone(),
            connections_opened: r.connections_opened,
            interrupted: r.interrupted,
            options: m::LoadOptions {
                url: o.url.clone(),
                connections: o.connections,
                threads: o.threads,
                duration_us: secs_us(o.duration_s),
                requests: o.requests,
                rate: o.rate,
                timeout_us: secs_us(o.timeout_s),
                connect_timeout_us: secs_us(o.connect_timeout_s),
                method: o.method.clone(),
                headers: o.headers.clone(),
                body_bytes: o.body_bytes,
                quickack: o.quickack,
                insecure: o.insecure,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_units() {
        assert_eq!(format_time_us(635.91), "635.91us");
        assert_eq!(format_time_us(890.0), "0.89ms");
        assert_eq!(format_time_us(12920.0), "12.92ms");
        assert_eq!(format_time_us(10_000_000.0), "10.00s");
        assert_eq!(format_time_us(120_000_000.0), "2.00m");
        assert_eq!(format_metric(56200.0), "56.20k");
        assert_eq!(format_metric(12.0), "12.00");
        assert_eq!(format_binary(17.76 * 1024.0 * 1024.0 * 1024.0), "17.76G");
        let mut s = String::new();
        units(&mut s, "635.91us", 8);
        units(&mut s, "0.89ms", 10);
        units(&mut s, "12.92ms", 9);
        assert_eq!(s, "635.91us    0.89ms  12.92ms");
    }

    #[test]
    fn percentiles_are_log_spaced() {
        let p = chart_percentiles();
        assert_eq!(p[0], 0.0);
        assert!((p[4] - 90.0).abs() < 1e-9 && (p[8] - 99.0).abs() < 1e-9);
        assert_eq!(*p.last().unwrap(), 100.0);
    }
}
