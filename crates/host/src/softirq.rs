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

/// The window's report from the softnet readings at its ends, the CPUs' softirq times
/// (`None`: not timed) indexed by CPU, and ksoftirqd's CPU time (µs). The softnet counters
/// are 32-bit and wrap: a counter that went down counted through its wrap.
pub fn report(
    a: &[Softnet],
    b: &[Softnet],
    times: Option<&[Times]>,
    ksoftirqd_us: u64,
    window_us: u64,
) -> Softirq {
    let d = |x: u64, y: u64| {
        if y >= x {
            y - x
        } else {
            (y + (1 << 32)).saturating_sub(x)
        }
    };
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
                rx_packets: d(s.processed, e.processed),
                rx_share: t.rx_ns as f64 / 1000.0 / window_us.max(1) as f64,
                backlog_drops: d(s.dropped, e.dropped),
                time_squeeze: d(s.squeezed, e.squeezed),
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

#[cfg(lagtrace_bpf)]
mod imp {
    use super::*;
    use crate::bpf::{load_program, refused};
    use lagtrace_bpf::btf::{Btf, VMLINUX, Vmlinux};
    use lagtrace_bpf::{Error, MAP_ARRAY, MAP_PERCPU_ARRAY, MapSpec, PROG_RAW_TRACEPOINT};
    use lagtrace_bpf::{map_create, map_lookup, map_update, u64_at};
    use std::os::fd::OwnedFd;

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

    /// The busiest CPU's share of a watch interval in the receive softirq at which the
    /// backlog wait starts to be timed: a little under the share the rule needs
    /// (`softirq-saturated`: half the window). A healthy nginx at c=32 over a veth keeps its
    /// busiest CPU ~25–35 % in it, and the program's run per packet cost a fast proxy's join
    /// a few points when it was always attached.
    const ARM_SHARE: f64 = 0.45;
    /// How often the watch looks.
    const WATCH: std::time::Duration = std::time::Duration::from_millis(200);

    /// The timer while attached (detached when dropped).
    pub struct Timer {
        acc: OwnedFd,
        qhist: OwnedFd,
        /// The possible CPUs' ids, in the order a per-CPU map's value lists them.
        possible: Vec<u32>,
        _links: Vec<OwnedFd>,
        /// The watch that attaches the backlog-wait program once a CPU is busy in the
        /// receive softirq; stopped (and the program detached) when the timer drops.
        watch: Option<(
            std::sync::Arc<std::sync::atomic::AtomicBool>,
            std::thread::JoinHandle<()>,
        )>,
    }

    impl Drop for Timer {
        fn drop(&mut self) {
            if let Some((stop, t)) = self.watch.take() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let _ = t.join();
            }
        }
    }

    /// The watch: every [`WATCH`], each CPU's receive softirq time; once one spent
    /// [`ARM_SHARE`] of an interval there, `prog` is attached to `netif_rx` and kept
    /// attached until `stop` (then detached with the thread's end).
    fn arm_when_busy(
        stop: &std::sync::atomic::AtomicBool,
        acc: &OwnedFd,
        n: usize,
        prog: &OwnedFd,
    ) {
        use std::sync::atomic::Ordering;
        let mut last = rx_ns(acc, n);
        let mut link = None;
        while !stop.load(Ordering::Relaxed) {
            // In short steps: the timer's drop waits for this thread.
            for _ in 0..4 {
                std::thread::sleep(WATCH / 4);
                if stop.load(Ordering::Relaxed) {
                    return;
                }
            }
            if link.is_some() {
                continue;
            }
            let now = rx_ns(acc, n);
            let busy = match (&last, &now) {
                (Some(a), Some(b)) => a.iter().zip(b).any(|(a, b)| {
                    b.saturating_sub(*a) as f64 >= ARM_SHARE * WATCH.as_nanos() as f64
                }),
                _ => false,
            };
            if busy {
                link = lagtrace_bpf::attach_raw_tracepoint(c"netif_rx", prog).ok();
            }
            last = now;
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
            let mut links = Vec::new();
            for (name, tp) in [
                ("softirq_entry", c"softirq_entry"),
                ("softirq_exit", c"softirq_exit"),
                ("netif_receive_skb", c"netif_receive_skb"),
                ("napi_poll", c"napi_poll"),
            ] {
                let prog = load(name)?;
                let link = lagtrace_bpf::attach_raw_tracepoint(tp, &prog).map_err(|e| {
                    let what = format!("attaching it to the {name} tracepoint");
                    refused(&what, Error::os(what.clone(), e))
                })?;
                links.push(prog);
                links.push(link);
            }
            // The backlog wait costs a program run on every packet queued to a backlog (a
            // fifth more kernel time per packet, and the timing of a fast proxy's packets
            // with it): attached only once a CPU spends ARM_SHARE of an interval in the
            // receive softirq — a queue needs a busy CPU; an idle one is never waited on.
            let rx = load("netif_rx")?;
            let qhist = maps.swap_remove(2).1;
            let acc = maps.swap_remove(1).1;
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let watch = {
                let (stop, acc, n) = (stop.clone(), acc.try_clone(), possible.len());
                acc.ok().and_then(|acc| {
                    std::thread::Builder::new()
                        .name("lagtrace-softirq".into())
                        .spawn(move || arm_when_busy(&stop, &acc, n, &rx))
                        .ok()
                })
            };
            Ok(Timer {
                acc,
                qhist,
                possible,
                _links: links,
                watch: watch.map(|t| (stop, t)),
            })
        }

        /// Each possible CPU's sums so far, indexed by CPU id (a CPU that is not possible
        /// has zeros).
        pub fn read(&self) -> Result<Vec<Times>, BpfError> {
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
                if let Some(&cpu) = self.possible.get(slot) {
                    let hist = (0..QBUCKETS).map(|b| u64_at(hc, b * 8)).collect();
                    out[cpu as usize] = Times {
                        rx_ns: f(0),
                        rx_runs: f(1),
                        tx_ns: f(2),
                        tx_runs: f(3),
                        ns_ns: f(6),
                        ns_packets: f(7),
                        q_ns: f(12),
                        q_packets: f(13),
                        q_max_ns: f(14),
                        q_hist: hist,
                    };
                }
            }
            Ok(out)
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
    pub fn read(&self) -> Result<Vec<Times>, BpfError> {
        Ok(Vec::new())
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
        let r = report(&a, &b, Some(&t), 0, 1_000_000);
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
