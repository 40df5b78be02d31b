//! The `--hdr-log` file: a standard HdrHistogram interval log (V2 compressed histograms,
//! values in µs, `StartTime`/`BaseTime` headers), so HdrHistogram's own tools
//! (`HistogramLogProcessor`, the Rust crate's `IntervalLogIterator`) read it, plus what
//! `lagtrace load merge` needs to combine the logs of several workers exactly.
//!
//! # Layout
//! ```text
//! #[Logged with lagtrace load; values in microseconds]
//! #[lagtrace load log 1: worker=web-3 interval_us=1000000 start_unix_us=1764000000123456]
//! #[StartTime: 1764000000.000 (seconds since epoch)]
//! #[BaseTime: 1764000000.000 (seconds since epoch)]
//! "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
//! 0.123,0.877,1234.000,HISTFAAA...                 the latency of responses completed then
//! Tag=first-request,0.123,0.877,1100.000,HISTF...  first requests of connections
//! Tag=uncorrected,0.123,0.877,900.000,HISTF...     with --rate: from the actual send times
//! 1.000,1.000,...
//! #[lagtrace summary: {"worker":"web-3","requests":...}]
//! ```
//! The untagged histograms are the report's latency (with `--rate`, from each request's
//! intended send time: corrected for coordinated omission), which is what HdrHistogram's
//! tools process by default; tagged ones they skip unless asked (`-tag`).
//!
//! # Intervals on the wall clock
//! Interval `k` holds the responses completed in `[k·L, (k+1)·L)` µs since the Unix epoch
//! (`L` = the interval length, a whole number of ms), one line per tag for the whole worker
//! (its threads summed). `BaseTime` (and `StartTime`, which HdrHistogram's readers need at
//! or before the first interval) is the interval boundary at or before the start, and
//! every timestamp in a line is whole ms: the first interval starts at the run's start
//! (rounded down to the ms), the last ends at its end. So workers on different hosts started
//! at different moments share interval boundaries (as far as their clocks agree), and a
//! merge adds the histograms of the same interval: an exact union, never an average.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use hdrhistogram::serialization::interval_log::{
    IntervalLogIterator, IntervalLogWriterBuilder, LogEntry, Tag,
};
use hdrhistogram::serialization::{Deserializer, V2DeflateSerializer};
use serde::{Deserialize, Serialize};

use crate::engine::{self, Interval};
use crate::error::{Context, Error, Result, bail};

/// The tag of the first-request histograms.
pub const TAG_FIRST: &str = "first-request";
/// The tag of the uncorrected histograms (`--rate`).
pub const TAG_UNCORRECTED: &str = "uncorrected";
const HEADER: &str = "lagtrace load log 1:";
const SUMMARY: &str = "#[lagtrace summary: ";

/// What a worker's log says besides its histograms (the last line, a JSON comment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogSummary {
    /// The worker's id.
    pub worker: String,
    /// The run's start, µs since the Unix epoch.
    pub start_unix_us: u64,
    /// The run's length, µs.
    pub duration_us: u64,
    /// Completed responses (any status).
    pub requests: u64,
    /// Bytes read.
    pub bytes: u64,
    /// TCP connections established.
    pub connections_opened: u64,
    /// Stopped early.
    pub interrupted: bool,
    /// Errors by kind.
    pub errors: lagtrace_model::load::ErrorCounts,
    /// Responses by status code.
    pub status_codes: BTreeMap<u16, u64>,
    /// The per-thread requests/sec samples (every 100 ms) of wrk's Req/Sec row, rounded to
    /// whole requests/sec.
    pub thread_rate_samples: Vec<u64>,
    /// What was loaded.
    pub target: lagtrace_model::Target,
    /// The options the worker ran with.
    pub options: lagtrace_model::load::LoadOptions,
}

/// A worker id: 1–64 of `A-Z a-z 0-9 . _ : -` (it goes into a header comment unquoted).
pub fn check_worker_id(id: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if id.is_empty() || id.len() > 64 || !id.chars().all(ok) {
        bail!("invalid worker id {id:?}: 1-64 characters of A-Z a-z 0-9 . _ : -");
    }
    Ok(())
}

/// The default worker id: `HOSTNAME-PID`.
pub fn default_worker_id() -> String {
    let uname = rustix::system::uname();
    let host: String = uname
        .nodename()
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    format!("{host}-{}", std::process::id())
}

struct Slot {
    latency: Histogram<u64>,
    uncorrected: Histogram<u64>,
    first: Histogram<u64>,
}

/// Writes the log as the threads' intervals arrive: an interval is written once every
/// thread has moved past it (memory does not grow with the run).
pub(crate) struct HdrLogWriter {
    path: PathBuf,
    worker: String,
    file: std::io::BufWriter<std::fs::File>,
    ser: V2DeflateSerializer,
    every_us: u64,
    base_us: u64,
    start_unix_us: u64,
    paced: bool,
    /// Per thread: the intervals below this one are complete.
    passed: Vec<u64>,
    pending: BTreeMap<u64, Slot>,
}

fn ms_floor(us: u64) -> std::time::Duration {
    std::time::Duration::from_millis(us / 1000)
}

impl HdrLogWriter {
    /// The log of a run with `opts` (none without `hdr_log`).
    pub fn for_run(opts: &crate::LoadOptions, start_unix_us: u64) -> Result<Option<Self>> {
        let Some(path) = &opts.hdr_log else {
            return Ok(None);
        };
        let worker = opts.worker_id.clone().unwrap_or_else(default_worker_id);
        HdrLogWriter::create(
            path,
            worker,
            opts.hdr_log_interval,
            start_unix_us,
            opts.threads,
            opts.rate.is_some(),
        )
        .map(Some)
    }

    /// The worker id written into the header.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    fn create(
        path: &Path,
        worker: String,
        every: std::time::Duration,
        start_unix_us: u64,
        threads: usize,
        paced: bool,
    ) -> Result<HdrLogWriter> {
        let every_us = every.as_micros() as u64;
        let base_us = start_unix_us / every_us * every_us;
        let ctx = || format!("cannot write {}", path.display());
        let file = if path.as_os_str() == "-" {
            // Standard output (a copy of the descriptor: the log's writes and the
            // process's own stdout stay apart in their buffers).
            use std::os::fd::AsFd;
            std::fs::File::from(
                std::io::stdout()
                    .as_fd()
                    .try_clone_to_owned()
                    .with_context(ctx)?,
            )
        } else {
            std::fs::File::create(path).with_context(ctx)?
        };
        let header = format!(
            "[{HEADER} worker={worker} interval_us={every_us} start_unix_us={start_unix_us}]"
        );
        let mut log = HdrLogWriter {
            path: path.to_path_buf(),
            worker,
            // Whole intervals per write (flushed after each): lines stay whole where the
            // log shares a stream with the report (a pod's log).
            file: std::io::BufWriter::with_capacity(1 << 16, file),
            ser: V2DeflateSerializer::new(),
            every_us,
            base_us,
            start_unix_us,
            paced,
            passed: vec![0; threads],
            pending: BTreeMap::new(),
        };
        let at = |us: u64| std::time::UNIX_EPOCH + std::time::Duration::from_micros(us);
        IntervalLogWriterBuilder::new()
            .add_comment("[Logged with lagtrace load; values in microseconds]")
            .add_comment(&header)
            // StartTime = BaseTime: HdrHistogram's readers (Java, Python) skip an interval
            // that starts before StartTime, and the first one starts at the run's start
            // rounded down to the ms. The exact start is in the lagtrace header.
            .with_start_time(at(base_us))
            .with_base_time(at(base_us))
            .begin_log_with(&mut log.file, &mut log.ser)
            .with_context(ctx)?;
        writeln!(
            log.file,
            "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\""
        )
        .and_then(|()| log.file.flush())
        .with_context(ctx)?;
        Ok(log)
    }

    /// Takes one thread's interval; writes the intervals every thread has finished.
    pub fn add(&mut self, iv: Interval) -> Result<()> {
        let slot = self.pending.entry(iv.slot).or_insert_with(|| Slot {
            latency: engine::new_hist(),
            uncorrected: engine::new_hist(),
            first: engine::new_hist(),
        });
        // Same bounds everywhere: adding cannot fail.
        let _ = slot.latency.add(&iv.latency);
        let _ = slot.uncorrected.add(&iv.uncorrected);
        let _ = slot.first.add(&iv.first);
        if let Some(p) = self.passed.get_mut(iv.thread) {
            *p = if iv.last { iv.slot } else { iv.slot + 1 };
        }
        let done = self.passed.iter().copied().min().unwrap_or(0);
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() >= done {
                break;
            }
            let (k, s) = entry.remove_entry();
            self.write_slot(k, &s, u64::MAX)?;
        }
        Ok(())
    }

    fn write_slot(&mut self, k: u64, s: &Slot, end_unix_us: u64) -> Result<()> {
        let from = (k * self.every_us).max(self.start_unix_us) - self.base_us;
        let to = ((k + 1) * self.every_us).min(end_unix_us).max(self.base_us) - self.base_us;
        let (start, to) = (ms_floor(from), ms_floor(to));
        let len = to.saturating_sub(start);
        let mut lines = vec![(None, &s.latency), (Tag::new(TAG_FIRST), &s.first)];
        if self.paced {
            lines.push((Tag::new(TAG_UNCORRECTED), &s.uncorrected));
        }
        // A builder without comments or times writes no header: this appends lines.
        let mut w = IntervalLogWriterBuilder::new()
            .begin_log_with(&mut self.file, &mut self.ser)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        for (tag, h) in lines {
            w.write_histogram(h, start, len, tag)
                .map_err(|e| Error::Other(format!("cannot write {}: {e}", self.path.display())))?;
        }
        self.file
            .flush()
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// Writes the remaining intervals (the last ends at `end_unix_us`) and the summary.
    pub fn finish(mut self, end_unix_us: u64, summary: &LogSummary) -> Result<()> {
        for (k, s) in std::mem::take(&mut self.pending) {
            self.write_slot(k, &s, end_unix_us)?;
        }
        let ctx = || format!("cannot write {}", self.path.display());
        let json = serde_json::to_string(summary)
            .map_err(|e| Error::Other(format!("cannot write {}: {e}", self.path.display())))?;
        writeln!(self.file, "{SUMMARY}{json}]").with_context(ctx)?;
        self.file.flush().with_context(ctx)
    }
}

/// One interval of a worker's log.
#[derive(Debug, Clone)]
pub struct LogInterval {
    /// Start, µs since the Unix epoch (whole ms).
    pub start_unix_us: u64,
    /// End, µs since the Unix epoch (whole ms).
    pub end_unix_us: u64,
    /// Latency (untagged).
    pub latency: Histogram<u64>,
    /// First requests of connections.
    pub first: Histogram<u64>,
    /// With `--rate`: from the actual send times.
    pub uncorrected: Option<Histogram<u64>>,
}

/// A worker's log as read back.
#[derive(Debug, Clone)]
pub struct WorkerLog {
    /// The file.
    pub path: PathBuf,
    /// Interval length, µs.
    pub interval_us: u64,
    /// Intervals by index (µs since the epoch / `interval_us`).
    pub intervals: BTreeMap<u64, LogInterval>,
    /// The summary line.
    pub summary: LogSummary,
}

fn header_field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.trim_end_matches(']').parse().ok())
}

/// Reads a log written by `lagtrace load --hdr-log`.
pub fn read_log(path: &Path) -> Result<WorkerLog> {
    let name = path.display();
    let raw = std::fs::read(path).with_context(|| format!("cannot read {name}"))?;
    // Only the log's own lines: a pod's log (`--hdr-log -` in a container) has the worker's
    // report between them, on stderr but in the same stream.
    let s: String = String::from_utf8_lossy(&raw)
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| {
            l.starts_with('#')
                || l.starts_with("\"StartTimestamp\"")
                || l.starts_with("Tag=")
                || l.starts_with(|c: char| c.is_ascii_digit())
        })
        .flat_map(|l| [l, "\n"])
        .collect();
    let text = s.as_bytes();
    let header = s
        .lines()
        .find(|l| l.starts_with('#') && l.contains(HEADER))
        .with_context(|| format!("{name}: not a log of `lagtrace load --hdr-log`"))?;
    let interval_us = header_field(header, "interval_us=")
        .filter(|&v| v >= 1000 && v % 1000 == 0)
        .with_context(|| format!("{name}: no valid interval_us in its header"))?;
    let summary: LogSummary = s
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(SUMMARY)?.strip_suffix(']'))
        .with_context(|| {
            format!("{name}: no summary line at its end (the worker did not finish its run?)")
        })
        .and_then(|j| {
            serde_json::from_str(j).map_err(|e| Error::Other(format!("{name}: summary: {e}")))
        })?;
    let mut base_us = None;
    let mut intervals: BTreeMap<u64, LogInterval> = BTreeMap::new();
    let mut de = Deserializer::new();
    for e in IntervalLogIterator::new(text) {
        let e = e.map_err(|e| Error::Other(format!("{name}: not an interval log ({e:?})")))?;
        let iv = match e {
            LogEntry::BaseTime(t) => {
                base_us = Some(t.as_micros() as u64);
                continue;
            }
            LogEntry::StartTime(_) => continue,
            LogEntry::Interval(iv) => iv,
        };
        let base = base_us.with_context(|| format!("{name}: an interval before BaseTime"))?;
        let start = base + iv.start_timestamp().as_micros() as u64;
        let bytes = base64_decode(iv.encoded_histogram())
            .with_context(|| format!("{name}: a histogram is not base64"))?;
        let h: Histogram<u64> = de
            .deserialize(&mut &bytes[..])
            .map_err(|e| Error::Other(format!("{name}: a histogram does not decode: {e:?}")))?;
        let slot = intervals
            .entry(start / interval_us)
            .or_insert_with(|| LogInterval {
                start_unix_us: start,
                end_unix_us: start + iv.duration().as_micros() as u64,
                latency: engine::new_hist(),
                first: engine::new_hist(),
                uncorrected: None,
            });
        let target = match iv.tag().as_deref() {
            None => &mut slot.latency,
            Some(TAG_FIRST) => &mut slot.first,
            Some(TAG_UNCORRECTED) => slot.uncorrected.get_or_insert_with(engine::new_hist),
            Some(_) => continue,
        };
        target
            .add(&h)
            .map_err(|e| Error::Other(format!("{name}: a histogram out of range: {e:?}")))?;
    }
    Ok(WorkerLog {
        path: path.to_path_buf(),
        interval_us,
        intervals,
        summary,
    })
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}
