//! Where a slow server's own time goes: the host layer's off-CPU blocks that lie inside the
//! requests' server time (`layers.host.offcpu.during_requests`), and the CPU each request
//! costs. It names the mechanism of a `slow-server` verdict when one of them holds at
//! least half of the server time:
//!
//! - `sleep`: the server's threads sleep (`nanosleep`) inside the server time;
//! - `lock-wait`: they wait on a futex (a lock, a condition variable, a semaphore) — a
//!   worker idle *between* requests waits across them and is no part of any;
//! - `disk-io`: they are blocked on block I/O (`io_schedule`);
//! - `on-cpu`: the processes' CPU time per request (over the window, divided by the
//!   requests served) is at least half the server's own time per request (its time at
//!   c=1, before any queueing). A server quick alone that queues under load is never
//!   named on-cpu: a busy event loop may be doing the work the load asks for (copying
//!   megabytes) or work a fix removes (a TLS handshake per request), and only on-CPU stacks
//!   would tell. It comes first: a CPU-bound server under load queues its
//!   requests behind each other's work, and where threads share an interpreter lock
//!   (Python's GIL) that queue is a futex — the waits are then the CPU work's queue.
//!
//! Below half, the split is evidence without a mechanism; so is a split where the serving
//! thread waited mostly in the run queue (the host's CPUs were busy: the host rules say
//! whose work held them, `cpu-contention` or the measurement's own). Waits in `epoll_wait`/`poll`
//! inside the server time (an event loop's timer, or an upstream's reply not yet there)
//! are said as such, never named a mechanism: the kernel stack cannot tell a timer from a
//! descriptor that was not ready. Who ended them can: when one command's processes woke
//! the serving thread out of most of that wait (`sched:sched_waking`, in the waker's
//! context), the server waited on them — an upstream on this host answering on a Unix or
//! loopback socket or a pipe (php-fpm behind nginx) — and the verdict names that process
//! as the hop where the time goes ([`Woken`]).

use lagtrace_model::Cause;
use lagtrace_model::host::{ServerTimePart, ServerTimeSplit, WaitClass};

use super::facts::Facts;
use super::{DOMINANT_SERVER_US, ms, pct, sup};
use crate::evidence::LayerName;
use crate::verdict::{EvidenceLine, Fix, FixSide, Mechanism};

/// A class must hold this share of the server time to name the mechanism.
pub(super) const MIN_SHARE: f64 = 0.5;
/// A split of fewer requests says nothing.
const MIN_REQUESTS: u64 = 5;

/// What the split shows about a slow server: its evidence line, and the mechanism with
/// its fix when one class holds most of the server time.
pub(super) struct Split {
    pub(super) line: EvidenceLine,
    pub(super) named: Option<(Mechanism, Fix)>,
    /// The process the server waited on, with the fix on its side.
    pub(super) woken: Option<(Woken, Fix)>,
    /// The waits for a descriptor (epoll/poll, a socket read, a pipe) when they hold at
    /// least [`MIN_SHARE`] of the server time and no process of this host ended them: each
    /// request's part, µs.
    pub(super) descriptor_us: Option<u64>,
}

/// The process whose wake-ups ended most of the serving thread's waits for a descriptor
/// (epoll/poll, a socket read, a pipe) inside the server time: what the server waited on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Woken {
    /// The one (of its command's processes) that woke the most.
    pub(super) pid: u32,
    pub(super) comm: String,
    /// Processes with that command that woke it (a pool's workers).
    pub(super) processes: u32,
    /// Its part of each request's server time, µs, and of the server time.
    pub(super) each_us: u64,
    pub(super) share: f64,
}

/// One command's wake-ups must have ended at least this share of the wait to name it.
const WAKER_SHARE: f64 = 2.0 / 3.0;

/// The waits for a descriptor that hold at least [`MIN_SHARE`] of the server time, and the
/// command whose processes ended at least [`WAKER_SHARE`] of them — not the server's
/// process nor lagtrace (whose requests arrive on the same sockets), nor an unnamed waker (an
/// interrupt's, or one that exited).
fn woken(s: &ServerTimeSplit, x: &Facts<'_>) -> Option<Woken> {
    let server = x.sockets.and_then(|s| s.server.as_ref());
    let p: &ServerTimePart = s
        .parts
        .iter()
        .filter(|p| is_descriptor(p.class))
        .max_by(|a, b| a.share.total_cmp(&b.share))?;
    if p.share < MIN_SHARE || p.us == 0 {
        return None;
    }
    // The server's own processes are left out where the wake-ups are counted (a worker
    // woken by its master); one with its command is another program (a Python backend
    // behind a Python front).
    let w = p.woken_by.iter().find(|w| {
        !w.comm.is_empty()
            && !w.comm.starts_with("lagtrace")
            && server.is_none_or(|s| s.pid != w.pid)
    })?;
    if (w.us as f64) < WAKER_SHARE * p.us as f64 {
        return None;
    }
    let share = (w.us as f64 / s.server_us.max(1) as f64).min(1.0);
    Some(Woken {
        pid: w.pid,
        comm: w.comm.clone(),
        processes: w.processes,
        each_us: w.us / s.requests.max(1),
        share,
    })
}

/// The descriptor waits' part of each request's server time, when they hold at least
/// [`MIN_SHARE`] of it.
fn descriptor_wait(s: &ServerTimeSplit) -> Option<u64> {
    let share: f64 = s
        .parts
        .iter()
        .filter(|p| is_descriptor(p.class))
        .map(|p| p.share)
        .sum();
    (share >= MIN_SHARE).then(|| ((s.server_us / s.requests.max(1)) as f64 * share.min(1.0)) as u64)
}

fn is_descriptor(c: WaitClass) -> bool {
    matches!(c, WaitClass::Poll | WaitClass::SocketRead | WaitClass::Pipe)
}

/// Plain words for a class in a sentence.
fn doing(c: WaitClass) -> &'static str {
    match c {
        WaitClass::RunQueue => "waiting for a CPU (run queue)",
        WaitClass::Disk => "blocked on disk I/O",
        WaitClass::Futex => "waiting on a futex (a lock)",
        WaitClass::Sleep => "asleep (nanosleep)",
        WaitClass::Poll => "waiting in epoll/poll (a timer, or a descriptor not ready)",
        WaitClass::Accept => "waiting in accept",
        WaitClass::SocketRead => "waiting to read a socket",
        WaitClass::SocketWrite => "waiting for room in a socket's send buffer",
        WaitClass::Pipe => "waiting on a pipe",
        WaitClass::Other => "blocked elsewhere in the kernel",
    }
}

fn frames_text(f: &[String]) -> String {
    if f.is_empty() {
        return String::new();
    }
    format!(
        " [{}]",
        f.iter().take(4).cloned().collect::<Vec<_>>().join(" < ")
    )
}

/// The split's line and, when one part dominates, the mechanism.
pub(super) fn split(x: &Facts<'_>) -> Option<Split> {
    let s: &ServerTimeSplit = x.host?.offcpu.get()?.during_requests.as_ref()?;
    if s.requests < MIN_REQUESTS || s.server_us == 0 {
        return None;
    }
    // Only a server slow before it answers, alone or under load: one that answers at once
    // and paces the response (`slow-server` from a slow transfer) has no server time worth
    // splitting.
    let own = x.server_own_us()?;
    if own < DOMINANT_SERVER_US && x.server_saturated().is_none() {
        return None;
    }
    let own = own.max(1);
    let per_request = s.server_us / s.requests;
    let cpu_share = s
        .cpu_per_request_us
        .map(|c| (c as f64 / per_request.max(1) as f64).min(1.0));
    // CPU per request against the server's own time (at c=1, without queueing). A server
    // quick alone that queues under load is named only for what its serving thread waited
    // on ([`Facts::server_saturated`]): never on-cpu.
    let saturated_only = x.server_own_us().is_some_and(|o| o < DOMINANT_SERVER_US);
    // The serving thread waited mostly for a CPU: the host's CPUs were the queue (the host
    // rules judge whose work held them), not the server's own work.
    let run_queue = s.share(WaitClass::RunQueue);
    let on_cpu = run_queue < MIN_SHARE
        && s.cpu_per_request_us
            .is_some_and(|c| c as f64 >= MIN_SHARE * own as f64)
        && !saturated_only;
    let mut parts: Vec<String> = s
        .parts
        .iter()
        .filter(|p| p.share >= 0.02)
        .map(|p| {
            format!(
                "{} {}{}",
                pct(p.share),
                doing(p.class),
                frames_text(&p.frames)
            )
        })
        .collect();
    if parts.is_empty() {
        parts.push("no block of its threads inside it".into());
    }
    let cpu = match (s.cpu_per_request_us, cpu_share) {
        (Some(c), Some(sh)) => format!(
            "; its threads' CPU time is ~{} per request ({} of the server time)",
            ms(c),
            pct(sh)
        ),
        _ => String::new(),
    };
    let woken = woken(s, x);
    let by = woken.as_ref().map_or(String::new(), |w| {
        format!(
            "; {} of the server time ended when {} (pid {}{}) woke it (sched_waking): the \
             server waited on that process",
            pct(w.share),
            w.comm,
            w.pid,
            if w.processes > 1 {
                format!(", one of {} with that name", w.processes)
            } else {
                String::new()
            }
        )
    });
    let line = sup(
        LayerName::Host,
        Cause::SlowServer,
        format!(
            "inside the server time of {} requests (~{} each; {} with their serving thread \
             found), that thread was {}{cpu}{by} (sched_switch: its blocks that began and \
             ended within the request's server time)",
            s.requests,
            ms(per_request),
            s.attributed,
            parts.join(", ")
        ),
    );
    let server = x.server_name();
    let top = s.largest_wait();
    let waits = top.map_or(0.0, |p| p.share);
    let named = if on_cpu {
        Some((
            Mechanism::OnCpu,
            format!(
                "{server} computes ~{} per request on a CPU (its own time is ~{}): profile \
                 it on-CPU (perf record -g -p PID, or a flame graph) for the function that \
                 costs it; more workers help only while CPUs are idle",
                ms(s.cpu_per_request_us.unwrap_or(0)),
                ms(own)
            ),
        ))
    } else if top.is_some() && waits >= MIN_SHARE {
        top.map(|p| {
            let each = ms((per_request as f64 * p.share) as u64);
            let at = frames_text(&p.frames);
            let (m, change) = match p.class {
                WaitClass::Sleep => (
                    Mechanism::Sleep,
                    format!(
                        "{server} sleeps ~{each} per request while the client waits{at}: a \
                         delay in the handler (a retry back-off, a rate limiter, a polling \
                         loop, a deliberate sleep) — remove it or make it conditional"
                    ),
                ),
                WaitClass::Futex => (
                    Mechanism::LockWait,
                    format!(
                        "{server}'s threads wait ~{each} per request on a futex{at}: the \
                         requests contend for a lock (a mutex around the handler, a pool, \
                         an interpreter lock such as Python's GIL) — hold it shorter, shard \
                         it, or serve from processes instead of threads"
                    ),
                ),
                _ => (
                    Mechanism::DiskIo,
                    format!(
                        "{server} is blocked ~{each} per request on disk I/O{at}: reads of \
                         data not in the page cache (or synchronous writes) — keep the data \
                         cached (memory, a warm-up), read it ahead, or use faster storage"
                    ),
                ),
            };
            (m, change)
        })
    } else {
        None
    };
    let woken = woken.map(|w| {
        let fix = Fix {
            side: FixSide::Server,
            location: Some(format!("{} (pid {})", w.comm, w.pid)),
            change: format!(
                "{server} waits ~{} per request for {} to answer: the time is spent there — \
                 profile {} (its handler, script or query) with its own tools, or run lagtrace \
                 on it",
                ms(w.each_us),
                w.comm,
                w.comm
            ),
            tradeoff: None,
        };
        (w, fix)
    });
    let descriptor_us = woken.is_none().then(|| descriptor_wait(s)).flatten();
    Some(Split {
        line,
        descriptor_us,
        woken,
        named: named.map(|(m, change)| {
            (
                m,
                Fix {
                    side: FixSide::Server,
                    location: None,
                    change,
                    tradeoff: None,
                },
            )
        }),
    })
}
