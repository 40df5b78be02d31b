//! lagtrace-load: an HTTP/1.1 load generator in the manner of wrk and wrk2.
//!
//! N threads each run their own epoll loop (mio) over their share of the connections:
//! non-blocking sockets with `TCP_NODELAY` (delayed ACK left on unless `quickack`), one
//! request in flight per connection, the request bytes built once, responses parsed
//! incrementally (bodies skipped without copying), per-thread HdrHistograms (1 µs .. 1 h,
//! 3 significant figures) merged at the end, all on the monotonic clock. Timeouts, resets,
//! garbage and error statuses are counted by kind in the [`LoadReport`]; `Err` means the
//! run could not start (bad URL, unresolvable host, nothing listening, TLS failure).
//!
//! With [`LoadOptions::records`] the run also returns per-request records
//! ([`lagtrace_model::RequestRecords`]: connection, local port, index on the connection,
//! connect/write/read times, SYN retransmissions), every slow one kept and the rest sampled
//! with weights, in memory fixed per thread; failed and pending connects are records too.
//!
//! The [`LoadReport`] is the engine's own type (`latency_us.p99`); `From` turns it into the
//! `lagtrace-model` JSON report (`latency.p99_us`).
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! let opts = lagtrace_load::LoadOptions::new("http://127.0.0.1:8080/");
//! let report = lagtrace_load::run(&opts, None, &AtomicBool::new(false))?;
//! println!("p99 {} µs", report.latency_us.p99);
//! # Ok::<(), lagtrace_load::Error>(())
//! ```

mod engine;
mod error;
mod hdrlog;
mod http;
mod merge;
mod records;
mod report;
mod target;
mod tls;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use error::{Context, bail};

pub use error::{Error, Result};
use lagtrace_model::RequestRecords;

pub use hdrlog::{
    LogInterval, LogSummary, TAG_FIRST, TAG_UNCORRECTED, WorkerLog, check_worker_id,
    default_worker_id, read_log,
};
pub use http::{Done, ParseError, ResponseParser};
pub use merge::{MergedLoad, TimelineRow, WorkerRow, merge_logs, render_merged_text};
pub use records::RecordOptions;
pub use report::{
    ErrorCounts, LatencySummary, LoadReport, OptionsUsed, PercentilePoint, RateSummary,
    chart_percentiles, format_binary, format_metric, format_time_us, render_header, render_text,
};
pub use target::{Target, build_request};

/// Run length when neither a duration nor a request count is given (wrk's default).
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Time limit of a `-n` run without a duration: a run always stops by itself.
pub const MAX_COUNTED_DURATION: Duration = Duration::from_secs(600);

/// Longest wait for a `start_at` barrier.
pub const MAX_START_WAIT: Duration = Duration::from_secs(24 * 3600);
/// How late a worker may reach its `start_at` barrier and still start (at once).
pub const START_LATE_LIMIT: Duration = Duration::from_secs(1);

/// Longest duration, timeout, or interval between two paced requests accepted.
const MAX_TIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// How to load the target.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// `http://` or `https://` URL.
    pub url: String,
    /// Concurrent connections (each has one request in flight).
    pub connections: usize,
    /// Threads (each with its own event loop); at most `connections`.
    pub threads: usize,
    /// Run length. `None`: [`DEFAULT_DURATION`], or [`MAX_COUNTED_DURATION`] with `requests`.
    pub duration: Option<Duration>,
    /// Stop after exactly this many requests have finished (responses plus failed requests).
    pub requests: Option<u64>,
    /// Constant throughput across all connections, requests/sec (wrk2): every request has an
    /// intended send time and its latency is measured from it.
    pub rate: Option<f64>,
    /// A request without a complete response after this long is abandoned and counted.
    pub timeout: Duration,
    /// A connection not established after this long is counted as a connect error.
    pub connect_timeout: Duration,
    /// HTTP method.
    pub method: String,
    /// Extra request headers, "Name: value".
    pub headers: Vec<String>,
    /// Request body.
    pub body: Option<Vec<u8>>,
    /// Set TCP_QUICKACK after every read (it is not permanent). Off: behave like wrk and
    /// ordinary clients, with delayed ACKs.
    pub quickack: bool,
    /// https: accept any certificate (self-signed, wrong name). The handshake is still
    /// authenticated against the certificate's key, but nobody vouches for the key.
    pub insecure: bool,
    /// Write an HdrHistogram interval log (V2 compressed, µs) to this file (see the
    /// layout in `hdrlog.rs`: intervals on the wall clock, a summary line at the end).
    pub hdr_log: Option<PathBuf>,
    /// Interval of the HdrHistogram log: a whole number of milliseconds.
    pub hdr_log_interval: Duration,
    /// The worker id written into the log's header (`None`: `HOSTNAME-PID`).
    pub worker_id: Option<String>,
    /// Start barrier: after preparing (resolving, the preflight connect), wait until this
    /// wall-clock time before the first request, so that workers on several hosts start
    /// together. At most [`MAX_START_WAIT`] ahead; a time in the past by more than
    /// [`START_LATE_LIMIT`] is an error (the workers would not start together).
    pub start_at: Option<SystemTime>,
    /// Keep per-request records ([`LoadReport::records`]); `None` (the default, and plain
    /// `lagtrace load`) costs nothing per request. With records on, every connect is a
    /// measurement: there is no preflight connect (an unreachable target gives records of
    /// failed connects instead of `Err`), and a failed or timed-out connect is a record that
    /// waited that long. To see a connect wait for the first and second SYN retransmissions
    /// (1 s, 3 s) give `connect_timeout` more than 3 s (e.g. 3.5 s).
    pub records: Option<RecordOptions>,
}

impl LoadOptions {
    /// wrk's defaults: 2 threads, 10 connections, 10 s, GET, 2 s timeout.
    pub fn new(url: &str) -> Self {
        LoadOptions {
            url: url.to_string(),
            connections: 10,
            threads: 2,
            duration: None,
            requests: None,
            rate: None,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            method: "GET".into(),
            headers: Vec::new(),
            body: None,
            quickack: false,
            insecure: false,
            hdr_log: None,
            hdr_log_interval: Duration::from_secs(1),
            worker_id: None,
            start_at: None,
            records: None,
        }
    }

    /// The run length that applies.
    pub fn effective_duration(&self) -> Duration {
        match (self.duration, self.requests) {
            (Some(d), _) => d,
            (None, Some(_)) => MAX_COUNTED_DURATION,
            (None, None) => DEFAULT_DURATION,
        }
    }

    /// The options as reported.
    pub fn used(&self) -> OptionsUsed {
        OptionsUsed {
            url: self.url.clone(),
            connections: self.connections,
            threads: self.threads,
            duration_s: self.effective_duration().as_secs_f64(),
            requests: self.requests,
            rate: self.rate,
            timeout_s: self.timeout.as_secs_f64(),
            connect_timeout_s: self.connect_timeout.as_secs_f64(),
            method: self.method.clone(),
            headers: self.headers.clone(),
            body_bytes: self.body.as_ref().map_or(0, Vec::len),
            quickack: self.quickack,
            insecure: self.insecure,
        }
    }
}

/// A progress snapshot, delivered about every 100 ms on the calling thread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Time since the start.
    pub elapsed: Duration,
    /// Run length limit.
    pub duration: Duration,
    /// Responses so far.
    pub requests: u64,
    /// Socket errors so far.
    pub errors: u64,
}

/// Parses a wrk-style duration: `10s`, `1m`, `500ms`, `2h`, `250us`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .with_context(|| format!("invalid duration {s:?} (examples: 10s, 1m, 500ms)"))?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" => v / 1e6,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        _ => bail!("invalid duration {s:?}: unknown unit {unit:?} (use us, ms, s, m, h)"),
    };
    Duration::try_from_secs_f64(secs).with_context(|| format!("invalid duration {s:?}"))
}

/// Parses a `--start-at` time, seen at `now`: RFC 3339 (`2026-11-24T04:00:00Z`, an offset
/// or fractional seconds allowed), Unix seconds (`1764000000`, `1764000000.25`), or
/// `+DURATION` from `now` (`+5s`, `+500ms`).
pub fn parse_start_at(s: &str, now: SystemTime) -> Result<SystemTime> {
    let t = s.trim();
    if let Some(rel) = t.strip_prefix('+') {
        let d = parse_duration(rel)?;
        return now
            .checked_add(d)
            .with_context(|| format!("start time {s:?} is out of range"));
    }
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let secs: f64 = t
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .with_context(|| format!("invalid start time {s:?}"))?;
        return Duration::try_from_secs_f64(secs)
            .ok()
            .and_then(|d| SystemTime::UNIX_EPOCH.checked_add(d))
            .with_context(|| format!("start time {s:?} is out of range"));
    }
    let dt = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            Error::Other(format!(
                "invalid start time {s:?}: {e} (give RFC 3339 like 2026-11-24T04:00:00Z, Unix \
                 seconds, or +5s)"
            ))
        })?;
    let ns = dt.unix_timestamp_nanos();
    u64::try_from(ns)
        .ok()
        .and_then(|ns| SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(ns)))
        .with_context(|| format!("start time {s:?} is before 1970"))
}

struct Prepared {
    target: Target,
    addr: std::net::SocketAddr,
    request: Vec<u8>,
    tls: Option<(
        std::sync::Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
}

fn prepare(opts: &LoadOptions) -> Result<Prepared> {
    if opts.connections == 0 {
        bail!("connections must be at least 1");
    }
    if opts.threads == 0 {
        bail!("threads must be at least 1");
    }
    if opts.threads > opts.connections {
        bail!(
            "number of connections ({}) must be >= threads ({})",
            opts.connections,
            opts.threads
        );
    }
    if opts.connections > 1 << 20 {
        bail!("too many connections ({})", opts.connections);
    }
    if let Some(r) = opts.rate
        && !(r.is_finite() && r > 0.0)
    {
        bail!("rate must be a positive number of requests/sec, not {r}");
    }
    if opts.requests == Some(0) {
        bail!("request count must be at least 1");
    }
    if opts.timeout.is_zero() || opts.connect_timeout.is_zero() {
        bail!("timeouts must be greater than zero");
    }
    if opts.duration.is_some_and(|d| d.is_zero()) {
        bail!("duration must be greater than zero");
    }
    // Deadlines are Instants: a time beyond any clock's range would overflow (panic).
    for (what, d) in [
        ("duration", opts.duration.unwrap_or_default()),
        ("timeout", opts.timeout),
        ("connect timeout", opts.connect_timeout),
    ] {
        if d > MAX_TIME {
            bail!("{what} too long (at most 365 days)");
        }
    }
    if let Some(r) = opts.rate
        && 1.0 / r > MAX_TIME.as_secs_f64()
    {
        bail!("rate {r} too low (at least one request per 365 days)");
    }
    if opts.hdr_log.is_some() {
        let iv = opts.hdr_log_interval;
        if iv < Duration::from_millis(1)
            || !iv.subsec_nanos().is_multiple_of(1_000_000)
            || iv > MAX_TIME
        {
            bail!("the log interval must be a whole number of milliseconds (at least 1 ms)");
        }
    }
    if let Some(id) = &opts.worker_id {
        hdrlog::check_worker_id(id)?;
    }
    check_start_at(opts.start_at, SystemTime::now())?;
    let target = Target::parse(&opts.url)?;
    let request = build_request(&target, &opts.method, &opts.headers, opts.body.as_deref())?;
    let addr = target.resolve()?;
    let tls = if target.tls {
        Some((
            tls::client_config(opts.insecure)?,
            tls::server_name(&target.host)?,
        ))
    } else {
        None
    };
    Ok(Prepared {
        target,
        addr,
        request,
        tls,
    })
}

/// wrk's probe connection: connect (and handshake) once, so that a target that cannot be
/// reached is one clear error instead of a report full of connect errors.
fn preflight(p: &Prepared, opts: &LoadOptions) -> Result<()> {
    let what = || format!("cannot connect to {} ({})", p.target.host_header(), p.addr);
    let mut sock = TcpStream::connect_timeout(&p.addr, opts.connect_timeout).with_context(what)?;
    if let Some((cfg, name)) = &p.tls {
        sock.set_read_timeout(Some(opts.connect_timeout))
            .and_then(|()| sock.set_write_timeout(Some(opts.connect_timeout)))
            .with_context(|| format!("setting timeouts on the connection to {}", p.addr))?;
        let mut conn =
            rustls::ClientConnection::new(cfg.clone(), name.clone()).context("TLS setup")?;
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut sock) {
                // A server that answers a TLS hello with bytes that are no TLS record, or not
                // at all (it waits for the rest of an HTTP request), and a plain request with
                // an HTTP status line, speaks plain HTTP: say so and give the URL. A TLS
                // server answers the hello; with an untrusted certificate it fails otherwise
                // (and nginx answers a plain request on its TLS port with `HTTP/1.1 400`).
                let not_tls = matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) || e
                    .get_ref()
                    .and_then(|x| x.downcast_ref::<rustls::Error>())
                    .is_some_and(|x| {
                        matches!(
                            x,
                            rustls::Error::InvalidMessage(
                                rustls::InvalidMessage::InvalidContentType
                            )
                        )
                    });
                if not_tls && speaks_plain_http(p, opts) {
                    bail!(
                        "{} answers in plain HTTP, not TLS: use {}",
                        p.target.host_header(),
                        p.target.other_scheme_url()
                    );
                }
                return Err::<(), _>(e).with_context(|| {
                    format!(
                        "TLS handshake with {} failed{}",
                        p.target.host_header(),
                        if opts.insecure {
                            ""
                        } else {
                            " (--insecure accepts self-signed certificates)"
                        }
                    )
                });
            }
        }
        conn.send_close_notify();
        let _ = conn.complete_io(&mut sock);
    }
    Ok(())
}

/// Whether the target answers a plain HTTP request with an HTTP status line (one request
/// on a new connection, within the connect timeout).
fn speaks_plain_http(p: &Prepared, opts: &LoadOptions) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&p.addr, opts.connect_timeout) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(opts.connect_timeout));
    let _ = s.set_write_timeout(Some(opts.connect_timeout));
    let req = format!(
        "HEAD {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        p.target.path,
        p.target.host_header()
    );
    let mut head = [0u8; 5];
    s.write_all(req.as_bytes()).is_ok() && s.read_exact(&mut head).is_ok() && &head == b"HTTP/"
}

/// Whether a start barrier can be kept, seen at `now`.
fn check_start_at(at: Option<SystemTime>, now: SystemTime) -> Result<()> {
    let Some(at) = at else { return Ok(()) };
    match at.duration_since(now) {
        Ok(ahead) if ahead > MAX_START_WAIT => bail!(
            "start time is {:.0} s ahead: at most {} h",
            ahead.as_secs_f64(),
            MAX_START_WAIT.as_secs() / 3600
        ),
        Ok(_) => Ok(()),
        Err(e) if e.duration() > START_LATE_LIMIT => bail!(
            "start time was {:.3} s ago: this worker cannot start with the others (give a \
             later --start-at; clocks of the hosts must agree)",
            e.duration().as_secs_f64()
        ),
        Err(_) => Ok(()),
    }
}

/// Sleeps until the wall-clock time `at` (checked by [`check_start_at`]), in slices so that
/// `stop` ends the wait, and on the clock itself (not a duration computed once), so that a
/// clock step during a long wait still starts on time.
fn wait_until(at: SystemTime, stop: &AtomicBool) -> Result<()> {
    check_start_at(Some(at), SystemTime::now())?;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let Ok(left) = at.duration_since(SystemTime::now()) else {
            return Ok(());
        };
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// Connects (and completes the TLS handshake) once, as a run without records does before
/// it starts: `Err` says why the target cannot be reached (refused, timed out, TLS).
pub fn check(opts: &LoadOptions) -> Result<()> {
    let p = prepare(opts)?;
    preflight(&p, opts)
}

/// Raises the soft limit on open files towards `need` (at most the hard limit), so that
/// `-c 1000` does not fail on the usual soft limit of 1024. If it cannot be raised, the
/// connections that cannot be opened are counted as connect errors.
fn raise_fd_limit(need: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if let Some(cur) = lim.current
        && cur < need
    {
        let mut new = lim;
        new.current = Some(lim.maximum.map_or(need, |max| need.min(max)));
        let _ = setrlimit(Resource::Nofile, new);
    }
}

/// Runs a load and returns what it measured. `progress` is called on this thread about
/// every 100 ms; setting `stop` ends the run early (the report covers what ran and says
/// `interrupted`).
pub fn run(
    opts: &LoadOptions,
    progress: Option<&dyn Fn(&Progress)>,
    stop: &AtomicBool,
) -> Result<LoadReport> {
    let p = prepare(opts)?;
    if opts.records.is_none() {
        preflight(&p, opts)?;
    }
    raise_fd_limit(opts.connections as u64 + 64);
    if let Some(at) = opts.start_at {
        wait_until(at, stop)?;
    }
    let duration = opts.effective_duration();
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let start_unix_us = start_wall
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let shared = engine::Shared {
        addr: p.addr,
        request: &p.request,
        method: &opts.method,
        tls: p.tls.clone(),
        timeout: opts.timeout,
        connect_timeout: opts.connect_timeout,
        quickack: opts.quickack,
        start,
        end: start + duration,
        stop,
        budget: opts.requests.map(|n| (n, AtomicU64::new(0))),
        pacing: opts.rate.map(|r| {
            let spacing = Duration::from_secs_f64(1.0 / r);
            (spacing * opts.connections as u32, spacing)
        }),
        progress: (0..opts.threads)
            .map(|_| engine::ThreadCounters::default())
            .collect(),
        interval: opts.hdr_log.as_ref().map(|_| opts.hdr_log_interval),
        start_unix_us,
        records: opts.records,
    };
    let mut log = hdrlog::HdrLogWriter::for_run(opts, start_unix_us)?;
    let (tx, rx) = mpsc::channel::<engine::Interval>();
    let results = std::thread::scope(|s| -> Result<Vec<engine::ThreadResult>> {
        let mut handles = Vec::new();
        let mut first = 0;
        for id in 0..opts.threads {
            let count =
                opts.connections / opts.threads + usize::from(id < opts.connections % opts.threads);
            let tx = log.as_ref().map(|_| tx.clone());
            let sh = &shared;
            let from = first;
            handles.push(
                std::thread::Builder::new()
                    .name(format!("load-{id}"))
                    .spawn_scoped(s, move || engine::run_thread(sh, id, from, count, tx))
                    .context("cannot start a load thread")?,
            );
            first += count;
        }
        while handles.iter().any(|h| !h.is_finished()) {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(iv) => {
                    if let Some(l) = log.as_mut() {
                        l.add(iv)?;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
            }
            if let Some(cb) = progress {
                cb(&Progress {
                    elapsed: start.elapsed(),
                    duration,
                    requests: shared
                        .progress
                        .iter()
                        .map(|c| c.requests.load(Ordering::Relaxed))
                        .sum(),
                    errors: shared
                        .progress
                        .iter()
                        .map(|c| c.errors.load(Ordering::Relaxed))
                        .sum(),
                });
            }
        }
        let mut out = Vec::new();
        for h in handles {
            match h.join() {
                Ok(r) => out.push(r.context("load thread failed")?),
                Err(_) => bail!("a load thread panicked"),
            }
        }
        Ok(out)
    })?;
    drop(tx);
    let mut report = merge(opts, results, start, stop.load(Ordering::Relaxed));
    report.host = p.target.host.clone();
    report.addr = Some(p.addr);
    if let Some(r) = report.records.as_mut() {
        r.start_unix_us = start_unix_us;
    }
    if let Some(l) = log {
        finish_log(l, rx.try_iter(), &report, start_unix_us)?;
    }
    Ok(report)
}

/// Writes the log's last intervals and its summary line.
fn finish_log(
    mut l: hdrlog::HdrLogWriter,
    rest: impl Iterator<Item = engine::Interval>,
    report: &LoadReport,
    start_unix_us: u64,
) -> Result<()> {
    for iv in rest {
        l.add(iv)?;
    }
    let duration_us = (report.duration_s * 1e6).round() as u64;
    let model = lagtrace_model::load::LoadReport::from(report);
    let summary = LogSummary {
        worker: l.worker().to_string(),
        start_unix_us,
        duration_us,
        requests: report.requests,
        bytes: report.bytes,
        connections_opened: report.connections_opened,
        interrupted: report.interrupted,
        errors: model.errors,
        status_codes: report.status_codes.clone(),
        thread_rate_samples: report
            .thread_rate_samples
            .iter()
            .map(|x| x.round() as u64)
            .collect(),
        target: model.target,
        options: model.options,
    };
    l.finish(start_unix_us + duration_us, &summary)
}

fn merge(
    opts: &LoadOptions,
    mut results: Vec<engine::ThreadResult>,
    start: Instant,
    interrupted: bool,
) -> LoadReport {
    let mut hist = engine::new_hist();
    let mut uncorrected = engine::new_hist();
    let mut first = engine::new_hist();
    let mut errors = ErrorCounts::default();
    let mut status_codes = BTreeMap::new();
    let (mut requests, mut bytes, mut connects) = (0, 0, 0);
    let mut samples = Vec::new();
    let mut ended = start;
    for r in &results {
        // Same bounds everywhere: adding cannot fail.
        let _ = hist.add(&r.hist);
        let _ = uncorrected.add(&r.uncorrected);
        let _ = first.add(&r.first);
        requests += r.requests;
        bytes += r.bytes;
        connects += r.connects;
        errors.connect += r.errors.connect;
        errors.read += r.errors.read;
        errors.write += r.errors.write;
        errors.timeout += r.errors.timeout;
        errors.status += r.errors.status;
        for (code, &n) in r.status.iter().enumerate() {
            if n > 0 {
                *status_codes.entry(code as u16).or_insert(0) += n;
            }
        }
        samples.extend_from_slice(&r.rate_samples);
        ended = ended.max(r.ended);
    }
    let records = opts.records.map(|ro| {
        let mut out = RequestRecords {
            threads: results.len() as u32,
            slow_cap: ro.slow_cap as u32,
            sample_cap: ro.sample_cap as u32,
            ..RequestRecords::default()
        };
        for r in &mut results {
            if let Some((recs, seen, pending)) = r.records.take() {
                out.seen += seen;
                out.pending += pending;
                out.records.extend(recs);
            }
        }
        out.records.sort_by_key(|r| (r.start_us, r.conn, r.index));
        out
    });
    let mut later = hist.clone();
    let _ = later.subtract(&first);
    let duration_s = (ended - start).as_secs_f64().max(1e-9);
    LoadReport {
        requests,
        duration_s,
        requests_per_sec: requests as f64 / duration_s,
        bytes,
        bytes_per_sec: bytes as f64 / duration_s,
        latency_us: LatencySummary::from_hist(&hist),
        uncorrected_latency_us: opts.rate.map(|_| LatencySummary::from_hist(&uncorrected)),
        first_request_latency_us: LatencySummary::from_hist(&first),
        later_request_latency_us: LatencySummary::from_hist(&later),
        percentiles: report::percentile_points(&hist),
        thread_requests_per_sec: RateSummary::from_samples(&samples),
        thread_rate_samples: samples,
        errors,
        status_codes,
        connections_opened: connects,
        interrupted,
        options: opts.used(),
        host: String::new(),
        addr: None,
        histogram: hist,
        records,
    }
}

/// `n` GET requests one after another on one keep-alive connection (c=1), returning each
/// latency. A failure ends the series with `Err` (the caller wanted every sample).
pub fn sequential(url: &str, n: usize, timeout: Duration) -> Result<Vec<Duration>> {
    let mut opts = LoadOptions::new(url);
    opts.timeout = timeout;
    opts.connect_timeout = timeout;
    let p = prepare(&LoadOptions {
        threads: 1,
        connections: 1,
        ..opts.clone()
    })?;
    if p.tls.is_some() {
        bail!("sequential: https is not supported; use run() with one connection");
    }
    let connect = || -> Result<TcpStream> {
        let s = TcpStream::connect_timeout(&p.addr, timeout)
            .with_context(|| format!("cannot connect to {}", p.addr))?;
        s.set_nodelay(true)
            .and_then(|()| s.set_read_timeout(Some(timeout)))
            .with_context(|| format!("setting options on the connection to {}", p.addr))?;
        Ok(s)
    };
    let mut sock = connect()?;
    let mut parser = ResponseParser::new("GET");
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        sock.write_all(&p.request).context("write request")?;
        parser.reset();
        let close = loop {
            let k = sock.read(&mut buf).context("read response")?;
            if k == 0 {
                match parser.eof() {
                    Some(d) => break d.close,
                    None => bail!("server closed the connection in the middle of a response"),
                }
            }
            match parser.feed(&buf[..k]) {
                Ok(Some(d)) => break d.close,
                Ok(None) => {}
                Err(e) => bail!("invalid response: {e:?}"),
            }
        };
        out.push(t0.elapsed());
        if close {
            sock = connect()?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn start_times() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let at = |s: &str| parse_start_at(s, now).unwrap();
        assert_eq!(at("+5s"), now + Duration::from_secs(5));
        assert_eq!(at("+250ms"), now + Duration::from_millis(250));
        assert_eq!(at("1764000000.5"), now + Duration::from_millis(500));
        // 1764000000 is 2025-11-24T16:00:00Z.
        assert_eq!(at("2025-11-24T16:00:00Z"), now);
        assert_eq!(
            at("2025-11-24T17:00:00.25+01:00"),
            now + Duration::from_millis(250)
        );
        for bad in ["tomorrow", "", "+5x", "2025-13-01T00:00:00Z", "1.2.3"] {
            assert!(parse_start_at(bad, now).is_err(), "{bad}");
        }
        // The barrier: a little late starts at once, too late or too far ahead is an error.
        assert!(check_start_at(Some(now - Duration::from_millis(500)), now).is_ok());
        assert!(check_start_at(Some(now - Duration::from_secs(3)), now).is_err());
        assert!(check_start_at(Some(now + Duration::from_secs(3600)), now).is_ok());
        assert!(check_start_at(Some(now + Duration::from_secs(2 * 86400)), now).is_err());
    }
}
