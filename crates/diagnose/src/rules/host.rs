//! The host layer as direct evidence: a kernel counter of the server's host names the
//! mechanism of a cause only when its timing and volume account for the slow requests,
//! never merely for being above zero.
//!
//! - `cpu-throttled` (cause `slow-server`): the server's cgroup ran out of CPU quota in
//!   periods that overlap most of the c=N run's slowest requests (those at or above its p99),
//!   each throttled period held the cgroup for a material time, and a material share of the
//!   periods were throttled.
//! - `accept-queue-overflow` (cause `syn-drop`): the listener on the target port dropped
//!   connections over the run (its own `sk_drops`), at least as many as half the connects
//!   that waited for a SYN retransmission (each such connect needs one drop), and it was
//!   seen full while sampled or the namespace's `ListenOverflows` moved.
//! - `cpu-contention`: the server's threads waited for a CPU (run-queue delay, sampled
//!   every ~100 ms) for at least half of what each of most of the slowest requests waited
//!   beyond the p50 — the host's CPUs were busy when they were slow — in waits long enough
//!   to add up to that: one wait for a CPU (the samples' delay per timeslice) times the
//!   contention spread reaches half the excess. The slowest requests are those of the tail
//!   the verdict is about: the p99's, or the p99.9's when the tail lies past the p99.
//!   Thousands of 50 µs waits a second leave every request quick; a request slow for its
//!   own reason on a busy host is not the CPU's. Where the off-CPU tracer timed the threads' blocks one by one (a live run), the
//!   waits are read, not inferred: within a slow request, one thread's run-queue blocks each
//!   longer than the p50 — waits a typical request does not sit through — must add up to
//!   half its excess (the samples' average hides a few long waits among thousands of short
//!   ones: under a suite's load the mean wait was ~450 µs while the hogs' slices held the
//!   server for milliseconds at a time). Who held the CPUs decides the verdict: when the measuring process itself (the load generator and the
//!   capture, on the server's host) may run on the server's CPUs (their affinity masks
//!   overlap) and used at least as much CPU as every other process together, the tail is
//!   the measurement's own contention — `healthy` at medium confidence with that evidence, never
//!   the server's fault; otherwise the host is busy with other work — `slow-server` with
//!   mechanism `cpu-contention`, the largest other CPU users named in its fix.
//! - run-queue delay beyond what throttling explains: a note that the host is busy.
//! - direct evidence wins: a `tcp-cork` inferred from packets alone (TCP_CORK not read on
//!   the server's sockets) yields to `cpu-throttled`; never the reverse.

use lagtrace_model::Cause;
use lagtrace_model::host::{
    CgroupCpu, HostCpu, HostReport, ListenerQueue, OffCpu, RunQueueWait, SchedSample,
};

use super::facts::{Facts, softirq_saturated_fix, waited_through_drops};
use super::{Candidate, Direct, MATERIAL_ADDED_US, ms, note, out, pct, sup};
use crate::evidence::{AppRun, LayerName, Target};
use crate::verdict::{EvidenceLine, Fix, FixSide, Mechanism};

/// A throttled share of the cgroup's periods below this is no explanation for a tail.
pub(super) const MIN_THROTTLED_SHARE: f64 = 0.05;
/// The share of the slowest requests that must overlap a throttled interval.
pub(super) const MIN_ALIGNED_SHARE: f64 = 0.5;

/// The slowest requests of `run` (at or above `from_us`, by default its p99), as
/// `[start, end)` on the realtime clock, and the run's p50.
fn slow_intervals(run: &AppRun, from_us: Option<u64>) -> Option<(Vec<(u64, u64)>, u64)> {
    let waits = run.waits.as_ref()?;
    let recs = run.records.as_ref()?;
    let from_us = from_us.unwrap_or(waits.p99_us);
    let v: Vec<(u64, u64)> = recs
        .records
        .iter()
        .filter(|r| r.wait_us >= from_us)
        .map(|r| {
            let s = recs.start_unix_us + r.start_us;
            (s, s + r.wait_us)
        })
        .collect();
    (!v.is_empty()).then_some((v, waits.p50_us))
}

/// The intervals between successive throttling samples in which the cgroup was throttled,
/// with the time it was held in each.
fn throttled_intervals(cg: &CgroupCpu) -> Vec<(u64, u64, u64)> {
    cg.timeline
        .windows(2)
        .filter(|w| w[1].throttled_periods > w[0].throttled_periods)
        .map(|w| {
            let held = w[1].throttled_us.saturating_sub(w[0].throttled_us);
            (w[0].t_unix_us, w[1].t_unix_us, held)
        })
        .collect()
}

/// `cpu-throttled`: throttled periods aligned with the slowest requests.
pub(super) fn throttled(x: &Facts<'_>, host: &HostReport) -> Option<Direct> {
    let cg = host.cgroup.get()?;
    let run = x.cn?;
    if cg.throttled_periods == 0 || cg.throttled_share < MIN_THROTTLED_SHARE {
        return None;
    }
    let stall_us = cg.throttled_us / cg.throttled_periods;
    let throttled = throttled_intervals(cg);
    let (slow, p50) = slow_intervals(run, None)?;
    // A slow request is accounted for when the intervals it overlaps held the cgroup for
    // at least half of what it waited beyond the p50 (timing and volume, per request).
    let aligned = slow
        .iter()
        .filter(|(s, e)| {
            let held: u64 = throttled
                .iter()
                .filter(|(a, b, _)| s < b && e > a)
                .map(|t| t.2)
                .sum();
            held > 0 && held * 2 >= (e - s).saturating_sub(p50)
        })
        .count();
    let share = aligned as f64 / slow.len() as f64;
    let sampled_us = cg
        .timeline
        .last()
        .zip(cg.timeline.first())
        .map_or(0, |(l, f)| l.t_unix_us.saturating_sub(f.t_unix_us));
    let covered_us: u64 = throttled.iter().map(|(a, b, _)| b - a).sum();
    let mut excess: Vec<u64> = slow
        .iter()
        .map(|(s, e)| (e - s).saturating_sub(p50))
        .collect();
    excess.sort_unstable();
    let added_us = excess.get(excess.len() / 2).copied().unwrap_or(0);
    if share < MIN_ALIGNED_SHARE || added_us < MATERIAL_ADDED_US {
        return None;
    }
    let limit = match (cg.quota_us, cg.period_us) {
        (Some(q), Some(p)) => format!(" (quota {} per {} period)", ms(q), ms(p)),
        _ => String::new(),
    };
    let total = run.waits.as_ref().map_or(0, |w| w.count);
    let text = format!(
        "cgroup {}{limit}: throttled in {} of {} periods ({}), held {} in all, ~{} per \
         throttled period; {aligned} of the {} slowest requests (≥ p99) overlap throttled \
         intervals that held it at least half their excess (throttling covered {} of the {} \
         sampled), median +{} over the p50",
        cg.path,
        cg.throttled_periods,
        cg.periods,
        pct(cg.throttled_share),
        ms(cg.throttled_us),
        ms(stall_us),
        slow.len(),
        ms(covered_us),
        ms(sampled_us),
        ms(added_us)
    );
    Some(Direct {
        cause: Cause::SlowServer,
        mechanism: Mechanism::CpuThrottled,
        evidence: vec![sup(LayerName::Host, Cause::SlowServer, text)],
        fix: Fix {
            side: FixSide::Server,
            location: Some(cg.path.clone()),
            change: "raise the cgroup's CPU limit (cpu.max / cpu.cfs_quota_us), or make the \
                     server need less CPU per request"
                .into(),
            tradeoff: Some("a higher limit lets the service take more of the host's CPU".into()),
        },
        added_us,
        share: aligned as f64 / total.max(1) as f64,
        counted: Some((aligned as u64, Some(total))),
    })
}

/// The server's run-queue delay next to the slowest requests ([`contention`]).
pub(super) struct Contention {
    /// The measuring process (load generator, capture) may run on the server's CPUs and
    /// used at least as much CPU as every other process together: the contention is the
    /// measurement's own.
    pub(super) own: bool,
    /// The evidence line's text.
    pub(super) text: String,
    /// The cause, mechanism, fix and cost when the host is busy with other work.
    pub(super) direct: Direct,
}

/// The server's threads' run-queue delay within `[s, e)`, per thread that ran or waited:
/// each sampling interval's delay, pro rata of the overlap (a density: the samples are
/// ~100 ms apart, a slow request a few ms to a few hundred).
fn waited_within(timeline: &[SchedSample], s: u64, e: u64) -> u64 {
    timeline
        .iter()
        .filter(|t| t.start_unix_us < e && t.end_unix_us > s && t.end_unix_us > t.start_unix_us)
        .map(|t| {
            let overlap = e.min(t.end_unix_us) - s.max(t.start_unix_us);
            let len = t.end_unix_us - t.start_unix_us;
            (t.wait_us as f64 * overlap as f64 / len as f64 / f64::from(t.active.max(1))) as u64
        })
        .sum()
}

/// How long one of the server's threads' waits for a CPU lasted on average within `[s, e)`
/// (µs): the overlapping samples' run-queue delay over their timeslices, pro rata of the
/// overlap. `None` when the samples did not count timeslices (older JSON).
fn stretch_within(timeline: &[SchedSample], s: u64, e: u64) -> Option<f64> {
    if timeline.iter().all(|t| t.timeslices == 0) {
        return None;
    }
    let (mut wait, mut slices) = (0.0, 0.0);
    for t in timeline
        .iter()
        .filter(|t| t.start_unix_us < e && t.end_unix_us > s && t.end_unix_us > t.start_unix_us)
    {
        let overlap = e.min(t.end_unix_us) - s.max(t.start_unix_us);
        let f = overlap as f64 / (t.end_unix_us - t.start_unix_us) as f64;
        wait += t.wait_us as f64 * f;
        slices += t.timeslices as f64 * f;
    }
    // A thread that waited through the overlap without running once waited all of it.
    Some(wait / slices.max(1.0))
}

/// Whether waits for a CPU lasting `stretch_us` on average can hold a request `half_us`:
/// a request waits through a few of its threads' waits (its wake-ups; an event loop serves
/// every ready request each time it runs), which spread like any contention wait — an
/// exponential, whose p99.9 is [`super::facts::spread`] × its median (the mean, a little
/// longer than the median, stands in for it). Waits of tens of µs — a thread that gets a CPU
/// thousands of times a second while the host is busy — never add up to a request's
/// hundreds of ms: those requests waited for something else (a backend, a lock, a sleep)
/// while the host happened to be busy.
fn long_enough(stretch_us: Option<f64>, half_us: u64) -> bool {
    stretch_us.is_none_or(|m| super::facts::spread() * m >= half_us as f64)
}

/// The watched threads' waits for a CPU (preempted while runnable, or woken and not yet
/// running: [`lagtrace_model::host::OffCpuBlock::waiting_for_cpu`]) at least `min_us` long,
/// sorted by start, read once per judgement: each slow request then looks only at the blocks
/// that can overlap it (the tracer keeps up to 400 000 blocks; a scan of all of them per slow
/// request was up to a thousand scans). From the blocks timed one by one (a live run), else
/// from the long ones a report carries ([`OffCpu::long_run_queue`]: an agent's, a saved
/// JSON), where the waits shorter than
/// [`lagtrace_model::host::LONG_RUN_QUEUE_US`] are missing — it can only
/// undercount them, never blame the CPU for more than it held.
struct LongRunQueueWaits {
    blocks: Vec<RunQueueWait>,
    /// The longest block: how far before a window a block may start and still overlap it.
    longest_us: i64,
}

impl LongRunQueueWaits {
    /// `None` when the report has neither (the tracer did not run, or older JSON).
    fn new(off: &OffCpu, min_us: u64) -> Option<Self> {
        let long =
            |b: &RunQueueWait| b.end_us > b.start_us && (b.end_us - b.start_us) as u64 >= min_us;
        let mut blocks: Vec<RunQueueWait> = if off.blocks.is_empty() {
            off.long_run_queue
                .as_ref()?
                .iter()
                .copied()
                .filter(long)
                .collect()
        } else {
            off.blocks
                .iter()
                .filter_map(lagtrace_model::host::OffCpuBlock::waiting_for_cpu)
                .filter(long)
                .collect()
        };
        blocks.sort_unstable_by_key(|b| b.start_us);
        let longest_us = blocks
            .iter()
            .map(|b| b.end_us - b.start_us)
            .max()
            .unwrap_or(0);
        Some(LongRunQueueWaits { blocks, longest_us })
    }

    /// The longest time one thread spent within `[s, e)` in these blocks — the waits a
    /// request of that length sat through beyond what a typical one does. Realtime µs.
    fn within(&self, s: u64, e: u64) -> u64 {
        let (s, e) = (s as i64, e as i64);
        let from = self
            .blocks
            .partition_point(|b| b.start_us < s - self.longest_us);
        let to = self.blocks.partition_point(|b| b.start_us < e);
        let mut by_tid: std::collections::HashMap<u32, i64> = std::collections::HashMap::new();
        for b in self.blocks[from..to.max(from)]
            .iter()
            .filter(|b| b.end_us > s)
        {
            *by_tid.entry(b.tid).or_default() += b.end_us.min(e) - b.start_us.max(s);
        }
        by_tid.into_values().max().unwrap_or(0).max(0) as u64
    }
}

/// A server's threads' share of their runnable time spent waiting for a CPU at or above
/// which they are starved: they waited longer than they ran.
pub(super) const STARVED_WAIT_SHARE: f64 = 0.5;

/// Whether the server's threads waited for a CPU at least as long as they ran over the
/// window ([`STARVED_WAIT_SHARE`]) while other processes used at least as much CPU as the
/// server did: the waits were for others' work, not for the server's own threads queued on
/// too few CPUs (two workers pinned to one CPU wait for each other).
pub(super) fn starved(host: &HostReport) -> bool {
    host.threads
        .get()
        .is_some_and(|t| t.wait_share >= STARVED_WAIT_SHARE)
        && host
            .cpu
            .get()
            .is_some_and(|c| c.others_us > 0 && c.others_us >= c.watched_us)
}

/// `cpu-contention`: the server's threads waited for a CPU through most of the slowest
/// requests, at least half of each one's excess; `None` when the threads were not sampled,
/// the cgroup's throttling explains it (`throttled`: [`throttled`] named it already — a
/// throttled thread waits in the run queue too), or the waits do not line up.
///
/// `tail`: where the tail the verdict is about starts in the c=N run and its percentile's
/// name (`(8_350, "p99.9")`), when it is not the p99 — the slowest requests are then those:
/// a CPU held for 9 ms three times in a run stalls the p99.9, not the p99.
pub(super) fn contention(
    x: &Facts<'_>,
    host: &HostReport,
    throttled: bool,
    tail: Option<(u64, &str)>,
) -> Option<Contention> {
    let th = host.threads.get()?;
    if th.timeline.is_empty() || throttled {
        return None;
    }
    let run = x.cn?;
    let (slow, p50) = slow_intervals(run, tail.map(|t| t.0))?;
    let label = tail.map_or("p99", |t| t.1);
    // The blocks timed one by one, or the long ones a report read back carries.
    let blocks = host
        .offcpu
        .get()
        .and_then(|o| LongRunQueueWaits::new(o, p50.max(1)));
    let mut waited: Vec<u64> = Vec::new();
    let mut excess: Vec<u64> = Vec::new();
    for &(s, e) in &slow {
        let ex = (e - s).saturating_sub(p50);
        excess.push(ex);
        // Timed one by one, the waits are read: one thread's waits within the request. The
        // samples' density (a 100 ms interval's wait spread over it) would dilute a single
        // 14 ms stall into a few ms; it stands in only where no block was timed.
        let (w, held) = match &blocks {
            Some(b) => {
                let w = b.within(s, e);
                (w, w * 2 >= ex)
            }
            None => {
                let w = waited_within(&th.timeline, s, e);
                let long = long_enough(stretch_within(&th.timeline, s, e), ex / 2);
                (w, w * 2 >= ex && long)
            }
        };
        if ex > 0 && held {
            waited.push(w);
        }
    }
    let aligned = waited.len();
    excess.sort_unstable();
    waited.sort_unstable();
    let added_us = excess.get(excess.len() / 2).copied().unwrap_or(0);
    if (aligned as f64) < MIN_ALIGNED_SHARE * slow.len() as f64 || added_us < MATERIAL_ADDED_US {
        return None;
    }
    let cpu = host.cpu.get();
    // The CPUs were the kernel's: its receive softirq held more of them than any process
    // did (ksoftirqd runs that same work) — the kernel's packet processing. With the
    // server's packets queued behind it, kernel-stack names it from the queue; without,
    // from the threads' wait here.
    let softirq = x.softirq_held_cpus();
    if softirq.is_some() && x.softirq_queue().is_some() {
        return None;
    }
    // The measurement's own when this lagtrace may run where the server runs and used at
    // least as much CPU as every other process together. (Not the threads' summed wait
    // against the others' CPU: two workers waiting behind one task count its time twice.)
    let own = softirq.is_none() && cpu.is_none_or(|c| c.own_shares_cpus && c.own_us >= c.others_us);
    let total = run.waits.as_ref().map_or(0, |w| w.count);
    let text = format!(
        "the server's {} threads waited {} for a CPU over the window ({} of their runnable time, ~{} each time); {aligned} of the {} slowest requests (≥ {label}) fall where they waited at least half their excess (median wait in a slow request ~{}, median excess +{}){}",
        th.threads,
        ms(th.wait_us),
        pct(th.wait_share),
        ms(th.wait_us / th.timeslices.max(1)),
        slow.len(),
        ms(waited.get(waited.len() / 2).copied().unwrap_or(0)),
        ms(added_us),
        cpu.map(cpu_users).unwrap_or_default()
    );
    let others = cpu
        .map(|c| {
            c.top
                .iter()
                .map(|p| format!("{} (pid {}, {})", p.comm, p.pid, ms(p.cpu_us)))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|t| !t.is_empty())
        .map(|t| format!(" — the largest: {t}"))
        .unwrap_or_default();
    if let Some(k) = softirq {
        let busiest = k
            .cpus
            .first()
            .map(|c| {
                format!(
                    "CPU {} spent {} of the window in it ({} packets",
                    c.cpu,
                    pct(c.rx_share),
                    c.rx_packets
                )
            })
            .unwrap_or_default();
        let each = k
            .rx_ns_per_packet
            .map(|n| format!(", ~{} each", ms(n / 1000)))
            .unwrap_or_default();
        let held = format!(
            "the kernel's receive softirq held the CPUs the server waits for: {} on all CPUs \
             over {}, more than any process; {busiest}{each}){}",
            ms(k.rx_us),
            ms(k.window_us),
            if k.ksoftirqd_us > 0 {
                format!(
                    "; ksoftirqd ran {} (the softirq's work deferred to a thread, it kept \
                     coming)",
                    ms(k.ksoftirqd_us)
                )
            } else {
                String::new()
            }
        );
        let direct = Direct {
            cause: Cause::KernelStack,
            mechanism: Mechanism::SoftirqSaturated,
            evidence: vec![
                sup(LayerName::Host, Cause::KernelStack, text.clone()),
                sup(LayerName::Host, Cause::KernelStack, held),
            ],
            fix: softirq_saturated_fix(Some(k)),
            added_us,
            share: aligned as f64 / total.max(1) as f64,
            counted: Some((aligned as u64, Some(total))),
        };
        return Some(Contention { own, text, direct });
    }
    let direct = Direct {
        cause: Cause::SlowServer,
        mechanism: Mechanism::CpuContention,
        evidence: vec![sup(LayerName::Host, Cause::SlowServer, text.clone())],
        fix: Fix {
            side: FixSide::Server,
            location: None,
            change: format!(
                "other work on the server's host holds the CPUs its threads wait for{others}: give the server CPUs of its own (cpuset, CPUAffinity), lower the others' priority (nice, CPUWeight) or move them to another host"
            ),
            tradeoff: Some("CPUs reserved for the server are taken from the rest".into()),
        },
        added_us,
        share: aligned as f64 / total.max(1) as f64,
        counted: Some((aligned as u64, Some(total))),
    };
    Some(Contention { own, text, direct })
}

/// Who used the host's CPUs, as a clause of the contention line.
fn cpu_users(c: &HostCpu) -> String {
    format!(
        "; the host's {} CPUs were {} busy: this lagtrace (load generator, capture) {}, the server {}, other processes {}, not attributed (interrupts, exited processes) {}",
        c.cpus,
        pct(c.busy_share),
        ms(c.own_us),
        ms(c.watched_us),
        ms(c.others_us),
        ms(c.unattributed_us)
    )
}

/// The listener on the target's port.
fn target_listener(host: &HostReport, port: u16) -> Option<&ListenerQueue> {
    let suffix = format!(":{port}");
    host.listeners
        .get()?
        .iter()
        .filter(|l| l.local.ends_with(&suffix))
        .max_by_key(|l| host.listen_drops(l))
}

/// `accept-queue-overflow`: the target's listener dropped as many connections as connects
/// waited for a SYN retransmission.
pub(super) fn overflow(x: &Facts<'_>, host: &HostReport, target: &Target) -> Option<Direct> {
    let l = target_listener(host, target.port)?;
    let drops = host.listen_drops(l);
    let overflows = host.counter("TcpExt.ListenOverflows");
    let run = x.cn?;
    let c = run.connects.as_ref()?;
    let waited = c.syn_retransmitted + c.failed;
    if drops == 0 || waited == 0 || drops * 2 < waited {
        return None;
    }
    if l.full_samples == 0 && overflows == 0 {
        return None;
    }
    let text = format!(
        "listener {} (accept queue limit {}, peak {}, full in {} of {} samples) dropped {} \
         connections during {} (namespace TcpExt.ListenOverflows +{}): enough for \
         the {} connects that waited for a SYN retransmission or failed",
        l.local,
        l.max,
        l.peak,
        l.full_samples,
        l.samples,
        drops,
        run.run_name(),
        overflows,
        waited
    );
    Some(Direct {
        cause: Cause::SynDrop,
        mechanism: Mechanism::AcceptQueueOverflow,
        evidence: vec![sup(LayerName::Host, Cause::SynDrop, text)],
        fix: Fix {
            side: FixSide::Server,
            location: Some(l.local.clone()),
            change: format!(
                "the accept queue of {} (limit {}) overflows: raise the server's listen \
                 backlog and net.core.somaxconn, and accept faster (more acceptor \
                 threads/workers)",
                l.local, l.max
            ),
            tradeoff: None,
        },
        added_us: c.time.p99_us,
        // Weighed by requests, like the records' SYN waits: a connect is one request.
        share: waited as f64 / run.waits.as_ref().map_or(c.attempts, |w| w.count).max(1) as f64,
        counted: Some((waited, Some(c.attempts))),
    })
}

/// SYNs a flood must have had dropped for `syn-flood` when none of the load's own connects
/// waited: the queue frees in bursts (half-open connections created together expire
/// together) and a run's few connects, made at once, may all land in one — a run-to-run
/// coin toss that must not flip the verdict while the host shows the flood dropping SYNs.
pub(super) const FLOOD_DROPS: u64 = 100;

/// `syn-drop` / `syn-flood`: the target's listener held a SYN queue flooded from many
/// sources ([`Facts::flood`]) and the kernel dropped SYNs with it full, syncookies off — as
/// many as half the connects that waited for a SYN retransmission or failed, or, when none
/// of this run's connects waited, at least [`FLOOD_DROPS`]: real clients' SYNs are among
/// them. A listener overflowing under one client's own burst (one source) is
/// `accept-queue-overflow` or plain `syn-drop`, not this.
pub(super) fn syn_flood(x: &Facts<'_>, target: &Target) -> Option<Direct> {
    let f = x.flood(target.port)?;
    let (run, c) = x.connects_run()?;
    let waited = c.syn_retransmitted + c.failed;
    let enough = if waited == 0 {
        f.dropped >= FLOOD_DROPS
    } else {
        f.dropped * 2 >= waited
    };
    if !enough {
        return None;
    }
    let text = f.line(&if waited > 0 {
        format!(
            "during {}: enough for the {waited} connects that waited for a SYN \
             retransmission or failed",
            run.run_name()
        )
    } else {
        format!(
            "during {}; its {} connects found room as the queue freed, but a \
             client whose SYN is dropped waits at least 1 s for its retransmission",
            run.run_name(),
            c.attempts
        )
    });
    Some(Direct {
        cause: Cause::SynDrop,
        mechanism: Mechanism::SynFlood,
        evidence: vec![sup(LayerName::Host, Cause::SynDrop, text)],
        fix: f.fix(),
        // A dropped SYN's client waits for the first retransmission (1 s) at least.
        added_us: if waited > 0 { c.time.p99_us } else { 1_000_000 },
        // Weighed by requests, like the records' SYN waits: a connect is one request.
        share: waited as f64 / run.waits.as_ref().map_or(c.attempts, |w| w.count).max(1) as f64,
        counted: Some((waited, Some(c.attempts))),
    })
}

/// A SYN flood at the listener on a healthy verdict (a note): absorbed with syncookies
/// (`TcpExt.TCPReqQFullDoCookies` moved: cookies kept connection setup quick), or with
/// cookies off dropping fewer SYNs than [`FLOOD_DROPS`] over the window.
pub(super) fn flood_note(x: &Facts<'_>, target: &Target) -> Option<EvidenceLine> {
    let f = x.flood(target.port)?;
    let head = format!(
        "listener {}: {} half-open connections from {} distinct sources at the fullest sample \
         (a SYN flood)",
        f.listener.local, f.peak, f.sources
    );
    let text = if f.cookies > 0 {
        format!(
            "{head} and {} SYNs answered with syncookies (TcpExt.TCPReqQFullDoCookies) with the \
             queue full: the cookies kept connection setup quick",
            f.cookies
        )
    } else if f.dropped > 0 {
        format!(
            "{head} and {} SYNs dropped with the queue full and syncookies off \
             (TcpExt.TCPReqQFullDrop): few, but real clients' may be among them — set \
             net.ipv4.tcp_syncookies=1",
            f.dropped
        )
    } else {
        return None;
    };
    Some(note(LayerName::Host, text))
}

/// `kernel-stack` / `conntrack`: the namespace's connection tracking lost packets of new
/// connections in the window (dropped with its table full, or not inserted), as many as
/// half the connects that waited for a SYN retransmission or failed. Each such SYN is
/// dropped in the kernel before any socket sees it: no listener overflows, no rule drops
/// it on purpose.
pub(super) fn conntrack(x: &Facts<'_>, host: &HostReport, target: &Target) -> Option<Direct> {
    let ct = host.conntrack.get()?;
    let lost = ct.lost();
    let run = x.cn?;
    let c = run.connects.as_ref()?;
    let waited = c.syn_retransmitted + c.failed;
    if lost == 0 || waited == 0 || lost * 2 < waited {
        return None;
    }
    let fill = match (ct.peak.or(ct.count), ct.max) {
        (Some(n), Some(m)) => format!("{n} of its {m} entries at the most"),
        (Some(n), None) => format!("{n} entries"),
        _ => "its fill unknown".into(),
    };
    let text = format!(
        "connection tracking in the server's namespace lost {lost} packets of new connections \
         during {} (`conntrack -S`: drop +{}, insert_failed +{}, early_drop +{}; the \
         table {fill}): enough for the {waited} connects that waited for a SYN \
         retransmission or failed",
        run.run_name(),
        ct.drop,
        ct.insert_failed,
        ct.early_drop
    );
    let max = ct
        .max
        .map_or("its size".to_string(), |m| format!("{m} entries"));
    Some(Direct {
        cause: Cause::KernelStack,
        mechanism: Mechanism::Conntrack,
        evidence: vec![sup(LayerName::Host, Cause::KernelStack, text)],
        fix: Fix {
            side: FixSide::Server,
            location: Some("net.netfilter.nf_conntrack_max".into()),
            change: format!(
                "the connection tracking table ({max}) drops new connections: raise \
                 net.netfilter.nf_conntrack_max (and nf_conntrack_buckets) on the server's \
                 host, shorten how long closed connections stay tracked \
                 (net.netfilter.nf_conntrack_tcp_timeout_time_wait), or stop tracking the \
                 server's port: `tcp dport {} notrack` in a prerouting chain at priority raw",
                target.port
            ),
            tradeoff: Some(
                "untracked traffic no longer matches `ct state` rules (stateful firewalling, \
                 NAT) on that port"
                    .into(),
            ),
        },
        added_us: c.time.p99_us,
        // Weighed by requests, like the records' SYN waits: a connect is one request.
        share: waited as f64 / run.waits.as_ref().map_or(c.attempts, |w| w.count).max(1) as f64,
        counted: Some((waited, Some(c.attempts))),
    })
}

/// Run-queue delay of the server's threads beyond the time the cgroup was throttled: a
/// busy host, as a note (it slows every request a little, not a tail on its own).
pub(super) fn busy_note(host: &HostReport) -> Option<EvidenceLine> {
    let t = host.threads.get()?;
    let throttled = host.cgroup.get().map_or(0, |c| c.throttled_us);
    let wait = t.wait_us.saturating_sub(throttled);
    let share = wait as f64 / (t.run_us + wait).max(1) as f64;
    (wait >= host.window_us / 100 && share >= 0.05).then(|| {
        note(
            LayerName::Host,
            format!(
                "the server's {} threads waited {} for a CPU beyond cgroup throttling ({} of \
                 their runnable time): the host is busy",
                t.threads,
                ms(wait),
                pct(share)
            ),
        )
    })
}

/// Merges what the host layer shows into the candidates: the mechanism, its evidence and its
/// fix go to the candidate of the same cause, or become one.
/// `tail_loss`: the tail's largest part is loss recovery.
pub(super) fn adopt(
    x: &Facts<'_>,
    target: &Target,
    cands: &mut Vec<Candidate>,
    dropped: Option<Direct>,
) {
    let Some(host) = x.host else {
        return;
    };
    let direct = [
        throttled(x, host),
        overflow(x, host, target),
        // After the overflow: with a flood's evidence (many sources) it is the more
        // specific account of the same drops.
        syn_flood(x, target),
        conntrack(x, host, target),
        // The mechanism follows the larger share: when netfilter's drops on the way in
        // explain more lost segments than the segments held or sent late on the way out,
        // the output side's few (one late response can be a probe timer's) do not name it.
        dropped.filter(|d| {
            let out = d.counted.map_or(0, |(n, _)| n);
            input_loss(x, host).is_none_or(|(lost, _, _)| lost <= out)
        }),
    ];
    for d in direct.into_iter().flatten() {
        merge(cands, d);
    }
    yield_syn_waits_to_conntrack(cands);
    netfilter_syns(x, host, target, cands);
    netfilter_input(x, host, target, cands);
    yield_inferred_cork(cands);
    cands.sort_by(|a, b| b.impact_us.total_cmp(&a.impact_us));
}

/// The mechanism, evidence and fix of `d` go to the candidate of the same cause, or become
/// one.
pub(super) fn merge(cands: &mut Vec<Candidate>, d: Direct) {
    // The layers its evidence comes from (the host's, and the packets' where they show
    // the same mechanism).
    let mut layers: Vec<LayerName> = d.evidence.iter().map(|e| e.layer).collect();
    layers.sort();
    layers.dedup();
    match cands.iter_mut().find(|c| c.cause == d.cause) {
        Some(c) => {
            c.evidence.extend(d.evidence);
            for l in layers {
                if !c.layers.contains(&l) {
                    c.layers.push(l);
                }
            }
            c.direct = true;
            c.mechanism = Some(d.mechanism);
            c.host_fix = Some(d.fix);
        }
        None => {
            let mut c = Candidate::new(d.cause, d.added_us, d.share, layers);
            c.counted = d.counted;
            c.evidence = d.evidence;
            c.mechanism = Some(d.mechanism);
            c.host_fix = Some(d.fix);
            cands.push(c);
        }
    }
}

/// Netfilter drops in the server's namespace a `syn-drop` needs before they name it: as
/// many as half the connects that waited for a SYN retransmission or failed.
const NETFILTER_SHARE_OF_WAITS: u64 = 2;

/// `syn-drop` / `dropped-by-netfilter`: the connects waited for SYN retransmissions (a
/// `syn-drop` candidate with no mechanism: no listener overflowed, no flood, no conntrack
/// table) and netfilter in the server's own namespace dropped at least half as many packets
/// over the window (`skb:kfree_skb` reason `NETFILTER_DROP`, counted per namespace). A
/// machine-wide count is another namespace's as likely, and names nothing.
fn netfilter_syns(x: &Facts<'_>, host: &HostReport, target: &Target, cands: &mut [Candidate]) {
    let Some(c) = cands
        .iter_mut()
        .find(|c| c.cause == Cause::SynDrop && c.mechanism.is_none())
    else {
        return;
    };
    let Some((dropped, on)) = netfilter_drops(host) else {
        return;
    };
    let Some((run, conn)) = x.connects_run() else {
        return;
    };
    let waited = conn.syn_retransmitted + conn.failed;
    if waited == 0 || dropped * NETFILTER_SHARE_OF_WAITS < waited {
        return;
    }
    c.evidence.push(sup(
        LayerName::Host,
        Cause::SynDrop,
        format!(
            "netfilter dropped {dropped} packets in the server's namespace (skb:kfree_skb \
             reason NETFILTER_DROP{on}) while {waited} of the {} connects of {} waited \
             for a SYN retransmission or failed: a firewall rule on the server's host drops \
             connection attempts",
            conn.attempts,
            run.run_name()
        ),
    ));
    named_by_host(
        c,
        Mechanism::DroppedByNetfilter,
        Fix {
            side: FixSide::Server,
            location: None,
            change: format!(
                "a netfilter rule on the server's host drops connection attempts to port {}: find \
             it (`nft list ruleset`, `iptables -S`; rate limits such as `limit rate`, \
             `hashlimit`, `connlimit`, or a drop matching the port or SYN flags) and let the \
             clients' SYNs through, or raise its limit above their rate",
                target.port
            ),
            tradeoff: Some(
                "a rate limit that protects the server from floods: raise it rather than remove \
             it, and keep syncookies on"
                    .into(),
            ),
        },
    );
}

/// Netfilter's drops in the server's own namespace (`skb:kfree_skb` reason
/// `NETFILTER_DROP`, counted per namespace), with the devices they were on as text; none
/// when there were none or the count is machine-wide (another namespace's as likely).
fn netfilter_drops(host: &HostReport) -> Option<(u64, String)> {
    let d = host.drops.get().filter(|d| d.scope == "namespace")?;
    let dropped: u64 = d
        .reasons
        .iter()
        .filter(|r| r.reason == "NETFILTER_DROP")
        .map(|r| r.count)
        .sum();
    let devices: Vec<String> = d
        .devices
        .iter()
        .filter(|v| v.reasons.iter().any(|r| r.reason == "NETFILTER_DROP"))
        .filter_map(|v| v.device.clone())
        .collect();
    let on = if devices.is_empty() {
        String::new()
    } else {
        format!(", on {}", devices.join(", "))
    };
    (dropped > 0).then_some((dropped, on))
}

/// The clients' segments lost after the server's capture point, and netfilter's drops in
/// the server's namespace (with their devices) when they are at least half as many.
fn input_loss(x: &Facts<'_>, host: &HostReport) -> Option<(u64, u64, String)> {
    let lost = x.inbound_lost()?.count;
    let (dropped, on) = netfilter_drops(host)?;
    (dropped * 2 >= lost).then_some((lost, dropped, on))
}

/// `packet-loss` / `dropped-by-netfilter` on the way in: the clients' segments passed the
/// server's capture point and were lost after it (`packets.inbound_lost`: resent, the
/// second copy acknowledged as new data), and netfilter in the server's namespace dropped
/// at least half as many packets. Netfilter's count does not say which way a packet went;
/// the packets do: an output drop never reaches the capture (`dropped-before-wire`).
fn netfilter_input(x: &Facts<'_>, host: &HostReport, target: &Target, cands: &mut [Candidate]) {
    let Some(c) = cands
        .iter_mut()
        .find(|c| c.cause == Cause::PacketLoss && c.mechanism.is_none())
    else {
        return;
    };
    let Some((lost, dropped, on)) = input_loss(x, host) else {
        return;
    };
    // Placed in time: the requests that waited for a loss recovery waited through the
    // netfilter drops (else the rule dropped other traffic at other times).
    let when = x.cn.and_then(|run| {
        let recs = run.records.as_ref()?;
        let j = super::facts::join_of(x, run)?;
        let lossy = j
            .requests
            .iter()
            .enumerate()
            .filter(|(_, p)| p.loss_us > 0)
            .map(|(i, _)| i);
        waited_through_drops(host, &["NETFILTER_DROP"], recs, lossy)
    });
    if when.is_some_and(|t| t.elsewhere()) {
        return;
    }
    c.evidence.push(sup(
        LayerName::Host,
        Cause::PacketLoss,
        format!(
            "netfilter dropped {dropped} packets in the server's namespace over {} \
             (skb:kfree_skb reason NETFILTER_DROP{on}), enough for the {} client segments \
             lost after the capture point: a rule on the server host's input path drops them",
            ms(host.window_us),
            lost
        ),
    ));
    if let Some(t) = when.filter(|t| t.of > 0) {
        c.evidence.push(sup(
            LayerName::Host,
            Cause::PacketLoss,
            t.text("requests that waited for a loss recovery"),
        ));
    }
    named_by_host(
        c,
        Mechanism::DroppedByNetfilter,
        Fix {
            side: FixSide::Server,
            location: Some("netfilter input path".into()),
            change: format!(
                "a netfilter rule on the server's host drops the clients' segments to port {} \
             on their way in: find it with `nft list ruleset` / `iptables -S` (a rule on the \
             input or prerouting hook with drop, numgen, limit, quota or a length match) and \
             remove or narrow it",
                target.port
            ),
            tradeoff: None,
        },
    );
}

/// The host layer names `c`'s mechanism directly (its evidence already pushed), with the fix.
fn named_by_host(c: &mut Candidate, mechanism: Mechanism, fix: Fix) {
    if !c.layers.contains(&LayerName::Host) {
        c.layers.push(LayerName::Host);
    }
    c.direct = true;
    c.mechanism = Some(mechanism);
    c.host_fix = Some(fix);
}

/// SYN waits that connection tracking's drops explain are its symptom, not a cause of their
/// own: a `syn-drop` candidate with no mechanism of its own (no listener overflowed) gives
/// its evidence to `kernel-stack` / `conntrack` and leaves.
fn yield_syn_waits_to_conntrack(cands: &mut Vec<Candidate>) {
    let Some(ct) = cands
        .iter()
        .position(|c| c.mechanism == Some(Mechanism::Conntrack))
    else {
        return;
    };
    let Some(syn) = cands
        .iter()
        .position(|c| c.cause == Cause::SynDrop && c.mechanism.is_none())
    else {
        return;
    };
    let s = cands.remove(syn);
    let ct = if syn < ct { ct - 1 } else { ct };
    let c = &mut cands[ct];
    for l in s.layers {
        if !c.layers.contains(&l) {
            c.layers.push(l);
        }
    }
    c.evidence.extend(s.evidence);
    if s.impact_us > c.impact_us {
        c.impact_us = s.impact_us;
    }
}

/// Direct evidence wins: a `tcp-cork` candidate inferred from packets alone (the sockets
/// layer did not read TCP_CORK on) yields to the host's throttling aligned with the slow
/// requests, or to its drops before the wire. A throttled server answers late, and a
/// response it writes in pieces after a stall looks held like a cork's; a segment dropped
/// locally waits for the probe timer, the very timer that ends a cork's 200 ms hold.
/// TCP_CORK read on the sockets is itself direct, and then the cork candidate keeps its
/// place.
fn yield_inferred_cork(cands: &mut Vec<Candidate>) {
    let direct = |c: &Candidate| {
        matches!(
            c.mechanism,
            Some(Mechanism::CpuThrottled | Mechanism::DroppedBeforeWire)
        )
    };
    let Some(i) = cands
        .iter()
        .position(|c| c.cause == Cause::TcpCork && !c.layers.contains(&LayerName::Sockets))
    else {
        return;
    };
    if !cands.iter().any(direct) {
        return;
    }
    let cork = cands.remove(i);
    let Some(w) = cands.iter_mut().find(|c| direct(c)) else {
        return;
    };
    let why = if w.mechanism == Some(Mechanism::CpuThrottled) {
        "its cgroup was throttled while the slowest requests waited: the throttling holds them"
    } else {
        "the host dropped its segments before the wire: a dropped segment waits for the same \
         probe timer that ends a cork's hold"
    };
    w.evidence.push(out(
        LayerName::Packets,
        Cause::TcpCork,
        format!(
            "responses held ~{} look corked in the packets, but the server's sockets were not \
             seen with TCP_CORK on and {why}",
            ms(cork.added_us)
        ),
    ));
}

/// The cost in the user's terms of a candidate only the host layer shows.
pub(super) fn cost_text(c: &Candidate) -> Option<String> {
    if c.mechanism == Some(Mechanism::DroppedBeforeWire) {
        let (n, of) = c.counted?;
        let of = of.map(|o| format!(" of {o}")).unwrap_or_default();
        return Some(format!(
            "{n}{of} transactions wait ~{} for a segment the server host dropped before the \
             wire (sent again on the client's next ACK or at the probe timer)",
            ms(c.added_us)
        ));
    }
    if c.mechanism == Some(Mechanism::Conntrack) {
        let (n, of) = c.counted?;
        return Some(format!(
            "{n} of {} connects wait for a SYN retransmission or fail: connection tracking \
             drops them (p99 connect {})",
            of.unwrap_or(0),
            ms(c.added_us)
        ));
    }
    if c.layers != [LayerName::Host] {
        return None;
    }
    let (n, of) = c.counted?;
    Some(match c.mechanism? {
        Mechanism::CpuThrottled => format!(
            "{n} of {} requests (the slowest) wait ~{} more while the server's cgroup is \
             throttled",
            of.unwrap_or(0),
            ms(c.added_us)
        ),
        Mechanism::AcceptQueueOverflow => format!(
            "{n} of {} connects wait for a SYN retransmission or fail: the accept queue \
             overflows (p99 connect {})",
            of.unwrap_or(0),
            ms(c.added_us)
        ),
        Mechanism::SynFlood if n == 0 => format!(
            "none of this run's {} connects waited, but a SYN flood fills the SYN queue and \
             its dropped SYNs include real clients': each waits at least 1 s",
            of.unwrap_or(0)
        ),
        Mechanism::SynFlood => format!(
            "{n} of {} connects wait for a SYN retransmission or fail: a SYN flood fills the \
             SYN queue (p99 connect {})",
            of.unwrap_or(0),
            ms(c.added_us)
        ),
        Mechanism::CpuContention => format!(
            "{n} of {} requests (the slowest) wait ~{} more while the server's threads wait \
             for a CPU other work on its host holds",
            of.unwrap_or(0),
            ms(c.added_us)
        ),
        // From the threads' wait (the queue-based candidate has no count: its own text).
        Mechanism::SoftirqSaturated => format!(
            "{n} of {} requests (the slowest) wait ~{} more while the server's threads wait \
             for a CPU the kernel's receive softirq holds",
            of.unwrap_or(0),
            ms(c.added_us)
        ),
        _ => return None,
    })
}
