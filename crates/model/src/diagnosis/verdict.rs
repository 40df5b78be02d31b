//! The verdict: one primary cause, secondary causes, a confidence, the cost in the user's
//! terms, the evidence for and against, and the fix.

use crate::Cause;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::evidence::LayerName;

/// How sure the verdict is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Confidence {
    /// One layer's indirect evidence only.
    Low,
    /// One layer's direct evidence.
    Medium,
    /// Direct evidence corroborated by another layer.
    High,
}

impl Confidence {
    /// The stable string.
    pub fn name(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// Whether an evidence line supports the verdict, rules out an alternative, or is a note.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stance {
    /// Supports the primary (or a secondary) cause.
    Supports,
    /// Rules out an alternative cause.
    RulesOut,
    /// Context.
    Note,
}

/// One line of evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EvidenceLine {
    /// The layer it comes from.
    pub layer: LayerName,
    /// What it does for the verdict.
    pub stance: Stance,
    /// The cause it is about (supported or ruled out), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// The line, with numbers.
    pub text: String,
}

/// Where a fix is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FixSide {
    /// The server (process or config).
    Server,
    /// The client.
    Client,
    /// The network path.
    Path,
}

/// One way to fix the cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fix {
    /// Server, client or path.
    pub side: FixSide,
    /// Where to change it (`/etc/nginx/nginx.conf:12`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// What to change (`tcp_nodelay off; → tcp_nodelay on;`).
    pub change: String,
    /// The price of this fix, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tradeoff: Option<String>,
}

/// The conclusion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Verdict {
    /// The primary cause.
    pub cause: Cause,
    /// Further causes that add latency too, by decreasing cost.
    pub secondary: Vec<Cause>,
    /// How sure.
    pub confidence: Confidence,
    /// One sentence naming the cause in plain words.
    pub summary: String,
    /// The cost in the user's terms, as numbers and in one sentence.
    pub cost: Cost,
    /// How the cause works, when the evidence shows it; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Mechanism>,
    /// What the slowest requests wait for; absent until the tail decomposition fills it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Tail>,
    /// How to fix it, best first (empty when healthy).
    pub fix: Vec<Fix>,
    /// Where on the request's way the cause sits, when it is behind the server: the chain
    /// client → server → upstream … and which link of it. Absent when the cause is at the
    /// server the client talks to (or no hop behind it was observed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop: Option<Hop>,
}

/// Where the cause sits on the way of a request through the server to its upstreams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hop {
    /// The chain from the client on: `client`, the server, then each upstream.
    pub chain: Vec<HopNode>,
    /// Index in `chain` of the process whose side the cause is on (≥ 2: behind the server).
    pub at: usize,
    /// The chain in one line (`client → nginx (pid 7) 10.0.0.2:8080 → python3 (pid 9)
    /// 127.0.0.1:9000`).
    pub text: String,
    /// The server's own time per request, µs, when its hop's packets were captured: its
    /// server time at the client-facing capture less its wait on the first hop (the hop's
    /// request's first byte to its response's last byte), p50 of each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_own_us: Option<u64>,
}

/// One process on a request's way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HopNode {
    /// Its command name (`client` for the client, `remote` when not on this host).
    pub name: String,
    /// Its process id, when on this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The address:port its clients connect to (none for the client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

impl HopNode {
    /// `name (pid N) addr`, as far as known.
    pub fn label(&self) -> String {
        let mut s = self.name.clone();
        if let Some(p) = self.pid {
            s.push_str(&format!(" (pid {p})"));
        }
        if let Some(a) = &self.addr {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

impl Hop {
    /// A hop from its chain, with the one-line text filled.
    pub fn new(chain: Vec<HopNode>, at: usize) -> Hop {
        let text = chain
            .iter()
            .map(HopNode::label)
            .collect::<Vec<_>>()
            .join(" → ");
        Hop {
            chain,
            at,
            text,
            server_own_us: None,
        }
    }
}

/// The cost of the verdict's cause in the user's terms: numbers first, the same in prose.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Cost {
    /// Latency the cause adds to an affected request (its median), µs. 0 when `healthy`, and
    /// when requests fail rather than wait (`unreachable`).
    pub added_us: u64,
    /// Share of requests that pay it, 0–1 (1: every request; 0 when `healthy`).
    pub share: f64,
    /// How many were counted as affected (transactions in the capture, or connection
    /// attempts), when the share comes from a count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affected: Option<u64>,
    /// ... out of this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of: Option<u64>,
    /// The p50 latency the user sees (the c=N run, else c=1), µs; none when no request
    /// completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<u64>,
    /// The connections of the run `p50_us` comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// The p50 the user would see without the cause, µs, when the evidence shows it (the
    /// first request on a connection, which Nagle/delayed ACK spares).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_without_us: Option<u64>,
    /// The same in one sentence, for people.
    pub text: String,
}

/// How a cause works, where the evidence shows it (filled by later rules; none today).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// Every n-th request (or segment) pays the cost: a pattern in the request order.
    EveryNth,
    /// The server pauses periodically (a GC, a flush, a timer) and requests queue behind it.
    PeriodicPause,
    /// The server's CPU is throttled (a cgroup quota runs out within its period).
    CpuThrottled,
    /// Packets are dropped on the sending host before they reach the wire (netfilter, a
    /// qdisc), so the capture shows only the retransmitted copy.
    DroppedBeforeWire,
    /// The listen socket's accept queue overflows and SYNs (or the final ACKs) are dropped.
    AcceptQueueOverflow,
    /// The server's threads wait for a CPU that other work on its host holds (run-queue
    /// delay aligned with the slow requests): a busy host, not the server's handling.
    CpuContention,
    /// The server's time is its own CPU work: its threads are on a CPU for most of each
    /// request's server time.
    OnCpu,
    /// The server's threads wait on a futex (a lock, a condition variable, a semaphore)
    /// inside the requests' server time: requests contend for a lock.
    LockWait,
    /// The server's threads are blocked on block I/O inside the requests' server time:
    /// reads of data not in the page cache, synchronous writes.
    DiskIo,
    /// The server's threads sleep (nanosleep) inside the requests' server time: a delay in
    /// the handler.
    Sleep,
    /// Every packet to the server walks a long netfilter chain before a verdict: the
    /// kernel's receive time per packet is the rule walk.
    NetfilterRules,
    /// The receive softirq keeps a CPU busy (other traffic, a flood): the server's packets
    /// wait their turn in the kernel before its socket has them.
    SoftirqSaturated,
    /// The server's time is a wait on an upstream that lagtrace cannot look inside (on
    /// another host, no agent there): its connections to it show the wait, not the reason.
    UpstreamWait,
    /// The kernel's connection tracking drops new connections' packets: its table is full
    /// (`nf_conntrack_max`) or entries fail to insert, so their SYNs wait for a
    /// retransmission.
    Conntrack,
    /// A SYN flood fills the listener's SYN queue with half-open connections from many
    /// (spoofed) sources, and with syncookies off real clients' SYNs are dropped.
    SynFlood,
    /// A link on the path carries less than the sender's MSS, and the ICMP "fragmentation
    /// needed" (IPv6 "packet too big") that would say so does not come back: full-size
    /// segments are resent and never acknowledged while smaller ones pass.
    PmtuBlackHole,
    /// A netfilter rule on the server's host drops connection attempts (a rate limit, a
    /// filter on the port): the kernel counted the drops (`NETFILTER_DROP`) as the
    /// connects waited for SYN retransmissions.
    DroppedByNetfilter,
}

impl Mechanism {
    /// The name in the JSON (`lock-wait`).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::EveryNth => "every-nth",
            Mechanism::PeriodicPause => "periodic-pause",
            Mechanism::CpuThrottled => "cpu-throttled",
            Mechanism::DroppedBeforeWire => "dropped-before-wire",
            Mechanism::AcceptQueueOverflow => "accept-queue-overflow",
            Mechanism::CpuContention => "cpu-contention",
            Mechanism::OnCpu => "on-cpu",
            Mechanism::LockWait => "lock-wait",
            Mechanism::DiskIo => "disk-io",
            Mechanism::Sleep => "sleep",
            Mechanism::NetfilterRules => "netfilter-rules",
            Mechanism::SoftirqSaturated => "softirq-saturated",
            Mechanism::UpstreamWait => "upstream-wait",
            Mechanism::Conntrack => "conntrack",
            Mechanism::SynFlood => "syn-flood",
            Mechanism::PmtuBlackHole => "pmtu-black-hole",
            Mechanism::DroppedByNetfilter => "dropped-by-netfilter",
        }
    }
}

/// What the slowest requests wait for (filled by the tail decomposition; none today).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tail {
    /// The percentile described, in percent (`99.0`).
    pub percentile: f64,
    /// Its latency, µs.
    pub latency_us: u64,
    /// How far it lies above the p50, µs.
    pub excess_us: u64,
    /// What the excess is made of, largest first.
    pub parts: Vec<TailPart>,
    /// The same in one sentence.
    pub text: String,
}

/// One component of the tail's excess latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TailPart {
    /// The cause the slow requests wait for.
    pub cause: Cause,
    /// How, when the evidence shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<Mechanism>,
    /// What it adds to a request at the percentile, µs.
    pub added_us: u64,
    /// Its share of the excess, 0–1.
    pub share: f64,
}

#[cfg(test)]
mod mechanism_names {
    use super::Mechanism;

    #[test]
    fn names_are_the_json_names() {
        for m in [
            Mechanism::EveryNth,
            Mechanism::PeriodicPause,
            Mechanism::CpuThrottled,
            Mechanism::DroppedBeforeWire,
            Mechanism::AcceptQueueOverflow,
            Mechanism::CpuContention,
            Mechanism::OnCpu,
            Mechanism::LockWait,
            Mechanism::DiskIo,
            Mechanism::Sleep,
            Mechanism::NetfilterRules,
            Mechanism::SoftirqSaturated,
            Mechanism::UpstreamWait,
            Mechanism::Conntrack,
            Mechanism::SynFlood,
        ] {
            assert_eq!(serde_json::to_value(m).unwrap(), m.name());
        }
    }
}
