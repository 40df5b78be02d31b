//! The kernel's own packet processing over the window: how long each CPU spent in the
//! network softirqs (BPF programs on the `softirq_entry` / `softirq_exit` and
//! `netif_receive_skb` raw tracepoints, bpf/softirq.bpf.c) and what `/proc/net/softnet_stat` counted (packets processed, backlog
//! drops, time squeezes). Receive time over packets processed is the kernel's cost per
//! packet received: the driver, IP, netfilter's hooks and TCP, before a socket has the data.
//! Softirqs are per CPU, not per namespace: the figures are machine-wide, apart from the
//! watched namespace's own packets (timed one by one, see bpf/softirq.bpf.c).

use lagtrace_model::host::{BacklogWait, Softirq, SoftirqCpu};

pub use crate::bpf::BpfError;

/// One CPU's line of `/proc/net/softnet_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Softnet {
    /// CPU number (the line's own column when the kernel prints it, else the line's place).
    pub cpu: u32,
    /// Packets taken off the device and backlog queues (`__netif_receive_skb`).
    pub processed: u64,
    /// Packets dropped because the CPU's backlog queue was full.
    pub dropped: u64,
    /// Receive softirqs that stopped with work left (budget or time used up).
    pub squeezed: u64,
}

/// Parses `/proc/net/softnet_stat` (hex columns; the 13th, when present, is the CPU).
pub fn parse_softnet(text: &str) -> Vec<Softnet> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let cols: Vec<u64> = l
                .split_whitespace()
                .map(|c| u64::from_str_radix(c, 16))
                .collect::<Result<_, _>>()
                .ok()?;
            (cols.len() >= 3).then(|| Softnet {
                cpu: cols
                    .get(12)
                    .and_then(|c| u32::try_from(*c).ok())
                    .unwrap_or(i as u32),
                processed: cols[0],
                dropped: cols[1],
                squeezed: cols[2],
            })
        })
        .collect()
}

/// Reads `/proc/net/softnet_stat`.
pub fn read_softnet() -> std::io::Result<Vec<Softnet>> {
    std::fs::read_to_string("/proc/net/softnet_stat").map(|t| parse_softnet(&t))
}

/// The possible CPUs' ids from `/sys/devices/system/cpu/possible` (`0-3,8`), every one
/// (no cap: a per-CPU map's value has one slot per possible CPU, and a short buffer would
/// be overrun); `None` when the text lists none or is not a CPU list.
pub fn possible_cpus(text: &str) -> Option<Vec<u32>> {
    let mut v = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b) = (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?);
        if b < a || b - a > 1 << 20 {
            return None;
        }
        v.extend(a..=b);
    }
    (!v.is_empty()).then_some(v)
}

/// One CPU's softirq times as the BPF program sums them (ns, runs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Times {
    /// Time in NET_RX (ns).
    pub rx_ns: u64,
    /// NET_RX runs.
    pub rx_runs: u64,
    /// Time in NET_TX (ns).
    pub tx_ns: u64,
    /// NET_TX runs.
    pub tx_runs: u64,
    /// Receive time of the watched namespace's packets (ns).
    pub ns_ns: u64,
    /// The watched namespace's packets.
    pub ns_packets: u64,
    /// The watched namespace's TCP packets' waits in a backlog queue (ns), how many were
    /// timed, the longest (ns).
    pub q_ns: u64,
    /// Packets whose wait was timed.
    pub q_packets: u64,
    /// The longest wait (ns).
    pub q_max_ns: u64,
    /// The waits by size ([`wait_bucket`]'s buckets).
    pub q_hist: Vec<u64>,
}

/// Buckets of the backlog-wait histogram (as bpf/softirq.bpf.c's `QBUCKETS`).
pub const QBUCKETS: usize = 128;

/// The bucket of a wait of `us` µs: 0–3 one each, then four per power of two (~19 %
/// wide) — the BPF program's own function, kept here for its inverse and its test.
pub fn wait_bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let msb = 63 - us.leading_zeros() as usize;
    (4 + (msb - 2) * 4 + ((us >> (msb - 2)) & 3) as usize).min(QBUCKETS - 1)
}

/// The waits bucket `b` holds, from its lowest to its highest (µs).
pub fn bucket_range(b: usize) -> (u64, u64) {
    if b < 4 {
        return (b as u64, b as u64);
    }
    let msb = (b - 4) / 4 + 2;
    let sub = ((b - 4) % 4) as u64;
    let lo = (4 + sub) << (msb - 2);
    (lo, lo + (1u64 << (msb - 2)) - 1)
}

/// The `q` quantile of the histogram's waits (µs): the middle of the bucket it falls in.
pub fn hist_quantile(hist: &[u64], q: f64) -> Option<u64> {
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((n as f64 * q).ceil() as u64).clamp(1, n);
    let mut seen = 0;
    for (b, c) in hist.iter().enumerate() {
        seen += c;
        if seen >= rank {
            let (lo, hi) = bucket_range(b);
            return Some((lo + hi) / 2);
        }
    }
    None
}

/// `y - x` for a 32-bit `softnet_stat` counter read twice: one that went down counted
/// through its wrap.
fn wrapped_delta(x: u64, y: u64) -> u64 {
    if y >= x {
        y - x
    } else {
        (y + (1 << 32)).saturating_sub(x)
    }
}

/// The window's report from the softnet readings at its ends, the CPUs' softirq times
/// (`None`: not timed) indexed by CPU, and ksoftirqd's CPU time (µs). The softnet counters
/// are 32-bit and wrap: a counter that went down counted through its wrap.
pub fn report(
    a: &[Softnet],
    b: &[Softnet],
    times: Option<(&[Times], f64)>,
    ksoftirqd_us: u64,
    window_us: u64,
) -> Softirq {
    let timed_share = times.map_or(1.0, |t| t.1);
    let times = times.map(|t| t.0);
    let mut cpus: Vec<SoftirqCpu> = b
        .iter()
        .map(|e| {
            let s = a
                .iter()
                .find(|s| s.cpu == e.cpu)
                .copied()
                .unwrap_or(Softnet {
                    cpu: e.cpu,
                    ..Softnet::default()
                });
            let t = times
                .and_then(|t| t.get(e.cpu as usize))
                .cloned()
                .unwrap_or_default();
            SoftirqCpu {
                cpu: e.cpu,
                rx_us: t.rx_ns / 1000,
                tx_us: t.tx_ns / 1000,
                rx_packets: wrapped_delta(s.processed, e.processed),
                rx_share: t.rx_ns as f64 / 1000.0 / window_us.max(1) as f64,
                backlog_drops: wrapped_delta(s.dropped, e.dropped),
                time_squeeze: wrapped_delta(s.squeezed, e.squeezed),
            }
        })
        .collect();
    cpus.sort_by(|x, y| y.rx_us.cmp(&x.rx_us).then(x.cpu.cmp(&y.cpu)));
    let rx_us: u64 = cpus.iter().map(|c| c.rx_us).sum();
    let rx_packets: u64 = cpus.iter().map(|c| c.rx_packets).sum();
    let (ns_ns, ns_packets) = times.map_or((0, 0), |t| {
        t.iter()
            .fold((0, 0), |(n, p), c| (n + c.ns_ns, p + c.ns_packets))
    });
    let mut hist = vec![0u64; QBUCKETS];
    let (mut q_ns, mut q_packets, mut q_max_ns) = (0, 0, 0);
    for t in times.unwrap_or_default() {
        q_ns += t.q_ns;
        q_packets += t.q_packets;
        q_max_ns = q_max_ns.max(t.q_max_ns);
        for (h, n) in hist.iter_mut().zip(&t.q_hist) {
            *h += n;
        }
    }
    let netns_backlog_wait = (q_packets > 0).then(|| BacklogWait {
        packets: q_packets,
        mean_us: q_ns / q_packets / 1000,
        p50_us: hist_quantile(&hist, 0.5).unwrap_or(0),
        p99_us: hist_quantile(&hist, 0.99).unwrap_or(0),
        max_us: q_max_ns / 1000,
    });
    Softirq {
        netns_backlog_wait,
        netns_packets: ns_packets,
        netns_rx_us: ns_ns / 1000,
        netns_ns_per_packet: (ns_packets > 0).then(|| ns_ns / ns_packets),
        timed: times.is_some(),
        timed_share,
        rx_us,
        tx_us: cpus.iter().map(|c| c.tx_us).sum(),
        rx_packets,
        rx_ns_per_packet: (times.is_some() && rx_packets > 0).then(|| rx_us * 1000 / rx_packets),
        busiest_rx_share: cpus.first().map_or(0.0, |c| c.rx_share),
        backlog_drops: cpus.iter().map(|c| c.backlog_drops).sum(),
        time_squeeze: cpus.iter().map(|c| c.time_squeeze).sum(),
        ksoftirqd_us,
        window_us,
        cpus,
    }
}

/// Machine-wide packets a second up to which the softirq timer runs throughout. Where every
/// packet is its own softirq (loopback, a lightly loaded veth) a packet costs ~4 program runs
/// of ~100–130 ns: ~0.5 % of a core at this rate. Above it the programs are attached for
/// `FULL_RATE / rate` of each half second (not under [`MIN_DUTY`]) and the sums are scaled to
/// the window, so that the timer's own kernel time stays near half a percent of a core —
/// with the host layer's own ~1.2 % (its process), under the 2 % it may cost.
pub const FULL_RATE: f64 = 10_000.0;
/// The smallest share of each period the timer runs.
pub const MIN_DUTY: f64 = 0.05;

/// The share of the next period the timer runs at `rate` packets a second.
pub fn duty(rate: f64) -> f64 {
    if rate <= FULL_RATE {
        1.0
    } else {
        (FULL_RATE / rate).max(MIN_DUTY)
    }
}

#[cfg(lagtrace_bpf)]
mod imp {
    use super::*;
    use crate::bpf::{load_program, refused};
    use lagtrace_bpf::btf::{Btf, VMLINUX, Vmlinux};
    use lagtrace_bpf::{Error, MAP_ARRAY, MAP_PERCPU_ARRAY, MapSpec, PROG_RAW_TRACEPOINT};
    use lagtrace_bpf::{map_create, map_lookup, map_update, u64_at};
    use std::os::fd::OwnedFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    static OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/softirq.bpf.o"));

    /// Bytes of one CPU's `struct acc`.
    const ACC: usize = 136;
    /// Bytes of one CPU's `struct qhist`.
    const QHIST: usize = QBUCKETS * 8;

    /// The program's maps (as softirq.bpf.c declares them).
    const MAPS: [MapSpec; 4] = [
        ("CONF", MAP_ARRAY, 4, 24, 1),
        ("ACC", MAP_PERCPU_ARRAY, 4, ACC as u32, 1),
        ("QHIST", MAP_PERCPU_ARRAY, 4, QHIST as u32, 1),
        ("QSLOT", MAP_ARRAY, 4, 16, 64),
    ];

    /// The list above says what the object declares (a struct grown in the C source and not
    /// here is refused by the verifier with a message about a register).
    #[cfg(test)]
    #[test]
    fn maps_agree_with_the_object() {
        lagtrace_bpf::check_maps(OBJ, &MAPS).unwrap();
    }

    /// The busiest CPU's share of an interval in the receive softirq at which the backlog
    /// wait starts to be timed: a little under the share the rule needs
    /// (`softirq-saturated`: half the window). A healthy nginx at c=32 over a veth keeps its
    /// busiest CPU ~25–35 % in it, and the program's run per packet cost a fast proxy's join
    /// a few points when it was always attached.
    const ARM_SHARE: f64 = 0.45;
    /// One attached phase and the detached one after it.
    const PERIOD: Duration = Duration::from_millis(500);
    /// The first attached phase.
    const FIRST: Duration = Duration::from_millis(200);
    /// The shortest attached phase.
    const MIN_ON: Duration = Duration::from_millis(25);

    /// How long the programs have been attached: the share of the window the sums cover.
    struct Clock {
        started: Instant,
        /// Attached time of the phases that ended.
        sampled: Duration,
        /// When the phase now attached began.
        on_since: Option<Instant>,
    }

    impl Clock {
        /// The share of the time since the start the programs were attached (0..1].
        fn share(&self) -> f64 {
            let on = self.sampled + self.on_since.map_or(Duration::ZERO, |t| t.elapsed());
            let all = self.started.elapsed().as_secs_f64();
            if all <= 0.0 {
                return 1.0;
            }
            (on.as_secs_f64() / all).clamp(1e-3, 1.0)
        }
    }

    /// The loaded programs.
    struct Progs {
        entry: OwnedFd,
        exit: OwnedFd,
        recv: OwnedFd,
        napi: OwnedFd,
        /// `netif_rx`, the backlog wait's start: attached once a CPU is busy.
        rx: OwnedFd,
    }

    impl Progs {
        /// Attaches the programs but `netif_rx`, `softirq_entry` last: a softirq whose
        /// start was seen has its end seen. Detach with [`detach`] (the entry first).
        fn attach(&self) -> Result<Vec<OwnedFd>, BpfError> {
            let mut links = Vec::new();
            for (name, tp, prog) in [
                ("softirq_exit", c"softirq_exit", &self.exit),
                ("netif_receive_skb", c"netif_receive_skb", &self.recv),
                ("napi_poll", c"napi_poll", &self.napi),
                ("softirq_entry", c"softirq_entry", &self.entry),
            ] {
                let l = lagtrace_bpf::attach_raw_tracepoint(tp, prog).map_err(|e| {
                    let what = format!("attaching the softirq timer to the {name} tracepoint");
                    refused(&what, Error::os(what.clone(), e))
                })?;
                links.push(l);
            }
            Ok(links)
        }

        /// Attaches `netif_rx` (the backlog wait's start); none when the kernel refuses.
        fn attach_rx(&self) -> Option<OwnedFd> {
            lagtrace_bpf::attach_raw_tracepoint(c"netif_rx", &self.rx).ok()
        }
    }

    /// Detaches the links in the reverse of [`Progs::attach`]'s order.
    fn detach(mut links: Vec<OwnedFd>) {
        while let Some(l) = links.pop() {
            drop(l);
        }
    }

    /// The timer while attached (detached when dropped).
    pub struct Timer {
        acc: OwnedFd,
        qhist: OwnedFd,
        /// The possible CPUs' ids, in the order a per-CPU map's value lists them.
        possible: Vec<u32>,
        clock: Arc<Mutex<Clock>>,
        /// The thread that attaches and detaches the programs in phases and attaches the
        /// backlog wait's once a CPU is busy; stopped (the programs detached) on drop.
        duty: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    }

    impl Drop for Timer {
        fn drop(&mut self) {
            if let Some((stop, t)) = self.duty.take() {
                stop.store(true, Ordering::Relaxed);
                let _ = t.join();
            }
        }
    }

    /// Sleeps `d` in short steps; false once `stop` is set.
    fn nap(stop: &AtomicBool, d: Duration) -> bool {
        let step = Duration::from_millis(25);
        let end = Instant::now() + d;
        loop {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            std::thread::sleep((end - now).min(step));
        }
    }

    /// Packets the stack received on all CPUs so far (`softnet_stat`; 32-bit counters, each
    /// CPU's own: the difference of two readings is taken per CPU through a wrap).
    fn processed() -> Vec<Softnet> {
        read_softnet().unwrap_or_default()
    }

    fn received_between(a: &[Softnet], b: &[Softnet]) -> u64 {
        b.iter()
            .map(|e| {
                let s = a.iter().find(|s| s.cpu == e.cpu).map_or(0, |s| s.processed);
                super::wrapped_delta(s, e.processed)
            })
            .sum()
    }

    /// The duty thread: each attached phase measures the machine's packet rate and each
    /// CPU's receive softirq share; at a rate over [`FULL_RATE`] the programs are detached
    /// for the rest of the period; once a CPU spent [`ARM_SHARE`] of a phase in the receive
    /// softirq, `netif_rx` is attached with the others from then on.
    fn run_in_phases(
        stop: &AtomicBool,
        acc: &OwnedFd,
        n: usize,
        progs: &Progs,
        first: Vec<OwnedFd>,
        clock: &Mutex<Clock>,
    ) {
        let mut links = Some(first);
        let mut rx_link: Option<OwnedFd> = None;
        // The first phase is short: the rate decides the duty, and until it is known the
        // programs run on every packet.
        let mut on = FIRST;
        loop {
            let (t0, rx0, p0) = (Instant::now(), rx_ns(acc, n), processed());
            if !nap(stop, on) {
                return;
            }
            let dt = t0.elapsed();
            let (rx1, p1) = (rx_ns(acc, n), processed());
            let busy = match (&rx0, &rx1) {
                (Some(a), Some(b)) => a
                    .iter()
                    .zip(b)
                    .any(|(a, b)| b.saturating_sub(*a) as f64 >= ARM_SHARE * dt.as_nanos() as f64),
                _ => false,
            };
            let armed = rx_link.is_some() || busy;
            if busy && rx_link.is_none() {
                rx_link = progs.attach_rx();
            }
            let rate = received_between(&p0, &p1) as f64 / dt.as_secs_f64().max(1e-3);
            let d = duty(rate);
            if d >= 1.0 {
                on = PERIOD;
                continue;
            }
            on = PERIOD.mul_f64(d).max(MIN_ON);
            let off = on.mul_f64((1.0 - d) / d);
            {
                let mut c = clock.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(t) = c.on_since.take() {
                    c.sampled += t.elapsed();
                }
            }
            if let Some(l) = links.take() {
                detach(l);
            }
            rx_link = None;
            if !nap(stop, off) {
                return;
            }
            match progs.attach() {
                Ok(l) => {
                    clock.lock().unwrap_or_else(|e| e.into_inner()).on_since = Some(Instant::now());
                    links = Some(l);
                    if armed {
                        rx_link = progs.attach_rx();
                    }
                }
                // Could not attach again: the sums cover the phases that ran.
                Err(_) => return,
            }
        }
    }

    /// A per-CPU map's one value on each of `n` possible CPUs (`size` bytes each): the
    /// kernel writes one per possible CPU, so the buffer is sized from the exact list.
    fn per_cpu(map: &OwnedFd, size: usize, n: usize) -> std::io::Result<Vec<u8>> {
        let mut v = vec![0u8; size * n];
        map_lookup(map, &0u32.to_ne_bytes(), &mut v)?;
        Ok(v)
    }

    /// Each possible CPU's receive softirq time so far (ns), in `possible`'s order.
    fn rx_ns(acc: &OwnedFd, n: usize) -> Option<Vec<u64>> {
        let v = per_cpu(acc, ACC, n).ok()?;
        Some(v.chunks_exact(ACC).map(|c| u64_at(c, 0)).collect())
    }

    impl Timer {
        /// Loads and attaches the timer; the packets received on devices of the namespace
        /// with inode `netns` are timed apart.
        pub fn start(netns: u32) -> Result<Timer, BpfError> {
            let what = "loading the softirq timer (BPF on the softirq_entry/exit, \
                        netif_rx, netif_receive_skb and napi_poll raw tracepoints)";
            let btf = Vmlinux::open().map_err(|e| BpfError::Kernel(format!("{VMLINUX}: {e}")))?;
            let offsets = Btf::parse(btf.bytes()).and_then(|b| {
                Ok([
                    b.offset("sk_buff", &["dev"])?,
                    b.offset("net_device", &["nd_net", "net"])?,
                    b.offset("net", &["ns", "inum"])?,
                    b.offset("sk_buff", &["protocol"])?,
                    b.offset("sk_buff", &["data"])?,
                ])
            });
            let [skb_dev, dev_net, net_inum, skb_protocol, skb_data] =
                offsets.map_err(|e| BpfError::Kernel(e.to_string()))?;
            drop(btf);
            let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")
                .map_err(|e| BpfError::Kernel(format!("/sys/devices/system/cpu/possible: {e}")))
                .and_then(|t| {
                    possible_cpus(&t).ok_or_else(|| {
                        BpfError::Kernel(format!(
                            "/sys/devices/system/cpu/possible: no CPU list in {:?}",
                            t.trim()
                        ))
                    })
                })?;
            let mut maps = Vec::new();
            for m in &MAPS {
                maps.push((m.0, map_create(m).map_err(|e| refused(what, e))?));
            }
            let conf: Vec<u8> = [skb_dev, dev_net, net_inum, netns, skb_protocol, skb_data]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect();
            map_update(&maps[0].1, &0u32.to_ne_bytes(), &conf)
                .map_err(|e| refused(what, Error::os(what, e)))?;
            let load = |name: &str| {
                load_program(
                    OBJ,
                    &format!("raw_tracepoint/{name}"),
                    &maps,
                    "lt_softirq",
                    what,
                    PROG_RAW_TRACEPOINT,
                )
            };
            let progs = Progs {
                entry: load("softirq_entry")?,
                exit: load("softirq_exit")?,
                recv: load("netif_receive_skb")?,
                napi: load("napi_poll")?,
                // The backlog wait costs a run on every packet queued to a backlog (a fifth
                // more kernel time per packet, and the timing of a fast proxy's packets with
                // it): attached only once a CPU is busy in the receive softirq — a queue
                // needs a busy CPU; an idle one is never waited on.
                rx: load("netif_rx")?,
            };
            let first = progs.attach()?;
            let clock = Arc::new(Mutex::new(Clock {
                started: Instant::now(),
                sampled: Duration::ZERO,
                on_since: Some(Instant::now()),
            }));
            let qhist = maps.swap_remove(2).1;
            let acc = maps.swap_remove(1).1;
            let stop = Arc::new(AtomicBool::new(false));
            let acc2 = acc
                .try_clone()
                .map_err(|e| BpfError::Kernel(format!("the softirq timer's map: {e}")))?;
            let (stop2, clock2, n) = (stop.clone(), clock.clone(), possible.len());
            let duty = std::thread::Builder::new()
                .name("lagtrace-softirq".into())
                .spawn(move || run_in_phases(&stop2, &acc2, n, &progs, first, &clock2))
                .map_err(|e| BpfError::Kernel(format!("the softirq timer's thread: {e}")))?;
            Ok(Timer {
                acc,
                qhist,
                possible,
                clock,
                duty: Some((stop, duty)),
            })
        }

        /// Each possible CPU's sums, indexed by CPU id (a CPU that is not possible has
        /// zeros), scaled to the time since the start when the programs ran in phases; and
        /// the share of that time they were attached.
        pub fn read(&self) -> Result<(Vec<Times>, f64), BpfError> {
            let share = self.clock.lock().unwrap_or_else(|e| e.into_inner()).share();
            let n = self.possible.len();
            let v = per_cpu(&self.acc, ACC, n).map_err(|e| {
                BpfError::Kernel(format!("reading the softirq timer's per-CPU sums: {e}"))
            })?;
            let h = per_cpu(&self.qhist, QHIST, n).map_err(|e| {
                BpfError::Kernel(format!("reading the backlog waits' per-CPU histogram: {e}"))
            })?;
            let last = self.possible.iter().max().map_or(0, |m| *m as usize);
            let mut out = vec![Times::default(); last + 1];
            for (slot, (c, hc)) in v.chunks_exact(ACC).zip(h.chunks_exact(QHIST)).enumerate() {
                let f = |i: usize| u64_at(c, i * 8);
                let scaled = |i: usize| (f(i) as f64 / share).round() as u64;
                if let Some(&cpu) = self.possible.get(slot) {
                    let hist = (0..QBUCKETS).map(|b| u64_at(hc, b * 8)).collect();
                    out[cpu as usize] = Times {
                        rx_ns: scaled(0),
                        rx_runs: scaled(1),
                        tx_ns: scaled(2),
                        tx_runs: scaled(3),
                        ns_ns: scaled(6),
                        ns_packets: scaled(7),
                        q_ns: f(12),
                        q_packets: f(13),
                        q_max_ns: f(14),
                        q_hist: hist,
                    };
                }
            }
            Ok((out, share))
        }
    }
}

#[cfg(lagtrace_bpf)]
pub use imp::Timer;

/// Without the program (built without clang): never starts.
#[cfg(not(lagtrace_bpf))]
pub struct Timer(());

#[cfg(not(lagtrace_bpf))]
impl Timer {
    /// Always `NotBuilt`, with the build's reason.
    pub fn start(_netns: u32) -> Result<Timer, BpfError> {
        Err(BpfError::NotBuilt(env!("LAGTRACE_BPF_BUILD")))
    }

    /// Never reached.
    pub fn read(&self) -> Result<(Vec<Times>, f64), BpfError> {
        Ok((Vec::new(), 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // This machine's /proc/net/softnet_stat (kernel 6.18: 15 columns, the CPU in the 13th).
    const A: &str = "0b025e91 00000000 0000003d 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n\
                     0aca4dbc 00000000 0000004c 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000000\n";

    #[test]
    fn wait_buckets_invert_and_give_quantiles() {
        // Every µs value lies in its bucket's range, buckets in order, ~19 % wide.
        let mut last = 0;
        for us in (0..5000u64).chain([10_000, 123_456, 1 << 30]) {
            let b = wait_bucket(us);
            let (lo, hi) = bucket_range(b);
            assert!(lo <= us && us <= hi, "{us} in bucket {b} = {lo}..={hi}");
            assert!(b >= last || us > 5000);
            last = b;
            if us >= 16 {
                assert!(
                    (hi - lo + 1) as f64 <= 0.26 * lo as f64,
                    "{us}: {lo}..={hi}"
                );
            }
        }
        assert_eq!(wait_bucket(u64::MAX), QBUCKETS - 1);
        let mut h = vec![0u64; QBUCKETS];
        h[wait_bucket(8)] = 90;
        h[wait_bucket(700)] = 10;
        assert_eq!(hist_quantile(&h, 0.5), Some(8));
        let p99 = hist_quantile(&h, 0.99).unwrap();
        assert!((640..=767).contains(&p99), "{p99}");
        assert_eq!(hist_quantile(&[0; 4], 0.5), None);
    }

    #[test]
    fn lists_every_possible_cpu() {
        assert_eq!(possible_cpus("0-1\n"), Some(vec![0, 1]));
        assert_eq!(possible_cpus("0,2-3"), Some(vec![0, 2, 3]));
        assert_eq!(possible_cpus("0-8191").map(|v| v.len()), Some(8192));
        assert_eq!(possible_cpus(""), None);
        assert_eq!(possible_cpus("x"), None);
        assert_eq!(possible_cpus("3-1"), None);
    }

    #[test]
    fn the_timer_runs_throughout_at_low_rates_and_in_phases_above() {
        assert_eq!(duty(0.0), 1.0);
        assert_eq!(duty(FULL_RATE), 1.0);
        assert!((duty(4.0 * FULL_RATE) - 0.25).abs() < 1e-9);
        assert_eq!(duty(1e9), MIN_DUTY);
    }

    #[test]
    fn parses_softnet_stat() {
        let v = parse_softnet(A);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].processed, 0x0b02_5e91);
        assert_eq!(v[1].cpu, 1);
        assert_eq!(v[1].squeezed, 0x4c);
        // An old kernel's three columns: the line's place is the CPU.
        let old = parse_softnet("00000010 00000001 00000002\n00000020 00000000 00000000\n");
        assert_eq!(old[1].cpu, 1);
        assert_eq!(old[0].dropped, 1);
        assert!(parse_softnet("garbage\n\n").is_empty());
    }

    #[test]
    fn the_report_is_per_packet_and_per_cpu_and_survives_a_wrap() {
        let a = vec![
            Softnet {
                cpu: 0,
                processed: 1000,
                dropped: 0,
                squeezed: 0,
            },
            Softnet {
                cpu: 1,
                processed: 0xffff_fff0,
                dropped: 5,
                squeezed: 1,
            },
        ];
        let b = vec![
            Softnet {
                cpu: 0,
                processed: 3000,
                dropped: 0,
                squeezed: 0,
            },
            Softnet {
                cpu: 1,
                processed: 0x10,
                dropped: 7,
                squeezed: 4,
            },
        ];
        let t = [
            Times {
                rx_ns: 600_000_000,
                ns_ns: 500_000_000,
                ns_packets: 1000,
                ..Times::default()
            },
            Times {
                rx_ns: 10_000_000,
                tx_ns: 1_000_000,
                ..Times::default()
            },
        ];
        let r = report(&a, &b, Some((&t, 1.0)), 0, 1_000_000);
        assert!(r.timed);
        assert_eq!(r.cpus[0].cpu, 0, "busiest first");
        assert_eq!(r.cpus[1].rx_packets, 0x20, "through the wrap");
        assert_eq!(r.rx_packets, 2000 + 0x20);
        assert_eq!(r.rx_us, 610_000);
        assert_eq!(r.rx_ns_per_packet, Some(610_000_000 / 2032));
        assert!((r.busiest_rx_share - 0.6).abs() < 1e-9);
        assert_eq!((r.backlog_drops, r.time_squeeze), (2, 3));
        assert_eq!(r.netns_packets, 1000);
        assert_eq!(r.netns_ns_per_packet, Some(500_000));
        let untimed = report(&a, &b, None, 0, 1_000_000);
        assert!(!untimed.timed);
        assert_eq!(untimed.rx_ns_per_packet, None);
    }
}
