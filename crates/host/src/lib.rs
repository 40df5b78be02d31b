//! lagtrace-host: the server host's kernel evidence over a window, for a network namespace
//! and/or a process — what an expert reads with `nstat`, `ss -lnt`, `tc -s qdisc`, the
//! cgroup's `cpu.stat` and `/proc/PID/task/*/schedstat`.
//!
//! [`measure`] takes a reading at the start, samples the listen queues through the window,
//! takes a reading at the end and returns the deltas as a [`HostReport`]. It never prints.
//! Each part that cannot be read says why in its own [`Layer`]; the others still run.
#![deny(missing_docs)]

pub mod bpf;
pub mod cgroup;
pub mod conntrack;
pub mod counters;
pub mod cpu;
pub mod disk;
pub mod drops;
mod ksym_cache;
pub mod listen;
pub mod netfilter;
pub mod offcpu;
pub mod oncpu;
pub mod qdisc;
pub mod sched;
pub mod sockstat;
pub mod softirq;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use lagtrace_model::diagnosis::evidence::Layer;
use lagtrace_model::host::{HostCost, HostReport, HostScope};
use lagtrace_model::{Capability, Privilege};
use lagtrace_netns::NetNs;

/// What to watch and for how long.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// A named network namespace (under /run/netns).
    pub netns: Option<String>,
    /// A process: its namespace, cgroup and threads.
    pub pid: Option<u32>,
    /// More processes whose threads are accounted with `pid`'s (a pre-forked server's
    /// master and workers all hold its listener; any of them may serve a request).
    pub more_pids: Vec<u32>,
    /// The window.
    pub duration: Duration,
    /// How often the listen queues are sampled within the window.
    pub interval: Duration,
    /// Count drops by reason (the `skb:kfree_skb` tracepoint): the namespace's by device.
    pub drops: bool,
    /// When the per-namespace counter cannot run (no privilege, built without clang),
    /// count drops machine-wide instead (saying why); else the drop layer is unavailable.
    pub drops_machine: bool,
    /// Time the process's threads off a CPU by why (BPF on `sched:sched_switch`; needs a
    /// process).
    pub offcpu: bool,
    /// Sample the process's threads on a CPU (BPF on CPU-clock perf events; needs a
    /// process) this many times a second per CPU; 0: not at all.
    pub profile_hz: u64,
    /// Time the network softirqs (BPF on `irq:softirq_entry`/`exit`) beside
    /// `/proc/net/softnet_stat`'s counts.
    pub softirq: bool,
    /// The server's TCP port: the netfilter rule walk is for a packet to it (`None`: the
    /// chains' sizes only).
    pub port: Option<u16>,
    /// The server's address is IPv6 (the walk reads the `ip6` tables instead of `ip`).
    pub ipv6: bool,
    /// When to read the netfilter rules.
    pub rule_walk: RuleWalk,
}

/// When the netfilter rules are read: `nft -j list ruleset` on a ruleset of 20 000 rules
/// costs ~0.5 s of CPU, worth spending only when there is a cost to explain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleWalk {
    /// Always (`lagtrace host`: the user asked).
    Always,
    /// When the receive softirq was timed at [`COSTLY_PACKET_NS`] or more per packet.
    IfCostly,
    /// Never.
    Never,
}

/// The receive cost per packet from which the rules are read with [`RuleWalk::IfCostly`]
/// (a normal stack's is a few µs).
pub const COSTLY_PACKET_NS: u64 = 10_000;

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            netns: None,
            pid: None,
            more_pids: Vec::new(),
            duration: Duration::from_secs(5),
            interval: Duration::from_millis(100),
            drops: true,
            drops_machine: true,
            offcpu: true,
            profile_hz: oncpu::DEFAULT_HZ,
            softirq: true,
            port: None,
            ipv6: false,
            rule_walk: RuleWalk::IfCostly,
        }
    }
}

/// Tells when a window is armed (every counter read, the drop tracer open) and ends it
/// before its duration on demand — for a caller that drives traffic against the window and
/// must neither start before it counts nor stop before the last packet is counted.
#[derive(Debug, Clone, Default)]
pub struct WindowControl(Arc<Control>);

#[derive(Debug, Default)]
struct Control {
    armed: Mutex<bool>,
    cv: Condvar,
    stop: AtomicBool,
}

impl WindowControl {
    /// Waits until the window is armed; false after `timeout` (or if it never arms: the
    /// measurement failed before, and says why).
    pub fn wait_armed(&self, timeout: Duration) -> bool {
        let g = self.0.armed.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self
            .0
            .cv
            .wait_timeout_while(g, timeout, |armed| !*armed)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }

    /// Ends the window at its next sample (within one interval).
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::Release);
    }

    fn arm(&self) {
        *self.0.armed.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        self.0.stop.load(Ordering::Acquire)
    }
}

/// Why the host layer could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `--pid` names no running process.
    #[error("no process {0}")]
    NoProcess(u32),
    /// `--netns` names no namespace.
    #[error("no network namespace {0:?} (under /run/netns)")]
    NoNetns(String),
    /// Entering the namespace was refused.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// Opening or entering the namespace failed otherwise.
    #[error("network namespace: {0}")]
    Netns(std::io::Error),
}

/// Mounts tracefs at /sys/kernel/tracing when no tracefs is mounted (needs CAP_SYS_ADMIN):
/// the tracepoints' ids and record layouts are read there. The host layer does it when it
/// first needs one; a process that gives up `mount` (the agent's seccomp filter) does it
/// first. `Err`: why tracefs is not there (the layers using it will say so too).
pub fn prepare_tracefs() -> std::io::Result<()> {
    lagtrace_bpf::tracefs::event_dir("skb", "kfree_skb").map(|_| ())
}

/// Measures the host over `o.duration`.
pub fn measure(o: &HostOptions) -> Result<HostReport, HostError> {
    measure_with(o, &WindowControl::default())
}

/// Measures the host over `o.duration` or until `ctl` stops it, telling `ctl` when armed.
pub fn measure_with(o: &HostOptions, ctl: &WindowControl) -> Result<HostReport, HostError> {
    let ns = match (o.pid, &o.netns) {
        (Some(pid), _) => {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return Err(HostError::NoProcess(pid));
            }
            NetNs::Pid(pid)
        }
        (None, Some(name)) => NetNs::Named(name.clone()),
        (None, None) => NetNs::Current,
    };
    if let (Some(pid), Err(e)) = (o.pid, ns.inode())
        && e.kind() == std::io::ErrorKind::PermissionDenied
    {
        return Err(HostError::Privilege(Privilege::new(
            Capability::SysPtrace,
            format!("reading process {pid}'s network namespace"),
            " (or the process's own uid)",
        )));
    }
    if !ns.exists() {
        return Err(HostError::NoNetns(o.netns.clone().unwrap_or_default()));
    }
    // Already there (the usual --pid case): no setns, which would need CAP_SYS_ADMIN even
    // into the caller's own namespace.
    let inode = ns.inode().unwrap_or(0);
    let ns = if inode != 0 && NetNs::Current.inode().ok() == Some(inode) {
        NetNs::Current
    } else {
        ns
    };
    let scope = HostScope {
        netns: o.netns.clone(),
        pid: o.pid,
        comm: o.pid.and_then(lagtrace_sockets::procfs::comm),
        netns_inode: inode,
    };
    let started = Instant::now();
    // The window's own thread's CPU: inside diagnose the process also runs the load.
    let (mut report, cpu_us) = ns
        .run(|| {
            let cpu0 = thread_cpu_us();
            let r = window(o, ctl);
            (r, thread_cpu_us().saturating_sub(cpu0))
        })
        .map_err(|e| match e {
            lagtrace_netns::Error::Privilege(_) => HostError::Privilege(Privilege::new(
                Capability::SysAdmin,
                "entering another network namespace",
                " (run as root; without it, watch this namespace: no --netns/--pid)",
            )),
            e => HostError::Netns(e.into()),
        })?;
    report.scope = scope;
    let wall = started.elapsed();
    report.cost = HostCost {
        cpu_us,
        cpu_share: cpu_us as f64 / (wall.as_micros().max(1) as f64),
        ..report.cost
    };
    Ok(report)
}

fn err_layer<T>(what: &str, e: &std::io::Error) -> Layer<T> {
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => Layer::unavailable(format!(
            "{what}: {e} (needs CAP_SYS_ADMIN or the process's own uid)"
        )),
        _ => Layer::error(format!("{what}: {e}")),
    }
}

/// What is read once at each end of the window.
struct Ends {
    counters: std::io::Result<counters::Counters>,
    qdiscs: std::io::Result<Vec<qdisc::QdiscStats>>,
    cgroup: Option<std::io::Result<cgroup::CpuReading>>,
    threads: Option<std::io::Result<BTreeMap<u32, sched::ThreadReading>>>,
    cpu: std::io::Result<cpu::CpuReading>,
    softnet: std::io::Result<Vec<softirq::Softnet>>,
    conntrack: std::io::Result<Option<conntrack::Reading>>,
}

fn read_ends(pids: &[u32], dirs: Option<&cgroup::CgroupDirs>) -> Ends {
    Ends {
        counters: counters::read(),
        qdiscs: qdisc::dump(),
        cgroup: dirs.map(cgroup::read),
        threads: (!pids.is_empty()).then(|| sched::read_all(pids)),
        cpu: cpu::read(),
        softnet: softirq::read_softnet(),
        conntrack: conntrack::read(),
    }
}

/// The watched processes: `--pid` first, then the others holding its listener.
fn watched(o: &HostOptions) -> Vec<u32> {
    let mut v: Vec<u32> = o.pid.into_iter().collect();
    if o.pid.is_some() {
        v.extend(o.more_pids.iter().filter(|p| Some(**p) != o.pid));
    }
    v
}

/// The qdiscs' counts over the window, with their backlog as sampled through it.
fn qdisc_layer(
    first: &Ends,
    last: &Ends,
    backlogs: qdisc::BacklogTrack,
) -> Layer<Vec<lagtrace_model::host::QdiscDelta>> {
    match (&first.qdiscs, &last.qdiscs) {
        (Ok(a), Ok(b)) => {
            let names: BTreeMap<i32, String> = b
                .iter()
                .map(|q| (q.ifindex, qdisc::dev_name(q.ifindex)))
                .collect();
            let after = qdisc::keyed(b.clone());
            let mut d = qdisc::deltas(&qdisc::keyed(a.clone()), &after, &names);
            backlogs.finish(&after, &mut d);
            Layer::ran(d)
        }
        (Err(e), _) | (_, Err(e)) => err_layer("rtnetlink qdisc dump", e),
    }
}

/// The window, on a thread inside the watched namespace.
fn window(o: &HostOptions, ctl: &WindowControl) -> HostReport {
    let dirs = o.pid.map(|pid| {
        let pc = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
        let mi = std::fs::read_to_string("/proc/self/mountinfo");
        match (pc, mi) {
            (Ok(pc), Ok(mi)) => cgroup::locate(&pc, &mi).ok_or_else(|| {
                "no cpu cgroup (neither a v1 `cpu` hierarchy nor a v2 mount)".to_string()
            }),
            (Err(e), _) | (_, Err(e)) => Err(format!("reading the process's cgroup: {e}")),
        }
    });
    let mut track = listen::ListenTrack::new(o.pid);
    // This thread's namespace (the watched one: `measure` entered it), not the process's.
    let netns = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    });
    let pids = watched(o);
    let mut offcpu = (o.offcpu && !pids.is_empty()).then(|| offcpu::Tracer::start(&pids));
    let mut sampler =
        (o.profile_hz > 0 && !pids.is_empty()).then(|| oncpu::Sampler::start(&pids, o.profile_hz));
    let softirq_timer = o.softirq.then(|| softirq::Timer::start(netns as u32));
    // The drop counter brackets the first and last readings as closely as it can (the
    // slower tracers load before it), so its counts and the qdiscs' cover one window.
    let mut tracer = o
        .drops
        .then(|| drops::DropCounter::start(netns, o.drops_machine));
    let started = Instant::now();
    let first = read_ends(&pids, dirs.as_ref().and_then(|d| d.as_ref().ok()));
    let disks0 = disk::read();
    // The first tick is the window's first reading (no second read of the same files).
    let start_times = match &first.threads {
        Some(Ok(t)) => t
            .iter()
            .map(|(tid, r)| (*tid, (r.run_ns, r.wait_ns, r.slices)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let mut sched_tick = (unix_us(), start_times);
    let mut sched_timeline = Vec::new();
    let mut listen_err = track.sample().err();
    let cg_dirs = dirs.as_ref().and_then(|d| d.as_ref().ok());
    let mut timeline = Vec::new();
    if let Some(Ok(r)) = &first.cgroup {
        timeline.push((unix_us(), r.clone()));
    }
    let deadline = started + o.duration;
    let mut backlogs = qdisc::BacklogTrack::default();
    let cpu_at_start = thread_cpu_us();
    ctl.arm();
    loop {
        let now = Instant::now();
        if now >= deadline || ctl.stopped() {
            break;
        }
        std::thread::sleep(o.interval.min(deadline - now));
        if let Err(e) = track.sample() {
            listen_err.get_or_insert(e);
        }
        if let Some(Ok(r)) = cg_dirs.map(cgroup::read) {
            timeline.push((unix_us(), r));
        }
        if !pids.is_empty() {
            let tick = (unix_us(), sched::read_times(&pids));
            sched_timeline.push(sched::sample(&sched_tick.1, &tick.1, sched_tick.0, tick.0));
            sched_tick = tick;
        }
        if let Ok(v) = qdisc::dump() {
            backlogs.sample(&v);
        }
        if let Some(Ok(t)) = tracer.as_mut() {
            t.tick();
        }
        if let Some(Ok(t)) = offcpu.as_mut() {
            t.drain();
        }
    }
    let last = read_ends(&pids, cg_dirs);
    let disks1 = disk::read();
    let drops = match tracer {
        None => Layer::skipped("not asked for"),
        Some(Ok(t)) => match t.finish() {
            Ok(d) => Layer::ran(d),
            Err(e) => Layer::error(e),
        },
        Some(Err(e)) if e.privilege => Layer::unavailable(e.why),
        Some(Err(e)) => Layer::error(e.why),
    };
    let window_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let window_cpu_us = thread_cpu_us().saturating_sub(cpu_at_start);
    // After the drop counter (read right after the last reading): naming the samples'
    // frames reads the binaries' symbols. One read of /proc/kallsyms names both tracers'
    // kernel stacks (the kernel formats ~150 000 lines for it: ~30 ms of CPU a read).
    let mut needed = Vec::new();
    if let Some(Ok(s)) = sampler.as_mut() {
        needed.extend(s.kernel_addrs());
    }
    if let Some(Ok(t)) = offcpu.as_mut() {
        needed.extend(t.kernel_addrs());
    }
    let ksyms = offcpu::Kallsyms::read(&needed);
    let oncpu = tracer_layer(
        sampler,
        !pids.is_empty(),
        "the on-CPU sampler",
        "the on-CPU profile is per process: give --pid",
        |s| s.finish(Some(&ksyms)),
    );
    let softirq = softirq_layer(softirq_timer, &first, &last, window_us);
    let owners = match o.pid {
        Some(_) => pids.clone(),
        None => lagtrace_sockets::procfs::pids(),
    };
    let listeners = match listen_err {
        Some(e) => err_layer("sock_diag dump of the listeners", &e),
        None => Layer::ran(track.finish(&listen::owners(&owners))),
    };
    HostReport {
        scope: HostScope::default(),
        window_us,
        counters: match (&first.counters, &last.counters) {
            (Ok(a), Ok(b)) => Layer::ran(counters::deltas(a, b)),
            (Err(e), _) | (_, Err(e)) => err_layer("reading /proc/net/netstat and snmp", e),
        },
        listeners,
        cgroup: cgroup_layer(dirs, &first, &last, &timeline),
        threads: match (&first.threads, &last.threads) {
            (Some(Ok(a)), Some(Ok(b))) => Layer::ran(lagtrace_model::host::ThreadSched {
                timeline: sched_timeline,
                ..sched::delta(a, b)
            }),
            (Some(Err(e)), _) | (_, Some(Err(e))) => err_layer("reading the threads' schedstat", e),
            _ => Layer::skipped("run-queue delay is per process: give --pid"),
        },
        qdiscs: qdisc_layer(&first, &last, backlogs),
        cpu: match (&first.cpu, &last.cpu) {
            (Ok(a), Ok(b)) => Layer::ran(cpu::delta(a, b, std::process::id(), &pids, window_us)),
            (Err(e), _) | (_, Err(e)) => err_layer("reading /proc/stat", e),
        },
        sockstat: match sockstat::read() {
            Ok(s) => Layer::ran(s),
            Err(e) => err_layer("reading /proc/net/sockstat", &e),
        },
        drops,
        offcpu: tracer_layer(
            offcpu,
            !pids.is_empty(),
            "the off-CPU tracer",
            "off-CPU time is per process: give --pid",
            |t| t.finish(Some(&ksyms)),
        ),
        oncpu,
        disks: match (&disks0, &disks1) {
            (Ok(a), Ok(b)) => Layer::ran(disk::report(a, b, io_limits(o.pid))),
            (Err(e), _) | (_, Err(e)) => err_layer("reading /proc/diskstats", e),
        },
        netfilter: rule_walk(o, &softirq),
        softirq,
        conntrack: match (&first.conntrack, &last.conntrack) {
            (Ok(Some(a)), Ok(Some(b))) => Layer::ran(conntrack::delta(a, b)),
            (Ok(_), Ok(_)) => Layer::skipped("no connection tracking table in the namespace"),
            (Err(e), _) | (_, Err(e)) => err_layer("reading /proc/net/stat/nf_conntrack", e),
        },
        cost: HostCost {
            window_cpu_us,
            window_share: window_cpu_us as f64 / window_us.max(1) as f64,
            ..HostCost::default()
        },
    }
}

/// The netfilter walk for the port, when `o.rule_walk` asks for it.
fn rule_walk(
    o: &HostOptions,
    softirq: &Layer<lagtrace_model::host::Softirq>,
) -> Layer<lagtrace_model::host::Netfilter> {
    let per_packet = softirq.get().and_then(|k| k.per_packet_ns());
    match (o.rule_walk, per_packet) {
        (RuleWalk::Never, _) => Layer::skipped("not asked for"),
        (RuleWalk::Always, _) => netfilter::read(o.port, o.ipv6),
        (RuleWalk::IfCostly, Some(ns)) if ns >= COSTLY_PACKET_NS => netfilter::read(o.port, o.ipv6),
        (RuleWalk::IfCostly, Some(ns)) => Layer::skipped(format!(
            "not read: the kernel's receive processing took {} per packet, no rule walk's cost to explain",
            lagtrace_model::Micros(ns / 1000)
        )),
        (RuleWalk::IfCostly, None) => Layer::skipped(
            "not read: the receive softirq was not timed, so no rule walk's cost can be told",
        ),
    }
}

/// The network softirqs' times (when the timer ran) and `softnet_stat`'s counts (always).
fn softirq_layer(
    timer: Option<Result<softirq::Timer, bpf::BpfError>>,
    first: &Ends,
    last: &Ends,
    window_us: u64,
) -> Layer<lagtrace_model::host::Softirq> {
    let (a, b) = match (&first.softnet, &last.softnet) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return err_layer("reading /proc/net/softnet_stat", e),
    };
    // ksoftirqd: softirq work the kernel deferred to a thread because it kept coming.
    let ksoftirqd_us = match (&first.cpu, &last.cpu) {
        (Ok(x), Ok(y)) => cpu::used_by(x, y, |comm| comm.starts_with("ksoftirqd/")),
        _ => 0,
    };
    let (times, why) = match timer.map(|t| t.and_then(|t| t.read())) {
        Some(Ok(t)) => (Some(t), None),
        Some(Err(bpf::BpfError::NotBuilt(why))) => (None, Some(format!("the timer was {why}"))),
        Some(Err(bpf::BpfError::Privilege(p))) => (None, Some(p.to_string())),
        Some(Err(bpf::BpfError::Kernel(e))) => (None, Some(e)),
        None => (None, Some("not asked for".to_string())),
    };
    let mut l = Layer::ran(softirq::report(
        a,
        b,
        times.as_ref().map(|(t, share)| (t.as_slice(), *share)),
        ksoftirqd_us,
        window_us,
    ));
    l.reason = why.map(|e| {
        format!("softirq time not measured ({e}): softnet_stat's packet and drop counts only")
    });
    l
}

/// A BPF error's own words, without the drop counter's prefix its `Display` carries.
fn kernel_why(e: bpf::BpfError) -> String {
    match e {
        bpf::BpfError::Kernel(k) => k,
        e => e.to_string(),
    }
}

/// A BPF tracer's layer (`name`: "the off-CPU tracer"): its report with the note it gave,
/// why it was skipped (`per_process` without a process), or why it could not run.
fn tracer_layer<S, T>(
    t: Option<Result<S, bpf::BpfError>>,
    have_pid: bool,
    name: &str,
    per_process: &str,
    finish: impl FnOnce(S) -> Result<(T, Option<String>), bpf::BpfError>,
) -> Layer<T> {
    match t {
        None if !have_pid => Layer::skipped(per_process),
        None => Layer::skipped("not asked for"),
        Some(Ok(t)) => match finish(t) {
            Ok((r, note)) => {
                let mut l = Layer::ran(r);
                l.reason = note;
                l
            }
            Err(e) => Layer::error(format!("{name}: {}", kernel_why(e))),
        },
        Some(Err(bpf::BpfError::NotBuilt(why))) => Layer::unavailable(format!("{name} was {why}")),
        Some(Err(bpf::BpfError::Privilege(p))) => Layer::unavailable(p.to_string()),
        Some(Err(e)) => Layer::error(format!("{name}: {}", kernel_why(e))),
    }
}

/// The I/O limits on the process's cgroup and its ancestors (none without a process).
fn io_limits(pid: Option<u32>) -> Vec<lagtrace_model::host::IoLimit> {
    let Some(pid) = pid else {
        return Vec::new();
    };
    match (
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) {
        (Ok(pc), Ok(mi)) => disk::limits(&pc, &mi, |p| std::fs::read_to_string(p).ok()),
        _ => Vec::new(),
    }
}

fn cgroup_layer(
    dirs: Option<Result<cgroup::CgroupDirs, String>>,
    first: &Ends,
    last: &Ends,
    timeline: &[(u64, cgroup::CpuReading)],
) -> Layer<lagtrace_model::host::CgroupCpu> {
    match (dirs, &first.cgroup, &last.cgroup) {
        (None, _, _) => Layer::skipped("cgroup CPU accounting is per process: give --pid"),
        (Some(Err(e)), _, _) => Layer::unavailable(e),
        (Some(Ok(d)), Some(Ok(a)), Some(Ok(b))) => {
            let mut cpu = cgroup::delta(&d, a, b);
            if b.has_bandwidth {
                cpu.timeline = cgroup::timeline(a, timeline);
            }
            let mut l = Layer::ran(cpu);
            if !b.has_bandwidth {
                l.reason = Some(format!(
                    "{} has no cpu controller: usage only, no throttling accounting",
                    d.cpu.display()
                ));
            }
            l
        }
        (Some(Ok(d)), Some(Err(e)), _) | (Some(Ok(d)), _, Some(Err(e))) => {
            err_layer(&format!("reading {}", d.cpu.join("cpu.stat").display()), e)
        }
        (Some(Ok(_)), _, _) => Layer::error("cgroup reading missing"),
    }
}

/// Now on `CLOCK_REALTIME`, µs since the Unix epoch.
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), µs.
pub fn thread_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000
        + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1000
}

/// This process's user + system CPU time (`/proc/self/stat` utime + stime), µs.
pub fn self_cpu_us() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000 / hz
}
