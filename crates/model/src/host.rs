//! `lagtrace host --json`: the server host's kernel evidence over a window — what moved in
//! the namespace's TCP/IP counters, listen queues, qdiscs and socket memory, and in the
//! process's cgroup CPU accounting and its threads' run-queue delay.
//!
//! Each part is a [`Layer`]: `ok` with its data, or `skipped`/`unavailable`/`error` with the
//! reason (a missing capability is named there; the other parts still run).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::diagnosis::evidence::Layer;

/// What `lagtrace host` measured over one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostReport {
    /// Which namespace and process were watched.
    pub scope: HostScope,
    /// Length of the window, from the first reading to the last.
    pub window_us: u64,
    /// `/proc/net/netstat` and `/proc/net/snmp` counters (TcpExt, Tcp, Ip, ...) that moved.
    pub counters: Layer<Vec<CounterDelta>>,
    /// The listening TCP sockets (of the process with `--pid`, else of the namespace).
    pub listeners: Layer<Vec<ListenerQueue>>,
    /// The process's cgroup CPU accounting (needs `--pid`).
    pub cgroup: Layer<CgroupCpu>,
    /// The process's threads' run-queue delay (needs `--pid`).
    pub threads: Layer<ThreadSched>,
    /// Who used the host's CPUs over the window: all of them, the measuring process itself,
    /// the watched process, and the largest other users.
    #[serde(default = "not_measured")]
    pub cpu: Layer<HostCpu>,
    /// The qdiscs of the namespace's devices (rtnetlink).
    pub qdiscs: Layer<Vec<QdiscDelta>>,
    /// `/proc/net/sockstat` at the end of the window.
    pub sockstat: Layer<SockStat>,
    /// Drops by reason (and device) from the `skb:kfree_skb` tracepoint: the watched
    /// namespace's, or machine-wide when the per-namespace counter cannot run.
    pub drops: Layer<DropsByReason>,
    /// Where the watched process's threads were while off a CPU, by why (needs `--pid`):
    /// a BPF program on `sched:sched_switch` notes each thread's kernel stack and state
    /// when it leaves a CPU and times the block until it gets one again.
    #[serde(default = "offcpu_not_measured")]
    pub offcpu: Layer<OffCpu>,
    /// Where the watched process's threads were while on a CPU (needs `--pid`): CPU-clock
    /// samples of every CPU, a BPF program keeping the watched processes' kernel and user
    /// stacks, counted in the kernel; named from `/proc/kallsyms` and the binaries' ELF
    /// symbols (and perf maps, for JIT-compiled code).
    #[serde(default = "oncpu_not_measured")]
    pub oncpu: Layer<OnCpu>,
    /// The block devices that did I/O over the window (`/proc/diskstats`) and the I/O
    /// limits of the watched process's cgroup (v1 `blkio.throttle.*`, v2 `io.max`).
    #[serde(default = "disks_not_measured")]
    pub disks: Layer<Disks>,
    /// The kernel's own packet processing over the window: time in the network softirqs
    /// per CPU, and per packet of the watched namespace (BPF on the `softirq_entry`/`exit`,
    /// `netif_receive_skb` and `napi_poll` raw tracepoints), and `/proc/net/softnet_stat`
    /// (packets processed, backlog drops, time squeezes).
    #[serde(default = "softirq_not_measured")]
    pub softirq: Layer<Softirq>,
    /// The netfilter rules (nftables, iptables-nft) a packet to the watched port walks on
    /// its way in, in the watched namespace.
    #[serde(default = "netfilter_not_measured")]
    pub netfilter: Layer<Netfilter>,
    /// Connection tracking in the namespace (`conntrack -S` and the table's fill) over the
    /// window; skipped where the namespace has no table.
    #[serde(default = "conntrack_not_measured")]
    pub conntrack: Layer<Conntrack>,
    /// What the measurement itself cost.
    pub cost: HostCost,
}

fn softirq_not_measured() -> Layer<Softirq> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

fn netfilter_not_measured() -> Layer<Netfilter> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

fn conntrack_not_measured() -> Layer<Conntrack> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

/// Connection tracking (`nf_conntrack`) in the namespace over the window: the table's fill
/// at its ends and what `conntrack -S` counted in between, summed over the CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Conntrack {
    /// Entries at the end of the window (`net.netfilter.nf_conntrack_count`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// The table's size (`net.netfilter.nf_conntrack_max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// The larger of the entries at the window's two ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
    /// Packets dropped because the table was full and no entry could be evicted (`drop`):
    /// a new connection's SYN among them waits for its retransmission.
    pub drop: u64,
    /// Entries evicted early to make room for new ones (`early_drop`).
    pub early_drop: u64,
    /// New entries that could not be inserted (`insert_failed`: a race between CPUs, or a
    /// table full), their packets dropped.
    pub insert_failed: u64,
    /// Packets conntrack could not track (`invalid`), dropped by a `ct state invalid drop`.
    pub invalid: u64,
}

impl Conntrack {
    /// Packets of new connections the table lost: dropped when full, or not inserted.
    pub fn lost(&self) -> u64 {
        self.drop + self.insert_failed
    }
}

fn one() -> f64 {
    1.0
}

/// The kernel's packet processing in softirq context over the window, machine-wide (a
/// softirq serves every namespace on its CPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Softirq {
    /// Whether the softirq times were measured (the BPF timer ran); without it only
    /// `softnet_stat`'s counts are known and every time is 0.
    pub timed: bool,
    /// The share of the window the timer ran (0..1; 1: throughout). At high packet rates it
    /// runs in phases, so that its own cost — a program run per softirq and per packet —
    /// stays near 1 % of a core; the times, runs and the namespace's packets are then
    /// scaled to the window (the backlog wait's `packets` stay the ones timed).
    #[serde(default = "one")]
    pub timed_share: f64,
    /// Per CPU, busiest first by receive time.
    pub cpus: Vec<SoftirqCpu>,
    /// Time in the receive softirq (NET_RX) on all CPUs (µs).
    pub rx_us: u64,
    /// Time in the transmit softirq (NET_TX) on all CPUs (µs).
    pub tx_us: u64,
    /// Packets the stack received (`softnet_stat`'s processed, all CPUs; packets received
    /// outside a softirq — threaded NAPI, busy polling — included, their time not).
    pub rx_packets: u64,
    /// Receive softirq time per packet (ns): what the kernel spends on each packet it
    /// receives — driver, IP, netfilter's hooks, TCP — before a socket has it.
    pub rx_ns_per_packet: Option<u64>,
    /// Packets received on devices of the watched namespace (the server's), within a
    /// receive softirq.
    pub netns_packets: u64,
    /// Receive time of those packets, each timed from its entry into the stack
    /// (`net:netif_receive_skb`) to the next packet's or the softirq's end (µs).
    pub netns_rx_us: u64,
    /// The watched namespace's receive time per packet (ns): its own rules and sockets,
    /// apart from the other namespaces' packets on the same CPUs.
    pub netns_ns_per_packet: Option<u64>,
    /// The busiest CPU's share of its time in the receive softirq (0..1).
    pub busiest_rx_share: f64,
    /// How long the watched namespace's TCP packets waited in a CPU's backlog queue before
    /// its receive softirq took them (`net:netif_rx` to `net:netif_receive_skb`: loopback,
    /// veth and RPS-steered packets; a driver's own NAPI poll queues nothing this sees).
    /// `None`: none was timed.
    #[serde(default)]
    pub netns_backlog_wait: Option<BacklogWait>,
    /// Packets dropped because a CPU's backlog queue was full (`softnet_stat` column 2,
    /// all CPUs): `net.core.netdev_max_backlog`.
    pub backlog_drops: u64,
    /// Times a receive softirq stopped with work left (budget or time spent,
    /// `softnet_stat` column 3, all CPUs).
    pub time_squeeze: u64,
    /// Time in `ksoftirqd` threads (softirq work deferred to a thread because it kept
    /// coming, µs).
    pub ksoftirqd_us: u64,
    /// The window the times are over (µs).
    pub window_us: u64,
}

impl Softirq {
    /// The receive cost per packet that speaks for the watched namespace (ns): its own
    /// packets' when it received enough of them to tell (100), else the machine's.
    pub fn per_packet_ns(&self) -> Option<u64> {
        self.own_per_packet_ns().or(self.rx_ns_per_packet)
    }

    /// The watched namespace's own receive cost per packet (ns), when it received enough
    /// packets (100) for the figure to speak for it.
    pub fn own_per_packet_ns(&self) -> Option<u64> {
        self.netns_ns_per_packet
            .filter(|_| self.netns_packets >= 100)
    }
}

/// Packets' waits in a CPU's backlog queue, before the receive softirq took them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct BacklogWait {
    /// Packets timed.
    pub packets: u64,
    /// Mean wait (µs).
    pub mean_us: u64,
    /// Median wait (µs, the middle of a histogram bucket ~19 % wide).
    pub p50_us: u64,
    /// 99th percentile (µs, as the median).
    pub p99_us: u64,
    /// The longest (µs, exact).
    pub max_us: u64,
}

/// One CPU's softirq work over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct SoftirqCpu {
    /// CPU number.
    pub cpu: u32,
    /// Time in NET_RX (µs).
    pub rx_us: u64,
    /// Time in NET_TX (µs).
    pub tx_us: u64,
    /// Packets received (`softnet_stat`'s processed).
    pub rx_packets: u64,
    /// Share of the window in NET_RX (0..1).
    pub rx_share: f64,
    /// `softnet_stat` backlog drops.
    pub backlog_drops: u64,
    /// `softnet_stat` time squeezes.
    pub time_squeeze: u64,
}

/// The netfilter ruleset of the watched namespace, and the walk a packet to the port
/// makes through it on input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct Netfilter {
    /// Rules in the whole ruleset (every table and chain).
    pub rules: u64,
    /// The TCP port the walk is for (the server's).
    pub port: Option<u16>,
    /// The base chains on the receive path (prerouting, input) of the `ip`/`inet` families,
    /// in the order the kernel runs them (hook, then priority), each with the walk a TCP
    /// packet to the port makes in it.
    pub walks: Vec<ChainWalk>,
    /// Where the rules came from (e.g. `nft -j list ruleset`), and what could not be read.
    pub source: String,
}

/// The rules a packet to the port evaluates in one base chain (and the chains it jumps to)
/// before a verdict: a packet of an established connection, and a new connection's first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct ChainWalk {
    /// `ip`, `ip6` or `inet`.
    pub family: String,
    /// Table name.
    pub table: String,
    /// Chain name.
    pub chain: String,
    /// `prerouting` or `input`.
    pub hook: String,
    /// The chain's priority (lower runs first).
    pub priority: i64,
    /// Rules in the chain and the chains it jumps to.
    pub rules: u64,
    /// Rules a packet of an established connection (a data or ACK segment: conntrack state
    /// established) evaluates before a verdict (a set or map lookup is one rule): the walk
    /// every packet but a connection's first pays.
    pub walked: u64,
    /// How that walk ended: `accept`, `drop`, `reject`, `policy accept`, `policy drop`,
    /// `unknown` (a rule the walk cannot evaluate: it may decide), or `not reached` (walked
    /// 0: an earlier chain dropped the packet, or a nat chain, which only a connection's
    /// first packet runs).
    pub verdict: String,
    /// The handle of the rule that decided the established connection's packet, when one did.
    pub decided_by: Option<u64>,
    /// Rules a new connection's first packet (its SYN, conntrack state new) evaluates
    /// before a verdict: the walk every connection pays once.
    #[serde(default)]
    pub walked_new: u64,
    /// How that walk ended (as `verdict`).
    #[serde(default)]
    pub verdict_new: String,
    /// The handle of the rule that decided the new connection's first packet, when one did.
    #[serde(default)]
    pub decided_by_new: Option<u64>,
}

fn offcpu_not_measured() -> Layer<OffCpu> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

fn oncpu_not_measured() -> Layer<OnCpu> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

fn disks_not_measured() -> Layer<Disks> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

/// The block devices' I/O over the window and the watched process's I/O limits.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Disks {
    /// The devices that completed I/O, most I/Os first.
    pub devices: Vec<DiskDelta>,
    /// The limits on the watched process's cgroup and its ancestors (empty without `--pid`,
    /// or none set).
    pub limits: Vec<IoLimit>,
}

impl Disks {
    /// The limit on device `dev` (`7:3`) of kind `limit` (`read-iops`), if one is set.
    pub fn limit(&self, dev: &str, limit: &str) -> Option<&IoLimit> {
        self.limits
            .iter()
            .find(|l| l.dev == dev && l.limit == limit)
    }
}

/// One device's I/O over the window (`/proc/diskstats` deltas).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DiskDelta {
    /// Its kernel name (`loop3`, `nvme0n1`).
    pub device: String,
    /// `MAJ:MIN`.
    pub dev: String,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Time the reads spent at the device (issue to completion, summed), µs (ms resolution).
    pub read_us: u64,
    /// The same for the writes.
    pub write_us: u64,
    /// Time the device had I/O in flight, µs (ms resolution).
    pub busy_us: u64,
}

impl DiskDelta {
    /// The device's own time per read, µs.
    pub fn per_read_us(&self) -> Option<u64> {
        (self.reads > 0).then(|| self.read_us / self.reads)
    }
}

/// One I/O limit of a cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IoLimit {
    /// The device, `MAJ:MIN`.
    pub dev: String,
    /// Its name, when it is a block device of this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `read-iops`, `write-iops`, `read-bps` or `write-bps`.
    pub limit: String,
    /// Per second.
    pub value: u64,
    /// The file that sets it.
    pub file: String,
}

/// The watched processes' on-CPU profile over the window.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct OnCpu {
    /// Samples a second on each CPU.
    pub hz: u64,
    /// CPUs sampled.
    pub cpus: u32,
    /// Samples that found a watched process's thread on the CPU: at `hz`, each is
    /// `1/hz` s of its CPU time.
    pub samples: u64,
    /// Where the samples' innermost frame was (the self time), by module — a binary, a
    /// shared library, `[kernel]`, `[jit]` for anonymous code — largest first, at most 8.
    pub modules: Vec<HotModule>,
    /// The innermost frames with the most samples, largest first, at most 12. A function is
    /// named only where an ELF symbol (or a perf map's entry) covers the address; else the
    /// module alone is.
    pub functions: Vec<HotFunction>,
    /// Whole stacks, root first, frames joined by `;` (Brendan Gregg's folded format, as
    /// `stackcollapse-perf.pl` writes it), with their samples: largest first, at most
    /// [`OnCpu::FOLDED_MAX`].
    pub folded: Vec<FoldedStack>,
    /// Samples of the stacks beyond that bound (left out of `folded`).
    pub folded_left_out: u64,
    /// The deepest user stack seen, frames: 1 means the binaries keep no frame pointers
    /// (Debian's builds), so a user stack is its innermost function only.
    pub user_depth: u32,
    /// Samples that lost a stack (two stacks hashed to one bucket of the kernel's stack
    /// map, or it was full) or were not counted (the count map full).
    pub missed: u64,
    /// What would name frames the profile could not (an interpreter or JIT runtime's flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// The program's run time in the kernel over the window, µs, and its runs (every
    /// sample on every CPU) — when `kernel.bpf_stats_enabled` is 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_run_us: Option<u64>,
    /// See `bpf_run_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_runs: Option<u64>,
}

impl OnCpu {
    /// Stacks kept in `folded` at most.
    pub const FOLDED_MAX: usize = 400;

    /// The module with the most self time, with its share of the samples.
    pub fn top_module(&self) -> Option<&HotModule> {
        self.modules.first()
    }
}

/// One module's self time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HotModule {
    /// Its file name (`libcrypto.so.3`), `[kernel]`, or `[jit]`/`[anon]` for code in
    /// anonymous memory.
    pub module: String,
    /// Samples whose innermost frame lay in it.
    pub samples: u64,
    /// Of all samples, 0–1.
    pub share: f64,
}

/// One function's self time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HotFunction {
    /// Its name, when a symbol covers the sampled addresses (absent: stripped, the module's
    /// `.dynsym` has no symbol there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// The module it lies in.
    pub module: String,
    /// Samples.
    pub samples: u64,
    /// Of all samples, 0–1.
    pub share: f64,
}

impl HotFunction {
    /// `bn_sqr8x_internal (libcrypto.so.3)`, or `libcrypto.so.3 (no symbol)`.
    pub fn label(&self) -> String {
        match &self.function {
            Some(f) => format!("{f} ({})", self.module),
            None => format!("{} (no symbol)", self.module),
        }
    }
}

/// One stack of the folded profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FoldedStack {
    /// Frames, root first, joined by `;`: `module`function` for user code (`module` alone
    /// where no symbol covers it), `function_[k]` for the kernel's.
    pub stack: String,
    /// Samples.
    pub samples: u64,
}

/// Why a thread was off its CPU: from the state it left in and the kernel functions on its
/// stack then (the scheduler's own frames left out).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum WaitClass {
    /// Runnable but preempted: waiting for a CPU (run-queue).
    RunQueue,
    /// Blocked on block I/O (`io_schedule`: a read of file data not in the page cache, a
    /// synchronous write).
    Disk,
    /// Waiting on a futex: a lock, a condition variable or a semaphore — contention, or an
    /// idle worker waiting for work.
    Futex,
    /// A timed sleep (`nanosleep`, `clock_nanosleep`).
    Sleep,
    /// Waiting in `epoll_wait`, `poll` or `select`: for a descriptor to be ready or a timeout.
    Poll,
    /// Waiting in `accept` for a connection.
    Accept,
    /// Waiting for data on a socket (`recv`, `read`).
    SocketRead,
    /// Waiting for room in a socket's send buffer.
    SocketWrite,
    /// Reading or writing a pipe.
    Pipe,
    /// Anything else: its stack says.
    Other,
}

impl WaitClass {
    /// The name in the JSON (`socket-read`).
    pub fn name(self) -> &'static str {
        match self {
            WaitClass::RunQueue => "run-queue",
            WaitClass::Disk => "disk",
            WaitClass::Futex => "futex",
            WaitClass::Sleep => "sleep",
            WaitClass::Poll => "poll",
            WaitClass::Accept => "accept",
            WaitClass::SocketRead => "socket-read",
            WaitClass::SocketWrite => "socket-write",
            WaitClass::Pipe => "pipe",
            WaitClass::Other => "other",
        }
    }
}

/// The watched threads' time off a CPU over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
pub struct OffCpu {
    /// Time off a CPU by class, all blocks of every watched thread, largest first.
    pub classes: Vec<WaitTotal>,
    /// The kernel stacks with the most time, up to three per class, largest first.
    pub stacks: Vec<WaitStack>,
    /// Blocks as long as this or longer were timed one by one (for the per-request
    /// split); shorter ones are only in the sums. µs.
    pub min_block_us: u64,
    /// Blocks the kernel side had no room for (ring buffer or map full): the split then
    /// misses them.
    pub missed: u64,
    /// The tracer's own cost in the kernel: its program's run time over the window, µs,
    /// and how many times it ran (every context switch on the machine) — when
    /// `kernel.bpf_stats_enabled` is 1, else absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_run_us: Option<u64>,
    /// See `bpf_run_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_runs: Option<u64>,
    /// Where the server's time went while it served requests, when a capture gave their
    /// windows (`diagnose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub during_requests: Option<ServerTimeSplit>,
    /// The same split over the slowest requests only (at or above the p99 of server time):
    /// what the tail waits for, which may not be what the median request does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub during_slowest: Option<SlowestSplit>,
    /// The waits for a CPU ([`OffCpuBlock::waiting_for_cpu`]: preempted while runnable, or
    /// woken and not yet running) at least [`LONG_RUN_QUEUE_US`] long,
    /// by start, at most [`LONG_RUN_QUEUE_MAX`] (the longest): the few long waits for a CPU
    /// a slow request sits through, which the per-interval sums average away. Written out so
    /// a report read back (an agent's, a saved JSON) still places them; absent when the
    /// tracer did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_run_queue: Option<Vec<RunQueueWait>>,
    /// The blocks timed one by one (not written out).
    #[serde(skip)]
    pub blocks: Vec<OffCpuBlock>,
    /// Every stack's frames by the kernel's stack id (not written out).
    #[serde(skip)]
    pub stack_frames: std::collections::BTreeMap<i32, Vec<String>>,
    /// The command name of each process that woke a block ([`OffCpuBlock::waker`]), read
    /// at the end of the window (not written out).
    #[serde(skip)]
    pub wakers: std::collections::BTreeMap<u32, String>,
}

/// The server-time split of the slowest requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SlowestSplit {
    /// The requests at or above this percentile of server time, in percent (`99.0`).
    pub percentile: f64,
    /// The shortest server time among them, µs.
    pub from_us: u64,
    /// Their split.
    pub split: ServerTimeSplit,
}

/// One class's total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WaitTotal {
    /// Why.
    pub class: WaitClass,
    /// Time, all threads, µs.
    pub total_us: u64,
    /// Blocks.
    pub blocks: u64,
}

/// One kernel stack's total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WaitStack {
    /// Its class.
    pub class: WaitClass,
    /// Time, all threads, µs.
    pub total_us: u64,
    /// Blocks.
    pub blocks: u64,
    /// Kernel functions, innermost first, the scheduler's own left out (at most 12).
    pub frames: Vec<String>,
}

/// Run-queue blocks shorter than this are left out of [`OffCpu::long_run_queue`], µs.
pub const LONG_RUN_QUEUE_US: i64 = 1_000;
/// At most this many blocks in [`OffCpu::long_run_queue`].
pub const LONG_RUN_QUEUE_MAX: usize = 2_000;

/// One long wait for a CPU of one thread ([`OffCpu::long_run_queue`]), on `CLOCK_REALTIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunQueueWait {
    /// Thread id.
    pub tid: u32,
    /// When it was preempted, µs since the Unix epoch.
    pub start_us: i64,
    /// When it got a CPU again.
    pub end_us: i64,
}

impl OffCpu {
    /// [`OffCpu::long_run_queue`] from the blocks timed one by one.
    pub fn long_run_queue_of(blocks: &[OffCpuBlock]) -> Vec<RunQueueWait> {
        let mut v: Vec<RunQueueWait> = blocks
            .iter()
            .filter_map(OffCpuBlock::waiting_for_cpu)
            .filter(|w| w.end_us - w.start_us >= LONG_RUN_QUEUE_US)
            .collect();
        if v.len() > LONG_RUN_QUEUE_MAX {
            v.sort_unstable_by_key(|w| std::cmp::Reverse(w.end_us - w.start_us));
            v.truncate(LONG_RUN_QUEUE_MAX);
        }
        v.sort_unstable_by_key(|w| w.start_us);
        v
    }
}

/// One block of one thread, on `CLOCK_REALTIME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuBlock {
    /// Thread id.
    pub tid: u32,
    /// When it left its CPU, µs since the Unix epoch.
    pub start_us: i64,
    /// When it got one again.
    pub end_us: i64,
    /// Why.
    pub class: WaitClass,
    /// The kernel's stack id ([`OffCpu::stack_frames`]; negative: none).
    pub stack: i32,
    /// The process whose thread woke it (`sched:sched_waking` runs in the waker's context;
    /// in an interrupt, whatever ran there), when the tracer saw the wake-up.
    pub waker: Option<u32>,
    /// When it was woken (runnable again), when the tracer saw the wake-up: from then to
    /// `end_us` it waited for a CPU. A preempted thread (run-queue) is never woken.
    pub woken_us: Option<i64>,
}

impl OffCpuBlock {
    /// The part of the block spent waiting for a CPU: all of a preempted thread's block,
    /// the rest of a sleeping one's after its wake-up (the scheduler's wake-up latency —
    /// a thread woken by a request's arrival that then waits for a CPU holds the request
    /// as surely as a preempted one). `None` when neither.
    pub fn waiting_for_cpu(&self) -> Option<RunQueueWait> {
        let start_us = if self.class == WaitClass::RunQueue {
            self.start_us
        } else {
            self.woken_us
                .filter(|&w| w >= self.start_us && w < self.end_us)?
        };
        Some(RunQueueWait {
            tid: self.tid,
            start_us,
            end_us: self.end_us,
        })
    }
}

/// Where the serving thread was during the requests' server time (from the request's last
/// byte to the response's first byte at the capture): its blocks that began and ended
/// within that wait, by class, and its wake-up after the request arrived (run-queue) — a
/// worker idle across many requests is no part of any, another thread's blocks neither.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerTimeSplit {
    /// Requests whose server time was split (weighted when the capture's timings were
    /// sampled).
    pub requests: u64,
    /// Of those, the requests whose serving thread was found (a thread blocked when the
    /// request arrived that woke for it); the others' server time has no parts.
    pub attributed: u64,
    /// Their server time, summed, µs.
    pub server_us: u64,
    /// The part spent in each class, largest first; what is left is the serving thread on
    /// a CPU (or unattributed).
    pub parts: Vec<ServerTimePart>,
    /// The watched processes' CPU time over the window divided by the requests served in
    /// it, µs, when known: what a request costs on a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_per_request_us: Option<u64>,
}

impl ServerTimeSplit {
    /// The share of the server time in `class` (0 when none).
    pub fn share(&self, class: WaitClass) -> f64 {
        self.parts
            .iter()
            .find(|p| p.class == class)
            .map_or(0.0, |p| p.share)
    }

    /// The largest part the serving thread spent waiting in its own work — asleep, on a
    /// futex or on the disk — as opposed to idle, polling or waiting for a CPU.
    pub fn largest_wait(&self) -> Option<&ServerTimePart> {
        self.parts
            .iter()
            .filter(|p| {
                matches!(
                    p.class,
                    WaitClass::Sleep | WaitClass::Futex | WaitClass::Disk
                )
            })
            .max_by(|a, b| a.share.total_cmp(&b.share))
    }
}

/// One class's part of the server time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerTimePart {
    /// Why.
    pub class: WaitClass,
    /// Time, summed over the requests, µs.
    pub us: u64,
    /// Of the server time, 0–1.
    pub share: f64,
    /// The kernel stack with the most of it (innermost first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// The processes whose threads ended these waits (woke the serving thread), most time
    /// first, at most three: an upstream on this host that answered on a Unix or loopback
    /// socket or a pipe is named here even where no packet shows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub woken_by: Vec<WokenBy>,
}

/// The processes (by command) that woke the serving thread inside the server time, and how
/// much of a part's time their wake-ups ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WokenBy {
    /// The process id of the one (of `processes` with this command) that woke the most.
    pub pid: u32,
    /// Their command name (empty: processes that exited before the window ended, or kernel
    /// threads — an interrupt's wake-up, not an upstream's).
    pub comm: String,
    /// The time of the blocks they ended, summed over the requests, µs.
    pub us: u64,
    /// How many processes with this command woke it.
    pub processes: u32,
}

impl HostReport {
    /// Moves every time in the report by `d_us` (an agent's report onto the caller's clock:
    /// its timelines are then compared with the load's records).
    pub fn shift_us(&mut self, d_us: i64) {
        let mv = |t: &mut u64| *t = t.saturating_add_signed(d_us);
        if let Some(c) = self.cgroup.data.as_mut() {
            c.timeline.iter_mut().for_each(|s| mv(&mut s.t_unix_us));
        }
        if let Some(t) = self.threads.data.as_mut() {
            for s in &mut t.timeline {
                mv(&mut s.start_unix_us);
                mv(&mut s.end_unix_us);
            }
        }
        if let Some(d) = self.drops.data.as_mut() {
            for s in &mut d.timeline {
                mv(&mut s.start_unix_us);
                mv(&mut s.end_unix_us);
            }
        }
        if let Some(o) = self.offcpu.data.as_mut() {
            for b in &mut o.blocks {
                b.start_us += d_us;
                b.end_us += d_us;
            }
            for w in o.long_run_queue.iter_mut().flatten() {
                w.start_us += d_us;
                w.end_us += d_us;
            }
        }
    }

    /// The namespace counter `name`'s delta over the window (0 when it did not move or was
    /// not read), e.g. `TcpExt.ListenDrops`.
    pub fn counter(&self, name: &str) -> i64 {
        self.counters
            .get()
            .and_then(|c| c.iter().find(|d| d.name == name))
            .map_or(0, |d| d.delta)
    }

    /// Connections the listener `l` dropped over the window: its own `sk_drops` — which
    /// tells which listener — bounded by the namespace's `TcpExt.ListenDrops`, which counts
    /// only connections dropped at a listener. A listener's `sk_drops` also counts segments
    /// it discarded for requests that were not connections yet: the RST that answers a
    /// SYN-ACK sent to a SYN probe (hping3's, or the path layer's) lands on the listener and
    /// counts there, while ListenDrops does not move.
    pub fn listen_drops(&self, l: &ListenerQueue) -> u64 {
        let ns = u64::try_from(self.counter("TcpExt.ListenDrops")).unwrap_or(0);
        l.drops.unwrap_or(0).min(ns)
    }
}

/// Which namespace and process a host report watched.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct HostScope {
    /// The named network namespace (`--netns`), if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// The process (`--pid`), if one was given; its namespace is the one watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The process's command name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Inode of the watched network namespace (identifies it across names).
    pub netns_inode: u64,
}

/// One kernel counter that moved over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CounterDelta {
    /// `Group.Name` as in the proc file, e.g. `TcpExt.ListenOverflows`, `Tcp.RetransSegs`
    /// (`nstat` prints them joined: `TcpExtListenOverflows`).
    pub name: String,
    /// Value at the start of the window.
    pub before: i64,
    /// Value at the end of the window.
    pub after: i64,
    /// `after - before`.
    pub delta: i64,
}

/// One listening TCP socket over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListenerQueue {
    /// Local address and port, e.g. `0.0.0.0:8080`, `[::]:80`.
    pub local: String,
    /// Socket inode.
    pub inode: u64,
    /// The processes holding it (`pid/comm`), where they could be read.
    pub owners: Vec<String>,
    /// Accept-queue limit (the backlog `listen()` got, capped by `somaxconn`).
    pub max: u32,
    /// Accept-queue length at the end of the window.
    pub current: u32,
    /// Longest accept queue seen while sampling the window.
    pub peak: u32,
    /// Samples taken.
    pub samples: u32,
    /// Samples in which the queue was over its limit (full: the next completed handshake
    /// is dropped).
    pub full_samples: u32,
    /// Segments this listener dropped over the window (its `sk_drops`), where the kernel
    /// reports it: accept-queue overflows and other listen drops, and also the RSTs that
    /// end half-open requests (a SYN probe's). [`HostReport::listen_drops`] keeps the
    /// connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drops: Option<u64>,
    /// Half-open connections to it (SYN received, SYN-ACK sent, handshake not completed: its
    /// SYN queue) at the sample that held the most, where they were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_open_peak: Option<u32>,
    /// Distinct source addresses of those half-open connections at that sample: one
    /// client's burst of connects comes from one or a few, a flood from spoofed sources from
    /// as many as it has entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_open_sources: Option<u32>,
}

/// Half-open connections from at least this many distinct sources in one sample make a
/// flood: a client's burst of connects comes from one address (or a few behind a balancer).
pub const FLOOD_SOURCES: u32 = 16;

impl ListenerQueue {
    /// The SYN queue flooded: at least half full of half-open connections from
    /// [`FLOOD_SOURCES`] or more distinct sources (handshakes that never complete: spoofed
    /// sources); the peak and the sources when so.
    pub fn flooded(&self) -> Option<(u32, u32)> {
        let (n, k) = (self.half_open_peak?, self.half_open_sources?);
        (k >= FLOOD_SOURCES && u64::from(n) * 2 >= u64::from(self.max)).then_some((n, k))
    }
}

/// A cgroup's CPU bandwidth accounting over the window.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct CgroupCpu {
    /// 1 (the `cpu`/`cpuacct` controllers) or 2 (the unified hierarchy).
    pub version: u8,
    /// The cgroup's directory.
    pub path: String,
    /// CPU time allowed per period (`cfs_quota_us` / `cpu.max`); absent when unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_us: Option<u64>,
    /// The enforcement period (`cfs_period_us` / `cpu.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_us: Option<u64>,
    /// Enforcement periods that elapsed (`nr_periods` delta).
    pub periods: u64,
    /// Periods in which the cgroup ran out of quota and was stopped (`nr_throttled` delta).
    pub throttled_periods: u64,
    /// Time the cgroup's threads were held stopped (`throttled_time` / `throttled_usec`).
    pub throttled_us: u64,
    /// `throttled_periods / periods`, 0–1 (0 without periods).
    pub throttled_share: f64,
    /// CPU time the cgroup used (`cpuacct.usage` / `usage_usec`), where readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_us: Option<u64>,
    /// The throttling counters read at every sampling tick of the window (~100 ms apart),
    /// so throttled periods can be placed in time; empty when not sampled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<ThrottleSample>,
}

/// One reading of a cgroup's throttling counters within the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ThrottleSample {
    /// When it was read, µs since the Unix epoch (`CLOCK_REALTIME`, the clock the load's
    /// records' `start_unix_us` and a pcap use).
    pub t_unix_us: u64,
    /// `nr_throttled` since the window's start.
    pub throttled_periods: u64,
    /// Throttled time since the window's start, µs.
    pub throttled_us: u64,
}

/// The process's threads' scheduler accounting (`/proc/PID/task/*/schedstat`) over the window.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ThreadSched {
    /// Threads seen at both ends of the window.
    pub threads: u32,
    /// Time on a CPU, all threads.
    pub run_us: u64,
    /// Time runnable but waiting for a CPU (run-queue delay), all threads. Includes the
    /// time a cgroup CPU quota held them: a throttled thread stays runnable.
    pub wait_us: u64,
    /// `wait / (run + wait)`, 0–1.
    pub wait_share: f64,
    /// Times a thread was put on a CPU, all threads.
    pub timeslices: u64,
    /// The thread that waited longest, and how long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst: Option<ThreadWait>,
    /// The same accounting per sampling interval (~100 ms), so run-queue delay can be
    /// placed next to the slow requests; empty when not sampled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<SchedSample>,
}

fn yes() -> bool {
    true
}

/// A report written before the host's CPU use was measured.
fn not_measured() -> Layer<HostCpu> {
    Layer::skipped("not measured (written by an older lagtrace)")
}

/// The watched threads' scheduler accounting over one sampling interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct SchedSample {
    /// Start of the interval, µs since the Unix epoch (`CLOCK_REALTIME`).
    pub start_unix_us: u64,
    /// End of the interval, µs since the Unix epoch.
    pub end_unix_us: u64,
    /// Time on a CPU in the interval, all threads.
    pub run_us: u64,
    /// Time runnable but waiting for a CPU in the interval, all threads.
    pub wait_us: u64,
    /// Threads that ran or waited in the interval.
    pub active: u32,
    /// Times a thread was put on a CPU in the interval, all threads: `wait_us / timeslices`
    /// is how long one wait for a CPU lasted on average. 0 when not measured (older JSON).
    #[serde(default)]
    pub timeslices: u64,
}

/// Who used the host's CPUs over the window (`/proc/stat`, `/proc/PID/stat`). Tells a
/// server starved by other work from one starved by the measurement itself (a load
/// generator on the same host).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct HostCpu {
    /// CPUs online.
    pub cpus: u32,
    /// CPU time spent, all CPUs (everything but idle and iowait).
    pub busy_us: u64,
    /// `busy / (cpus × window)`, 0–1.
    pub busy_share: f64,
    /// CPU time of the measuring process itself (lagtrace: inside diagnose, the load
    /// generator and the capture too).
    pub own_us: u64,
    /// CPU time of the watched process(es) (the server's threads).
    pub watched_us: u64,
    /// Every other process on the host (kernel threads included).
    pub others_us: u64,
    /// What no process present at the window's end was charged for: interrupts and
    /// softirqs (the network stack's work, much of it this very traffic's), and processes
    /// that started and exited within the window.
    pub unattributed_us: u64,
    /// Whether this lagtrace may run on a CPU the watched process may run on (their CPU
    /// affinity masks overlap): only then can it be what the watched threads wait behind.
    #[serde(default = "yes")]
    pub own_shares_cpus: bool,
    /// The other processes that used the most CPU over the window, largest first (at most 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<ProcCpu>,
}

/// One process's CPU time over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProcCpu {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// CPU time over the window (user + system, all threads).
    pub cpu_us: u64,
}

/// One thread's run-queue delay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadWait {
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`).
    pub name: String,
    /// Time runnable but waiting for a CPU over the window.
    pub wait_us: u64,
}

/// One qdisc over the window, as rtnetlink reports it (`tc -s qdisc` reads the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QdiscDelta {
    /// Device name.
    pub dev: String,
    /// Qdisc kind (`tbf`, `fq_codel`, `noqueue`, ...).
    pub kind: String,
    /// Handle as `tc` prints it, e.g. `8001:`.
    pub handle: String,
    /// Parent as `tc` prints it (`root`, `1:1`, ...).
    pub parent: String,
    /// Packets sent over the window.
    pub packets: u64,
    /// Bytes sent over the window.
    pub bytes: u64,
    /// Packets dropped over the window.
    pub drops: u64,
    /// Overlimit events over the window (shaping held a packet back).
    pub overlimits: u64,
    /// Requeues over the window.
    pub requeues: u64,
    /// Total drops at the end of the window (what `tc -s qdisc` shows as `dropped`).
    pub drops_total: u64,
    /// Queue length (packets) at the end of the window.
    pub qlen: u32,
    /// Bytes queued at the end of the window.
    pub backlog_bytes: u32,
    /// The bytes queued as sampled through the window (every sampling interval): a queue
    /// that stands shows in their median, a burst only in their maximum. Absent when the
    /// window took no sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_sampled: Option<BacklogSamples>,
}

/// A qdisc's backlog sampled through the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct BacklogSamples {
    /// Samples taken.
    pub samples: u32,
    /// Median bytes queued.
    pub p50_bytes: u32,
    /// Most bytes queued.
    pub max_bytes: u32,
}

/// `/proc/net/sockstat` of the namespace at the end of the window.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct SockStat {
    /// TCP sockets in use.
    pub tcp_inuse: u64,
    /// TCP sockets no longer attached to a descriptor.
    pub tcp_orphan: u64,
    /// TCP sockets in TIME-WAIT.
    pub tcp_tw: u64,
    /// TCP sockets allocated.
    pub tcp_alloc: u64,
    /// Pages TCP buffers use (machine-wide).
    pub tcp_mem_pages: u64,
    /// `net.ipv4.tcp_mem` (min, pressure, max pages), where readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_mem_limits: Option<[u64; 3]>,
    /// UDP sockets in use.
    pub udp_inuse: u64,
    /// Pages UDP buffers use (machine-wide).
    pub udp_mem_pages: u64,
}

/// Packets the kernel freed as dropped (`skb:kfree_skb`), by reason, over the window.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct DropsByReason {
    /// What the counts cover: `namespace` — the watched namespace's drops only (`scope.
    /// netns_inode`), counted in the kernel by a BPF program that reads each dropped
    /// packet's namespace and device, split by device in `devices`; or `machine` — every
    /// namespace's (the raw tracepoint carries no namespace or device), when that program
    /// cannot run: `scope_reason` says why.
    pub scope: String,
    /// Why the counts are not per namespace (only with scope `machine`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_reason: Option<String>,
    /// Reasons that occurred, most first.
    pub reasons: Vec<DropReasonCount>,
    /// The same drops by device (scope `namespace` only), most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceDrops>,
    /// Drops not counted (perf ring or BPF map full); counts are then lower bounds.
    pub lost: u64,
    /// The same drops placed in time: each sampling interval (~100 ms) that had drops,
    /// with its drops by reason (intervals without drops are left out). Empty when not
    /// sampled (older JSON).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<DropSample>,
}

/// The drops of one sampling interval of the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DropSample {
    /// Start of the interval, µs since the Unix epoch (`CLOCK_REALTIME`, the clock of the
    /// load's records' `start_unix_us`).
    pub start_unix_us: u64,
    /// End of the interval, µs since the Unix epoch.
    pub end_unix_us: u64,
    /// Drops in the interval by reason, most first.
    pub reasons: Vec<DropReasonCount>,
}

impl DropsByReason {
    /// The intervals with drops of any of `reasons`, as (start, end, those drops).
    pub fn times_of(&self, reasons: &[&str]) -> Vec<(u64, u64, u64)> {
        self.timeline
            .iter()
            .filter_map(|s| {
                let n: u64 = s
                    .reasons
                    .iter()
                    .filter(|r| reasons.contains(&r.reason.as_str()))
                    .map(|r| r.count)
                    .sum();
                (n > 0).then_some((s.start_unix_us, s.end_unix_us, n))
            })
            .collect()
    }
}

/// Drops on one device of the watched namespace: the device a packet was received on or
/// was leaving by (before the output device is set, e.g. in the output netfilter hook,
/// its route's device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceDrops {
    /// Interface index in the namespace; 0 when the packet had neither device nor route.
    pub ifindex: u32,
    /// Its name at the end of the window (absent when it is gone, or for ifindex 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Drops on it, all reasons.
    pub count: u64,
    /// By reason, most first.
    pub reasons: Vec<DropReasonCount>,
}

/// One drop reason and how often it occurred.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DropReasonCount {
    /// The kernel's name without the `SKB_DROP_REASON_` prefix, e.g. `NETFILTER_DROP`.
    pub reason: String,
    /// Packets dropped for it.
    pub count: u64,
}

/// CPU the host layer itself used over the window (its measuring thread's CPU clock).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct HostCost {
    /// User + system CPU time of the measuring thread over the window (inside `diagnose`
    /// the process's other threads run the load, which this does not count), from loading
    /// its programs to naming their stacks.
    pub cpu_us: u64,
    /// `cpu / window`, as a share of one core, 0–1.
    pub cpu_share: f64,
    /// Of `cpu_us`, what it used between the window's first and last readings: the CPU that
    /// competes with the measured server (the programs' loading comes before, naming the
    /// stacks' frames after: a boot's first run reads the kernel's symbols then, ~30 ms).
    #[serde(default)]
    pub window_cpu_us: u64,
    /// `window_cpu / window`, as a share of one core, 0–1.
    #[serde(default)]
    pub window_share: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sleeping thread's block waits for a CPU from its wake-up on; a preempted one all
    /// along; one never seen woken not at all. Only the waits of a millisecond or more are
    /// carried.
    #[test]
    fn the_long_waits_for_a_cpu_are_the_preempted_blocks_and_the_tails_of_woken_ones() {
        let b = |start_us, end_us, class, woken_us| OffCpuBlock {
            tid: 7,
            start_us,
            end_us,
            class,
            stack: -1,
            waker: None,
            woken_us,
        };
        let blocks = [
            b(0, 5_000, WaitClass::Poll, Some(1_000)),
            b(10_000, 13_000, WaitClass::RunQueue, None),
            b(20_000, 30_000, WaitClass::Poll, None),
            b(40_000, 45_000, WaitClass::Poll, Some(44_500)),
        ];
        let w: Vec<(i64, i64)> = OffCpu::long_run_queue_of(&blocks)
            .iter()
            .map(|w| (w.start_us, w.end_us))
            .collect();
        assert_eq!(w, [(1_000, 5_000), (10_000, 13_000)]);
    }

    /// An agent's report moved onto the caller's clock: every timeline and long wait moves
    /// by the same amount, nothing else changes.
    #[test]
    fn shift_moves_every_time_in_the_report() {
        let mut h: HostReport = serde_json::from_value(serde_json::json!({
            "scope": {"pid": 1, "comm": "x", "netns_inode": 1},
            "window_us": 1_000_000,
            "counters": {"status": "ok", "data": []},
            "listeners": {"status": "ok", "data": []},
            "cgroup": {"status": "ok", "data": {"version": 2, "path": "/", "periods": 1,
                "throttled_periods": 0, "throttled_us": 0, "throttled_share": 0.0,
                "timeline": [{"t_unix_us": 5_000_000, "throttled_periods": 0, "throttled_us": 0}]}},
            "threads": {"status": "ok", "data": {"threads": 1, "run_us": 1, "wait_us": 1, "timeslices": 1,
                "wait_share": 0.5, "timeline": [{"start_unix_us": 5_000_000,
                "end_unix_us": 5_100_000, "run_us": 1, "wait_us": 1, "active": 1}]}},
            "qdiscs": {"status": "ok", "data": []},
            "sockstat": {"status": "skipped", "reason": "x"},
            "drops": {"status": "ok", "data": {"reasons": [], "lost": 0, "scope": "namespace",
                "timeline": [{"start_unix_us": 5_000_000, "end_unix_us": 5_100_000, "reasons": []}]}},
            "offcpu": {"status": "ok", "data": {"classes": [], "stacks": [], "min_block_us": 50,
                "missed": 0, "long_run_queue": [{"tid": 2, "start_us": 5_000_000, "end_us": 5_010_000}]}},
            "cost": {"cpu_us": 0, "cpu_share": 0.0}
        }))
        .expect("report");
        h.shift_us(-2_500_000);
        let j = serde_json::to_value(&h).expect("json");
        assert_eq!(j["cgroup"]["data"]["timeline"][0]["t_unix_us"], 2_500_000);
        assert_eq!(
            j["threads"]["data"]["timeline"][0]["start_unix_us"],
            2_500_000
        );
        assert_eq!(
            j["threads"]["data"]["timeline"][0]["end_unix_us"],
            2_600_000
        );
        assert_eq!(j["drops"]["data"]["timeline"][0]["end_unix_us"], 2_600_000);
        let w = &j["offcpu"]["data"]["long_run_queue"][0];
        assert_eq!(
            (w["start_us"].clone(), w["end_us"].clone()),
            (2_500_000.into(), 2_510_000.into())
        );
        assert_eq!(j["window_us"], 1_000_000);
    }
}
