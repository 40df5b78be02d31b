//! `lagtrace load`: HTTP/1.1 load with a latency distribution, like wrk and wrk2.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use lagtrace_load::{LoadOptions, Progress};

static STOP: AtomicBool = AtomicBool::new(false);

/// Load an http:// or https:// URL and report its latency distribution (wrk's flags and
/// layout; `--rate` is wrk2's constant-throughput mode).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Errors are measurements: connect, read (reset, garbage, closed mid-response), write, timeout
(request abandoned after --timeout, connection replaced) and status >= 400 are counted in the
report. A target that cannot be reached at all is an error (exit 2).

Coming from wrk/wrk2: -t, -c, -d, -H, --timeout, --latency and -R mean the same here, -L is
--latency and -U --uncorrected; Lua scripts (-s) are not supported: set the request with -m, -H
and --body/--body-file (every flag: docs/peer-flags.md).

Running from many hosts: give each worker --hdr-log, a --worker-id and one --start-at, then
`lagtrace load merge w1.hlog w2.hlog ...` (an exact union: histograms added, intervals on the
clock).

Examples:
  lagtrace load -t2 -c100 -d10s --latency http://10.0.0.2/
  lagtrace load -c50 --rate 2000 -d30s --uncorrected --latency http://10.0.0.2:8080/
  lagtrace load -c50 -d30s --start-at 2026-11-24T04:00:00Z --worker-id w1 --hdr-log w1.hlog URL")]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    inner: Box<LoadArgs>,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Merge the --hdr-log logs of several workers into one exact report (HdrHistograms
    /// added, never percentiles averaged), with a row per worker
    #[command(after_help = "\
The logs must share their interval length and all come from runs with --rate or all from
runs without it (a corrected and an uncorrected latency do not add up). Intervals are on the
wall clock, so the timeline lines up workers that started at different moments; across
hosts it is as good as their clocks agree (NTP: ~1 ms).

Examples:
  lagtrace load merge --latency w0.hlog w1.hlog w2.hlog
  lagtrace load merge --json --timeline logs/*.hlog")]
    Merge(MergeArgs),
}

#[derive(Debug, clap::Args)]
struct MergeArgs {
    /// The logs (`lagtrace load --hdr-log`), one per worker
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,
    /// Print the latency distribution (50% .. 99.99%)
    #[arg(long)]
    latency: bool,
    /// With logs of --rate runs: also show latency from the actual send times
    #[arg(long)]
    uncorrected: bool,
    /// Print the merged timeline: one row per interval
    #[arg(long)]
    timeline: bool,
    /// Print the report as JSON
    #[arg(long)]
    json: bool,
}

/// The flags of `lagtrace load` (boxed: keeps the command enum small).
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Target URL (http:// or https://)
    #[arg(required = true)]
    pub url: Option<String>,
    /// Connections to keep open (one request in flight on each)
    #[arg(short = 'c', long, default_value_t = 10)]
    pub connections: usize,
    /// Threads, each with its own event loop
    #[arg(short = 't', long, default_value_t = 2)]
    pub threads: usize,
    /// Duration of the test (10s, 1m, 500ms) [default: 10s; with -n: until N, at most 10m]
    #[arg(short = 'd', long, value_parser = super::positive_duration)]
    pub duration: Option<Duration>,
    /// Stop after exactly N requests (responses plus requests that failed: timeout, read,
    /// write)
    #[arg(short = 'n', long = "requests", value_name = "N")]
    pub requests: Option<u64>,
    /// Constant throughput, requests/sec across all connections (wrk2); latency is measured
    /// from each request's intended send time (coordinated-omission correction)
    #[arg(short = 'R', long, value_name = "R")]
    pub rate: Option<f64>,
    /// With --rate: also show latency measured from the actual send times
    #[arg(long, requires = "rate")]
    pub uncorrected: bool,
    /// Abandon a request (count a timeout, replace the connection) after this long
    #[arg(long, value_parser = super::positive_duration, default_value = "2s")]
    pub timeout: Duration,
    /// Count a connect error when a connection is not established after this long
    #[arg(long, value_parser = super::positive_duration, default_value = "2s")]
    pub connect_timeout: Duration,
    /// Print the latency distribution (50% .. 99.99%)
    #[arg(long)]
    pub latency: bool,
    /// Add a request header, "Name: value" (repeatable)
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub headers: Vec<String>,
    /// HTTP method
    #[arg(short = 'm', long, default_value = "GET")]
    pub method: String,
    /// Request body
    #[arg(long, conflicts_with = "body_file")]
    pub body: Option<String>,
    /// Request body read from a file
    #[arg(long, value_name = "FILE")]
    pub body_file: Option<PathBuf>,
    /// Set TCP_QUICKACK after every read (default off: delayed ACKs like wrk and browsers)
    #[arg(long)]
    pub quickack: bool,
    /// https: accept any server certificate (self-signed or for another name). Traffic is
    /// still encrypted, but the server is not authenticated
    #[arg(short = 'k', long)]
    pub insecure: bool,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Write an HdrHistogram interval log (V2 compressed, values in µs, intervals on the wall
    /// clock; `lagtrace load merge` combines the logs of several workers). `-`: to stdout,
    /// and the report to stderr
    #[arg(long, value_name = "FILE")]
    pub hdr_log: Option<PathBuf>,
    /// Interval of the --hdr-log log (whole milliseconds)
    #[arg(long, value_name = "DURATION", default_value = "1s", requires = "hdr_log",
          value_parser = super::positive_duration)]
    pub hdr_log_interval: Duration,
    /// This worker's id in the --hdr-log log [default: HOSTNAME-PID]
    #[arg(long, value_name = "ID", requires = "hdr_log")]
    pub worker_id: Option<String>,
    /// Start the load at this time (after resolving and connecting once), so that workers
    /// on several hosts start together: RFC 3339 (2026-11-24T04:00:00Z), Unix seconds
    /// (1764000000.5) or +DURATION from now (+5s). At most 24 h ahead; more than 1 s in the
    /// past is an error
    #[arg(long, value_name = "TIME")]
    pub start_at: Option<String>,
    /// Write per-request records (times, status, error) as JSON to FILE: each thread's 4096
    /// slowest requests and connects and a weighted sample of the others (`seen` counts all);
    /// a connect that fails is a record, not a preflight error
    #[arg(long, value_name = "FILE")]
    pub records: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(Sub::Merge(m)) = args.sub {
        return merge(m);
    }
    let args = *args.inner;
    let url = args.url.clone().context("a target URL is required")?;
    // `--hdr-log -`: the log on stdout (e.g. a pod's log), the report on stderr.
    let log_on_stdout = args.hdr_log.as_deref() == Some(std::path::Path::new("-"));
    for (flag, p) in [("--hdr-log", &args.hdr_log), ("--records", &args.records)] {
        if let Some(p) = p.as_ref().filter(|p| p.as_os_str() != "-") {
            super::check_output(flag, p)?;
        }
    }
    if let Some(id) = &args.worker_id {
        lagtrace_load::check_worker_id(id)?;
    }
    let start_at = args
        .start_at
        .as_deref()
        .map(|s| lagtrace_load::parse_start_at(s, std::time::SystemTime::now()))
        .transpose()?;
    let body = match (&args.body, &args.body_file) {
        (Some(b), _) => Some(b.clone().into_bytes()),
        (None, Some(f)) => Some(
            std::fs::read(f).with_context(|| format!("cannot read body file {}", f.display()))?,
        ),
        (None, None) => None,
    };
    let opts = LoadOptions {
        url,
        connections: args.connections,
        threads: args.threads,
        duration: args.duration,
        requests: args.requests,
        rate: args.rate,
        timeout: args.timeout,
        connect_timeout: args.connect_timeout,
        method: args.method.clone(),
        headers: args.headers.clone(),
        body,
        quickack: args.quickack,
        insecure: args.insecure,
        hdr_log: args.hdr_log.clone(),
        hdr_log_interval: args.hdr_log_interval,
        worker_id: args.worker_id.clone(),
        start_at,
        // wrk semantics: no per-request records unless asked (diagnose turns them on).
        records: args
            .records
            .as_ref()
            .map(|_| lagtrace_load::RecordOptions::default()),
    };
    // Ctrl-C stops the run; the report covers what ran. A second Ctrl-C is left to the
    // handler too: the run ends within a few milliseconds of the first.
    crate::interrupt::on_interrupt(|_| STOP.store(true, Ordering::Relaxed));
    // wrk's header, printed once the run has started (so that a target that cannot be
    // reached gets only the error line).
    let header = std::cell::Cell::new(args.json);
    let print_header = || {
        if !header.replace(true) {
            let header = lagtrace_load::render_header(&opts.used());
            if log_on_stdout {
                eprint!("{header}");
            } else {
                print!("{header}");
                let _ = std::io::stdout().flush();
            }
        }
    };
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(opts.effective_duration().as_millis() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("  {bar:30} {elapsed:>4} {msg}")
                .expect("static template"),
        );
        b
    });
    let cb = |p: &Progress| {
        print_header();
        if let Some(b) = &bar {
            b.set_position(p.elapsed.as_millis() as u64);
            b.set_message(format!("{} requests, {} errors", p.requests, p.errors));
        }
    };
    let report = lagtrace_load::run(&opts, Some(&cb), &STOP);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = report?;
    print_header();
    if let (Some(path), Some(recs)) = (&args.records, &report.records) {
        let doc = lagtrace_model::Envelope::new("load-records", recs);
        let text = serde_json::to_string(&doc)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut out: Box<dyn Write> = if log_on_stdout {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    if args.json {
        let doc =
            lagtrace_model::Envelope::new("load", lagtrace_model::load::LoadReport::from(&report));
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        write!(
            out,
            "{}",
            lagtrace_load::render_text(&report, args.latency, args.uncorrected)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn merge(m: MergeArgs) -> Result<ExitCode> {
    let logs = m
        .logs
        .iter()
        .map(|p| lagtrace_load::read_log(p))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = lagtrace_load::merge_logs(&logs)?;
    let mut out = std::io::stdout().lock();
    if m.json {
        let doc = lagtrace_model::Envelope::new(
            "load-merge",
            lagtrace_model::load::LoadMergeReport::from(&merged),
        );
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        write!(
            out,
            "{}",
            lagtrace_load::render_merged_text(&merged, m.latency, m.uncorrected, m.timeline)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
