//! The verdict rules: pure functions from evidence to a verdict. No I/O, no clock.
//!
//! How it decides:
//! 1. No request succeeded and the connection could not be made → `unreachable`, with what
//!    the path layer saw (RST: nothing listens; silence: nothing answers).
//! 2. Each cause becomes a *candidate* when a layer shows it with a material effect: a packet
//!    finding on enough transactions with enough added latency, the SYN RTT rising under
//!    load, the server's own time (c=1 latency minus the path RTT, and the server time seen
//!    in the packets) being large. Socket and configuration evidence corroborate (raising the
//!    confidence) but never create a network cause on their own.
//! 3. The server's own time is "explained" by Nagle or TCP_CORK when their added latency is
//!    most of it; otherwise, when it dominates, no network cause is named as primary.
//! 4. The largest remaining expected cost (share × added latency) is the primary cause; the
//!    others are secondary. No candidate → `healthy`.

use lagtrace_model::{Cause, Micros};

use crate::evidence::{
    AppRun, FindingSummary, LayerName, Layers, PacketEvidence, PathEvidence, SocketEvidence, Target,
};
use crate::verdict::{Confidence, EvidenceLine, Fix, FixSide, Stance, Verdict};

/// A finding adds latency worth naming when its median added latency is at least this.
pub const MATERIAL_ADDED_US: u64 = 5_000;
/// ... and it affects at least this share of transactions (Nagle, cork, window).
pub const MATERIAL_SHARE: f64 = 0.05;
/// Retransmissions matter on a smaller share: each costs an RTO or more.
pub const MATERIAL_LOSS_SHARE: f64 = 0.005;
/// The server's own time per request worth naming on its own, whatever the path adds.
pub const SLOW_SERVER_US: u64 = 10_000;
/// Below [`SLOW_SERVER_US`], the server's own time is still the cause when it is at least
/// this long and makes up [`DOMINANT_SERVER_SHARE`] of what the user waits at c=1 (a 5 ms
/// handler on a 50 µs path is where the latency comes from; a 5 ms handler behind a 40 ms
/// path is not).
pub const DOMINANT_SERVER_US: u64 = 2_000;
/// The share of the c=1 p50 the server's own time must make up below [`SLOW_SERVER_US`].
pub const DOMINANT_SERVER_SHARE: f64 = 0.75;
/// A response that trickles out slower than this (bits/s, at c=1) on a path with no queue,
/// loss or window limit is paced by the sender: a bottleneck link TCP fills would show a
/// queue (SYN RTT rise) or losses, and a fast path carries far more.
pub const PACED_BPS: f64 = 100e6;
/// A SYN RTT rise under load worth naming (and it must be 3× the idle RTT, and the
/// application must feel it): well above what a busy CPU adds to one probe.
pub const QUEUE_RISE_US: u64 = 10_000;

/// The verdict, its evidence, and which layers hold a finding.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The conclusion.
    pub verdict: Verdict,
    /// Evidence for it and against the alternatives.
    pub evidence: Vec<EvidenceLine>,
    /// Layers whose data supports a non-healthy cause (their status becomes `finding`).
    pub finding_layers: Vec<LayerName>,
}

fn ms(us: u64) -> String {
    Micros(us).to_string()
}

fn pct(share: f64) -> String {
    let p = share * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

struct Candidate {
    cause: Cause,
    /// Expected added latency per request (share × median), for ranking.
    impact_us: f64,
    /// Median added latency of an affected request.
    added_us: u64,
    /// Share of requests affected.
    share: f64,
    /// Corroborating layers.
    layers: Vec<LayerName>,
    /// Whether a layer shows the mechanism directly (packets, or a socket option).
    direct: bool,
    evidence: Vec<EvidenceLine>,
}

fn line(layer: LayerName, stance: Stance, cause: Option<Cause>, text: String) -> EvidenceLine {
    EvidenceLine {
        layer,
        stance,
        cause,
        text,
    }
}

fn sup(layer: LayerName, cause: Cause, text: String) -> EvidenceLine {
    line(layer, Stance::Supports, Some(cause), text)
}

fn out(layer: LayerName, cause: Cause, text: String) -> EvidenceLine {
    line(layer, Stance::RulesOut, Some(cause), text)
}

fn note(layer: LayerName, text: String) -> EvidenceLine {
    line(layer, Stance::Note, None, text)
}

fn example_text(f: &FindingSummary) -> String {
    match f.examples.first() {
        Some(e) => {
            let frames: Vec<String> = e.frames.iter().map(|n| format!("#{n}")).collect();
            format!(
                "; e.g. stream {} frames {} at {:.6}s: {}{}",
                e.stream,
                frames.join(" "),
                e.time_s,
                ms(e.added_us),
                if e.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", e.note)
                }
            )
        }
        None => String::new(),
    }
}

fn finding_text(f: &FindingSummary, total: u64) -> String {
    format!(
        "{}: {} of {} transactions ({}), median +{}, p99 +{}{}",
        f.kind,
        f.transactions,
        total,
        pct(f.share),
        ms(f.median_added_us),
        ms(f.p99_added_us),
        example_text(f)
    )
}

/// The facts most rules share.
struct Facts<'a> {
    path: Option<&'a PathEvidence>,
    c1: Option<&'a AppRun>,
    cn: Option<&'a AppRun>,
    packets: Option<&'a PacketEvidence>,
    sockets: Option<&'a SocketEvidence>,
    /// Idle path RTT (SYN ping median, else the handshake RTT seen in packets).
    rtt_us: u64,
}

impl<'a> Facts<'a> {
    fn new(layers: &'a Layers) -> Self {
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
            rtt_us,
        }
    }

    /// The run whose p50 the user sees under concurrency (c=N, else c=1).
    fn main_run(&self) -> Option<&'a AppRun> {
        self.cn.or(self.c1)
    }

    fn finding(&self, kind: &str) -> Option<&'a FindingSummary> {
        self.packets.and_then(|p| p.finding(kind))
    }

    fn transactions(&self) -> u64 {
        self.packets.map(|p| p.transactions).unwrap_or(0)
    }

    /// The server's own time per request: c=1 latency minus the path RTT, and the packets'
    /// server time; the smaller of the two (c=N server time includes queueing on the path
    /// and in the server; c=1 latency includes transfer time).
    fn server_own_us(&self) -> Option<u64> {
        let from_c1 = self
            .c1
            .map(|r| r.latency.p50_us.saturating_sub(self.rtt_us));
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

    /// The response's transfer at c=1 dominates and runs slower than [`PACED_BPS`]:
    /// (transfer time µs, response bytes, bits/s).
    fn paced_transfer(&self) -> Option<(u64, u64, f64)> {
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
    fn bottleneck_transfer_us(&self, run: &AppRun) -> u64 {
        let Some(cn) = self.cn else { return 0 };
        if run.requests == 0 || run.bytes == 0 || cn.bytes == 0 || cn.duration_us == 0 {
            return 0;
        }
        let size = run.bytes as f64 / run.requests as f64;
        let rate = cn.bytes as f64 / (cn.duration_us as f64 / 1e6);
        (size / rate * 1e6) as u64
    }

    fn queue_rise_us(&self) -> Option<(u64, u64, u64)> {
        let p = self.path?;
        let idle = p.idle.as_ref().filter(|s| s.received > 0)?;
        let load = p.under_load.as_ref().filter(|s| s.received > 0)?;
        Some((
            idle.p50_us,
            load.p50_us,
            load.p50_us.saturating_sub(idle.p50_us),
        ))
    }
}

fn material(f: &FindingSummary, min_share: f64) -> bool {
    f.share >= min_share && f.median_added_us >= MATERIAL_ADDED_US
}

fn nagle_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::NagleDelayedAck;
    let mut ev = Vec::new();
    let mut layers = Vec::new();
    let mut direct = false;
    let mut added = 0;
    let mut share = 0.0;
    // Packets: the combined finding, else its halves.
    let pk = ["nagle-delayed-ack", "nagle-stall", "delayed-ack"]
        .iter()
        .filter_map(|k| x.finding(k))
        .find(|f| material(f, MATERIAL_SHARE));
    if let Some(f) = pk {
        ev.push(sup(
            LayerName::Packets,
            cause,
            finding_text(f, x.transactions()),
        ));
        layers.push(LayerName::Packets);
        direct = true;
        added = f.median_added_us;
        share = f.share;
    }
    // Sockets and config: corroborate; alone they only make a low-confidence candidate when
    // the application latency has the 40 ms shape.
    let mut sockets_say = false;
    if let Some(s) = x.sockets {
        if s.nodelay.off > 0 && s.nodelay.off >= s.nodelay.on {
            let who = s
                .server
                .as_ref()
                .map(|p| format!("{} (pid {})", p.comm, p.pid))
                .unwrap_or_else(|| "the server".into());
            ev.push(sup(
                LayerName::Sockets,
                cause,
                format!(
                    "{who}: TCP_NODELAY off on {}/{} established sockets",
                    s.nodelay.off,
                    s.nodelay.on + s.nodelay.off + s.nodelay.unknown
                ),
            ));
            sockets_say = true;
        }
        if let Some(d) = s.directive("tcp_nodelay").filter(|d| d.value == "off") {
            ev.push(sup(
                LayerName::Sockets,
                cause,
                format!("{}:{}: tcp_nodelay {};", d.file, d.line, d.value),
            ));
            sockets_say = true;
        }
        if !s.client.quickack {
            ev.push(note(
                LayerName::Sockets,
                "client (lagtrace): TCP_NODELAY on, delayed ACK on (no TCP_QUICKACK), \
                 like wrk and browsers"
                    .into(),
            ));
        }
    }
    if sockets_say {
        layers.push(LayerName::Sockets);
    }
    // Application: the 40 ms shape at c=1, first request fast and later ones slow.
    let mut app_says = false;
    let mut shape_added = None;
    if let Some(c1) = x.c1 {
        let p50 = c1.latency.p50_us;
        if (30_000..=60_000).contains(&p50) {
            let mut t = format!(
                "c=1 p50 {} over a path RTT of {}: the ~40 ms delayed-ACK timer",
                ms(p50),
                ms(x.rtt_us)
            );
            if let (Some(f), Some(l)) = (&c1.first_request, &c1.later_requests)
                && f.p50_us * 4 < l.p50_us
            {
                t.push_str(&format!(
                    "; the first request on a connection takes {}, later ones {} (quick-ACK \
                     mode ends after the first)",
                    ms(f.p50_us),
                    ms(l.p50_us)
                ));
                shape_added = Some(l.p50_us.saturating_sub(f.p50_us));
            }
            ev.push(sup(LayerName::App, cause, t));
            app_says = true;
            layers.push(LayerName::App);
        }
    }
    if !direct {
        if sockets_say && app_says {
            added = x.c1.map(|r| r.latency.p50_us.saturating_sub(x.rtt_us))?;
            share = 1.0;
            direct = true; // the socket option is direct evidence of the mechanism
        } else if let Some(a) = shape_added.filter(|_| app_says) {
            // Only the application's shape: a slow server would make the first request on a
            // connection slow too; ~40 ms on every later one is the delayed-ACK timer.
            added = a;
            share = 1.0;
            ev.push(note(
                LayerName::App,
                "packets and socket options could not confirm it: run as root for the \
                 capture and the server's TCP_NODELAY"
                    .into(),
            ));
        } else {
            return None;
        }
    }
    Some(Candidate {
        cause,
        impact_us: share * added as f64,
        added_us: added,
        share,
        layers,
        direct,
        evidence: ev,
    })
}

fn cork_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::TcpCork;
    let mut ev = Vec::new();
    let mut layers = Vec::new();
    let mut found = None;
    if let Some(f) = x
        .finding("tcp-cork")
        .filter(|f| material(f, MATERIAL_SHARE))
    {
        ev.push(sup(
            LayerName::Packets,
            cause,
            finding_text(f, x.transactions()),
        ));
        layers.push(LayerName::Packets);
        found = Some((f.median_added_us, f.share));
    }
    let mut sockets_say = false;
    if let Some(s) = x.sockets
        && s.cork.on > 0
    {
        let who = s
            .server
            .as_ref()
            .map(|p| format!("{} (pid {})", p.comm, p.pid))
            .unwrap_or_else(|| "the server".into());
        ev.push(sup(
            LayerName::Sockets,
            cause,
            format!(
                "{who}: TCP_CORK set on {}/{} established sockets",
                s.cork.on,
                s.cork.on + s.cork.off + s.cork.unknown
            ),
        ));
        layers.push(LayerName::Sockets);
        sockets_say = true;
    }
    // The server time clustered at the kernel's 200 ms cork ceiling, with the packets
    // showing at least one partial frame released by it: cork, even unseen in the sockets.
    let at_ceiling = x
        .packets
        .and_then(|p| p.server_time.as_ref())
        .filter(|t| t.count > 0 && (195_000..=220_000).contains(&t.p50_us) && t.p90_us <= 260_000);
    let (added, share) = match (found, x.finding("tcp-cork"), at_ceiling) {
        (Some(v), _, _) => v,
        (None, Some(f), Some(t)) if !sockets_say => {
            ev.push(sup(
                LayerName::Packets,
                cause,
                format!(
                    "server time p50 {} (p90 {}): responses leave at the 200 ms TCP_CORK \
                     ceiling; {} released by it{}",
                    ms(t.p50_us),
                    ms(t.p90_us),
                    f.kind,
                    example_text(f)
                ),
            ));
            layers.push(LayerName::Packets);
            (t.p50_us, 1.0)
        }
        _ => {
            // Without packets: TCP_CORK on and c=1 latency at the 200 ms ceiling.
            let c1 = x.c1?;
            if !(sockets_say && (150_000..=260_000).contains(&c1.latency.p50_us)) {
                return None;
            }
            ev.push(sup(
                LayerName::App,
                cause,
                format!(
                    "c=1 p50 {}: the 200 ms TCP_CORK ceiling",
                    ms(c1.latency.p50_us)
                ),
            ));
            layers.push(LayerName::App);
            (c1.latency.p50_us.saturating_sub(x.rtt_us), 1.0)
        }
    };
    Some(Candidate {
        cause,
        impact_us: share * added as f64,
        added_us: added,
        share,
        layers,
        direct: true,
        evidence: ev,
    })
}

fn loss_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::PacketLoss;
    // A few fast retransmissions or tail-loss probes a few ms apart are normal on a busy
    // link; what users feel is RTO-class waits or a cost of more than ~0.5 ms per request.
    let f = x.finding("retransmission").filter(|f| {
        f.count >= 3
            && f.share >= MATERIAL_LOSS_SHARE
            && (f.median_added_us >= 20_000 || f.share * f.median_added_us as f64 >= 500.0)
    })?;
    let mut ev = vec![sup(
        LayerName::Packets,
        cause,
        finding_text(f, x.transactions()),
    )];
    let mut layers = vec![LayerName::Packets];
    if let Some(run) = x.main_run()
        && f.share >= 0.01
        && run.latency.p99_us >= f.median_added_us / 2
        && run.latency.p99_us >= run.latency.p50_us * 4
    {
        ev.push(sup(
            LayerName::App,
            cause,
            format!(
                "c={}: p99 {} against p50 {}: the tail is the retransmission wait",
                run.concurrency,
                ms(run.latency.p99_us),
                ms(run.latency.p50_us)
            ),
        ));
        layers.push(LayerName::App);
    } else if let Some(run) = x.main_run()
        && run.errors.timeout + run.errors.read > 0
    {
        ev.push(sup(
            LayerName::App,
            cause,
            format!(
                "c={}: {} timeouts, {} read errors; p99 {}",
                run.concurrency,
                run.errors.timeout,
                run.errors.read,
                ms(run.latency.p99_us)
            ),
        ));
        layers.push(LayerName::App);
    }
    if let Some(l) = x.path.and_then(|p| p.under_load.as_ref())
        && l.sent > 0
        && l.received < l.sent
    {
        ev.push(sup(
            LayerName::Path,
            cause,
            format!(
                "SYN ping under load: {} of {} probes lost",
                l.sent - l.received,
                l.sent
            ),
        ));
        layers.push(LayerName::Path);
    }
    Some(Candidate {
        cause,
        impact_us: f.share * f.median_added_us as f64,
        added_us: f.median_added_us,
        share: f.share,
        layers,
        direct: true,
        evidence: ev,
    })
}

/// The load's connect timeout: a connection attempt that fails is a SYN not answered in it.
const CONNECT_TIMEOUT_US: u64 = 1_000_000;

/// At c=N a material share of connection attempts fail while c=1 connected every time and
/// the path answers SYNs: the server stops accepting under load (listen backlog full). The
/// SYN retransmission is often not in the packets, because the client gives up first.
/// Returns (failed attempts, share of attempts).
fn refused_under_load(x: &Facts<'_>) -> Option<(u64, f64)> {
    let cn = x.cn?;
    let failed = cn.errors.connect;
    let share = failed as f64 / (cn.requests + failed).max(1) as f64;
    let c1_clean = x.c1.is_some_and(|c1| c1.errors.connect == 0);
    let path_ok = x.path.is_some_and(|p| p.reached && p.port_open);
    (c1_clean && path_ok && failed >= 2 && share >= MATERIAL_LOSS_SHARE).then_some((failed, share))
}

fn syn_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::SynDrop;
    let Some(f) = x
        .finding("syn-retransmit")
        .filter(|f| f.count >= 2 && f.median_added_us >= 100_000)
    else {
        let (failed, share) = refused_under_load(x)?;
        let cn = x.cn?;
        return Some(Candidate {
            cause,
            impact_us: share * CONNECT_TIMEOUT_US as f64,
            added_us: CONNECT_TIMEOUT_US,
            share,
            layers: vec![LayerName::App],
            direct: x.packets.is_some(),
            evidence: vec![sup(
                LayerName::App,
                cause,
                format!(
                    "at c={} {failed} of {} connection attempts ({}) got no SYN-ACK within the \
                     {} connect timeout, while c=1 and the SYN probes connected every time: \
                     the server stops accepting new connections under load",
                    cn.concurrency,
                    cn.requests + failed,
                    pct(share),
                    ms(CONNECT_TIMEOUT_US)
                ),
            )],
        });
    };
    // Connections are few compared with requests: weigh by connections, not transactions.
    let share = f.share.max(0.01);
    Some(Candidate {
        cause,
        impact_us: share * f.median_added_us as f64,
        added_us: f.median_added_us,
        share,
        layers: vec![LayerName::Packets],
        direct: true,
        evidence: vec![sup(
            LayerName::Packets,
            cause,
            format!(
                "syn-retransmit: {} connection attempts waited for a SYN retransmission, \
                 median +{}{}",
                f.count,
                ms(f.median_added_us),
                example_text(f)
            ),
        )],
    })
}

fn window_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::ReceiveWindow;
    let f = ["zero-window", "window-full"]
        .iter()
        .filter_map(|k| x.finding(k))
        .find(|f| material(f, MATERIAL_SHARE))?;
    Some(Candidate {
        cause,
        impact_us: f.share * f.median_added_us as f64,
        added_us: f.median_added_us,
        share: f.share,
        layers: vec![LayerName::Packets],
        direct: true,
        evidence: vec![sup(
            LayerName::Packets,
            cause,
            finding_text(f, x.transactions()),
        )],
    })
}

fn queue_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::PathQueueing;
    let (idle, load, rise) = x.queue_rise_us()?;
    if rise < QUEUE_RISE_US || load < idle.saturating_mul(3) {
        return None;
    }
    let mut ev = vec![sup(
        LayerName::Path,
        cause,
        format!(
            "SYN RTT p50 {} idle → {} under load (+{}): a queue on the path fills",
            ms(idle),
            ms(load),
            ms(rise)
        ),
    )];
    let mut layers = vec![LayerName::Path];
    // The application must feel the queue too: a SYN RTT rising alone (a probe delayed on a
    // busy CPU) is not a queue on the path.
    if let (Some(c1), Some(cn)) = (x.c1, x.cn)
        && cn.latency.p50_us <= c1.latency.p50_us + rise / 2
    {
        return None;
    }
    if let (Some(c1), Some(cn)) = (x.c1, x.cn) {
        ev.push(sup(
            LayerName::App,
            cause,
            format!(
                "p50 {} at c=1 → {} at c={}",
                ms(c1.latency.p50_us),
                ms(cn.latency.p50_us),
                cn.concurrency
            ),
        ));
        layers.push(LayerName::App);
    }
    Some(Candidate {
        cause,
        impact_us: rise as f64,
        added_us: rise,
        share: 1.0,
        layers,
        direct: true,
        evidence: ev,
    })
}

fn slow_server_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let cause = Cause::SlowServer;
    let own = x.server_own_us()?;
    if own < SLOW_SERVER_US && !server_dominates(x, own) {
        return None;
    }
    let mut ev = Vec::new();
    let mut layers = Vec::new();
    if let Some(c1) = x.c1 {
        ev.push(sup(
            LayerName::App,
            cause,
            format!(
                "c=1 p50 {} with a path RTT of {}: the server takes ~{} per request itself",
                ms(c1.latency.p50_us),
                ms(x.rtt_us),
                ms(c1.latency.p50_us.saturating_sub(x.rtt_us))
            ),
        ));
        layers.push(LayerName::App);
    }
    if let Some(st) = x.packets.and_then(|p| p.server_time.as_ref())
        && st.count > 0
    {
        let mut t = format!(
            "server time (request's last byte → response's first byte) p50 {}, p99 {} over \
             {} transactions",
            ms(st.p50_us),
            ms(st.p99_us),
            st.count
        );
        if let Some(f) = x.finding("slow-server") {
            t.push_str(&example_text(f));
        }
        ev.push(sup(LayerName::Packets, cause, t));
        layers.push(LayerName::Packets);
    }
    Some(Candidate {
        cause,
        impact_us: own as f64,
        added_us: own,
        share: 1.0,
        layers,
        direct: x.packets.is_some(),
        evidence: ev,
    })
}

/// The server's own time, though short of [`SLOW_SERVER_US`], is most of what the user waits
/// at c=1 (measured at c=1, not under load, where a saturated server queues requests).
fn server_dominates(x: &Facts<'_>, own: u64) -> bool {
    own >= DOMINANT_SERVER_US
        && x.c1.is_some_and(|c1| {
            c1.latency.p50_us > 0 && own as f64 >= DOMINANT_SERVER_SHARE * c1.latency.p50_us as f64
        })
}

/// The server answers at once but sends the response slowly (a rate limit such as nginx
/// `limit_rate`, or a producer that writes in dribbles), with no network cause to explain it.
fn paced_response_candidate(x: &Facts<'_>) -> Option<Candidate> {
    let (transfer, size, bps) = x.paced_transfer()?;
    let cause = Cause::SlowServer;
    let c1 = x.c1?;
    let mut ev = vec![sup(
        LayerName::App,
        cause,
        format!(
            "c=1 p50 {} with a path RTT of {} and a server time of ~{}: ~{} goes to sending \
             each ~{} B response, {} — the sender paces it",
            ms(c1.latency.p50_us),
            ms(x.rtt_us),
            ms(x.server_own_us().unwrap_or(0)),
            ms(transfer),
            size,
            rate_text(bps)
        ),
    )];
    if x.packets.is_some() {
        ev.push(sup(
            LayerName::Packets,
            cause,
            "no retransmission, Nagle, cork or window finding explains the transfer time".into(),
        ));
    }
    // Inferred from what is absent: never high confidence.
    Some(Candidate {
        cause,
        impact_us: transfer as f64,
        added_us: transfer,
        share: 1.0,
        layers: vec![LayerName::App],
        direct: x.packets.is_some(),
        evidence: ev,
    })
}

fn rate_text(bps: f64) -> String {
    if bps >= 1e6 {
        format!("{:.1} Mbit/s", bps / 1e6)
    } else {
        format!("{:.0} kbit/s", bps / 1e3)
    }
}

fn is_network(c: Cause) -> bool {
    matches!(
        c,
        Cause::PacketLoss | Cause::PathQueueing | Cause::SynDrop | Cause::ReceiveWindow
    )
}

fn unreachable(target: &Target, layers: &Layers, x: &Facts<'_>) -> Option<Judgement> {
    if x.c1.is_some() || x.cn.is_some() {
        return None;
    }
    let app = layers.app.get();
    let connect_errors: u64 = app
        .map(|a| {
            [a.c1.as_ref(), a.cn.as_ref()]
                .into_iter()
                .flatten()
                .map(|r| r.errors.connect)
                .sum()
        })
        .unwrap_or(0);
    let path_says_closed = x.path.is_some_and(|p| !p.port_open);
    if connect_errors == 0 && !path_says_closed {
        return None;
    }
    let cause = Cause::Unreachable;
    let mut ev = Vec::new();
    let where_ = format!("{}:{}", target.addr, target.port);
    let summary;
    let mut fix = Vec::new();
    match x.path {
        Some(p) if p.reached && !p.port_open => {
            let rst = p.idle.as_ref().map(|s| s.rst).unwrap_or(0);
            ev.push(sup(
                LayerName::Path,
                cause,
                format!(
                    "the host answers ({} RST to {} SYN probes, RTT {}): nothing listens on \
                     port {}",
                    rst,
                    p.idle.as_ref().map(|s| s.sent).unwrap_or(0),
                    ms(x.rtt_us),
                    target.port
                ),
            ));
            summary = format!("nothing listens on {where_}: the host answers with RST");
            fix.push(Fix {
                side: FixSide::Server,
                location: Some(where_.clone()),
                change: format!(
                    "start the server on port {}, or use the port it listens on",
                    target.port
                ),
                tradeoff: None,
            });
        }
        Some(p) if !p.reached => {
            let sent = p.idle.as_ref().map(|s| s.sent).unwrap_or(0);
            let mut t = format!("no reply to {sent} SYN probes to {where_}");
            if let Some(last) = p.hops.iter().rev().find(|h| h.addr.is_some()) {
                t.push_str(&format!(
                    "; the route stops after hop {} ({})",
                    last.ttl,
                    last.addr.as_deref().unwrap_or("?")
                ));
            }
            ev.push(sup(LayerName::Path, cause, t));
            summary = format!("{} does not answer: no SYN-ACK, no RST", target.addr);
            fix.push(Fix {
                side: FixSide::Path,
                location: Some(target.addr.clone()),
                change: "check the address, the route to it and firewalls that drop SYNs \
                         silently"
                    .into(),
                tradeoff: None,
            });
        }
        _ if layers
            .app
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("TLS")) =>
        {
            // TCP connects (the SYN probes are answered), the TLS handshake does not.
            summary = format!(
                "{where_} accepts TCP connections but the TLS handshake fails: no request \
                 could be sent"
            );
            fix.push(Fix {
                side: FixSide::Client,
                location: Some(target.url.clone()),
                change: "if the server speaks plain HTTP on this port, use http://; if its \
                         certificate is self-signed, add --insecure"
                    .into(),
                tradeoff: None,
            });
        }
        _ => {
            summary = format!("no connection to {where_} could be made");
            fix.push(Fix {
                side: FixSide::Server,
                location: Some(where_.clone()),
                change: "check that the server runs and listens on this address".into(),
                tradeoff: None,
            });
        }
    }
    if connect_errors > 0 {
        let why = layers
            .app
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        ev.push(sup(
            LayerName::App,
            cause,
            format!("{connect_errors} connection attempt(s) failed, no request completed{why}"),
        ));
    }
    if let Some(p) = x.path
        && !p.hops.is_empty()
    {
        let answered: Vec<String> = p
            .hops
            .iter()
            .filter_map(|h| h.addr.as_ref().map(|a| format!("hop {} {a}", h.ttl)))
            .collect();
        ev.push(sup(
            LayerName::Path,
            cause,
            if answered.is_empty() {
                format!(
                    "route: no hop answered up to TTL {} (the address is on a directly \
                     connected link, or every router is silent)",
                    p.hops.len()
                )
            } else {
                format!("route: {}; nothing beyond", answered.join(", "))
            },
        ));
    }
    Some(Judgement {
        verdict: Verdict {
            cause,
            secondary: Vec::new(),
            confidence: if x.path.is_some() && connect_errors > 0 {
                Confidence::High
            } else {
                Confidence::Medium
            },
            summary: summary.clone(),
            cost: format!("every request fails: {summary}"),
            fix,
        },
        evidence: ev,
        finding_layers: [LayerName::Path, LayerName::App]
            .into_iter()
            .filter(|l| layers.status(*l) != crate::evidence::LayerStatus::Unavailable)
            .collect(),
    })
}

/// Decides the verdict from the evidence of all layers.
pub fn judge(target: &Target, layers: &Layers) -> Judgement {
    let x = Facts::new(layers);
    if let Some(j) = unreachable(target, layers, &x) {
        return j;
    }

    let mut cands: Vec<Candidate> = [
        nagle_candidate(&x),
        cork_candidate(&x),
        loss_candidate(&x),
        syn_candidate(&x),
        window_candidate(&x),
        queue_candidate(&x),
    ]
    .into_iter()
    .flatten()
    .collect();

    // SYN retransmissions where data packets are lost too are the same loss, not a
    // separate accept-queue problem.
    if let Some(i) = cands.iter().position(|c| c.cause == Cause::SynDrop)
        && cands.iter().any(|c| c.cause == Cause::PacketLoss)
    {
        let syn = cands.remove(i);
        if let Some(l) = cands.iter_mut().find(|c| c.cause == Cause::PacketLoss) {
            for mut e in syn.evidence {
                e.cause = Some(Cause::PacketLoss);
                e.text = format!("connection setup loses packets too: {}", e.text);
                l.evidence.push(e);
            }
        }
    }
    // The server's own time: explained by Nagle/cork when they account for most of it.
    let mut slow = slow_server_candidate(&x);
    if let Some(s) = &slow
        && cands.iter().any(|c| {
            matches!(c.cause, Cause::NagleDelayedAck | Cause::TcpCork)
                && c.added_us * 2 >= s.added_us
        })
    {
        slow = None;
    }
    // A queue on the path explains a server time seen under load (the capture sees the
    // response after the queue), not a c=1 one. On a bandwidth-limited path the c=1 time also
    // holds the response's transfer at the bottleneck rate (the c=N throughput, since the
    // queue is full): take it out before calling the rest the server's.
    if let (Some(s), Some(q)) = (&slow, cands.iter().find(|c| c.cause == Cause::PathQueueing))
        && x.c1.is_none_or(|c1| {
            c1.latency
                .p50_us
                .saturating_sub(x.rtt_us)
                .saturating_sub(x.bottleneck_transfer_us(c1))
                < SLOW_SERVER_US
        })
        && q.added_us * 2 >= s.added_us
    {
        slow = None;
    }
    // Nothing else explains a response that takes long to arrive: the sender paces it.
    if slow.is_none() && cands.is_empty() {
        slow = paced_response_candidate(&x);
    }
    if let Some(s) = slow {
        // When the server's own time dominates, network causes are never primary.
        for c in cands.iter_mut().filter(|c| is_network(c.cause)) {
            if c.impact_us <= s.impact_us * 2.0 {
                c.impact_us = c.impact_us.min(s.impact_us * 0.99);
            }
        }
        cands.push(s);
    }
    cands.sort_by(|a, b| b.impact_us.total_cmp(&a.impact_us));

    let mut evidence = Vec::new();

    let Some(primary) = cands.first() else {
        return healthy(layers, &x, evidence);
    };

    let cause = primary.cause;
    for c in &cands {
        evidence.extend(c.evidence.iter().cloned());
    }
    evidence.extend(rule_outs(&x, &cands));
    evidence.extend(missing_layers(layers));
    let mut finding_layers: Vec<LayerName> = cands
        .iter()
        .flat_map(|c| c.layers.iter().copied())
        .collect();
    finding_layers.sort();
    finding_layers.dedup();

    let confidence = {
        let corroborating = primary.layers.len();
        // A short server time that dominates only on a fast path is a judgement call.
        let short_server = primary.cause == Cause::SlowServer && primary.added_us < SLOW_SERVER_US;
        if primary.direct && corroborating >= 2 && !short_server {
            Confidence::High
        } else if primary.direct {
            Confidence::Medium
        } else {
            Confidence::Low
        }
    };
    let cost = cost_text(primary, &x);
    let fix = fixes(cause, &x, target);
    Judgement {
        verdict: Verdict {
            cause,
            secondary: cands.iter().skip(1).map(|c| c.cause).collect(),
            confidence,
            summary: summary_text(cause),
            cost,
            fix,
        },
        evidence,
        finding_layers,
    }
}

fn summary_text(cause: Cause) -> String {
    match cause {
        Cause::Healthy => "no latency problem beyond the path RTT and a normal server time",
        Cause::NagleDelayedAck => {
            "the server's Nagle algorithm holds the end of each response until the client's \
             delayed ACK (~40 ms); neither side is slow"
        }
        Cause::SlowServer => "the server's own time between request and response dominates",
        Cause::PacketLoss => "retransmissions after lost packets inflate latency",
        Cause::TcpCork => "TCP_CORK holds responses until its 200 ms ceiling",
        Cause::PathQueueing => "a queue on the path fills under load and delays every packet",
        Cause::SynDrop => "connection setup waits for SYN retransmissions",
        Cause::ReceiveWindow => "the receiver's window holds the sender back",
        Cause::Unreachable => "no connection can be made",
    }
    .into()
}

fn cost_text(c: &Candidate, x: &Facts<'_>) -> String {
    let run = x.main_run();
    let p50 = run.map(|r| r.latency.p50_us).unwrap_or(0);
    let conc = run.map(|r| r.concurrency).unwrap_or(1);
    match c.cause {
        Cause::NagleDelayedAck => {
            let without =
                x.c1.and_then(|r| r.first_request.as_ref())
                    .map(|f| f.p50_us)
                    .unwrap_or_else(|| p50.saturating_sub(c.added_us).max(x.rtt_us));
            format!(
                "adds ~{} to {} of requests (those after the first on each connection); p50 {} \
                 at c={} would be ~{} without it",
                ms(c.added_us),
                pct(c.share),
                ms(p50),
                conc,
                ms(without)
            )
        }
        Cause::TcpCork => format!(
            "adds ~{} to {} of requests (held until the 200 ms cork ceiling); p50 {} at c={}",
            ms(c.added_us),
            pct(c.share),
            ms(p50),
            conc
        ),
        Cause::PacketLoss => {
            let p99 = run.map(|r| r.latency.p99_us).unwrap_or(0);
            format!(
                "{} of requests wait ~{} for a retransmission; p99 {} at c={} (p50 {})",
                pct(c.share),
                ms(c.added_us),
                ms(p99),
                conc,
                ms(p50)
            )
        }
        Cause::PathQueueing => format!(
            "the path's queue adds ~{} to every packet under load; p50 {} at c={}{}",
            ms(c.added_us),
            ms(p50),
            conc,
            x.c1.map(|r| format!(" vs {} at c=1", ms(r.latency.p50_us)))
                .unwrap_or_default()
        ),
        Cause::SlowServer if x.paced_transfer().is_some_and(|p| p.0 == c.added_us) => {
            let (transfer, size, bps) = x.paced_transfer().unwrap_or_default();
            format!(
                "each ~{size} B response takes ~{} to arrive ({}) on a path with RTT {}; p50 {} \
                 at c={conc}",
                ms(transfer),
                rate_text(bps),
                ms(x.rtt_us),
                ms(p50)
            )
        }
        Cause::SlowServer => {
            let share =
                x.c1.filter(|c1| c1.latency.p50_us > 0)
                    .map(|c1| {
                        format!(
                            " ({} of the c=1 p50 {})",
                            pct((c.added_us as f64 / c1.latency.p50_us as f64).min(1.0)),
                            ms(c1.latency.p50_us)
                        )
                    })
                    .unwrap_or_default();
            format!(
                "the server takes ~{} per request itself{share}; the network adds {} (path \
                 RTT); p50 {} at c={}",
                ms(c.added_us),
                ms(x.rtt_us),
                ms(p50),
                conc
            )
        }
        Cause::SynDrop if c.layers.first() == Some(&LayerName::App) => format!(
            "{} of new connections at c={conc} fail: no SYN-ACK within the {} connect timeout",
            pct(c.share),
            ms(c.added_us)
        ),
        Cause::SynDrop => format!(
            "new connections wait ~{} for a SYN retransmission",
            ms(c.added_us)
        ),
        Cause::ReceiveWindow => format!(
            "{} of requests wait ~{} for the receiver's window to open",
            pct(c.share),
            ms(c.added_us)
        ),
        Cause::Healthy | Cause::Unreachable => String::new(),
    }
}

/// Lines that rule out what was not chosen.
fn rule_outs(x: &Facts<'_>, cands: &[Candidate]) -> Vec<EvidenceLine> {
    let has = |c: Cause| cands.iter().any(|k| k.cause == c);
    let mut v = Vec::new();
    if !has(Cause::PathQueueing) {
        if let Some((idle, load, _)) = x.queue_rise_us() {
            v.push(out(
                LayerName::Path,
                Cause::PathQueueing,
                format!(
                    "SYN RTT p50 {} idle, {} under load: no queue on the path",
                    ms(idle),
                    ms(load)
                ),
            ));
        } else if let Some(idle) = x
            .path
            .and_then(|p| p.idle.as_ref())
            .filter(|s| s.received > 0)
        {
            v.push(note(
                LayerName::Path,
                format!(
                    "SYN RTT p50 {} idle ({} of {} probes answered)",
                    ms(idle.p50_us),
                    idle.received,
                    idle.sent
                ),
            ));
        }
    }
    if !has(Cause::SlowServer)
        && let Some(own) = x.server_own_us()
    {
        let st = x
            .packets
            .and_then(|p| p.server_time.as_ref())
            .filter(|s| s.count > 0)
            .map(|s| format!("; server time in packets p50 {}", ms(s.p50_us)))
            .unwrap_or_default();
        v.push(out(
            if x.c1.is_some() {
                LayerName::App
            } else {
                LayerName::Packets
            },
            Cause::SlowServer,
            if own >= SLOW_SERVER_US
                && let Some(m) = cands
                    .iter()
                    .find(|c| matches!(c.cause, Cause::NagleDelayedAck | Cause::TcpCork))
            {
                format!(
                    "the wait before each response (~{}{}) is the {} hold, not the server's \
                     own work",
                    ms(own),
                    st,
                    m.cause
                )
            } else if own < 100 {
                format!(
                    "the server's own time is negligible (c=1 p50 within the path RTT){st}: \
                     not the application"
                )
            } else {
                format!(
                    "the server's own time is ~{}{}: not the application",
                    ms(own),
                    st
                )
            },
        ));
        // At c=1 the server is quick, but under load it holds requests itself: say so
        // rather than let "not the application" stand alone.
        if let (Some(p), Some(cn)) = (x.packets.and_then(|p| p.server_time.as_ref()), x.cn)
            && p.count > 0
            && p.p50_us >= DOMINANT_SERVER_US
            && p.p50_us >= own.saturating_mul(4)
        {
            v.push(note(
                LayerName::Packets,
                format!(
                    "under load the server queues requests itself: server time p50 {} at \
                     c={} against ~{} at c=1 ({:.0} req/s is about what it serves)",
                    ms(p.p50_us),
                    cn.concurrency,
                    ms(own),
                    cn.requests_per_sec
                ),
            ));
        }
    }
    if let Some(p) = x.packets {
        if !has(Cause::PacketLoss) {
            let n = p.finding("retransmission").map(|f| f.count).unwrap_or(0);
            v.push(out(
                LayerName::Packets,
                Cause::PacketLoss,
                if n == 0 {
                    format!("no retransmissions in {} packets", p.packets)
                } else {
                    format!(
                        "{n} retransmissions in {} packets: too few to matter",
                        p.packets
                    )
                },
            ));
        }
        if !has(Cause::NagleDelayedAck) {
            // Nagle holds seen in the packets that stay short (a large response's tail waits
            // one ACK round trip, not the delayed-ACK timer) are named, not hidden.
            let short = ["nagle-delayed-ack", "nagle-stall"]
                .iter()
                .filter_map(|k| p.finding(k))
                .filter(|f| f.share >= MATERIAL_SHARE && f.median_added_us < MATERIAL_ADDED_US)
                .max_by(|a, b| a.share.total_cmp(&b.share));
            v.push(out(
                LayerName::Packets,
                Cause::NagleDelayedAck,
                match short {
                    Some(f) => format!(
                        "{} on {} of {} transactions adds only ~{} (the end of a response \
                         waits for an ACK that comes within a round trip, not the ~40 ms \
                         delayed-ACK timer): below the {} worth naming",
                        f.kind,
                        pct(f.share),
                        p.transactions,
                        ms(f.median_added_us),
                        ms(MATERIAL_ADDED_US)
                    ),
                    None => format!(
                        "no Nagle/delayed-ACK stall on a material share of {} transactions",
                        p.transactions
                    ),
                },
            ));
        }
        if !has(Cause::TcpCork) && p.finding("tcp-cork").is_none() {
            v.push(out(
                LayerName::Packets,
                Cause::TcpCork,
                "no response held to the 200 ms cork ceiling".into(),
            ));
        }
    }
    if let Some(s) = x.sockets {
        if !has(Cause::NagleDelayedAck) && s.nodelay.on > 0 && s.nodelay.off == 0 {
            v.push(out(
                LayerName::Sockets,
                Cause::NagleDelayedAck,
                format!(
                    "server sockets: TCP_NODELAY set on {}/{}",
                    s.nodelay.on,
                    s.nodelay.on + s.nodelay.unknown
                ),
            ));
        }
        if !has(Cause::NagleDelayedAck) && s.nodelay.off > 0 && x.packets.is_some() {
            v.push(note(
                LayerName::Sockets,
                format!(
                    "server sockets: TCP_NODELAY off on {}/{}, but no material Nagle stall \
                     in the packets (each response leaves in one write, or a hold lasts only \
                     until an ACK within a round trip)",
                    s.nodelay.off,
                    s.nodelay.on + s.nodelay.off + s.nodelay.unknown
                ),
            ));
        }
        if !has(Cause::TcpCork) && s.cork.off > 0 && s.cork.on == 0 {
            v.push(out(
                LayerName::Sockets,
                Cause::TcpCork,
                format!(
                    "server sockets: TCP_CORK off on {}/{}",
                    s.cork.off, s.cork.off
                ),
            ));
        }
    }
    v
}

/// A note for each layer that did not run, with why (and for a capture that lost packets).
fn missing_layers(layers: &Layers) -> Vec<EvidenceLine> {
    let mut v = Vec::new();
    if let Some(p) = layers.packets.get()
        && p.dropped > 0
    {
        v.push(note(
            LayerName::Packets,
            format!(
                "the capture missed {} packets (kernel buffer full): the analysis covers {} \
                 packets",
                p.dropped, p.packets
            ),
        ));
    }
    v.extend(
        LayerName::ALL
            .into_iter()
            .filter(|l| {
                !matches!(
                    layers.status(*l),
                    crate::evidence::LayerStatus::Ok | crate::evidence::LayerStatus::Finding
                )
            })
            .map(|l| {
                note(
                    l,
                    format!(
                        "{} layer {}: {}",
                        l.name(),
                        layers.status(l).name(),
                        layers.reason(l).unwrap_or("no reason given")
                    ),
                )
            }),
    );
    v
}

fn healthy(layers: &Layers, x: &Facts<'_>, mut evidence: Vec<EvidenceLine>) -> Judgement {
    evidence.extend(rule_outs(x, &[]));
    let mut cost = String::from("none");
    if let Some(c1) = x.c1 {
        cost.push_str(&format!(": p50 {} at c=1", ms(c1.latency.p50_us)));
    }
    if let Some(cn) = x.cn {
        cost.push_str(&format!(
            "{} {} at c={} ({:.0} req/s)",
            if x.c1.is_some() { "," } else { ": p50" },
            ms(cn.latency.p50_us),
            cn.concurrency,
            cn.requests_per_sec
        ));
    }
    if x.rtt_us > 0 {
        cost.push_str(&format!("; path RTT {}", ms(x.rtt_us)));
    }
    if let Some(run) = x.main_run() {
        evidence.insert(
            0,
            note(
                LayerName::App,
                format!(
                    "c={}: {} requests, p50 {}, p99 {}, {:.0} req/s, {} errors",
                    run.concurrency,
                    run.requests,
                    ms(run.latency.p50_us),
                    ms(run.latency.p99_us),
                    run.requests_per_sec,
                    run.errors.total()
                ),
            ),
        );
    }
    // Healthy is as sure as the layers that could have shown a problem.
    let ran = |l: LayerName| {
        matches!(
            layers.status(l),
            crate::evidence::LayerStatus::Ok | crate::evidence::LayerStatus::Finding
        )
    };
    let confidence = if !ran(LayerName::App) {
        Confidence::Low
    } else if ran(LayerName::Packets) && ran(LayerName::Path) {
        Confidence::High
    } else {
        Confidence::Medium
    };
    evidence.extend(missing_layers(layers));
    Judgement {
        verdict: Verdict {
            cause: Cause::Healthy,
            secondary: Vec::new(),
            confidence,
            summary: summary_text(Cause::Healthy),
            cost,
            fix: Vec::new(),
        },
        evidence,
        finding_layers: Vec::new(),
    }
}

fn server_name(x: &Facts<'_>) -> String {
    x.sockets
        .and_then(|s| s.server.as_ref())
        .map(|p| format!("{} (pid {})", p.comm, p.pid))
        .unwrap_or_else(|| "the server process".into())
}

fn fixes(cause: Cause, x: &Facts<'_>, target: &Target) -> Vec<Fix> {
    let mut v = Vec::new();
    let server = server_name(x);
    match cause {
        Cause::NagleDelayedAck => {
            let d = x
                .sockets
                .and_then(|s| s.directive("tcp_nodelay"))
                .filter(|d| d.value == "off");
            if let Some(d) = d {
                v.push(Fix {
                    side: FixSide::Server,
                    location: Some(format!("{}:{}", d.file, d.line)),
                    change: "tcp_nodelay off; → tcp_nodelay on; then reload nginx".into(),
                    tradeoff: None,
                });
                v.push(Fix {
                    side: FixSide::Server,
                    location: Some(d.file.clone()),
                    change: "or sendfile off; or tcp_nopush on; (the response then leaves in \
                             full frames)"
                        .into(),
                    tradeoff: Some("tcp_nopush delays the last partial frame slightly".into()),
                });
            } else {
                let seen = x.sockets.is_some_and(|s| s.nodelay.off > 0);
                v.push(Fix {
                    side: FixSide::Server,
                    location: None,
                    change: format!(
                        "{} TCP_NODELAY on its sockets: set it \
                         (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, 1)), or write each \
                         response in one call (one buffer or writev)",
                        if seen {
                            format!("{server} sets no")
                        } else {
                            format!("{server} most likely sets no (its sockets were not read)")
                        }
                    ),
                    tradeoff: None,
                });
            }
            v.push(Fix {
                side: FixSide::Client,
                location: None,
                change: "set TCP_QUICKACK on the client socket after each read".into(),
                tradeoff: Some(
                    "not permanent (the kernel clears it), must be set again after every \
                     read; more ACK packets"
                        .into(),
                ),
            });
            v.push(Fix {
                side: FixSide::Client,
                location: Some(format!("the client host's route to {}", target.addr)),
                change: match target.addr.parse::<std::net::IpAddr>() {
                    // Loopback traffic follows the local table's route, not a main-table
                    // one: give the exact command.
                    Ok(std::net::IpAddr::V4(a)) if a.is_loopback() => {
                        "ip route change local 127.0.0.0/8 dev lo table local proto kernel \
                         scope host src 127.0.0.1 quickack 1"
                            .into()
                    }
                    Ok(a @ std::net::IpAddr::V6(_)) => format!(
                        "ip -6 route change <the route `ip -6 route get {a}` shows> quickack 1"
                    ),
                    Ok(a) => {
                        format!("ip route change <the route `ip route get {a}` shows> quickack 1")
                    }
                    Err(_) => "ip route change <route to the server> quickack 1".into(),
                },
                tradeoff: Some(
                    "every connection on that route ACKs at once: more ACK packets, needs \
                     root on every client"
                        .into(),
                ),
            });
        }
        Cause::TcpCork => v.push(Fix {
            side: FixSide::Server,
            location: x
                .sockets
                .and_then(|s| s.directive("tcp_nopush"))
                .filter(|d| d.value == "on")
                .map(|d| format!("{}:{}", d.file, d.line)),
            change: format!(
                "{server} {}: uncork after each response (setsockopt \
                 TCP_CORK=0 flushes), or use MSG_MORE on all writes but the last",
                if x.sockets.is_some_and(|s| s.cork.on > 0) {
                    "leaves TCP_CORK on"
                } else {
                    "most likely leaves TCP_CORK on (its sockets were not read)"
                }
            ),
            tradeoff: None,
        }),
        Cause::SlowServer if x.server_own_us().unwrap_or(0) < DOMINANT_SERVER_US => {
            let (transfer, size, bps) = x.paced_transfer().unwrap_or_default();
            v.push(Fix {
                side: FixSide::Server,
                location: None,
                change: format!(
                    "{server} answers at once but sends each ~{size} B response over ~{} \
                     ({}): look for a send rate limit (nginx limit_rate, a proxy's or \
                     shaper's bandwidth cap) or a handler that writes its body in slow pieces",
                    ms(transfer),
                    rate_text(bps)
                ),
                tradeoff: None,
            });
        }
        Cause::SlowServer => {
            let own = x.server_own_us().unwrap_or(0);
            v.push(Fix {
                side: FixSide::Server,
                location: None,
                change: format!(
                    "{server} spends ~{} per request before answering: profile the handler \
                     and its backends (the network is not the problem)",
                    ms(own)
                ),
                tradeoff: None,
            });
        }
        Cause::PacketLoss => v.push(Fix {
            side: FixSide::Path,
            location: None,
            change: "find where packets drop: firewall rules (`nft list ruleset`), interface \
                     and qdisc drops (`ip -s link`, `tc -s qdisc`), a lossy link on the route"
                .into(),
            tradeoff: None,
        }),
        Cause::PathQueueing => v.push(Fix {
            side: FixSide::Path,
            location: None,
            change: "shorten the queue at the bottleneck (tbf `latency`/`limit`, or fq_codel / \
                     cake instead of a deep FIFO), or pace senders below the bottleneck rate"
                .into(),
            tradeoff: Some("a shorter queue drops earlier under bursts".into()),
        }),
        Cause::SynDrop => v.push(Fix {
            side: FixSide::Server,
            location: None,
            change: "raise the listen backlog (the server's backlog and net.core.somaxconn), \
                     accept faster, and check rules that drop SYNs"
                .into(),
            tradeoff: None,
        }),
        Cause::ReceiveWindow => v.push(Fix {
            side: FixSide::Client,
            location: None,
            change: "the receiver reads too slowly or its buffer is small: read faster, raise \
                     SO_RCVBUF / net.ipv4.tcp_rmem"
                .into(),
            tradeoff: Some("larger buffers cost memory per connection".into()),
        }),
        Cause::Healthy | Cause::Unreachable => {}
    }
    v
}
