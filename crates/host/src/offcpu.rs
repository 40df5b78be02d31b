//! Where the watched process's threads wait: a BPF program on `sched:sched_switch`
//! (bpf/offcpu.bpf.c) notes the kernel stack and state of each of their threads as it
//! leaves a CPU and times the block until it gets one again — summed in the kernel by
//! (process, stack, state), and the longer blocks sent one by one through a ring buffer.
//! Each stack is then named from `/proc/kallsyms` and classed ([`classify`]): run-queue,
//! disk, futex, sleep, poll, accept, socket read or write, pipe.
//!
//! Like `offcputime` (bcc), but only the watched processes' threads, aggregated in the
//! kernel, and with the blocks' times so `diagnose` can keep the ones inside a request's
//! server time ([`split`]).

use std::collections::{BTreeMap, HashMap};

use lagtrace_model::host::{
    OffCpu, OffCpuBlock, ServerTimePart, ServerTimeSplit, SlowestSplit, WaitClass, WaitStack,
    WaitTotal, WokenBy,
};

use crate::bpf::BpfError;

/// Blocks at least this long are timed one by one (shorter ones are summed only): a
/// request's server time worth splitting is longer.
pub const MIN_BLOCK_US: u64 = 50;
/// Blocks kept one by one at most (~32 B each); beyond, counted as missed.
pub const MAX_BLOCKS: usize = 400_000;
/// Kernel frames kept per stack.
const FRAMES: usize = 12;

/// The scheduler's own frames and the tracing machinery's, above the reason on a stack.
fn scheduler_frame(f: &str) -> bool {
    const PREFIXES: [&str; 12] = [
        "__schedule",
        "schedule",
        "preempt_schedule",
        "__cond_resched",
        "__traceiter_",
        "__bpf_trace",
        "bpf_",
        "perf_",
        "trace_call_bpf",
        "__perf",
        "__do_trace",
        "__probestub",
    ];
    PREFIXES.iter().any(|p| f.starts_with(p))
}

/// Why a thread that left its CPU in `state` (the tracepoint's `prev_state`: 0 runnable, 1
/// S, 2 D, ...) with `frames` (innermost first) on its kernel stack was off it.
pub fn classify(state: u64, frames: &[&str]) -> WaitClass {
    if state & 0xff == 0 {
        return WaitClass::RunQueue;
    }
    let has = |ps: &[&str]| frames.iter().any(|f| ps.iter().any(|p| f.starts_with(p)));
    if has(&[
        "io_schedule",
        "bit_wait_io",
        "folio_wait_bit",
        "wait_on_page_bit",
    ]) || (state & 2 != 0
        && has(&[
            "submit_bio_wait",
            "blk_",
            "filemap_",
            "__filemap_",
            "folio_wait",
            "__folio_lock",
            "ext4_",
            "xfs_",
            "btrfs_",
            "jbd2_",
        ]))
    {
        return WaitClass::Disk;
    }
    if has(&["futex_", "__futex"]) {
        return WaitClass::Futex;
    }
    if has(&[
        "do_nanosleep",
        "hrtimer_nanosleep",
        "common_nsleep",
        "__x64_sys_nanosleep",
        "__x64_sys_clock_nanosleep",
    ]) {
        return WaitClass::Sleep;
    }
    if has(&[
        "ep_poll",
        "do_epoll_wait",
        "do_select",
        "core_sys_select",
        "do_sys_poll",
        "do_poll",
    ]) {
        return WaitClass::Poll;
    }
    if has(&[
        "inet_csk_accept",
        "inet_csk_wait_for_connect",
        "unix_accept",
    ]) {
        return WaitClass::Accept;
    }
    if has(&[
        "sk_stream_wait_memory",
        "sock_alloc_send_pskb",
        "unix_wait_for_peer",
    ]) {
        return WaitClass::SocketWrite;
    }
    if has(&[
        "sk_wait_data",
        "tcp_recvmsg",
        "unix_stream_data_wait",
        "unix_stream_read_generic",
        "__skb_wait_for_more_packets",
        "__skb_recv_datagram",
        "udp_recvmsg",
        "sock_recvmsg",
    ]) {
        return WaitClass::SocketRead;
    }
    if has(&["pipe_read", "pipe_write", "pipe_wait"]) {
        return WaitClass::Pipe;
    }
    WaitClass::Other
}

/// Farthest an address may lie past the start of the symbol that names it (bytes): the
/// kernel's longest functions are a few tens of kilobytes.
pub const MAX_SYMBOL_SPAN: u64 = 1 << 20;

/// The kernel's text symbols (`/proc/kallsyms`), sorted by address: all of them, or only
/// those that name a given set of addresses.
#[derive(Debug, Default)]
pub struct Kallsyms {
    syms: Vec<(u64, String)>,
}

/// One `/proc/kallsyms` line's text symbol: (address, name); `None` for data symbols, a
/// zero address (read without CAP_SYSLOG) or a malformed line.
fn text_symbol(l: &str) -> Option<(u64, &str)> {
    // Most lines are data or read-only symbols on 64-bit kernels ("%016lx %c %s"): the type
    // letter sits at byte 17, so they are skipped before any parsing.
    let b = l.as_bytes();
    if b.len() > 19 && b[16] == b' ' && b[18] == b' ' {
        if !matches!(b[17], b't' | b'T' | b'w' | b'W') {
            return None;
        }
        // The fixed format, read in place (the file has ~120 000 lines, nearly all text).
        let addr = b[..16].iter().try_fold(0u64, |a, &c| {
            Some(a << 4 | u64::from((c as char).to_digit(16)?))
        })?;
        let rest = &l[19..];
        let name = rest.split(['\t', ' ', '\n']).next()?;
        return (addr != 0 && !name.is_empty()).then_some((addr, name));
    }
    let mut f = l.split_whitespace();
    let addr = u64::from_str_radix(f.next()?, 16).ok()?;
    let ty = f.next()?;
    let name = f.next()?;
    (addr != 0 && matches!(ty, "t" | "T" | "w" | "W")).then_some((addr, name))
}

/// Every text symbol of a whole `/proc/kallsyms` text, sorted by address (the file lists the
/// core kernel, then each module: each part sorted).
pub(crate) fn text_symbols(text: &str) -> Vec<(u64, &str)> {
    let mut all: Vec<(u64, &str)> = text.lines().filter_map(text_symbol).collect();
    all.sort_by_key(|s| s.0);
    all
}

impl Kallsyms {
    /// Every text symbol of `text`.
    pub fn parse(text: &str) -> Kallsyms {
        Kallsyms {
            syms: text_symbols(text)
                .into_iter()
                .map(|(a, n)| (a, n.to_string()))
                .collect(),
        }
    }

    /// The symbols of `all` (sorted by address) that name the addresses `needed`: for each,
    /// the nearest at or below it; nothing else is kept (the file has ~120 000, a few
    /// hundred stack addresses are asked).
    pub(crate) fn naming(all: &[(u64, &str)], needed: &[u64]) -> Kallsyms {
        let mut syms: Vec<(u64, String)> = needed
            .iter()
            .filter_map(|&a| {
                let i = all.partition_point(|s| s.0 <= a);
                let (at, name) = all.get(i.checked_sub(1)?)?;
                Some((*at, (*name).to_string()))
            })
            .collect();
        syms.sort_unstable_by_key(|s| s.0);
        syms.dedup_by_key(|s| s.0);
        Kallsyms { syms }
    }

    /// The symbols naming `needed`: from the boot's copy ([`crate::ksym_cache`]) when there is
    /// one, else from `/proc/kallsyms`, read once and kept for the boot's next runs (not read
    /// when nothing is needed).
    pub fn read(needed: &[u64]) -> Kallsyms {
        if needed.is_empty() {
            return Kallsyms::default();
        }
        if let Some(mut syms) = crate::ksym_cache::lookup(needed) {
            syms.sort_unstable_by_key(|s| s.0);
            syms.dedup_by_key(|s| s.0);
            return Kallsyms { syms };
        }
        let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
            return Kallsyms::default();
        };
        let all = text_symbols(&text);
        crate::ksym_cache::store_sorted(&all);
        Kallsyms::naming(&all, needed)
    }

    /// The function `addr` lies in: the symbol below it, unless that lies farther than any
    /// function is long ([`MAX_SYMBOL_SPAN`]) — an address in no listed symbol (a JIT'd BPF
    /// program with `net.core.bpf_jit_kallsyms` off) is unnamed, not named after the core
    /// kernel's last function a gigabyte below.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.0 <= addr);
        let (at, name) = self.syms.get(i.checked_sub(1)?)?;
        (addr - at <= MAX_SYMBOL_SPAN).then_some(name.as_str())
    }

    /// Whether it has any symbol (the file was readable with addresses).
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
}

/// The functions on a stack of addresses (innermost first), the scheduler's left out.
pub fn frames(sym: &Kallsyms, addrs: &[u64]) -> Vec<String> {
    addrs
        .iter()
        .take_while(|&&a| a != 0)
        .map(|&a| sym.name(a).unwrap_or("?").to_string())
        .skip_while(|f| scheduler_frame(f))
        .take(FRAMES)
        .collect()
}

/// One block as the kernel sent it (monotonic ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBlock {
    /// Thread.
    pub tid: u32,
    /// Left its CPU.
    pub start_ns: u64,
    /// Got one again.
    pub end_ns: u64,
    /// Kernel stack id (negative: none).
    pub kstack: i32,
    /// `prev_state`.
    pub state: u32,
    /// The process whose thread woke it (`sched:sched_waking`); 0 when none was seen.
    pub waker: u32,
    /// When it was first woken (0: not seen; a preempted thread never is).
    pub woken_ns: u64,
}

impl RawBlock {
    /// Parses a ring-buffer record (`struct block`; a record without the waker has none).
    pub fn parse(b: &[u8]) -> Option<RawBlock> {
        let u32_at = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?));
        Some(RawBlock {
            tid: u32_at(0)?,
            start_ns: u64_at(8)?,
            end_ns: u64_at(16)?,
            kstack: u32_at(24)? as i32,
            state: u32_at(28)?,
            waker: u32_at(32).unwrap_or(0),
            woken_ns: u64_at(40).unwrap_or(0),
        })
    }
}

/// What the kernel side summed: (stack id, state) → (ns, blocks).
pub type Totals = BTreeMap<(i32, u32), (u64, u64)>;

/// The report from the kernel's sums, the blocks and the stacks' frames
/// (`stacks[id]`); `clock_offset_ns` is `CLOCK_REALTIME − CLOCK_MONOTONIC`.
pub fn report(
    totals: &Totals,
    raw: &[RawBlock],
    stacks: &HashMap<i32, Vec<String>>,
    clock_offset_ns: i64,
    missed: u64,
) -> OffCpu {
    let class_of = |id: i32, state: u32| {
        let f: Vec<&str> = stacks
            .get(&id)
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        classify(u64::from(state), &f)
    };
    let mut by_class: BTreeMap<WaitClass, (u64, u64)> = BTreeMap::new();
    let mut by_stack: BTreeMap<(WaitClass, Vec<String>), (u64, u64)> = BTreeMap::new();
    for (&(id, state), &(ns, n)) in totals {
        let c = class_of(id, state);
        let e = by_class.entry(c).or_default();
        e.0 += ns;
        e.1 += n;
        let f = stacks.get(&id).cloned().unwrap_or_default();
        let e = by_stack.entry((c, f)).or_default();
        e.0 += ns;
        e.1 += n;
    }
    let mut classes: Vec<WaitTotal> = by_class
        .into_iter()
        .map(|(class, (ns, blocks))| WaitTotal {
            class,
            total_us: ns / 1000,
            blocks,
        })
        .collect();
    classes.sort_by(|a, b| b.total_us.cmp(&a.total_us).then(a.class.cmp(&b.class)));
    let mut all: Vec<WaitStack> = by_stack
        .into_iter()
        .map(|((class, frames), (ns, blocks))| WaitStack {
            class,
            total_us: ns / 1000,
            blocks,
            frames,
        })
        .collect();
    all.sort_by_key(|b| std::cmp::Reverse(b.total_us));
    let mut kept: BTreeMap<WaitClass, usize> = BTreeMap::new();
    let stacks_out = all
        .into_iter()
        .filter(|s| {
            let k = kept.entry(s.class).or_default();
            *k += 1;
            *k <= 3
        })
        .collect();
    let blocks = raw
        .iter()
        .map(|b| OffCpuBlock {
            tid: b.tid,
            start_us: (b.start_ns as i64 + clock_offset_ns) / 1000,
            end_us: (b.end_ns as i64 + clock_offset_ns) / 1000,
            class: class_of(b.kstack, b.state),
            stack: b.kstack,
            waker: (b.waker != 0).then_some(b.waker),
            woken_us: (b.woken_ns > b.start_ns && b.woken_ns <= b.end_ns)
                .then(|| (b.woken_ns as i64 + clock_offset_ns) / 1000),
        })
        .collect::<Vec<_>>();
    OffCpu {
        classes,
        stacks: stacks_out,
        min_block_us: MIN_BLOCK_US,
        missed,
        during_requests: None,
        during_slowest: None,
        long_run_queue: Some(OffCpu::long_run_queue_of(&blocks)),
        blocks,
        stack_frames: stacks.iter().map(|(k, v)| (*k, v.clone())).collect(),
        wakers: BTreeMap::new(),
        bpf_run_us: None,
        bpf_runs: None,
    }
}

/// The command names of the processes that woke the blocks (`/proc/PID/comm`, read at the
/// end of the window). Left out: one that exited meanwhile, and kernel threads (no command
/// line) — an interrupt's wake-up runs in whatever thread it interrupted, and a softirq
/// thread woke on behalf of a device, not as an upstream.
pub fn waker_names(raw: &[RawBlock]) -> BTreeMap<u32, String> {
    let pids: std::collections::BTreeSet<u32> =
        raw.iter().map(|b| b.waker).filter(|&p| p != 0).collect();
    pids.into_iter()
        .filter_map(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            if cmdline.is_empty() {
                return None;
            }
            let c = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
            Some((p, c.trim_end().to_string()))
        })
        .collect()
}

/// One request's server time on `CLOCK_REALTIME` µs: `[start, end)`, and how many requests
/// it stands for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// The request's last byte at the capture.
    pub start_us: i64,
    /// The response's first byte at the capture.
    pub end_us: i64,
    /// Requests it stands for (timings sampled: > 1).
    pub weight: f64,
}

/// How far a block may stick out of a window and still count as inside it: the capture's
/// and the scheduler's clocks are read at different points of the same path.
const EDGE_US: i64 = 50;

/// The thread that served window `w`: the one on a CPU when the response's first byte
/// left (the capture stamps a packet in the context of the thread that sends it, and at
/// most one thread per CPU runs at that instant), preferring the one that was blocked when
/// the request's last byte arrived and woke for it — a thread-per-connection server's
/// reader, an event loop in `epoll_wait` — the one whose wake is nearest after the arrival —
/// then one that woke within the window. Returns the thread and the block it woke from
/// after the request arrived, if any. `None` when no such thread was seen running then.
fn server_thread<'a>(
    by_tid: &'a HashMap<u32, Vec<&'a OffCpuBlock>>,
    w: &Window,
) -> Option<(u32, Option<&'a OffCpuBlock>)> {
    // ((score, woke at or after the arrival, -|wake|), tid, woke)
    type Key = (u8, bool, i64);
    let mut best: Option<(Key, u32, Option<&OffCpuBlock>)> = None;
    for (&tid, v) in by_tid {
        // Blocked at the response: not the sender.
        let i = v.partition_point(|b| b.start_us <= w.end_us - EDGE_US);
        let last = i.checked_sub(1).map(|i| v[i]);
        if last.is_some_and(|b| b.end_us >= w.end_us + EDGE_US) {
            continue;
        }
        // It lived then: a block of it ended before the response, or begins soon after.
        let alive = last.is_some_and(|b| b.end_us >= w.start_us - 1_000_000)
            || v.get(i).is_some_and(|b| b.start_us <= w.end_us + 1_000_000);
        if !alive {
            continue;
        }
        // The block it was in when the request arrived, if it woke from it in the window.
        let j = v.partition_point(|b| b.start_us < w.start_us);
        let woke = j
            .checked_sub(1)
            .map(|j| v[j])
            .filter(|b| b.end_us + EDGE_US >= w.start_us && b.end_us <= w.end_us + EDGE_US);
        // (A window shorter than the edges has no block inside it: j > i.)
        let woke_within = v
            .get(j..i)
            .is_some_and(|s| s.iter().any(|b| b.end_us <= w.end_us + EDGE_US));
        let score = if woke.is_some() {
            2
        } else if woke_within {
            1
        } else {
            // Running at the response but with no wake seen near the request: maybe a
            // thread whose blocks are all shorter than the tracer times, maybe another's.
            continue;
        };
        // Woken by this request: the wake at or after its arrival nearest to it; one woken
        // just before it (within the edge) woke for an earlier one.
        let wake = woke.map_or(i64::MAX, |b| b.end_us - w.start_us);
        let key = (score, wake >= 0, -wake.abs());
        if best.is_none_or(|b| (key, std::cmp::Reverse(tid)) > (b.0, std::cmp::Reverse(b.1))) {
            best = Some((key, tid, woke));
        }
    }
    best.map(|b| (b.1, b.2))
}

/// Splits the requests' server time by where the serving thread waited. For each window
/// ([`server_thread`] finds the thread), the blocks of that thread that began and ended
/// inside it, by class; the time from the request's arrival until that thread got a CPU
/// counts as run-queue when it was woken from a read or a poll (the arrival woke it), else
/// as the class of the block it woke from. A thread blocked across the window — a worker idle
/// between requests — is no part of it; another thread's blocks, which serve other
/// requests, neither. `cpu_per_request_us` is passed through.
pub fn split(
    windows: &[Window],
    off: &OffCpu,
    cpu_per_request_us: Option<u64>,
) -> Option<ServerTimeSplit> {
    let mut by_tid: HashMap<u32, Vec<&OffCpuBlock>> = HashMap::new();
    for b in &off.blocks {
        by_tid.entry(b.tid).or_default().push(b);
    }
    for v in by_tid.values_mut() {
        v.sort_unstable_by_key(|b| b.start_us);
    }
    let mut sum: BTreeMap<WaitClass, f64> = BTreeMap::new();
    let mut by_stack: HashMap<(WaitClass, i32), f64> = HashMap::new();
    let mut by_waker: HashMap<(WaitClass, u32), f64> = HashMap::new();
    let (mut server, mut requests, mut attributed) = (0f64, 0f64, 0f64);
    for w in windows {
        let len = w.end_us - w.start_us;
        if len <= 0 {
            continue;
        }
        server += len as f64 * w.weight;
        requests += w.weight;
        let Some((tid, woke)) = server_thread(&by_tid, w) else {
            continue;
        };
        attributed += w.weight;
        // From the request's arrival until its thread ran: a thread blocked reading or
        // polling was woken by the arrival itself, and what followed is its wait for a CPU;
        // any other block (a worker on a futex woken by a dispatcher) is that block's class.
        if let Some(b) = woke {
            let wake = (b.end_us - w.start_us).clamp(0, len);
            let class = match b.class {
                WaitClass::SocketRead | WaitClass::Poll | WaitClass::Accept => WaitClass::RunQueue,
                c => c,
            };
            if wake > 0 {
                *sum.entry(class).or_default() += wake as f64 * w.weight;
            }
        }
        let v = &by_tid[&tid];
        let from = v.partition_point(|b| b.start_us < w.start_us - EDGE_US);
        for b in &v[from..] {
            if b.start_us > w.end_us {
                break;
            }
            if woke.is_some_and(|x| std::ptr::eq(*b, x)) || b.end_us > w.end_us + EDGE_US {
                continue;
            }
            let t = (b.end_us.min(w.end_us) - b.start_us.max(w.start_us)).max(0) as f64;
            *sum.entry(b.class).or_default() += t * w.weight;
            *by_stack.entry((b.class, b.stack)).or_default() += t * w.weight;
            if let Some(p) = b.waker {
                *by_waker.entry((b.class, p)).or_default() += t * w.weight;
            }
        }
    }
    if requests == 0.0 {
        return None;
    }
    let frames_of = |class: WaitClass| -> Vec<String> {
        by_stack
            .iter()
            .filter(|((c, _), _)| *c == class)
            .max_by(|a, b| a.1.total_cmp(b.1))
            .and_then(|((_, st), _)| off.stack_frames.get(st).cloned())
            .unwrap_or_default()
    };
    // The watched processes themselves (a process's main thread has its pid as tid, and
    // every watched thread that blocked is in `by_tid`): one of the server's processes
    // waking another is the server's own work, never an upstream — whatever the names.
    let own = |pid: u32| by_tid.contains_key(&pid);
    // The processes that ended a class's waits, by command (a pool of worker processes is
    // one upstream, named by the one that woke the most), most time first.
    let wakers_of = |class: WaitClass| -> Vec<WokenBy> {
        let mut by_comm: BTreeMap<&str, (f64, u32, f64, u32)> = BTreeMap::new();
        for (&(c, pid), &us) in &by_waker {
            if c != class || own(pid) {
                continue;
            }
            let comm = off.wakers.get(&pid).map_or("", String::as_str);
            let e = by_comm.entry(comm).or_insert((0.0, pid, 0.0, 0));
            e.0 += us;
            e.3 += 1;
            if us > e.2 || (us == e.2 && pid < e.1) {
                (e.1, e.2) = (pid, us);
            }
        }
        let mut v: Vec<WokenBy> = by_comm
            .into_iter()
            .filter(|(_, e)| e.0 >= 1.0)
            .map(|(comm, (us, pid, _, n))| WokenBy {
                pid,
                comm: comm.to_string(),
                us: us as u64,
                processes: n,
            })
            .collect();
        v.sort_by(|a, b| b.us.cmp(&a.us).then(a.pid.cmp(&b.pid)));
        v.truncate(3);
        v
    };
    let mut parts: Vec<ServerTimePart> = sum
        .into_iter()
        .filter(|(_, us)| *us >= 1.0)
        .map(|(class, us)| ServerTimePart {
            class,
            us: us as u64,
            share: (us / server).min(1.0),
            frames: frames_of(class),
            woken_by: wakers_of(class),
        })
        .collect();
    parts.sort_by(|a, b| b.us.cmp(&a.us).then(a.class.cmp(&b.class)));
    Some(ServerTimeSplit {
        requests: requests.round() as u64,
        attributed: attributed.round() as u64,
        server_us: server as u64,
        parts,
        cpu_per_request_us,
    })
}

/// Requests the slowest split needs at least (and the windows it needs to pick them from).
const MIN_SLOWEST: usize = 5;

/// The same split over the slowest requests only: the windows at or above the p99 of server
/// time (by weight; at least [`MIN_SLOWEST`] of them, so the percentile said is lower with
/// fewer than 500), with the shortest server time among them. What a tail waits for may differ from what the median request does (a disk read
/// that misses the cache one time in a hundred). `None` with fewer than 20 windows.
pub fn slowest(windows: &[Window], off: &OffCpu) -> Option<SlowestSplit> {
    let mut v: Vec<&Window> = windows.iter().filter(|w| w.end_us > w.start_us).collect();
    if v.len() < 20 {
        return None;
    }
    v.sort_by_key(|w| std::cmp::Reverse(w.end_us - w.start_us));
    let total: f64 = v.iter().map(|w| w.weight).sum();
    let mut acc = 0.0;
    let mut k = 0;
    for w in &v {
        acc += w.weight;
        k += 1;
        if acc >= total * 0.01 {
            break;
        }
    }
    let chosen: Vec<Window> = v[..k.max(MIN_SLOWEST).min(v.len())]
        .iter()
        .map(|w| **w)
        .collect();
    let from_us = chosen.last().map(|w| (w.end_us - w.start_us) as u64)?;
    // At least five: below 500 requests that is more than the slowest 1 %.
    let weight: f64 = chosen.iter().map(|w| w.weight).sum();
    let percentile = ((100.0 * (1.0 - weight / total)) * 10.0).round() / 10.0;
    Some(SlowestSplit {
        percentile,
        from_us,
        split: split(&chosen, off, None)?,
    })
}

/// The offset `CLOCK_REALTIME − CLOCK_MONOTONIC`, ns, read back to back.
pub fn clock_offset_ns() -> i64 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec for the kernel to fill.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    };
    let m0 = read(libc::CLOCK_MONOTONIC);
    let r = read(libc::CLOCK_REALTIME);
    let m1 = read(libc::CLOCK_MONOTONIC);
    r - (m0 + (m1 - m0) / 2)
}

#[cfg(lagtrace_bpf)]
mod imp {
    use super::*;
    use crate::bpf::{load_tracepoint, refused};
    use lagtrace_bpf::ringbuf::RingBuf;
    use lagtrace_bpf::tracefs::Format;
    use lagtrace_bpf::{Error, MAP_ARRAY, MAP_HASH, MAP_LRU_HASH, MAP_RINGBUF, MapSpec};
    use lagtrace_bpf::{map_create, map_update, stack_addrs, u32_at, u64_at};
    use std::os::fd::OwnedFd;

    static OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/offcpu.bpf.o"));
    const MAP_STACK_TRACE: u32 = 7;
    const DEPTH: u32 = 24;
    const RING_BYTES: u32 = 1 << 20;

    /// The program's maps (as offcpu.bpf.c declares them).
    const MAPS: [MapSpec; 8] = [
        ("CONF", MAP_ARRAY, 4, 24, 1),
        ("WATCH", MAP_HASH, 4, 1, 256),
        ("START", MAP_LRU_HASH, 4, 32, 16384),
        ("STACKS", MAP_STACK_TRACE, 4, DEPTH * 8, 4096),
        ("SPILL", MAP_STACK_TRACE, 4, DEPTH * 8, 1024),
        ("TOTALS", MAP_HASH, 16, 16, 8192),
        ("EVENTS", MAP_RINGBUF, 0, 0, RING_BYTES),
        ("MISSED", MAP_ARRAY, 4, 8, 2),
    ];

    /// The list above says what the object declares (a struct grown in the C source and not
    /// here is refused by the verifier with a message about a register).
    #[cfg(test)]
    #[test]
    fn maps_agree_with_the_object() {
        lagtrace_bpf::check_maps(OBJ, &MAPS).unwrap();
    }

    /// The mark on a stack id that lives in SPILL, not STACKS (offcpu.bpf.c).
    const SPILL_BIT: i32 = 1 << 24;

    /// What the tracer's maps held at the end of the window.
    struct Collected {
        totals: Totals,
        raw_stacks: Vec<(i32, Vec<u64>)>,
        missed: u64,
    }

    /// The tracer while attached (detached when dropped).
    pub struct Tracer {
        collected: Option<Collected>,
        maps: Vec<(&'static str, OwnedFd)>,
        events: RingBuf,
        raw: Vec<RawBlock>,
        dropped: u64,
        offset_ns: i64,
        _prog: OwnedFd,
        _event: OwnedFd,
        /// The `sched:sched_waking` program and its event, when they loaded and attached.
        waking: Option<(OwnedFd, OwnedFd)>,
    }

    impl Tracer {
        /// Loads and attaches the tracer for the processes `pids` (their every thread).
        pub fn start(pids: &[u32]) -> Result<Tracer, BpfError> {
            let what = "loading the off-CPU tracer (BPF on sched:sched_switch)";
            let kernel = |e: std::io::Error| BpfError::Kernel(format!("sched:sched_switch: {e}"));
            let fmt = Format::of("sched", "sched_switch").map_err(kernel)?;
            let off = |name: &str| {
                fmt.field(name).map(|f| f.0 as u32).ok_or_else(|| {
                    BpfError::Kernel(format!("sched:sched_switch has no field {name}"))
                })
            };
            let (prev_pid, prev_state, next_pid) =
                (off("prev_pid")?, off("prev_state")?, off("next_pid")?);
            let id = lagtrace_bpf::tracefs::id("sched", "sched_switch").map_err(kernel)?;
            // Who wakes a blocked thread: optional (without it no block names its waker).
            let waking = Format::of("sched", "sched_waking")
                .ok()
                .and_then(|f| f.field("pid").map(|f| f.0 as u32))
                .zip(lagtrace_bpf::tracefs::id("sched", "sched_waking").ok());
            let mut maps = Vec::new();
            for m in &MAPS {
                maps.push((m.0, map_create(m).map_err(|e| refused(what, e))?));
            }
            let fd_of = |n: &str| maps.iter().find(|m| m.0 == n).map(|m| &m.1);
            let mut conf = Vec::with_capacity(24);
            for v in [prev_pid, prev_state, next_pid, waking.map_or(0, |w| w.0)] {
                conf.extend_from_slice(&v.to_ne_bytes());
            }
            conf.extend_from_slice(&(MIN_BLOCK_US * 1000).to_ne_bytes());
            let set = |map: &str, k: &[u8], v: &[u8]| {
                fd_of(map)
                    .map(|f| map_update(f, k, v))
                    .unwrap_or(Ok(()))
                    .map_err(|e| refused(what, Error::os(what, e)))
            };
            set("CONF", &0u32.to_ne_bytes(), &conf)?;
            for p in pids {
                set("WATCH", &p.to_ne_bytes(), &[1])?;
            }
            let prog = load_tracepoint(
                OBJ,
                "tracepoint/sched/sched_switch",
                &maps,
                "lt_offcpu",
                what,
            )?;
            let waking_prog = match waking {
                Some((_, wid)) => load_tracepoint(
                    OBJ,
                    "tracepoint/sched/sched_waking",
                    &maps,
                    "lt_offcpu_wake",
                    what,
                )
                .ok()
                .map(|p| (wid, p)),
                None => None,
            };
            let i = maps
                .iter()
                .position(|m| m.0 == "EVENTS")
                .ok_or_else(|| BpfError::Kernel("no EVENTS map".into()))?;
            let ring = maps.swap_remove(i).1;
            let events = RingBuf::new(ring, RING_BYTES as usize)
                .map_err(|e| BpfError::Kernel(format!("mapping its ring buffer: {e}")))?;
            let offset_ns = clock_offset_ns();
            let event = lagtrace_bpf::attach_tracepoint(id, &prog).map_err(|e| {
                let what = "attaching it to sched:sched_switch";
                refused(what, Error::os(what, e))
            })?;
            // Attached after the switch program: a waker noted on a block that program
            // never started is harmless (no START entry, nothing noted).
            let waking = waking_prog.and_then(|(wid, p)| {
                let ev = lagtrace_bpf::attach_tracepoint(wid, &p).ok()?;
                Some((p, ev))
            });
            Ok(Tracer {
                collected: None,
                maps,
                events,
                raw: Vec::new(),
                dropped: 0,
                offset_ns,
                _prog: prog,
                _event: event,
                waking,
            })
        }

        /// Moves the blocks sent so far out of the ring buffer.
        pub fn drain(&mut self) {
            let (raw, dropped) = (&mut self.raw, &mut self.dropped);
            self.events.drain(|rec| {
                if raw.len() >= MAX_BLOCKS {
                    *dropped += 1;
                } else if let Some(b) = RawBlock::parse(rec) {
                    raw.push(b);
                }
            });
        }

        fn map(&self, n: &str) -> Option<&OwnedFd> {
            self.maps.iter().find(|m| m.0 == n).map(|m| &m.1)
        }

        /// Reads the kernel's sums and stacks (once; later calls return the same), and the
        /// blocks sent so far: what [`Tracer::kernel_addrs`] and [`Tracer::finish`] read.
        fn collect(&mut self) -> Result<&Collected, BpfError> {
            if self.collected.is_none() {
                self.drain();
                self.collected = Some(self.read_maps()?);
            }
            self.collected
                .as_ref()
                .ok_or_else(|| BpfError::Kernel("its maps were not read".into()))
        }

        fn read_maps(&self) -> Result<Collected, BpfError> {
            let kernel = |e: std::io::Error| BpfError::Kernel(format!("reading its maps: {e}"));
            let (Some(tot), Some(stk), Some(spill), Some(mis)) = (
                self.map("TOTALS"),
                self.map("STACKS"),
                self.map("SPILL"),
                self.map("MISSED"),
            ) else {
                return Err(BpfError::Kernel("a map is missing".into()));
            };
            let mut totals = Totals::new();
            lagtrace_bpf::map_for_each::<16, 16>(tot, |k, v| {
                let e = totals
                    .entry((u32_at(k, 4) as i32, u32_at(k, 8)))
                    .or_default();
                e.0 += u64_at(v, 0);
                e.1 += u64_at(v, 8);
            })
            .map_err(kernel)?;
            let missed = self.dropped + lagtrace_bpf::array_sum(mis, 2);
            let ids: std::collections::BTreeSet<i32> = totals
                .keys()
                .map(|k| k.0)
                .chain(self.raw.iter().map(|b| b.kstack))
                .filter(|&id| id >= 0)
                .collect();
            let raw_stacks: Vec<(i32, Vec<u64>)> = ids
                .into_iter()
                .filter_map(|id| {
                    let addrs = if id & SPILL_BIT != 0 {
                        stack_addrs(spill, id & !SPILL_BIT, DEPTH as usize)
                    } else {
                        stack_addrs(stk, id, DEPTH as usize)
                    };
                    Some((id, addrs?))
                })
                .collect();
            Ok(Collected {
                totals,
                raw_stacks,
                missed,
            })
        }

        /// The kernel addresses on the blocks' stacks: what the caller reads
        /// `/proc/kallsyms` for (once for every tracer that needs it).
        pub fn kernel_addrs(&mut self) -> Vec<u64> {
            self.collect()
                .map(|c| {
                    c.raw_stacks
                        .iter()
                        .flat_map(|s| s.1.iter().copied())
                        .collect()
                })
                .unwrap_or_default()
        }

        /// Detaches and reports, with a note when the kernel's symbols could not be read
        /// (then no block is classed but run-queue). `ksyms`: the kernel's symbols for
        /// [`Tracer::kernel_addrs`], when the caller read them (else read here).
        pub fn finish(
            mut self,
            ksyms: Option<&Kallsyms>,
        ) -> Result<(OffCpu, Option<String>), BpfError> {
            self.collect()?;
            let Some(Collected {
                totals,
                raw_stacks,
                missed,
            }) = self.collected.take()
            else {
                return Err(BpfError::Kernel("its maps were not read".into()));
            };
            let own;
            let sym = match ksyms {
                Some(k) => k,
                None => {
                    let needed: Vec<u64> = raw_stacks
                        .iter()
                        .flat_map(|s| s.1.iter().copied())
                        .collect();
                    own = Kallsyms::read(&needed);
                    &own
                }
            };
            let stacks: HashMap<i32, Vec<String>> = raw_stacks
                .into_iter()
                .map(|(id, addrs)| (id, frames(sym, &addrs)))
                .collect();
            let note = (sym.is_empty() && !stacks.is_empty()).then(|| {
                "/proc/kallsyms gave no addresses (needs CAP_SYSLOG, or kernel.kptr_restrict \
                 is 2): the blocks' kernel stacks are unnamed, so only run-queue waits are \
                 told apart"
                    .to_string()
            });
            // The realtime clock may be slewed during the window: the offset's mean.
            let offset = self.offset_ns + (clock_offset_ns() - self.offset_ns) / 2;
            let mut r = report(&totals, &self.raw, &stacks, offset, missed);
            r.wakers = waker_names(&self.raw);
            // The cost is both programs': every context switch and every wake-up.
            let stats = [Some(&self._prog), self.waking.as_ref().map(|w| &w.0)]
                .into_iter()
                .flatten()
                .filter_map(prog_stats)
                .reduce(|a, b| (a.0 + b.0, a.1 + b.1));
            if let Some((ns, runs)) = stats {
                r.bpf_run_us = Some(ns / 1000);
                r.bpf_runs = Some(runs);
            }
            Ok((r, note))
        }
    }
}

#[cfg(lagtrace_bpf)]
pub use imp::Tracer;

/// A loaded program's run time (ns) and run count from its descriptor's fdinfo: counted
/// only while `kernel.bpf_stats_enabled` is 1 (both 0 otherwise: `None`).
#[cfg_attr(not(lagtrace_bpf), allow(dead_code))]
pub(crate) fn prog_stats(prog: &impl std::os::fd::AsRawFd) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", prog.as_raw_fd())).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let (ns, runs) = (field("run_time_ns:")?, field("run_cnt:")?);
    (runs > 0).then_some((ns, runs))
}

/// Without the program (built without clang): never starts.
#[cfg(not(lagtrace_bpf))]
pub struct Tracer(());

#[cfg(not(lagtrace_bpf))]
impl Tracer {
    /// Always `NotBuilt`, with the build's reason.
    pub fn start(_pids: &[u32]) -> Result<Tracer, BpfError> {
        Err(BpfError::NotBuilt(env!("LAGTRACE_BPF_BUILD")))
    }

    /// Never reached.
    pub fn drain(&mut self) {}

    /// Never reached.
    pub fn kernel_addrs(&mut self) -> Vec<u64> {
        Vec::new()
    }

    /// Never reached.
    pub fn finish(self, _ksyms: Option<&Kallsyms>) -> Result<(OffCpu, Option<String>), BpfError> {
        Ok((OffCpu::default(), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_classed_by_state_and_function() {
        let sleep = ["do_nanosleep", "hrtimer_nanosleep", "common_nsleep_timens"];
        assert_eq!(classify(1, &sleep), WaitClass::Sleep);
        // Preempted: runnable, whatever the stack.
        assert_eq!(classify(0, &sleep), WaitClass::RunQueue);
        assert_eq!(
            classify(1, &["futex_do_wait", "__futex_wait"]),
            WaitClass::Futex
        );
        assert_eq!(
            classify(2, &["io_schedule", "folio_wait_bit_common", "filemap_read"]),
            WaitClass::Disk
        );
        // D state in a file system's read path without io_schedule on the stack kept.
        assert_eq!(
            classify(2, &["__folio_lock", "filemap_fault"]),
            WaitClass::Disk
        );
        // The same function in S state is no disk wait.
        assert_eq!(classify(1, &["filemap_fault"]), WaitClass::Other);
        assert_eq!(
            classify(1, &["ep_poll", "do_epoll_wait", "__x64_sys_epoll_wait"]),
            WaitClass::Poll
        );
        assert_eq!(
            classify(1, &["wait_woken", "sk_wait_data", "tcp_recvmsg_locked"]),
            WaitClass::SocketRead
        );
        assert_eq!(
            classify(1, &["inet_csk_accept", "do_accept"]),
            WaitClass::Accept
        );
        assert_eq!(
            classify(1, &["sk_stream_wait_memory", "tcp_sendmsg_locked"]),
            WaitClass::SocketWrite
        );
        assert_eq!(classify(1, &[]), WaitClass::Other);
    }

    #[test]
    fn kallsyms_names_the_function_an_address_is_in() {
        let k = Kallsyms::parse(
            "ffffffff81000200 T second\nffffffff81000000 T first\n\
             ffffffff81000100 D data_not_text\nffffffff81000300 t third [mod]\nbad line\n",
        );
        assert_eq!(k.name(0xffffffff81000000), Some("first"));
        assert_eq!(k.name(0xffffffff810001ff), Some("first"));
        assert_eq!(k.name(0xffffffff81000250), Some("second"));
        assert_eq!(k.name(0xffffffff81000301), Some("third"));
        assert_eq!(k.name(0xffffffff80000000), None);
        // A gigabyte past the last symbol (a BPF program kallsyms does not list): unnamed.
        assert_eq!(k.name(0xffffffffc0025cf3), None);
        // Read without CAP_SYSLOG: every address 0.
        assert!(Kallsyms::parse("0000000000000000 T first\n").is_empty());
        let f = frames(&k, &[0xffffffff81000000, 0xffffffff81000250, 0]);
        assert_eq!(f, ["first", "second"]);
    }

    /// Resolving only the needed addresses names each as the full table does, whatever
    /// the file's order (modules come after the core kernel, each part sorted).
    #[test]
    fn resolving_needed_addresses_matches_the_full_table() {
        let text = "ffffffff81000000 T a\nffffffff81000100 t b\nffffffff81000200 D data\n\
                    ffffffff81000300 T c\nffffffffc0000000 t m1 [mod]\nffffffffc0000100 t m2 [mod]\n\
                    ffffffff80000000 T early\n";
        let full = Kallsyms::parse(text);
        let needed = [
            0xffffffff81000150,
            0xffffffff81000250,
            0xffffffff81000000,
            0xffffffffc0000180,
            0xffffffff80000010,
            0xffffffff81000150,
        ];
        let r = Kallsyms::naming(&text_symbols(text), &needed);
        for a in needed {
            assert_eq!(r.name(a), full.name(a), "{a:x}");
        }
        assert_eq!(r.name(0xffffffff81000250), Some("b"));
        assert_eq!(r.name(0xffffffffc0000180), Some("m2"));
        assert!(r.syms.len() <= needed.len());
        assert!(Kallsyms::naming(&text_symbols("0 T x\n"), &needed).is_empty());
        // The kernel's own format: a module's name after a tab.
        let tabbed = "ffffffffc0000000 t m1\t[mod]\nffffffffc0000100 t m2\t[mod]\n";
        let r = Kallsyms::naming(&text_symbols(tabbed), &[0xffffffffc0000180]);
        assert_eq!(r.name(0xffffffffc0000180), Some("m2"));
    }

    /// On this kernel's own `/proc/kallsyms` (when it gives addresses): the needed symbols
    /// alone name every sampled address as the whole table does.
    #[test]
    fn resolving_this_kernels_symbols_matches_the_full_table() {
        let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
            return;
        };
        let full = Kallsyms::parse(&text);
        if full.is_empty() {
            return;
        }
        // Every 97th symbol, and a byte inside it.
        let needed: Vec<u64> = full.syms.iter().step_by(97).map(|s| s.0 + 1).collect();
        let r = Kallsyms::naming(&text_symbols(&text), &needed);
        // The symbol's address (several names can share one: aliases).
        let start = |k: &Kallsyms, a: u64| {
            let i = k.syms.partition_point(|s| s.0 <= a);
            (i > 0).then(|| k.syms[i - 1].0)
        };
        for &a in &needed {
            assert_eq!(start(&r, a), start(&full, a), "{a:x}: {:?}", r.name(a));
            assert!(r.name(a).is_some(), "{a:x}");
        }
    }

    #[test]
    fn scheduler_frames_are_left_out() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T __schedule\nffffffff81000100 T schedule\n\
             ffffffff81000200 T do_nanosleep\nffffffff81000300 T hrtimer_nanosleep\n",
        );
        let f = frames(
            &k,
            &[0xffffffff81000010, 0xffffffff81000110, 0xffffffff81000210],
        );
        assert_eq!(f, ["do_nanosleep"]);
    }

    fn block(tid: u32, start_us: i64, end_us: i64, class: WaitClass) -> OffCpuBlock {
        OffCpuBlock {
            tid,
            start_us,
            end_us,
            class,
            stack: class as i32,
            waker: None,
            woken_us: None,
        }
    }

    fn off(blocks: Vec<OffCpuBlock>) -> OffCpu {
        let mut o = OffCpu {
            blocks,
            ..OffCpu::default()
        };
        o.stack_frames
            .insert(WaitClass::Sleep as i32, vec!["do_nanosleep".into()]);
        o
    }

    fn share(s: &ServerTimeSplit, c: WaitClass) -> f64 {
        s.parts
            .iter()
            .find(|p| p.class == c)
            .map_or(0.0, |p| p.share)
    }

    /// 100 requests 100 ms apart on one thread, each 1 ms of CPU, but two of them read the
    /// disk for 20 ms: the whole split is mostly not disk, the slowest requests' is.
    #[test]
    fn the_slowest_requests_are_split_apart_from_the_rest() {
        let mut blocks = Vec::new();
        let mut windows = Vec::new();
        let mut prev_end = 0;
        for i in 0..100i64 {
            let t = 1_000 + i * 100_000;
            blocks.push(block(1, prev_end + 50, t + 20, WaitClass::SocketRead));
            let slow = i % 50 == 7;
            if slow {
                blocks.push(block(1, t + 100, t + 20_100, WaitClass::Disk));
            }
            let end = t + if slow { 21_000 } else { 1_000 };
            windows.push(Window {
                start_us: t,
                end_us: end,
                weight: 1.0,
            });
            prev_end = end;
        }
        let o = off(blocks);
        let all = split(&windows, &o, None).unwrap();
        assert!(share(&all, WaitClass::Disk) < 0.3, "{all:?}");
        let sl = slowest(&windows, &o).unwrap();
        assert_eq!(sl.split.requests, 5, "at least five: {sl:?}");
        assert_eq!(sl.from_us, 1_000);
        assert_eq!(sl.percentile, 95.0, "five of a hundred");
        assert!(share(&sl.split, WaitClass::Disk) > 0.85, "{sl:?}");
        assert_eq!(slowest(&windows[..19], &o), None, "too few to say");
    }

    /// Thread 1 reads its request (blocked in recv until 1 000 µs + 20), sleeps 30 ms and
    /// answers at 31 100. Thread 2 sleeps across the whole window (another request's
    /// handler, which began before) and thread 3 is an idle worker blocked on a futex
    /// throughout: neither is this request's.
    #[test]
    fn the_serving_threads_blocks_inside_the_window_are_its_parts() {
        let o = off(vec![
            block(1, 0, 1_020, WaitClass::SocketRead),
            block(1, 1_060, 31_060, WaitClass::Sleep),
            block(1, 31_150, 90_000, WaitClass::SocketRead),
            block(2, 500, 31_200, WaitClass::Sleep),
            block(3, 0, 90_000, WaitClass::Futex),
        ]);
        let w = [Window {
            start_us: 1_000,
            end_us: 31_100,
            weight: 1.0,
        }];
        let s = split(&w, &o, Some(200)).unwrap();
        assert_eq!((s.requests, s.attributed, s.server_us), (1, 1, 30_100));
        assert!(
            (share(&s, WaitClass::Sleep) - 30_000.0 / 30_100.0).abs() < 1e-9,
            "{s:?}"
        );
        // The wake-up after the request arrived: 20 µs.
        assert_eq!(
            s.parts
                .iter()
                .find(|p| p.class == WaitClass::RunQueue)
                .map(|p| p.us),
            Some(20)
        );
        assert_eq!(share(&s, WaitClass::Futex), 0.0);
        assert_eq!(s.parts[0].frames, ["do_nanosleep"]);
        assert_eq!(s.cpu_per_request_us, Some(200));
    }

    /// An event loop (thread 1) woke for each of three requests, waited in epoll inside
    /// each until a worker of another process answered, and sent the response. The waits
    /// are credited to the waker's command: two php-fpm workers (pids 50, 51) ended 25 ms of
    /// them, a softirq's wake-up in lagtrace's context (pid 60) 2 ms; a block with no waker
    /// seen (the arrival's) none. The pid named is the worker that woke the most.
    #[test]
    fn the_waits_inside_the_windows_are_credited_to_the_processes_that_ended_them() {
        let woken = |start, end, waker| OffCpuBlock {
            waker,
            ..block(1, start, end, WaitClass::Poll)
        };
        let mut o = off(vec![
            block(1, 0, 1_020, WaitClass::Poll),
            woken(1_100, 11_100, Some(50)),
            block(1, 11_200, 20_020, WaitClass::Poll),
            woken(20_100, 30_100, Some(51)),
            block(1, 30_200, 40_020, WaitClass::Poll),
            woken(40_100, 45_100, Some(50)),
            woken(45_150, 47_150, Some(60)),
            block(1, 47_300, 90_000, WaitClass::Poll),
        ]);
        o.wakers.insert(50, "php-fpm8.2".into());
        o.wakers.insert(51, "php-fpm8.2".into());
        o.wakers.insert(60, "lagtrace".into());
        let w = |start_us, end_us| Window {
            start_us,
            end_us,
            weight: 1.0,
        };
        let s = split(
            &[w(1_000, 11_150), w(20_000, 30_150), w(40_000, 47_200)],
            &o,
            None,
        )
        .unwrap();
        let poll = s.parts.iter().find(|p| p.class == WaitClass::Poll).unwrap();
        assert_eq!(poll.us, 27_000, "{s:?}");
        // A watched process (its main thread, tid 50, blocked too: one of the server's own
        // processes) that wakes the serving thread is the server's own work, credited to
        // no one.
        let mut own = o.clone();
        own.blocks.push(block(50, 95_000, 96_000, WaitClass::Poll));
        let s2 = split(
            &[w(1_000, 11_150), w(20_000, 30_150), w(40_000, 47_200)],
            &own,
            None,
        )
        .unwrap();
        let p2 = s2
            .parts
            .iter()
            .find(|p| p.class == WaitClass::Poll)
            .unwrap();
        assert_eq!(
            p2.woken_by
                .iter()
                .map(|w| (w.pid, w.us))
                .collect::<Vec<_>>(),
            [(51, 10_000), (60, 2_000)],
            "{s2:?}"
        );
        assert_eq!(
            poll.woken_by,
            [
                WokenBy {
                    pid: 50,
                    comm: "php-fpm8.2".into(),
                    us: 25_000,
                    processes: 2,
                },
                WokenBy {
                    pid: 60,
                    comm: "lagtrace".into(),
                    us: 2_000,
                    processes: 1,
                },
            ]
        );
    }

    /// Two threads sleep inside the window; the one that sent the response (running at the
    /// window's end) is the server's, and only its sleep counts.
    #[test]
    fn only_the_thread_running_when_the_response_left_is_split() {
        let o = off(vec![
            block(1, 0, 1_010, WaitClass::SocketRead),
            block(1, 2_000, 4_000, WaitClass::Sleep),
            block(1, 10_500, 50_000, WaitClass::SocketRead),
            // Another handler: wakes in the window, sleeps most of it, still asleep at
            // the end.
            block(2, 0, 1_005, WaitClass::SocketRead),
            block(2, 1_100, 9_000, WaitClass::Futex),
            block(2, 9_100, 20_000, WaitClass::Sleep),
        ]);
        let w = [Window {
            start_us: 1_000,
            end_us: 10_000,
            weight: 2.0,
        }];
        let s = split(&w, &o, None).unwrap();
        assert_eq!((s.requests, s.attributed), (2, 2));
        assert_eq!(share(&s, WaitClass::Futex), 0.0, "{s:?}");
        assert!((share(&s, WaitClass::Sleep) - 2_000.0 / 9_000.0).abs() < 1e-9);
    }

    /// Two threads running when the response left, both woken around the request's
    /// arrival: the one woken 10 µs after it is the server, not the one woken 40 µs before
    /// (for an earlier request).
    #[test]
    fn the_thread_woken_after_the_arrival_serves_it() {
        let o = off(vec![
            block(1, 0, 960, WaitClass::SocketRead),
            block(1, 2_000, 9_000, WaitClass::Futex),
            block(2, 0, 1_010, WaitClass::SocketRead),
            block(2, 2_000, 6_000, WaitClass::Sleep),
        ]);
        let w = [Window {
            start_us: 1_000,
            end_us: 10_000,
            weight: 1.0,
        }];
        let s = split(&w, &o, None).unwrap();
        assert!(share(&s, WaitClass::Sleep) > 0.4, "{s:?}");
        assert_eq!(share(&s, WaitClass::Futex), 0.0, "{s:?}");
    }

    /// A worker handed the request by another thread wakes from a futex: the time until
    /// it runs is that hand-off (futex), not a wait for a CPU.
    #[test]
    fn a_hand_off_wake_is_its_blocks_class() {
        let o = off(vec![
            block(1, 0, 4_000, WaitClass::Futex),
            block(1, 9_500, 20_000, WaitClass::Futex),
        ]);
        let w = [Window {
            start_us: 1_000,
            end_us: 9_000,
            weight: 1.0,
        }];
        let s = split(&w, &o, None).unwrap();
        assert_eq!(s.attributed, 1);
        assert_eq!(
            s.parts
                .iter()
                .find(|p| p.class == WaitClass::Futex)
                .map(|p| p.us),
            Some(3_000),
            "{s:?}"
        );
        assert_eq!(share(&s, WaitClass::RunQueue), 0.0);
    }

    /// A thread running at the response that shows no wake near the request (its blocks
    /// all before) is no evidence of which thread served it: unattributed.
    #[test]
    fn a_thread_seen_only_running_is_not_the_server() {
        let o = off(vec![
            block(1, 0, 500, WaitClass::Poll),
            block(1, 20_000, 30_000, WaitClass::Poll),
        ]);
        let w = [Window {
            start_us: 1_000,
            end_us: 9_000,
            weight: 1.0,
        }];
        let s = split(&w, &o, None).unwrap();
        assert_eq!((s.requests, s.attributed), (1, 0));
    }

    /// No watched thread was running when the response left (every one blocked across
    /// it): the window counts, unsplit.
    #[test]
    fn a_window_without_its_thread_is_not_split() {
        let o = off(vec![block(1, 0, 50_000, WaitClass::Futex)]);
        let w = [Window {
            start_us: 1_000,
            end_us: 10_000,
            weight: 1.0,
        }];
        let s = split(&w, &o, None).unwrap();
        assert_eq!((s.requests, s.attributed, s.server_us), (1, 0, 9_000));
        assert!(s.parts.is_empty());
        assert!(split(&[], &o, None).is_none());
    }

    /// Windows shorter than the edges (a fast server's 30 µs) among blocks on both sides.
    #[test]
    fn windows_shorter_than_the_edges_are_split_without_a_panic() {
        let o = off(vec![
            block(1, 0, 990, WaitClass::Poll),
            block(1, 1_010, 1_020, WaitClass::Poll),
            block(1, 1_030, 5_000, WaitClass::Poll),
        ]);
        for (a, b) in [(1_000, 1_030), (1_000, 1_001), (1_015, 1_016)] {
            let w = [Window {
                start_us: a,
                end_us: b,
                weight: 1.0,
            }];
            let s = split(&w, &o, None).unwrap();
            assert_eq!(s.requests, 1);
            assert!(s.parts.iter().all(|p| p.share <= 1.0), "{s:?}");
        }
    }

    #[test]
    fn ring_records_parse_and_short_ones_are_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&7u32.to_ne_bytes());
        b.extend_from_slice(&9u32.to_ne_bytes());
        b.extend_from_slice(&100u64.to_ne_bytes());
        b.extend_from_slice(&250u64.to_ne_bytes());
        b.extend_from_slice(&(-14i32).to_ne_bytes());
        b.extend_from_slice(&2u32.to_ne_bytes());
        let r = RawBlock::parse(&b).unwrap();
        assert_eq!(
            (r.tid, r.start_ns, r.end_ns, r.kstack, r.state),
            (7, 100, 250, -14, 2)
        );
        assert!(RawBlock::parse(&b[..31]).is_none());
    }

    #[test]
    fn the_report_sums_by_class_and_keeps_three_stacks_each() {
        let mut totals = Totals::new();
        let mut stacks = HashMap::new();
        for id in 0..5 {
            totals.insert((id, 1), (1_000_000 * (id as u64 + 1), 10));
            stacks.insert(id, vec![format!("futex_wait_{id}")]);
        }
        totals.insert((-14, 0), (4_500_000, 3));
        let raw = [RawBlock {
            tid: 1,
            start_ns: 1_000,
            end_ns: 61_000,
            kstack: 4,
            state: 1,
            waker: 0,
            woken_ns: 0,
        }];
        let r = report(&totals, &raw, &stacks, 1_000_000, 2);
        assert_eq!(r.classes[0].class, WaitClass::Futex);
        assert_eq!(r.classes[0].total_us, 15_000);
        assert_eq!(r.classes[1].class, WaitClass::RunQueue);
        assert_eq!(
            r.stacks
                .iter()
                .filter(|s| s.class == WaitClass::Futex)
                .count(),
            3
        );
        assert_eq!(r.stacks[0].frames, ["futex_wait_4"]);
        assert_eq!(r.blocks[0].start_us, 1_001);
        assert_eq!(r.blocks[0].end_us, 1_061);
        assert_eq!(r.missed, 2);
    }
}
