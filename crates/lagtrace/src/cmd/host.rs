//! `lagtrace host`: the server host's kernel evidence over a window.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use lagtrace_host::HostOptions;
use lagtrace_model::Envelope;
use lagtrace_model::diagnosis::evidence::{Layer, LayerStatus};
use lagtrace_model::host::{
    CgroupCpu, DropsByReason, HostReport, ListenerQueue, QdiscDelta, ThreadSched,
};

/// What the server host's kernel saw over a window: the deltas an expert reads with nstat,
/// ss -lnt, tc -s qdisc, the cgroup's cpu.stat and /proc/PID/task/*/schedstat.
///
/// Run it on the server's host while the slow traffic flows (or during `lagtrace load`).
/// It reads, over -d: the namespace's TcpExt/Tcp/Ip counters (listen overflows, RTOs,
/// tail-loss probes, retransmits, memory pressure, ...), the accept queues of the listening
/// sockets (sampled every 100 ms: peak against limit, and each listener's own drops), the
/// qdiscs of the namespace's devices (rtnetlink: drops, overlimits), socket memory; and with
/// --pid, the process's cgroup CPU bandwidth (v1 cpu.stat + cfs_quota_us, or v2 cpu.stat +
/// cpu.max: periods throttled, time held), its threads' run-queue delay, and where its
/// threads were while off a CPU (BPF on sched:sched_switch, like bcc's offcputime: by
/// kernel stack — disk, futex, sleep, poll, socket, run queue) and where they were while on
/// one (CPU-clock samples of every CPU, like bcc's profile: its hottest libraries and
/// functions, and folded stacks for a flame graph in --json); the kernel's receive work
/// (the NET_RX softirq timed per CPU and per packet, softnet_stat's backlog drops) and, with
/// --port, the netfilter rules a packet to that port walks (nft -j list ruleset).
///
/// The text names only what moved, with its rate and what it usually means; --json has
/// every counter that moved.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
What the usual suspects look like:
  accept-queue overflow   TcpExt.ListenOverflows rises, a listener's queue peaks at its limit
                          with drops; clients wait for SYN retransmits (>= 1 s each)
  SYN flood               a listener's SYN queue full of half-open connections from many
                          sources; TcpExt.TCPReqQFullDrop rises with syncookies off
                          (TCPReqQFullDoCookies with them on: absorbed)
  CPU quota               the cgroup is throttled in many periods: requests stall up to
                          period - quota (e.g. 80 ms of a 100 ms period)
  busy host               threads wait in the run queue a large share of their runnable time
  local drops             a qdisc drops (tbf/htb shaping), or Tcp.RetransSegs and
                          TcpExt.TCPTimeouts / TCPLossProbes rise while the path is clean
  a handler that waits    off-CPU: its threads sleep, wait on a futex (a lock) or on disk
                          (io_schedule); an idle worker waits too (poll, socket read)
  a handler that computes on-CPU: the library and function its samples are in (libcrypto:
                          TLS handshakes; libz: compression); a function is named only
                          where a symbol covers it (stripped libraries: the file alone)
  a costly kernel path    kernel receive takes tens of µs per packet (a few is normal); with
                          --port, the netfilter chain a packet to it walks rule by rule
  a flooded receive CPU   one CPU most of the window in the receive softirq on cheap
                          packets, and the watched namespace's TCP packets wait in its
                          backlog queue (tens of µs and more; a few µs is normal)

Needs root to enter another namespace (--netns, or --pid of a process in another one).

Examples:
  lagtrace host -d 10s
  lagtrace host --pid $(pgrep -o nginx) -d 10s
  lagtrace host --netns lt-default --json")]
pub struct Args {
    /// Watch the network namespace NAME (under /run/netns)
    #[arg(long, value_name = "NAME", conflicts_with = "pid")]
    netns: Option<String>,
    /// Watch process PID: its network namespace, cgroup, threads and listening sockets
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Length of the window (10s, 500ms, 1m)
    #[arg(short = 'd', long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Skip the off-CPU tracer (BPF on sched:sched_switch): no time-off-CPU-by-why section
    #[arg(long)]
    no_offcpu: bool,
    /// Skip the on-CPU profile (BPF on CPU-clock perf events): no hot-functions section
    #[arg(long, conflicts_with = "profile_hz")]
    no_profile: bool,
    /// On-CPU samples a second on each CPU (each costs a few µs of kernel time)
    #[arg(long, value_name = "HZ", default_value_t = lagtrace_host::oncpu::DEFAULT_HZ,
          value_parser = clap::value_parser!(u64).range(1..=4999))]
    profile_hz: u64,
    /// Skip the softirq timer (BPF on irq:softirq_entry/exit, net:netif_receive_skb): the
    /// kernel receive line keeps softnet_stat's counts but no times
    #[arg(long)]
    no_softirq: bool,
    /// The server's TCP port: show the netfilter rules a packet to it walks on its way in
    /// (nft -j list ruleset in the watched namespace)
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// With --port: the server is reached over IPv6 (walk the ip6 and inet tables, not ip)
    #[arg(long, requires = "port")]
    ipv6: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = lagtrace_load::parse_duration(s).map_err(|e| format!("{e:#}"))?;
    if d.is_zero() || d > Duration::from_secs(3600) {
        return Err("a window between 1ms and 1h".into());
    }
    Ok(d)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let o = HostOptions {
        netns: args.netns,
        pid: args.pid,
        duration: args.duration,
        offcpu: !args.no_offcpu,
        profile_hz: if args.no_profile { 0 } else { args.profile_hz },
        softirq: !args.no_softirq,
        port: args.port,
        ipv6: args.ipv6,
        rule_walk: lagtrace_host::RuleWalk::Always,
        ..HostOptions::default()
    };
    let report = lagtrace_host::measure(&o).context("host")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = Envelope::new("host", report);
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        out.write_all(text(&report).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a counter usually means, for the counters worth a line of their own.
fn meaning(name: &str) -> Option<&'static str> {
    Some(match name {
        "TcpExt.ListenOverflows" => {
            "accept queue full: completed handshakes dropped; clients wait for SYN retransmits (>= 1 s each)"
        }
        "TcpExt.ListenDrops" => "connections dropped at a listener (overflows and other reasons)",
        "TcpExt.TCPReqQFullDrop" => "SYN queue full with syncookies off: SYNs dropped",
        "TcpExt.SyncookiesSent" => "SYN queue full: answered with syncookies",
        "TcpExt.TCPTimeouts" => "retransmission timeouts: a segment waited a full RTO (>= 200 ms)",
        "TcpExt.TCPLossProbes" => {
            "tail-loss probes: the last segment of a burst went unacknowledged for ~2 RTT"
        }
        "TcpExt.TCPSynRetrans" => "SYN / SYN-ACK retransmits: connection setup waited >= 1 s",
        "Tcp.RetransSegs" => "segments retransmitted",
        "TcpExt.TCPMemoryPressures" => "TCP memory entered pressure: socket buffers are trimmed",
        "TcpExt.TCPBacklogDrop" => {
            "socket backlog full while its owner held the socket: packets dropped"
        }
        "TcpExt.TCPRcvQDrop" => "receive queue memory full: packets dropped",
        "TcpExt.TCPZeroWindowDrop" => "packets dropped against a zero receive window",
        "TcpExt.PruneCalled" => "receive queues pruned under memory pressure",
        "TcpExt.TCPAbortOnTimeout" => "connections aborted after too many retransmits",
        "TcpExt.TCPAbortOnMemory" => "connections aborted for lack of memory",
        "TcpExt.TCPOFODrop" => "out-of-order segments dropped for lack of memory",
        "Ip.OutDiscards" => "outgoing IP packets discarded (qdisc or memory)",
        "Ip.InDiscards" => "incoming IP packets discarded",
        "TcpExt.DelayedACKs" => "delayed ACKs sent (a peer waiting on one waits up to 40 ms)",
        _ => return None,
    })
}

fn rate(n: f64, window_us: u64) -> String {
    let per_s = n / (window_us.max(1) as f64 / 1e6);
    format!("{per_s:.1}/s")
}

/// The human form: only what moved.
pub fn text(r: &HostReport) -> String {
    let mut s = String::new();
    let w = r.window_us;
    let mut scope = match (&r.scope.netns, r.scope.pid) {
        (_, Some(pid)) => format!("process {pid}"),
        (Some(ns), None) => format!("namespace {ns}"),
        (None, None) => "this namespace".to_string(),
    };
    if let Some(c) = &r.scope.comm {
        let _ = write!(scope, " ({c})");
    }
    let _ = writeln!(s, "host: {scope}, {:.1} s window", w as f64 / 1e6);
    let mut quiet: Vec<&str> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut note = |name: &'static str, status: LayerStatus, reason: &Option<String>| {
        if status != LayerStatus::Ok {
            skipped.push(format!(
                "{name}: {}",
                reason.as_deref().unwrap_or(status.name())
            ));
        }
    };
    note("counters", r.counters.status, &r.counters.reason);
    note("listeners", r.listeners.status, &r.listeners.reason);
    note("cgroup", r.cgroup.status, &r.cgroup.reason);
    note("threads", r.threads.status, &r.threads.reason);
    note("qdiscs", r.qdiscs.status, &r.qdiscs.reason);
    note("drops by reason", r.drops.status, &r.drops.reason);
    note("off-CPU", r.offcpu.status, &r.offcpu.reason);
    note("on-CPU", r.oncpu.status, &r.oncpu.reason);
    note("disks", r.disks.status, &r.disks.reason);
    note("softirq", r.softirq.status, &r.softirq.reason);
    note("netfilter", r.netfilter.status, &r.netfilter.reason);
    note("conntrack", r.conntrack.status, &r.conntrack.reason);
    if !counters_text(&mut s, r) {
        quiet.push("TCP/IP error counters");
    }
    if !listeners_text(&mut s, r) {
        quiet.push("listen queues");
    }
    if !cgroup_text(&mut s, &r.cgroup) {
        quiet.push("cgroup CPU");
    }
    if !threads_text(&mut s, &r.threads, w) {
        quiet.push("run queue");
    } else {
        cpu_text(&mut s, r);
    }
    if !qdisc_text(&mut s, &r.qdiscs, w) {
        quiet.push("qdiscs");
    }
    if !drops_text(&mut s, &r.drops, w) {
        quiet.push("drops");
    }
    offcpu_text(&mut s, r, w);
    oncpu_text(&mut s, r, w);
    disks_text(&mut s, r);
    softirq_text(&mut s, r);
    netfilter_text(&mut s, r);
    conntrack_text(&mut s, r);
    if let Some(ss) = r.sockstat.get()
        && let Some([min, pressure, _]) = ss.tcp_mem_limits.filter(|l| ss.tcp_mem_pages > l[0])
    {
        let _ = writeln!(
            s,
            "socket memory: TCP {} pages (pressure at {pressure}, min {min})",
            ss.tcp_mem_pages
        );
    }
    if !quiet.is_empty() {
        let _ = writeln!(s, "nothing moved: {}", quiet.join(", "));
    }
    for k in skipped {
        let _ = writeln!(s, "skipped {k}");
    }
    let _ = writeln!(
        s,
        "cost: {} CPU ({:.2}% of one core); during the window {} ({:.2}%), the rest loading \
         the programs and naming their stacks",
        lagtrace_model::Micros(r.cost.cpu_us),
        r.cost.cpu_share * 100.0,
        lagtrace_model::Micros(r.cost.window_cpu_us),
        r.cost.window_share * 100.0
    );
    s
}

/// The kernel's packet processing: softirq time per packet and per CPU, softnet's drops.
fn softirq_text(s: &mut String, r: &HostReport) {
    let Some(k) = r.softirq.get() else { return };
    let mut line = format!("kernel receive: {} packets", k.rx_packets);
    if k.timed {
        let _ = write!(
            line,
            ", {} in the NET_RX softirq",
            lagtrace_model::Micros(k.rx_us)
        );
        if let Some(ns) = k.rx_ns_per_packet {
            let _ = write!(line, " ({} per packet)", lagtrace_model::Micros(ns / 1000));
        }
        if k.timed_share < 0.99 {
            let _ = write!(
                line,
                " (timed over {:.0}% of the window, scaled: the packet rate was high)",
                k.timed_share * 100.0
            );
        }
        if let Some(ns) = k.netns_ns_per_packet {
            let _ = write!(
                line,
                "; the watched namespace's {} packets {} each",
                k.netns_packets,
                lagtrace_model::Micros(ns / 1000)
            );
        }
        if let Some(w) = &k.netns_backlog_wait {
            let _ = write!(
                line,
                "; its TCP packets waited p50 {} (p99 {}, longest {}, {} packets) in a CPU's \
                 backlog queue",
                lagtrace_model::Micros(w.p50_us),
                lagtrace_model::Micros(w.p99_us),
                lagtrace_model::Micros(w.max_us),
                w.packets
            );
        }
        if let Some(c) = k.cpus.first().filter(|c| c.rx_us > 0) {
            let _ = write!(
                line,
                "; busiest CPU {} spent {:.0}% of the window there",
                c.cpu,
                c.rx_share * 100.0
            );
        }
        let _ = write!(line, "; NET_TX {}", lagtrace_model::Micros(k.tx_us));
    }
    if k.ksoftirqd_us > 0 {
        let _ = write!(
            line,
            "; ksoftirqd ran {}",
            lagtrace_model::Micros(k.ksoftirqd_us)
        );
    }
    if !k.timed {
        let _ = write!(
            line,
            " (times not measured: {})",
            r.softirq.reason.as_deref().unwrap_or("no timer")
        );
    }
    let _ = writeln!(s, "{line}");
    if k.backlog_drops > 0 {
        let _ = writeln!(
            s,
            "  {} packets dropped at a full CPU backlog (softnet_stat): raise net.core.netdev_max_backlog or spread receive work (RPS/RSS)",
            k.backlog_drops
        );
    }
    if k.time_squeeze > 0 {
        let _ = writeln!(
            s,
            "  the receive softirq ran out of budget {} times with packets left (softnet_stat time_squeeze)",
            k.time_squeeze
        );
    }
}

/// Connection tracking: the table's fill, and what it lost or evicted in the window.
fn conntrack_text(s: &mut String, r: &HostReport) {
    let Some(c) = r.conntrack.get() else { return };
    let fill = match (c.peak.or(c.count), c.max) {
        (Some(n), Some(m)) => format!("{n} of {m} entries at the most"),
        (Some(n), None) => format!("{n} entries"),
        _ => "fill unknown".into(),
    };
    let mut t = format!("conntrack: {fill}");
    for (n, what) in [
        (c.drop, "dropped with the table full"),
        (c.insert_failed, "failed to insert"),
        (c.early_drop, "evicted early for room"),
        (c.invalid, "invalid"),
    ] {
        if n > 0 {
            let _ = write!(t, ", {n} {what}");
        }
    }
    if c.lost() > 0 {
        t += " — new connections' SYNs among them wait for a retransmission: raise \
              net.netfilter.nf_conntrack_max or `notrack` the port";
    }
    let _ = writeln!(s, "{t}");
}

/// The netfilter rules a packet to the port walks on its way in.
fn netfilter_text(s: &mut String, r: &HostReport) {
    let Some(n) = r.netfilter.get() else { return };
    if n.rules == 0 {
        let _ = writeln!(s, "netfilter: no rules");
        return;
    }
    let to = n
        .port
        .map_or("a packet (no --port: worst case)".to_string(), |p| {
            format!("a TCP packet to :{p}")
        });
    let walks: Vec<String> = n
        .walks
        .iter()
        .map(|w| {
            let mut t = format!(
                "{} {} {} ({} {}): {} of {} rules, {}",
                w.family, w.table, w.chain, w.hook, w.priority, w.walked, w.rules, w.verdict
            );
            if w.walked_new != w.walked || w.verdict_new != w.verdict {
                let _ = write!(
                    t,
                    " (a new connection's SYN: {}, {})",
                    w.walked_new, w.verdict_new
                );
            }
            t
        })
        .collect();
    let _ = writeln!(
        s,
        "netfilter: {} rules; {to} walks {}",
        n.rules,
        if walks.is_empty() {
            "no chain on its way in".to_string()
        } else {
            walks.join("; ")
        }
    );
}

fn counters_text(s: &mut String, r: &HostReport) -> bool {
    let Some(cs) = r.counters.get() else {
        return true;
    };
    let notable: Vec<_> = cs
        .iter()
        .filter_map(|c| Some((c, meaning(&c.name)?)))
        .collect();
    for (c, m) in &notable {
        let _ = writeln!(
            s,
            "{:<26} +{:<8} {:>9}  {m}",
            c.name,
            c.delta,
            rate(c.delta as f64, r.window_us)
        );
    }
    let rest = cs.len() - notable.len();
    if rest > 0 {
        let _ = writeln!(s, "({rest} other counters moved; --json lists them)");
    }
    !notable.is_empty()
}

fn listener_line(r: &HostReport, q: &ListenerQueue) -> String {
    let mut l = format!("listener {} queue peak {}/{}", q.local, q.peak, q.max);
    if q.full_samples > 0 {
        let _ = write!(l, ", full in {} of {} samples", q.full_samples, q.samples);
    }
    if let (Some(n), Some(k)) = (q.half_open_peak, q.half_open_sources)
        && n > 0
    {
        let _ = write!(l, ", SYN queue peak {n} half-open from {k} sources");
    }
    let dropped = r.listen_drops(q);
    if dropped > 0 {
        let _ = write!(
            l,
            ", {dropped} connections dropped ({})",
            rate(dropped as f64, r.window_us)
        );
    }
    let other = q.drops.unwrap_or(0).saturating_sub(dropped);
    if other > 0 {
        let _ = write!(
            l,
            ", {other} other segments discarded (not connections: e.g. the RSTs that answer \
             SYN probes)"
        );
    }
    if !q.owners.is_empty() {
        let _ = write!(l, " [{}]", q.owners.join(" "));
    }
    l
}

fn listeners_text(s: &mut String, r: &HostReport) -> bool {
    let Some(qs) = r.listeners.get() else {
        return true;
    };
    let moved: Vec<_> = qs
        .iter()
        .filter(|q| {
            q.peak > 0 || q.drops.is_some_and(|d| d > 0) || q.half_open_peak.is_some_and(|n| n > 0)
        })
        .collect();
    for q in &moved {
        let _ = writeln!(s, "{}", listener_line(r, q));
        // Half-open connections from many sources filling the SYN queue: a flood, whose
        // dropped SYNs count as listen drops too.
        if q.flooded().is_some() {
            let _ = writeln!(
                s,
                "  the SYN queue is full of half-open connections from many sources: a SYN flood; with net.ipv4.tcp_syncookies=1 the kernel answers it with cookies (TcpExt.TCPReqQFullDrop: SYNs dropped with cookies off)"
            );
        } else if q.full_samples > 0 || r.listen_drops(q) > 0 {
            let _ = writeln!(
                s,
                "  the accept queue overflowed: the application accepts slower than connections complete (raise the backlog / somaxconn, or accept faster)"
            );
        }
    }
    !moved.is_empty()
}

fn cgroup_text(s: &mut String, l: &Layer<CgroupCpu>) -> bool {
    let Some(c) = l.get() else { return true };
    if c.throttled_periods == 0 {
        return false;
    }
    let quota = match (c.quota_us, c.period_us) {
        (Some(q), Some(p)) => format!(
            "; quota {} per {}",
            lagtrace_model::Micros(q),
            lagtrace_model::Micros(p)
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "cgroup v{} {}: throttled in {} of {} periods ({:.0}%), held {}{quota}",
        c.version,
        c.path,
        c.throttled_periods,
        c.periods,
        c.throttled_share * 100.0,
        lagtrace_model::Micros(c.throttled_us)
    );
    let _ = writeln!(
        s,
        "  CPU quota exhausted: its threads stop until the next period; requests stall up to period - quota (raise cpu.max / cfs_quota_us)"
    );
    true
}

fn threads_text(s: &mut String, l: &Layer<ThreadSched>, w: u64) -> bool {
    let Some(t) = l.get() else { return true };
    // Worth a line when the waits add up to 1 % of a core and a real share of the threads'
    // runnable time (a mostly idle thread that waited 2 ms once is not news).
    if t.wait_us * 100 < w || t.wait_share < 0.05 {
        return false;
    }
    let _ = write!(
        s,
        "run queue: {} threads waited {} for a CPU ({:.0}% of their runnable time, ran {})",
        t.threads,
        lagtrace_model::Micros(t.wait_us),
        t.wait_share * 100.0,
        lagtrace_model::Micros(t.run_us)
    );
    if let Some(worst) = &t.worst {
        let _ = write!(
            s,
            "; most: {} {} {}",
            worst.tid,
            worst.name,
            lagtrace_model::Micros(worst.wait_us)
        );
    }
    let _ = writeln!(
        s,
        "\n  runnable but not running: the host's CPUs are busy, or a cgroup quota holds them (a throttled thread counts as waiting)"
    );
    true
}

/// Who held the CPUs the watched threads waited for.
fn cpu_text(s: &mut String, r: &HostReport) {
    let Some(c) = r.cpu.get() else { return };
    let us = lagtrace_model::Micros;
    let _ = write!(
        s,
        "  CPUs: {} busy {:.0}% over the window: the watched process {}, lagtrace {}, \
         other processes {}, not attributed (interrupts, exited processes) {}",
        c.cpus,
        c.busy_share * 100.0,
        us(c.watched_us),
        us(c.own_us),
        us(c.others_us),
        us(c.unattributed_us)
    );
    if !c.top.is_empty() {
        let top: Vec<String> = c
            .top
            .iter()
            .map(|p| format!("{} {} {}", p.pid, p.comm, us(p.cpu_us)))
            .collect();
        let _ = write!(s, " (most: {})", top.join(", "));
    }
    let _ = writeln!(s);
}

fn qdisc_line(q: &QdiscDelta, w: u64) -> String {
    format!(
        "qdisc {} {} on {} (parent {}): {} dropped ({}), {} overlimits, {} requeues, {} sent; now {} queued",
        q.kind,
        q.handle,
        q.dev,
        q.parent,
        q.drops,
        rate(q.drops as f64, w),
        q.overlimits,
        q.requeues,
        q.packets,
        q.qlen
    )
}

fn qdisc_text(s: &mut String, l: &Layer<Vec<QdiscDelta>>, w: u64) -> bool {
    let Some(qs) = l.get() else { return true };
    let moved: Vec<_> = qs
        .iter()
        .filter(|q| q.drops > 0 || q.overlimits > 0 || q.requeues > 0)
        .collect();
    for q in &moved {
        let _ = writeln!(s, "{}", qdisc_line(q, w));
        if q.drops > 0 {
            let _ = writeln!(
                s,
                "  dropped before the wire: a TCP sender retransmits after an RTO or a loss probe"
            );
        } else {
            let _ = writeln!(
                s,
                "  shaping held packets back: queueing delay on this host"
            );
        }
    }
    !moved.is_empty()
}

/// What a drop reason means where it is not what it seems: reasons that are no lost
/// traffic, and the two that drop a sender's own packets before the wire.
fn reason_note(reason: &str) -> &'static str {
    match reason {
        "SOCKET_FILTER" => {
            "  (a packet socket's filter declined a copy, e.g. a capture's: not lost traffic)"
        }
        "QUEUE_PURGE" => "  (a closing socket's queue freed: not lost traffic)",
        "NETFILTER_DROP" => "  (a netfilter rule dropped it)",
        "QDISC_DROP" => "  (a qdisc's queue was full)",
        _ => "",
    }
}

/// Where the process's threads were off a CPU, by class, with the heaviest stack of each.
fn offcpu_text(s: &mut String, r: &HostReport, w: u64) {
    let Some(o) = r.offcpu.get() else {
        return;
    };
    let threads = r.threads.get().map_or(0, |t| t.threads).max(1);
    let _ = writeln!(
        s,
        "off-CPU ({} thread(s), {:.1} s window; a thread idle between requests waits too):",
        threads,
        w as f64 / 1e6
    );
    for c in o.classes.iter().filter(|c| c.total_us > 0).take(6) {
        let top = o
            .stacks
            .iter()
            .find(|st| st.class == c.class)
            .map(|st| {
                st.frames
                    .iter()
                    .take(4)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" < ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  {:<13} {:>10} in {:>7} blocks  {top}",
            c.class.name(),
            lagtrace_model::Micros(c.total_us).to_string(),
            c.blocks
        );
    }
    if o.missed > 0 {
        let _ = writeln!(
            s,
            "  ({} blocks not timed: the tracer's buffers were full)",
            o.missed
        );
    }
    if let (Some(us), Some(runs)) = (o.bpf_run_us, o.bpf_runs) {
        let _ = writeln!(
            s,
            "  (the tracer ran {runs} times, {} in the kernel: {:.2}% of one core)",
            lagtrace_model::Micros(us),
            us as f64 / w.max(1) as f64 * 100.0
        );
    }
}

/// The block devices that did I/O, and the process's cgroup I/O limits.
fn disks_text(s: &mut String, r: &HostReport) {
    let Some(d) = r.disks.get() else {
        return;
    };
    for dev in d.devices.iter().take(4) {
        let per = dev.per_read_us().map_or(String::new(), |u| {
            format!(", ~{} per read at the device", lagtrace_model::Micros(u))
        });
        let _ = writeln!(
            s,
            "disk {} ({}): {} reads, {} writes{per}",
            dev.device, dev.dev, dev.reads, dev.writes
        );
    }
    for l in &d.limits {
        let _ = writeln!(
            s,
            "I/O limit on the process's cgroup: {} {} on {}{} ({})",
            l.limit,
            l.value,
            l.dev,
            l.device
                .as_ref()
                .map_or(String::new(), |n| format!(" ({n})")),
            l.file
        );
    }
}

/// The on-CPU profile: the modules and functions with the most self time.
fn oncpu_text(s: &mut String, r: &HostReport, w: u64) {
    let Some(p) = r.oncpu.get() else {
        return;
    };
    let cpu_s = p.samples as f64 / p.hz.max(1) as f64;
    let _ = writeln!(
        s,
        "on-CPU ({} samples at {} Hz on {} CPU(s): ~{:.2} s of CPU in {:.1} s):",
        p.samples,
        p.hz,
        p.cpus,
        cpu_s,
        w as f64 / 1e6
    );
    if p.samples == 0 {
        let _ = writeln!(s, "  its threads were not on a CPU when sampled");
        return;
    }
    let modules: Vec<String> = p
        .modules
        .iter()
        .filter(|m| m.share >= 0.02)
        .map(|m| format!("{} {:.0}%", m.module, m.share * 100.0))
        .collect();
    let _ = writeln!(s, "  by module (self): {}", modules.join(", "));
    for f in p.functions.iter().filter(|f| f.share >= 0.02).take(8) {
        let _ = writeln!(s, "  {:>5.1}%  {}", f.share * 100.0, f.label());
    }
    if p.user_depth <= 1 {
        let _ = writeln!(
            s,
            "  (user stacks are one frame deep: the binaries keep no frame pointers, so only \
             the function on the CPU is known, not its callers)"
        );
    }
    if let Some(h) = &p.hint {
        let _ = writeln!(s, "  hint: {h}");
    }
    if p.missed > 0 {
        let _ = writeln!(
            s,
            "  ({} samples lost their stack: a stack-id collision or a full map)",
            p.missed
        );
    }
    if let (Some(us), Some(runs)) = (p.bpf_run_us, p.bpf_runs) {
        let _ = writeln!(
            s,
            "  (the sampler ran {runs} times, {} in the kernel: {:.2}% of one core)",
            lagtrace_model::Micros(us),
            us as f64 / w.max(1) as f64 * 100.0
        );
    }
}

/// Drops by reason and, per namespace, by device; the scope always said. False if none.
fn drops_text(s: &mut String, l: &Layer<DropsByReason>, w: u64) -> bool {
    let Some(d) = l.get() else {
        return true;
    };
    let scope = match &d.scope_reason {
        Some(why) => format!("{}, because {why}", d.scope),
        None => d.scope.clone(),
    };
    if d.reasons.is_empty() {
        if d.scope != "namespace" {
            let _ = writeln!(s, "drops ({scope}): none");
            return true;
        }
        return false;
    }
    let _ = writeln!(s, "drops by reason ({scope}):");
    if d.lost > 0 {
        let _ = writeln!(s, "  ({} not counted: the counts are lower bounds)", d.lost);
    }
    for c in &d.reasons {
        let _ = writeln!(
            s,
            "  {:<28} {:>8}  {}{}",
            c.reason,
            c.count,
            rate(c.count as f64, w),
            reason_note(&c.reason)
        );
    }
    for dev in &d.devices {
        let name = dev.device.clone().unwrap_or_else(|| match dev.ifindex {
            0 => "(no device)".into(),
            i => format!("(ifindex {i}, gone)"),
        });
        let reasons: Vec<String> = dev
            .reasons
            .iter()
            .map(|c| format!("{} {}", c.reason, c.count))
            .collect();
        let _ = writeln!(s, "  on {name}: {} ({})", dev.count, reasons.join(", "));
    }
    true
}
