//! `kernel-stack`: the kernel's own packet processing on the server's host costs the time —
//! the case study's second cause, between the wire and the application.
//!
//! Judged by measured cost, never by counting rules: the host layer times the receive
//! softirq (BPF on `irq:softirq_entry`/`exit`) and counts the packets it took
//! (`softnet_stat`). A Linux stack takes a few µs per packet; [`KERNEL_PACKET_NS`] and more,
//! when that is a material share of the typical request, is the kernel. Then the mechanism
//! is what the host shows directly: a long netfilter walk for the server's port
//! (`netfilter-rules`, naming the chain and its rule count), else a receive softirq that
//! keeps a CPU busy (`softirq-saturated`). Softirqs serve every namespace on their CPU; the
//! cost per packet is the server's namespace's own (each packet timed from its entry into
//! the stack to the next one's) when enough of its packets were seen, else the machine's.

use lagtrace_model::Cause;
use lagtrace_model::host::{ChainWalk, Netfilter, Softirq};

use super::facts::{BACKLOG_QUEUE_US, Facts, SATURATED_SHARE, SoftirqQueue, softirq_saturated_fix};
use super::{Candidate, CauseRule, EXPLAINS_SHARE, ms, note, pct, sup};
use crate::evidence::{LayerName, Target};
use crate::verdict::{Cost, EvidenceLine, Fix, FixSide, Mechanism};

pub(super) struct KernelStack;

const CAUSE: Cause = Cause::KernelStack;

/// Receive softirq time per packet at which the kernel's processing is no longer a normal
/// stack's (driver, IP, TCP: 1–5 µs a packet, ~10 on a busy virtual machine).
pub const KERNEL_PACKET_NS: u64 = 20_000;

/// Rules walked before a verdict worth naming at all.
pub const LONG_WALK: u64 = 100;

/// What one rule evaluated costs at the least (ns): a linear nftables rule took ~27 ns on
/// the lab's 2-CPU VM (20 000 rules: 535 µs a packet; 2 000: 58 µs); faster CPUs take less.
/// A walk names the mechanism only when, at this cost, it accounts for a quarter of the
/// measured cost above a normal stack's ([`NORMAL_PACKET_NS`]): a few hundred rules in a
/// nat chain (Docker, kube-proxy) do not explain 60 µs a packet.
pub const RULE_NS: u64 = 10;

/// A normal stack's receive cost per packet (ns), left out when a walk explains the rest.
pub const NORMAL_PACKET_NS: u64 = 5_000;

/// Whether a walk of `walked` rules can account for a per-packet cost of `per_packet_ns`.
fn walk_explains(walked: u64, per_packet_ns: u64) -> bool {
    walked >= LONG_WALK && walked * RULE_NS * 4 >= per_packet_ns.saturating_sub(NORMAL_PACKET_NS)
}

/// What the host shows of the kernel's receive path.
struct Shown<'a> {
    k: &'a Softirq,
    per_packet_ns: u64,
    /// The longest walk on the way in, when long.
    walk: Option<&'a ChainWalk>,
    rules: Option<&'a Netfilter>,
    mechanism: Option<Mechanism>,
}

fn shown<'a>(x: &Facts<'a>) -> Option<Shown<'a>> {
    let h = x.host?;
    let k = h.softirq.get().filter(|k| k.timed)?;
    let per_packet_ns = k.per_packet_ns()?;
    let rules = h.netfilter.get();
    let walk = rules
        .and_then(|n| n.walks.iter().max_by_key(|w| longest(w)))
        .filter(|w| walk_explains(longest(w), per_packet_ns));
    let mechanism = if walk.is_some() {
        Some(Mechanism::NetfilterRules)
    } else if k.busiest_rx_share >= SATURATED_SHARE {
        Some(Mechanism::SoftirqSaturated)
    } else {
        None
    };
    Some(Shown {
        k,
        per_packet_ns,
        walk,
        rules,
        mechanism,
    })
}

/// The longer of the chain's two walks: an established connection's packet's and a new
/// connection's SYN's (a ruleset that accepts established traffic first makes only the
/// SYN walk).
fn longest(w: &ChainWalk) -> u64 {
    w.walked.max(w.walked_new)
}

/// The walk in words: `inet lt_filter input (hook input, priority 0): 20000 of its 20000
/// rules before its verdict (policy accept)`, each packet's when they differ.
fn walk_text(w: &ChainWalk) -> String {
    let chain = format!(
        "{} {} {} (hook {}, priority {})",
        w.family, w.table, w.chain, w.hook, w.priority
    );
    if w.walked_new == w.walked || w.verdict_new.is_empty() {
        return format!(
            "{chain}: {} of its {} rules before its verdict ({})",
            w.walked, w.rules, w.verdict
        );
    }
    format!(
        "{chain}: a new connection's SYN {} of its {} rules before its verdict ({}), an \
         established connection's packet {} ({})",
        w.walked_new, w.rules, w.verdict_new, w.walked, w.verdict
    )
}

fn cost_line(s: &Shown<'_>, port: Option<u16>) -> String {
    let k = s.k;
    let busiest = k
        .cpus
        .first()
        .map(|c| format!(" (CPU {} {} of the window)", c.cpu, pct(c.rx_share)))
        .unwrap_or_default();
    let own = k.own_per_packet_ns().is_some();
    let mut t = if own {
        format!(
            "the kernel spent {} in the receive softirq over {}{busiest}, {} of it on the {} \
             packets received in the server's namespace: {} per packet, where a Linux stack \
             needs a few µs",
            ms(k.rx_us),
            ms(k.window_us),
            ms(k.netns_rx_us),
            k.netns_packets,
            ms(s.per_packet_ns / 1000)
        )
    } else {
        format!(
            "the kernel spent {} in the receive softirq over {}{busiest}: {} per packet received \
             ({} packets, machine-wide), where a Linux stack needs a few µs",
            ms(k.rx_us),
            ms(k.window_us),
            ms(s.per_packet_ns / 1000),
            k.rx_packets
        )
    };
    match (s.walk, port) {
        (Some(w), Some(p)) => t += &format!("; a TCP packet to :{p} walks {}", walk_text(w)),
        (Some(w), None) => t += &format!("; a packet walks {}", walk_text(w)),
        (None, _) => {}
    }
    t
}

/// A direct path whose SYN RTT is the kernel's time, not the wire's: the path's line on
/// `c`. Only where the kernel's time per packet is a third of the RTT or more: a LAN's
/// 200 µs RTT is not a 30 µs packet's.
fn path_support(x: &Facts<'_>, c: &mut Candidate) {
    let added_us = c.added_us;
    if let Some(p) = x.path.filter(|p| p.hops.is_empty())
        && x.rtt_us >= added_us
        && x.rtt_us <= 3 * added_us
    {
        c.layers.push(LayerName::Path);
        c.evidence.push(sup(
            LayerName::Path,
            CAUSE,
            format!(
                "SYN RTT p50 {} on a direct (one-hop) path{}: most of it is the SYN's time in \
                 the server host's kernel (~{} a packet), not the wire",
                ms(x.rtt_us),
                if p.method == "tcp-syn" {
                    ""
                } else {
                    " (connect timing)"
                },
                ms(added_us)
            ),
        ));
    }
}

/// Cheap packets, but so many that a CPU's receive softirq is busy most of the window:
/// the server's own packets wait their turn in its backlog queue (`softirq-saturated`).
/// Every request's packet waits the median at least once on its way in.
fn queued(x: &Facts<'_>, q: &SoftirqQueue<'_>) -> Option<Candidate> {
    let (k, w) = (q.softirq, q.wait);
    let typical = x.c1.or(x.cn).map(|r| r.latency.p50_us)?;
    if (w.p50_us as f64) < EXPLAINS_SHARE * typical as f64 {
        return None;
    }
    let mut c = Candidate::new(CAUSE, w.p50_us, 1.0, vec![LayerName::Host]);
    c.mechanism = Some(Mechanism::SoftirqSaturated);
    c.evidence
        .push(sup(LayerName::Host, CAUSE, queue_line(k, w)));
    path_support(x, &mut c);
    Some(c)
}

/// The queue in words: the server's packets' wait, the busiest CPU, what the packets cost.
fn queue_line(k: &Softirq, w: &lagtrace_model::host::BacklogWait) -> String {
    let busiest = k.cpus.first();
    let mut t = format!(
        "the server's TCP packets waited p50 {} (p99 {}, longest {}; {} packets) in a CPU's \
         backlog queue before the kernel's receive softirq took them, where an idle host \
         takes a few µs",
        ms(w.p50_us),
        ms(w.p99_us),
        ms(w.max_us),
        w.packets
    );
    if let Some(c) = busiest {
        t += &format!(
            "; CPU {} spent {} of the window in the receive softirq ({} packets",
            c.cpu,
            pct(c.rx_share),
            c.rx_packets
        );
        if let Some(n) = k.rx_ns_per_packet {
            t += &format!(
                ", ~{} each: cheap packets, so many that the CPU is their queue",
                ms(n / 1000)
            );
        }
        t += ")";
    }
    if k.ksoftirqd_us > 0 {
        t += &format!(
            "; ksoftirqd ran {} (the softirq's work deferred to a thread, it kept coming)",
            ms(k.ksoftirqd_us)
        );
    }
    if k.backlog_drops > 0 || k.time_squeeze > 0 {
        t += &format!(
            "; {} packets dropped with a backlog queue full, {} softirq runs stopped with work \
             left",
            k.backlog_drops, k.time_squeeze
        );
    }
    t
}

impl CauseRule for KernelStack {
    fn cause(&self) -> Cause {
        CAUSE
    }

    fn candidate(&self, x: &Facts<'_>) -> Option<Candidate> {
        let s = shown(x)?;
        if s.per_packet_ns < KERNEL_PACKET_NS {
            return x.softirq_queue().and_then(|q| queued(x, &q));
        }
        // Every request's own packet pays it on its way in before the server can read it
        // (a new connection's SYN and ACK pay it again): at least one packet's cost.
        let added_us = s.per_packet_ns / 1000;
        let typical = x.c1.or(x.cn).map(|r| r.latency.p50_us)?;
        if (added_us as f64) < EXPLAINS_SHARE * typical as f64 {
            return None;
        }
        let mut c = Candidate::new(CAUSE, added_us, 1.0, vec![LayerName::Host]);
        c.mechanism = s.mechanism;
        c.evidence
            .push(sup(LayerName::Host, CAUSE, cost_line(&s, port(x))));
        // The kernel's time per handshake, read off the server's own capture.
        if let Some(g) = handshake_gap(x).filter(|g| g.p50_us * 1000 >= KERNEL_PACKET_NS) {
            c.layers.push(LayerName::Packets);
            c.evidence
                .push(sup(LayerName::Packets, CAUSE, handshake_text(g)));
        }
        path_support(x, &mut c);
        Some(c)
    }

    fn rule_out(&self, x: &Facts<'_>, chosen: &[Candidate]) -> Vec<EvidenceLine> {
        if chosen.iter().any(|c| c.cause == CAUSE) {
            return Vec::new();
        }
        let Some(s) = shown(x) else {
            // Say when the cost was not measured, and why: a silent absence reads as fine.
            return x
                .host
                .filter(|h| h.softirq.data.as_ref().is_some_and(|k| !k.timed))
                .map(|h| {
                    vec![note(
                        LayerName::Host,
                        format!(
                            "the kernel's receive cost per packet was not measured ({}): a \
                             costly kernel path (long netfilter chains) cannot be told",
                            h.softirq.reason.as_deref().unwrap_or("no timer")
                        ),
                    )]
                })
                .unwrap_or_default();
        };
        let mut v = Vec::new();
        if s.per_packet_ns < KERNEL_PACKET_NS {
            v.push(super::out(
                LayerName::Host,
                CAUSE,
                format!(
                    "the kernel's receive processing takes {} per packet ({}): a normal \
                     stack's cost, not the latency's source",
                    ms(s.per_packet_ns / 1000),
                    if s.k.own_per_packet_ns().is_some() {
                        format!(
                            "{} packets into the server's namespace, {} in the receive softirq",
                            s.k.netns_packets,
                            ms(s.k.netns_rx_us)
                        )
                    } else {
                        format!(
                            "{} packets machine-wide, {} in the receive softirq",
                            s.k.rx_packets,
                            ms(s.k.rx_us)
                        )
                    }
                ),
            ));
        } else {
            v.push(note(
                LayerName::Host,
                format!(
                    "{}; small next to the typical request",
                    cost_line(&s, port(x))
                ),
            ));
        }
        // The server's packets' wait for the receive softirq, when it was timed: no queue
        // in front of the kernel's processing, or one no busy CPU explains.
        if let Some(w) = s.k.netns_backlog_wait.as_ref().filter(|w| w.packets >= 100)
            && x.softirq_queue().is_none()
        {
            let waited = format!(
                "the server's TCP packets waited p50 {} (p99 {}, {} packets) in a CPU's backlog \
                 queue for the receive softirq, the busiest CPU {} of the window in it",
                ms(w.p50_us),
                ms(w.p99_us),
                w.packets,
                pct(s.k.busiest_rx_share)
            );
            if w.p50_us < BACKLOG_QUEUE_US {
                v.push(super::out(
                    LayerName::Host,
                    CAUSE,
                    format!("{waited}: no queue in the kernel's receive path"),
                ));
            } else {
                v.push(note(
                    LayerName::Host,
                    format!(
                        "{waited}: a wait no CPU busy with the receive work explains (the \
                         softirq's CPU held by other work, or too few packets to tell)"
                    ),
                ));
            }
        }
        // What a handshake costs the kernel, when the capture is the server's: the same
        // answer from the packets' side.
        if let Some(g) = handshake_gap(x) {
            v.push(note(LayerName::Packets, handshake_text(g)));
        }
        // A long chain the port's packets do not walk: the rules are there, the cost is not.
        if let Some(n) = s.rules
            && s.walk.is_none()
            && n.rules >= LONG_WALK
        {
            let biggest = n.walks.iter().max_by_key(|w| w.rules);
            v.push(note(
                LayerName::Host,
                format!(
                    "netfilter has {} rules{}; a packet to the server's port walks {} before its \
                     verdict",
                    n.rules,
                    biggest
                        .map(|w| format!(" ({} {} {}: {})", w.family, w.table, w.chain, w.rules))
                        .unwrap_or_default(),
                    n.walks.iter().map(longest).sum::<u64>()
                ),
            ));
        }
        v
    }

    fn summary(&self) -> &'static str {
        "the server host's kernel costs the time in its packet processing, before the server \
         sees the packets"
    }

    fn cost(&self, c: &Candidate, x: &Facts<'_>) -> Cost {
        let run = x.main_run();
        let rate = run
            .map(|r| format!("; {} served {:.0} req/s", r.label(), r.requests_per_sec))
            .unwrap_or_default();
        c.cost(
            x,
            format!(
                "every packet into the server waits ~{} in the kernel before the server can \
                 read it: each request at least once, a new connection's handshake twice more{rate}",
                ms(c.added_us)
            ),
        )
    }

    fn fixes(&self, c: &Candidate, x: &Facts<'_>, _target: &Target) -> Vec<Fix> {
        let s = shown(x);
        match (c.mechanism, s.as_ref().and_then(|s| s.walk)) {
            (Some(Mechanism::NetfilterRules), Some(w)) if w.walked < LONG_WALK => vec![Fix {
                side: FixSide::Server,
                location: Some(format!(
                    "nft list chain {} {} {}",
                    w.family, w.table, w.chain
                )),
                change: format!(
                    "a new connection's SYN walks {} rules of {} {} {} one by one (established \
                     traffic is accepted early): accept the server's port before them (`tcp \
                     dport {} accept`), and match the other ports with one set, `tcp dport {{ \
                     1, 2, … }} drop`, or a verdict map — one hash lookup per packet",
                    w.walked_new,
                    w.family,
                    w.table,
                    w.chain,
                    port(x).map_or("PORT".to_string(), |p| p.to_string())
                ),
                tradeoff: Some("clients that reuse connections pay it only once each".into()),
            }],
            (Some(Mechanism::NetfilterRules), Some(w)) => {
                vec![Fix {
                side: FixSide::Server,
                location: Some(format!("nft list chain {} {} {}", w.family, w.table, w.chain)),
                change: format!(
                    "a packet walks {} rules of {} {} {} one by one: match the ports (or \
                     addresses) with one set, `tcp dport {{ 1, 2, … }} drop`, or a verdict map, \
                     `tcp dport vmap {{ 1 : drop, … }}` — one hash lookup per packet — and accept \
                     the server's own traffic (`tcp dport {} accept`, or `ct state \
                     established,related accept`) before the rest",
                    longest(w),
                    w.family,
                    w.table,
                    w.chain,
                    port(x).map_or("PORT".to_string(), |p| p.to_string())
                ),
                tradeoff: Some(
                    "iptables users: ipset (`-m set --match-set`) does the same for an iptables \
                     chain"
                        .into(),
                ),
            }]
            }
            // The host's own fix (the table's size, `notrack`) says it all.
            (Some(Mechanism::Conntrack), _) => Vec::new(),
            (Some(Mechanism::SoftirqSaturated), _) => {
                vec![softirq_saturated_fix(s.as_ref().map(|s| s.k))]
            }
            _ => vec![Fix {
                side: FixSide::Server,
                location: None,
                change: "find what the kernel does per packet on the server's host: \
                         `perf top` / `perf record -a -g` during the load shows the kernel \
                         functions (netfilter hooks, conntrack, a qdisc, XDP), `nft list \
                         ruleset` the rules every packet walks"
                    .into(),
                tradeoff: None,
            }],
        }
    }
}

/// SYN in → SYN-ACK out at a capture next to the server (the packet layer's).
fn handshake_gap<'a>(x: &Facts<'a>) -> Option<&'a crate::evidence::Percentiles> {
    x.packets?
        .server_syn_synack
        .as_ref()
        .filter(|g| g.count >= 3)
}

fn handshake_text(g: &crate::evidence::Percentiles) -> String {
    format!(
        "at the server's capture a SYN in → its SYN-ACK out took p50 {} (p90 {}, {} \
         handshakes): the server host's kernel answering a handshake, beside the wire",
        ms(g.p50_us),
        ms(g.p90_us),
        g.count
    )
}

/// The server's port, as the rule walk was read for it.
fn port(x: &Facts<'_>) -> Option<u16> {
    x.host.and_then(|h| h.netfilter.get()).and_then(|n| n.port)
}
