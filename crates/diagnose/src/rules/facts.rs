//! The facts most rules share: each layer's data when it ran, the idle path RTT, and the
//! quantities derived from several layers (the server's own time, a paced transfer, the
//! queue's rise).

use lagtrace_model::diagnosis::evidence::InboundLost;

use crate::evidence::{
    AppRun, ConnectStats, FindingKind, FindingSummary, Layers, PacketEvidence, PathEvidence,
    SocketEvidence,
};

use super::{DOMINANT_SERVER_SHARE, PACED_BPS, SLOW_SERVER_US};
use crate::verdict::{Fix, FixSide};

/// Least resent-and-lost client segments that say where the loss is.
const INBOUND_MIN: u64 = 3;

/// The facts most rules share.
pub(super) struct Facts<'a> {
    pub(super) path: Option<&'a PathEvidence>,
    pub(super) c1: Option<&'a AppRun>,
    pub(super) cn: Option<&'a AppRun>,
    pub(super) packets: Option<&'a PacketEvidence>,
    pub(super) sockets: Option<&'a SocketEvidence>,
    /// Every app run, with or without a completed request (c=1 first): connects that
    /// waited or failed are evidence even where no request completed.
    pub(super) runs: Vec<&'a AppRun>,
    /// Idle path RTT (SYN ping median, else the handshake RTT seen in packets).
    pub(super) rtt_us: u64,
    /// The server host's kernel evidence over the c=N run.
    pub(super) host: Option<&'a lagtrace_model::host::HostReport>,
    /// The run is real clients' traffic (`--passive`, `--pcap`): the clients are not
    /// lagtrace, and there is no c=1 run.
    pub(super) passive: bool,
    /// The hops behind the server (its own connections to its upstreams).
    pub(super) hops: &'a [lagtrace_model::diagnosis::evidence::HopEvidence],
}

/// A SYN flood at the target's listener, as the host layer read it: its SYN queue flooded
/// ([`lagtrace_model::host::ListenerQueue::flooded`]), with the namespace's counters of SYNs
/// the kernel dropped (`TcpExt.TCPReqQFullDrop`: syncookies off) or answered with a cookie
/// (`TCPReqQFullDoCookies`) with the queue full.
pub(super) struct Flood<'a> {
    pub(super) listener: &'a lagtrace_model::host::ListenerQueue,
    pub(super) peak: u32,
    pub(super) sources: u32,
    pub(super) dropped: u64,
    pub(super) cookies: u64,
}

impl Flood<'_> {
    /// The host's line: the queue, its sources and the drops.
    pub(super) fn line(&self, during: &str) -> String {
        format!(
            "listener {}: its SYN queue held {} half-open connections (it holds {}) from {} \
             distinct source addresses at the fullest sample — handshakes that never \
             complete, a SYN flood — and the kernel dropped {} SYNs with it full and \
             syncookies off (namespace TcpExt.TCPReqQFullDrop +{}) {during}",
            self.listener.local,
            self.peak,
            self.listener.max,
            self.sources,
            self.dropped,
            self.dropped
        )
    }

    /// The fix: syncookies first.
    pub(super) fn fix(&self) -> crate::verdict::Fix {
        crate::verdict::Fix {
            side: crate::verdict::FixSide::Server,
            location: Some("net.ipv4.tcp_syncookies".into()),
            change: format!(
                "a SYN flood fills the SYN queue of {} and syncookies are off, so real \
                 clients' SYNs are dropped: set net.ipv4.tcp_syncookies=1 (the kernel answers \
                 with a cookie when the queue is full and keeps no state), raise the backlog \
                 and net.ipv4.tcp_max_syn_backlog, shorten net.ipv4.tcp_synack_retries, and \
                 filter the flood before the host (SYN proxy, scrubbing)",
                self.listener.local
            ),
            tradeoff: Some(
                "a connection made with a cookie keeps window scaling and SACK only when \
                 TCP timestamps carry them"
                    .into(),
            ),
        }
    }
}

/// The busiest CPU's share of the window in the receive softirq at which it leaves the
/// packets behind waiting their turn.
pub(super) const SATURATED_SHARE: f64 = 0.5;

/// A median wait in a CPU's backlog queue that is a queue (µs): handing a packet to the
/// softirq of its own or another CPU takes a few µs to a few tens on an idle host (the lab's
/// VM: p50 8 µs, p99 29 µs).
pub(super) const BACKLOG_QUEUE_US: u64 = 50;

/// The server host's receive softirq saturated: a CPU busy in it for most of the window,
/// and the server's own packets queued behind its work.
pub(super) struct SoftirqQueue<'a> {
    pub(super) softirq: &'a lagtrace_model::host::Softirq,
    pub(super) wait: &'a lagtrace_model::host::BacklogWait,
}

impl<'a> Facts<'a> {
    /// The receive softirq's queue the server's packets waited in, when the host layer
    /// timed one ([`SoftirqQueue`]): the busiest CPU at least [`SATURATED_SHARE`] of the
    /// window in it, and the server's TCP packets' median wait in a backlog queue at least
    /// [`BACKLOG_QUEUE_US`] over 100 packets or more.
    pub(super) fn softirq_queue(&self) -> Option<SoftirqQueue<'a>> {
        let k = self.host?.softirq.get().filter(|k| k.timed)?;
        let w = k.netns_backlog_wait.as_ref()?;
        (k.busiest_rx_share >= SATURATED_SHARE && w.packets >= 100 && w.p50_us >= BACKLOG_QUEUE_US)
            .then_some(SoftirqQueue {
                softirq: k,
                wait: w,
            })
    }

    /// The receive softirq, when it held the CPUs more than any process did: timed, the
    /// busiest CPU at least [`SATURATED_SHARE`] of the window in it, and its time on all
    /// CPUs at least any process's CPU time (ksoftirqd, which runs that same work, apart).
    /// A server whose threads wait for a CPU then waits behind the kernel's packet
    /// processing, whether or not its own packets queue.
    pub(super) fn softirq_held_cpus(&self) -> Option<&'a lagtrace_model::host::Softirq> {
        let h = self.host?;
        let k = h.softirq.get().filter(|k| k.timed)?;
        let most = h.cpu.get().map_or(0, |c| {
            c.top
                .iter()
                .filter(|p| !p.comm.starts_with("ksoftirqd/"))
                .map(|p| p.cpu_us)
                .max()
                .unwrap_or(0)
        });
        (k.busiest_rx_share >= SATURATED_SHARE && k.rx_us >= most).then_some(k)
    }

    /// The SYN flood at the listener on `port`, when the host layer shows one
    /// ([`Flood`]).
    pub(super) fn flood(&self, port: u16) -> Option<Flood<'a>> {
        let host = self.host?;
        let suffix = format!(":{port}");
        let l = host
            .listeners
            .get()?
            .iter()
            .filter(|l| l.local.ends_with(&suffix))
            .max_by_key(|l| l.half_open_peak.unwrap_or(0))?;
        let (peak, sources) = l.flooded()?;
        let count = |n: &str| u64::try_from(host.counter(n)).unwrap_or(0);
        Some(Flood {
            listener: l,
            peak,
            sources,
            dropped: count("TcpExt.TCPReqQFullDrop"),
            cookies: count("TcpExt.TCPReqQFullDoCookies"),
        })
    }

    pub(super) fn new(layers: &'a Layers) -> Self {
        let path = layers.path.get();
        let app = layers.app.get();
        let packets = layers.packets.get();
        let rtt_us = path
            .and_then(|p| p.idle.as_ref())
            .filter(|s| s.received > 0)
            .map(|s| s.p50_us)
            .or_else(|| {
                packets
                    .and_then(|p| p.handshake_rtt.as_ref())
                    .map(|h| h.p50_us)
            })
            .unwrap_or(0);
        Facts {
            path,
            c1: app.and_then(|a| a.c1.as_ref()).filter(|r| r.requests > 0),
            cn: app.and_then(|a| a.cn.as_ref()).filter(|r| r.requests > 0),
            packets,
            sockets: layers.sockets.get(),
            runs: app
                .map(|a| a.c1.iter().chain(a.cn.iter()).collect())
                .unwrap_or_default(),
            rtt_us,
            host: layers.host.get(),
            passive: app
                .and_then(|a| a.cn.as_ref())
                .is_some_and(|r| r.passive.is_some()),
            hops: &layers.hops,
        }
    }

    /// The run whose p50 the user sees under concurrency (c=N, else c=1).
    pub(super) fn main_run(&self) -> Option<&'a AppRun> {
        self.cn.or(self.c1)
    }

    /// The last run that made connects (c=N before c=1), whether or not a request
    /// completed (a flood or a dropping firewall may leave every connect waiting), with its
    /// connect figures.
    pub(super) fn connects_run(&self) -> Option<(&'a AppRun, &'a ConnectStats)> {
        self.runs
            .iter()
            .copied()
            .rev()
            .find_map(|r| Some((r, r.connects.as_ref()?)))
    }

    pub(super) fn finding(&self, kind: FindingKind) -> Option<&'a FindingSummary> {
        self.packets.and_then(|p| p.finding(kind))
    }

    /// The clients' segments lost inside the server's host (`packets.inbound_lost`), when
    /// they are what the retransmissions are about: most of the clients' own
    /// retransmissions, and at least a quarter of all (a lost request that carried the ACK
    /// of the previous response costs the server a retransmission of that response too,
    /// which the client D-SACKs).
    pub(super) fn inbound_lost(&self) -> Option<&'a InboundLost> {
        let p = self.packets?;
        let l = p.inbound_lost.as_ref()?;
        let all = p
            .finding(FindingKind::Retransmission)
            .map_or(0, |f| f.count);
        (l.count >= INBOUND_MIN && l.count * 2 >= l.of && l.count * 4 >= all).then_some(l)
    }

    pub(super) fn transactions(&self) -> u64 {
        self.packets.map(|p| p.transactions).unwrap_or(0)
    }

    /// The server's own time per request: c=1 latency minus the path RTT, and the packets'
    /// server time; the smaller of the two (c=N server time includes queueing on the path
    /// and in the server; c=1 latency includes transfer time).
    pub(super) fn server_own_us(&self) -> Option<u64> {
        let from_c1 = self.c1.map(|r| {
            r.latency
                .p50_us
                .saturating_sub(self.rtt_us)
                .saturating_sub(self.link_transfer_us(r))
        });
        let from_pk = self
            .packets
            .and_then(|p| p.server_time.as_ref())
            .filter(|s| s.count > 0)
            .map(|s| s.p50_us);
        match (from_c1, from_pk) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Under load the server queues requests itself, and the host layer timed its threads
    /// through it: the c=N server time (packets) p50 is at least [`SLOW_SERVER_US`] and 4×
    /// the server's own time at c=1, and the off-CPU split covered the requests. (c=N
    /// server time p50, own time at c=1.) Without the host's timing, a server saturated
    /// under load stays a note: nothing would say what it queues for. The serving thread
    /// must have waited (sleep, futex, disk) through most of the server time, or its on-CPU
    /// profile must show work a setting removes ([`Facts::avoidable_cpu`]).
    pub(super) fn server_saturated(&self) -> Option<(u64, u64)> {
        self.packets_saturated()
            .or_else(|| self.handshake_saturated())
    }

    /// [`Facts::server_saturated`] from the server time in packets (the request's last byte
    /// to the response's first).
    fn packets_saturated(&self) -> Option<(u64, u64)> {
        let own = self.server_own_us()?;
        let p50 = self
            .packets
            .and_then(|p| p.server_time.as_ref())
            .filter(|s| s.count > 0)?
            .p50_us;
        self.cn?;
        let split = self
            .host?
            .offcpu
            .get()?
            .during_requests
            .as_ref()
            .filter(|s| s.requests >= 5)?;
        // The serving thread's waits count only where it was found for most requests; a
        // thread busy through the window (an event loop computing) blocks for none of them,
        // and then only the profile can say what it queues for.
        let found = split.attributed * 2 >= split.requests;
        // What it queues for must be a wait of its serving thread (a sleep, a lock, the
        // disk) that holds most of the server time. A thread busy on a CPU through it may be
        // doing the work the load asks for (nginx copying megabytes to 32 clients: ~0.9 core
        // at 949 req/s, healthy) or work a fix removes (a TLS handshake per request): only
        // on-CPU stacks tell: the profile names work a setting removes (a TLS handshake per
        // connection, compression at a high level), else it stays unnamed. A thread that
        // waited mostly for a CPU queued for the host's CPUs: contention, which the host
        // rules judge.
        let waited = split
            .largest_wait()
            .filter(|_| found)
            .map_or(0.0, |p| p.share);
        (p50 >= SLOW_SERVER_US
            && p50 >= own.saturating_mul(4)
            && (waited >= 0.5 || self.avoidable_cpu().is_some()))
        .then_some((p50, own))
    }

    /// Under load the clients wait in connection setup, where the server time in packets
    /// (request to response) does not look: a server doing a full TLS handshake for every
    /// connection (keep-alive off, no session resumption) queues the handshakes behind each
    /// other on its CPU. Most c=N requests opened a connection, the c=N p50 (less the path's
    /// RTT) is at least [`SLOW_SERVER_US`] and 4× the c=1 p50, and the profile shows TLS
    /// cryptography as avoidable work ([`Facts::avoidable_cpu`]). (That p50, the server's own
    /// time at c=1.)
    pub(super) fn handshake_saturated(&self) -> Option<(u64, u64)> {
        let own = self.server_own_us()?;
        let (c1, cn) = (self.c1?, self.cn?);
        let (work, _) = self.avoidable_cpu()?;
        // Most requests opened a connection (each a handshake): with keep-alive, the same
        // libcrypto share is the bulk cipher the load asks for, not a handshake per request.
        let new_each = cn
            .connects
            .as_ref()
            .is_some_and(|c| c.attempts.saturating_mul(2) >= cn.requests);
        let p50 = cn.latency.p50_us.saturating_sub(self.rtt_us);
        (work == Work::Tls
            && new_each
            && p50 >= SLOW_SERVER_US
            && p50 >= c1.latency.p50_us.saturating_mul(4))
        .then_some((p50, own))
    }

    /// The server's on-CPU profile, when it holds enough samples to say anything (a
    /// quarter-second of one thread's CPU at the default rate).
    pub(super) fn profile(&self) -> Option<&'a lagtrace_model::host::OnCpu> {
        self.host?.oncpu.get().filter(|p| p.samples >= MIN_SAMPLES)
    }

    /// The server's threads kept half a core or more busy over the window, and at least
    /// [`AVOIDABLE_SHARE`] of their samples were in libraries doing work
    /// a server setting removes or cuts (TLS handshakes, compression, regular expressions):
    /// that work and its share.
    pub(super) fn avoidable_cpu(&self) -> Option<(Work, f64)> {
        let h = self.host?;
        let p = self.profile()?;
        let cores = p.samples as f64 / p.hz.max(1) as f64 / (h.window_us.max(1) as f64 / 1e6);
        let (w, share) = work_shares(p)
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        (cores >= 0.5 && share >= AVOIDABLE_SHARE).then_some((w, share))
    }

    /// The packets show most responses leaving at the 200 ms cork ceiling, yet the sockets
    /// were all read with TCP_CORK off. A connection whose held responses wait corked ~200 ms
    /// each is corked for share × hold / (time per request on it) of the time, so one
    /// reading of n ≥ 3 sockets finds every one uncorked with a probability of about
    /// (1 − that)ⁿ; below 1 % the wait is the server's
    /// own (a think time at the ceiling — seen: a disk-bound server at 20 reads/s with four
    /// clients, each request queued 4 × 50 ms), not a cork. (sockets read, share held.)
    pub(super) fn cork_ruled_out(&self) -> Option<(u32, f64)> {
        let s = self.sockets?;
        let read = s.cork.on + s.cork.off;
        if read < 3 || s.cork.on > 0 {
            return None;
        }
        let f = self.finding(FindingKind::TcpCork)?;
        // The share of the time a connection is corked: its held responses' hold over the
        // time each request takes on it (c / rate), when the run says.
        let corked = match self.cn.filter(|r| r.requests_per_sec > 0.0) {
            Some(r) => {
                let cycle_us = f64::from(r.concurrency) / r.requests_per_sec * 1e6;
                f.share * f.median_added_us as f64 / cycle_us.max(1.0)
            }
            None => f.share,
        }
        .min(1.0);
        ((1.0 - corked).powi(read as i32) < 0.01).then_some((read, f.share))
    }

    /// The response's transfer at c=1 dominates and runs slower than [`PACED_BPS`]:
    /// (transfer time µs, response bytes, bits/s).
    pub(super) fn paced_transfer(&self) -> Option<(u64, u64, f64)> {
        let c1 = self.c1?;
        // The byte count includes the response each connection was reading when the run
        // ended: take the run with the most requests per connection, and count those as half.
        let size = [Some(c1), self.cn]
            .into_iter()
            .flatten()
            .filter(|r| r.requests > 0 && r.bytes > 0)
            .max_by(|a, b| {
                let per = |r: &AppRun| r.requests as f64 / f64::from(r.concurrency.max(1));
                per(a).total_cmp(&per(b))
            })
            .map(|r| {
                (r.bytes as f64 / (r.requests as f64 + f64::from(r.concurrency.max(1)) / 2.0))
                    as u64
            })?;
        let transfer = c1
            .latency
            .p50_us
            .saturating_sub(self.rtt_us)
            .saturating_sub(self.server_own_us().unwrap_or(0));
        let bps = size as f64 * 8.0 / (transfer.max(1) as f64 / 1e6);
        (transfer >= SLOW_SERVER_US
            && transfer as f64 >= DOMINANT_SERVER_SHARE * c1.latency.p50_us as f64
            && bps < PACED_BPS)
            .then_some((transfer, size, bps))
    }

    /// How long one response of `run` takes to cross the path at the c=N throughput
    /// (bytes/s): 0 when the byte counts are unknown.
    pub(super) fn bottleneck_transfer_us(&self, run: &AppRun) -> u64 {
        let Some(cn) = self.cn else { return 0 };
        if run.requests == 0 || run.bytes == 0 || cn.bytes == 0 || cn.duration_us == 0 {
            return 0;
        }
        let size = run.bytes as f64 / run.requests as f64;
        let rate = cn.bytes as f64 / (cn.duration_us as f64 / 1e6);
        (size / rate * 1e6) as u64
    }

    /// The part of a `run` request's time that moving its response takes when responses
    /// cross at path speed: the c=N throughput, when it is at least [`PACED_BPS`] (a rate a
    /// paced sender does not reach). A 4 MB body takes milliseconds on a 10 Gbit/s veth
    /// however quick the server is: that is transfer, not the server's own time.
    pub(super) fn link_transfer_us(&self, run: &AppRun) -> u64 {
        let Some(cn) = self.cn.filter(|cn| cn.duration_us > 0) else {
            return 0;
        };
        let bps = cn.bytes as f64 * 8.0 / (cn.duration_us as f64 / 1e6);
        if bps < PACED_BPS {
            return 0;
        }
        self.bottleneck_transfer_us(run)
    }

    pub(super) fn queue_rise_us(&self) -> Option<(u64, u64, u64)> {
        let p = self.path?;
        let idle = p.idle.as_ref().filter(|s| s.received > 0)?;
        let load = p.under_load.as_ref().filter(|s| s.received > 0)?;
        Some((
            idle.p50_us,
            load.p50_us,
            load.p50_us.saturating_sub(idle.p50_us),
        ))
    }

    /// Who the server is, for a fix: `nginx (pid 12)`, else "the server process".
    pub(super) fn server_name(&self) -> String {
        self.sockets
            .and_then(|s| s.server.as_ref())
            .map(|p| format!("{} (pid {})", p.comm, p.pid))
            .unwrap_or_else(|| "the server process".into())
    }

    /// The server's own time, though short of [`SLOW_SERVER_US`], is most of what the user
    /// waits at c=1 (measured at c=1, not under load, where a saturated server queues
    /// requests).
    pub(super) fn server_dominates(&self, own: u64) -> bool {
        own >= super::DOMINANT_SERVER_US
            && self.c1.is_some_and(|c1| {
                c1.latency.p50_us > 0
                    && own as f64 >= DOMINANT_SERVER_SHARE * c1.latency.p50_us as f64
            })
    }
}

/// The p99/p50 ratio beyond which a spread is not contention: an exponential wait's
/// p99.9/p50, `log2(1000)` ≈ 9.97.
pub fn spread() -> f64 {
    1000f64.log2()
}

/// How much longer than a typical connect the run's slowest requests (at or above the p99 of
/// their waits) spent connecting: the median over them of their connect time beyond the
/// run's median connect (0 for a request on an open connection). Measured per request from
/// the records; `None` without records.
pub(super) fn tail_connect_us(run: &AppRun) -> Option<u64> {
    let typical = run.connects.as_ref()?.time.p50_us;
    let p99 = run.waits.as_ref()?.p99_us;
    let mut extra: Vec<u64> = run
        .records
        .as_ref()?
        .records
        .iter()
        .filter(|r| r.wait_us >= p99)
        .map(|r| {
            // Only a connect that waited a SYN retransmission is the SYN's drop; a slower
            // first connect of a burst (the accept of 32 at once) is not.
            if crate::adapters::app::is_connect(r) && crate::adapters::app::syn_retransmitted(r) {
                crate::adapters::app::connect_time_us(r).saturating_sub(typical)
            } else {
                0
            }
        })
        .collect();
    extra.sort_unstable();
    extra.get(extra.len() / 2).copied()
}

/// The packets' join of a run's records, when the capture covered it.
pub(super) fn join_of<'a>(
    x: &Facts<'a>,
    run: &AppRun,
) -> Option<&'a lagtrace_model::diagnosis::evidence::RequestJoin> {
    let recs = run.records.as_ref()?;
    x.packets?
        .joins
        .iter()
        .find(|j| j.concurrency == run.concurrency && j.requests.len() == recs.records.len())
}

/// Drops placed in time and the requests that waited through them: of the records at
/// `picked`, how many were waiting (from their start to their end) during an interval in
/// which the host dropped packets of `reasons`, out of how many picked; none when the host
/// layer did not place its drops in time (an older report) or none of `reasons` occurred.
pub(super) fn waited_through_drops(
    host: &lagtrace_model::host::HostReport,
    reasons: &[&str],
    recs: &lagtrace_model::RequestRecords,
    picked: impl Iterator<Item = usize>,
) -> Option<TimedDrops> {
    let times = host.drops.get()?.times_of(reasons);
    if times.is_empty() {
        return None;
    }
    let waits = picked
        .filter_map(|i| recs.records.get(i))
        .map(|r| (recs.start_unix_us + r.start_us, r.wait_us));
    let (hit, of) = waited_through(&times, waits);
    let spans: u64 = times.iter().map(|t| t.1.saturating_sub(t.0)).sum();
    Some(TimedDrops {
        intervals: times.len() as u64,
        window_intervals: (host.window_us * times.len() as u64)
            .checked_div(spans)
            .unwrap_or(0)
            .max(times.len() as u64),
        dropped: times.iter().map(|t| t.2).sum(),
        hit,
        of,
    })
}

/// Of the waits `(start, length)`, how many overlap one of the intervals `(start, end, _)`,
/// out of how many (µs on one clock).
fn waited_through(
    times: &[(u64, u64, u64)],
    waits: impl Iterator<Item = (u64, u64)>,
) -> (u64, u64) {
    let (mut hit, mut of) = (0, 0);
    for (start, len) in waits {
        of += 1;
        if times.iter().any(|&(s, e, _)| s < start + len && e > start) {
            hit += 1;
        }
    }
    (hit, of)
}

/// What [`waited_through_drops`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TimedDrops {
    /// Sampling intervals (~100 ms) with drops.
    pub intervals: u64,
    /// About how many intervals the window had.
    pub window_intervals: u64,
    /// The drops in them.
    pub dropped: u64,
    /// Requests waiting through one of them.
    pub hit: u64,
    /// Requests looked at.
    pub of: u64,
}

impl TimedDrops {
    /// Whether the drops fell elsewhere in time: fewer than half of the requests waited
    /// through one (none looked at says nothing).
    pub(super) fn elsewhere(&self) -> bool {
        self.of > 0 && self.hit * 2 < self.of
    }

    /// The line's words: "joined by time: 87 of the 89 late responses were waiting during
    /// one of the 24 ~100 ms intervals (of the window's ~36) in which the host dropped them
    /// (512 drops)".
    pub(super) fn text(&self, what: &str) -> String {
        format!(
            "joined by time: {} of the {} {what} were waiting during one of the {} ~100 ms \
             intervals (of the window's ~{}) in which the host dropped them ({} drops)",
            self.hit, self.of, self.intervals, self.window_intervals, self.dropped
        )
    }
}

/// An on-CPU profile of fewer samples says nothing (at the default 199 Hz, a quarter-second of
/// one thread's CPU).
pub(super) const MIN_SAMPLES: u64 = 50;
/// The share of the server's on-CPU samples in libraries doing avoidable work that names
/// it ([`Facts::avoidable_cpu`]).
pub(super) const AVOIDABLE_SHARE: f64 = 0.3;

/// Work whose CPU cost a server setting removes or cuts, told by the library it runs in
/// (the file is always known from the process's maps; its functions may not be: Debian's
/// libcrypto and libz keep only `.dynsym`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Work {
    /// Cryptography: TLS handshakes (asymmetric signing, key exchange) or bulk ciphers.
    Tls,
    /// Compression (deflate/gzip, brotli, zstd).
    Compression,
    /// Regular expressions.
    Regex,
}

/// The work a library's file name says it does.
pub(super) fn work_of(module: &str) -> Option<Work> {
    let m = module.to_ascii_lowercase();
    let any = |ps: &[&str]| ps.iter().any(|p| m.starts_with(p));
    if any(&[
        "libcrypto.",
        "libssl.",
        "libgnutls.",
        "libnettle.",
        "libhogweed.",
        "libgcrypt.",
        "libmbedcrypto.",
        "libmbedtls.",
        "libwolfssl.",
    ]) {
        Some(Work::Tls)
    } else if any(&[
        "libz.",
        "libz-ng.",
        "libdeflate.",
        "libbrotlienc.",
        "libzstd.",
    ]) {
        Some(Work::Compression)
    } else if any(&["libpcre", "libonig.", "libre2."]) {
        Some(Work::Regex)
    } else {
        None
    }
}

/// Each kind of avoidable work's share of the profile's samples (its modules' self time).
pub(super) fn work_shares(p: &lagtrace_model::host::OnCpu) -> Vec<(Work, f64)> {
    let mut v: Vec<(Work, f64)> = Vec::new();
    for m in &p.modules {
        if let Some(w) = work_of(&m.module) {
            match v.iter_mut().find(|e| e.0 == w) {
                Some(e) => e.1 += m.share,
                None => v.push((w, m.share)),
            }
        }
    }
    v
}

/// The fix for `softirq-saturated`: where to look (the busiest CPU) and what to change.
pub(super) fn softirq_saturated_fix(k: Option<&lagtrace_model::host::Softirq>) -> Fix {
    Fix {
        side: FixSide::Server,
        location: k.and_then(|k| k.cpus.first()).map(|c| {
            format!(
                "CPU {}: /proc/net/softnet_stat, mpstat -P {} 1",
                c.cpu, c.cpu
            )
        }),
        change: "one CPU takes the receive work for the server's packets and is busy with it \
                 most of the time: spread it (more RSS queues, RPS \
                 /sys/class/net/DEV/queues/rx-*/rps_cpus over more CPUs, irqbalance), and stop \
                 or rate-limit the traffic that floods it as early as possible (upstream \
                 filtering, an XDP or tc ingress drop)"
            .into(),
        tradeoff: Some("RPS spends CPU on other cores for the hand-off".into()),
    }
}

#[cfg(test)]
mod timed_drop_tests {
    use super::*;

    #[test]
    fn a_wait_joins_the_drops_of_an_interval_it_overlaps_and_only_those() {
        // Drops in [1.0 s, 1.1 s) and [2.0 s, 2.1 s).
        let times = [(1_000_000, 1_100_000, 3), (2_000_000, 2_100_000, 1)];
        let waits = [
            (900_000, 205_000),   // through the first interval
            (1_050_000, 10),      // inside it
            (1_100_000, 200_000), // starts as it ends: not through it
            (1_500_000, 400_000), // between the two
            (1_999_000, 1_000),   // ends as the second starts: overlaps by nothing
        ];
        assert_eq!(waited_through(&times, waits.into_iter()), (2, 5));
        let t = TimedDrops {
            intervals: 2,
            window_intervals: 30,
            dropped: 4,
            hit: 2,
            of: 5,
        };
        assert!(
            t.elsewhere(),
            "2 of 5: the drops were mostly at other times"
        );
        assert!(!TimedDrops { hit: 3, ..t }.elsewhere());
        assert!(
            !TimedDrops { hit: 0, of: 0, ..t }.elsewhere(),
            "nothing to judge"
        );
    }
}
