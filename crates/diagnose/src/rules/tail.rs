//! The tail: when the slowest requests wait far longer than the typical one, the tail is a
//! finding of its own — never `healthy` over it.
//!
//! ## When is a tail a finding? (the derivation)
//! A run's p99 lies above its p50 for reasons no one needs to fix, and those reasons bound
//! the spread from above; a tail beyond *both* bounds below is a finding.
//!
//! 1. **Absolute noise: the path and the scheduler.** The slowest request of a healthy run
//!    may cross the path a few more times than the median one (a delayed ACK on a ramp, a
//!    request that waits one round for the window): [`PATH_ROUNDS`] RTTs. Each of the two
//!    processes involved (the load client and the server) may be woken onto a CPU that runs
//!    something else and wait there for one scheduler slice before it runs: EEVDF's base
//!    slice is 0.75 ms scaled by `1 + log2(ncpu)` up to 8 CPUs (3 ms), and CFS's wake-up
//!    preemption waits at most half its 6 ms latency period while another task is runnable —
//!    [`SCHED_SLICE_US`] each, twice. Timer slack (50 µs) is below that resolution. So
//!    `noise = PATH_ROUNDS × RTT + 2 × SCHED_SLICE` (≈ 6.1 ms on a lab path).
//! 2. **Relative noise: contention.** A run that only queues (for the CPU, a lock, the
//!    accept loop, the NIC) spreads like a memoryless wait: an exponential distribution,
//!    whose quantile is `median × log2(1 / (1 − q))`. Its p99 is 6.6 × its p50 and its
//!    p99.9 10.0 ×. We call the p99 a finding only when it lies beyond where contention would
//!    put even the p99.9: `p99 ≥ log2(1000) × p50` ([`spread`]) — a decade of probability
//!    as the margin, which the healthy lab runs need (nginx at c=32 on 2 shared cores shows
//!    p99 6.8 × p50).
//!
//! Both must hold. The acceptance floor (a p99 ≥ 10 × p50 and ≥ 10 ms above it is never
//! `healthy, high`) follows for every path RTT: `log2(1000) < 10`, and since the p50 is at
//! least one RTT, `p99 − p50 ≥ max(10 ms, 9 × RTT) ≥ 3 × RTT + 6 ms` (a unit test checks
//! it over a grid). The p99 is judged, not the p99.9: a c=1 run holds a few hundred
//! requests, where the p99.9 is the single slowest one.
//!
//! ## What explains it
//! Without the per-request join (each request matched to its packets) the layers show the
//! tail only as distributions and finding summaries over the same run. Each gives the extra
//! latency its cause adds at *its* p99, which can reach the tail on its own:
//! - the SYN probes' RTT under load (their largest, the probes being few) over the idle
//!   median → `path-queueing`;
//! - the packets' server time (request's last byte → response's first byte): p99 − p50 →
//!   `slow-server`;
//! - the handshake RTT seen in the packets (p99 − p50) and `syn-retransmit` → `syn-drop`;
//!   with the load's per-request records, the connect time of the slowest requests
//!   themselves beyond the run's median connect (their median) → `syn-drop`;
//! - retransmissions → `packet-loss`; Nagle holds → `nagle-delayed-ack`; cork → `tcp-cork`;
//!   window stalls → `receive-window`; each when it touches at least
//!   [`MATERIAL_LOSS_SHARE`] of the transactions (the p99 is set by the slowest 1 %; the
//!   other rules' 5 % would miss it), with its p99 added latency.
//!
//! A part's `share` is how much of the excess it can account for on its own; the parts
//! overlap (they are measured over the same requests, not per request) so their shares are
//! not added. The part covering at least half the excess names the cause. No `mechanism`
//! is set from these summaries: every-nth and periodic pauses need the request index and
//! time of each slow request, and a mechanism is never assumed. When the c=N run's kept
//! records were joined with the capture (`layers.packets.data.joins`), that run is judged
//! from the join instead (`tail_join`), with its mechanism when the join shows one (a first
//! response segment dropped before the wire and sent at a retransmission timer counts as
//! loss there, when the host shows the drops: `wiredrop`); where no
//! p99 is a finding (or only the client's own), the p99.9 of a joined run of at least
//! [`RARE_MIN_REQUESTS`] is judged when the join names a cause *with* its mechanism there.
//!
//! ## The client's own host
//! The load generator shares the machine (its CPUs) with whatever else runs there, and on a
//! lab with the server too. Each load phase measures it (`app.*.client_cpu`: runnable
//! tasks, PSI, the load threads' run-queue delay). With `k` runnable tasks per CPU a woken
//! thread waits behind the `k − 1` others, a slice each, on the client and on the server:
//! [`contention_us`] (`k = 2` is the idle bound's two slices). A tail within that, with no
//! pattern naming a cause, or one the slow requests spend reading responses already
//! received (the join's `client_read`), is the client's: `healthy` at medium confidence
//! with the measurement and the tail in its evidence — neither the server's fault nor
//! `healthy, high`.
//!
//! ## When nothing explains it: `unexplained-tail`
//! No stable code fits a tail no layer explains: `slow-server` claims the server's time,
//! which the packets do not show (or did not see); `healthy` denies what the app layer
//! measured. The verdict is then `unexplained-tail`, medium confidence when the packets
//! were captured (the network causes were looked for and are not there) and low otherwise,
//! with the distribution and the excess in its evidence.

use lagtrace_model::diagnosis::evidence::{ClientCpu, RequestJoin};
use lagtrace_model::{Cause, FindingKind, RequestRecord};

use super::facts::{Facts, join_of};
use super::notes::{missing_layers, rule_outs};
use super::tail_join::{self, JoinedTail};
use super::{Candidate, Judgement, MATERIAL_LOSS_SHARE, ms, note, pct, rule, sup};
use crate::evidence::{AppRun, LayerName, Layers, Target};
use crate::join::tail::Component;
use crate::verdict::{
    Confidence, Cost, EvidenceLine, Fix, FixSide, Mechanism, Tail, TailPart, Verdict,
};

/// Round trips the slowest healthy request may spend on the path beyond the median one.
pub const PATH_ROUNDS: u64 = 3;
/// One scheduler slice: how long a woken process may wait for a busy CPU (µs).
pub const SCHED_SLICE_US: u64 = 3_000;
/// The percentile judged.
const PERCENTILE: f64 = 99.0;
/// A part explains the tail when it covers at least this share of the excess.
const EXPLAINS: f64 = 0.5;
/// Parts covering less than this share of the excess are left out of the list.
const MIN_PART_SHARE: f64 = 0.1;

pub use super::facts::spread;

/// What the path and the scheduler can add to the slowest requests (µs).
pub fn noise_us(rtt_us: u64) -> u64 {
    PATH_ROUNDS * rtt_us + 2 * SCHED_SLICE_US
}

/// Share of the run some task must wait for a CPU (PSI `some`) to call the host busy.
const BUSY_PRESSURE: f64 = 0.05;

/// Runnable tasks per CPU on the load generator's host during a run, when it was busy: at
/// least two per CPU at the 90th percentile sample (the sampler itself left out) and, with
/// PSI, some task waiting for a CPU at least [`BUSY_PRESSURE`] of the run.
pub fn busy_per_cpu(c: &ClientCpu) -> Option<u64> {
    let k = u64::from(c.runnable_p90.saturating_sub(1)).div_ceil(u64::from(c.cpus.max(1)));
    (k >= 2 && c.pressure().is_none_or(|p| p >= BUSY_PRESSURE)).then_some(k)
}

/// What the path and a CPU-busy host can add to the slowest requests (µs), with `k`
/// runnable tasks per CPU: a woken thread waits behind the `k − 1` others for a slice each
/// (the fair scheduler runs every runnable task once per period), on each of the two
/// processes a request wakes. `k = 2` is [`noise_us`]'s one other task.
pub fn contention_us(rtt_us: u64, k: u64) -> u64 {
    PATH_ROUNDS * rtt_us + 2 * k.saturating_sub(1).max(1) * SCHED_SLICE_US
}

/// Whether a run with this p50 and p99 has a tail that is a finding, on a path of `rtt_us`.
pub fn is_finding(p50_us: u64, p99_us: u64, rtt_us: u64) -> bool {
    p99_us.saturating_sub(p50_us) >= noise_us(rtt_us) && p99_us as f64 >= spread() * p50_us as f64
}

/// A tail that is a finding, and what the layers say it is made of.
pub(super) struct TailFinding<'a> {
    run: &'a AppRun,
    /// The percentile judged (99.0, 99.9 for a rare cost: [`rare`], or where a deep tail
    /// starts: [`deep`]).
    percentile: f64,
    /// The run's wait at the percentile, µs.
    at_us: u64,
    /// A deep tail ([`deep`]): the floor it was cut at (with [`DEEP_SPREAD`] × p50) and
    /// its mean wait, µs.
    deep: Option<(u64, u64)>,
    excess_us: u64,
    parts: Vec<TailPart>,
    /// The part that explains at least half the excess.
    explained: Option<TailPart>,
    /// The per-request join's account of the tail, when the records and packets were joined.
    pub(super) joined: Option<JoinedTail>,
    /// When the tail is the load generator's own host being CPU-busy (within what its
    /// measured contention explains, with no pattern showing a cause; or the slow requests
    /// waiting mostly for the client to read a response already received): the evidence.
    pub(super) client: Option<String>,
}

/// The kept per-request records of a run, when the app layer has them.
fn run_records(run: &AppRun) -> Option<&[RequestRecord]> {
    run.records.as_ref().map(|r| r.records.as_slice())
}

/// How a run's join is read before the tail sums its parts ([`assess`]).
pub(super) type Reattribute<'r, 'a> =
    &'r dyn Fn(&AppRun, &'a RequestJoin) -> std::borrow::Cow<'a, RequestJoin>;

/// The run with the largest tail that is a finding, with its parts; `None` when no run's
/// tail is a finding. The p99 first; where no run's p99 is a finding, the p99.9 of a joined
/// run large enough to have one ([`RARE_MIN_REQUESTS`]) when the join shows a cause *and*
/// its mechanism there (a rare, long cost such as a process-wide pause hitting one request
/// per connection per pause: [`rare`]).
///
/// `reattribute` reads a run's join before its parts are summed: a first response segment
/// dropped before the wire leaves at the probe timer, and the drop rule moves that wait from
/// the server's time to loss recovery when the host shows the drops (`judge` passes it in:
/// no rule module imports another).
pub(super) fn assess<'a>(
    x: &Facts<'a>,
    reattribute: Reattribute<'_, 'a>,
) -> Option<TailFinding<'a>> {
    let found = [x.c1, x.cn]
        .into_iter()
        .flatten()
        .filter(|r| is_finding(r.waited().p50_us, r.waited().p99_us, x.rtt_us))
        // The run the capture covered and joined first (its slow requests' own packets),
        // then the larger excess.
        .max_by_key(|r| {
            (
                join_of(x, r).is_some(),
                r.waited().p99_us - r.waited().p50_us,
            )
        });
    let Some(run) = found else {
        return beyond_p99(x, reattribute);
    };
    let excess_us = run.waited().p99_us - run.waited().p50_us;
    let join = join_of(x, run).map(|j| reattribute(run, j));
    let joined = tail_join::joined(run_records(run), join.as_deref(), PERCENTILE);
    let parts = uncork(
        x,
        match &joined {
            Some(j) => j.parts.clone(),
            None => parts(x, run, excess_us),
        },
    );
    let at_us = run.waited().p99_us;
    let f = finding(x, run, PERCENTILE, at_us, excess_us, parts, joined);
    // A p99 nothing names (or the client's own scheduling) may hide a rarer cost the join
    // names with its mechanism. A deep tail nothing names past an unexplained p99 adds
    // nothing to it: the p99 stays.
    if (f.explained.is_none() || f.client.is_some())
        && let Some(r) = beyond_p99(x, reattribute)
            // The client's own scheduling at the p99 does not excuse a deep tail past it
            // that is not the client's too.
            .filter(|r| r.explained.is_some() || (f.client.is_some() && r.client.is_none()))
    {
        return Some(r);
    }
    Some(f)
}

/// The tail past the p99 ([`deep`], [`rare`]): a deep tail whose cause the layers name
/// first (the requests a timeout meets, with what they waited for), then a p99.9 the join
/// names with its mechanism, then a deep tail nothing names (`unexplained-tail`).
fn beyond_p99<'a>(x: &Facts<'a>, reattribute: Reattribute<'_, 'a>) -> Option<TailFinding<'a>> {
    let d = deep(x, reattribute, DEEP_MIN_US);
    if d.as_ref().is_some_and(|d| d.explained.is_some()) {
        return d;
    }
    rare(x, reattribute)
        .or_else(|| {
            // Shorter than a deep tail but as rare and as far from the p50 (a 50 ms pause
            // once a second at tens of thousands of requests a second lies past the p99.9):
            // named only with its mechanism, like the p99.9.
            deep(x, reattribute, noise_us(x.rtt_us)).filter(|f| {
                f.explained
                    .as_ref()
                    .is_some_and(|p| p.mechanism.is_some() && p.share >= EXPLAINS)
            })
        })
        .or(d)
}

/// Requests a run needs before its p99.9 is judged (at least 10 requests above it).
pub const RARE_MIN_REQUESTS: u64 = 10_000;

/// The p99.9 tail of a joined run, when its p99 is not a finding but its p99.9 is (the same
/// bounds, the spread one decade further: `log2(10⁴)` × the p50) and the join names a cause
/// with its mechanism at that percentile. Without a mechanism a p99.9 spread is left alone:
/// one request in a thousand meets every hiccup of a shared machine.
fn rare<'a>(x: &Facts<'a>, reattribute: Reattribute<'_, 'a>) -> Option<TailFinding<'a>> {
    const P999: f64 = 99.9;
    let (run, joined) = [x.cn, x.c1].into_iter().flatten().find_map(|r| {
        let w = r.waited();
        let ok = w.count >= RARE_MIN_REQUESTS
            && w.p999_us.saturating_sub(w.p50_us) >= noise_us(x.rtt_us)
            && w.p999_us as f64 >= 10_000f64.log2() * w.p50_us as f64;
        let join = join_of(x, r).filter(|_| ok).map(|j| reattribute(r, j));
        let j = tail_join::joined(run_records(r), join.as_deref(), P999)?;
        let top = j.parts.first()?;
        (top.mechanism.is_some() && top.share >= EXPLAINS).then_some((r, j))
    })?;
    let excess_us = run.waited().p999_us - run.waited().p50_us;
    let parts = joined.parts.clone();
    let at_us = run.waited().p999_us;
    Some(finding(x, run, P999, at_us, excess_us, parts, Some(joined)))
}

/// A deep tail starts at this wait (µs): a client's timeout, a user's patience, a page's
/// budget are counted in hundreds of milliseconds.
pub const DEEP_MIN_US: u64 = 100_000;
/// ... and at this many times the p50: beyond any contention spread (an exponential wait's
/// p99.99 is 13 × its median).
pub const DEEP_SPREAD: f64 = 20.0;
/// Requests a deep tail needs: fewer are single events (one lost SYN, one slow request).
pub const DEEP_MIN_REQUESTS: f64 = 10.0;
/// ... and this share of the run (0.05 %),
pub const DEEP_MIN_SHARE: f64 = 0.0005;
/// ... or, from the kept records, this share of the clients' time (5 %). A load of `c`
/// connections has one request in flight on each, so a stall of the server holds `c`
/// requests however long it lasts, and the share of *requests* it shows falls as the rate
/// rises: a server stopped 50 ms every 300 ms (17 % of the time) was 0.026 % of 76 600
/// requests at c=4 on a fast machine, and `healthy`. The clients' time in the deep waits
/// (their sum over `c` × the run) is the share of the run the stalls held them — what the
/// requests of clients that do not wait for each other's answers would meet. A twentieth
/// of the run: a shared machine's hiccups (three of 10 ms on every connection of a 3 s run
/// are 1 %) stay below it.
pub const DEEP_MIN_TIME_SHARE: f64 = 0.05;
/// ... and this many distinct moments they were released at: one hiccup of the host (a
/// stall of the client, the server or the machine) releases every request in flight at
/// once — 32 of them at c=32 — and is one event, not a tail.
pub const DEEP_MIN_MOMENTS: usize = 3;
/// Requests whose waits end within this of each other were released at one moment (µs).
pub const MOMENT_US: u64 = 10_000;

/// Where a run's deep tail starts, and the share of its requests there: the requests that
/// waited at least `floor_us` ([`DEEP_MIN_US`] for a deep tail), [`DEEP_SPREAD`] × the p50
/// and more than the p99 (the tail *past* it), when there are at least
/// [`DEEP_MIN_REQUESTS`] of them and [`DEEP_MIN_SHARE`] of the run (or, from records,
/// [`DEEP_MIN_TIME_SHARE`] of the clients' time), released at [`DEEP_MIN_MOMENTS`] distinct
/// moments or more.
///
/// From the kept records that stand for themselves (every slow one is kept exactly, weight
/// 1; a sampled record standing for hundreds would make a deep tail of one request): when
/// more are slow than were kept, the count is a lower bound. Without records, from the
/// percentiles: a p99.9 there is a deep tail of 0.1 %, whose moments are unknown — so it
/// must hold [`DEEP_MIN_MOMENTS`] × the concurrency requests (more than one stall of every
/// connection).
pub fn deep_tail(run: &AppRun, floor_us: u64) -> Option<DeepTail> {
    let w = run.waited();
    let from_us = floor_us
        .max((DEEP_SPREAD * w.p50_us as f64) as u64)
        .max(w.p99_us + 1);
    let total = w.count.max(1) as f64;
    // `time_share`: the clients' time in these waits, of the time they had (records only:
    // without them the percentiles' set is a fixed share of the requests, nothing more is
    // known).
    let (n, least, sum, moments, time_share) = match run_records(run).filter(|r| !r.is_empty()) {
        Some(rs) => {
            let exact: Vec<&RequestRecord> = rs
                .iter()
                .filter(|r| r.wait_us >= from_us && (r.slow || r.weight < 1.5))
                .collect();
            let n = exact.len() as f64;
            let least = exact.iter().map(|r| r.wait_us).min().unwrap_or(u64::MAX);
            let sum: f64 = exact.iter().map(|r| r.wait_us as f64).sum();
            let mut ends: Vec<u64> = exact.iter().map(|r| r.start_us + r.wait_us).collect();
            ends.sort_unstable();
            let moments = ends.windows(2).filter(|p| p[1] - p[0] > MOMENT_US).count()
                + usize::from(!ends.is_empty());
            let had = f64::from(run.concurrency.max(1)) * run.duration_us.max(1) as f64;
            (n, least, sum, moments, sum / had)
        }
        // Between the p99.9 and the max: their middle stands for the set's mean.
        None if w.p999_us >= from_us
            && total * 0.001
                >= (DEEP_MIN_MOMENTS as u64 * u64::from(run.concurrency.max(1))) as f64 =>
        {
            (
                total * 0.001,
                w.p999_us,
                total * 0.001 * (w.p999_us + w.max_us) as f64 / 2.0,
                DEEP_MIN_MOMENTS,
                0.0,
            )
        }
        None => return None,
    };
    let enough = n / total >= DEEP_MIN_SHARE || time_share >= DEEP_MIN_TIME_SHARE;
    (n >= DEEP_MIN_REQUESTS && enough && moments >= DEEP_MIN_MOMENTS).then(|| DeepTail {
        from_us: least,
        share: (n / total).min(1.0),
        mean_us: (sum / n) as u64,
        moments,
    })
}

/// A run's deep tail ([`deep_tail`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeepTail {
    /// The least wait in it, µs.
    pub from_us: u64,
    /// Its share of the run's requests.
    pub share: f64,
    /// Its mean wait, µs.
    pub mean_us: u64,
    /// The distinct moments its requests were released at ([`MOMENT_US`] apart or more).
    pub moments: usize,
}

/// The deep tail beyond the p99 (issue 28): at least ten requests and 0.05 % of a run
/// waiting ≥ `floor_us` and ≥ 20 × the p50 ([`deep_tail`]). With the floor at
/// [`DEEP_MIN_US`] it is a finding even where the p99 and p99.9 are not — the requests a
/// client's timeout or an SLO at p99.9 meets — never `healthy` over it; with the noise bound
/// as the floor, the caller names it only with a mechanism. Split by the join when the run
/// was joined (the set exactly: its percentile is `100 × (1 − share)`), else by the layers'
/// summaries.
fn deep<'a>(
    x: &Facts<'a>,
    reattribute: Reattribute<'_, 'a>,
    floor_us: u64,
) -> Option<TailFinding<'a>> {
    let (run, t) = [x.cn, x.c1]
        .into_iter()
        .flatten()
        .find_map(|r| Some((r, deep_tail(r, floor_us)?)))?;
    let (at_us, percentile) = (t.from_us, 100.0 * (1.0 - t.share));
    let excess_us = at_us.saturating_sub(run.waited().p50_us);
    let join = join_of(x, run).map(|j| reattribute(run, j));
    let joined = tail_join::joined_from(run_records(run), join.as_deref(), percentile, Some(at_us));
    let parts = uncork(
        x,
        match &joined {
            Some(j) => j.parts.clone(),
            None => parts(x, run, excess_us),
        },
    );
    let mut f = finding(x, run, percentile, at_us, excess_us, parts, joined);
    f.deep = Some((floor_us, t.mean_us));
    Some(f)
}

/// The finding at `percentile` from its parts.
fn finding<'a>(
    x: &Facts<'a>,
    run: &'a AppRun,
    percentile: f64,
    at_us: u64,
    excess_us: u64,
    parts: Vec<TailPart>,
    joined: Option<JoinedTail>,
) -> TailFinding<'a> {
    let explained = parts
        .first()
        .filter(|p| p.share >= EXPLAINS && p.cause != Cause::UnexplainedTail)
        .cloned();
    let client = client_busy(x, run, excess_us, joined.as_ref(), explained.is_some());
    TailFinding {
        run,
        percentile,
        at_us,
        deep: None,
        excess_us,
        parts,
        explained,
        joined,
        client,
    }
}

/// The client-side account of a tail (see [`TailFinding::client`]), as an evidence line.
fn client_busy(
    x: &Facts<'_>,
    run: &AppRun,
    excess_us: u64,
    joined: Option<&JoinedTail>,
    explained: bool,
) -> Option<String> {
    let patterned = joined.is_some_and(|j| j.mechanism.is_some());
    let read = joined
        .and_then(|j| j.split.parts.first())
        .filter(|p| p.component == Component::ClientRead && p.share >= EXPLAINS);
    let cpu = run.client_cpu.as_ref();
    let busy = cpu.and_then(|c| busy_per_cpu(c).map(|k| (c, k)));
    let within = busy.filter(|&(_, k)| excess_us <= contention_us(x.rtt_us, k));
    let mut text = match busy {
        Some((c, k)) => format!(
            "the load generator's host was CPU-busy during {}: {} runnable tasks on {} \
             CPUs at the p90 sample (≈{k} per CPU){}{}; a woken thread may wait behind the \
             {} others for a {} slice each, on the client and the server: up to +{} with \
             the path",
            run.label(),
            c.runnable_p90,
            c.cpus,
            c.pressure()
                .map(|p| format!(", some task waiting for a CPU {} of the run", pct(p)))
                .unwrap_or_default(),
            c.run_delay_us
                .map(|d| format!(", the load threads waited {} for a CPU", ms(d)))
                .unwrap_or_default(),
            k - 1,
            ms(SCHED_SLICE_US),
            ms(contention_us(x.rtt_us, k))
        ),
        None => String::new(),
    };
    if within.is_some() && !patterned {
        text.push_str(&format!("; the tail (+{}) is within it", ms(excess_us)));
        return Some(text);
    }
    let p = read.filter(|_| !explained)?;
    if !text.is_empty() {
        text.push_str("; ");
    }
    text.push_str(&format!(
        "the slowest requests wait +{} ({}) after their whole response was on the wire, \
         before the client read it: the client's own scheduling, not the server or the path",
        ms(p.added_us),
        pct(p.share)
    ));
    Some(text)
}

/// The extra latency each layer shows at its own p99, capped at the excess, largest first.
fn parts(x: &Facts<'_>, run: &AppRun, excess_us: u64) -> Vec<TailPart> {
    let mut raw: Vec<(Cause, u64)> = Vec::new();
    // Connect time of the slowest requests themselves, from the load's records.
    if let Some(c) = super::facts::tail_connect_us(run) {
        raw.push((Cause::SynDrop, c));
    }
    // The slowest SYN probe under load over the idle median: a queue on the path. The
    // probes are few (tens), so their largest stands for their p99.
    if let Some(p) = x.path
        && let (Some(idle), Some(load)) = (&p.idle, &p.under_load)
        && idle.received > 0
        && load.received > 0
    {
        raw.push((Cause::PathQueueing, load.max_us.saturating_sub(idle.p50_us)));
    }
    if let Some(p) = x.packets {
        for (dist, cause) in [
            (p.server_time.as_ref(), Cause::SlowServer),
            (p.handshake_rtt.as_ref(), Cause::SynDrop),
        ] {
            if let Some(d) = dist.filter(|d| d.count > 0) {
                raw.push((cause, d.p99_us.saturating_sub(d.p50_us)));
            }
        }
        for f in p
            .findings
            .iter()
            .filter(|f| f.count > 0 && f.share >= MATERIAL_LOSS_SHARE)
        {
            let cause = match f.kind {
                // Held until the next ACK with TCP_NODELAY on: a drop before the wire.
                FindingKind::Retransmission
                | FindingKind::HeldUntilAck
                | FindingKind::DroppedBeforeCapture => Cause::PacketLoss,
                FindingKind::SynRetransmit => Cause::SynDrop,
                FindingKind::NagleDelayedAck | FindingKind::NagleStall => Cause::NagleDelayedAck,
                FindingKind::TcpCork => Cause::TcpCork,
                FindingKind::ZeroWindow | FindingKind::WindowFull => Cause::ReceiveWindow,
                FindingKind::DelayedAck | FindingKind::SlowServer => continue,
            };
            raw.push((cause, f.p99_added_us));
        }
    }
    let mut parts: Vec<TailPart> = Vec::new();
    for (cause, added) in raw {
        let added_us = added.min(excess_us);
        let share = added_us as f64 / excess_us.max(1) as f64;
        if share < MIN_PART_SHARE {
            continue;
        }
        match parts.iter_mut().find(|p| p.cause == cause) {
            Some(p) if p.added_us >= added_us => {}
            Some(p) => {
                p.added_us = added_us;
                p.share = share;
            }
            None => parts.push(TailPart {
                cause,
                mechanism: None,
                added_us,
                share,
            }),
        }
    }
    parts.sort_by_key(|p| std::cmp::Reverse(p.added_us));
    parts
}

impl TailFinding<'_> {
    /// The share of requests the percentile leaves above it (0.01 for the p99).
    fn above(&self) -> f64 {
        (100.0 - self.percentile) / 100.0
    }

    /// The run's wait at the percentile, µs.
    fn at_us(&self) -> u64 {
        self.at_us
    }

    /// The percentile as the text names it: "p99", "p99.9", "p99.93".
    fn label(&self) -> String {
        super::percentile_label(self.percentile)
    }

    /// The verdict's `tail`.
    pub(super) fn tail(&self) -> Tail {
        let w = self.run.waited();
        let mut text = match self.deep {
            Some((_, mean_us)) => format!(
                "the slowest {} (the {} and up) wait {} to {}, +{} over the p50 on average \
                 ({} at {})",
                share_text(self.above()),
                self.label(),
                ms(self.at_us()),
                ms(w.max_us),
                ms(mean_us.saturating_sub(w.p50_us)),
                ms(w.p50_us),
                self.run.label()
            ),
            None => format!(
                "the slowest {} wait +{} over the p50 ({} at {}, {} {})",
                share_text(self.above()),
                ms(self.excess_us),
                ms(w.p50_us),
                self.run.label(),
                self.label(),
                ms(self.at_us())
            ),
        };
        match (&self.explained, &self.joined) {
            (_, Some(j)) => {
                text.push_str(": ");
                text.push_str(&j.text());
            }
            (Some(p), None) => text.push_str(&format!(
                ": {} {} (+{})",
                pct(p.share),
                part_name(p.cause),
                ms(p.added_us)
            )),
            (None, None) if self.client.is_some() => {
                text.push_str(": the load generator's own host (CPU-busy), not the server")
            }
            (None, None) => text.push_str(": no layer shows what they wait for"),
        }
        Tail {
            percentile: super::two_decimals_down(self.percentile),
            latency_us: self.at_us(),
            excess_us: self.excess_us,
            parts: self.parts.clone(),
            text,
        }
    }

    /// Whether the tail looks like the server's own time as far as the packets tell (its
    /// largest part is server time, or nothing explains it) with no pattern but a pause:
    /// what a server waiting for a CPU on a busy host looks like. A single-threaded server
    /// descheduled stalls every connection at once, like a process-wide pause.
    pub(super) fn server_shaped(&self) -> bool {
        let p = self.explained.as_ref();
        p.is_none_or(|p| p.cause == Cause::SlowServer)
            && p.and_then(|p| p.mechanism)
                .is_none_or(|m| m == Mechanism::PeriodicPause)
    }

    /// The tail is contention on the server's host that the measurement itself caused: an
    /// account of the client's side like [`TailFinding::client`], with that evidence.
    pub(super) fn measurement_contention(&mut self, text: &str) {
        let t = format!(
            "{text}: the tail is CPU contention on the host the server shares with this lagtrace, not the server's handling (diagnose from another host, or with fewer connections, to measure the server alone)"
        );
        self.client = Some(match self.client.take() {
            Some(c) => format!("{c}; {t}"),
            None => t,
        });
    }

    /// What the slow requests wait over the p50: "+40 ms"; for a deep tail, its mean and
    /// its least ("+250 ms on average, at least +100 ms").
    fn wait_text(&self) -> String {
        match self.deep {
            Some((_, mean_us)) => format!(
                "+{} on average, at least +{}",
                ms(mean_us.saturating_sub(self.run.waited().p50_us)),
                ms(self.excess_us)
            ),
            None => format!("+{}", ms(self.excess_us)),
        }
    }

    /// Where this tail starts in `run` and its percentile's name, when it is `run`'s and
    /// past the p99 (the slow requests a host rule should look at).
    pub(super) fn slow_from(&self, run: &AppRun) -> Option<(u64, String)> {
        (std::ptr::eq(self.run, run) && self.percentile > PERCENTILE)
            .then(|| (self.at_us, self.label()))
    }

    /// Whether this is a deep tail ([`deep`] at [`DEEP_MIN_US`]): never `healthy`.
    pub(super) fn is_deep(&self) -> bool {
        self.deep
            .is_some_and(|(floor_us, _)| floor_us >= DEEP_MIN_US)
    }

    /// The cause of the part that explains the tail, when one does.
    pub(super) fn explained_cause(&self) -> Option<Cause> {
        self.explained.as_ref().map(|p| p.cause)
    }

    /// The mechanism the join shows for `cause` (the tail's largest part is that cause and
    /// carries one), with the packets' line that shows it: for a verdict another rule named.
    pub(super) fn mechanism_for(&self, cause: Cause) -> Option<(Mechanism, EvidenceLine)> {
        let j = self.joined.as_ref()?;
        let p = self.explained.as_ref().filter(|p| p.cause == cause)?;
        let m = p.mechanism?;
        Some((m, sup(LayerName::Packets, cause, j.line())))
    }

    /// The app layer's line stating the tail.
    pub(super) fn app_line(&self, x: &Facts<'_>, cause: Cause) -> crate::verdict::EvidenceLine {
        let l = self.run.waited();
        let head = format!(
            "{}: {} requests, p50 {}, p90 {}, p99 {}, p99.9 {}, max {}",
            self.run.label(),
            self.run.requests,
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.p999_us),
            ms(l.max_us),
        );
        let text = if let Some((floor_us, _)) = self.deep {
            format!(
                "{head}: {} of the requests (the {} and up) waited {} or more, at least {} \
                 and {:.0}× the p50 — past the p99, where a client's timeout or an SLO at \
                 p99.9 meets them",
                share_text(self.above()),
                self.label(),
                ms(self.at_us()),
                ms(floor_us),
                DEEP_SPREAD
            )
        } else {
            format!(
                "{head}: the {} is {:.0}× the p50 and {} above it, beyond what contention \
                 ({:.1}× the p50) and the path and scheduler ({}) explain",
                self.label(),
                self.at_us() as f64 / l.p50_us.max(1) as f64,
                ms(self.excess_us),
                if self.percentile > 99.0 {
                    10_000f64.log2()
                } else {
                    spread()
                },
                ms(noise_us(x.rtt_us))
            )
        };
        sup(LayerName::App, cause, text)
    }
}

/// A share of requests to two significant digits below 1 % ("0.07%"), as [`pct`] above.
fn share_text(share: f64) -> String {
    let p = share * 100.0;
    if p < 1.0 {
        let t = format!("{p:.2}");
        format!("{}%", t.trim_end_matches('0').trim_end_matches('.'))
    } else {
        pct(share)
    }
}

/// What a part's cause is, as the slow requests wait for it.
fn part_name(c: Cause) -> &'static str {
    match c {
        Cause::SlowServer => "server time",
        Cause::SynDrop => "connection setup",
        Cause::PathQueueing => "the path's queue",
        Cause::PacketLoss => "loss recovery",
        Cause::NagleDelayedAck => "Nagle holds",
        Cause::TcpCork => "cork holds",
        Cause::ReceiveWindow => "window stalls",
        Cause::KernelStack => "the kernel's packet processing",
        _ => "unexplained",
    }
}

/// The packets' line for the part that explains the tail.
fn part_line(p: &TailPart, excess_us: u64) -> String {
    format!(
        "{} at its p99 adds {} over its median, {} of the tail's excess of {}",
        part_name(p.cause),
        ms(p.added_us),
        pct(p.share),
        ms(excess_us)
    )
}

/// The judgement when no other rule names a cause but the tail is a finding.
pub(super) fn judge(
    layers: &Layers,
    x: &Facts<'_>,
    target: &Target,
    t: &TailFinding<'_>,
) -> Judgement {
    let tail = t.tail();
    let cause = t
        .explained
        .as_ref()
        .map_or(Cause::UnexplainedTail, |p| p.cause);
    let mut evidence = vec![t.app_line(x, cause)];
    let mut finding_layers = vec![LayerName::App];
    let (summary, confidence, added_us, fix) = match &t.explained {
        Some(p) => {
            let line = match &t.joined {
                Some(j) => j.line(),
                None => part_line(p, t.excess_us),
            };
            evidence.push(sup(LayerName::Packets, cause, line));
            finding_layers.push(LayerName::Packets);
            let r = rule(cause);
            let summary = r.map_or("", |r| r.summary()).to_owned();
            let fix = if cause == Cause::SlowServer {
                vec![Fix {
                    side: FixSide::Server,
                    location: None,
                    change: format!(
                        "{} answers most requests at once but some after +{}: find what the \
                         slow ones do (a slow path, a lock, a GC, a backend) with per-request \
                         timings in its logs or a profiler",
                        x.server_name(),
                        ms(p.added_us)
                    ),
                    tradeoff: None,
                }]
            } else {
                let c = Candidate::new(cause, p.added_us, t.above(), finding_layers.clone());
                r.map(|r| r.fixes(&c, x, target)).unwrap_or_default()
            };
            // The slow requests' own packets, every one of them seen: high. Summaries of the
            // same run rather than the slow requests' own packets: medium.
            let confidence = match &t.joined {
                Some(j) if j.complete() => Confidence::High,
                _ => Confidence::Medium,
            };
            (summary, confidence, p.added_us, fix)
        }
        None => {
            match &t.joined {
                Some(j) => evidence.push(note(LayerName::Packets, j.line())),
                None => {
                    for p in &t.parts {
                        evidence.push(note(LayerName::Packets, part_line(p, t.excess_us)));
                    }
                }
            }
            // The packets were looked at and show no cause: medium — unless the capture
            // stopped before most of the slow requests (it could not show one).
            let uncaptured = t.joined.as_ref().is_some_and(JoinedTail::mostly_uncaptured);
            let confidence = if x.packets.is_some() && !uncaptured {
                Confidence::Medium
            } else {
                Confidence::Low
            };
            let fix = vec![Fix {
                side: FixSide::Server,
                location: None,
                change: format!(
                    "the slowest {} of requests wait {} and neither the path nor the packets \
                     show why: look inside {} (per-request timings, pauses, locks, CPU quota)",
                    share_text(t.above()),
                    t.wait_text(),
                    x.server_name()
                ),
                tradeoff: None,
            }];
            (
                "the slowest requests wait far longer than the path and scheduling explain, \
                 and no layer shows why"
                    .to_owned(),
                confidence,
                t.excess_us,
                fix,
            )
        }
    };
    let chosen = t
        .explained
        .as_ref()
        .map(|p| vec![Candidate::new(p.cause, p.added_us, t.above(), Vec::new())])
        .unwrap_or_default();
    evidence.extend(rule_outs(x, &chosen));
    evidence.extend(missing_layers(layers));
    let run = x.main_run();
    let cost = Cost {
        added_us,
        share: t.above(),
        affected: None,
        of: None,
        p50_us: run.map(|r| r.latency.p50_us),
        concurrency: run.map(|r| r.concurrency),
        p50_without_us: None,
        text: tail.text.clone(),
    };
    Judgement {
        verdict: Verdict {
            cause,
            secondary: Vec::new(),
            confidence,
            summary,
            cost,
            mechanism: t.explained.as_ref().and_then(|p| p.mechanism),
            tail: Some(tail),
            fix,
            hop: None,
        },
        evidence,
        finding_layers,
    }
}

/// Holds at the cork ceiling on sockets read uncorked are the server's own time
/// ([`Facts::cork_ruled_out`]): their part is the server's, added to its part if there is
/// one.
fn uncork(x: &Facts<'_>, parts: Vec<TailPart>) -> Vec<TailPart> {
    if x.cork_ruled_out().is_none() {
        return parts;
    }
    let mut out: Vec<TailPart> = Vec::with_capacity(parts.len());
    for mut p in parts {
        if p.cause == Cause::TcpCork {
            p.cause = Cause::SlowServer;
        }
        match out.iter_mut().find(|q| q.cause == p.cause) {
            // Two components of the same requests' wait (the join's): they add up.
            Some(q) => {
                q.added_us += p.added_us;
                q.share = (q.share + p.share).min(1.0);
            }
            None => out.push(p),
        }
    }
    out
}
