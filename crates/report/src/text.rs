//! Terminal text: verdict on top, then each layer with its status, then the evidence, the
//! fix, and the before/after table when verifying.

use std::fmt::Write as _;

use lagtrace_model::diagnosis::Diagnosis;
use lagtrace_model::diagnosis::evidence::{
    AppEvidence, AppRun, LayerName, LayerStatus, PacketEvidence, PathEvidence, SocketEvidence,
};
use lagtrace_model::diagnosis::verdict::{FixSide, Stance};

use crate::ms;

/// How diagnose --agent's note on a server-side layer begins (`from agent ADDR (...)`).
const REMOTE_NOTE: &str = "from agent ";

/// One line summing up what a layer measured (or why it did not run).
pub(crate) fn layer_summary(d: &Diagnosis, l: LayerName) -> String {
    let layers = &d.layers;
    let missing = || layers.reason(l).unwrap_or("").to_string();
    let s = match l {
        LayerName::Path => layers.path.get().map_or_else(missing, path_summary),
        LayerName::App => layers.app.get().map_or_else(missing, app_summary),
        LayerName::Packets => layers.packets.get().map_or_else(missing, packets_summary),
        LayerName::Host => layers.host.get().map_or_else(missing, host_summary),
        // A passive run's clients are real clients: their options were not lagtrace's.
        LayerName::Sockets if passive(d) => layers
            .sockets
            .get()
            .map_or_else(missing, |so| sockets_summary(so, false)),
        LayerName::Sockets => match layers.sockets.get() {
            None => format!(
                "{}; client lagtrace: TCP_NODELAY on, delayed ACK on (like wrk, browsers)",
                missing()
            ),
            Some(so) => sockets_summary(so, true),
        },
    };
    // A layer that kept some data but did not fully measure says why first.
    match layers.reason(l) {
        Some(r)
            if !matches!(layers.status(l), LayerStatus::Ok | LayerStatus::Finding)
                && !s.starts_with(r) =>
        {
            format!("{r}; {s}")
        }
        // A server-side layer from `lagtrace agent` says so (diagnose --agent's note).
        Some(r) if r.contains(REMOTE_NOTE) && !s.contains(r) => format!("{s}; {r}"),
        _ => s,
    }
}

/// SYN RTT idle and under load, the hops that answered, the probe method if not SYN.
fn path_summary(p: &PathEvidence) -> String {
    let mut s = String::new();
    match &p.idle {
        Some(i) if i.received > 0 => {
            let _ = write!(
                s,
                "SYN RTT p50 {} idle ({}/{} answered{})",
                ms(i.p50_us),
                i.received,
                i.sent,
                if i.rst > 0 { ", RST" } else { "" }
            );
        }
        Some(i) => {
            let _ = write!(s, "no reply to {} SYN probes", i.sent);
        }
        None => s.push_str("no idle probe"),
    }
    if let Some(u) = p.under_load.as_ref().filter(|u| u.received > 0) {
        let _ = write!(s, ", {} under load", ms(u.p50_us));
    }
    if !p.hops.is_empty() {
        let answered: Vec<String> = p
            .hops
            .iter()
            .filter_map(|h| h.addr.as_ref().map(|a| format!("{}:{a}", h.ttl)))
            .collect();
        if answered.is_empty() {
            let _ = write!(s, "; route: no hop answered ({} TTLs)", p.hops.len());
        } else {
            let _ = write!(s, "; route: {}", answered.join(" "));
        }
    }
    if p.method != "tcp-syn" && !p.method.is_empty() {
        // The text keeps its short word for a timed connect().
        let m = if p.method == "tcp-connect" {
            "connect"
        } else {
            &p.method
        };
        let _ = write!(s, " [{m}]");
    }
    s
}

/// c=1 and c=N: p50, p99, rate and errors.
fn app_summary(a: &AppEvidence) -> String {
    let one = |r: &AppRun| {
        if r.requests == 0 {
            return format!(
                "{}: no request completed ({} connect, {} timeout, {} read errors)",
                r.label(),
                r.errors.connect,
                r.errors.timeout,
                r.errors.read
            );
        }
        // The p99 the verdict reads: every request's wait, slow and failed connects
        // included, when records were kept and it differs from the completed requests'.
        let p99 = match &r.waits {
            Some(w) if w.p99_us != r.latency.p99_us => {
                format!("{} incl. connects", ms(w.p99_us))
            }
            _ => ms(r.latency.p99_us),
        };
        format!(
            "{} p50 {} p99 {} {:.0} req/s{}",
            r.label(),
            ms(r.latency.p50_us),
            p99,
            r.requests_per_sec,
            if r.errors.total() > 0 {
                format!(", {} errors", r.errors.total())
            } else {
                String::new()
            }
        )
    };
    let v: Vec<String> = [a.c1.as_ref(), a.cn.as_ref()]
        .into_iter()
        .flatten()
        .map(one)
        .collect();
    if v.is_empty() {
        "no load run".into()
    } else {
        v.join("; ")
    }
}

/// Packets, streams, transactions and each finding's share and added time.
fn packets_summary(p: &PacketEvidence) -> String {
    let mut s = format!(
        "{} packets, {} streams, {} transactions",
        p.packets, p.streams, p.transactions
    );
    for f in &p.findings {
        let _ = write!(
            s,
            "; {} {:.1}% +{}",
            f.kind,
            f.share * 100.0,
            ms(f.median_added_us)
        );
    }
    if p.findings.is_empty() {
        s.push_str("; no findings");
    }
    s
}

/// The host layer in one line: what moved on the server's host over the c=N run.
fn host_summary(h: &lagtrace_model::host::HostReport) -> String {
    let mut s = match (&h.scope.comm, h.scope.pid) {
        (Some(c), Some(p)) => format!("{c} (pid {p})"),
        _ => "namespace only".into(),
    };
    for l in h.listeners.get().into_iter().flatten() {
        let dropped = h.listen_drops(l);
        if dropped > 0 || l.full_samples > 0 {
            let _ = write!(
                s,
                "; listener {} dropped {} connections (queue peak {} of {}, full in {} samples)",
                l.local, dropped, l.peak, l.max, l.full_samples
            );
        }
    }
    match h.cgroup.get() {
        Some(c) if c.throttled_periods > 0 => {
            let _ = write!(
                s,
                "; cgroup throttled in {} of {} periods ({:.0}%), {} held",
                c.throttled_periods,
                c.periods,
                c.throttled_share * 100.0,
                ms(c.throttled_us)
            );
        }
        Some(_) => s.push_str("; cgroup not throttled"),
        None => {}
    }
    if let Some(t) = h.threads.get() {
        let _ = write!(
            s,
            "; {} threads waited {} for a CPU ({:.0}%)",
            t.threads,
            ms(t.wait_us),
            t.wait_share * 100.0
        );
    }
    for q in h.qdiscs.get().into_iter().flatten().filter(|q| q.drops > 0) {
        let _ = write!(s, "; qdisc {} on {} dropped {}", q.kind, q.dev, q.drops);
    }
    if let Some(p) = h.oncpu.get().filter(|p| p.samples > 0) {
        let top: Vec<String> = p
            .modules
            .iter()
            .take(2)
            .map(|m| format!("{} {:.0}%", m.module, m.share * 100.0))
            .collect();
        let _ = write!(
            s,
            "; on a CPU ~{} ({} samples: {})",
            ms(p.samples * 1_000_000 / p.hz.max(1)),
            p.samples,
            top.join(", ")
        );
    }
    if let Some(k) = h.softirq.get() {
        if let Some(ns) = k.per_packet_ns() {
            let whose = if k.own_per_packet_ns().is_some() {
                "the server's namespace"
            } else {
                "machine-wide"
            };
            let _ = write!(s, "; kernel receive {} per packet ({whose})", ms(ns / 1000));
        }
        if let Some(w) = &k.netns_backlog_wait {
            let _ = write!(s, ", its TCP packets queued p50 {}", ms(w.p50_us));
        }
        if k.backlog_drops > 0 {
            let _ = write!(
                s,
                "; {} packets dropped at a full CPU backlog",
                k.backlog_drops
            );
        }
    }
    if let Some(c) = h.conntrack.get().filter(|c| c.lost() > 0) {
        let _ = write!(
            s,
            "; conntrack lost {} new connections' packets ({} of {} entries)",
            c.lost(),
            c.peak.or(c.count).unwrap_or(0),
            c.max.unwrap_or(0)
        );
    }
    if let Some(w) = h
        .netfilter
        .get()
        .and_then(|n| n.walks.iter().max_by_key(|w| w.walked.max(w.walked_new)))
    {
        let _ = write!(
            s,
            "; netfilter {} {} {}: {} rules walked",
            w.family,
            w.table,
            w.chain,
            w.walked.max(w.walked_new)
        );
    }
    s
}

/// Whether the run watched real clients (`diagnose --passive` / `--pcap`).
fn passive(d: &Diagnosis) -> bool {
    d.layers
        .app
        .get()
        .and_then(|a| a.cn.as_ref())
        .is_some_and(|r| r.passive.is_some())
}

/// The server process, its sockets' options, its non-default config, and (when lagtrace was
/// the client) the client's.
fn sockets_summary(so: &SocketEvidence, own_client: bool) -> String {
    let mut s = match &so.server {
        Some(p) => format!("{} (pid {})", p.comm, p.pid),
        None => "server process not found".into(),
    };
    let _ = write!(
        s,
        ": {} established, TCP_NODELAY on {}/off {}, TCP_CORK on {}",
        so.established, so.nodelay.on, so.nodelay.off, so.cork.on
    );
    for c in so.config.iter().filter(|c| !c.default) {
        let _ = write!(s, "; {} {} ({}:{})", c.name, c.value, c.file, c.line);
    }
    if !own_client {
        return s;
    }
    let _ = write!(
        s,
        "; client lagtrace: TCP_NODELAY {}, delayed ACK {}",
        if so.client.nodelay { "on" } else { "off" },
        if so.client.quickack {
            "off (TCP_QUICKACK)"
        } else {
            "on"
        }
    );
    s
}

/// Renders the diagnosis for a terminal.
pub fn text(d: &Diagnosis) -> String {
    let mut o = String::new();
    let v = &d.verdict;
    let _ = writeln!(
        o,
        "lagtrace diagnose {}  ({:.1} s)\n",
        d.target.url,
        d.elapsed_us as f64 / 1e6
    );
    let _ = writeln!(
        o,
        "VERDICT  {}  (confidence {})",
        v.cause,
        v.confidence.name()
    );
    let _ = writeln!(o, "  {}", v.summary);
    if let Some(h) = &v.hop {
        let _ = writeln!(o, "  where: {}", h.text);
    }
    if !v.cost.text.is_empty() {
        let _ = writeln!(o, "  cost: {}", v.cost.text);
    }
    if let Some(t) = &v.tail {
        let _ = writeln!(o, "  tail: {}", t.text);
    }
    if !v.secondary.is_empty() {
        let s: Vec<&str> = v.secondary.iter().map(|c| c.code()).collect();
        let _ = writeln!(o, "  also: {}", s.join(", "));
    }
    let _ = writeln!(o, "\nLAYERS");
    for l in LayerName::ALL {
        let _ = writeln!(
            o,
            "  {:<8} {:<11} {}",
            l.name(),
            d.layers.status(l).name(),
            layer_summary(d, l)
        );
    }
    if !d.evidence.is_empty() {
        let _ = writeln!(o, "\nEVIDENCE  (+ supports, - rules out, · note)");
        for e in &d.evidence {
            // A layer that did not measure says why once, in LAYERS above (JSON keeps both).
            let l = e.layer;
            if e.stance == Stance::Note
                && d.layers.status(l) != LayerStatus::Ok
                && e.text
                    == format!(
                        "{} layer {}: {}",
                        l.name(),
                        d.layers.status(l).name(),
                        d.layers.reason(l).unwrap_or("no reason given")
                    )
            {
                continue;
            }
            let mark = match e.stance {
                Stance::Supports => '+',
                Stance::RulesOut => '-',
                Stance::Note => '·',
            };
            let _ = writeln!(o, "  {mark} [{}] {}", e.layer.name(), e.text);
        }
    }
    if !v.fix.is_empty() {
        let _ = writeln!(o, "\nFIX");
        for f in &v.fix {
            let side = match f.side {
                FixSide::Server => "server",
                FixSide::Client => "client",
                FixSide::Path => "path",
            };
            let loc = f
                .location
                .as_ref()
                .map(|l| format!("{l}: "))
                .unwrap_or_default();
            let _ = writeln!(o, "  {side:<6} {loc}{}", f.change);
            if let Some(t) = &f.tradeoff {
                let _ = writeln!(o, "         trade-off: {t}");
            }
        }
    }
    if let Some(vf) = &d.verify {
        let _ = writeln!(
            o,
            "\nVERIFY  against {}: {} → {}",
            vf.baseline, vf.before_cause, vf.after_cause
        );
        let _ = writeln!(
            o,
            "  {:<6} {:<6} {:>12} {:>12}  change",
            "run", "metric", "before", "after"
        );
        for r in &vf.rows {
            let (b, a) = if r.metric == "req/s" {
                (format!("{:.0}", r.before), format!("{:.0}", r.after))
            } else {
                (ms(r.before as u64), ms(r.after as u64))
            };
            let change = if r.improvement >= 1.0 {
                format!("{:.1}× better", r.improvement)
            } else {
                format!("{:.1}× worse", 1.0 / r.improvement.max(1e-9))
            };
            let _ = writeln!(
                o,
                "  {:<6} {:<6} {:>12} {:>12}  {}",
                r.run, r.metric, b, a, change
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use lagtrace_model::diagnosis::evidence::{AppEvidence, Percentiles};

    use super::*;

    fn run(p99: u64, waits: Option<u64>) -> AppRun {
        let p = |p99_us| Percentiles {
            count: 1000,
            min_us: 100,
            mean_us: 300,
            p50_us: 300,
            p90_us: 400,
            p99_us,
            p999_us: p99_us * 2,
            max_us: p99_us * 3,
        };
        AppRun {
            concurrency: 32,
            requests: 1000,
            duration_us: 4_000_000,
            requests_per_sec: 250.0,
            latency: p(p99),
            distribution: vec![],
            errors: Default::default(),
            first_request: None,
            bytes: 0,
            later_requests: None,
            waits: waits.map(p),
            connects: None,
            records: None,
            client_cpu: None,
            passive: None,
        }
    }

    #[test]
    fn the_app_row_shows_the_p99_the_verdict_reads() {
        let row = |r| {
            app_summary(&AppEvidence {
                c1: None,
                cn: Some(r),
            })
        };
        // The backlog case: completed requests' p99 14 ms, every wait's 46 ms.
        let s = row(run(14_000, Some(46_000)));
        assert!(s.contains("p99 46"), "{s}");
        assert!(s.contains("incl. connects"), "{s}");
        assert!(!s.contains("p99 14"), "{s}");
        // Without records, or when they agree, the row is what it was.
        let plain = row(run(14_000, None));
        assert_eq!(row(run(14_000, Some(14_000))), plain);
        assert!(!plain.contains("incl."), "{plain}");
    }
}
