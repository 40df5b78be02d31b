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
//!   c=1, before any queueing). A server quick alone that queues under load is named
//!   on-cpu only when its on-CPU profile shows work a setting removes: its threads kept
//!   half a core busy with [`AVOIDABLE_SHARE`] of their samples in a library whose work is
//!   that (libcrypto: a TLS handshake per connection; libz: compression at a high level). A
//!   busy event loop may as well be doing the work the load asks for (copying megabytes:
//!   samples in the kernel), which is no fault. It comes first: a CPU-bound server under
//!   load queues its requests behind each other's work, and where threads share an
//!   interpreter lock (Python's GIL) that queue is a futex — the waits are then the CPU
//!   work's queue. Its fix names what the profile shows: the setting for avoidable work,
//!   else the hottest function (a symbol covers it) or its library (stripped).
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
use lagtrace_model::host::{OnCpu, ServerTimePart, ServerTimeSplit, WaitClass};

use super::facts::{AVOIDABLE_SHARE, Facts, Work, work_shares};
use super::{DOMINANT_SERVER_US, ms, pct, sup};
use crate::evidence::LayerName;
use crate::verdict::{EvidenceLine, Fix, FixSide, Mechanism};

/// The profile in a clause: the modules and the hottest named functions.
pub(super) fn profile_text(p: &OnCpu) -> String {
    let modules: Vec<String> = p
        .modules
        .iter()
        .filter(|m| m.share >= 0.05)
        .take(4)
        .map(|m| format!("{} {}", m.module, pct(m.share)))
        .collect();
    let functions: Vec<String> = p
        .functions
        .iter()
        .filter(|f| f.function.is_some() && f.share >= 0.03)
        .take(3)
        .map(|f| format!("{} {}", f.label(), pct(f.share)))
        .collect();
    let mut t = format!(
        "its threads' on-CPU samples ({} at {} Hz, ~{} of CPU) lie in {}",
        p.samples,
        p.hz,
        ms(p.samples * 1_000_000 / p.hz.max(1)),
        modules.join(", ")
    );
    if !functions.is_empty() {
        t.push_str(&format!(" (hottest functions: {})", functions.join(", ")));
    }
    t.push_str(" (CPU-clock samples; self time by innermost frame)");
    t
}

/// The fix for a server whose CPU goes to `work`, in the server's own terms (`comm`).
pub(super) fn work_fix(server: &str, comm: &str, work: Work, share: f64) -> String {
    let at = format!("{server} spends {} of its CPU samples", pct(share));
    match (work, comm) {
        (Work::Tls, "nginx") => format!(
            "{at} in TLS cryptography: a full handshake per connection costs milliseconds of \
             key exchange and signing — keep connections alive (keepalive_timeout above 0, \
             keep-alive on the clients), resume sessions (ssl_session_cache shared:SSL:10m; \
             ssl_session_tickets on), and prefer an ECDSA certificate (cheaper to sign with \
             than RSA)"
        ),
        (Work::Tls, "apache2" | "httpd") => format!(
            "{at} in TLS cryptography: a full handshake per connection costs milliseconds — \
             KeepAlive On, SSLSessionCache shmcb:logs/ssl_scache(512000) with SSLSessionTickets \
             on, and an ECDSA certificate (cheaper to sign with than RSA)"
        ),
        (Work::Tls, _) => format!(
            "{at} in TLS cryptography: a full handshake per connection costs milliseconds — \
             keep connections alive and resume TLS sessions (a session cache or tickets) so a \
             client pays one full handshake, not one per request; an ECDSA certificate is \
             cheaper to sign with than RSA"
        ),
        (Work::Compression, "nginx") => format!(
            "{at} compressing responses: lower gzip_comp_level to 1–4 (level 9 costs several \
             times level 1 for a few percent smaller output), or serve precompressed files \
             (gzip_static on)"
        ),
        (Work::Compression, "apache2" | "httpd") => format!(
            "{at} compressing responses: lower DeflateCompressionLevel to 1–4, or serve \
             precompressed files"
        ),
        (Work::Compression, _) => format!(
            "{at} compressing responses: lower the compression level, or compress static \
             content once ahead of time"
        ),
        (Work::Regex, _) => format!(
            "{at} in regular expressions: simplify or anchor them (in nginx, prefer prefix \
             locations to regex locations), or cache their results"
        ),
    }
}

/// The fix for a server computing on a CPU, from its profile: the avoidable work's setting,
/// else the hottest function (or, stripped, its library), with the flag that would name an
/// interpreter's or a JIT's frames.
fn on_cpu_fix(x: &Facts<'_>, server: &str, per_request: &str) -> String {
    let comm = x
        .sockets
        .and_then(|s| s.server.as_ref())
        .map_or("", |p| p.comm.as_str());
    let generic = format!(
        "{server} computes {per_request} on a CPU: profile it on-CPU (perf record -g -p PID, \
         or a flame graph) for the function that costs it; more workers help only while CPUs \
         are idle"
    );
    let Some(p) = x.profile() else {
        return generic;
    };
    if let Some((w, share)) = work_shares(p)
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|w| w.1 >= AVOIDABLE_SHARE)
    {
        return work_fix(server, comm, w, share);
    }
    // An interpreter's loop or unnamed JIT code: the script's functions are not in the
    // frames, and the flag that would put them there is the fix to the profile itself.
    if let Some(h) = &p.hint {
        let modules: Vec<String> = p
            .modules
            .iter()
            .filter(|m| m.share >= 0.1)
            .take(3)
            .map(|m| format!("{} {}", m.module, pct(m.share)))
            .collect();
        return format!(
            "{server} computes {per_request} on a CPU, in its runtime ({}): {h}; then \
             lagtrace names the function that costs it",
            modules.join(", ")
        );
    }
    match p.functions.first().filter(|f| f.share >= 0.1) {
        Some(f) if f.module == "[jit]" && f.function.is_none() => format!(
            "{server} computes {per_request} on a CPU, {} of it in code compiled in memory (a \
             JIT), which has no symbols",
            pct(f.share)
        ),
        Some(f) if f.function.is_some() => format!(
            "{server} computes {per_request} on a CPU, {} of it in {}: that is the code to make \
             cheaper (or to run less often: cache its result)",
            pct(f.share),
            f.label()
        ),
        Some(f) => format!(
            "{server} computes {per_request} on a CPU, {} of it in {}, which has no symbol \
             there (stripped): its debug symbols (the -dbgsym package, debuginfod) or perf \
             record -g name the function",
            pct(f.share),
            f.module
        ),
        None => generic,
    }
}

/// The fix for a server blocked on disk I/O: the limit on its cgroup that paced the reads
/// when one is set on a device that did I/O in the window (the device's own time per read
/// then short: the reads wait for the limit), else the device with the most I/O.
fn disk_fix(x: &Facts<'_>, server: &str, each: &str, at: &str) -> String {
    let base = format!("{server} is blocked ~{each} per request on disk I/O{at}");
    let cached = "keep the data cached (memory, a warm-up), read it ahead, or use faster storage";
    let Some(d) = x.host.and_then(|h| h.disks.get()) else {
        return format!(
            "{base}: reads of data not in the page cache (or synchronous writes) — {cached}"
        );
    };
    let limited = d.limits.iter().find_map(|l| {
        let dev = d.devices.iter().find(|v| v.dev == l.dev)?;
        let moved = if l.limit.starts_with("read") {
            dev.reads
        } else {
            dev.writes
        };
        (moved > 0).then_some((l, dev))
    });
    if let Some((l, dev)) = limited {
        let (what, unit) = match l.limit.as_str() {
            "read-iops" => ("reads", "reads/s"),
            "write-iops" => ("writes", "writes/s"),
            "read-bps" => ("reads", "B/s"),
            _ => ("writes", "B/s"),
        };
        let own = dev
            .per_read_us()
            .filter(|_| what == "reads")
            .map_or(String::new(), |u| {
                format!("; the device itself took ~{} per read", ms(u))
            });
        return format!(
            "{base}: its cgroup limits its {what} on {} ({}) to {} {unit} ({}){own} — the \
             requests wait for the limit, not the device: raise or remove it (write a higher \
             value, or 0 / max, to that file), or keep the data cached",
            dev.device, dev.dev, l.value, l.file
        );
    }
    match d.devices.first() {
        Some(dev) => format!(
            "{base}: the device with the most I/O over the window was {} ({}: {} reads, {} \
             writes{}) — reads of data not in the page cache (or synchronous writes): {cached}",
            dev.device,
            dev.dev,
            dev.reads,
            dev.writes,
            dev.per_read_us().map_or(String::new(), |u| format!(
                ", ~{} per read at the device",
                ms(u)
            ))
        ),
        None => format!(
            "{base}: reads of data not in the page cache (or synchronous writes) — {cached}"
        ),
    }
}

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

/// A split's parts of 2 % or more, as clauses (`96% asleep in do_nanosleep`).
fn parts_text(s: &ServerTimeSplit) -> Vec<String> {
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
    parts
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
    // Under load, quick alone: on-cpu only when the profile shows work a setting removes
    // (a TLS handshake per connection), never the work the load asks for (copying bytes).
    let on_cpu = run_queue < MIN_SHARE
        && if saturated_only {
            x.avoidable_cpu().is_some()
        } else {
            s.cpu_per_request_us
                .is_some_and(|c| c as f64 >= MIN_SHARE * own as f64)
        };
    let parts = parts_text(s);
    // What the slowest requests waited for, when it was timed apart (it may not be what
    // the median request waits for).
    let tail = x
        .host
        .and_then(|h| h.offcpu.get())
        .and_then(|o| o.during_slowest.as_ref())
        .filter(|t| t.split.requests >= MIN_REQUESTS)
        .map_or(String::new(), |t| {
            format!(
                "; in its slowest {} requests (server time {} or more, the p{}), {}",
                t.split.requests,
                ms(t.from_us),
                t.percentile,
                parts_text(&t.split).join(", ")
            )
        });
    let cpu = match (s.cpu_per_request_us, cpu_share) {
        (Some(c), Some(sh)) => format!(
            "; its threads' CPU time is ~{} per request ({} of the server time)",
            ms(c),
            pct(sh)
        ),
        _ => String::new(),
    };
    let profile = x
        .profile()
        .map_or(String::new(), |p| format!("; {}", profile_text(p)));
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
             ended within the request's server time){tail}{profile}",
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
        let per_request = match s.cpu_per_request_us {
            Some(c) => format!("~{} per request (its own time is ~{})", ms(c), ms(own)),
            None => format!("most of its own time (~{} per request)", ms(own)),
        };
        Some((Mechanism::OnCpu, on_cpu_fix(x, &server, &per_request)))
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
                _ => (Mechanism::DiskIo, disk_fix(x, &server, &each, &at)),
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
